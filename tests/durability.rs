//! Durability at the edges: requests that land after the client gave up on them,
//! unmount with the disk open or during an outage, writers through an outage,
//! lease loss at unmount, and memory under scattered writes. Runs as root against
//! Azurite through the fault-injecting proxy. Every test here failed on the code
//! before the durability work (issue 13).

mod common;
mod faultproxy;

use common::util::{json, rt, sh, sh_ok, stdout_of_success, wait_for};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use common::azurite::{unique_container, Azurite};
use common::bd::{Harness, Via};
use common::mount::{proc_status_kib, require_root, Mp};
use faultproxy::{Config, Hold, Proxy};

const BD: Harness = Harness::new("durability-run");

fn read_blob(spec: &str, offset: u64, len: u64) -> Vec<u8> {
    rt().block_on(BD.blob(spec).read(offset, len))
        .unwrap()
        .to_vec()
}

/// Writes `data` at `offset` of `path` and fsyncs, in one Python process.
fn pwrite_fsync(path: &str, offset: u64, data: &[u8]) {
    sh_ok(&format!(
        "python3 -c \"import os; fd = os.open('{path}', os.O_WRONLY); \
         assert os.pwrite(fd, bytes.fromhex('{}'), {offset}) == {}; os.fsync(fd); os.close(fd)\"",
        hex(data),
        data.len()
    ));
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A proxy that holds the first request whose head contains `needle` for
/// `delay_secs` and then forwards it, and the way to the account through it with
/// a request timeout of `timeout_secs`.
fn held(needle: &str, delay_secs: u64, timeout_secs: &str) -> (Proxy, Via) {
    let proxy = Proxy::start(Config::holding(
        Azurite::shared().port,
        needle,
        1,
        Duration::from_secs(delay_secs),
    ));
    let via = BD.via(
        &proxy.connection_string(),
        &[("BLOBDRIVE_REQUEST_TIMEOUT_SECS", timeout_secs)],
    );
    (proxy, via)
}

/// A proxy that holds the first Put Page for the disk's first bytes for `delay`
/// (long after a client with a 2 s request timeout gave up on it) and then
/// forwards it anyway.
fn holding_the_first_write_at_zero(delay: Duration) -> Proxy {
    Proxy::start(Config {
        hold: Some(Hold {
            needles: vec![
                "x-ms-page-write: update".into(),
                "x-ms-range: bytes=0-".into(),
            ],
            count: 1,
            delay,
        }),
        ..Config::clean(Azurite::shared().port)
    })
}

#[test]
fn an_abandoned_put_page_that_lands_late_changes_nothing() {
    require_root();
    let spec = BD.new_drive("late", "16MiB");
    let proxy = holding_the_first_write_at_zero(Duration::from_secs(8));
    let cs = proxy.connection_string();
    let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
    let mp = BD.via(&cs, &env).mount(&spec, &["--mode", "raw"]);
    let a = [b'A'; 512];
    let b = [b'B'; 512];
    pwrite_fsync(&mp.disk(), 0, &a);
    pwrite_fsync(&mp.disk(), 0, &b);
    wait_for("the held request to land", Duration::from_secs(30), || {
        !proxy.late_commits().is_empty()
    });
    BD.via(&cs, &env).unmount(&mp);
    let late = proxy.late_commits();
    let got = read_blob(&spec, 0, 512);
    assert!(
        got == b,
        "sector 0 holds {:?}...: an abandoned Put Page landed on top of a newer acknowledged write: {late:?}",
        String::from_utf8_lossy(&got[..8])
    );
    // It reached the server and was refused there, not lost on the way.
    assert_eq!(late[0].status, Some(412), "{late:?}");
}

/// A Python writer that writes 4 KiB blocks numbered from 0 into `path`, prints
/// each block's number once `pwrite` returned, and keeps the file open until its
/// standard input closes.
fn spawn_block_writer(path: &str, blocks: u64) -> std::process::Child {
    let script = format!(
        "import os, sys\n\
         fd = os.open('{path}', os.O_WRONLY)\n\
         for i in range({blocks}):\n\
         \x20   os.pwrite(fd, (b'%08d' % i) * 512, i * 4096)\n\
         \x20   print(i, flush=True)\n\
         sys.stdin.read()\n\
         os.close(fd)\n"
    );
    Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn unmount_refuses_while_the_raw_disk_is_open_and_loses_nothing() {
    require_root();
    let spec = BD.new_drive("busyraw", "64MiB");
    let cs = BD.cs();
    let mp = BD.via(&cs, &[]).mount(&spec, &["--mode", "raw"]);
    let blocks = 2048;
    let mut writer = spawn_block_writer(&mp.disk(), blocks);
    let mut out = std::io::BufReader::new(writer.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while out.read_line(&mut line).unwrap() > 0 && !line.contains(&format!("{}\n", blocks - 1)) {
        line.clear();
    }
    // Every block was acknowledged and the file is still open: unmount is refused.
    let refused = BD.cmd(&["unmount", mp.s()]).cs(&cs).output();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "unmount with the disk open must be refused"
    );
    assert!(err.contains("busy") || err.contains("open"), "{err}");
    // The mount still serves.
    assert_eq!(std::fs::metadata(mp.disk()).unwrap().len(), 64 << 20);
    drop(writer.stdin.take());
    assert!(writer.wait().unwrap().success());
    BD.via(&cs, &[]).unmount(&mp);
    let blob = read_blob(&spec, 0, blocks * 4096);
    for i in 0..blocks as usize {
        let want = format!("{i:08}").repeat(512);
        assert!(
            blob[i * 4096..(i + 1) * 4096] == *want.as_bytes(),
            "block {i} of {blocks} acknowledged writes is missing on the blob"
        );
    }
}

#[test]
fn writers_and_fsync_wait_through_a_40s_outage_at_default_settings() {
    require_root();
    let spec = BD.new_drive("outage", "256MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    BD.cmd(&[
        "mount",
        &spec,
        mp.s(),
        "--mode",
        "raw",
        "--cache-size",
        "32MiB",
    ])
    .cs(&cs)
    .ok();
    let src = tempfile::NamedTempFile::new().unwrap();
    let srcp = src.path().to_str().unwrap().to_string();
    sh_ok(&format!("head -c 160M /dev/urandom > '{srcp}'"));
    let dd = Command::new("dd")
        .args([
            format!("if={srcp}"),
            format!("of={}", mp.disk()),
            "bs=1M".into(),
            "conv=notrunc,fsync".into(),
            "status=none".into(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once writing is under way, the backend stops answering for 40 s.
    wait_for("dd to start writing", Duration::from_secs(60), || {
        mp.stats()["bytes_written"].as_u64().unwrap() > 24 << 20
    });
    proxy.paused.store(true, SeqCst);
    std::thread::sleep(Duration::from_secs(30));
    let during = mp.stats();
    std::thread::sleep(Duration::from_secs(10));
    proxy.paused.store(false, SeqCst);
    let out = dd.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "dd failed through the outage: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        during["stalled_secs"].as_f64().unwrap_or(0.0) >= 10.0,
        "stats do not show the stall: {during}"
    );
    assert!(during["last_error"].is_string(), "{during}");
    BD.via(&cs, &[]).unmount(&mp);
    let want = sh_ok(&format!("sha256sum < '{srcp}'"));
    let blob = read_blob(&spec, 0, 160 << 20);
    let got_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(got_file.path(), &blob).unwrap();
    let got = sh_ok(&format!("sha256sum < '{}'", got_file.path().display()));
    assert_eq!(want, got, "the blob does not hold what dd wrote");
}

#[test]
fn unmount_waits_out_an_outage_and_loses_no_unsynced_file() {
    require_root();
    let spec = BD.new_drive("umoutage", "256MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.via(&cs, &[]).mount(&spec, &["--mkfs", "ext4"]);
    let sum = sh_ok(&format!(
        "head -c 20M /dev/urandom > '{0}/r3.bin' && sha256sum < '{0}/r3.bin'",
        mp.s()
    ));
    proxy.paused.store(true, SeqCst);
    let started = Instant::now();
    let unmount = BD.cmd(&["unmount", mp.s()]).cs(&cs).spawn_piped();
    std::thread::sleep(Duration::from_secs(40));
    proxy.paused.store(false, SeqCst);
    let out = unmount.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "unmount failed: {text}");
    assert!(started.elapsed() >= Duration::from_secs(40), "{text}");
    assert!(
        text.contains("waiting"),
        "unmount said nothing while it waited: {text}"
    );
    // Everything is on the blob: the file is whole and the filesystem clean.
    let dev = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    sh_ok(&format!("e2fsck -fn {dev}"));
    BD.ok(&["unmount", mp.s()]);
    let mp2 = BD.mp();
    BD.ok(&["mount", &spec, mp2.s(), "--read-only"]);
    let again = sh_ok(&format!("sha256sum < '{}/r3.bin'", mp2.s()));
    BD.ok(&["unmount", mp2.s()]);
    assert_eq!(sum, again);
}

/// A plain `umount` (systemd's at shutdown) while the service does not answer:
/// like `blobdrive unmount`, it waits for the service without limit (a flush
/// failed by the I/O timeout would make ext4 abort its journal and drop what it
/// had not committed: the file written here, before this was fixed), then every
/// byte is on the blob, the filesystem is clean and the lease released.
#[test]
fn a_plain_umount_during_an_outage_waits_for_the_service_and_loses_nothing() {
    require_root();
    let spec = BD.new_drive("umountoutage", "64MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    let short = [
        ("BLOBDRIVE_IO_TIMEOUT_SECS", "3"),
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "1"),
    ];
    BD.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"])
        .cs(&cs)
        .envs(&short)
        .ok();
    let pid = mp.pid() as u32;
    let sum = sh_ok(&format!(
        "head -c 12M /dev/urandom > '{0}/r.bin' && sha256sum < '{0}/r.bin'",
        mp.s()
    ));
    proxy.paused.store(true, SeqCst);
    let mut umount = Command::new("umount")
        .arg(mp.s())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lease = |state: &str| json(&BD.ok(&["lease", "status", &spec, "--json"]))["state"] == state;
    // Well past the I/O timeout: umount still waits, and so does the daemon,
    // holding the lease.
    std::thread::sleep(Duration::from_secs(10));
    let waiting = umount.try_wait().unwrap().is_none();
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    let leased = lease("leased");
    proxy.paused.store(false, SeqCst);
    let out = umount.wait_with_output().unwrap();
    assert!(out.status.success(), "umount: {out:?}");
    assert!(
        waiting && alive && leased,
        "during the outage umount and the daemon must wait, holding the lease (umount waiting {waiting}, daemon alive {alive}, leased {leased})"
    );
    wait_for("the daemon to finish", Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(lease("available"), "the lease was not released");
    // Every byte: the image is a clean filesystem (no journal to replay) holding
    // the file.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image.raw");
    BD.ok(&[
        "download",
        &spec,
        image.to_str().unwrap(),
        "--format",
        "raw",
    ]);
    sh_ok(&format!("e2fsck -fn '{}'", image.display()));
    let got = sh_ok(&format!(
        "debugfs -R 'cat /r.bin' '{}' 2>/dev/null | sha256sum",
        image.display()
    ));
    assert_eq!(sum, got);
}

#[test]
fn memory_stays_within_the_cache_size_under_scattered_512_byte_writes() {
    require_root();
    let spec = BD.new_drive("memory", "1GiB");
    let cs = BD.cs();
    let mp = BD.mp_through(&cs);
    BD.cmd(&[
        "mount",
        &spec,
        mp.s(),
        "--mode",
        "raw",
        "--cache-size",
        "64MiB",
    ])
    .cs(&cs)
    .ok();
    // One 512-byte O_DIRECT write every 64 KiB over the whole disk, then fsync.
    sh_ok(&format!(
        "python3 -c \"import mmap, os\n\
fd = os.open('{}', os.O_WRONLY | os.O_DIRECT)\n\
buf = mmap.mmap(-1, 4096); buf.write(b'x' * 512)\n\
for i in range(0, 1 << 30, 65536): os.pwritev(fd, [memoryview(buf)[:512]], i)\n\
os.fsync(fd)\"",
        mp.disk()
    ));
    let pid = mp.pid() as u32;
    let hwm = proc_status_kib(pid as u64, "VmHWM") / 1024;
    eprintln!(
        "daemon memory: peak {hwm} MiB, now {} MiB",
        proc_status_kib(pid as u64, "VmRSS") / 1024
    );
    BD.via(&cs, &[]).unmount(&mp);
    assert!(
        hwm <= 64 + 150,
        "the daemon's peak resident memory was {hwm} MiB with --cache-size 64MiB"
    );
    let blob = read_blob(&spec, 65536 * 100, 1024);
    assert_eq!(&blob[..512], &[b'x'; 512][..]);
    assert_eq!(&blob[512..], &[0u8; 512][..]);
}

#[test]
fn unmount_after_the_lease_was_lost_says_what_was_dropped_and_fails() {
    require_root();
    let spec = BD.new_drive("lostlease", "64MiB");
    let cs = BD.cs();
    let mp = BD.mp_through(&cs);
    // Through the loop device, which holds the disk file open: written, never
    // synced, so still only in the cache when the lease goes.
    let dev = BD
        .cmd(&["mount", &spec, mp.s(), "--mode", "block"])
        .cs(&cs)
        .ok();
    sh_ok(&format!(
        "head -c 512 /dev/urandom | dd of='{}' conv=notrunc status=none",
        dev.trim()
    ));
    common::mount::break_lease_from_elsewhere(&cs, &spec);
    let out = BD.cmd(&["unmount", mp.s()]).cs(&cs).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "unmount must not report success: {err}"
    );
    assert!(err.contains("lease") && err.contains("lost"), "{err}");
    assert!(err.contains("KiB") && err.contains("dropped"), "{err}");
    // The daemon is gone and nothing is left mounted.
    assert!(!sh(&format!("mountpoint -q '{}'", mp.s())).status.success());
}

#[test]
fn a_lease_that_cannot_be_released_fails_the_unmount_and_says_so() {
    require_root();
    let spec = BD.new_drive("norelease", "64MiB");
    let proxy = Proxy::start(Config::holding(
        Azurite::shared().port,
        "x-ms-lease-action: release",
        1000,
        Duration::from_secs(3),
    ));
    let cs = proxy.connection_string();
    let env = [
        ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "1"),
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "3"),
    ];
    let mp = BD.via(&cs, &env).mount(&spec, &["--mode", "raw"]);
    let out = BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("lease break"), "{err}");
}

