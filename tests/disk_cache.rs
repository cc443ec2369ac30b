//! `mount --disk-cache`, against Azurite: a remount after a clean unmount reads
//! from the local disk, not the service; anything that may have changed the blob
//! since (another writer, a SIGKILLed mount and a lease break) empties the cache
//! instead of serving a byte older than the blob's; a corrupted block is read
//! from the blob; the size limit holds; a full cache disk or a removed cache
//! directory turns the tier off and I/O goes on; a directory another user could
//! change is refused.

mod common;
mod faultproxy;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::azurite::Azurite;
use common::bd::Harness;
use common::mount::{require_root, Mp};
use common::util::{json, pattern, private_dir, sh_ok, wait_for_exit};

const MIB: u64 = 1 << 20;

const BD: Harness = Harness::new("disk-cache-run");

/// A directory to hold disk caches: root's, 0700, new for each test.
fn cache_parent(tag: &str) -> PathBuf {
    let d = BD.run_dir().join(format!("caches-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    private_dir(&d);
    d
}

/// The one drive directory blobdrive made in `parent`.
fn drive_dir(parent: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

fn mount_raw(spec: &str, mp: &Mp, extra: &[&str]) {
    BD.mount(spec, mp, &[&["--mode", "raw"], extra].concat());
}

/// Writes `data` at `offset` (a multiple of 64 KiB) and fsyncs, in pieces of one
/// FUSE request each. The file is opened for direct I/O, so one large write from
/// a heap buffer would be cut where the buffer's pages end, inside sectors; a 64
/// KiB block the flusher then sent in two parts is not stored in the disk cache
/// (only blocks a write covers whole are), which would make the counts below
/// depend on when the flusher ran.
fn write_disk(mp: &Mp, offset: u64, data: &[u8]) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(mp.disk())
        .unwrap();
    for (i, piece) in data.chunks(256 * 1024).enumerate() {
        f.write_all_at(piece, offset + (i * 256 * 1024) as u64)
            .unwrap();
    }
    f.sync_all().unwrap();
}

fn read_disk(mp: &Mp, offset: u64, len: u64) -> Vec<u8> {
    let f = std::fs::File::open(mp.disk()).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

fn disk_stats(mp: &Mp) -> serde_json::Value {
    mp.stats()["disk_cache"].clone()
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// An ext4 drive with a 64 MiB file, unmounted, mounted again with the same
/// cache and read: the file comes from the local disk (at most 5% of it from
/// the service), and the cache says it started warm.
#[test]
fn a_remount_after_a_clean_unmount_reads_from_the_disk_cache() {
    require_root();
    let spec = BD.new_drive("dc-warm", "256MiB");
    let caches = cache_parent("warm");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4", "--disk-cache", dc]);
    sh_ok(&format!(
        "head -c {1} /dev/urandom > '{0}/f' && sync '{0}/f' && sha256sum '{0}/f' | cut -d' ' -f1 > '{0}/f.sum'",
        mp.s(),
        64 * MIB
    ));
    let sum = std::fs::read_to_string(mp.path().join("f.sum")).unwrap();
    let first = disk_stats(&mp);
    assert_eq!(first["on"], true, "{first}");
    assert_eq!(first["warm_start"], false, "{first}");
    BD.unmount(&mp);
    assert!(
        drive_dir(&caches).join("index").exists(),
        "a clean unmount leaves the index"
    );
    BD.ok(&["mount", &spec, mp.s(), "--disk-cache", dc]);
    assert!(
        !drive_dir(&caches).join("index").exists(),
        "a mount takes the index away while it runs"
    );
    let again = sh_ok(&format!("sha256sum '{}/f' | cut -d' ' -f1", mp.s()));
    assert_eq!(again.trim(), sum.trim());
    let stats = mp.stats();
    let d = &stats["disk_cache"];
    assert_eq!(d["warm_start"], true, "{d}");
    let from_service = n(&stats, "bytes_downloaded");
    assert!(
        from_service * 20 <= 64 * MIB,
        "{from_service} bytes of a 64 MiB file came from the service: {stats}"
    );
    assert!(n(d, "hit_bytes") * 20 >= 19 * 64 * MIB, "{d}");
    let human = BD.ok(&["stats", mp.s()]);
    assert!(
        human.contains("disk cache:     on, started warm"),
        "{human}"
    );
    BD.unmount(&mp);
}

/// Another writer between two mounts: the cache is emptied, and every byte
/// read is the other writer's.
#[test]
fn another_writer_between_mounts_empties_the_cache() {
    require_root();
    let spec = BD.new_drive("dc-other", "64MiB");
    let caches = cache_parent("other");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    let a = pattern(1, 8 * MIB);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    write_disk(&mp, 0, &a);
    assert_eq!(read_disk(&mp, 0, 8 * MIB), a);
    BD.unmount(&mp);
    // Another writer, without the cache, rewrites the middle.
    let b = pattern(2, 2 * MIB);
    mount_raw(&spec, &mp, &[]);
    write_disk(&mp, 3 * MIB, &b);
    BD.unmount(&mp);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    let d = disk_stats(&mp);
    assert_eq!(d["warm_start"], false, "{d}");
    let mut want = a.clone();
    want[3 * MIB as usize..5 * MIB as usize].copy_from_slice(&b);
    assert!(read_disk(&mp, 0, 8 * MIB) == want, "stale bytes served");
    assert_eq!(n(&disk_stats(&mp), "hits"), 0);
    BD.unmount(&mp);
}

/// A mount SIGKILLed with its cache full, its lease broken and the drive
/// written elsewhere: the next mount serves the new bytes, never the cache's.
#[test]
fn a_killed_mount_a_lease_break_and_another_writer_leave_nothing_stale() {
    require_root();
    let spec = BD.new_drive("dc-kill", "64MiB");
    let caches = cache_parent("kill");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    let a = pattern(3, 4 * MIB);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    write_disk(&mp, 0, &a);
    assert_eq!(read_disk(&mp, 0, 4 * MIB), a);
    let pid = mp.pid();
    sh_ok(&format!("kill -KILL {pid}"));
    wait_for_exit(pid, "the daemon to end on SIGKILL", Duration::from_secs(20));
    // Cleans up after the dead daemon, then fails: the lease is still held.
    let out = BD.cmd(&["unmount", mp.s()]).output();
    assert!(!out.status.success());
    BD.ok(&["lease", "break", &spec, "--yes"]);
    let b = pattern(4, MIB);
    mount_raw(&spec, &mp, &[]);
    write_disk(&mp, MIB, &b);
    BD.unmount(&mp);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    assert_eq!(disk_stats(&mp)["warm_start"], false);
    let mut want = a.clone();
    want[MIB as usize..2 * MIB as usize].copy_from_slice(&b);
    assert!(read_disk(&mp, 0, 4 * MIB) == want, "stale bytes served");
    BD.unmount(&mp);
}

/// What a drive's cache directory holds, by name: inode, owner and size, so
/// that any file removed, replaced, given away or cut shows.
fn files_in(dir: &Path) -> Vec<(String, u64, u32, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, m.ino(), m.uid(), m.len())
        })
        .collect();
    v.sort();
    v
}

/// A disk cache directory a live mount holds is refused to every other mount
/// of the drive, a read-only one too, in one line naming the mount that holds
/// it, and nothing in it is touched: the writer's unmount leaves its index and
/// its next mount starts warm. A holder that is gone (SIGKILLed) leaves a lock
/// nobody holds, and the next mount takes the directory over.
#[test]
fn a_live_mount_s_disk_cache_is_refused_to_others_and_a_dead_one_s_taken_over() {
    require_root();
    let spec = BD.new_drive("dc-held", "64MiB");
    let caches = cache_parent("held");
    let dc = caches.to_str().unwrap();
    let (writer, reader) = (BD.mp(), BD.mp());
    let a = pattern(21, 4 * MIB);
    mount_raw(&spec, &writer, &["--disk-cache", dc]);
    write_disk(&writer, 0, &a);
    assert!(read_disk(&writer, 0, 4 * MIB) == a);
    let dir = drive_dir(&caches);
    let before = files_in(&dir);
    let owner = |p: &Path| std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p).unwrap());
    let dir_owner = owner(&dir);
    let err = BD
        .cmd(&[
            "mount",
            &spec,
            reader.s(),
            "--mode",
            "raw",
            "--read-only",
            "--disk-cache",
            dc,
        ])
        .fails_in_one_line();
    assert!(
        err.contains(&format!("in use by the mount at {}", writer.s())),
        "{err}"
    );
    assert_eq!(files_in(&dir), before, "the holder's files were touched");
    assert_eq!(owner(&dir), dir_owner);
    let listed = json(&BD.ok(&["list", "--json"]));
    assert!(
        !listed.to_string().contains(reader.s()),
        "the second mount is up"
    );
    // The writer's cache is whole: its unmount seals it and it starts warm.
    let d = disk_stats(&writer);
    assert_eq!(d["on"], true, "{d}");
    BD.unmount(&writer);
    assert!(dir.join("index").exists(), "the writer left no index");
    mount_raw(&spec, &writer, &["--disk-cache", dc]);
    assert_eq!(disk_stats(&writer)["warm_start"], true);
    // Its holder killed, the lock is held by nobody: the next mount (read-only,
    // as the lease is still the dead mount's) takes the directory over.
    let pid = writer.pid();
    sh_ok(&format!("kill -KILL {pid}"));
    wait_for_exit(pid, "the daemon to end on SIGKILL", Duration::from_secs(20));
    let _ = BD.cmd(&["unmount", writer.s()]).output();
    mount_raw(&spec, &reader, &["--read-only", "--disk-cache", dc]);
    assert!(read_disk(&reader, 0, 4 * MIB) == a);
    let d = disk_stats(&reader);
    assert_eq!(
        (d["on"].clone(), d["warm_start"].clone()),
        (true.into(), false.into()),
        "{d}"
    );
    BD.unmount(&reader);
    BD.ok(&["lease", "break", &spec, "--yes"]);
}

