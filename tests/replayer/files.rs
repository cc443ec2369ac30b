//! What an fs workload did to its files, timed on the recorder's clock, and what
//! a crash at an instant must have kept of it: every file fsynced (with its
//! directory) before the instant, with the content it had then or a newer one
//! being written; a rename or unlink fsynced before it, done.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// A block of a file: content is compared a block at a time, since an
/// unfinished rewrite leaves some blocks new and some old.
const BLOCK: usize = 4096;

/// One thing done to a file, from when it started until it was synced (its
/// fsync, and its directory's, returned).
#[derive(Clone, Debug)]
pub enum Change {
    /// Created with version 0 of its content, at `path`.
    Made {
        path: String,
        len: u64,
    },
    /// Its content rewritten in place with version `version`.
    Rewrote {
        version: u32,
    },
    Moved {
        to: String,
    },
    Removed,
}

#[derive(Clone, Debug)]
pub struct Event {
    pub file: u32,
    pub change: Change,
    pub started: Duration,
    pub synced: Option<Duration>,
}

/// The bytes of one version of a file.
type Content = Arc<Vec<u8>>;

/// The workload's journal.
#[derive(Default)]
pub struct FileLog {
    events: Mutex<Vec<Event>>,
    /// The file whose content starts with a marker (a planted fault's), and it.
    pub marked: Option<(u32, Vec<u8>)>,
    /// Each version of each file's content, made once.
    contents: Mutex<HashMap<(u32, u32), Content>>,
}

impl FileLog {
    /// A journal in which file `marked.0`'s content starts with `marked.1`.
    pub fn marking(marked: Option<(u32, Vec<u8>)>) -> FileLog {
        FileLog {
            marked,
            ..FileLog::default()
        }
    }

    /// The content of version `version` of file `file`, `len` bytes: from a
    /// seeded generator, the marker first for the file that carries it.
    pub fn content(&self, file: u32, version: u32, len: u64) -> Arc<Vec<u8>> {
        let mut all = self.contents.lock().unwrap();
        all.entry((file, version))
            .or_insert_with(|| {
                let mut out = vec![0u8; len as usize];
                let seed = (u64::from(file) << 32) | u64::from(version);
                StdRng::seed_from_u64(seed).fill_bytes(&mut out);
                let marker = self.marked.as_ref().filter(|(f, _)| *f == file);
                if let Some((_, m)) = marker.filter(|(_, m)| m.len() <= out.len()) {
                    out[..m.len()].copy_from_slice(m);
                }
                Arc::new(out)
            })
            .clone()
    }

    /// Records the start of `change` to `file`: an index for [`FileLog::synced`].
    pub fn start(&self, file: u32, change: Change, at: Duration) -> usize {
        let mut e = self.events.lock().unwrap();
        e.push(Event {
            file,
            change,
            started: at,
            synced: None,
        });
        e.len() - 1
    }

    pub fn synced(&self, idx: usize, at: Duration) {
        self.events.lock().unwrap()[idx].synced = Some(at);
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Every instant a change became durable: the flush points.
    pub fn sync_points(&self) -> Vec<Duration> {
        self.events().iter().filter_map(|e| e.synced).collect()
    }

    /// What a crash at `t` lost of the files, whose copies are under `root`
    /// (the state's files): one line per loss.
    pub fn lost_at(&self, t: Duration, root: &Path) -> Vec<String> {
        let mut by_file: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
        for e in self.events() {
            by_file.entry(e.file).or_default().push(e);
        }
        by_file
            .iter()
            .filter_map(|(file, events)| self.file_lost_at(*file, events, t, root))
            .collect()
    }

    fn file_lost_at(
        &self,
        file: u32,
        events: &[Event],
        t: Duration,
        root: &Path,
    ) -> Option<String> {
        let durable = |e: &Event| e.synced.is_some_and(|s| s <= t);
        let begun = |e: &Event| e.started <= t;
        let Change::Made { path, len } = &events.first()?.change else {
            return None;
        };
        if !durable(&events[0]) {
            return None;
        }
        let (mut names, mut versions) = (vec![path.clone()], vec![0u32]);
        let (mut gone, mut maybe_gone) = (false, false);
        for e in events[1..].iter().filter(|e| begun(e)) {
            match &e.change {
                Change::Moved { to } if durable(e) => names = vec![to.clone()],
                Change::Moved { to } => names.push(to.clone()),
                Change::Removed if durable(e) => gone = true,
                Change::Removed => maybe_gone = true,
                Change::Rewrote { version } if durable(e) => versions = vec![*version],
                Change::Rewrote { version } => versions.push(*version),
                Change::Made { .. } => {}
            }
        }
        let found: Vec<&String> = names.iter().filter(|n| root.join(n).exists()).collect();
        let since = events[0].synced.unwrap();
        match (found.as_slice(), gone) {
            ([], true) => None,
            ([], _) if maybe_gone => None,
            ([], _) => Some(format!(
                "{} (fsynced at {since:?}) is missing",
                names.join(" or ")
            )),
            (_, true) => Some(format!(
                "{} was unlinked and fsynced before {t:?}, and is back",
                found[0]
            )),
            ([one], false) => {
                let got = std::fs::read(root.join(one)).unwrap_or_default();
                let wants: Vec<Arc<Vec<u8>>> = versions
                    .iter()
                    .map(|v| self.content(file, *v, *len))
                    .collect();
                let bad = blocks_none_of(&got, &wants);
                bad.map(|b| {
                    format!(
                        "{one} (fsynced at {since:?}, versions {versions:?} allowed) holds other bytes in block {b} ({} bytes long)",
                        got.len()
                    )
                })
            }
            (many, false) => Some(format!("{many:?} all exist: one file under two names")),
        }
    }
}

/// The first block of `got` that matches the same block of none of `wants`
/// (or the length, as block `usize::MAX`, if it differs).
fn blocks_none_of(got: &[u8], wants: &[Arc<Vec<u8>>]) -> Option<usize> {
    if wants.iter().all(|w| w.len() != got.len()) {
        return Some(usize::MAX);
    }
    got.chunks(BLOCK).enumerate().find_map(|(i, b)| {
        let at = i * BLOCK..i * BLOCK + b.len();
        (!wants.iter().any(|w| &w[at.clone()] == b)).then_some(i)
    })
}