#[test]
fn a_write_across_the_end_lands_its_inside_part_and_read_only_close_does_not_flush() {
    require_root();
    let spec = BD.new_drive("edge", "16MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.via(&cs, &[]).mount(&spec, &["--mode", "raw"]);
    let size = 16u64 << 20;
    let wrote = sh_ok(&format!(
        "python3 -c \"import os; fd = os.open('{}', os.O_WRONLY); \
         print(os.pwrite(fd, b'E' * 1024, {})); os.fsync(fd)\"",
        mp.disk(),
        size - 512
    ));
    assert_eq!(wrote.trim(), "512", "a block device writes the part inside");
    // Unsynced data, backend paused: closing a read-only handle does not wait for it.
    sh_ok(&format!(
        "printf 'dirty' | dd of='{}' bs=512 seek=4 conv=notrunc status=none",
        mp.disk()
    ));
    proxy.paused.store(true, SeqCst);
    let started = Instant::now();
    sh_ok(&format!("head -c 512 '{}' > /dev/null", mp.disk()));
    let took = started.elapsed();
    proxy.paused.store(false, SeqCst);
    assert!(
        took < Duration::from_secs(5),
        "read-only close took {took:?}"
    );
    BD.via(&cs, &[]).unmount(&mp);
    assert_eq!(read_blob(&spec, size - 512, 512), vec![b'E'; 512]);
    assert_eq!(&read_blob(&spec, 2048, 5)[..], b"dirty");
}

#[test]
fn snapshot_create_finds_the_mount_by_account_too_and_freezes_only_filesystems() {
    require_root();
    let spec = BD.new_drive("snapacct", "16MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let said = |cs: &str| {
        let out = BD.cmd(&["snapshot", "create", &spec]).cs(cs).output();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        stdout_of_success(&"snapshot create", out);
        err
    };
    // The same names behind another endpoint are another account's drive: not the
    // one mounted here, whatever its container and blob are called.
    let other = Proxy::start(Config::clean(Azurite::shared().port));
    let elsewhere = said(&other.connection_string());
    assert!(
        elsewhere.contains("not mounted on this machine"),
        "{elsewhere}"
    );
    let here = said(&BD.cs());
    assert!(
        here.contains("flushed") && here.contains("not frozen"),
        "{here}"
    );
    BD.ok(&["unmount", mp.s()]);
}

/// A proxy that carries out the first request whose head holds every one of
/// `needles`, and drops its answer: the client cannot know it was done.
fn lost_answer(needles: &[&str]) -> Proxy {
    Proxy::start(Config {
        hold: Some(Hold {
            needles: needles.iter().map(|n| n.to_string()).collect(),
            count: 1,
            delay: Duration::ZERO,
        }),
        ..Config::clean(Azurite::shared().port)
    })
}

#[test]
fn a_snapshot_whose_answer_was_lost_is_taken_once() {
    require_root();
    let spec = BD.new_drive("snaplost", "16MiB");
    let proxy = lost_answer(&["comp=snapshot"]);
    let id = BD
        .cmd(&["snapshot", "create", &spec])
        .cs(&proxy.connection_string())
        .ok();
    assert_eq!(proxy.late_commits().len(), 1, "the answer was not lost");
    let list = json(&BD.ok(&["snapshot", "list", &spec, "--json"]));
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![id.trim()], "one snapshot asked for, one taken");
}