/// Read-only mounts: a snapshot's cache is warm on its next mount; a live blob
/// mounted read-only starts its cache empty (another writer may change the blob
/// once mounted, and bytes from before the mount would then be served where a
/// mount without the disk cache reads the new ones); it keeps it for a later
/// writable mount only if the blob did not change while it was mounted (here a
/// writer on this host changes it meanwhile).
#[test]
fn read_only_mounts_keep_their_cache_only_for_a_blob_that_did_not_change() {
    require_root();
    let spec = BD.new_drive("dc-ro", "64MiB");
    let caches = cache_parent("ro");
    let dc = caches.to_str().unwrap();
    let a = pattern(9, 4 * MIB);
    let writer = BD.mp();
    mount_raw(&spec, &writer, &[]);
    write_disk(&writer, 0, &a);
    BD.unmount(&writer);
    let snap = json(&BD.ok(&["snapshot", "create", &spec, "--json"]));
    let at = format!(
        "{spec}@{}",
        snap["snapshot"].as_str().expect("snapshot time")
    );
    let mp = BD.mp();
    // The snapshot: cold, then warm.
    for warm in [false, true] {
        mount_raw(&at, &mp, &["--disk-cache", dc]);
        assert!(read_disk(&mp, 0, 4 * MIB) == a);
        let d = disk_stats(&mp);
        assert_eq!(d["warm_start"], warm, "{d}");
        if warm {
            assert_eq!(n(&d, "hit_bytes"), 4 * MIB, "{d}");
        }
        BD.unmount(&mp);
    }
    // The live blob, read-only: never warm; unchanged while mounted, it is
    // kept for a writable mount, which starts warm.
    for _ in 0..2 {
        mount_raw(&spec, &mp, &["--read-only", "--disk-cache", dc]);
        assert!(read_disk(&mp, 0, 4 * MIB) == a);
        assert_eq!(disk_stats(&mp)["warm_start"], false);
        BD.unmount(&mp);
    }
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    assert_eq!(disk_stats(&mp)["warm_start"], true);
    BD.unmount(&mp);
    // Changed while mounted read-only: not kept, and the next mount reads the
    // new bytes.
    mount_raw(&spec, &mp, &["--read-only", "--disk-cache", dc]);
    assert!(read_disk(&mp, 0, 4 * MIB) == a);
    let b = pattern(10, MIB);
    mount_raw(&spec, &writer, &[]);
    write_disk(&writer, 0, &b);
    BD.unmount(&writer);
    BD.unmount(&mp);
    mount_raw(&spec, &mp, &["--read-only", "--disk-cache", dc]);
    assert_eq!(disk_stats(&mp)["warm_start"], false);
    assert!(read_disk(&mp, 0, MIB) == b, "stale bytes served");
    BD.unmount(&mp);
}

