use std::cell::Cell;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::files::BlobState;
use super::index::{CHUNK, PIECE};
use super::*;
use crate::device::DeviceError;

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
    let me = std::process::id();
    assert!(e.contains(&format!("is in use by pid {me}")), "{e}");
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