#[test]
fn a_delete_whose_answer_was_lost_succeeds() {
    require_root();
    let spec = BD.new_drive("dellost", "16MiB");
    let proxy = lost_answer(&["delete /"]);
    BD.cmd(&["delete", &spec, "--yes"])
        .cs(&proxy.connection_string())
        .ok();
    assert_eq!(proxy.late_commits().len(), 1, "the answer was not lost");
    assert!(rt()
        .block_on(BD.blob(&spec).properties())
        .unwrap_err()
        .is_not_found());
}

/// A delete is held in the network past the client's timeout; the retry deletes
/// the drive, a new drive is created under the same name, and only then does the
/// first attempt reach the service. It must not delete the new drive.
#[test]
fn a_delete_that_lands_after_the_name_was_used_again_deletes_nothing() {
    require_root();
    let spec = BD.new_drive("dellate", "16MiB");
    let (proxy, via) = held("delete /", 15, "2");
    via.cmd(&["delete", &spec, "--yes"]).ok();
    BD.ok(&["create", &spec, "--size", "16MiB"]);
    let blob = BD.blob(&spec);
    rt().block_on(blob.put_pages(0, bytes::Bytes::from(vec![b'R'; 4096]), None))
        .unwrap();
    proxy.held_lands_late_and_is_refused("delete");
    assert_eq!(read_blob(&spec, 0, 4096), vec![b'R'; 4096]);
}

