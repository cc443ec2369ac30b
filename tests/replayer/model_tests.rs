//! The replayer's model of the states a crash leaves, on made-up records: a
//! write whose answer was lost never lands over newer bytes once the fence
//! closed on it, and does when nothing closes it; a write answered by someone
//! other than the service may be missing; a settled write never is.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::image::Blob;
use super::model::states_at;
use crate::recorder::{Answer, Op, Record, Service};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A request sent at `sent` ms, carried out by the service `1` ms later (with
/// `sequence` in its answer), its answer handed back then.
fn carried(op: Op, fence: Option<u64>, body: &[u8], sent: u64, sequence: Option<u64>) -> Record {
    Record {
        op,
        fence,
        lease: None,
        body: Arc::new(body.to_vec()),
        sent: ms(sent),
        service: Some(Service {
            from: ms(sent),
            at: ms(sent + 1),
            status: 201,
            sequence,
            snapshot: None,
            code: None,
        }),
        answer: Answer::Delivered {
            at: ms(sent + 1),
            status: 201,
        },
        planted: false,
    }
}

fn put(fence: u64, byte: u8, sent: u64) -> Record {
    carried(
        Op::Put { start: 0, end: 512 },
        Some(fence),
        &[byte; 512],
        sent,
        Some(fence),
    )
}

fn raise(to: u64, sent: u64) -> Record {
    carried(Op::Raise, None, &[], sent, Some(to))
}

/// What sector 0 holds in each state a crash at `t` ms can leave.
fn first_sectors(records: &[Record], t: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(1);
    states_at(records, ms(t), 256, &mut rng)
        .iter()
        .map(|s| Blob::build(records, &s.ops).bytes.read(0, 1)[0])
        .collect()
}

/// A write of `a` whose answer was lost, then `b` written over it; `fenced`
/// says whether the number was raised after the loss and `b` carries the new
/// one (as blobdrive does it) or not.
fn lost_answer_then_newer_bytes(fenced: bool) -> Vec<Record> {
    let later = if fenced { 2 } else { 1 };
    let mut lost = put(1, b'a', 3);
    lost.answer = Answer::Dropped { at: ms(5) };
    let mut all = vec![
        carried(Op::Create { len: 1024 }, None, &[], 0, None),
        raise(1, 1),
        lost,
    ];
    if fenced {
        all.push(raise(2, 6));
    }
    all.push(put(later, b'b', 10));
    all
}

#[test]
fn a_write_whose_answer_was_lost_never_lands_after_the_raise_that_fenced_it() {
    let held = first_sectors(&lost_answer_then_newer_bytes(true), 12);
    assert!(held.len() > 1, "one state only: {held:?}");
    assert!(held.iter().all(|b| *b == b'b'), "{held:?}");
}

#[test]
fn an_unfenced_write_whose_answer_was_lost_can_land_over_newer_bytes() {
    let held = first_sectors(&lost_answer_then_newer_bytes(false), 12);
    assert!(held.contains(&b'b') && held.contains(&b'a'), "{held:?}");
}

#[test]
fn a_write_the_proxy_answered_before_the_service_had_it_may_be_missing() {
    let mut early = put(1, b'a', 3);
    early.planted = true;
    early.service.as_mut().unwrap().at = ms(20);
    let records = [
        carried(Op::Create { len: 1024 }, None, &[], 0, None),
        raise(1, 1),
        early,
    ];
    let held = first_sectors(&records, 10);
    assert!(held.contains(&0) && held.contains(&b'a'), "{held:?}");
    assert_eq!(first_sectors(&records[..2], 10), [0]);
}

#[test]
fn a_settled_write_is_in_every_state_and_an_unsent_one_in_none() {
    let mut records = vec![
        carried(Op::Create { len: 1024 }, None, &[], 0, None),
        raise(1, 1),
        put(1, b'a', 3),
        put(1, b'c', 30),
    ];
    assert_eq!(first_sectors(&records, 10), [b'a']);
    // Its answer lost, the same write is sent again and answered: wherever
    // the first copy lands, the second puts the same bytes after it.
    records[2].answer = Answer::Dropped { at: ms(5) };
    records.splice(3..3, [raise(2, 6), put(2, b'a', 8)]);
    assert_eq!(first_sectors(&records, 10), [b'a']);
}
