//! End to end, as root: real FUSE mounts, loop devices, mkfs and mount(8) against
//! Azurite. Every test unmounts what it mounted, also when it fails.

mod common;

use common::util::{json, output_text as text, rt, sh, sh_ok, wait_for_exit};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::azurite::fingerprint;
use common::bd::{Bd, Harness};
use common::mount::{proc_status_kib, require_root, Mp};

const MIB: u64 = 1024 * 1024;

/// A private run directory for this test binary, so tests never touch real
/// mounts; a retry budget of 10 s, so a failure is one in bounded time.
const BD: Harness = Harness::new("e2e-run").env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "10")]);

/// Writes a tree of files of many sizes with random content; returns `sha256sum`
/// output of all of them (relative paths).
fn write_tree(root: &Path) -> String {
    sh_ok(&format!(
        "set -e; cd '{}'; mkdir -p tree/a/b tree/c
         for s in 1 4 13 64 1000; do head -c ${{s}}K /dev/urandom > tree/a/k$s; done
         for s in 1 3 17; do head -c ${{s}}M /dev/urandom > tree/b$s; done
         head -c 150M /dev/urandom > tree/c/big
         for i in $(seq 1 50); do head -c $((i * 777)) /dev/urandom > tree/a/b/f$i; done
         sync -f tree/c/big
         find tree -type f | sort | xargs sha256sum",
        root.display()
    ))
}

/// The writeback settings (`strict_limit`, `max_ratio`) of loop device `dev` after
/// blobdrive let go of it, or `None` if another mount has attached it again
/// meanwhile (the tests run in parallel and the kernel hands out the freed number
/// first): its settings are then that mount's, and a check of them would fail
/// for no fault of the mount that let go.
fn released_writeback(dev: &str) -> Option<(String, String)> {
    let name = dev.trim_start_matches("/dev/");
    let attached = || Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists();
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/block/{name}/bdi/{f}"))
            .unwrap()
            .trim()
            .to_string()
    };
    if attached() {
        eprintln!("{dev} was attached again before its settings could be read");
        return None;
    }
    let settings = (read("strict_limit"), read("max_ratio"));
    if attached() {
        eprintln!("{dev} was attached again while its settings were read");
        return None;
    }
    Some(settings)
}

#[test]
fn filesystem_mode_survives_unmount_and_remount() {
    require_root();
    let spec = BD.new_drive("fs", "512MiB");
    let mp = BD.mp();
    let out = BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    assert!(out.contains("ext4") && out.contains("/dev/loop"), "{out}");
    let sums = write_tree(mp.path());
    let me = mp.listed();
    assert_eq!(me["mode"], "fs");
    assert_eq!(me["blob"], spec.as_str());
    assert_eq!(me["read_only"], false);
    let dev = me["device"].as_str().unwrap().to_string();
    assert!(dev.starts_with("/dev/loop"), "{dev}");
    let strict = || {
        let name = dev.trim_start_matches("/dev/");
        sh_ok(&format!("cat /sys/block/{name}/bdi/strict_limit"))
            .trim()
            .to_string()
    };
    assert_eq!(strict(), "1", "writeback limited while mounted");
    // Made on a never-written drive, ext4 knows its inode tables are zeros:
    // the kernel does not zero them again in the background (as Clear Pages,
    // which an outage makes wait with the loop device's reads behind them).
    let groups = sh_ok(&format!("dumpe2fs {dev} 2>/dev/null | grep '^Group [0-9]'"));
    assert!(
        groups.lines().count() > 1 && groups.lines().all(|g| g.contains("ITABLE_ZEROED")),
        "{groups}"
    );
    let st = mp.stats();
    for k in [
        "put_page_requests",
        "bytes_uploaded",
        "get_requests",
        "bytes_downloaded",
        "clear_requests",
        "cache_hits",
        "cache_misses",
        "dirty_bytes",
        "retries",
    ] {
        assert!(st[k].is_u64(), "stats lacks {k}: {st}");
    }
    assert_eq!(st["lease_state"], "held");
    assert!(st["bytes_uploaded"].as_u64().unwrap() >= 150 * MIB);
    let lease = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(lease["state"], "leased");
    let out = BD.ok(&["unmount", mp.s()]);
    assert!(out.contains("unmounted"), "{out}");
    // The loop device let go by itself (autoclear) and has its defaults back.
    if let Some(settings) = released_writeback(&dev) {
        assert_eq!(
            settings,
            ("0".to_string(), "100".to_string()),
            "writeback limit left on {dev}"
        );
    }
    // Everything is in the blob and the lease is free.
    let lease = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(lease["state"], "available");
    BD.assert_nothing_left(mp.path(), &spec);
    // Remount (the existing ext4 is found; --mkfs is not needed) and verify.
    let out = BD.ok(&["mount", &spec, mp.s()]);
    assert!(out.contains("ext4"), "{out}");
    // Mounting reads what ext4 reads to mount, not read-ahead grown on its
    // superblock and group descriptors read over and over (which fetched all the
    // data the drive holds, up to the largest window).
    let down = mp.stats()["bytes_downloaded"].as_u64().unwrap();
    assert!(down < 16 * MIB, "{down} bytes downloaded to mount");
    let again = sh_ok(&format!(
        "cd '{}' && find tree -type f | sort | xargs sha256sum",
        mp.s()
    ));
    assert_eq!(sums, again);
    // The filesystem is clean after its unmount.
    BD.ok(&["unmount", mp.s()]);
    let out = BD.ok(&["mount", &spec, mp.s(), "--mode", "block"]);
    let dev = out.trim().to_string();
    sh_ok(&format!("e2fsck -fn {dev}"));
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn blank_disk_is_refused_without_mkfs_and_leaves_nothing_behind() {
    require_root();
    let spec = BD.new_drive("blank", "64MiB");
    let mp = BD.mp();
    BD.cmd(&["mount", &spec, mp.s()]).fails_with("--mkfs ext4");
    BD.assert_nothing_left(mp.path(), &spec);
    // xfs works as well (xfs needs at least 300 MiB).
    let spec = BD.new_drive("xfs", "320MiB");
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "xfs"]);
    sh_ok(&format!("echo hello > '{0}/x' && sync -f '{0}'", mp.s()));
    BD.ok(&["unmount", mp.s()]);
    let out = BD.ok(&["mount", &spec, mp.s()]);
    assert!(out.contains("xfs"), "{out}");
    assert_eq!(sh_ok(&format!("cat '{}/x'", mp.s())), "hello\n");
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn raw_mode_coalesces_writes_and_reads_holes_for_free() {
    require_root();
    let spec = BD.new_drive("raw", "256MiB");
    let mp = BD.mp();
    let out = BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let disk = out.trim().to_string();
    assert_eq!(disk, format!("{}/disk", mp.s()));
    // Exactly the disk's size; the footer is not part of it.
    let meta = std::fs::metadata(&disk).unwrap();
    assert_eq!(meta.len(), 256 * MIB);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(mp.path()).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let out = sh(&format!(
        "printf x | dd of='{disk}' bs=1 seek={} conv=notrunc status=none",
        256 * MIB
    ));
    assert!(!out.status.success(), "writing past the disk must fail");
    // 64 MiB written sequentially and synced: at most 20 Put Page calls.
    let before = mp.stats();
    sh_ok(&format!(
        "head -c 64M /dev/urandom > /tmp/blobdrive-e2e-64m.$$ && dd if=/tmp/blobdrive-e2e-64m.$$ of='{disk}' bs=1M seek=16 conv=fsync,notrunc status=none; rc=$?; cmp -n 64M -i 0:16M /tmp/blobdrive-e2e-64m.$$ '{disk}'; rc2=$?; rm -f /tmp/blobdrive-e2e-64m.$$; exit $((rc + rc2))"
    ));
    let after = mp.stats();
    assert_eq!(
        after["get_requests"], before["get_requests"],
        "whole-page writes never read from the network"
    );
    let puts = after["put_page_requests"].as_u64().unwrap()
        - before["put_page_requests"].as_u64().unwrap();
    assert!(puts <= 20, "64 MiB took {puts} Put Page calls");
    assert!(
        after["bytes_uploaded"].as_u64().unwrap() - before["bytes_uploaded"].as_u64().unwrap()
            >= 64 * MIB
    );
    assert_eq!(after["dirty_bytes"], 0);
    // A never-written region reads as zeros with no request at all.
    let gets = after["get_requests"].as_u64().unwrap();
    let zeros = sh_ok(&format!(
        "dd if='{disk}' bs=1M skip=128 count=100 status=none | tr -d '\\0' | wc -c"
    ));
    assert_eq!(zeros.trim(), "0");
    let st = mp.stats();
    assert_eq!(
        st["get_requests"].as_u64().unwrap(),
        gets,
        "holes cost no request"
    );
    // Unaligned writes read-modify-write correctly.
    sh_ok(&format!(
        "printf 'hello' | dd of='{disk}' bs=1 seek=1000003 conv=notrunc,fsync status=none"
    ));
    BD.ok(&["unmount", mp.s()]);
    let data = rt().block_on(BD.blob(&spec).read(1000003, 5)).unwrap();
    assert_eq!(&data[..], b"hello");
}