/// An upload's first Put Page is held in the network past the client's timeout;
/// the retry lands, the upload finishes, the drive is mounted and written where
/// that Put Page went, and only then does the held one reach the service. It must
/// be refused, not put the image's bytes back over the acknowledged write.
#[test]
fn an_upload_put_page_that_lands_late_is_refused() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img.raw");
    std::fs::write(&img, vec![b'I'; 4 << 20]).unwrap();
    let spec = format!("{}/disk.vhd", unique_container("uplate"));
    // The container, made by creating a drive in it and deleting the drive.
    BD.ok(&["create", &spec, "--size", "4MiB", "--create-container"]);
    BD.ok(&["delete", &spec, "--yes"]);
    let proxy = holding_the_first_write_at_zero(Duration::from_secs(15));
    let cs = proxy.connection_string();
    let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
    BD.cmd(&["upload", img.to_str().unwrap(), &spec])
        .cs(&cs)
        .envs(&env)
        .ok();
    assert_eq!(read_blob(&spec, 0, 4096), vec![b'I'; 4096]);
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    pwrite_fsync(&mp.disk(), 0, &[b'W'; 4096]);
    BD.ok(&["unmount", mp.s()]);
    proxy.held_lands_late_and_is_refused("Put Page");
    assert_eq!(read_blob(&spec, 0, 4096), vec![b'W'; 4096]);
}

