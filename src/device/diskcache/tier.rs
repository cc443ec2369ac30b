//! The disk cache as a layer: a [`Backend`] over the backend below it (the
//! blob's), asking the disk cache first and telling it of every change. The
//! stack is composed once at start-up ([`crate::device::stack::Stack`]); nothing
//! below or above this layer knows whether it is there.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::DiskCache;
use crate::device::{first_error, Backend, DeviceError};

/// The disk cache `cache` in front of `below`.
pub struct DiskTier<B: Backend + ?Sized> {
    cache: Arc<DiskCache>,
    below: Arc<B>,
}

impl<B: Backend + ?Sized> DiskTier<B> {
    pub fn new(cache: Arc<DiskCache>, below: Arc<B>) -> DiskTier<B> {
        DiskTier { cache, below }
    }
}

impl<B: Backend + ?Sized> Backend for DiskTier<B> {
    /// What the disk cache holds from it, the rest from below (and then kept).
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.cache.read(offset, buf, |o, b| self.below.read(o, b))
    }

    // `read_scattered` is the default, through one buffer: the disk cache keeps
    // what is fetched, from one buffer. So `reads_scattered` is false.

    fn has_local(&self) -> bool {
        self.cache.is_on()
    }

    fn read_local(&self, offset: u64, blocks: &mut [&mut [u8]]) -> bool {
        self.cache.read_held(offset, blocks)
    }

    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError> {
        first_error(self.write_each(runs))
    }

    fn write_each(&self, runs: Vec<(u64, Bytes)>) -> Vec<Result<(), DeviceError>> {
        self.write_each_issued(runs, Instant::now())
    }

    /// The disk cache forgets what each run replaces before it is sent, and
    /// keeps the bytes of each run that landed.
    fn write_each_issued(
        &self,
        runs: Vec<(u64, Bytes)>,
        issued: Instant,
    ) -> Vec<Result<(), DeviceError>> {
        for (o, d) in &runs {
            self.cache.change_begins(*o, o + d.len() as u64);
        }
        // Cheap: `Bytes` are shared, not copied.
        let kept = runs.clone();
        let results = self.below.write_each_issued(runs, issued);
        for ((o, d), r) in kept.iter().zip(&results) {
            self.cache
                .change_ends(*o, o + d.len() as u64, r.is_ok().then_some(&d[..]));
        }
        results
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.cache.change_begins(offset, offset + len);
        let r = self.below.discard(offset, len);
        self.cache.change_ends(offset, offset + len, None);
        r
    }

    fn fail_fast_since(&self, issued: Instant) -> Result<(), DeviceError> {
        self.below.fail_fast_since(issued)
    }

    fn past_the_io_timeout(&self) -> bool {
        self.below.past_the_io_timeout()
    }

    fn probe(&self) -> Result<(), DeviceError> {
        self.below.probe()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::super::index::{CHUNK, PIECE};
    use super::super::tests::{parent, state};
    use super::*;
    use crate::device::mem::MemBackend;

    fn read(tier: &DiskTier<MemBackend>, offset: u64, len: u64) -> Vec<u8> {
        let mut buf = vec![1u8; len as usize];
        tier.read(offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn the_tier_keeps_what_the_layer_below_answered_or_took_and_forgets_what_changed() {
        let dir = parent("tier");
        let cache = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        let below = Arc::new(MemBackend::new(8 << 20));
        let tier = DiskTier::new(Arc::new(cache), below.clone());
        let asked = || below.reads.load(Relaxed);
        assert!(tier.has_local() && !tier.reads_scattered());
        // A write the layer below took is read back from the tier, also
        // straight into blocks.
        let data = Bytes::from(vec![7u8; 2 * PIECE as usize]);
        tier.write_runs(vec![(0, data.clone())]).unwrap();
        assert_eq!(read(&tier, 0, 2 * PIECE), data);
        let mut blocks = vec![vec![0u8; PIECE as usize]; 2];
        let mut parts: Vec<&mut [u8]> = blocks.iter_mut().map(|b| &mut b[..]).collect();
        assert!(tier.read_local(0, &mut parts));
        assert_eq!(blocks.concat(), data);
        assert_eq!(asked(), 0);
        // A miss is read below once, then from the tier.
        assert_eq!(read(&tier, 4 * PIECE, PIECE), vec![0; PIECE as usize]);
        assert_eq!(read(&tier, 4 * PIECE, PIECE), vec![0; PIECE as usize]);
        assert_eq!(asked(), 1);
        // A discard is forgotten: the next read asks below.
        tier.discard(0, PIECE).unwrap();
        assert_eq!(read(&tier, 0, PIECE), vec![0; PIECE as usize]);
        assert_eq!(asked(), 2);
        // A write the layer below refused is not kept.
        below.fail_writes.store(true, Relaxed);
        assert!(tier.write_runs(vec![(8 * PIECE, data)]).is_err());
        below.fail_writes.store(false, Relaxed);
        assert_eq!(read(&tier, 8 * PIECE, PIECE), vec![0; PIECE as usize]);
        assert_eq!(asked(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
