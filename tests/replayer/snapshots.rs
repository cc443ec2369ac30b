//! Each snapshot, as the service holds it after the run, checked against the
//! blob at its instant as the recorded requests rebuild it, then as a state of
//! its own.

use super::bytes::SECTOR;
use super::check::{record_verdict, Oracle};
use super::image::{Blob, Pieces};
use super::model::{as_carried_out, Placed};
use super::report::Report;
use crate::recorder::{Op, Record};

/// Checks snapshot `idx` (its bytes as the service holds them after the run):
/// they must be the blob's at its instant, as the recorded requests rebuild it
/// (writes the service carried out while it was taking it may be in or out),
/// and a state the workload's promises hold in.
pub fn check_snapshot(
    records: &[Record],
    idx: usize,
    held: Vec<u8>,
    oracle: &mut Oracle,
    report: &mut Report,
) {
    let snap = records[idx].service.clone().expect("a snapshot taken");
    let name = snap.snapshot.clone().unwrap_or_default();
    let (mut before, mut during) = (Vec::<Placed>::new(), Vec::new());
    for p in as_carried_out(records) {
        let s = records[p.idx].service.as_ref().unwrap();
        if s.at <= snap.from {
            before.push(p);
        } else if s.from < snap.at && records[p.idx].op.is_write() {
            during.push(p.idx);
        }
    }
    let then = Blob::build(records, &before);
    let (was, resize) = (then.bytes.to_vec(), then.resize);
    let moving = |at: usize| {
        during.iter().any(|&i| match records[i].op {
            Op::Put { start, end } | Op::Clear { start, end } => {
                (start..end).contains(&(at as u64))
            }
            _ => false,
        })
    };
    let sector = |b: &[u8], at: usize| b.get(at..at + SECTOR as usize).map(<[u8]>::to_vec);
    let differs = (was != held)
        .then(|| {
            (0..was.len().max(held.len()))
                .step_by(SECTOR as usize)
                .find(|&at| sector(&was, at) != sector(&held, at) && !moving(at))
        })
        .flatten();
    let what = format!("snapshot {name}");
    if let Some(at) = differs {
        report.lost.push(format!(
            "{what} holds other bytes than the blob at its instant, at byte {at}"
        ));
        return;
    }
    let disk = Blob {
        bytes: Pieces::from_bytes(&held),
        resize,
    }
    .into_disk();
    report.states += 1;
    match disk {
        Err(e) => report.inconsistent.push(format!("{what}: {e}")),
        Ok(disk) => {
            let v = oracle.judge(snap.from, snap.at, &disk, false);
            record_verdict(report, &what, v, &disk);
        }
    }
}