/// A drive with one snapshot, data written after it, and the snapshot's id.
fn drive_with_a_snapshot(tag: &str) -> (String, String) {
    let spec = BD.new_drive(tag, "16MiB");
    let blob = BD.blob(&spec);
    rt().block_on(blob.put_pages(0, bytes::Bytes::from(vec![b'S'; 4096]), None))
        .unwrap();
    let id = BD.ok(&["snapshot", "create", &spec]);
    rt().block_on(blob.put_pages(0, bytes::Bytes::from(vec![b'N'; 4096]), None))
        .unwrap();
    (spec, id.trim().to_string())
}

#[test]
fn a_restore_whose_answer_was_lost_succeeds() {
    require_root();
    let (spec, id) = drive_with_a_snapshot("restlost");
    let proxy = lost_answer(&["x-ms-copy-source"]);
    let cs = proxy.connection_string();
    BD.cmd(&["restore", &spec, "--from", &id, "--yes"])
        .cs(&cs)
        .ok();
    assert_eq!(proxy.late_commits().len(), 1, "the answer was not lost");
    assert_eq!(read_blob(&spec, 0, 4096), vec![b'S'; 4096]);
}

/// Another party writes the drive between `restore` checking it and its copy
/// reaching the service (held meanwhile), after an earlier restore from the same
/// snapshot: the copy is refused for the changed ETag, and `restore` must say
/// nothing was restored, not take the old copy's source for its own.
#[test]
fn a_restore_that_meets_another_writer_says_nothing_was_restored() {
    require_root();
    let (spec, id) = drive_with_a_snapshot("restrace");
    BD.ok(&["restore", &spec, "--from", &id, "--yes"]);
    let (proxy, via) = held("x-ms-copy-source", 1, "3");
    let restore = via
        .cmd(&["restore", &spec, "--from", &id, "--yes"])
        .spawn_piped();
    proxy.wait_for_holding("the copy", Duration::from_secs(30));
    let theirs = vec![b'X'; 4096];
    rt().block_on(BD.blob(&spec).put_pages(0, theirs.clone().into(), None))
        .unwrap();
    let out = restore.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "restore claimed success: {out:?}");
    assert!(err.contains("changed while it was being restored"), "{err}");
    assert_eq!(proxy.late_commits()[0].status, Some(412));
    assert_eq!(read_blob(&spec, 0, 4096), theirs);
}

/// A restore's Copy Blob is held in the network past the client's timeout; the
/// retry restores the drive, which is then mounted, written and unmounted, and
/// only then does the first attempt reach the service. It must be refused: it
/// would copy the snapshot back over acknowledged writes.
#[test]
fn a_restore_copy_that_lands_late_is_refused() {
    require_root();
    let (spec, id) = drive_with_a_snapshot("restlate");
    let (proxy, via) = held("x-ms-copy-source", 15, "2");
    via.cmd(&["restore", &spec, "--from", &id, "--yes"]).ok();
    assert_eq!(read_blob(&spec, 0, 4096), vec![b'S'; 4096]);
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    pwrite_fsync(&mp.disk(), 8192, &[b'W'; 4096]);
    BD.ok(&["unmount", mp.s()]);
    proxy.held_lands_late_and_is_refused("copy");
    assert_eq!(read_blob(&spec, 8192, 4096), vec![b'W'; 4096]);
}

#[test]
fn a_read_only_mount_of_a_live_blob_sees_data_written_after_it_mounted() {
    require_root();
    let spec = BD.new_drive("rolive", "16MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw", "--read-only"]);
    // Another host writes where the blob held nothing when the reader mounted.
    rt().block_on(
        BD.blob(&spec)
            .put_pages(1 << 20, bytes::Bytes::from(vec![b'L'; 4096]), None),
    )
    .unwrap();
    let got = sh_ok(&format!(
        "dd if='{}' bs=4096 skip=256 count=1 status=none | head -c 8",
        mp.disk()
    ));
    BD.ok(&["unmount", mp.s()]);
    assert_eq!(got, "LLLLLLLL", "a hole was answered from a stale page map");
}

/// Runs fio with `args` (a tool nobody here wrote checks the data). fio saves each
/// verify job's state to `NAME-N-verify.state` in the working directory (the
/// repository root, under `cargo test`) unless told not to; no job here loads one.
fn fio(args: &str) {
    sh_ok(&format!(
        "fio --minimal --verify_fatal=1 --verify_state_save=0 --randseed=20261123 {args}"
    ));
}

