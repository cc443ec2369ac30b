//! The replay itself: instants chosen, the states a crash at each can leave
//! rebuilt, each distinct one checked once against what the workload was told
//! was durable.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::bytes::{Model, SECTOR};
use super::files::FileLog;
use super::fscheck::{self, Fault, Fs, Scratch};
use super::fsx::{self, FsxRun};
use super::image::{Blob, Pieces};
use super::model::states_at;
use super::report::{Report, Step};
use crate::common::util::env_u64;
use crate::recorder::Record;

/// How much is replayed; the environment lengthens it (see the test's text).
pub struct Settings {
    /// How long the workload runs.
    pub secs: u64,
    pub instants: usize,
    /// The most states rebuilt at one instant.
    pub per_instant: usize,
    /// The share of answers to writes dropped.
    pub drop_rate: f64,
    pub seed: u64,
}

impl Settings {
    pub fn from_env() -> Settings {
        Settings::from_env_or(10, 16, 4)
    }

    /// The environment's settings, these where it gives none: a workload
    /// whose states cost more to check runs shorter by default.
    pub fn from_env_or(secs: u64, instants: usize, per_instant: usize) -> Settings {
        let count = |name, default: usize| env_u64(name).map_or(default, |n| n as usize);
        Settings {
            secs: env_u64("BLOBDRIVE_REPLAY_SECS").unwrap_or(secs),
            instants: count("BLOBDRIVE_REPLAY_INSTANTS", instants),
            per_instant: count("BLOBDRIVE_REPLAY_STATES_PER_INSTANT", per_instant),
            drop_rate: env_u64("BLOBDRIVE_REPLAY_DROP_PERCENT").unwrap_or(5) as f64 / 100.0,
            seed: env_u64("BLOBDRIVE_REPLAY_SEED").unwrap_or_else(rand::random),
        }
    }

    /// A short run of `secs` with `instants`, no answer dropped: for a test
    /// of one thing.
    pub fn short(secs: u64, instants: usize) -> Settings {
        Settings {
            secs,
            instants,
            per_instant: 2,
            drop_rate: 0.0,
            ..Settings::from_env()
        }
    }
}

/// What a state must hold, by the workload's journal.
pub enum Oracle {
    /// A filesystem and its files.
    Files {
        fs: Fs,
        log: Arc<FileLog>,
        scratch: Scratch,
    },
    /// The bytes of a raw drive: the model's part from `from`, fsx's before.
    Bytes {
        model: Model,
        from: u64,
        fsx: Option<(FsxRun, fsx::Oracle)>,
    },
}

/// What is wrong with a state: the filesystem or drive cannot come back from
/// it, or it lacks acknowledged data.
#[derive(Default)]
pub struct Verdict {
    pub inconsistent: Option<String>,
    pub lost: Vec<String>,
    /// What XFS's own online grow leaves when a crash cuts it short (see
    /// [`Fault::is_xfs_superblocks_of_a_grow`]), at an instant during one.
    pub mid_grow: Option<String>,
}

impl Oracle {
    /// The instants the workload was told its data was durable.
    pub fn sync_points(&self) -> Vec<Duration> {
        match self {
            Oracle::Files { log, .. } => log.sync_points(),
            Oracle::Bytes { model, fsx, .. } => {
                let mut all = model.sync_points();
                all.extend(fsx.iter().flat_map(|(f, _)| f.sync_points()));
                all
            }
        }
    }

    /// Judges `disk`, a state in which everything settled by `settled` is
    /// carried out and nothing begun after `begun` is; `mid_grow` if the
    /// instant is during an online grow of the filesystem.
    pub fn judge(
        &mut self,
        settled: Duration,
        begun: Duration,
        disk: &Pieces,
        mid_grow: bool,
    ) -> Verdict {
        match self {
            Oracle::Files { fs, log, scratch } => match scratch.check(*fs, disk) {
                Err(Fault::Recovery(e)) => Verdict {
                    inconsistent: Some(e),
                    ..Verdict::default()
                },
                checked => {
                    let lost = log.lost_at(settled, &scratch.files());
                    let (inconsistent, mid_grow) = match checked {
                        Err(f) if mid_grow && f.is_xfs_superblocks_of_a_grow() => (None, Some(f)),
                        Err(f) => (Some(f), None),
                        Ok(()) => (None, None),
                    };
                    Verdict {
                        inconsistent: inconsistent.map(|f| f.to_string()),
                        lost,
                        mid_grow: mid_grow.map(|f| f.to_string()),
                    }
                }
            },
            Oracle::Bytes { model, from, fsx } => {
                let disk = &disk.to_vec();
                let sectors = *from / SECTOR..disk.len() as u64 / SECTOR;
                let mut lost = model.lost_between(settled, begun, disk, sectors);
                if let Some((run, oracle)) = fsx {
                    lost.extend(run.lost_between(settled, begun, disk, oracle));
                }
                Verdict {
                    lost,
                    ..Verdict::default()
                }
            }
        }
    }
}