/// The lease broken while the drive is mounted, and the blob written by someone
/// else before the mount ends: that unmount must not keep the cache (the blob's
/// state it would record is the other writer's), and the next mount reads the
/// other writer's bytes.
#[test]
fn a_lease_broken_and_the_blob_written_while_mounted_keeps_nothing_stale() {
    require_root();
    let spec = BD.new_drive("dc-break", "64MiB");
    let caches = cache_parent("break");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    let a = pattern(11, 4 * MIB);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    write_disk(&mp, 0, &a);
    assert!(read_disk(&mp, 0, 4 * MIB) == a);
    common::mount::break_lease_from_elsewhere(&BD.cs(), &spec);
    // Another writer, straight to the blob (no lease is needed once it is broken).
    let b = pattern(12, MIB);
    common::util::rt()
        .block_on(common::azurite::blob_client(&BD.cs(), &spec).put_pages(
            2 * MIB,
            b.clone().into(),
            None,
        ))
        .unwrap();
    // The unmount may fail (the lease is gone); either way nothing is kept.
    let _ = BD.cmd(&["unmount", mp.s()]).output();
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    assert_eq!(disk_stats(&mp)["warm_start"], false);
    let mut want = a.clone();
    want[2 * MIB as usize..3 * MIB as usize].copy_from_slice(&b);
    assert!(read_disk(&mp, 0, 4 * MIB) == want, "stale bytes served");
    BD.unmount(&mp);
}

