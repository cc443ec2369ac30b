//! The disk as a stack of layers, each testable alone.
//!
//! [`Backend`] is what the cache talks to: whole 512-byte pages, runs of at most
//! 4 MiB. [`remote::RemoteBackend`] is the page blob behind it (lease id on every
//! write, fenced once the lease is lost); [`mem::MemBackend`] is an in-memory twin
//! for tests; [`diskcache::tier::DiskTier`] puts the disk cache in front of
//! either, and [`stack::Stack`] composes a mount's layers at start-up.
//! [`cache::Cache`] is the write-back page cache with the sparse map
//! ([`sparse::SparseMap`]) that makes holes free, and is what FUSE serves.

pub mod blockmem;
pub mod bufpool;
pub mod cache;
pub mod crypt;
pub mod diskcache;
pub mod health;
pub mod mem;
pub mod remote;
pub mod sectors;
pub mod sparse;
pub mod stack;

use bytes::Bytes;
use thiserror::Error;

/// Bytes per page: every backend offset and length is a multiple of it.
pub const SECTOR: u64 = 512;
/// Longest run a single backend write may carry (the Put Page limit).
pub const MAX_RUN: u64 = 4 * 1024 * 1024;
/// Longest ranged read sent at once. A GET's range has no limit, and the
/// service's cost is largely per request: Azurite, in memory on this project's
/// 2-core machine, served 1 GiB in 4 MiB ranges at 313-383 MiB/s, in 8 MiB ranges
/// at 642 and in 16 MiB ranges at 819-885 (and 590 in 32 MiB ones); on Azure each
/// request is also a billed transaction. Sequential read-ahead fetches runs this
/// long where the backend reads them straight into cache blocks
/// ([`Backend::reads_scattered`]).
pub const MAX_GET: u64 = 16 * 1024 * 1024;

/// Whether a mount's lease was lost, and when: set once, by whichever part finds
/// out first (a write the service refused for the lease, the lease keeper's
/// renewal), read by every write, which then fails at once, and by the unmount,
/// which says when it happened.
#[derive(Debug, Default)]
pub struct LeaseLoss {
    lost: std::sync::atomic::AtomicBool,
    /// When it was lost, in milliseconds since the epoch; 0 while held.
    at_unix_ms: std::sync::atomic::AtomicU64,
}

impl LeaseLoss {
    pub fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Marks the lease lost now; true for the first to find out.
    pub fn lose(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis().max(1) as u64);
        // The time first, so that whoever sees the loss sees when.
        let _ = self.at_unix_ms.compare_exchange(0, now, SeqCst, SeqCst);
        !self.lost.swap(true, SeqCst)
    }

    /// When the lease was lost, once it was.
    pub fn lost_at(&self) -> Option<std::time::SystemTime> {
        let ms = self.at_unix_ms.load(std::sync::atomic::Ordering::SeqCst);
        (self.is_lost() && ms > 0)
            .then(|| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
    }
}

/// Why an I/O failed; FUSE turns each into an errno.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// The lease was lost: another party owns the drive now. Nothing is written any
    /// more, and this error is final.
    #[error("the lease on the drive was lost: writing stopped ({0})")]
    LeaseLost(String),
    /// The storage service could not be reached or refused the request.
    #[error("{0}")]
    Io(String),
    /// A write to a read-only drive.
    #[error("the drive is mounted read-only")]
    ReadOnly,
    /// Offset or length outside the disk.
    #[error("range {offset}+{len} is outside the disk")]
    OutOfRange { offset: u64, len: u64 },
}

impl DeviceError {
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::LeaseLost(_) | DeviceError::Io(_) => libc::EIO,
            DeviceError::ReadOnly => libc::EROFS,
            DeviceError::OutOfRange { .. } => libc::EINVAL,
        }
    }
}

