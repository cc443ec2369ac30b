//! Reusable 4 MiB buffers for flushes and read-ahead.
//!
//! A flush copies dirty data out of the cache (so a block rewritten while its run
//! is in flight is never sent half old, half new), and read-ahead needs a buffer
//! to receive into. A fresh allocation each time costs more than the copy: a
//! 4 MiB buffer is served by new pages that the kernel must fault in and zero, and
//! profiles of sequential writes showed that as a quarter of the daemon's CPU. A
//! pooled buffer's pages stay mapped.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Buffers of one fixed capacity, handed out and returned.
pub struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
    capacity: usize,
    keep: usize,
}

impl BufPool {
    /// A pool of `capacity`-byte buffers that keeps at most `keep` idle ones.
    pub fn new(capacity: usize, keep: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            free: Mutex::new(Vec::new()),
            capacity,
            keep,
        })
    }

    /// An empty buffer with room for the pool's capacity.
    pub fn take(&self) -> Vec<u8> {
        let mut buf = self.take_idle();
        buf.clear();
        buf
    }

    /// An idle buffer as it was given back (its bytes those of its last use), or
    /// a new empty one.
    fn take_idle(&self) -> Vec<u8> {
        let idle = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        idle.unwrap_or_else(|| Vec::with_capacity(self.capacity))
    }

    /// A buffer of `len` bytes for a caller that overwrites every one of them
    /// before reading any (a ranged read, which fails on a short answer; a cache
    /// read, which writes zeros for holes): a pooled buffer keeps the bytes of its
    /// last use, so only what it never held is zeroed, and a reused 4 MiB buffer
    /// costs no `memset` (3-4% of the daemon's CPU in a read from the disk
    /// cache). Pooled and plain as in [`Self::take_zeroed`].
    pub fn take_filled(&self, len: usize) -> Vec<u8> {
        let mut buf = if (self.capacity / 4..=self.capacity).contains(&len) {
            self.take_idle()
        } else {
            Vec::with_capacity(len)
        };
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        buf
    }

    /// A buffer of `len` zeroed bytes: pooled when `len` is between a quarter of
    /// the pool's capacity and all of it, a plain allocation otherwise (a small
    /// buffer costs the heap little, and a pooled one would hold its whole
    /// capacity for it). Either may be given back; only pooled sizes are kept.
    pub fn take_zeroed(&self, len: usize) -> Vec<u8> {
        let mut buf = if (self.capacity / 4..=self.capacity).contains(&len) {
            self.take()
        } else {
            Vec::with_capacity(len)
        };
        buf.resize(len, 0);
        buf
    }

    /// Freezes `buf` into [`Bytes`] that give the buffer back to the pool when the
    /// last clone is dropped (after a request, and its retries, are done with it).
    pub fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    /// Returns a buffer taken with [`BufPool::take`] and not frozen. Its bytes
    /// stay (see [`Self::take_filled`]); [`Self::take`] empties it.
    pub fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        // Only buffers of the pool's size: a larger one would hold more memory
        // idle than the pool promises.
        if free.len() < self.keep && (self.capacity..=self.capacity * 2).contains(&buf.capacity()) {
            free.push(buf);
        }
    }

    /// Idle buffers held now.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap().len()
    }
}

struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_clone_drops_and_are_reused() {
        let pool = BufPool::new(4096, 2);
        let mut b = pool.take();
        b.extend_from_slice(&[7u8; 4096]);
        let ptr = b.as_ptr();
        let bytes = pool.freeze(b);
        let part = bytes.slice(100..200);
        drop(bytes);
        assert_eq!(pool.idle(), 0, "a slice still holds the buffer");
        assert_eq!(&part[..], &[7u8; 100][..]);
        drop(part);
        assert_eq!(pool.idle(), 1);
        let again = pool.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), ptr, "the same allocation is reused");
    }

    #[test]
    fn keeps_no_more_than_asked() {
        let pool = BufPool::new(16, 1);
        let a = pool.freeze(pool.take());
        let b = pool.freeze(pool.take());
        drop(a);
        drop(b);
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn zeroed_buffers_are_pooled_only_at_the_pools_size() {
        let pool = BufPool::new(4096, 2);
        let mut big = pool.take_zeroed(2048);
        assert_eq!(big, vec![0u8; 2048]);
        big.fill(9);
        let ptr = big.as_ptr();
        pool.give(big);
        let again = pool.take_zeroed(4096);
        assert_eq!(again.as_ptr(), ptr, "a pooled size reuses the buffer");
        assert_eq!(again, vec![0u8; 4096], "and zeroes it");
        pool.give(again);
        let small = pool.take_zeroed(100);
        assert!(small.capacity() < 4096, "a small one is not pooled");
        pool.give(small);
        pool.give(vec![0u8; 3 * 4096]);
        assert_eq!(
            pool.idle(),
            1,
            "neither a small nor an oversized one is kept"
        );
    }

    #[test]
    fn filled_buffers_keep_their_last_bytes_and_zero_only_what_is_new() {
        let pool = BufPool::new(4096, 2);
        let mut a = pool.take_filled(2048);
        assert_eq!(a, vec![0u8; 2048], "a new buffer is zeroed");
        a.fill(9);
        let ptr = a.as_ptr();
        pool.give(a);
        let b = pool.take_filled(4096);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(&b[..2048], &[9u8; 2048][..], "its old bytes stay");
        assert_eq!(&b[2048..], &[0u8; 2048][..], "what it never held is zeroed");
        pool.give(b);
        assert!(pool.take().is_empty(), "take empties it");
    }
}