/// Bytes of the cache's data file changed behind its back: the blocks they are
/// in fail their checksum and are read from the blob.
#[test]
fn a_corrupted_cache_block_is_read_from_the_blob() {
    require_root();
    let spec = BD.new_drive("dc-crc", "64MiB");
    let caches = cache_parent("crc");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    let a = pattern(5, 4 * MIB);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    write_disk(&mp, 0, &a);
    BD.unmount(&mp);
    // The 4 MiB written are in the first four slots (1 MiB each) of the data
    // file: flip one byte in each.
    let data = drive_dir(&caches).join("data");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&data)
        .unwrap();
    for slot in 0..4 {
        let at = slot * MIB + 100_000;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[!b[0]], at).unwrap();
    }
    drop(f);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    assert!(read_disk(&mp, 0, 4 * MIB) == a, "corrupted bytes served");
    let d = disk_stats(&mp);
    assert_eq!(d["warm_start"], true, "{d}");
    assert_eq!(n(&d, "checksum_failures"), 4, "{d}");
    assert_eq!(n(&d, "hits"), 4 * 16 - 4, "{d}");
    BD.unmount(&mp);
}

/// A cache of 8 MiB under 32 MiB of reads: it never holds or takes more, the
/// oldest go first, and what it holds is what was used last.
#[test]
fn the_size_limit_holds() {
    require_root();
    let spec = BD.new_drive("dc-limit", "64MiB");
    let caches = cache_parent("limit");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    let a = pattern(6, 32 * MIB);
    mount_raw(
        &spec,
        &mp,
        &["--disk-cache", dc, "--disk-cache-size", "8MiB"],
    );
    // A MiB at a time, each fsynced: the cache stores them in that order.
    for (i, piece) in a.chunks(MIB as usize).enumerate() {
        write_disk(&mp, i as u64 * MIB, piece);
    }
    let d = disk_stats(&mp);
    assert_eq!(n(&d, "size_limit"), 8 * MIB);
    assert!(n(&d, "bytes") <= 8 * MIB, "{d}");
    assert!(n(&d, "evictions") >= 24, "{d}");
    let data = drive_dir(&caches).join("data");
    let meta = std::fs::metadata(&data).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.len() <= 8 * MIB && meta.blocks() * 512 <= 8 * MIB,
        "{meta:?}"
    );
    BD.unmount(&mp);
    // It holds the last 8 MiB written.
    mount_raw(
        &spec,
        &mp,
        &["--disk-cache", dc, "--disk-cache-size", "8MiB"],
    );
    assert!(read_disk(&mp, 24 * MIB, 8 * MIB) == a[24 * MIB as usize..]);
    let d = disk_stats(&mp);
    assert_eq!(n(&d, "hit_bytes"), 8 * MIB, "{d}");
    assert!(read_disk(&mp, 0, 32 * MIB) == a);
    assert!(n(&disk_stats(&mp), "bytes") <= 8 * MIB);
    BD.unmount(&mp);
}

