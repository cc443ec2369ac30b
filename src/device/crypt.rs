//! The crypto layer of an encrypted drive: between the memory cache, which
//! holds plaintext, and the disk tier and the blob, which hold only what this
//! layer hands them, the LUKS2 data segment's ciphertext.
//!
//! The disk above it is the data segment: offset 0 here is the segment's first
//! byte on the blob (16 MiB in, with cryptsetup's layout). Every write is
//! encrypted into a buffer of its own before it goes down, so a run sent again
//! after an outage is the same ciphertext (XTS is deterministic: the same
//! plaintext at the same place is the same ciphertext), and what is written
//! below, to the disk cache's files or the blob, is never plaintext. Every read
//! is decrypted in place, in the memory it was read into, except pages of all
//! zeros: a page the blob never held reads as zeros without being decrypted,
//! so a hole is a hole through this layer too (the cache also knows the holes
//! from the blob's page ranges and never asks for them). Discards pass down as
//! they are: on the blob they become Clear Pages, which shows which ranges the
//! filesystem does not use, as dm-crypt's `allow_discards` does (a mount can
//! refuse discards instead: `--discard off`, in the FUSE layer above).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::bufpool::BufPool;
use super::{Backend, DeviceError, MAX_RUN};
use crate::luks::xts::XtsCipher;

/// Idle ciphertext buffers kept: a flush's eight runs in flight.
const POOL_KEEP: usize = 8;
/// Below this many bytes an I/O is encrypted or decrypted on the calling
/// thread; above it, on two (the machines blobdrive runs on have a few cores,
/// and a flush or read-ahead run is 4 to 16 MiB).
const SPLIT_AT: usize = 1 << 20;

/// The data segment of a LUKS2 drive over `inner`, the disk below.
pub struct CryptLayer {
    inner: Arc<dyn Backend>,
    cipher: XtsCipher,
    /// Where the data segment starts on the disk below.
    offset: u64,
    pool: Arc<BufPool>,
}

impl CryptLayer {
    pub fn new(inner: Arc<dyn Backend>, cipher: XtsCipher, offset: u64) -> CryptLayer {
        CryptLayer {
            inner,
            cipher,
            offset,
            pool: BufPool::new(MAX_RUN as usize, POOL_KEEP),
        }
    }

    /// The runs' ciphertext, each in a pooled buffer, placed on the disk below.
    fn encrypt_runs(&self, runs: Vec<(u64, Bytes)>) -> Vec<(u64, Bytes)> {
        runs.into_iter()
            .map(|(at, plain)| {
                let mut buf = self.pool.take_filled(plain.len());
                buf.copy_from_slice(&plain);
                self.on_two_threads(at, &mut buf, true);
                (at + self.offset, self.pool.freeze(buf))
            })
            .collect()
    }

    /// Decrypts `parts`, consecutive from `at`, in place.
    fn decrypt_parts(&self, at: u64, parts: &mut [&mut [u8]]) {
        let mut pos = at;
        for p in parts.iter_mut() {
            self.on_two_threads(pos, p, false);
            pos += p.len() as u64;
        }
    }

    /// Encrypts or decrypts `buf` (at `at` in the segment), a large one in two
    /// halves on two threads.
    fn on_two_threads(&self, at: u64, buf: &mut [u8], encrypt: bool) {
        let apply = |at: u64, b: &mut [u8]| {
            if encrypt {
                self.cipher.encrypt(at, b)
            } else {
                self.cipher.decrypt_data(at, b)
            }
        };
        if buf.len() < SPLIT_AT {
            return apply(at, buf);
        }
        let sector = self.cipher.sector_size();
        let half = (buf.len() / 2).next_multiple_of(sector).min(buf.len());
        let (a, b) = buf.split_at_mut(half);
        std::thread::scope(|s| {
            s.spawn(|| apply(at + half as u64, b));
            apply(at, a);
        });
    }
}

impl Backend for CryptLayer {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.inner.read(offset + self.offset, buf)?;
        self.on_two_threads(offset, buf, false);
        Ok(())
    }

    fn read_scattered(&self, offset: u64, parts: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        self.inner.read_scattered(offset + self.offset, parts)?;
        self.decrypt_parts(offset, parts);
        Ok(())
    }

    fn reads_scattered(&self) -> bool {
        self.inner.reads_scattered()
    }

    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError> {
        self.inner.write_runs(self.encrypt_runs(runs))
    }

    fn write_each(&self, runs: Vec<(u64, Bytes)>) -> Vec<Result<(), DeviceError>> {
        self.inner.write_each(self.encrypt_runs(runs))
    }

    fn write_each_issued(
        &self,
        runs: Vec<(u64, Bytes)>,
        issued: Instant,
    ) -> Vec<Result<(), DeviceError>> {
        self.inner
            .write_each_issued(self.encrypt_runs(runs), issued)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.inner.discard(offset + self.offset, len)
    }

    fn read_local(&self, offset: u64, blocks: &mut [&mut [u8]]) -> bool {
        if !self.inner.read_local(offset + self.offset, blocks) {
            return false;
        }
        self.decrypt_parts(offset, blocks);
        true
    }

    fn has_local(&self) -> bool {
        self.inner.has_local()
    }

    fn fail_fast_since(&self, issued: Instant) -> Result<(), DeviceError> {
        self.inner.fail_fast_since(issued)
    }

    fn past_the_io_timeout(&self) -> bool {
        self.inner.past_the_io_timeout()
    }

    fn probe(&self) -> Result<(), DeviceError> {
        self.inner.probe()
    }
}

#[cfg(test)]
mod tests;
