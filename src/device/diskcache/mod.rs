//! The disk cache: a second tier under the memory cache, on a local filesystem,
//! that outlives the mount (`mount --disk-cache DIR`).
//!
//! It holds clean data only: what was fetched from the blob, and what was written
//! once the blob has it. So fsync still means "on the blob", and losing the tier
//! (disk full, an I/O error, its directory removed, a checksum that does not
//! match) loses nothing: the tier turns itself off, or a piece is a miss, and I/O
//! goes on from memory and the service.
//!
//! Never stale: a clean unmount records the blob's ETag, length and sequence
//! number beside the index ([`files::BlobState`]), and the next mount uses the
//! cache only if the blob still has all three; anything else (another writer, a
//! restore, a mount that never ended cleanly: the index is removed as a mount
//! starts) empties it. During a mount, every write and discard is a change
//! ([`index::Index::changed`]): it forgets the pieces it touches before it is
//! sent and again once it is answered, and a fetch that was under way across a
//! change stores none of the pieces the change touched, so a late fetch can never
//! put back bytes a write replaced.
//!
//! Here: the tier's state (on, or off and why) and its figures. Which parts it
//! holds and where is the index ([`index`]); its I/O is opening what a clean
//! unmount left (`open.rs`), reading through it (`read.rs`) and storing in it
//! (`store.rs`), on its files ([`files`]).

mod direct;
pub mod files;
pub mod index;
pub mod lock;
mod open;
mod preadv;
mod read;
pub mod reclaim;
mod store;
pub mod tier;
pub mod warm;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::warn;

use self::files::{BlobState, Files};
use self::index::{Index, CHUNK};

/// How often the tier checks that its directory is still there.
const REMOVED_CHECK: Duration = Duration::from_secs(1);

/// The smallest `--disk-cache-size`.
pub const MIN_SIZE: u64 = 4 * CHUNK;

/// The disk cache of one mounted drive.
pub struct DiskCache {
    files: Files,
    shown: PathBuf,
    limit: u64,
    index: Mutex<Index>,
    on: AtomicBool,
    off_reason: Mutex<Option<String>>,
    /// Whether the mount began with what a clean unmount left.
    warm: bool,
    last_check: Mutex<Instant>,
    hits: AtomicU64,
    misses: AtomicU64,
    hit_bytes: AtomicU64,
    miss_bytes: AtomicU64,
    stored_bytes: AtomicU64,
    checksum_failures: AtomicU64,
}

/// What `stats` shows of the tier.
#[derive(Debug, Clone, Serialize)]
pub struct DiskCacheStats {
    pub dir: String,
    pub on: bool,
    pub off_reason: Option<String>,
    /// Whether the mount began with a clean unmount's cache.
    pub warm_start: bool,
    pub size_limit: u64,
    /// Bytes of the drive held.
    pub bytes: u64,
    /// Blocks (64 KiB) read from the tier, and those it did not hold.
    pub hits: u64,
    pub misses: u64,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub stored_bytes: u64,
    pub evictions: u64,
    pub checksum_failures: u64,
}

impl DiskCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// Turns the tier off for the rest of the mount, once, with one warning: I/O
    /// goes on from memory and the service.
    fn off(&self, why: String) {
        if !self.on.swap(false, Relaxed) {
            return;
        }
        warn!(
            "disk cache {} turned off: {why}; reads and writes go on from memory and the storage service",
            self.shown.display()
        );
        *self.off_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.lock().clear_all();
        // Give the space back (a full disk is a common reason to be here).
        let _ = self.files.data.set_len(0);
    }

    /// Turns the tier off if its directory was removed under the mount.
    fn check_removed(&self) {
        let mut last = self.last_check.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() < REMOVED_CHECK {
            return;
        }
        *last = Instant::now();
        drop(last);
        if self.files.removed() {
            self.off(format!("{} was removed", self.shown.display()));
        }
    }

    /// Leaves the index for the next mount: the data file is current for a blob
    /// in `state`. Only once nothing reads or writes any more (a clean unmount).
    pub fn seal(&self, state: &BlobState) -> Result<(), String> {
        if !self.is_on() {
            return Err(self
                .off_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_else(|| "off".into()));
        }
        let entries = self.lock().entries();
        self.files
            .write_index(state, &entries)
            .map_err(|e| format!("cannot write {}/index: {e}", self.shown.display()))
    }

    pub fn stats(&self) -> DiskCacheStats {
        let (bytes, evictions) = {
            let ix = self.lock();
            (ix.bytes(), ix.evictions)
        };
        DiskCacheStats {
            dir: self.shown.display().to_string(),
            on: self.is_on(),
            off_reason: self
                .off_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            warm_start: self.warm,
            size_limit: self.limit,
            bytes,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            hit_bytes: self.hit_bytes.load(Relaxed),
            miss_bytes: self.miss_bytes.load(Relaxed),
            stored_bytes: self.stored_bytes.load(Relaxed),
            evictions,
            checksum_failures: self.checksum_failures.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests;
