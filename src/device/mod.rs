//! The disk as a stack of layers, each testable alone.
//!
//! [`Backend`] is what the cache talks to: whole 512-byte pages, runs of at most
//! 4 MiB. [`remote::RemoteBackend`] is the page blob behind it (lease id on every
//! write, fenced once the lease is lost); [`mem::MemBackend`] is an in-memory twin
//! for tests. [`cache::Cache`] is the write-back page cache with the sparse map
//! ([`sparse::SparseMap`]) that makes holes free, and is what FUSE serves.

pub mod blockmem;
pub mod bufpool;
pub mod cache;
pub mod diskcache;
pub mod health;
pub mod mem;
pub mod remote;
pub mod sectors;
pub mod sparse;

use bytes::Bytes;
use thiserror::Error;

/// Bytes per page: every backend offset and length is a multiple of it.
pub const SECTOR: u64 = 512;
/// Longest run a single backend write may carry (the Put Page limit).
pub const MAX_RUN: u64 = 4 * 1024 * 1024;

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
    /// Writes runs of whole pages, each at most [`MAX_RUN`], possibly in parallel.
    /// On error some runs may have landed; the caller keeps all of them dirty and
    /// re-sends the same bytes to the same ranges later.
    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError>;
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
}
