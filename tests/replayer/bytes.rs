//! A model of the bytes of a raw or block drive, timed on the recorder's clock,
//! and what a crash at an instant must have kept: every sector holds the value
//! it had when the last fsync that returned before the instant began, or a
//! value written to it since by a write begun before the instant; nothing older
//! and nothing never written.
//!
//! Writers own disjoint stripes of the disk, so the writes to one sector follow
//! each other; an fsync covers every write that returned before it began,
//! whichever writer made it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const SECTOR: u64 = 512;

/// One write (a discard writes zeros).
#[derive(Clone, Debug)]
pub struct Write {
    pub offset: u64,
    pub data: Arc<Vec<u8>>,
    pub started: Duration,
    pub done: Option<Duration>,
}

#[derive(Default)]
pub struct ByteLog {
    writes: Mutex<Vec<Write>>,
    /// Each fsync: when it began and when it returned.
    syncs: Mutex<Vec<(Duration, Duration)>>,
}

impl ByteLog {
    /// Records the start of a write of `data` at `offset`: an index for
    /// [`ByteLog::done`].
    pub fn start(&self, offset: u64, data: Arc<Vec<u8>>, at: Duration) -> usize {
        let mut w = self.writes.lock().unwrap();
        w.push(Write {
            offset,
            data,
            started: at,
            done: None,
        });
        w.len() - 1
    }

    pub fn done(&self, idx: usize, at: Duration) {
        self.writes.lock().unwrap()[idx].done = Some(at);
    }

    pub fn synced(&self, began: Duration, returned: Duration) {
        self.syncs.lock().unwrap().push((began, returned));
    }

    /// The model, frozen for checking.
    pub fn model(&self, disk: u64) -> Model {
        let writes = self.writes.lock().unwrap().clone();
        let mut per_sector = vec![Vec::new(); (disk / SECTOR) as usize];
        for (i, w) in writes.iter().enumerate() {
            let first = w.offset / SECTOR;
            for s in first..(w.offset + w.data.len() as u64).div_ceil(SECTOR) {
                per_sector[s as usize].push(i as u32);
            }
        }
        Model {
            writes,
            syncs: self.syncs.lock().unwrap().clone(),
            per_sector,
        }
    }
}

pub struct Model {
    writes: Vec<Write>,
    syncs: Vec<(Duration, Duration)>,
    /// For each sector the writes to it, in the order they were made.
    per_sector: Vec<Vec<u32>>,
}

impl Model {
    /// The bytes write `i` put in sector `s`.
    fn value(&self, i: u32, s: u64) -> &[u8] {
        let w = &self.writes[i as usize];
        let at = (s * SECTOR - w.offset) as usize;
        &w.data[at..at + SECTOR as usize]
    }

    pub fn sync_points(&self) -> Vec<Duration> {
        self.syncs.iter().map(|s| s.1).collect()
    }

    /// What `disk` lost in the sectors `range` (sector numbers), a state in
    /// which every fsync that returned by `settled` holds and no write begun
    /// after `begun` landed: one line each for the first few.
    pub fn lost_between(
        &self,
        settled: Duration,
        begun: Duration,
        disk: &[u8],
        range: std::ops::Range<u64>,
    ) -> Vec<String> {
        let covered = self
            .syncs
            .iter()
            .filter(|(_, end)| *end <= settled)
            .map(|(begin, _)| *begin)
            .max();
        let zero = [0u8; SECTOR as usize];
        let (mut first, mut bad) = (None, 0);
        for s in range {
            let at = (s * SECTOR) as usize;
            let Some(got) = disk.get(at..at + SECTOR as usize) else {
                break;
            };
            let writes = &self.per_sector[s as usize];
            let synced = writes.iter().rposition(|&i| {
                covered.is_some_and(|c| self.writes[i as usize].done.is_some_and(|d| d <= c))
            });
            let synced_value = synced.map_or(&zero[..], |k| self.value(writes[k], s));
            let newer = writes[synced.map_or(0, |k| k + 1)..]
                .iter()
                .filter(|&&i| self.writes[i as usize].started <= begun);
            if got == synced_value || newer.clone().any(|&i| got == self.value(i, s)) {
                continue;
            }
            bad += 1;
            if first.is_some() {
                continue;
            }
            let older = writes[..synced.unwrap_or(0)]
                .iter()
                .any(|&i| got == self.value(i, s))
                || (synced.is_some() && got == zero);
            first = Some(format!(
                "sector {s} (byte {at}) holds {}, not what the write begun at {:?} put there, fsynced since",
                if older {
                    "an older value: acknowledged data lost"
                } else {
                    "bytes never written there"
                },
                synced.map(|k| self.writes[writes[k] as usize].started)
            ));
        }
        let mut lost = Vec::new();
        if let Some(first) = first {
            lost.push(format!("{bad} sectors wrong; the first: {first}"));
        }
        lost
    }
}