#[test]
fn block_mode_exposes_a_loop_device_of_the_disk_size() {
    require_root();
    let spec = BD.new_drive("block", "96MiB");
    let mp = BD.mp();
    let dev = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    assert!(dev.starts_with("/dev/loop"), "{dev}");
    assert_eq!(
        sh_ok(&format!("blockdev --getsize64 {dev}")).trim(),
        (96 * MIB).to_string()
    );
    // Writeback to the drive has a limit of its own while it is mounted, and the
    // loop device gets the kernel's defaults back when it is let go.
    let bdi = format!("/sys/block/{}/bdi", dev.trim_start_matches("/dev/"));
    let setting = |f: &str| sh_ok(&format!("cat {bdi}/{f}")).trim().to_string();
    assert_eq!(setting("strict_limit"), "1");
    // (The kernel keeps it as a share of its own limit: within a MiB of it.)
    let max_bytes: u64 = setting("max_bytes").parse().unwrap();
    assert!(max_bytes.abs_diff(256 * MIB) < MIB, "max_bytes {max_bytes}");
    sh_ok(&format!(
        "printf 'block-data' | dd of={dev} bs=512 seek=2048 conv=fsync status=none"
    ));
    // blkdiscard reaches the blob as Clear Pages.
    sh_ok(&format!(
        "dd if=/dev/urandom of={dev} bs=1M seek=32 count=16 conv=fsync status=none"
    ));
    let before = mp.stats()["clear_requests"].as_u64().unwrap();
    sh_ok(&format!("blkdiscard -o {} -l {} {dev}", 32 * MIB, 16 * MIB));
    assert!(mp.stats()["clear_requests"].as_u64().unwrap() > before);
    BD.ok(&["unmount", mp.s()]);
    assert!(!sh_ok("losetup -a").contains(mp.s()));
    if let Some(settings) = released_writeback(&dev) {
        assert_eq!(
            settings,
            ("0".to_string(), "100".to_string()),
            "writeback limit left on {dev}"
        );
    }
    // A read-only mount writes nothing back: no limit is set.
    let ro = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block", "--read-only"])
        .trim()
        .to_string();
    let ro_bdi = format!("/sys/block/{}/bdi", ro.trim_start_matches("/dev/"));
    assert_eq!(sh_ok(&format!("cat {ro_bdi}/strict_limit")).trim(), "0");
    BD.ok(&["unmount", mp.s()]);
    let blob = BD.blob(&spec);
    let data = rt().block_on(blob.read(2048 * 512, 10)).unwrap();
    assert_eq!(&data[..], b"block-data");
    let ranges = rt().block_on(blob.page_ranges(None)).unwrap();
    assert!(
        ranges
            .iter()
            .all(|r| r.end <= 32 * MIB || r.start >= 48 * MIB),
        "discarded range still allocated: {ranges:?}"
    );
}

