//! What a replay found, as the test prints it.

use std::fmt;

use crate::recorder::{Answer, Op, Record};

/// A step taken on the mounted drive during the workload (a snapshot, a
/// growth), and when.
#[derive(Debug, Clone)]
pub struct Step {
    pub what: String,
    pub began: std::time::Duration,
    pub ended: std::time::Duration,
}

#[derive(Default, Debug)]
pub struct Report {
    pub workload: String,
    /// Distinct states checked (a state many subsets leave is checked once).
    pub states: usize,
    pub instants: usize,
    /// The most writes ever in flight at once, and the most whose fate was
    /// open at a replayed instant (answers lost included).
    pub most_in_flight: usize,
    pub most_open_at_instant: usize,
    pub requests: usize,
    /// Answers dropped (the request carried out, the answer lost), and how many
    /// of those requests were sent again and answered.
    pub dropped: usize,
    pub retried: usize,
    /// Writes the fence refused (a copy given up on, landing late).
    pub refused_by_fence: usize,
    pub snapshots: usize,
    /// The snapshots and growth of the workload.
    pub steps: Vec<Step>,
    /// States the filesystem or the drive cannot come back from.
    pub inconsistent: Vec<String>,
    /// States without data an fsync had acknowledged.
    pub lost: Vec<String>,
    /// States during an online grow of XFS whose superblocks XFS had not all
    /// written yet (the kernel recovered them, every file was there; only
    /// xfs_repair finds the superblocks in conflict).
    pub mid_grow: Vec<String>,
}

impl Report {
    /// The figures read from the records of the run.
    pub fn count_requests(&mut self, records: &[Record]) {
        self.requests = records.len();
        self.most_in_flight = super::model::most_in_flight(records);
        let dropped: Vec<(usize, &Record)> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r.answer, Answer::Dropped { .. }))
            .collect();
        self.dropped = dropped.len();
        self.retried = dropped
            .iter()
            .filter(|(i, r)| {
                records[i + 1..].iter().any(|again| {
                    again.op == r.op
                        && again.body == r.body
                        && matches!(again.answer, Answer::Delivered { status, .. } if (200..300).contains(&status))
                })
            })
            .count();
        self.refused_by_fence = records
            .iter()
            .filter(|r| {
                r.service
                    .as_ref()
                    .is_some_and(|s| s.code.as_deref() == Some("SequenceNumberConditionNotMet"))
            })
            .count();
        self.snapshots = records
            .iter()
            .filter(|r| r.op == Op::Snapshot && r.applied())
            .count();
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "replay {}: {} states checked at {} instants; at most {} writes in flight; {} answers dropped and {} retried; {} inconsistent states, {} with acknowledged data lost",
            self.workload,
            self.states,
            self.instants,
            self.most_in_flight,
            self.dropped,
            self.retried,
            self.inconsistent.len(),
            self.lost.len(),
        )?;
        write!(
            f,
            "\n  {} requests recorded; at most {} writes in flight or with their answers lost whose fate a replayed instant left open; {} writes refused by the fence; {} snapshots unchanged",
            self.requests, self.most_open_at_instant, self.refused_by_fence, self.snapshots,
        )?;
        if !self.mid_grow.is_empty() {
            write!(
                f,
                "; {} states cut short inside XFS's own online grow, its superblocks not all written yet (recovered by the mount, every file there)",
                self.mid_grow.len()
            )?;
        }
        for s in &self.steps {
            write!(f, "\n  {} from {:?} to {:?}", s.what, s.began, s.ended)?;
        }
        for line in self.inconsistent.iter().chain(&self.lost).take(10) {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}
