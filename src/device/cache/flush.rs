//! Writing dirty data to the blob: fsync ([`Cache::flush`]), complete 4 MiB runs
//! sent ahead of it ([`Cache::flush_full_runs`], [`Cache::settled_runs`]), the flush
//! lock that orders flushes and discards ([`Cache::order_lock`]), and the workers
//! that copy dirty sectors into units of at most 4 MiB, several in flight, each
//! marked clean as soon as it lands ([`Cache::write_blocks`], [`Cache::flush_worker`],
//! [`Cache::take_unit`]). Clean gaps are sent along where the cache holds them and
//! the blob has them ([`data_mask`]). The background flusher thread
//! ([`Cache::run_flusher`]) lives here too.
//!
//! Relies on the rules in `mod.rs` ("Rules that keep data safe"): a flush copies a
//! snapshot of the dirty sectors and clears a block's dirty bits only if its
//! generation did not change meanwhile; flushes and discards are serialised under
//! `flush_lock`, and a block is never in two units in flight; every unit that lands
//! is recorded as a change of its span (`State::changed`), so data of that range
//! fetched while it travelled is not cached.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, warn};

use crate::device::sectors::{self, mask};
use crate::device::sparse::SparseMap;
use crate::device::{first_error, Backend, DeviceError, MAX_RUN, SECTOR};

use super::{
    Block, Cache, State, BLOCK, FLUSHER_IDLE, FLUSHER_POLL, FLUSH_BATCH, FLUSH_PARALLEL, SETTLE,
};

/// Dirty data being written by [`Cache::write_blocks`]'s workers.
struct FlushQueue {
    pending: BTreeSet<u64>,
    /// Blocks of units in flight: never taken again until their unit has landed.
    in_flight: BTreeSet<u64>,
    error: Option<DeviceError>,
}

/// Dirty data copied out for one backend write: the runs, and per block the write
/// generation and dirty mask they hold (cleared on success only if unchanged).
struct FlushUnit {
    runs: Vec<(u64, Bytes)>,
    taken: Vec<(u64, u64, u128)>,
}

/// Blocks of the dirty data that make up complete 4 MiB runs of consecutive
/// blocks each passing `ok`, in disk order, until at least `most` bytes are found.
fn full_runs(st: &State, most: u64, ok: impl Fn(u64, &Block) -> bool) -> BTreeSet<u64> {
    let per_run = MAX_RUN / BLOCK;
    let mut set = BTreeSet::new();
    let mut streak: Vec<u64> = Vec::new();
    for (&b, blk) in st.dirty.iter() {
        let fits = ok(b, blk);
        if !fits || streak.last().is_some_and(|&l| l + 1 != b) {
            streak.clear();
        }
        if fits {
            streak.push(b);
            if streak.len() as u64 == per_run {
                set.extend(streak.drain(..));
                if set.len() as u64 * BLOCK >= most {
                    break;
                }
            }
        }
    }
    set
}

/// The sectors of block `b` that hold data on the blob (the rest are holes).
pub(super) fn data_mask(sparse: &SparseMap, b: u64) -> u128 {
    let bs = b * BLOCK;
    sparse.data_in(bs, bs + BLOCK).iter().fold(0u128, |m, r| {
        m | mask((r.start - bs) / SECTOR, (r.end - bs).div_ceil(SECTOR))
    })
}

impl<B: Backend> Cache<B> {
    /// Writes every sector that is dirty now; returns when all of it is in the
    /// backend (fsync, unmount). Data written meanwhile may stay dirty.
    pub fn flush(&self) -> Result<(), DeviceError> {
        let issued = Instant::now();
        let _order = self.order_lock();
        let pending: BTreeSet<u64> = self.lock().dirty.keys().copied().collect();
        if pending.is_empty() {
            return Ok(());
        }
        if self.is_fenced() {
            return Err(DeviceError::LeaseLost(format!(
                "{} dirty bytes cannot be written",
                self.dirty_bytes()
            )));
        }
        // Past an outage's I/O timeout, a flush that waited here for another one
        // that failed gets no try of its own: it would wait twice as long.
        self.backend.fail_fast_since(issued)?;
        self.counters.flushes.fetch_add(1, Relaxed);
        self.write_blocks(pending, false, issued)
    }

    /// Writes complete 4 MiB runs of fully dirty blocks at once, without waiting for
    /// fsync: a sequential writer's data then travels while it is still writing,
    /// and the runs are as large as they can ever be, so no coalescing is lost. Runs
    /// that settle while it works are taken too, so a steady writer keeps the
    /// uploads busy; it yields as soon as a flush or discard waits for its turn.
    /// Returns whether anything was written. Skips if another flush is running.
    pub fn flush_full_runs(&self) -> Result<bool, DeviceError> {
        let Ok(_order) = self.flush_lock.try_lock() else {
            return Ok(false);
        };
        if self.is_fenced() {
            return Ok(false);
        }
        let pending = self.settled_runs(&self.lock(), &BTreeSet::new());
        if pending.is_empty() {
            return Ok(false);
        }
        self.write_blocks(pending, true, Instant::now())?;
        Ok(true)
    }