#[test]
fn one_writer_many_readers_and_snapshot_mounts() {
    require_root();
    let spec = BD.new_drive("lease", "64MiB");
    let writer = BD.mp();
    BD.ok(&["mount", &spec, writer.s(), "--mode", "raw"]);
    let disk = format!("{}/disk", writer.s());
    sh_ok(&format!(
        "printf 'version-1' | dd of='{disk}' conv=notrunc,fsync status=none"
    ));
    // A second writable mount is refused naming where this machine has it,
    // and leaves nothing behind.
    let second = BD.mp();
    BD.cmd(&["mount", &spec, second.s(), "--mode", "raw"])
        .fails_saying(&format!(
            "{spec} is already mounted writable on this machine, at {}",
            writer.s()
        ));
    let list = json(&BD.ok(&["list", "--json"]));
    assert!(!list
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["mountpoint"] == second.s()));
    // The same mountpoint cannot be used twice.
    BD.cmd(&["mount", &spec, writer.s(), "--mode", "raw"])
        .fails_saying(&format!("{spec} is already mounted at {}", writer.s()));
    // Read-only mounts take no lease and run beside the writer.
    let r1 = BD.mp();
    let r2 = BD.mp();
    BD.ok(&["mount", &spec, r1.s(), "--mode", "raw", "--read-only"]);
    BD.ok(&["mount", &spec, r2.s(), "--mode", "raw", "--read-only"]);
    assert_eq!(sh_ok(&format!("head -c 9 '{}/disk'", r1.s())), "version-1");
    assert_eq!(r1.stats()["lease_state"], "none");
    let out = sh(&format!(
        "printf x | dd of='{}/disk' conv=notrunc status=none",
        r2.s()
    ));
    assert!(!out.status.success(), "read-only mounts refuse writes");
    // Snapshots mount read-only, several at once, while the writer goes on.
    let snap = rt().block_on(BD.blob(&spec).create_snapshot()).unwrap();
    sh_ok(&format!(
        "printf 'version-2' | dd of='{disk}' conv=notrunc,fsync status=none"
    ));
    let at = format!("{spec}@{snap}");
    let s1 = BD.mp();
    let s2 = BD.mp();
    BD.ok(&["mount", &at, s1.s(), "--mode", "raw"]);
    BD.ok(&["mount", &at, s2.s(), "--mode", "raw"]);
    assert_eq!(sh_ok(&format!("head -c 9 '{}/disk'", s1.s())), "version-1");
    assert_eq!(sh_ok(&format!("head -c 9 '{}/disk'", s2.s())), "version-1");
    assert_eq!(sh_ok(&format!("head -c 9 '{disk}'")), "version-2");
    let snap_entry = s1.listed();
    assert_eq!(snap_entry["snapshot"], snap.as_str());
    assert_eq!(snap_entry["read_only"], true);
    for m in [&s1, &s2, &r1, &r2, &writer] {
        BD.ok(&["unmount", m.s()]);
    }
}

