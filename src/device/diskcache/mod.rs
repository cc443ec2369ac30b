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

mod direct;
pub mod files;
pub mod index;
pub mod reclaim;
pub mod tier;
pub mod warm;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

use self::files::{BlobState, Files};
use self::index::{Chunk, Index, CHUNK, PIECE, PIECES};
use super::DeviceError;

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

    /// Like [`DiskCache::open`], in the drive's directory `dir` opened already
    /// (by a split daemon's root part: `files::open_drive_dir`); `shown` names it.
    pub fn open_in(
        dir: std::fs::File,
        shown: std::path::PathBuf,
        limit: u64,
        now: &BlobState,
        may_start_warm: bool,
    ) -> Result<DiskCache, String> {
        let files = Files::open_in(dir, &shown)?;
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

    /// Fills `buf` (the drive's bytes from `offset`, sector-aligned) from the
    /// tier where it holds them, and the rest with `fetch`, storing what was
    /// fetched.
    pub fn read<F>(&self, offset: u64, buf: &mut [u8], mut fetch: F) -> Result<(), DeviceError>
    where
        F: FnMut(u64, &mut [u8]) -> Result<(), DeviceError>,
    {
        if !self.is_on() || buf.is_empty() {
            return fetch(offset, buf);
        }
        let end = offset + buf.len() as u64;
        let first = offset / PIECE;
        let last = (end - 1) / PIECE;
        let (epoch, found) = {
            let mut ix = self.lock();
            let epoch = ix.fetch_begins();
            let found: Vec<Option<(u32, u32)>> = (first..=last).map(|p| ix.lookup(p)).collect();
            (epoch, found)
        };
        let mut served = vec![false; found.len()];
        let mut failed = None;
        let whole = |i: usize| {
            let p = first + i as u64;
            p * PIECE >= offset && (p + 1) * PIECE <= end
        };
        let mut i = 0;
        while i < found.len() && failed.is_none() {
            let Some((slot, crc)) = found[i] else {
                i += 1;
                continue;
            };
            // Whole pieces held next to each other in one slot: one read. A
            // piece the request covers only in part (at its edges) alone.
            // (Reading on across slots that follow each other in the file, as
            // `read_held` does, made warm reads slower here, through the bounce
            // buffer: 2050-2270 MiB/s against 2440-2620 in seven warm remounts each.)
            let mut j = i + 1;
            while whole(i)
                && j < found.len()
                && whole(j)
                && (first + j as u64) % PIECES as u64 != 0
                && found[j].is_some_and(|(s, _)| s == slot)
            {
                j += 1;
            }
            let p = first + i as u64;
            let at = u64::from(slot) * CHUNK + p % PIECES as u64 * PIECE;
            let result = if whole(i) {
                self.read_pieces(p, at, &found[i..j], offset, buf)
                    .map(|ok| served[i..j].copy_from_slice(&ok))
            } else {
                self.read_part(p, slot, crc, offset, buf)
                    .map(|ok| served[i] = ok)
            };
            if let Err(e) = result {
                failed = Some(e);
            }
            i = j;
        }
        {
            let mut ix = self.lock();
            for (slot, _) in found.iter().flatten() {
                ix.unpin(*slot);
            }
        }
        if let Some(e) = failed {
            self.off(format!("reading {}/data: {e}", self.shown.display()));
        }
        let hits = served.iter().filter(|s| **s).count() as u64;
        self.hits.fetch_add(hits, Relaxed);
        self.misses.fetch_add(served.len() as u64 - hits, Relaxed);
        // What the tier did not serve, in runs, from the blob.
        let mut result = Ok(());
        let mut i = 0;
        while i < served.len() {
            if served[i] {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < served.len() && !served[j] {
                j += 1;
            }
            let s = ((first + i as u64) * PIECE).max(offset);
            let e = ((first + j as u64) * PIECE).min(end);
            let part = &mut buf[(s - offset) as usize..(e - offset) as usize];
            if let Err(err) = fetch(s, part) {
                result = Err(err);
                break;
            }
            self.miss_bytes.fetch_add(e - s, Relaxed);
            // Whole pieces of what was fetched go to the tier.
            let ps = s.div_ceil(PIECE) * PIECE;
            let pe = e / PIECE * PIECE;
            if ps < pe {
                self.store(
                    ps,
                    &buf[(ps - offset) as usize..(pe - offset) as usize],
                    epoch,
                );
            }
            i = j;
        }
        self.lock().fetch_done(epoch);
        result
    }

    /// Fills `pieces` (whole pieces, consecutive from `offset`) from the tier if it
    /// holds every one of them and each matches its crc; `false` otherwise, and
    /// then nothing counts as served (a piece that failed its checksum is
    /// forgotten, so the caller's usual read fetches it). Runs of pieces next to
    /// each other in the data file are one read, straight into the pieces.
    pub fn read_held(&self, offset: u64, pieces: &mut [&mut [u8]]) -> bool {
        if !self.is_on()
            || pieces.is_empty()
            || offset % PIECE != 0
            || pieces.iter().any(|p| p.len() as u64 != PIECE)
        {
            return false;
        }
        let first = offset / PIECE;
        let found: Vec<Option<(u32, u32)>> = {
            let mut ix = self.lock();
            (first..first + pieces.len() as u64)
                .map(|p| ix.lookup(p))
                .collect()
        };
        let unpin = |found: &[Option<(u32, u32)>]| {
            let mut ix = self.lock();
            for (slot, _) in found.iter().flatten() {
                ix.unpin(*slot);
            }
        };
        if found.iter().any(Option::is_none) {
            unpin(&found);
            return false;
        }
        let at = |k: usize| {
            let (slot, _) = found[k].expect("all held");
            u64::from(slot) * CHUNK + (first + k as u64) % PIECES as u64 * PIECE
        };
        let mut read = Ok(());
        let mut i = 0;
        while i < pieces.len() && read.is_ok() {
            let mut j = i + 1;
            while j < pieces.len() && at(j) == at(j - 1) + PIECE {
                j += 1;
            }
            read = self.files.read_data_vectored(&mut pieces[i..j], at(i));
            i = j;
        }
        unpin(&found);
        if let Err(e) = read {
            self.off(format!("reading {}/data: {e}", self.shown.display()));
            return false;
        }
        let mut all = true;
        for (k, bytes) in pieces.iter().enumerate() {
            if crc32c::crc32c(bytes) != found[k].expect("all held").1 {
                self.count_checked(first + k as u64, false, PIECE);
                all = false;
            }
        }
        if all {
            let n = pieces.len() as u64;
            self.hits.fetch_add(n, Relaxed);
            self.hit_bytes.fetch_add(n * PIECE, Relaxed);
        }
        all
    }

    /// Reads whole pieces `p..` (as many as `found` holds, all inside `buf`,
    /// next to each other in the data file from `at`) with one read, and says
    /// which matched their crc; those that did not are forgotten (a miss).
    fn read_pieces(
        &self,
        p: u64,
        at: u64,
        found: &[Option<(u32, u32)>],
        offset: u64,
        buf: &mut [u8],
    ) -> std::io::Result<Vec<bool>> {
        let start = (p * PIECE - offset) as usize;
        let part = &mut buf[start..start + found.len() * PIECE as usize];
        self.files.read_data(part, at)?;
        let ok: Vec<bool> = part
            .chunks(PIECE as usize)
            .zip(found)
            .map(|(bytes, f)| f.is_some_and(|(_, crc)| crc32c::crc32c(bytes) == crc))
            .collect();
        for (k, good) in ok.iter().enumerate() {
            self.count_checked(p + k as u64, *good, PIECE);
        }
        Ok(ok)
    }

    /// Counts a piece read from the data file: its bytes served, or its
    /// checksum failure (the piece forgotten).
    fn count_checked(&self, p: u64, good: bool, bytes: u64) {
        if good {
            self.hit_bytes.fetch_add(bytes, Relaxed);
        } else {
            self.checksum_failures.fetch_add(1, Relaxed);
            warn!(
                "disk cache {}: the block at {} failed its checksum; read from the blob instead",
                self.shown.display(),
                p * PIECE
            );
            self.lock().drop_piece(p);
        }
    }

    /// Copies the part of piece `p` inside `offset..` (a piece the request
    /// covers only in part) into `buf` from `slot`, if the whole piece's bytes
    /// match `crc`. `Ok(false)`: they did not (a miss; the piece is forgotten).
    /// `Err`: the data file could not be read.
    fn read_part(
        &self,
        p: u64,
        slot: u32,
        crc: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> std::io::Result<bool> {
        let end = offset + buf.len() as u64;
        let (ps, pe) = (p * PIECE, (p + 1) * PIECE);
        let mut whole = vec![0u8; PIECE as usize];
        self.files
            .read_data(&mut whole, u64::from(slot) * CHUNK + ps % CHUNK)?;
        let ok = crc32c::crc32c(&whole) == crc;
        if ok {
            let (s, e) = (ps.max(offset), pe.min(end));
            buf[(s - offset) as usize..(e - offset) as usize]
                .copy_from_slice(&whole[(s - ps) as usize..(e - ps) as usize]);
        }
        self.count_checked(p, ok, pe.min(end) - ps.max(offset));
        Ok(ok)
    }

    /// Stores whole pieces (`start` and `data.len()` multiples of [`PIECE`]),
    /// leaving out any a change touched after `since` (a registered fetch's
    /// epoch): checked before the bytes go to the data file and again before
    /// they count as held.
    fn store(&self, start: u64, data: &[u8], since: u64) {
        use std::os::unix::fs::FileExt;
        if !self.is_on() {
            return;
        }
        let end = start + data.len() as u64;
        let unchanged = |ix: &Index, i: usize, chunk: u64| {
            let s = chunk * CHUNK + i as u64 * PIECE;
            !ix.changed_since(since, s, s + PIECE)
        };
        let mut pos = start;
        while pos < end {
            let chunk = pos / CHUNK;
            let ce = ((chunk + 1) * CHUNK).min(end);
            let first = ((pos % CHUNK) / PIECE) as usize;
            let last = first + ((ce - pos) / PIECE) as usize;
            let reserved = {
                let mut ix = self.lock();
                let wanted: Vec<usize> = (first..last)
                    .filter(|&i| unchanged(&ix, i, chunk))
                    .collect();
                if wanted.is_empty() {
                    None
                } else {
                    let slot = ix.reserve(chunk);
                    if let Some(_s) = slot {
                        ix.clear(chunk, wanted.iter().fold(0u16, |m, i| m | 1 << i));
                    }
                    slot.map(|s| (s, wanted))
                }
            };
            if let Some((slot, wanted)) = reserved {
                // Pieces i..j of the chunk, as bytes of `data`.
                let pieces = |i: usize, j: usize| {
                    let s = (chunk * CHUNK + i as u64 * PIECE - start) as usize;
                    &data[s..s + (j - i) * PIECE as usize]
                };
                let mut written = Ok(());
                let mut crcs = Vec::with_capacity(wanted.len());
                let mut k = 0;
                while k < wanted.len() && written.is_ok() {
                    // One write per run of adjacent pieces.
                    let mut n = 1;
                    while k + n < wanted.len() && wanted[k + n] == wanted[k] + n {
                        n += 1;
                    }
                    let (i, j) = (wanted[k], wanted[k] + n);
                    let at = u64::from(slot) * CHUNK + i as u64 * PIECE;
                    written = self.files.data.write_all_at(pieces(i, j), at);
                    if written.is_ok() {
                        crcs.extend((i..j).map(|p| (p, crc32c::crc32c(pieces(p, p + 1)))));
                    }
                    k += n;
                }
                {
                    let mut ix = self.lock();
                    if written.is_ok() {
                        for (i, crc) in crcs {
                            if unchanged(&ix, i, chunk) {
                                ix.set_valid(chunk, slot, i, crc);
                            }
                        }
                    }
                    ix.unpin(slot);
                }
                match written {
                    Ok(()) => {
                        self.stored_bytes
                            .fetch_add(wanted.len() as u64 * PIECE, Relaxed);
                    }
                    Err(e) => {
                        let why = match e.raw_os_error() {
                            Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
                                format!("its filesystem is full ({e})")
                            }
                            _ => format!("writing {}/data: {e}", self.shown.display()),
                        };
                        self.off(why);
                        return;
                    }
                }
            }
            pos = ce;
        }
        self.check_removed();
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

    /// A write or discard of `start..end` is about to be sent: the tier forgets
    /// what it held there.
    pub fn change_begins(&self, start: u64, end: u64) {
        if self.is_on() {
            self.lock().changed(start, end);
        }
    }

    /// A write or discard of `start..end` was answered. `written`: the bytes a
    /// successful write put there (whole pieces of it are stored); `None` for a
    /// discard or a failed write, whose pieces are forgotten again.
    pub fn change_ends(&self, start: u64, end: u64, written: Option<&[u8]>) {
        if !self.is_on() {
            return;
        }
        let since = {
            let mut ix = self.lock();
            ix.changed(start, end);
            ix.fetch_begins()
        };
        if let Some(data) = written {
            let ps = start.div_ceil(PIECE) * PIECE;
            let pe = end / PIECE * PIECE;
            if ps < pe {
                self.store(
                    ps,
                    &data[(ps - start) as usize..(pe - start) as usize],
                    since,
                );
            }
        }
        self.lock().fetch_done(since);
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
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::os::unix::fs::PermissionsExt;

    /// A private directory for one test's caches (root's, 0700: the tests run as
    /// root, as the daemon does).
    pub(super) fn parent(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bd-diskcache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    pub(super) fn state(etag: &str) -> BlobState {
        BlobState {
            etag: etag.into(),
            content_length: 64 << 20,
            sequence_number: 0,
        }
    }

    /// The drive's byte at `i`.
    fn byte(i: u64) -> u8 {
        (i * 31 % 251) as u8
    }

    /// A fetch from a blob of [`byte`]s, counting the bytes asked for.
    fn blob(asked: &Cell<u64>) -> impl FnMut(u64, &mut [u8]) -> Result<(), DeviceError> + '_ {
        move |o, b| {
            asked.set(asked.get() + b.len() as u64);
            for (k, x) in b.iter_mut().enumerate() {
                *x = byte(o + k as u64);
            }
            Ok(())
        }
    }

    fn read(t: &DiskCache, offset: u64, len: usize, asked: &Cell<u64>) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        t.read(offset, &mut buf, blob(asked)).unwrap();
        for (k, x) in buf.iter().enumerate() {
            assert_eq!(*x, byte(offset + k as u64), "byte {}", offset + k as u64);
        }
        buf
    }

    #[test]
    fn fetched_data_is_served_again_and_after_a_sealed_reopen_only_if_the_blob_is_unchanged() {
        let dir = parent("reopen");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        read(&t, 3 * PIECE, 5 * PIECE as usize, &asked);
        assert_eq!(asked.get(), 5 * PIECE);
        // The same range, and a part of it not on piece bounds: no fetch.
        read(&t, 3 * PIECE, 5 * PIECE as usize, &asked);
        read(&t, 4 * PIECE + 512, 1024, &asked);
        assert_eq!(asked.get(), 5 * PIECE);
        t.seal(&state("a")).unwrap();
        drop(t);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        assert!(t.stats().warm_start);
        read(&t, 3 * PIECE, 5 * PIECE as usize, &asked);
        assert_eq!(asked.get(), 5 * PIECE, "warm after a clean reopen");
        // Not sealed this time (as after a crash): the next open starts empty.
        drop(t);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        assert!(!t.stats().warm_start);
        read(&t, 3 * PIECE, 5 * PIECE as usize, &asked);
        assert_eq!(asked.get(), 10 * PIECE);
        t.seal(&state("a")).unwrap();
        drop(t);
        // Sealed, but the blob changed since.
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("b"), true).unwrap();
        assert!(!t.stats().warm_start);
        read(&t, 3 * PIECE, 5 * PIECE as usize, &asked);
        assert_eq!(asked.get(), 15 * PIECE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_smaller_limit_keeps_the_most_recent_chunks_that_fit() {
        let dir = parent("shrink");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        for c in 0..12 {
            read(&t, c * CHUNK, CHUNK as usize, &asked);
        }
        t.seal(&state("a")).unwrap();
        drop(t);
        let t = DiskCache::open(&dir, "d", 8 * CHUNK, &state("a"), true).unwrap();
        assert!(t.stats().warm_start, "a smaller limit keeps what fits");
        // The eight read last are there (moved into the eight slots left), and
        // read back right; the first four are not.
        let before = asked.get();
        for c in 4..12 {
            read(&t, c * CHUNK, CHUNK as usize, &asked);
        }
        assert_eq!(
            asked.get(),
            before,
            "the newest eight are served from the disk"
        );
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(asked.get(), before + CHUNK, "the oldest did not fit");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_read_only_mount_of_a_live_blob_starts_empty() {
        let dir = parent("live-ro");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        read(&t, 0, CHUNK as usize, &asked);
        t.seal(&state("a")).unwrap();
        drop(t);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), false).unwrap();
        assert!(!t.stats().warm_start);
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(asked.get(), 2 * CHUNK, "fetched again, as it is now");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_open_of_the_same_drive_is_refused() {
        let dir = parent("lock");
        let _t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        let e = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true)
            .err()
            .unwrap();
        assert!(e.contains("in use by another mount"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Flips byte `at` of drive `d`'s data file: the drive's byte `at` where
    /// chunk 0 is in slot 0, as in a cache that stored it first.
    fn corrupt(dir: &Path, at: u64) {
        use std::os::unix::fs::FileExt;
        let data = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("d/data"))
            .unwrap();
        data.write_all_at(&[!byte(at)], at).unwrap();
    }

    /// Checks that `pieces` hold the drive's bytes from `offset`.
    fn holds(pieces: &[&mut [u8]], offset: u64) {
        for (k, p) in pieces.iter().enumerate() {
            let at = offset + k as u64 * PIECE;
            assert!(
                p.iter().enumerate().all(|(i, x)| *x == byte(at + i as u64)),
                "piece at {at}"
            );
        }
    }

    #[test]
    fn held_pieces_are_read_straight_into_block_memory_all_or_nothing() {
        use crate::device::blockmem::BlockMem;
        let dir = parent("held");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        // Two chunks (in slots next to each other: one read across both) and
        // the first piece of a third.
        read(&t, 0, 2 * CHUNK as usize, &asked);
        read(&t, 2 * CHUNK, PIECE as usize, &asked);
        let hits = t.stats().hits;
        // Into memory like the cache's blocks (parts of huge-page mappings).
        let mut mems = BlockMem::batch(32, PIECE as usize);
        let mut parts: Vec<&mut [u8]> = mems.iter_mut().map(|m| &mut m[..]).collect();
        assert!(t.read_held(0, &mut parts));
        holds(&parts, 0);
        assert_eq!(t.stats().hits, hits + 32);
        // Into heap memory (not aligned for direct reads): the same bytes.
        let mut heap = [vec![0u8; PIECE as usize], vec![0u8; PIECE as usize + 1]];
        let mut parts: Vec<&mut [u8]> = heap.iter_mut().map(|h| &mut h[..PIECE as usize]).collect();
        assert!(t.read_held(3 * PIECE, &mut parts));
        holds(&parts, 3 * PIECE);
        // Not every piece held: nothing served, nothing counted.
        let mut parts: Vec<&mut [u8]> = mems.iter_mut().take(2).map(|m| &mut m[..]).collect();
        assert!(!t.read_held(2 * CHUNK, &mut parts));
        assert_eq!(t.stats().hits, hits + 34);
        // A corrupted piece: nothing served, that piece forgotten (the usual
        // read then fetches it), the failure counted.
        corrupt(&dir, 5 * PIECE + 9);
        let mut parts: Vec<&mut [u8]> = mems.iter_mut().take(16).map(|m| &mut m[..]).collect();
        assert!(!t.read_held(0, &mut parts));
        assert_eq!(t.stats().checksum_failures, 1);
        assert!(!t.read_held(0, &mut parts));
        assert_eq!(t.stats().checksum_failures, 1, "the piece was forgotten");
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(
            asked.get(),
            2 * CHUNK + 2 * PIECE,
            "only that piece fetched again"
        );
        assert!(t.read_held(0, &mut parts));
        holds(&parts, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupted_block_is_a_miss_and_read_from_the_blob() {
        let dir = parent("crc");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        read(&t, 0, CHUNK as usize, &asked);
        // Chunk 0 is in slot 0: flip one byte of its third piece.
        corrupt(&dir, 2 * PIECE + 77);
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(
            asked.get(),
            CHUNK + PIECE,
            "only the bad block fetched again"
        );
        assert_eq!(t.stats().checksum_failures, 1);
        // Stored again, good this time.
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(asked.get(), CHUNK + PIECE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_data_file_that_cannot_be_read_turns_the_tier_off_and_reads_go_on() {
        let dir = parent("eio");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        read(&t, 0, CHUNK as usize, &asked);
        // The data file cut short behind the tier's back: its reads fail.
        std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("d/data"))
            .unwrap()
            .set_len(0)
            .unwrap();
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(asked.get(), 2 * CHUNK, "read from the blob instead");
        let s = t.stats();
        assert!(!s.on, "{s:?}");
        assert!(s.off_reason.unwrap().contains("reading"));
        assert_eq!(s.bytes, 0);
        // Off for good: nothing is stored or served any more, I/O goes on.
        read(&t, 0, CHUNK as usize, &asked);
        assert_eq!(asked.get(), 3 * CHUNK);
        assert!(t.seal(&state("a")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_change_during_a_fetch_keeps_the_fetched_bytes_out() {
        let dir = parent("race");
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        let mut buf = vec![0u8; 2 * PIECE as usize];
        // While the fetch is under way, a write of the first piece begins and
        // ends: the fetch's (older) bytes of that piece must not be stored.
        t.read(0, &mut buf, |_, b| {
            t.change_begins(0, 512);
            t.change_ends(0, 512, None);
            b.fill(1);
            Ok(())
        })
        .unwrap();
        let asked = Cell::new(0);
        let mut again = vec![0u8; 2 * PIECE as usize];
        t.read(0, &mut again, |o, b| {
            asked.set(asked.get() + b.len() as u64);
            assert_eq!(o, 0);
            b.fill(2);
            Ok(())
        })
        .unwrap();
        assert_eq!(asked.get(), PIECE, "the changed piece is fetched again");
        assert!(again[..PIECE as usize].iter().all(|x| *x == 2));
        assert!(again[PIECE as usize..].iter().all(|x| *x == 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_data_is_stored_once_answered_and_a_failed_write_forgets() {
        let dir = parent("write");
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        let data = vec![9u8; 3 * PIECE as usize];
        // One whole piece and parts of two: only the whole one is stored.
        t.change_begins(PIECE / 2, PIECE / 2 + 3 * PIECE);
        t.change_ends(PIECE / 2, PIECE / 2 + 3 * PIECE, Some(&data));
        assert_eq!(t.stats().bytes, 2 * PIECE);
        let mut buf = vec![0u8; PIECE as usize];
        t.read(PIECE, &mut buf, |_, _| panic!("served from the disk cache"))
            .unwrap();
        assert!(buf.iter().all(|x| *x == 9));
        // A write that failed may or may not have landed: its pieces are gone.
        t.change_begins(PIECE, PIECE + 512);
        t.change_ends(PIECE, PIECE + 512, None);
        let asked = Cell::new(0);
        t.read(PIECE, &mut buf, blob(&asked)).unwrap();
        assert_eq!(asked.get(), PIECE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_size_limit_holds_least_recently_used_first() {
        let dir = parent("limit");
        let asked = Cell::new(0);
        let t = DiskCache::open(&dir, "d", MIN_SIZE, &state("a"), true).unwrap();
        for chunk in 0..8 {
            read(&t, chunk * CHUNK, CHUNK as usize, &asked);
            // Chunk 0 stays in use.
            read(&t, 0, PIECE as usize, &asked);
        }
        let s = t.stats();
        assert_eq!(s.evictions, 4);
        assert_eq!(s.bytes, MIN_SIZE);
        let len = std::fs::metadata(dir.join("d/data")).unwrap().len();
        assert!(len <= MIN_SIZE, "{len}");
        let before = asked.get();
        read(&t, 0, PIECE as usize, &asked);
        read(&t, 7 * CHUNK, CHUNK as usize, &asked);
        assert_eq!(asked.get(), before, "the most recent chunks are kept");
        read(&t, CHUNK, PIECE as usize, &asked);
        assert_eq!(asked.get(), before + PIECE, "an old one is gone");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_or_a_link_is_refused() {
        let dir = parent("perm");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = DiskCache::open(&dir, "d", MIN_SIZE, &state("a"), true)
            .err()
            .unwrap();
        assert!(e.contains("writable by no one else"), "{e}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = DiskCache::open(&link, "d", MIN_SIZE, &state("a"), true)
            .err()
            .unwrap();
        assert!(e.contains("not a directory"), "{e}");
        // A link planted where the drive's directory goes.
        std::os::unix::fs::symlink("/etc", dir.join("d")).unwrap();
        let e = DiskCache::open(&dir, "d", MIN_SIZE, &state("a"), true)
            .err()
            .unwrap();
        assert!(e.contains("not a directory"), "{e}");
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
