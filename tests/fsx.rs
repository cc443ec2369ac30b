//! fsx, the File System eXerciser (Alan Somers' Rust port of the FreeBSD and
//! Linux tool, from crates.io), drives a mounted drive through a network that
//! fails, stalls and commits requests late. fsx checks every read against its own
//! model as it goes; at the end the blob must hold, byte for byte, what the same
//! fsx run (same seed, same settings) leaves in a local file: a second oracle that
//! shares no code with blobdrive or its tests.
//!
//! The blob is read at the end by Microsoft's Python SDK, not by blobdrive.
//!
//! fsx is built into `target/tools` by `scripts/install-deps.sh` (which
//! `scripts/test.sh` runs), or named by `BLOBDRIVE_FSX`. `BLOBDRIVE_FSX_OPS`
//! sets the number of operations per run (default 1500); `BLOBDRIVE_FSX_SEED`
//! replays a run.

mod common;
mod faultproxy;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::azurite::Azurite;
use common::bd::Harness;
use common::mount::require_root;
use common::sdk;
use common::util::{env_u64, fsx_bin};
use faultproxy::{Config, Hold, Proxy};

/// fsx settings shared by both runs: reads and writes of up to 1 MiB at any byte
/// offset, through pread/pwrite, mmap, sendfile and copy_file_range, with hole
/// punching, cache invalidation, fsync and fdatasync among them.
const COMMON_WEIGHTS: &str = "read = 10
write = 10
mapread = 5
mapwrite = 5
invalidate = 1
fsync = 2
fdatasync = 2
punch_hole = 2
sendfile = 1
posix_fadvise = 1
copy_file_range = 2
";

const BD: Harness = Harness::new("fsx-run");

/// The raw disk file of a `--mode raw` mount, as a block device: fsx never
/// changes its size.
fn raw_config() -> String {
    format!(
        "blockmode = true\nnosizechecks = true\n[opsize]\nmax = 1048576\nalign = 1\n[weights]\n{COMMON_WEIGHTS}close_open = 0\ntruncate = 0\nposix_fallocate = 0\n"
    )
}

/// A file in ext4 on the drive, growing and shrinking up to 40 MiB, reopened now
/// and then, with space allocated ahead.
fn file_config() -> String {
    format!(
        "flen = 41943040\n[opsize]\nmax = 1048576\n[weights]\n{COMMON_WEIGHTS}close_open = 1\ntruncate = 2\nposix_fallocate = 2\n"
    )
}

fn ops() -> u64 {
    env_u64("BLOBDRIVE_FSX_OPS").unwrap_or(1500)
}

/// One fsx run of `ops` operations with `seed` on `file`; fails the test with
/// fsx's own account of the first wrong byte. Its artifacts (the operation log
/// and the expected image) are left in `artifacts` when it fails.
fn fsx(config: &str, file: &Path, ops: u64, seed: u64, artifacts: &Path) {
    std::fs::create_dir_all(artifacts).unwrap();
    let conf = artifacts.join("fsx.toml");
    std::fs::write(&conf, config).unwrap();
    let out = Command::new(fsx_bin())
        .arg("-f")
        .arg(&conf)
        .args(["-N", &ops.to_string(), "-S", &seed.to_string()])
        .arg("-P")
        .arg(artifacts)
        .arg(file)
        .output()
        .expect("run fsx");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("All operations completed A-OK!"),
        "fsx on {} (seed {seed}, {ops} operations; artifacts in {}) failed:\n{}",
        file.display(),
        artifacts.display(),
        head(&text, 40)
    );
}

/// The start of fsx's output: what was wrong, where, and the operations log's
/// first lines (the whole log is in the artifacts).
fn head(text: &str, lines: usize) -> String {
    text.lines().take(lines).collect::<Vec<_>>().join("\n")
}

/// Fails unless the two files hold the same bytes, naming where they part.
fn assert_same_bytes(got: &Path, want: &Path, what: &str) {
    let (g, w) = (std::fs::read(got).unwrap(), std::fs::read(want).unwrap());
    assert_eq!(g.len(), w.len(), "{what}: sizes differ");
    if g != w {
        let first = g.iter().zip(&w).position(|(a, b)| a != b).unwrap();
        let sectors = g
            .chunks(512)
            .zip(w.chunks(512))
            .filter(|(a, b)| a != b)
            .count();
        panic!("{what}: {sectors} sectors differ, the first at byte {first}");
    }
}

fn artifacts(tag: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fsx-{tag}"))
}

/// What the proxy did to the run's requests, for the test's output.
fn report(proxy: &Proxy, what: &str) {
    let mut kinds = std::collections::BTreeMap::new();
    for f in proxy.injected() {
        *kinds.entry(format!("{f:?}")).or_insert(0) += 1;
    }
    eprintln!(
        "{what}: {} requests, faults {kinds:?}, {} late commits",
        proxy.requests.load(SeqCst),
        proxy.late_commits().len()
    );
}

fn seed(default: u64) -> u64 {
    let s = env_u64("BLOBDRIVE_FSX_SEED").unwrap_or(default);
    eprintln!("fsx seed {s} (BLOBDRIVE_FSX_SEED={s} replays it)");
    s
}