#[test]
fn lease_broken_under_a_mounted_drive_fences_all_writes() {
    require_root();
    let spec = BD.new_drive("fence", "64MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let disk = format!("{}/disk", mp.s());
    sh_ok(&format!(
        "printf 'before' | dd of='{disk}' conv=notrunc,fsync status=none"
    ));
    // Not from this machine, where it is mounted: unmount is the way, --yes or not.
    for yes in [None, Some("--yes")] {
        let mut args = vec!["lease", "break", &spec];
        args.extend(yes);
        let out = BD.cmd(&args).output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("mounted writable on this machine at {}", mp.s()))
                && err.contains(&format!("blobdrive unmount {}", mp.s())),
            "{err}"
        );
    }
    // Nor by a user who is not root, who cannot read the run directory to see
    // the mount: refused, saying why and to run it as root (it warned, then
    // broke the lease, and the mount lost its writes).
    let err = BD
        .cmd(&["lease", "break", &spec, "--yes"])
        .by_nobody()
        .fails_in_one_line();
    assert!(
        err.contains(&format!(
            "cannot tell whether {spec} is mounted writable on this machine"
        )) && err.contains("run this as root")
            && err.contains("Nothing was broken"),
        "{err}"
    );
    assert_eq!(mp.stats()["lease_state"], "held");
    sh_ok(&format!(
        "printf 'still!' | dd of='{disk}' bs=512 seek=20 conv=notrunc,fsync status=none"
    ));
    common::mount::break_lease_from_elsewhere(&BD.cs(), &spec);
    let blob = BD.blob(&spec);
    let etag = rt().block_on(blob.properties()).unwrap().etag;
    // The first write after the break fails at flush time; every later one at once.
    let out = sh(&format!(
        "printf 'after!' | dd of='{disk}' conv=notrunc,fsync status=none"
    ));
    assert!(!out.status.success(), "a write without the lease must fail");
    let out = sh(&format!(
        "printf 'again!' | dd of='{disk}' bs=512 seek=10 conv=notrunc status=none"
    ));
    assert!(!out.status.success(), "fenced: writes fail at once");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Input/output error"));
    // Reads keep working, stats and the log say what happened.
    assert_eq!(sh_ok(&format!("head -c 6 '{disk}' | wc -c")).trim(), "6");
    assert_eq!(mp.stats()["lease_state"], "lost");
    // Nothing reached the blob after the break.
    let props = rt().block_on(blob.properties()).unwrap();
    assert_eq!(
        props.etag, etag,
        "the blob changed after the lease was broken"
    );
    assert_eq!(&rt().block_on(blob.read(0, 6)).unwrap()[..], b"before");
    // Fenced, the mount holds nothing: the drive mounts writable at another
    // place on this machine, as it would on another.
    let second = BD.mp();
    BD.ok(&["mount", &spec, second.s(), "--mode", "raw"]);
    BD.ok(&["unmount", second.s()]);
    // Unmount still ends the mount, but fails saying what was lost: what was
    // dropped, when the lease was lost, how many writes failed (the fsync, the
    // write after it, and the flushes as each closed).
    let err = BD
        .cmd(&["unmount", mp.s()])
        .fails_with("512 bytes written to the drive but not yet on the blob were dropped");
    assert!(
        err.contains(&format!("the lease on {spec} was lost at "))
            && err.contains(" writes to the drive failed while it was mounted"),
        "{err}"
    );
    assert!(!sh(&format!("mountpoint -q '{}'", mp.s())).status.success());
    let log = std::fs::read_dir(BD.run_dir().join("mounts"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    assert!(log.contains("LEASE LOST"), "log: {log}");
}

/// When `unmount`'s message says the lease was lost, checked to lie between
/// `after` and now.
fn lost_at_within(said: &str, after: std::time::SystemTime) {
    let at = said
        .split("was lost at ")
        .nth(1)
        .and_then(|rest| rest.split(" while").next())
        .unwrap_or_else(|| panic!("no time the lease was lost: {said}"));
    let at = httpdate::parse_http_date(at).unwrap_or_else(|e| panic!("{at}: {e}"));
    let now = std::time::SystemTime::now();
    assert!(
        at + Duration::from_secs(1) >= after && at <= now,
        "lost at {at:?}, the break at {after:?}, now {now:?}: {said}"
    );
}

#[test]
fn unmount_after_a_lease_broken_under_the_mount_says_what_was_lost() {
    // An ext4 drive and a raw one mounted; both leases broken by another
    // machine; each mount notices at its next lease renewal.
    require_root();
    let fs_spec = BD.new_drive("lost-fs", "64MiB");
    let raw_spec = BD.new_drive("lost-raw", "64MiB");
    let (fs_mp, raw_mp) = (BD.mp(), BD.mp());
    BD.ok(&["mount", &fs_spec, fs_mp.s(), "--mkfs", "ext4"]);
    BD.ok(&["mount", &raw_spec, raw_mp.s(), "--mode", "raw"]);
    sh_ok(&format!(
        "head -c 1M /dev/urandom > '{}/before' && sync -f '{}/before'",
        fs_mp.s(),
        fs_mp.s()
    ));
    let broken = std::time::SystemTime::now();
    for spec in [&fs_spec, &raw_spec] {
        common::mount::break_lease_from_elsewhere(&BD.cs(), spec);
    }
    common::util::wait_for(
        "both mounts to see their leases lost",
        Duration::from_secs(30),
        || fs_mp.stats()["lease_state"] == "lost" && raw_mp.stats()["lease_state"] == "lost",
    );
    // An application writes a file and syncs it: the sync fails with EIO.
    let out = sh(&format!(
        "head -c 256K /dev/urandom > '{}/after' && sync -f '{}/after'",
        fs_mp.s(),
        fs_mp.s()
    ));
    assert!(!out.status.success(), "a sync without the lease succeeded");
    let failed = fs_mp.stats()["failed_writes"].as_u64().unwrap();
    assert!(failed > 0, "{}", fs_mp.stats());
    // Unmount says the lease was lost, when, and how many writes failed (ext4's
    // own, as it unmounts, on top), and exits non-zero: what the application
    // wrote is not on the blob. It said "unmounted" and exited 0.
    let err = BD
        .cmd(&["unmount", fs_mp.s()])
        .fails_with(&format!("the lease on {fs_spec} was lost at "));
    assert!(
        err.contains("writes to the drive failed while it was mounted (answered with an I/O error), and what they carried is not on the blob"),
        "{err}"
    );
    lost_at_within(&err, broken);
    let counted: u64 = err
        .split(" writes to the drive failed")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of failed writes: {err}"));
    assert!(counted >= failed, "{counted} < {failed}: {err}");
    assert!(!sh(&format!("mountpoint -q '{}'", fs_mp.s()))
        .status
        .success());
    // The raw drive was not written after the break: nothing was lost, and
    // unmount says the lease was lost all the same, and exits 0.
    let said = BD.ok(&["unmount", raw_mp.s()]);
    assert!(
        said.contains(&format!("the lease on {raw_spec} was lost at "))
            && said.contains("no write failed, and everything written is on the blob"),
        "{said}"
    );
    lost_at_within(&said, broken);
}

#[test]
fn fstrim_frees_the_space_of_deleted_files() {
    require_root();
    let spec = BD.new_drive("trim", "256MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    sh_ok(&format!(
        "head -c 100M /dev/urandom > '{0}/big' && sync -f '{0}'",
        mp.s()
    ));
    BD.ok(&["unmount", mp.s()]);
    let before = json(&BD.ok(&["info", &spec, "--json"]))["allocated_bytes"]
        .as_u64()
        .unwrap();
    assert!(before >= 100 * MIB);
    BD.ok(&["mount", &spec, mp.s()]);
    // `sync -f`: this filesystem only. A plain `sync` waits for every filesystem
    // on the machine, a drive of another test waiting out an outage too, and
    // holds each one's superblock lock while it waits, so that test's unmount
    // waited with it (300 s, until the outage's I/O timeout, in two fresh-clone
    // runs).
    sh_ok(&format!(
        "rm '{0}/big' && sync -f '{0}' && fstrim '{0}'",
        mp.s()
    ));
    assert!(mp.stats()["clear_requests"].as_u64().unwrap() > 0);
    BD.ok(&["unmount", mp.s()]);
    let after = json(&BD.ok(&["info", &spec, "--json"]))["allocated_bytes"]
        .as_u64()
        .unwrap();
    assert!(after < before - 90 * MIB, "allocated {before} -> {after}");
}

#[test]
fn busy_filesystem_stays_mounted_and_sigterm_unmounts() {
    require_root();
    let spec = BD.new_drive("busy", "64MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    sh_ok(&format!("echo keep > '{}/f'", mp.s()));
    let mut holder = Command::new("bash")
        .arg("-c")
        .arg("sleep 30")
        .current_dir(mp.path())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let err = BD.cmd(&["unmount", mp.s()]).fails_with("busy");
    // The process inside it is named, as for a raw mount's open disk file.
    assert!(
        err.contains(&format!("pid {} (sleep)", holder.id())),
        "{err}"
    );
    assert_eq!(
        sh_ok(&format!("cat '{}/f'", mp.s())),
        "keep\n",
        "still mounted and usable"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // SIGTERM to the daemon unmounts like `unmount` does.
    let pid = mp.pid();
    sh_ok(&format!("kill -TERM {pid}"));
    wait_for_exit(pid, "the daemon to end on SIGTERM", Duration::from_secs(10));
    BD.assert_nothing_left(mp.path(), &spec);
    BD.ok(&["mount", &spec, mp.s()]);
    assert_eq!(sh_ok(&format!("cat '{}/f'", mp.s())), "keep\n");
    BD.ok(&["unmount", mp.s()]);
}

/// Output into a pipe whose reader is gone (`| head` once it has read its fill)
/// is a quiet exit, not a panic: each command ends with its own status, and what
/// it does is done whole (a mount and an unmount too).
#[test]
fn output_into_a_closed_pipe_is_a_quiet_exit_and_the_command_finishes() {
    require_root();
    let spec = BD.new_drive("epipe", "64MiB");
    let mp = BD.mp();
    let quiet = |args: &[&str]| {
        let out = common::util::output_into_closed_pipe(&mut BD.cmd(args).command());
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success() && !err.contains("panicked"),
            "{args:?}: {:?}: {err}",
            out.status
        );
    };
    quiet(&["mount", &spec, mp.s(), "--mode", "raw"]);
    assert_eq!(mp.stats()["lease_state"], "held");
    for args in [
        vec!["stats", mp.s()],
        vec!["stats", mp.s(), "--json"],
        vec!["list"],
        vec!["list", "--json"],
        vec!["info", &spec],
        vec!["info", &spec, "--json"],
        vec!["lease", "status", &spec],
        vec!["snapshot", "list", &spec],
        vec!["--help"],
        vec!["stats", "--help"],
    ] {
        quiet(&args);
    }
    // Output lost for another reason (a full disk) fails the command, saying so.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = BD
        .cmd(&["info", &spec])
        .command()
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot write the output: No space left on device"),
        "{err}"
    );
    // A failure still says why, on standard error.
    let out =
        common::util::output_into_closed_pipe(&mut BD.cmd(&["stats", "/nonexistent"]).command());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing is mounted"));
    // Written, not synced: the unmount puts it on the blob.
    sh_ok(&format!(
        "printf 'kept' | dd of='{}' conv=notrunc status=none",
        mp.disk()
    ));
    quiet(&["unmount", mp.s()]);
    BD.assert_nothing_left(mp.path(), &spec);
    let head = rt().block_on(BD.blob(&spec).read(0, 4)).unwrap();
    assert_eq!(&head[..], b"kept");
}