/// A disk of whole pages below the cache.
pub trait Backend: Send + Sync + 'static {
    /// Fills `buf` from `offset`; both multiples of [`SECTOR`].
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError>;
    /// Fills `parts` one after another from `offset`, as [`Self::read`] would
    /// fill one buffer of their total length (at most [`MAX_GET`]). This default
    /// reads through a buffer of its own; backends that answer
    /// [`Self::reads_scattered`] read straight into the parts.
    fn read_scattered(&self, offset: u64, parts: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        read_through_buffer(self, offset, parts)
    }
    /// Whether [`Self::read_scattered`] needs no buffer of its own: read-ahead
    /// then fetches runs of [`MAX_GET`] straight into new cache blocks, and
    /// otherwise runs of [`MAX_RUN`] through the cache's pooled buffers.
    fn reads_scattered(&self) -> bool {
        false
    }
    /// Writes runs of whole pages, each at most [`MAX_RUN`], possibly in parallel.
    /// On error some runs may have landed; the caller keeps all of them dirty and
    /// re-sends the same bytes to the same ranges later.
    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError>;
    /// [`Self::write_runs`] with one result per run, in order, so that a layer
    /// above (the disk tier) keeps what landed of a write that failed in part.
    /// This default answers for all the runs at once.
    fn write_each(&self, runs: Vec<(u64, Bytes)>) -> Vec<Result<(), DeviceError>> {
        let n = runs.len();
        vec![self.write_runs(runs); n]
    }
    /// [`Self::write_each`] for an I/O issued at `issued`, which may have waited
    /// for another flush before it: past an outage's I/O timeout, its one try
    /// is over a request timeout after `issued` (the wait counts), or a moment
    /// after it starts if it starts later (see [`remote::RemoteBackend`]). This
    /// default takes no account of when.
    fn write_each_issued(
        &self,
        runs: Vec<(u64, Bytes)>,
        _issued: std::time::Instant,
    ) -> Vec<Result<(), DeviceError>> {
        self.write_each(runs)
    }
    /// Deallocates whole pages (they read as zeros afterwards).
    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError>;
    /// Fills `blocks` (cache blocks, consecutive from `offset`) straight from a
    /// local copy, if the backend holds every byte of them there (a disk cache):
    /// read-ahead then lands in the cache's own memory, with no buffer between.
    /// `false`: nothing was read, and the caller reads the usual way.
    fn read_local(&self, _offset: u64, _blocks: &mut [&mut [u8]]) -> bool {
        false
    }
    /// Whether [`Self::read_local`] can ever succeed (a disk cache is on).
    fn has_local(&self) -> bool {
        false
    }
    /// Fails at once if the backend's outage is past its I/O timeout and a try
    /// failed since `issued` (a flush that waited for another one had its one
    /// try made for it); `Ok` otherwise, and always for a backend without one.
    fn fail_fast_since(&self, _issued: std::time::Instant) -> Result<(), DeviceError> {
        Ok(())
    }
    /// Whether the backend's outage is past its I/O timeout: the background
    /// flusher then [`Self::probe`]s instead of flushing.
    fn past_the_io_timeout(&self) -> bool {
        false
    }
    /// One try at reaching the service without sending data, which ends the
    /// outage if it answers.
    fn probe(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

/// The error to report of several runs': a lost lease outranks any other.
fn first_error(results: Vec<Result<(), DeviceError>>) -> Result<(), DeviceError> {
    let mut first = None;
    for r in results {
        if let Err(e) = r {
            if matches!(e, DeviceError::LeaseLost(_)) || first.is_none() {
                first = Some(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// [`Backend::read_scattered`] through one buffer: [`Backend::read`] into it, then
/// copied into the parts.
fn read_through_buffer<B: Backend + ?Sized>(
    backend: &B,
    offset: u64,
    parts: &mut [&mut [u8]],
) -> Result<(), DeviceError> {
    let mut buf = vec![0; parts.iter().map(|p| p.len()).sum()];
    backend.read(offset, &mut buf)?;
    fill_parts(parts, &buf);
    Ok(())
}

/// Copies the start of `src` into `parts`, one after another; returns the bytes
/// copied.
fn fill_parts(parts: &mut [&mut [u8]], src: &[u8]) -> usize {
    let mut at = 0;
    for p in parts.iter_mut() {
        p.copy_from_slice(&src[at..at + p.len()]);
        at += p.len();
    }
    at
}