/// The cache's filesystem fills up (a 4 MiB tmpfs under a 64 MiB limit), and
/// later its directory is removed: each turns the tier off with one warning,
/// and I/O goes on from memory and the service.
#[test]
fn a_full_cache_disk_or_a_removed_directory_turns_the_tier_off() {
    require_root();
    let spec = BD.new_drive("dc-full", "64MiB");
    let (small, _tmpfs) = small_cache_fs("full", "4m");
    let mp = BD.mp();
    let dc = small.to_str().unwrap();
    mount_raw(
        &spec,
        &mp,
        &["--disk-cache", dc, "--disk-cache-size", "64MiB"],
    );
    let a = pattern(7, 16 * MIB);
    write_disk(&mp, 0, &a);
    assert!(read_disk(&mp, 0, 16 * MIB) == a);
    let d = disk_stats(&mp);
    assert_eq!(d["on"], false, "{d}");
    assert!(d["off_reason"].as_str().unwrap().contains("full"), "{d}");
    let human = BD.ok(&["stats", mp.s()]);
    assert!(
        human.contains("disk cache:     off (its filesystem is full"),
        "{human}"
    );
    // One warning, in the mount's log (which goes with the mount).
    let id = blobdrive::mount::record::id_for(mp.path());
    let log =
        std::fs::read_to_string(BD.run_dir().join("mounts").join(format!("{id}.log"))).unwrap();
    assert_eq!(log.matches("turned off").count(), 1, "{log}");
    BD.unmount(&mp);

    // A removed directory.
    let caches = cache_parent("removed");
    let dc = caches.to_str().unwrap();
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    write_disk(&mp, 0, &a[..4 * MIB as usize]);
    std::fs::remove_dir_all(drive_dir(&caches)).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let b = pattern(8, 4 * MIB);
    write_disk(&mp, 4 * MIB, &b);
    let d = disk_stats(&mp);
    assert_eq!(d["on"], false, "{d}");
    assert!(d["off_reason"].as_str().unwrap().contains("removed"), "{d}");
    assert!(read_disk(&mp, 4 * MIB, 4 * MIB) == b);
    BD.unmount(&mp);
}

/// A tmpfs of `size` (mount(8)'s words, `4m`) mounted as a cache directory,
/// unmounted when the guard goes.
fn small_cache_fs(tag: &str, size: &str) -> (PathBuf, UnmountOnDrop) {
    let dir = cache_parent(tag);
    sh_ok(&format!(
        "mount -t tmpfs -o size={size},mode=0700 blobdrive-test-cache '{}'",
        dir.display()
    ));
    (dir.clone(), UnmountOnDrop(dir))
}

struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// On a small cache filesystem, the default size (half its free space) stays
/// what it was at every mount, the cache's own file counted as free, so a
/// remount starts warm; and a remount with a smaller `--disk-cache-size` keeps what
/// fits instead of starting empty.
#[test]
fn a_remount_starts_warm_whether_its_own_file_or_a_smaller_limit_shrank_the_room() {
    require_root();
    let spec = BD.new_drive("dc-shrink", "64MiB");
    let (small, _tmpfs) = small_cache_fs("shrink", "48m");
    let dc = small.to_str().unwrap();
    let mp = BD.mp();
    let a = pattern(9, 16 * MIB);
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    let limit = n(&disk_stats(&mp), "size_limit");
    assert!(
        (20 * MIB..=24 * MIB).contains(&limit),
        "{limit}: half of the 48 MiB tmpfs's free space"
    );
    for (i, piece) in a.chunks(MIB as usize).enumerate() {
        write_disk(&mp, i as u64 * MIB, piece);
    }
    BD.unmount(&mp);
    for _ in 0..2 {
        mount_raw(&spec, &mp, &["--disk-cache", dc]);
        let d = disk_stats(&mp);
        // Within a chunk or two of the first (the index and the directory take
        // a little of the room); without its own file counted, half as much.
        assert!(n(&d, "size_limit") + 2 * MIB >= limit, "{limit}: {d}");
        assert_eq!(d["warm_start"], true, "{d}");
        BD.unmount(&mp);
    }
    // Half of what it holds: the newest 8 MiB written are kept and served.
    mount_raw(
        &spec,
        &mp,
        &["--disk-cache", dc, "--disk-cache-size", "8MiB"],
    );
    let d = disk_stats(&mp);
    assert_eq!(d["warm_start"], true, "{d}");
    assert!(read_disk(&mp, 8 * MIB, 8 * MIB) == a[8 * MIB as usize..]);
    assert_eq!(n(&disk_stats(&mp), "hit_bytes"), 8 * MIB);
    assert!(read_disk(&mp, 0, 16 * MIB) == a);
    BD.unmount(&mp);
}

