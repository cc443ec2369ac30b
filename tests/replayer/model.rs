//! Which blobs a crash at an instant can leave, from the recorded requests.
//!
//! The host running blobdrive dies at instant T. Then:
//! - a request whose answer blobdrive was handed before T, and which the service
//!   had dealt with by then, is settled: carried out (it is on the blob) or
//!   refused (it never will be);
//! - a request sent before T and not settled (no answer yet, its answer lost,
//!   or answered by someone other than the service before the service had it:
//!   a planted fault) may have been carried out, or may still be, at any moment
//!   from its sending until its conditions fail; or never. After the crash the drive's lease is broken,
//!   which refuses every write of the dead mount, so what the next mount sees is
//!   fixed by then.
//!
//! The conditions are the write fence: a write carrying sequence number N
//! (`x-ms-if-sequence-number-eq`) can only be carried out before the service
//! raised the number past N, and a write under a lease only while that lease
//! lasts. So a state is: the settled requests in the order the service carried
//! them out, plus a subset of the unsettled ones, each placed anywhere its
//! window allows; its earliest moment (when it was sent), the moment it was in
//! fact carried out, or the last moment before the fence closed on it (the end,
//! if nothing closes it: a write that was never fenced can land after every
//! other). Raises that a settled request proves done (a settled write carried a
//! number they produced, or a settled raise went past them) are in every state.

use std::collections::HashSet;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use crate::recorder::{Answer, Op, Record};

/// What the service answers a write whose sequence-number condition failed.
const FENCE_REFUSAL: &str = "SequenceNumberConditionNotMet";

/// Where a state's unsettled write lands within its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// When the service in fact carried it out (its sending, if it did not).
    Recorded,
    /// As soon as it was sent.
    Early,
    /// At the last moment the fence allows (after everything, if none closes).
    Late,
}

/// A request placed in a state, at `at` (ties broken by `tie`).
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub idx: usize,
    pub at: Duration,
    pub tie: u64,
}

/// One blob a crash at `instant` can leave: the requests carried out, in order.
pub struct State {
    pub instant: Duration,
    pub ops: Vec<Placed>,
    /// The unsettled writes whose fate the instant leaves open (those that
    /// could land and would change something), and how many landed here.
    pub open_writes: usize,
    pub landed: usize,
    /// Where the writes that may land at the instant write (merged): the only
    /// bytes in which its states can differ, with the length.
    pub open_ranges: Vec<(u64, u64)>,
}

/// How a request stands at an instant.
#[derive(Debug, PartialEq, Eq)]
enum Standing {
    Unsent,
    /// Settled: carried out, or not.
    Settled(bool),
    Open,
}

fn standing(r: &Record, t: Duration) -> Standing {
    if r.sent > t {
        return Standing::Unsent;
    }
    // Settled once blobdrive has an answer and the service has done what it
    // did: an answer the proxy made up before the service had the request
    // (a planted fault) settles nothing until the service has it.
    match (&r.answer, &r.service) {
        (Answer::Delivered { at, .. }, Some(s)) if *at <= t && s.at <= t => {
            Standing::Settled(s.applied())
        }
        _ => Standing::Open,
    }
}

/// Whether an unsettled request could be carried out at some moment: it was,
/// or it is a fenced write the service has not seen or refused for its number
/// only (earlier, the number may still have matched).
fn could_land(r: &Record) -> bool {
    if r.applied() {
        return true;
    }
    r.op.is_write()
        && r.fence.is_some()
        && r.service
            .as_ref()
            .is_none_or(|s| s.code.as_deref() == Some(FENCE_REFUSAL))
}

/// When the service carried `r` out (recorded requests that were).
fn carried_at(r: &Record) -> Duration {
    r.service.as_ref().map_or(r.sent, |s| s.at)
}

/// The moment the fence or the lease closes on write `w` among the requests
/// `carried` (indices into `records`), `Duration::MAX` if none does.
fn closes(w: &Record, records: &[Record], carried: &[usize]) -> Duration {
    let mut close = Duration::MAX;
    for &j in carried {
        let q = &records[j];
        let past_fence = matches!(q.op, Op::Raise)
            && w.fence
                .zip(q.service.as_ref().and_then(|s| s.sequence))
                .is_some_and(|(n, now)| now > n);
        let lease_ended = match &q.op {
            Op::Lease { action } => {
                w.lease.is_some()
                    && (action == "break"
                        || ((action == "release" || action == "change") && q.lease == w.lease))
            }
            _ => false,
        };
        if past_fence || lease_ended {
            close = close.min(carried_at(q));
        }
    }
    close
}

/// The unsettled and settled requests at an instant, with the raises the
/// settled ones prove done moved among the settled.
struct Split {
    settled: Vec<usize>,
    open: Vec<usize>,
}

fn split(records: &[Record], t: Duration) -> Split {
    let (mut settled, mut open) = (Vec::new(), Vec::new());
    for (i, r) in records.iter().enumerate() {
        match standing(r, t) {
            Standing::Settled(true) => settled.push(i),
            Standing::Open if could_land(r) => open.push(i),
            _ => {}
        }
    }
    let proven = settled
        .iter()
        .filter_map(|&i| {
            let r = &records[i];
            match r.op {
                Op::Raise => r.service.as_ref().and_then(|s| s.sequence),
                _ => r.fence,
            }
        })
        .max();
    let (forced, open): (Vec<usize>, Vec<usize>) = open.into_iter().partition(|&i| {
        let r = &records[i];
        matches!(r.op, Op::Raise)
            && r.applied()
            && r.service
                .as_ref()
                .and_then(|s| s.sequence)
                .zip(proven)
                .is_some_and(|(n, p)| n <= p)
    });
    settled.extend(forced);
    let open = open
        .into_iter()
        .filter(|&i| !rewritten_after_its_fence(records, i, &settled))
        .collect();
    Split { settled, open }
}

