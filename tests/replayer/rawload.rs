//! The byte workload on a raw disk file or a block device: writers at once, one
//! with buffered writes and one with O_DIRECT, each in stripes of its own,
//! writing, discarding (hole punching: Clear Pages) and fsyncing, every step
//! journalled in a [`ByteLog`] on the recorder's clock. The writable part starts
//! at `from` (fsx may have the part before it) and ends at `limit`, which grows
//! when the drive does.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use super::bytes::ByteLog;
use crate::common::util::discard;
use crate::recorder::Clock;

/// The unit the writers share the disk in.
pub const STRIPE: u64 = 256 << 10;
/// How many writers.
pub const WRITERS: u64 = 2;

pub struct RawLoad {
    pub path: PathBuf,
    pub log: Arc<ByteLog>,
    pub clock: Clock,
    pub stop: Arc<AtomicBool>,
    pub from: u64,
    pub limit: Arc<AtomicU64>,
    /// A planted fault's marker: written once, first, in the last stripe,
    /// which with the one before it no other write touches (so the write
    /// carrying it holds nothing else, and nothing is written over it).
    pub marker: Option<Vec<u8>>,
}

/// Where the marker goes on a drive of `limit` bytes.
pub fn marker_at(limit: u64) -> u64 {
    limit - STRIPE
}

impl RawLoad {
    fn open(path: &Path, direct: bool) -> File {
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path).unwrap()
    }

    /// A random range of writer `me`'s stripes: 4 KiB aligned, within one stripe.
    fn range(&self, me: u64, rng: &mut StdRng) -> (u64, u64) {
        let kept = if self.marker.is_some() { 2 } else { 0 };
        let stripes = (self.limit.load(SeqCst) - self.from) / STRIPE - kept;
        let mine = (stripes - me).div_ceil(WRITERS);
        let stripe = rng.gen_range(0..mine) * WRITERS + me;
        let blocks = STRIPE / 4096;
        let first = rng.gen_range(0..blocks);
        let count = rng.gen_range(1..=(blocks - first).min(32));
        (self.from + stripe * STRIPE + first * 4096, count * 4096)
    }

    /// Writes the marker, if any, and fsyncs it.
    fn mark(&self, f: &File) {
        let Some(m) = &self.marker else { return };
        let mut data = vec![0x6d; 4096];
        data[..m.len()].copy_from_slice(m);
        self.write(f, marker_at(self.limit.load(SeqCst)), Arc::new(data));
        self.fsync(f);
    }

    fn write(&self, f: &File, offset: u64, data: Arc<Vec<u8>>) {
        let buf = super::fsload::Aligned::new(&data);
        let w = self.log.start(offset, data, self.clock.now());
        f.write_all_at(buf.bytes(), offset).unwrap();
        self.log.done(w, self.clock.now());
    }

    /// Writer `me` (0: buffered, 1: O_DIRECT) until told to stop, then a last
    /// fsync; the first writes the marker first.
    pub fn writer(&self, me: u64, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let f = Self::open(&self.path, me == 1);
        if me == 0 {
            self.mark(&f);
        }
        while !self.stop.load(SeqCst) {
            let (offset, len) = self.range(me, &mut rng);
            match rng.gen_range(0..20) {
                0..=13 => {
                    let mut data = vec![0u8; len as usize];
                    rng.fill_bytes(&mut data);
                    self.write(&f, offset, Arc::new(data));
                }
                14..=16 => {
                    let w =
                        self.log
                            .start(offset, Arc::new(vec![0; len as usize]), self.clock.now());
                    discard(&f, offset, len);
                    self.log.done(w, self.clock.now());
                }
                _ => self.fsync(&f),
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..15)));
        }
        self.fsync(&f);
    }

    fn fsync(&self, f: &File) {
        let began = self.clock.now();
        f.sync_all().unwrap();
        self.log.synced(began, self.clock.now());
    }
}
