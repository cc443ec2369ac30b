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
        let stripes = (self.limit.load(SeqCst) - self.from) / STRIPE;
        let mine = (stripes - me).div_ceil(WRITERS);
        let stripe = rng.gen_range(0..mine) * WRITERS + me;
        let blocks = STRIPE / 4096;
        let first = rng.gen_range(0..blocks);
        let count = rng.gen_range(1..=(blocks - first).min(32));
        (self.from + stripe * STRIPE + first * 4096, count * 4096)
    }

    /// Writer `me` (0: buffered, 1: O_DIRECT) until told to stop, then a last
    /// fsync. Its first write starts with `marker` (a planted fault's), if given.
    pub fn writer(&self, me: u64, seed: u64, marker: Option<&[u8]>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let f = Self::open(&self.path, me == 1);
        let mut marker = marker.map(<[u8]>::to_vec);
        while !self.stop.load(SeqCst) {
            let (offset, len) = self.range(me, &mut rng);
            match rng.gen_range(0..20) {
                0..=13 => {
                    let mut data = vec![0u8; len as usize];
                    rng.fill_bytes(&mut data);
                    if let Some(m) = marker.take() {
                        data[..m.len()].copy_from_slice(&m);
                    }
                    let data = Arc::new(data);
                    let buf = super::fsload::Aligned::new(&data);
                    let w = self.log.start(offset, data, self.clock.now());
                    f.write_all_at(buf.bytes(), offset).unwrap();
                    self.log.done(w, self.clock.now());
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