#[test]
fn fio_verifies_through_faults_and_again_from_the_blob_after_remount() {
    require_root();
    let spec = BD.new_drive("fioverify", "128MiB");
    let proxy = Proxy::start(Config {
        rate: 0.03,
        seed: 5,
        kinds: &[
            faultproxy::Fault::Busy503,
            faultproxy::Fault::Internal500,
            faultproxy::Fault::ResetBefore,
            faultproxy::Fault::ResetAfter,
        ],
        ..Config::clean(Azurite::shared().port)
    });
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    // Raw disk: random 4 KiB direct writes with checksummed blocks, verified
    // right away (through the cache) ...
    let job = |mp: &Mp, verify_only: bool| {
        format!(
            "--name=raw --filename='{}' --rw=randwrite --bs=4k --size=48M --ioengine=psync \
             --direct=1 --verify=crc32c --do_verify=1 --fsync_on_close=1 {}",
            mp.disk(),
            if verify_only { "--verify_only" } else { "" }
        )
    };
    BD.cmd(&[
        "mount",
        &spec,
        mp.s(),
        "--mode",
        "raw",
        "--cache-size",
        "32MiB",
    ])
    .cs(&cs)
    .ok();
    fio(&job(&mp, false));
    BD.via(&cs, &[]).unmount(&mp);
    assert!(!proxy.injected().is_empty(), "no fault was injected");
    // ... and again from the blob itself, through a fresh mount and cold cache
    // (writable: fio opens the file of a write job for writing, also to verify).
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    fio(&job(&mp, true));
    BD.ok(&["unmount", mp.s()]);
    // A filesystem on a drive of its own (--mkfs formats only an empty one):
    // files written and verified by fio, then checked again after a remount.
    let spec = BD.new_drive("fioverify-fs", "128MiB");
    let fsjob = |dir: &str, verify_only: bool| {
        format!(
            "--name=fs --directory='{dir}' --nrfiles=8 --rw=randrw --bs=16k --size=24M \
             --ioengine=psync --verify=md5 --do_verify=1 --fsync_on_close=1 {}",
            if verify_only { "--verify_only" } else { "" }
        )
    };
    BD.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"])
        .cs(&cs)
        .ok();
    fio(&fsjob(mp.s(), false));
    BD.via(&cs, &[]).unmount(&mp);
    BD.ok(&["mount", &spec, mp.s()]);
    fio(&fsjob(mp.s(), true));
    BD.ok(&["unmount", mp.s()]);
}

/// Short timeouts, so that a last try and a lease release give up soon.
const SHORT_TIMEOUTS: [(&str, &str); 2] = [
    ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2"),
    ("BLOBDRIVE_RETRY_BUDGET_SECS", "3"),
];

/// A drive mounted in block mode through a proxy that then stops answering, with
/// `mib` MiB written to its loop device that the service never got. Block mode:
/// closing the loop device does not flush (closing `disk` would).
struct Stuck {
    spec: String,
    /// Dropped (and so unmounted) before the proxy it talks through.
    mp: Mp,
    proxy: Proxy,
    cs: String,
    dev: String,
}

fn stuck_block_mount(tag: &str, mib: u32) -> Stuck {
    let spec = BD.new_drive(tag, "64MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    let dev = BD
        .cmd(&["mount", &spec, mp.s(), "--mode", "block"])
        .cs(&cs)
        .envs(&SHORT_TIMEOUTS)
        .ok()
        .trim()
        .to_string();
    proxy.paused.store(true, SeqCst);
    sh_ok(&format!(
        "timeout 60 dd if=/dev/urandom of={dev} bs=1M count={mib} oflag=direct status=none"
    ));
    Stuck {
        spec,
        mp,
        proxy,
        cs,
        dev,
    }
}

impl Stuck {
    /// The service answers again. The lease release the daemon gave up on was held
    /// by the paused proxy and may land now (a late commit); otherwise the lease
    /// stays held until broken, which this does.
    fn resume_and_free_the_lease(&self) {
        self.proxy.paused.store(false, SeqCst);
        std::thread::sleep(Duration::from_millis(500));
        let info = json(&BD.ok(&["info", &self.spec, "--json"]));
        if info["lease_state"] == "leased" {
            BD.ok(&["lease", "break", &self.spec, "--yes"]);
        }
    }
}

/// A plain `unmount` of `mp` started in the background, checked to be still
/// waiting (for a service that does not answer) six seconds later.
fn waiting_unmount(cs: &str, env: &[(&str, &str)], mp: &Mp) -> std::process::Child {
    let mut waiting = BD
        .cmd(&["unmount", mp.s()])
        .cs(cs)
        .envs(env)
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "unmount did not wait"
    );
    waiting
}