#[test]
fn dead_daemon_is_cleaned_up_and_the_lease_named() {
    require_root();
    let spec = BD.new_drive("dead", "64MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    sh_ok(&format!(
        "echo durable > '{0}/f' && sync -f '{0}/f'",
        mp.s()
    ));
    let pid = mp.pid();
    sh_ok(&format!("kill -KILL {pid}"));
    std::thread::sleep(Duration::from_millis(300));
    // Mounting it elsewhere here names the mount that died holding its lease,
    // and the way: unmount there (a lease break from here is refused, below).
    let err = BD.cmd(&["mount", &spec, BD.mp().s()]).fails_saying(&format!(
        "was mounted at {} on this machine, and that mount ended without an unmount (its daemon is gone)",
        mp.s()
    ));
    assert!(
        err.contains(&format!("blobdrive unmount {}", mp.s())),
        "{err}"
    );
    // Its lease is not broken from here while its mount is not cleaned up.
    let err = BD
        .cmd(&["lease", "break", &spec, "--yes"])
        .fails_with("is dead");
    assert!(
        err.contains(&format!("blobdrive unmount {}", mp.s())),
        "{err}"
    );
    // It cleans up, then fails so scripts notice: the lease is still held.
    let id = blobdrive::mount::record::id_for(mp.path());
    let log = BD.run_dir().join("mounts").join(format!("{id}.log"));
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("cleaned up after the dead daemon"),
        "{err}"
    );
    assert!(err.contains("lease break"), "{err}");
    // A failed mount's log is kept, to be read.
    assert!(log.exists(), "the dead daemon's log was removed");
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(mp.s()));
    assert!(!sh_ok("losetup -a").contains(&format!("{id}.fuse")));
    BD.ok(&["lease", "break", &spec, "--yes"]);
    BD.ok(&["mount", &spec, mp.s()]);
    assert_eq!(sh_ok(&format!("cat '{}/f'", mp.s())), "durable\n");
    BD.ok(&["unmount", mp.s()]);
    let out = BD.ok(&["mount", &spec, mp.s(), "--mode", "block"]);
    sh_ok(&format!("e2fsck -fn {}", out.trim()));
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn mount_refuses_bad_input_cleanly() {
    require_root();
    let spec = BD.new_drive("badmount", "64MiB");
    let mp = BD.mp();
    BD.cmd(&["mount", &spec, "/nonexistent/blobdrive/mp"])
        .fails_with("does not exist");
    std::fs::write(mp.path().join("x"), b"x").unwrap();
    BD.cmd(&["mount", &spec, mp.s()]).fails_with("not empty");
    std::fs::remove_file(mp.path().join("x")).unwrap();
    BD.cmd(&["mount", &format!("{spec}x"), mp.s(), "--mode", "raw"])
        .fails_with("does not exist");
    BD.cmd(&["mount", &spec, mp.s(), "--read-only", "--mkfs", "ext4"])
        .fails_with("writable");
    BD.cmd(&["mount", &spec, mp.s(), "--cache-size", "1M"])
        .fails_with("too small");
    BD.cmd(&["unmount", mp.s()])
        .fails_with("nothing is mounted");
    BD.assert_nothing_left(mp.path(), &spec);
}