/// A cache directory another user could change, or a link, is refused before
/// anything is mounted, with one line.
#[test]
fn a_cache_directory_others_could_change_is_refused() {
    require_root();
    let spec = BD.new_drive("dc-perm", "64MiB");
    let mp = BD.mp();
    let theirs = cache_parent("theirs");
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let open = cache_parent("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let link = BD.run_dir().join("caches-link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(cache_parent("target"), &link).unwrap();
    for (dir, says) in [
        (&theirs, "must be root's"),
        (&open, "writable by no one else"),
        (&link, "not a directory"),
    ] {
        let err = BD
            .mount_cmd(
                &spec,
                &mp,
                &["--mode", "raw", "--disk-cache", dir.to_str().unwrap()],
            )
            .fails_in_one_line();
        assert!(err.contains(says), "{err}");
    }
    let out = BD
        .cmd(&["mount", &spec, mp.s(), "--disk-cache-size", "1GiB"])
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--disk-cache <DIR>"),
        "{err}"
    );
    let listed = json(&BD.ok(&["list", "--json"]));
    assert!(!listed.to_string().contains(mp.s()), "nothing mounted");
}

/// A cache filled through one endpoint is never served through another: a
/// proxy that rewrote bytes, or another emulator, may answer with the same
/// name, ETag, length and sequence number. The second endpoint here is a clean
/// proxy in front of the same emulator, so everything but the endpoint agrees.
#[test]
fn a_cache_filled_through_one_endpoint_is_not_served_through_another() {
    require_root();
    let spec = BD.new_drive("dc-endpoint", "16MiB");
    let caches = cache_parent("endpoint");
    let dc = caches.to_str().unwrap();
    let mp = BD.mp();
    mount_raw(&spec, &mp, &["--disk-cache", dc]);
    write_disk(&mp, 0, &pattern(5, 4 * MIB));
    BD.unmount(&mp);
    let proxy = faultproxy::Proxy::start(faultproxy::Config::clean(Azurite::shared().port));
    let elsewhere = proxy.connection_string();
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--disk-cache", dc])
        .cs(&elsewhere)
        .ok();
    let d = disk_stats(&mp);
    assert_eq!(d["on"], true, "{d}");
    assert_eq!(d["warm_start"], false, "{d}");
    assert_eq!(read_disk(&mp, 0, 4 * MIB), pattern(5, 4 * MIB));
    BD.cmd(&["unmount", mp.s()]).cs(&elsewhere).ok();
    let dirs = std::fs::read_dir(&caches).unwrap().count();
    assert_eq!(dirs, 2, "one cache per endpoint");
}

/// `mibs` MiB of [`pattern`]'s first MiB, each MiB's first 16 bytes naming
/// `seed` and its place: as quick to make in a debug build as a copy, and no two
/// MiB alike.
fn mib_pattern(seed: u64, mibs: u64) -> Vec<u8> {
    let one = pattern(seed, MIB);
    let mut out = Vec::with_capacity((mibs * MIB) as usize);
    for i in 0..mibs {
        let at = out.len();
        out.extend_from_slice(&one);
        out[at..at + 8].copy_from_slice(&seed.to_le_bytes());
        out[at + 8..at + 16].copy_from_slice(&i.to_le_bytes());
    }
    out
}

