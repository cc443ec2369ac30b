//! The fs workload: writers at once in a mounted filesystem, each change made
//! durable with fsync (of the file and of its directory) and journalled on the
//! recorder's clock. One writer creates files with buffered writes and renames
//! and unlinks them; one creates and rewrites files in place with O_DIRECT and
//! fdatasync; one makes and deletes scratch files and discards the free space
//! (fstrim: Clear Pages).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::files::{Change, FileLog};
use crate::recorder::Clock;

/// What the writers share.
pub struct FsLoad {
    pub root: PathBuf,
    pub log: Arc<FileLog>,
    pub clock: Clock,
    pub stop: Arc<AtomicBool>,
    next_file: AtomicU32,
}

/// A buffer whose start is aligned for O_DIRECT, holding `data`.
pub struct Aligned {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    pub fn new(data: &[u8]) -> Aligned {
        let mut raw = vec![0u8; data.len() + 4096];
        let at = raw.as_ptr().align_offset(4096);
        raw[at..at + data.len()].copy_from_slice(data);
        Aligned {
            raw,
            at,
            len: data.len(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.raw[self.at..self.at + self.len]
    }
}

fn fsync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

impl FsLoad {
    /// Makes the writers' directories (durable) under `root`.
    pub fn new(root: &Path, log: Arc<FileLog>, clock: Clock) -> Arc<FsLoad> {
        for d in ["buffered", "direct", "moved", "scratch"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        fsync_dir(root);
        Arc::new(FsLoad {
            root: root.to_path_buf(),
            log,
            clock,
            stop: Arc::new(AtomicBool::new(false)),
            next_file: AtomicU32::new(1),
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Creates the file `rel` with version 0 of file `id`'s content, written by
    /// `write`, then fsyncs it and its directory.
    fn make(&self, id: u32, rel: &str, len: u64, write: impl FnOnce(&Path, &[u8])) {
        let data = self.log.content(id, 0, len);
        let ev = self.log.start(
            id,
            Change::Made {
                path: rel.to_string(),
                len,
            },
            self.clock.now(),
        );
        let path = self.path(rel);
        write(&path, &data);
        fsync_dir(path.parent().unwrap());
        self.log.synced(ev, self.clock.now());
    }

    /// Buffered writes in pieces, then fsync.
    fn write_buffered(path: &Path, data: &[u8]) {
        let f = File::create(path).unwrap();
        let mut at = 0;
        for piece in data.chunks(48 << 10) {
            f.write_all_at(piece, at).unwrap();
            at += piece.len() as u64;
        }
        f.sync_all().unwrap();
    }

    fn open_direct(path: &Path, create: bool) -> File {
        OpenOptions::new()
            .write(true)
            .create(create)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .unwrap()
    }

    /// The buffered writer: new files (the marked one first, which stays
    /// where it is made, so that what a crash lost of it is named by its
    /// path), renames, unlinks.
    pub fn buffered(&self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut live: Vec<(u32, String)> = Vec::new();
        if let Some((id, _)) = &self.log.marked {
            self.make(
                *id,
                &format!("buffered/marked-{id}"),
                64 << 10,
                Self::write_buffered,
            );
        }
        while !self.stop.load(SeqCst) {
            let roll = rng.gen_range(0..10);
            if roll < 6 || live.len() < 3 {
                let id = self.next_file.fetch_add(1, SeqCst);
                let len = (rng.gen_range(1..=96u64) << 10) + rng.gen_range(0..4096);
                let rel = format!("buffered/f{id}");
                self.make(id, &rel, len, Self::write_buffered);
                live.push((id, rel));
            } else if roll < 8 {
                let (id, from) = live.remove(rng.gen_range(0..live.len()));
                let to = format!("moved/f{id}.{}", rng.gen::<u16>());
                let ev = self
                    .log
                    .start(id, Change::Moved { to: to.clone() }, self.clock.now());
                std::fs::rename(self.path(&from), self.path(&to)).unwrap();
                fsync_dir(&self.path("moved"));
                fsync_dir(self.path(&from).parent().unwrap());
                self.log.synced(ev, self.clock.now());
                live.push((id, to));
            } else {
                let (id, rel) = live.remove(rng.gen_range(0..live.len()));
                let ev = self.log.start(id, Change::Removed, self.clock.now());
                std::fs::remove_file(self.path(&rel)).unwrap();
                fsync_dir(self.path(&rel).parent().unwrap());
                self.log.synced(ev, self.clock.now());
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..30)));
        }
    }

    /// The O_DIRECT writer: new files, and rewrites in place (fdatasync).
    pub fn direct(&self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut mine: Vec<(u32, u64, u32)> = Vec::new();
        while !self.stop.load(SeqCst) {
            if mine.is_empty() || rng.gen_bool(0.4) {
                let id = self.next_file.fetch_add(1, SeqCst);
                let len = rng.gen_range(1..=64u64) * 4096;
                self.make(id, &format!("direct/d{id}"), len, |p, data| {
                    let f = Self::open_direct(p, true);
                    f.write_all_at(Aligned::new(data).bytes(), 0).unwrap();
                    f.sync_all().unwrap();
                });
                mine.push((id, len, 0));
            } else {
                let pick = rng.gen_range(0..mine.len());
                let (id, len, version) = mine[pick];
                let version = version + 1;
                let data = Aligned::new(&self.log.content(id, version, len));
                let ev = self
                    .log
                    .start(id, Change::Rewrote { version }, self.clock.now());
                let f = Self::open_direct(&self.path(&format!("direct/d{id}")), false);
                f.write_all_at(data.bytes(), 0).unwrap();
                f.sync_data().unwrap();
                self.log.synced(ev, self.clock.now());
                mine[pick].2 = version;
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..40)));
        }
    }

    /// Scratch files made and deleted, then the free space discarded.
    pub fn trim(&self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0;
        while !self.stop.load(SeqCst) {
            n += 1;
            let scratch = self.path(&format!("scratch/s{n}"));
            let data = vec![0xa5u8; rng.gen_range(1..=4) << 20];
            std::fs::write(&scratch, &data).unwrap();
            std::thread::sleep(Duration::from_millis(rng.gen_range(100..400)));
            std::fs::remove_file(&scratch).unwrap();
            let out = std::process::Command::new("fstrim")
                .arg(&self.root)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "fstrim {}: {}",
                self.root.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(rng.gen_range(300..900)));
        }
    }
}