#[test]
fn memory_stays_bounded_and_parallel_io_progresses() {
    require_root();
    let spec = BD.new_drive("mem", "512MiB");
    let mp = BD.mp();
    BD.ok(&[
        "mount",
        &spec,
        mp.s(),
        "--mode",
        "raw",
        "--cache-size",
        "64MiB",
    ]);
    let disk = format!("{}/disk", mp.s());
    // Two writers and a reader in parallel, 3x the cache size in total.
    sh_ok(&format!(
        "set -e
         dd if=/dev/urandom of='{disk}' bs=1M count=96 conv=notrunc,fsync status=none &
         a=$!
         dd if=/dev/urandom of='{disk}' bs=1M seek=200 count=96 conv=notrunc,fsync status=none &
         b=$!
         dd if='{disk}' of=/dev/null bs=1M skip=400 count=100 status=none &
         c=$!
         wait $a; wait $b; wait $c"
    ));
    let hwm_kib = proc_status_kib(mp.pid(), "VmHWM");
    assert!(
        hwm_kib * 1024 <= 64 * MIB + 100 * MIB,
        "peak RSS {hwm_kib} KiB"
    );
    let st = mp.stats();
    assert!(st["cached_bytes"].as_u64().unwrap() <= 64 * MIB);
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn a_sparse_terabyte_drive_mounts_with_few_page_range_calls() {
    require_root();
    let spec = BD.new_drive("tera", "1TiB");
    let blob = BD.blob(&spec);
    rt().block_on(async {
        for off in [0u64, 300 << 30, 700 << 30, (1 << 40) - MIB] {
            blob.put_pages(off, bytes::Bytes::from(vec![0xabu8; 65536]), None)
                .await
                .unwrap();
        }
    });
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let st = mp.stats();
    let calls = st["page_range_requests"].as_u64().unwrap();
    assert!(
        calls <= 20,
        "{calls} Get Page Ranges calls for a sparse 1 TiB drive"
    );
    assert_eq!(st["allocated_bytes"], 4 * 65536);
    let disk = format!("{}/disk", mp.s());
    let got = sh_ok(&format!(
        "dd if='{disk}' bs=64K skip=$((300 * 16384)) count=1 status=none | od -An -tx1 | head -1"
    ));
    assert!(got.trim().starts_with("ab ab"), "{got}");
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn consistent_snapshot_of_a_drive_being_written() {
    require_root();
    let spec = BD.new_drive("consistent", "256MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    // A writer keeps creating, appending and deleting files while the snapshot is taken.
    let mut writer = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "cd '{}' && i=0; while [ $i -lt 400 ]; do head -c $((i * 1000 + 1)) /dev/urandom > f$i; echo $i >> log; rm -f f$((i - 20)); i=$((i + 1)); done",
            mp.s()
        ))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let snap = json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        writer.wait().unwrap().success(),
        "the writer must not fail during the snapshot"
    );
    // The snapshot mounts read-only and its filesystem is clean.
    let at = format!("{spec}@{snap}");
    let smp = BD.mp();
    let dev = BD
        .ok(&["mount", &at, smp.s(), "--mode", "block"])
        .trim()
        .to_string();
    sh_ok(&format!("e2fsck -fn {dev}"));
    // A mounted snapshot is not deleted from under its mount.
    BD.cmd(&["snapshot", "delete", &at])
        .fails_with("unmount it");
    BD.ok(&["unmount", smp.s()]);
    let fmp = BD.mp();
    BD.ok(&["mount", &at, fmp.s()]);
    assert!(Path::new(&format!("{}/log", fmp.s())).exists());
    BD.ok(&["unmount", fmp.s()]);
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn mkfs_over_another_filesystem_is_ignored_and_said_by_mount() {
    require_root();
    let spec = BD.new_drive("mkfsother", "320MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "xfs"]);
    BD.ok(&["unmount", mp.s()]);
    let out = BD.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"]).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            "warning: the disk already holds an xfs filesystem, not the ext4 that mkfs asks for"
        ),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("(xfs"));
    BD.ok(&["unmount", mp.s()]);
    // Asking for what is there says nothing: it formats only a blank disk.
    let out = BD.cmd(&["mount", &spec, mp.s(), "--mkfs", "xfs"]).output();
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", text(&out));
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn xattrs_are_refused_quietly_and_a_clean_unmount_leaves_no_log() {
    require_root();
    let spec = BD.new_drive("xattr", "16MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let id = blobdrive::mount::record::id_for(mp.path());
    let log = BD.run_dir().join("mounts").join(format!("{id}.log"));
    // The kernel answers "not supported" after the first ENOSYS, without asking.
    let script = std::env::temp_dir().join(format!("bd-xattr-{id}.py"));
    std::fs::write(
        &script,
        r#"import os, sys, errno
disk = sys.argv[1]
calls = [lambda: os.getxattr(disk, 'security.capability'), lambda: os.listxattr(disk),
         lambda: os.setxattr(disk, 'user.x', b'1'), lambda: os.removexattr(disk, 'user.x')]
for call in calls:
    for _ in range(3):
        try:
            call()
            raise SystemExit('an xattr call succeeded')
        except OSError as e:
            assert e.errno == errno.EOPNOTSUPP, e
"#,
    )
    .unwrap();
    let probe = format!("python3 {} '{}/disk'", script.display(), mp.s());
    sh_ok(&probe);
    let _ = std::fs::remove_file(&script);
    sh_ok(&format!(
        "dd if=/dev/zero of='{}/disk' bs=64k count=4 conv=notrunc,fsync 2>/dev/null",
        mp.s()
    ));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("Not Implemented"), "{text}");
    assert!(!text.contains('\x1b'), "colour in the log file: {text:?}");
    BD.ok(&["unmount", mp.s()]);
    assert!(!log.exists(), "a clean unmount left its log behind");
}

/// The options of the mount at `path`, from /proc/self/mountinfo.
fn mount_options(path: &str) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(path))
        .unwrap_or_else(|| panic!("{path} is not mounted"));
    line.split(' ')
        .nth(5)
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect()
}

/// What `id -u` prints when a user with nothing (65534) runs `program`.
fn run_by_nobody(program: &str) -> String {
    sh_ok(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups -- '{program}' -u"
    ))
    .trim()
    .to_string()
}