#[test]
fn unmount_discard_dirty_takes_down_a_drive_the_service_will_not_take_data_for() {
    require_root();
    // 4 MiB the service will never get.
    let st = stuck_block_mount("discard", 4);
    let (cs, mp, env) = (&st.cs, &st.mp, &SHORT_TIMEOUTS);
    // Without --yes it refuses and changes nothing.
    let refused = BD
        .cmd(&["unmount", mp.s(), "--discard-dirty"])
        .cs(cs)
        .envs(env)
        .output();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    assert!(sh_ok("losetup -a").contains(&st.dev));
    let started = Instant::now();
    let out = BD
        .cmd(&["unmount", mp.s(), "--discard-dirty", "--yes"])
        .cs(cs)
        .envs(env)
        .output();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    // Data was lost: non-zero, naming how much; the lease cannot be released while
    // the service does not answer, and it says so and how to break it.
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("dropped 4 MiB"), "{err}");
    assert!(
        err.contains("lease") && err.contains("lease break"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(90), "{err}");
    // Nothing is left mounted or attached, and no record remains.
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(mp.s()));
    // (By backing file: another test running alongside may already have been
    // given the same loop device number.)
    assert!(!sh_ok("losetup -a").contains(mp.s()));
    let listed = json(&BD.cmd(&["list", "--json"]).cs(cs).ok());
    assert!(
        !listed.to_string().contains(mp.s()),
        "still listed: {listed}"
    );
    assert!(err.contains("could not be released"), "{err}");
    st.resume_and_free_the_lease();
    // The dropped bytes never reached the blob.
    assert!(read_blob(&st.spec, 0, 4 << 20).iter().all(|&b| b == 0));
}

#[test]
fn unmount_discard_dirty_stops_an_unmount_that_waits_for_the_service() {
    require_root();
    let st = stuck_block_mount("discard2", 2);
    let (cs, mp, env) = (&st.cs, &st.mp, &SHORT_TIMEOUTS);
    // A plain unmount waits without limit; the operator gives up on it.
    let mut waiting = waiting_unmount(cs, env, mp);
    waiting.kill().unwrap();
    let _ = waiting.wait();
    let out = BD
        .cmd(&["unmount", mp.s(), "--discard-dirty", "--yes"])
        .cs(cs)
        .envs(env)
        .output();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("dropped 2 MiB"), "{err}");
    assert!(!err.contains("all data is on the blob"), "{err}");
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(mp.s()));
    st.resume_and_free_the_lease();
}

/// An ext4 drive whose service stops answering for good, with data the service
/// never got: a plain unmount waits in the kernel, inside the filesystem's last
/// sync, which writes through the daemon. `--discard-dirty --yes` must end it
/// (and itself) all the same, dropping what cannot be written and saying so;
/// before, the sync waited on with the daemon, and both unmounts and every
/// `sync(1)` on the machine hung until the service came back.
#[test]
fn unmount_discard_dirty_ends_an_ext4_unmount_whose_last_sync_waits_for_the_service() {
    require_root();
    let spec = BD.new_drive("discard-fs", "64MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let env = &SHORT_TIMEOUTS;
    let mp = BD.via(&cs, env).mount(&spec, &["--mkfs", "ext4"]);
    sh_ok(&format!(
        "dd if=/dev/urandom of={}/f bs=1M count=3 conv=fsync status=none",
        mp.s()
    ));
    proxy.paused.store(true, SeqCst);
    // Written and left to the kernel's write-back: the unmount's sync sends it.
    sh_ok(&format!(
        "dd if=/dev/urandom of={}/g bs=1M count=2 status=none",
        mp.s()
    ));
    let mut waiting = waiting_unmount(&cs, env, &mp);
    let mut discard = BD
        .cmd(&["unmount", mp.s(), "--discard-dirty", "--yes"])
        .cs(&cs)
        .envs(env)
        .spawn_piped();
    let deadline = Instant::now() + Duration::from_secs(90);
    while discard.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // Let everything finish before failing, so nothing stays stuck.
            proxy.paused.store(false, SeqCst);
            let _ = discard.wait();
            let _ = waiting.wait();
            panic!("unmount --discard-dirty did not end while the service was gone");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = discard.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("dropped"), "{err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiting.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the first unmount still waits");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(mp.s()));
    assert!(!sh_ok("losetup -a").contains(mp.s()));
    proxy.paused.store(false, SeqCst);
    std::thread::sleep(Duration::from_millis(500));
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    if info["lease_state"] == "leased" {
        BD.ok(&["lease", "break", &spec, "--yes"]);
    }
}