/// The sha256 of `data`, by sha256sum.
fn sha256_of(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// `warm`: a 2 GiB drive with 128 MiB of data in four places (one not on a
/// 64 KiB boundary), written straight to the blob, mounted raw with a 1 GiB disk
/// cache behind a proxy that counts the bytes it carries. Paced at 32 MiB a
/// second and stopped by Ctrl-C after 2 s (`stats` and the metrics show it
/// meanwhile), then run again to the end: the two fetch at most 110% of the
/// allocated bytes (nothing of the holes), and a third run fetches nothing.
/// After an unmount and a mount, reading the whole disk fetches at most 5% of
/// them from the service, and every byte is what was written (the data's
/// sha256 by sha256sum, the holes zeros).
#[test]
fn warm_fetches_the_allocated_pages_once_stops_on_ctrl_c_and_resumes() {
    use std::sync::atomic::Ordering::Relaxed;
    require_root();
    let spec = BD.new_drive("dc-warmup", "2GiB");
    let places = [
        (0, 21),
        (700 * MIB + 4096, 22),
        (1300 * MIB, 23),
        (2016 * MIB, 24),
    ];
    let allocated = 4 * 32 * MIB;
    let data: Vec<Vec<u8>> = places.iter().map(|(_, s)| mib_pattern(*s, 32)).collect();
    let blob = BD.blob(&spec);
    let rt = common::util::rt();
    for ((at, _), written) in places.iter().zip(&data) {
        for (i, part) in written.chunks(4 * MIB as usize).enumerate() {
            let to = *at + i as u64 * 4 * MIB;
            rt.block_on(blob.put_pages(to, part.to_vec().into(), None))
                .unwrap();
        }
    }
    let caches = cache_parent("warmup");
    let dc = caches.to_str().unwrap();
    let proxy = faultproxy::Proxy::start(faultproxy::Config::clean(Azurite::shared().port));
    let via = BD.via(&proxy.connection_string(), &[]);
    let port = common::util::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let mount_args = [
        "--mode",
        "raw",
        "--disk-cache",
        dc,
        "--disk-cache-size",
        "1GiB",
        "--metrics",
        &metrics,
    ];
    let mp = via.mount(&spec, &mount_args);
    let carried = || proxy.bytes.load(Relaxed);
    let start = carried();
    let began = std::time::Instant::now();
    let child = via
        .cmd(&["warm", mp.s(), "--max-rate", "32MiB", "--json"])
        .spawn_piped();
    common::util::wait_for(
        "the warm-up to show in stats",
        Duration::from_secs(10),
        || {
            let w = &mp.stats()["warm_up"];
            w["running"] == true && n(w, "done") > 0 && n(w, "allocated") == allocated
        },
    );
    let scraped = common::util::http_get(port, "/metrics").1;
    assert!(
        scraped.contains(&format!("blobdrive_warm_up_running{{drive=\"{spec}\"}} 1")),
        "{scraped}"
    );
    std::thread::sleep(Duration::from_secs(2).saturating_sub(began.elapsed()));
    sh_ok(&format!("kill -INT {}", child.id()));
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("stopped before the end"),
        "{err}"
    );
    let first = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(first["stopped"], true, "{first}");
    let first_fetched = n(&first, "fetched");
    assert!(
        first_fetched > 0 && first_fetched < allocated / 2 + 16 * MIB,
        "paced at 32 MiB/s and stopped after 2 s: {first}"
    );
    assert_eq!(mp.stats()["warm_up"]["running"], false);
    let second = json(&via.ok(&["warm", mp.s(), "--json"]));
    assert_eq!(second["stopped"], false, "{second}");
    assert!(n(&second, "already_cached") >= first_fetched, "{second}");
    assert!(
        n(&second, "fetched") + n(&second, "already_cached") >= allocated,
        "{second}"
    );
    let total = carried() - start;
    assert!(
        total * 10 <= allocated * 11,
        "{total} bytes came through the proxy for {allocated} allocated"
    );
    let third = json(&via.ok(&["warm", mp.s(), "--json"]));
    assert_eq!(n(&third, "fetched"), 0, "{third}");
    assert_eq!(n(&third, "skipped"), 0, "{third}");
    let said = via.ok(&["warm", mp.s()]);
    assert!(
        said.starts_with(&format!("warm-up of {}: done, 128 MiB allocated", mp.s()))
            && said.contains(": 0 bytes fetched, 128"),
        "{said}"
    );
    let human = via.ok(&["stats", mp.s()]);
    assert!(
        human.contains("warm-up:        done, 128 MiB allocated"),
        "{human}"
    );
    via.unmount(&mp);
    via.ok(&[&["mount", &spec, mp.s()][..], &mount_args].concat());
    assert_eq!(disk_stats(&mp)["warm_start"], true);
    let before = carried();
    let f = std::fs::File::open(mp.disk()).unwrap();
    let mut want = vec![0u8; 8 * MIB as usize];
    let mut got = vec![0u8; 8 * MIB as usize];
    for at in (0..2048 * MIB).step_by(8 * MIB as usize) {
        f.read_exact_at(&mut got, at).unwrap();
        want.fill(0);
        for ((start, _), written) in places.iter().zip(&data) {
            let (s, e) = (at.max(*start), (start + 32 * MIB).min(at + 8 * MIB));
            if s < e {
                want[(s - at) as usize..(e - at) as usize]
                    .copy_from_slice(&written[(s - start) as usize..(e - start) as usize]);
            }
        }
        assert!(
            got == want,
            "the 8 MiB at {at} differ from what was written"
        );
    }
    drop(f);
    let from_service = carried() - before;
    eprintln!(
        "allocated {allocated}; first run {first_fetched}, both {total} through the proxy; the read after the mount {from_service}"
    );
    assert!(
        from_service * 20 <= allocated,
        "reading the warmed disk fetched {from_service} bytes"
    );
    for ((at, _), written) in places.iter().zip(&data) {
        let read = sh_ok(&format!(
            "dd if='{}' iflag=skip_bytes,count_bytes skip={at} count={} bs=1M status=none | sha256sum",
            mp.disk(),
            32 * MIB
        ));
        assert_eq!(
            read.split_whitespace().next().unwrap(),
            sha256_of(written),
            "the 32 MiB at {at}"
        );
    }
    via.unmount(&mp);
}