    /// The flush lock, for those who must wait for it (not the background flusher,
    /// which only tries): counted, so a long background flush gives way to them.
    pub(super) fn order_lock(&self) -> MutexGuard<'_, ()> {
        self.order_waiters.fetch_add(1, Relaxed);
        let guard = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.order_waiters.fetch_sub(1, Relaxed);
        guard
    }

    /// Blocks of complete 4 MiB runs that are fully dirty, not written within
    /// [`SETTLE`] (a block rewritten within the last moment is part of a hot region
    /// that fsync will coalesce better) and not in flight; at most [`FLUSH_BATCH`].
    fn settled_runs(&self, st: &State, in_flight: &BTreeSet<u64>) -> BTreeSet<u64> {
        full_runs(st, FLUSH_BATCH, |b, blk| {
            blk.dirty == u128::MAX
                && blk.touched.is_none_or(|t| t.elapsed() >= SETTLE)
                && !in_flight.contains(&b)
        })
    }

    /// Whether the dirty data holds a complete 4 MiB run of fully dirty blocks,
    /// settled or not, in flight or not: one that [`Self::flush_full_runs`] sends,
    /// or will once it settles.
    pub(super) fn has_complete_runs(&self, st: &State) -> bool {
        !full_runs(st, MAX_RUN, |_, blk| blk.dirty == u128::MAX).is_empty()
    }

    /// Writes the dirty sectors of `pending` blocks, in units of at most 4 MiB with
    /// up to [`FLUSH_PARALLEL`] in flight, each unit marked clean as soon as it
    /// lands. With `refill`, settled runs are added as the pending ones run out.
    /// The caller holds `flush_lock`, so no other flush or discard interleaves, and
    /// a block is never in two units in flight at once. `issued`: when the flush
    /// was asked for, before it waited for the flush lock.
    fn write_blocks(
        &self,
        pending: BTreeSet<u64>,
        refill: bool,
        issued: Instant,
    ) -> Result<(), DeviceError> {
        let units = (pending.len() as u64 * BLOCK).div_ceil(MAX_RUN) as usize;
        let workers = if refill {
            FLUSH_PARALLEL
        } else {
            units.clamp(1, FLUSH_PARALLEL)
        };
        let queue = Mutex::new(FlushQueue {
            pending,
            in_flight: BTreeSet::new(),
            error: None,
        });
        if workers == 1 {
            self.flush_worker(&queue, refill, issued);
        } else {
            std::thread::scope(|s| {
                for _ in 1..workers {
                    s.spawn(|| self.flush_worker(&queue, refill, issued));
                }
                self.flush_worker(&queue, refill, issued);
            });
        }
        let queue = queue.into_inner().unwrap_or_else(|p| p.into_inner());
        queue.error.map_or(Ok(()), Err)
    }

    /// One of [`Cache::write_blocks`]'s workers: takes units until none are left or
    /// a unit failed.
    fn flush_worker(&self, queue: &Mutex<FlushQueue>, refill: bool, issued: Instant) {
        let lock_queue = || queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let unit = {
                let st = self.lock();
                let mut q = lock_queue();
                if q.error.is_some() {
                    return;
                }
                if q.pending.is_empty()
                    && refill
                    && self.order_waiters.load(Relaxed) == 0
                    && !self.is_fenced()
                {
                    q.pending = self.settled_runs(&st, &q.in_flight);
                }
                let unit = self.take_unit(&st, &mut q.pending);
                q.in_flight.extend(unit.taken.iter().map(|&(b, _, _)| b));
                unit
            };
            if unit.taken.is_empty() {
                return;
            }
            let bytes: u64 = unit.runs.iter().map(|(_, d)| d.len() as u64).sum();
            debug!(runs = unit.runs.len(), bytes, "flushing");
            // The span the unit's runs touch.
            let span = unit.runs.iter().map(|r| r.0).min().unwrap_or(0)
                ..unit
                    .runs
                    .iter()
                    .map(|(o, d)| o + d.len() as u64)
                    .max()
                    .unwrap_or(0);
            let result = first_error(self.backend.write_each_issued(unit.runs, issued));
            {
                let mut st = self.lock();
                if result.is_ok() {
                    st.changed(span.start, span.end);
                    for &(b, gen, m) in &unit.taken {
                        let now_clean = match st.dirty.get_mut(&b) {
                            Some(blk) if blk.gen == gen => {
                                let cleared = (blk.dirty & m).count_ones() as u64;
                                blk.dirty &= !m;
                                st.dirty_sectors -= cleared;
                                st.dirty.get(&b).is_some_and(|blk| blk.dirty == 0)
                            }
                            _ => false,
                        };
                        if now_clean {
                            let blk = st.dirty.remove(&b).expect("present");
                            st.clean.put(b, blk);
                        }
                    }
                }
                self.evict(&mut st);
            }
            {
                let mut q = lock_queue();
                for (b, _, _) in &unit.taken {
                    q.in_flight.remove(b);
                }
                if let Err(e) = result {
                    // A lost lease outranks any other failure.
                    if q.error.is_none() || matches!(e, DeviceError::LeaseLost(_)) {
                        q.error = Some(e);
                    }
                }
            }
            self.changed.notify_all();
        }
    }

    /// Copies the next unit of dirty data (in disk order, whole blocks, at most
    /// 4 MiB) out of `pending` blocks into one pooled buffer, as runs of adjacent
    /// sectors. Clean gaps between dirty sectors are sent along where the cache
    /// holds them and the blob has them (see [`sectors`]): gaps inside a block, and
    /// gaps across the edge of two adjacent blocks of the unit. Only blocks of the
    /// unit itself are read, so no other unit in flight can hold the same sectors.
    fn take_unit(&self, st: &State, pending: &mut BTreeSet<u64>) -> FlushUnit {
        // Per taken block: (block, generation, dirty mask, sectors to send).
        let mut taken: Vec<(u64, u64, u128, u128)> = Vec::new();
        let mut sectors_total = 0u64;
        let mut prev_bridgeable = 0u128;
        while let Some(&b) = pending.first() {
            let Some(blk) = st.dirty.get(&b) else {
                pending.remove(&b);
                continue;
            };
            let bridgeable = blk.valid & !blk.dirty & data_mask(&st.sparse, b);
            let mut send = sectors::bridge_inner(blk.dirty, bridgeable);
            // Bridge the edge with the previous block when both sides are held.
            let mut prev_extra = 0u128;
            if let Some(&(pb, _, _, psend)) = taken.last() {
                let tail = sectors::trailing_gap(psend);
                let lead = sectors::leading_gap(send);
                if pb + 1 == b
                    && psend != 0
                    && send != 0
                    && tail & prev_bridgeable == tail
                    && lead & bridgeable == lead
                {
                    prev_extra = tail;
                    send |= lead;
                }
            }
            let cost = u64::from(send.count_ones() + prev_extra.count_ones());
            if !taken.is_empty() && (sectors_total + cost) * SECTOR > MAX_RUN {
                break;
            }
            pending.remove(&b);
            sectors_total += cost;
            if let Some(last) = taken.last_mut() {
                last.3 |= prev_extra;
            }
            taken.push((b, blk.gen, blk.dirty, send));
            prev_bridgeable = bridgeable;
        }
        let mut buf = self.pool.take();
        // (offset, start in buf, length) of each run.
        let mut spans: Vec<(u64, usize, usize)> = Vec::new();
        for &(b, _, _, send) in &taken {
            let blk = st.dirty.get(&b).expect("taken under the same lock");
            for (sa, se) in sectors::runs(send) {
                let off = b * BLOCK + sa * SECTOR;
                let data = &blk.data[(sa * SECTOR) as usize..(se * SECTOR) as usize];
                match spans.last_mut() {
                    Some(last) if last.0 + last.2 as u64 == off => last.2 += data.len(),
                    _ => spans.push((off, buf.len(), data.len())),
                }
                buf.extend_from_slice(data);
            }
        }
        let data = self.pool.freeze(buf);
        let runs = spans
            .into_iter()
            .map(|(off, start, len)| (off, data.slice(start..start + len)))
            .collect();
        FlushUnit {
            runs,
            taken: taken.into_iter().map(|(b, g, d, _)| (b, g, d)).collect(),
        }
    }

    /// Runs the background flusher until [`Cache::close`]: sends complete runs as
    /// they settle, and writes all dirty data when no write came for `flush_after`,
    /// or when it passes half its limit with no complete run among it (scattered
    /// writes). A sequential writer's data past half the limit goes on as a
    /// stream of complete runs: a whole flush there would send the run still
    /// being written in pieces and let the uploads drain to nothing before the
    /// next flush.
    pub fn run_flusher(&self) {
        loop {
            let (idle, full, dirty) = {
                let st = self.lock();
                // Decided under the lock the write that dirties a clean cache
                // takes to wake us: that wake-up cannot be missed.
                let poll = if st.dirty_sectors == 0 {
                    FLUSHER_IDLE
                } else {
                    FLUSHER_POLL
                };
                let st = self
                    .changed
                    .wait_timeout(st, poll)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                if self.closing.load(Relaxed) {
                    return;
                }
                let dirty = st.dirty_memory();
                let idle = dirty > 0
                    && st
                        .last_write
                        .is_none_or(|t| t.elapsed() >= self.cfg.flush_after);
                let full =
                    dirty > 0 && dirty >= self.cfg.dirty_limit / 2 && !self.has_complete_runs(&st);
                (idle, full, dirty > 0)
            };
            if dirty && self.backend.past_the_io_timeout() {
                // Past an outage's I/O timeout a flush here would hold the flush
                // lock for a whole try, and an fsync that came meanwhile would
                // fail only after that try and one of its own. A probe holds
                // nothing; once it is answered, the next round flushes.
                if let Err(e) = self.backend.probe() {
                    debug!("the storage service still does not answer: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
                continue;
            }
            let result = if (idle || full) && !self.is_fenced() {
                self.flush()
            } else {
                // Drain complete runs while there are any.
                loop {
                    match self.flush_full_runs() {
                        Ok(true) => continue,
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            };
            if let Err(e) = result {
                warn!("background flush failed (will retry): {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}