#[test]
fn the_raw_disk_can_be_memory_mapped_and_msync_puts_it_on_the_blob() {
    require_root();
    let spec = BD.new_drive("mmap", "16MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    // A shared mapping, written through and flushed with msync; then read back
    // through a second mapping before unmount.
    let read_back = sh_ok(&format!(
        "python3 -c \"import mmap, os\n\
fd = os.open('{0}', os.O_RDWR)\n\
m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=4 << 20)\n\
m[8192:8192 + 11] = b'mapped page'\n\
m.flush(); m.close(); os.close(fd)\n\
fd = os.open('{0}', os.O_RDONLY)\n\
r = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ, offset=4 << 20)\n\
print(r[8192:8192 + 11].decode())\"",
        mp.disk()
    ));
    assert_eq!(read_back.trim(), "mapped page");
    BD.ok(&["unmount", mp.s()]);
    assert_eq!(&read_blob(&spec, (4 << 20) + 8192, 11)[..], b"mapped page");
}

/// A mount's Acquire Lease is held in the network past the client's timeout; the
/// retry takes the lease, the drive is unmounted (nothing written), and only then
/// does the first attempt reach the service. It must take nothing: unmount said
/// the drive was free, and the next mount must find it so.
#[test]
fn an_abandoned_lease_acquire_that_lands_after_unmount_takes_nothing() {
    require_root();
    let spec = BD.new_drive("lateacq", "16MiB");
    let (proxy, via) = held("x-ms-lease-action: acquire", 15, "2");
    let mp = via.mount(&spec, &["--mode", "raw"]);
    via.unmount(&mp);
    proxy.held_lands_late_and_is_refused("acquire");
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_ne!(info["lease_state"], "leased", "{info}");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    BD.ok(&["unmount", mp.s()]);
}

/// `lease break` of a dead host's lease: its Break Lease is held in the network
/// past the client's timeout, the retry breaks the lease, a new mount takes the
/// drive, and only then does the first attempt reach the service. It must not
/// break the new mount's lease (which would fence the mount and fail its writes).
/// Once at once, and once with a break period, which the command waits out
/// before it raises the sequence number.
#[test]
fn an_abandoned_lease_break_that_lands_after_a_new_mount_breaks_nothing() {
    require_root();
    for period in [None, Some("2")] {
        let spec = BD.new_drive("latebrk", "16MiB");
        let dead = "0badf00d-0000-4000-8000-000000000000";
        rt().block_on(BD.blob(&spec).acquire_lease(dead, None))
            .unwrap();
        let (proxy, via) = held("x-ms-lease-action: break", 15, "2");
        let mut args = vec!["lease", "break", &spec, "--yes"];
        if let Some(p) = period {
            args.extend(["--period", p]);
        }
        let said = via.cmd(&args).ok();
        assert!(said.contains("lease broken;"), "{period:?}: {said}");
        let mp = BD.mp();
        BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
        proxy.held_lands_late_and_is_refused("break");
        let info = json(&BD.ok(&["info", &spec, "--json"]));
        assert_eq!(info["lease_state"], "leased", "{period:?}: {info}");
        let data = [0x5au8; 4096];
        pwrite_fsync(&mp.disk(), 0, &data);
        BD.ok(&["unmount", mp.s()]);
        assert_eq!(read_blob(&spec, 0, 4096), data);
    }
}

/// `lease break` while the dead host's last write is still landing: the write
/// lands between `lease break` reading the drive and its break reaching the
/// service (held meanwhile), so the break is refused for the changed ETag; the
/// command reads the drive again and breaks the lease.
#[test]
fn a_lease_break_that_meets_a_late_write_of_the_dead_host_reads_again_and_breaks() {
    require_root();
    let spec = BD.new_drive("brkrace", "16MiB");
    let dead = "0badf00d-0000-4000-8000-000000000001";
    let blob = BD.blob(&spec);
    rt().block_on(blob.acquire_lease(dead, None)).unwrap();
    let (proxy, via) = held("x-ms-lease-action: break", 1, "3");
    let breaker = via.cmd(&["lease", "break", &spec, "--yes"]).spawn_piped();
    proxy.wait_for_holding("the break", Duration::from_secs(30));
    rt().block_on(blob.put_pages(0, bytes::Bytes::from(vec![b'D'; 4096]), Some(dead)))
        .unwrap();
    let out = breaker.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(proxy.late_commits()[0].status, Some(412));
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(info["lease_state"], "broken", "{info}");
}

/// Another party writes the blob between the mount reading it and its acquire
/// landing (the acquire is held in the network meanwhile): the acquire is refused
/// for the changed ETag, the mount reads the drive again, takes the lease, and
/// shows the other party's data, not a view read before it.
#[test]
fn a_drive_written_while_its_lease_is_being_taken_is_read_again() {
    require_root();
    let spec = BD.new_drive("raceacq", "16MiB");
    let (proxy, via) = held("x-ms-lease-action: acquire", 1, "3");
    let mp = via.mp();
    let mount = via
        .cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .spawn_piped();
    proxy.wait_for_holding("the acquire", Duration::from_secs(30));
    let theirs = vec![0x3c; 4096];
    rt().block_on(BD.blob(&spec).put_pages(8192, theirs.clone().into(), None))
        .unwrap();
    let out = mount.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let late = proxy.late_commits();
    assert_eq!(late[0].status, Some(412), "{late:?}");
    let mut got = vec![0u8; 4096];
    File::open(mp.disk())
        .unwrap()
        .read_exact_at(&mut got, 8192)
        .unwrap();
    assert!(
        got == theirs,
        "the mount shows the drive as it was before the write"
    );
    via.unmount(&mp);
}

#[test]
fn a_lease_release_whose_answer_was_lost_is_a_clean_unmount() {
    require_root();
    let spec = BD.new_drive("rellost", "16MiB");
    let proxy = lost_answer(&["x-ms-lease-action: release"]);
    let cs = proxy.connection_string();
    let mp = BD.via(&cs, &[]).mount(&spec, &["--mode", "raw"]);
    BD.via(&cs, &[]).unmount(&mp);
    assert_eq!(proxy.late_commits().len(), 1, "the answer was not lost");
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_ne!(info["lease_state"], "leased", "{info}");
}
