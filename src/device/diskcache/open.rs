//! Opening a drive's disk cache: with what a clean unmount left, when the blob
//! is still as that unmount saw it, or empty.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::Instant;

use tracing::{info, warn};

use super::files::{BlobState, Files};
use super::index::{Chunk, Index, CHUNK};
use super::DiskCache;

/// The most recently used of `entries` (least recently used first) that fit in
/// `slots` slots, each moved into one of them if it sat beyond: a cache mounted
/// again with a smaller limit keeps what fits instead of starting empty. An
/// entry whose move fails is left out.
fn keep_what_fits(files: &Files, slots: u32, mut entries: Vec<(u64, Chunk)>) -> Vec<(u64, Chunk)> {
    let keep_from = entries.len().saturating_sub(slots as usize);
    let mut kept = entries.split_off(keep_from);
    let mut taken = vec![false; slots as usize];
    for (_, c) in &kept {
        if let Some(t) = taken.get_mut(c.slot as usize) {
            *t = true;
        }
    }
    let mut free = (0..slots).filter(|s| !taken[*s as usize]);
    kept.retain_mut(|(chunk, c)| {
        if c.slot < slots {
            return true;
        }
        let Some(to) = free.next() else {
            return false;
        };
        match files.move_slot(c.slot, to) {
            Ok(()) => {
                c.slot = to;
                true
            }
            Err(e) => {
                warn!("disk cache: cannot keep chunk {chunk} in the smaller cache: {e}");
                false
            }
        }
    });
    kept
}

impl DiskCache {
    /// Opens the cache of one drive: directory `name` under `parent`, at most
    /// `limit` bytes. What a clean unmount left is used if `now` (the blob as it
    /// is) is what that unmount recorded; otherwise the cache starts empty.
    ///
    /// `may_start_warm` is false for a read-only mount of a live blob: another
    /// writer may change the blob after this mount read its state, and bytes
    /// kept from before the mount would then be served for ranges it first
    /// reads afterwards, where a mount without the disk cache reads the new
    /// ones. So such a mount starts it empty: each block is as this mount first
    /// read it, with or without the disk cache.
    pub fn open(
        parent: &Path,
        name: &str,
        limit: u64,
        now: &BlobState,
        may_start_warm: bool,
    ) -> Result<DiskCache, String> {
        let shown = parent.join(name);
        let files = Files::open(parent, name)?;
        DiskCache::open_files(files, shown, limit, now, may_start_warm)
    }

    /// Like [`DiskCache::open`], in the drive's directory `dir` opened and
    /// locked already (by a split daemon's root part, which holds the lock:
    /// `files::open_drive_dir`); `shown` names it.
    pub fn open_in(
        dir: std::fs::File,
        shown: std::path::PathBuf,
        limit: u64,
        now: &BlobState,
        may_start_warm: bool,
    ) -> Result<DiskCache, String> {
        let files = Files::open_in(dir, None, &shown)?;
        DiskCache::open_files(files, shown, limit, now, may_start_warm)
    }

    fn open_files(
        files: Files,
        shown: std::path::PathBuf,
        limit: u64,
        now: &BlobState,
        may_start_warm: bool,
    ) -> Result<DiskCache, String> {
        let slots = u32::try_from(limit / CHUNK).unwrap_or(u32::MAX).max(1);
        let left = files
            .take_index(slots)
            .map_err(|e| format!("cannot read {}/index: {e}", shown.display()))?;
        let (index, warm) = match left {
            Some((state, entries)) if &state == now && may_start_warm => {
                info!(
                    "disk cache {}: the blob is as the last clean unmount left it; using {} chunks",
                    shown.display(),
                    entries.len()
                );
                let entries = keep_what_fits(&files, slots, entries);
                (Index::with_entries(slots, entries), true)
            }
            Some(_) if !may_start_warm => {
                info!(
                    "disk cache {}: a read-only mount of a live blob starts it empty",
                    shown.display()
                );
                (Index::new(slots), false)
            }
            Some(_) => {
                info!(
                    "disk cache {}: the blob changed since the last clean unmount; emptied",
                    shown.display()
                );
                (Index::new(slots), false)
            }
            None => (Index::new(slots), false),
        };
        files
            .size_data(slots, warm)
            .map_err(|e| format!("cannot size {}/data: {e}", shown.display()))?;
        Ok(DiskCache {
            files,
            shown,
            limit: u64::from(slots) * CHUNK,
            index: Mutex::new(index),
            on: AtomicBool::new(true),
            off_reason: Mutex::new(None),
            warm,
            last_check: Mutex::new(Instant::now()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            miss_bytes: AtomicU64::new(0),
            stored_bytes: AtomicU64::new(0),
            checksum_failures: AtomicU64::new(0),
        })
    }
}