#[test]
fn fsx_on_the_raw_disk_through_faults_and_late_commits_leaves_its_image_on_the_blob() {
    require_root();
    let seed = seed(3);
    let ops = ops();
    let spec = BD.new_drive("fsxraw", "64MiB");
    // Short timeouts, so that stalls and late commits cost seconds: any request
    // may be refused, cut or stalled; two Put Page calls are held past the
    // client's timeout and carried out after it sent them again.
    let proxy = Proxy::start(Config {
        rate: 0.015,
        seed,
        stall: Duration::from_secs(3),
        kinds: faultproxy::ALL_AND_LATE,
        hold: Some(Hold::put_pages(2, Duration::from_secs(5))),
        ..Config::clean(Azurite::shared().port)
    });
    let cs = proxy.connection_string();
    let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
    let mp = BD.mp_through(&cs);
    // A cache half the disk's size: fsx's writes are evicted and read back.
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
    .envs(&env)
    .ok();
    let dir = artifacts("raw");
    fsx(&raw_config(), Path::new(&mp.disk()), ops, seed, &dir);
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
    proxy.wait_for_held();
    report(&proxy, "fsx run");
    assert!(!proxy.injected().is_empty(), "no fault was injected");
    assert!(
        proxy.late_commits().len() >= 2,
        "the held Put Page calls were not carried out late"
    );
    // The same run on a local file of the disk's size is what the blob must hold.
    let reference = dir.join("reference.img");
    std::fs::File::create(&reference)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    fsx(&raw_config(), &reference, ops, seed, &dir.join("local"));
    // Read by Microsoft's SDK: a whole fixed VHD, free, holding fsx's bytes.
    let got = dir.join("blob.raw");
    let seen = sdk::read_blob(&BD.cs(), &spec, &got);
    assert_eq!(seen["blob_type"], "PageBlob", "{seen}");
    assert_eq!(seen["lease_state"], "available", "{seen}");
    assert_eq!(seen["footer_problems"], serde_json::json!([]), "{seen}");
    assert_same_bytes(&got, &reference, "the blob after unmount");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stops the proxy answering for 3 s every 10 s until dropped, the first time 1 s
/// in: fsx may be done in under 10 s on a quick machine, and the point is an
/// outage in the middle of it.
struct Outages {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u32>>,
}

impl Outages {
    fn start(proxy: &Proxy) -> Outages {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = proxy.paused.clone();
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            let mut wait = 10;
            'run: loop {
                for _ in 0..wait {
                    if s.load(SeqCst) {
                        break 'run;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                paused.store(true, SeqCst);
                n += 1;
                std::thread::sleep(Duration::from_secs(3));
                paused.store(false, SeqCst);
                wait = 70;
            }
            n
        });
        Outages {
            stop,
            thread: Some(thread),
        }
    }

    /// Ends the outages; how many there were.
    fn finish(mut self) -> u32 {
        self.stop.store(true, SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Outages {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

#[test]
fn fsx_on_a_file_in_ext4_at_default_settings_through_faults_and_outages_survives_remount() {
    require_root();
    let seed = seed(5);
    let ops = ops();
    let spec = BD.new_drive("fsxext4", "128MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", "ext4"]);
    BD.ok(&["unmount", mp.s()]);
    // The shipped retry and timeout settings: faults that answer at once, the
    // service gone for 3 s every 10 s (from 1 s in), and two Put Page calls carried out 25 s
    // late, after the client gave up on them (its timeout is 20 s) and sent them
    // again.
    let proxy = Proxy::start(Config {
        rate: 0.03,
        seed,
        kinds: faultproxy::QUICK,
        hold: Some(Hold::put_pages(2, Duration::from_secs(25))),
        ..Config::clean(Azurite::shared().port)
    });
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    BD.cmd(&["mount", &spec, mp.s(), "--cache-size", "32MiB"])
        .cs(&cs)
        .ok();
    let dir = artifacts("ext4");
    let outages = Outages::start(&proxy);
    fsx(
        &file_config(),
        &Path::new(mp.s()).join("fsx.file"),
        ops,
        seed,
        &dir,
    );
    let outages = outages.finish();
    BD.cmd(&["unmount", mp.s()]).cs(&cs).ok();
    proxy.wait_for_held();
    report(&proxy, "fsx run");
    assert!(!proxy.injected().is_empty(), "no fault was injected");
    assert!(outages > 0, "fsx ended before the first outage");
    assert_eq!(
        proxy.late_commits().len(),
        2,
        "the held Put Page calls were not carried out late"
    );
    // From the blob, on a cold mount that bypasses the proxy: the file is what
    // the same fsx run leaves in a local file.
    let local = dir.join("local");
    fsx(&file_config(), &local.join("fsx.file"), ops, seed, &local);
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--read-only"]);
    assert_same_bytes(
        &Path::new(mp.s()).join("fsx.file"),
        &local.join("fsx.file"),
        "the file after remount",
    );
    BD.ok(&["unmount", mp.s()]);
    // And the filesystem around it is whole, read by Microsoft's SDK.
    let image = dir.join("blob.raw");
    let seen = sdk::read_blob(&BD.cs(), &spec, &image);
    assert_eq!(seen["lease_state"], "available", "{seen}");
    assert_eq!(seen["footer_problems"], serde_json::json!([]), "{seen}");
    let fsck = Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck found damage: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