/// Up to `n` instants from `from` (when the drive was mounted: nothing is
/// promised before `mount` returns): the end, the instant with the most writes
/// in flight,
/// for each of the workload's `steps` (a growth, a snapshot) two moments a
/// write was sent during it and the moment its command returned, then as many
/// flush points (`syncs`) as other moments a write was sent.
fn instants(
    records: &[Record],
    syncs: &[Duration],
    steps: &[Step],
    (from, end): (Duration, Duration),
    n: usize,
    rng: &mut StdRng,
) -> Vec<Duration> {
    let sends: Vec<Duration> = records
        .iter()
        .filter(|r| r.op.is_write() && r.sent >= from)
        .map(|r| r.sent)
        .collect();
    let syncs: Vec<Duration> = syncs.iter().copied().filter(|t| *t >= from).collect();
    let busiest = super::model::busiest(records).filter(|t| *t >= from);
    let mut chosen: Vec<Duration> = std::iter::once(end).chain(busiest).collect();
    for step in steps {
        let during: Vec<Duration> = sends
            .iter()
            .copied()
            .filter(|t| (step.began..step.ended).contains(t))
            .collect();
        chosen.extend(during.choose_multiple(rng, 2));
        chosen.push(step.ended);
    }
    let half = n.saturating_sub(chosen.len()) / 2;
    chosen.extend(syncs.choose_multiple(rng, half));
    chosen.extend(sends.choose_multiple(rng, n.saturating_sub(chosen.len())));
    chosen.sort();
    chosen.dedup();
    chosen
}

/// Replays the run between `from` (the drive mounted) and `end` (unmounted):
/// checks every distinct state of the chosen instants.
pub fn replay(
    records: &[Record],
    oracle: &mut Oracle,
    s: &Settings,
    (from, end): (Duration, Duration),
    report: &mut Report,
) {
    let mut rng = StdRng::seed_from_u64(s.seed);
    let syncs = oracle.sync_points();
    let chosen = instants(
        records,
        &syncs,
        &report.steps,
        (from, end),
        s.instants,
        &mut rng,
    );
    report.instants = chosen.len();
    for t in chosen {
        // States of one instant differ only where its unsettled writes go.
        let mut seen = Vec::new();
        for state in states_at(records, t, s.per_instant, &mut rng) {
            report.most_open_at_instant = report.most_open_at_instant.max(state.open_writes);
            let what = format!(
                "crash at {t:?} ({} of {} unsettled writes landed)",
                state.landed, state.open_writes
            );
            let blob = Blob::build(records, &state.ops);
            let key = blob.key(&state.open_ranges);
            if key.as_ref().is_some_and(|k| seen.contains(k)) {
                continue;
            }
            seen.extend(key);
            let disk = match blob.into_disk() {
                Ok(d) => d,
                Err(e) => {
                    report.inconsistent.push(format!("{what}: {e}"));
                    continue;
                }
            };
            report.states += 1;
            let mid_grow = report
                .steps
                .iter()
                .any(|s| s.what.starts_with("grown") && s.began < t && t < s.ended);
            let v = oracle.judge(t, t, &disk, mid_grow);
            record_verdict(report, &what, v, &disk);
        }
    }
}

/// Adds a verdict's findings to the report, keeping the first bad state's image.
pub(super) fn record_verdict(report: &mut Report, what: &str, v: Verdict, disk: &Pieces) {
    if let Some(e) = v.mid_grow {
        report.mid_grow.push(format!("{what}: {e}"));
    }
    if v.inconsistent.is_none() && v.lost.is_empty() {
        return;
    }
    if report.inconsistent.is_empty() && report.lost.is_empty() {
        let kept = fscheck::keep(disk, &report.workload);
        eprintln!(
            "replay {}: the first bad state ({what}) is kept in {}",
            report.workload,
            kept.display()
        );
    }
    if let Some(e) = v.inconsistent {
        report.inconsistent.push(format!("{what}: {e}"));
    }
    if !v.lost.is_empty() {
        report.lost.push(format!("{what}: {}", v.lost.join("; ")));
    }
}