/// fstab's `warm=SIZE` (the mount(8) helper, as `mount` runs it): the mount is
/// ready while its warm-up still runs (32 MiB at 4 MiB a second), `stats` says
/// the mount started it, a `blobdrive warm` meanwhile is refused in one line,
/// reads are served right, and an unmount stops the warm-up and comes down
/// clean. The command line's `--warm` needs `--disk-cache`, and a rate above 0.
#[test]
fn a_mount_with_warm_is_ready_while_it_warms_and_an_unmount_stops_it() {
    use std::os::unix::process::CommandExt;
    require_root();
    let spec = BD.new_drive("dc-mountwarm", "256MiB");
    let data = mib_pattern(31, 32);
    let blob = BD.blob(&spec);
    let rt = common::util::rt();
    for (i, part) in data.chunks(4 * MIB as usize).enumerate() {
        rt.block_on(blob.put_pages(64 * MIB + i as u64 * 4 * MIB, part.to_vec().into(), None))
            .unwrap();
    }
    let caches = cache_parent("mountwarm");
    let options = format!("mode=raw,disk-cache={},warm=4MiB", caches.display());
    let mp = BD.mp();
    common::user::ensure_user();
    let mut helper = BD.cmd(&[&spec, mp.s(), "-o", &options]).command();
    helper.arg0("mount.blobdrive");
    let out = helper.output().unwrap();
    assert!(out.status.success(), "{}", common::util::output_text(&out));
    let w = mp.stats()["warm_up"].clone();
    assert_eq!(w["running"], true, "ready before the warm-up ends: {w}");
    assert_eq!(w["started_by"], "mount", "{w}");
    assert_eq!(n(&w, "max_rate"), 4 * MIB, "{w}");
    let err = BD.cmd(&["warm", mp.s()]).fails_in_one_line();
    assert!(err.contains("running already"), "{err}");
    assert!(read_disk(&mp, 64 * MIB, 32 * MIB) == data);
    BD.unmount(&mp);
    let listed = json(&BD.ok(&["list", "--json"]));
    assert!(!listed.to_string().contains(mp.s()), "{listed}");
    // The command line's --warm.
    let dc = caches.to_str().unwrap();
    let err = BD
        .cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--warm"])
        .fails();
    assert!(err.contains("--disk-cache <DIR>"), "{err}");
    let err = BD
        .cmd(&["mount", &spec, mp.s(), "--disk-cache", dc, "--warm=0"])
        .fails_in_one_line();
    assert!(err.contains("--warm=0"), "{err}");
}