/// Whether write `i` (unsettled) is sent again, the same bytes to the same
/// range, by a settled write carried out after the fence closed on `i` (a
/// retry after its answer was lost): wherever `i` lands, that write lands
/// after it and puts the same bytes over it, so its fate changes nothing.
fn rewritten_after_its_fence(records: &[Record], i: usize, settled: &[usize]) -> bool {
    let w = &records[i];
    if !w.op.is_write() {
        return false;
    }
    let close = closes(w, records, settled);
    settled.iter().any(|&j| {
        let again = &records[j];
        again.op == w.op && again.body == w.body && close <= carried_at(again)
    })
}

/// Which unsettled requests land in each state, and where: up to `most` choices,
/// the first two always "none of them" and "all of them, as late as allowed".
fn choices(n: usize, most: usize, rng: &mut StdRng) -> Vec<Vec<Option<Place>>> {
    let mut out = vec![vec![None; n]];
    if n == 0 {
        return out;
    }
    out.push(vec![Some(Place::Late); n]);
    let mut seen: HashSet<Vec<Option<Place>>> = out.iter().cloned().collect();
    let all = if n < 12 {
        4usize.pow(n as u32)
    } else {
        usize::MAX
    };
    let mut tries = 0;
    while out.len() < most.min(all) && tries < most * 20 {
        tries += 1;
        let c: Vec<Option<Place>> = (0..n)
            .map(|_| match rng.gen_range(0..6) {
                0..=2 => None,
                3 => Some(Place::Recorded),
                4 => Some(Place::Early),
                _ => Some(Place::Late),
            })
            .collect();
        if seen.insert(c.clone()) {
            out.push(c);
        }
    }
    out
}

/// Up to `most` states a crash at `t` can leave.
pub fn states_at(records: &[Record], t: Duration, most: usize, rng: &mut StdRng) -> Vec<State> {
    let Split { settled, open } = split(records, t);
    let open_writes = open.iter().filter(|&&i| records[i].op.is_write()).count();
    let open_ranges = crate::common::util::merged_ranges(
        open.iter()
            .filter_map(|&i| match records[i].op {
                Op::Put { start, end } | Op::Clear { start, end } => Some((start, end)),
                _ => None,
            })
            .collect(),
    );
    let mut states = Vec::new();
    for choice in choices(open.len(), most, rng) {
        let landing: Vec<(usize, Place)> = open
            .iter()
            .zip(&choice)
            .filter_map(|(&i, p)| p.map(|p| (i, p)))
            .collect();
        let carried: Vec<usize> = settled
            .iter()
            .copied()
            .chain(
                landing
                    .iter()
                    .filter(|(i, _)| !records[*i].op.is_write())
                    .map(|(i, _)| *i),
            )
            .collect();
        let mut ops: Vec<Placed> = carried
            .iter()
            .map(|&idx| Placed {
                idx,
                at: carried_at(&records[idx]),
                tie: idx as u64,
            })
            .collect();
        let mut landed = 0;
        for &(idx, place) in landing.iter().filter(|(i, _)| records[*i].op.is_write()) {
            let w = &records[idx];
            let close = closes(w, records, &carried);
            if close <= w.sent {
                continue;
            }
            let at = match place {
                Place::Recorded if w.applied() && carried_at(w) < close => carried_at(w),
                Place::Recorded | Place::Early => w.sent,
                Place::Late if close == Duration::MAX => close,
                Place::Late => close - Duration::from_nanos(1),
            };
            landed += 1;
            ops.push(Placed {
                idx,
                at,
                tie: rng.gen(),
            });
        }
        ops.sort_by_key(|p| (p.at, p.tie));
        states.push(State {
            instant: t,
            ops,
            open_writes,
            landed,
            open_ranges: open_ranges.clone(),
        });
    }
    states
}

/// Every request the service carried out, in the order it did: the blob as it
/// stands after the run.
pub fn as_carried_out(records: &[Record]) -> Vec<Placed> {
    let mut ops: Vec<Placed> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.applied())
        .map(|(idx, r)| Placed {
            idx,
            at: carried_at(r),
            tie: idx as u64,
        })
        .collect();
    ops.sort_by_key(|p| (p.at, p.tie));
    ops
}

/// When each write was in flight: from its sending to its answer (or the
/// closing of its connection), for ever if neither came.
fn flights(records: &[Record]) -> Vec<(Duration, Duration)> {
    records
        .iter()
        .filter(|r| r.op.is_write())
        .map(|r| {
            let end = match r.answer {
                Answer::Delivered { at, .. } | Answer::Dropped { at } => at,
                Answer::Pending => Duration::MAX,
            };
            (r.sent, end)
        })
        .collect()
}

/// How many writes were in flight at `t`.
fn in_flight_at(flights: &[(Duration, Duration)], t: Duration) -> usize {
    flights.iter().filter(|(s, e)| *s <= t && t < *e).count()
}

/// The most writes that were ever in flight at once (sent, not yet answered
/// or given up on).
pub fn most_in_flight(records: &[Record]) -> usize {
    let f = flights(records);
    f.iter()
        .map(|&(t, _)| in_flight_at(&f, t))
        .max()
        .unwrap_or(0)
}

/// The moment the most writes were in flight.
pub fn busiest(records: &[Record]) -> Option<Duration> {
    let f = flights(records);
    f.iter()
        .map(|&(t, _)| t)
        .max_by_key(|&t| in_flight_at(&f, t))
}