#[test]
fn filesystems_are_nosuid_and_nodev_unless_asked_for() {
    require_root();
    let spec = BD.new_drive("nosuid", "64MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    let opts = mount_options(mp.s());
    assert!(
        opts.contains(&"nosuid".to_string()) && opts.contains(&"nodev".to_string()),
        "{opts:?}"
    );
    // Whoever writes the blob plants a setuid-root program and a device node.
    sh_ok(&format!(
        "cp /usr/bin/id '{m}/id' && chown 0:0 '{m}/id' && chmod 4755 '{m}/id' && mknod -m 666 '{m}/null' c 1 3",
        m = mp.s()
    ));
    BD.ok(&["unmount", mp.s()]);
    BD.ok(&["mount", &spec, mp.s()]);
    assert_eq!(
        run_by_nobody(&format!("{}/id", mp.s())),
        "65534",
        "a setuid program from the blob ran as root"
    );
    let dev = sh(&format!("echo x > '{}/null'", mp.s()));
    assert!(
        !dev.status.success(),
        "a device node from the blob could be opened"
    );
    BD.ok(&["unmount", mp.s()]);
    // Opted in: the flags are off, and the setuid bit works.
    BD.ok(&["mount", &spec, mp.s(), "--suid", "--dev"]);
    let opts = mount_options(mp.s());
    assert!(
        !opts.contains(&"nosuid".to_string()) && !opts.contains(&"nodev".to_string()),
        "{opts:?}"
    );
    assert_eq!(run_by_nobody(&format!("{}/id", mp.s())), "0");
    sh_ok(&format!("echo x > '{}/null'", mp.s()));
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn only_ext4_and_xfs_are_mounted_and_other_filesystems_are_left_untouched() {
    require_root();
    for (fs, a, mkfs) in [
        ("minix", "a", "mkfs.minix"),
        ("ext2", "an", "mkfs.ext2 -q -F"),
    ] {
        let spec = BD.new_drive(&format!("fstype-{fs}"), "16MiB");
        let mp = BD.mp();
        let dev = BD
            .ok(&["mount", &spec, mp.s(), "--mode", "block"])
            .trim()
            .to_string();
        sh_ok(&format!("{mkfs} {dev} >/dev/null"));
        BD.ok(&["unmount", mp.s()]);
        let before = fingerprint(&BD.blob(&spec));
        let err = BD.cmd(&["mount", &spec, mp.s()]).fails_with(&format!(
            "holds {a} {fs} filesystem; blobdrive mounts only ext4 and xfs"
        ));
        assert_eq!(
            err.lines().filter(|l| l.contains("error")).count(),
            1,
            "{err}"
        );
        assert_eq!(
            fingerprint(&BD.blob(&spec)),
            before,
            "the refused {fs} drive changed"
        );
        BD.assert_nothing_left(mp.path(), &spec);
    }
}

/// `blobdrive ARGS` with the test account and `run` as its run directory.
fn bd_in(run: &Path, args: &[&str]) -> Output {
    Bd::new(args).cs(&BD.cs()).run_dir(run).output()
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn a_run_directory_another_user_could_write_to_is_refused() {
    require_root();
    let spec = BD.new_drive("rundir", "16MiB");
    let scratch = tempfile::tempdir().unwrap();
    let mp = BD.mp();
    let refused = |run: &Path, why: &str| {
        for args in [vec!["list"], vec!["mount", &spec, mp.s(), "--mode", "raw"]] {
            let out = bd_in(run, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} accepted {}", run.display());
            assert!(
                err.contains("refusing the run directory") && err.contains(why),
                "{args:?}: {err}"
            );
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
        assert!(!Path::new(&format!("{}/disk", mp.s())).exists());
    };
    // Another user's world-writable directory (what a local attacker offers).
    let theirs = scratch.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    sh_ok(&format!("chmod 0777 '{}'", theirs.display()));
    refused(&theirs, "not to root");
    // Root's, but open to others.
    let open = scratch.path().join("open");
    std::fs::create_dir(&open).unwrap();
    sh_ok(&format!("chmod 0755 '{}'", open.display()));
    refused(&open, "open to group or others");
    // Root's and closed, but its mounts/ is a symlink to somewhere else.
    let linked = scratch.path().join("linked");
    common::util::private_dir(&linked);
    std::os::unix::fs::symlink(&theirs, linked.join("mounts")).unwrap();
    refused(&linked, "not a directory");
    // A fresh one is made root's alone, and so is everything in it.
    let fresh = scratch.path().join("fresh/run");
    let out = bd_in(&fresh, &["mount", &spec, mp.s(), "--mode", "raw"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode_of(&fresh), 0o700);
    assert_eq!(mode_of(&fresh.join("mounts")), 0o700);
    for e in std::fs::read_dir(fresh.join("mounts")).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode_of(&p), 0o600, "{}", p.display());
    }
    let out = bd_in(&fresh, &["unmount", mp.s()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_control_socket_serves_root_only_and_bounds_its_lines() {
    require_root();
    let spec = BD.new_drive("ctlsock", "16MiB");
    // A run directory of its own: the test opens it to others for a moment, and
    // the shared one would then be refused to the tests running beside it.
    let scratch = tempfile::tempdir().unwrap();
    let own_run = scratch.path().join("run");
    common::util::private_dir(&own_run);
    let cs = BD.cs();
    let mp = Mp::new(&own_run, &cs);
    let own = |args: &[&str]| Bd::new(args).cs(&cs).run_dir(&own_run).ok();
    own(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let id = blobdrive::mount::record::id_for(&std::fs::canonicalize(mp.path()).unwrap());
    let sock = own_run.join("mounts").join(format!("{id}.sock"));
    assert_eq!(mode_of(&sock), 0o600);
    // Open the way to the socket, as a mistake could, to show that the peer
    // check alone turns another user away.
    let mounts = sock.parent().unwrap().to_path_buf();
    let run = mounts.parent().unwrap().to_path_buf();
    sh_ok(&format!(
        "chmod 0711 '{}' '{}' && chmod 0666 '{}'",
        run.display(),
        mounts.display(),
        sock.display()
    ));
    let client = |by_nobody: bool, line: &str| {
        let who = if by_nobody {
            "setpriv --reuid=65534 --regid=65534 --clear-groups --"
        } else {
            ""
        };
        let out = sh(&format!(
            "cd / && {who} /usr/bin/python3 -c \"import socket\ntry:\n    s = socket.socket(socket.AF_UNIX); s.connect('{}'); s.sendall(b'{line}'); s.shutdown(socket.SHUT_WR); print(repr(s.recv(4096)))\nexcept OSError as e:\n    print('refused', e)\"",
            sock.display()
        ));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let answer = client(true, "unmount\\n");
    sh_ok(&format!(
        "chmod 0700 '{}' '{}' && chmod 0600 '{}'",
        run.display(),
        mounts.display(),
        sock.display()
    ));
    assert!(
        answer == "b''" || answer.starts_with("refused"),
        "another user was answered: {answer}"
    );
    assert!(
        !answer.starts_with("refused [Errno 13]"),
        "the socket was not reachable, so the peer check was not shown: {answer}"
    );
    assert!(
        Path::new(&format!("{}/disk", mp.s())).exists(),
        "another user unmounted the drive"
    );
    // An endless line is refused; the daemon goes on serving.
    let long = "a".repeat(100_000);
    let answer = client(false, &long);
    assert!(answer.contains("too long"), "{answer}");
    assert!(mp.stats()["dirty_bytes"].is_u64());
    own(&["unmount", mp.s()]);
}

#[test]
fn a_fifo_or_a_symlink_as_credentials_file_is_refused_at_once() {
    require_root();
    let scratch = tempfile::tempdir().unwrap();
    let good = scratch.path().join("good.env");
    std::fs::write(
        &good,
        format!("AZURE_STORAGE_CONNECTION_STRING={}\n", BD.cs()),
    )
    .unwrap();
    sh_ok(&format!("chmod 600 '{}'", good.display()));
    let link = scratch.path().join("link.env");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    let fifo = scratch.path().join("fifo.env");
    sh_ok(&format!("mkfifo -m 600 '{}'", fifo.display()));
    let spec = BD.new_drive("credfifo", "16MiB");
    let mp = BD.mp();
    for f in [&fifo, &link] {
        // Under a timeout: a FIFO once hung the mount (and a boot) for ever.
        let out = sh(&format!(
            "timeout 20 '{}' mount '{spec}' '{}' --mode raw --credentials '{}'",
            env!("CARGO_BIN_EXE_blobdrive"),
            mp.s(),
            f.display()
        ));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(124), "hung on {}", f.display());
        assert!(
            !out.status.success() && err.contains("not a regular file"),
            "{}: {err}",
            f.display()
        );
    }
}

/// A CSI node plugin that ran on this machine (in this binary's run
/// directory): started until `list` shows its line, then stopped. Its record
/// of its budget stays, as a stopped plugin's does; dropping this removes it.
struct CsiNodeRan(std::path::PathBuf);

impl CsiNodeRan {
    fn start(node_id: &str) -> CsiNodeRan {
        let socket = BD.run_dir().join(format!("{node_id}.sock"));
        let mut node = BD
            .cmd(&["csi", "--role", "node", "--node-id", node_id])
            .command();
        node.args(["--container", "facts-node", "--cache-budget", "1GiB"])
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = node.spawn().unwrap();
        let listed = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            BD.ok(&["list"]).contains(&format!("CSI node {node_id}:"))
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_file(&socket);
        assert!(listed, "the node plugin's line never showed in `list`");
        CsiNodeRan(BD.run_dir().join("csi/staged"))
    }
}

impl Drop for CsiNodeRan {
    fn drop(&mut self) {
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with("budget-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// `mount`, `list` (with a CSI node plugin's line), `stats`, `warm` and
/// `unmount` say the same facts as text and as JSON (see tests/common/facts.rs
/// and `text_and_json_say_the_same_for_each_command` in tests/cli.rs): mount
/// and unmount on twin drives, fs and raw, the others on the same mounts.
#[test]
fn text_and_json_say_the_same_for_mount_list_stats_warm_and_unmount() {
    use common::facts::{strings, text_and_json, JSON_TWIN};
    require_root();
    let specs = [
        BD.new_drive("facts-fs", "64MiB"),
        BD.new_drive("facts-fs", "64MiB"),
    ];
    let raws = [
        BD.new_drive("facts-raw", "64MiB"),
        BD.new_drive("facts-raw", "64MiB"),
    ];
    let (fs, raw) = ([BD.mp(), BD.mp()], [BD.mp(), BD.mp()]);
    let caches = BD.run_dir().join("facts-caches");
    let _ = std::fs::remove_dir_all(&caches);
    common::util::private_dir(&caches);
    let dc = caches.to_str().unwrap();
    let which = |twin: &str| usize::from(twin == JSON_TWIN);
    let pairs = [
        (specs[1].as_str(), specs[0].as_str()),
        (raws[1].as_str(), raws[0].as_str()),
        (fs[1].s(), fs[0].s()),
        (raw[1].s(), raw[0].s()),
    ];
    let both = |args: &dyn Fn(&str) -> Vec<String>, same, own: &[&str]| {
        text_and_json(&BD, args, same, own, &pairs)
    };
    let mounted = both(
        &|t| {
            strings(&[
                "mount",
                &specs[which(t)],
                fs[which(t)].s(),
                "--mkfs",
                "ext4",
            ])
        },
        false,
        &["pid", "mode", "fuse_dir", "disk"],
    );
    assert_eq!(
        (&mounted["fstype"], &mounted["formatted"]),
        (&"ext4".into(), &true.into())
    );
    both(
        &|t| {
            let w = which(t);
            strings(&[
                "mount",
                &raws[w],
                raw[w].s(),
                "--mode",
                "raw",
                "--disk-cache",
                dc,
            ])
        },
        false,
        &["pid", "mode"],
    );
    for mp in &raw {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mp.disk())
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &vec![5u8; 4 * MIB as usize], 0).unwrap();
        f.sync_all().unwrap();
    }
    let _node = CsiNodeRan::start("facts-node");
    let listed = both(&|_| strings(&["list"]), true, &["kind"]);
    let kinds: Vec<&serde_json::Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["kind"])
        .collect();
    assert!(
        kinds.contains(&&"csi_node".into()) && kinds.contains(&&"mount".into()),
        "{listed}"
    );
    both(&|_| strings(&["stats", fs[0].s()]), true, &["*"]);
    let warmed = both(
        &|t| strings(&["warm", raw[which(t)].s()]),
        false,
        &["seconds"],
    );
    assert_eq!(warmed["mountpoint"], raw[1].s());
    for mps in [&fs, &raw] {
        let down = both(&|t| strings(&["unmount", mps[which(t)].s()]), false, &[]);
        assert_eq!(down["done"], "unmounted");
    }
}

/// A mount that fails keeps its log (to be read), which says the error once:
/// the worker tells the root part, which reports it and writes it.
#[test]
fn a_failed_mount_s_log_holds_its_error_once() {
    require_root();
    let spec = BD.new_drive("failedlog", "64MiB");
    let mp = BD.mp();
    let err = BD.cmd(&["mount", &spec, mp.s()]).fails_in_one_line();
    assert!(err.contains("holds no filesystem"), "{err}");
    let id = blobdrive::mount::record::id_for(mp.path());
    let log_path = BD.run_dir().join(format!("mounts/{id}.log"));
    let log = std::fs::read_to_string(&log_path).unwrap();
    let said = log
        .lines()
        .filter(|l| l.contains("holds no filesystem"))
        .count();
    assert_eq!(said, 1, "{log}");
    let _ = std::fs::remove_file(log_path);
}

/// `delete` of a drive mounted on this very machine says so and how to
/// unmount it, never to break the lease "if that host is dead": the host is
/// this one. Nothing is deleted; unmounted, it goes.
#[test]
fn delete_of_a_drive_mounted_here_says_where_and_how_to_unmount() {
    require_root();
    let spec = BD.new_drive("deletehere", "64MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mode", "raw"]);
    for args in [
        vec!["delete", &spec, "--yes"],
        vec!["delete", &spec, "--yes", "--snapshots"],
    ] {
        let err = BD.cmd(&args).fails_in_one_line();
        assert!(
            err.contains(&format!("is mounted on this machine, at {}", mp.s()))
                && err.contains(&format!("blobdrive unmount {}", mp.s()))
                && !err.contains("lease break"),
            "{err}"
        );
    }
    assert_eq!(
        json(&BD.ok(&["info", &spec, "--json"]))["lease_state"],
        "leased"
    );
    BD.unmount(&mp);
    BD.ok(&["delete", &spec, "--yes"]);
}
