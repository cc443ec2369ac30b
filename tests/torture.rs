//! A randomized torture test of a mounted drive, with a byte model as its oracle.
//!
//! Random writes, discards, fsyncs, reads, clean unmount and remount, SIGKILL of
//! the daemon, and backend outages, through a proxy that injects faults, late
//! commits among them (requests carried out long after the client gave up on
//! them). What must hold:
//! - reads through the mount always return the model's current bytes;
//! - after a clean unmount the blob holds exactly the model's bytes;
//! - after a SIGKILL every sector holds its value at the last fsync or a value
//!   written to it since, and nothing older ever reappears.
//!
//! Bounded by default (`BLOBDRIVE_TORTURE_OPS`, default 300 operations per run);
//! `BLOBDRIVE_TORTURE_OPS=5000` makes a soak of it. Each run prints its two seeds:
//! `BLOBDRIVE_TORTURE_SEED` replays its operations, `BLOBDRIVE_TORTURE_FAULT_SEED`
//! the proxy's draws (which fault, how much latency, request by request; the
//! threads' timing can still change which request draws what).

mod common;
mod faultproxy;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use blobdrive::azure::BlobClient;
use common::azurite::{unique_container, Azurite};
use common::bd::{isolated_cs, Harness, Via};
use common::util::{discard, env_u64, json, rt, wait_for_exit};
use faultproxy::{Config, Hold, Proxy};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const SECTOR: u64 = 512;
const SIZE: u64 = 32 << 20;

const BD: Harness = Harness::new("torture-run").account(isolated_cs);

/// The drive as the test believes it is.
struct Model {
    now: Vec<u8>,
    /// The bytes as of the last fsync or clean unmount.
    synced: Vec<u8>,
    /// Every value a sector took since then (a crash may leave any of them).
    since_sync: HashMap<u64, Vec<Vec<u8>>>,
}

impl Model {
    fn new() -> Model {
        Model {
            now: vec![0; SIZE as usize],
            synced: vec![0; SIZE as usize],
            since_sync: HashMap::new(),
        }
    }

    fn set(&mut self, offset: u64, data: &[u8]) {
        self.now[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        for s in (offset..offset + data.len() as u64).step_by(SECTOR as usize) {
            let v = self.now[s as usize..(s + SECTOR) as usize].to_vec();
            self.since_sync.entry(s).or_default().push(v);
        }
    }

    fn sync(&mut self) {
        self.synced.copy_from_slice(&self.now);
        self.since_sync.clear();
    }

    /// After a crash: every sector is what it was at the last sync or a value it
    /// took since. Adopts what the blob holds.
    fn check_crash(&mut self, blob: &[u8]) {
        for s in (0..SIZE).step_by(SECTOR as usize) {
            let got = &blob[s as usize..(s + SECTOR) as usize];
            let synced = &self.synced[s as usize..(s + SECTOR) as usize];
            let allowed = got == synced
                || self
                    .since_sync
                    .get(&s)
                    .is_some_and(|vs| vs.iter().any(|v| v == got));
            assert!(
                allowed,
                "after a crash, sector {s} holds bytes it never held since the last fsync (first bytes {:?}, synced {:?})",
                &got[..8],
                &synced[..8]
            );
        }
        self.now.copy_from_slice(blob);
        self.sync();
    }
}

struct Drive {
    spec: String,
    blob: BlobClient,
    proxy: Proxy,
    /// blobdrive through the proxy, with this run's environment.
    via: Via,
    mp: tempfile::TempDir,
    disk: Option<File>,
    /// Extra `mount` arguments (a disk cache, an encrypted drive's key file).
    mount_args: Vec<String>,
    /// An encrypted drive: its data segment's cipher, to read the blob as
    /// its plaintext.
    crypt: Option<blobdrive::encrypted::Opened>,
}

impl Drive {
    fn mp(&self) -> &str {
        self.mp.path().to_str().unwrap()
    }

    fn mount(&mut self) {
        let (spec, mp) = (self.spec.clone(), self.mp().to_string());
        self.via.ok(&[
            "mount",
            &spec,
            &mp,
            "--mode",
            "raw",
            "--cache-size",
            "32MiB",
        ]
        .into_iter()
        .chain(self.mount_args.iter().map(String::as_str))
        .collect::<Vec<_>>());
        self.disk = Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("{mp}/disk"))
                .unwrap(),
        );
    }

    fn disk(&self) -> &File {
        self.disk.as_ref().unwrap()
    }

    /// With a disk cache, right after a mount: the whole drive read back (from
    /// the disk cache where it holds it, which must be current) is the model's.
    fn read_all_with_a_disk_cache(&self, m: &Model, seed: u64) {
        if !self.mount_args.iter().any(|a| a == "--disk-cache") {
            return;
        }
        let mut got = vec![0u8; SIZE as usize];
        self.disk().read_exact_at(&mut got, 0).unwrap();
        if let Some(s) = (0..SIZE as usize)
            .step_by(SECTOR as usize)
            .find(|&s| got[s..s + SECTOR as usize] != m.now[s..s + SECTOR as usize])
        {
            panic!("seed {seed}: after a remount with a disk cache, sector {s} differs from what was written");
        }
    }

    fn unmount(&mut self) {
        self.disk = None;
        let mp = self.mp().to_string();
        self.via.ok(&["unmount", &mp]);
    }

    fn kill(&mut self) {
        let list = json(&self.via.ok(&["list", "--json"]));
        let pid = list
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountpoint"] == self.mp())
            .unwrap()["pid"]
            .as_u64()
            .unwrap() as i32;
        // SAFETY: kill(2) on the daemon's pid, read from its own mount record.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        self.disk = None;
        wait_for_exit(
            pid as u64,
            "the daemon to end on SIGKILL",
            Duration::from_secs(20),
        );
        let mp = self.mp().to_string();
        // Cleans up after the dead daemon, then fails: its lease is still held.
        let out = self.via.cmd(&["unmount", &mp]).output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "unmount after SIGKILL exited 0: {err}"
        );
        assert!(
            err.contains("cleaned up")
                || String::from_utf8_lossy(&out.stdout).contains("cleaned up"),
            "{err}"
        );
        assert!(err.contains("lease break"), "{err}");
        let spec = self.spec.clone();
        self.via.ok(&["lease", "break", &spec, "--yes"]);
        // Whatever the dead daemon left in the network lands (or not) now.
        self.proxy.wait_for_held();
    }

    /// The disk's bytes on the blob: an encrypted drive's data segment,
    /// decrypted (holes, pages of zeros, read as zeros).
    fn blob_bytes(&self) -> Vec<u8> {
        match &self.crypt {
            Some(c) => common::luks::plaintext(&self.blob, c, SIZE),
            None => rt().block_on(self.blob.read(0, SIZE)).unwrap().to_vec(),
        }
    }
}

impl Drop for Drive {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the daemon saw is what explains a failure here (the log of the
            // mount at this mountpoint, kept in the test's run directory).
            let mp = std::fs::canonicalize(self.mp()).unwrap_or_else(|_| self.mp().into());
            let id = blobdrive::mount::record::id_for(&mp);
            let log = BD.run_dir().join("mounts").join(format!("{id}.log"));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("--- last lines of the daemon's log ({}):", log.display());
            for l in &lines[lines.len().saturating_sub(80)..] {
                eprintln!("  {l}");
            }
        }
        self.disk = None;
        let mp = self.mp().to_string();
        let _ = self.via.cmd(&["unmount", &mp]).cs(&BD.cs()).output();
    }
}

/// A sector-aligned range, half the time inside a small hot region so that the
/// same sectors are written, discarded and rewritten often.
fn range(rng: &mut StdRng, most_sectors: u64) -> (u64, u64) {
    let sectors = rng.gen_range(1..=most_sectors);
    let span = if rng.gen_bool(0.5) { 1 << 20 } else { SIZE };
    let start = rng.gen_range(0..(span / SECTOR - sectors)) * SECTOR;
    (start, sectors * SECTOR)
}

/// How to replay the proxy's draws.
fn fault_seed_note(proxy: &Proxy) -> String {
    format!("BLOBDRIVE_TORTURE_FAULT_SEED={}", proxy.seed)
}

/// Runs `ops` random operations; returns how many late commits the proxy made.
fn torture(tag: &str, ops: u64, proxy: Proxy, env: Vec<(&'static str, String)>) -> usize {
    torture_with(tag, ops, proxy, env, Vec::new(), false)
}

/// [`torture`] with `mount_args` added to every mount, on an encrypted drive
/// (its disk as large as a plain one's, plus the 16 MiB header) if `encrypted`.
fn torture_with(
    tag: &str,
    ops: u64,
    proxy: Proxy,
    env: Vec<(&'static str, String)>,
    mut mount_args: Vec<String>,
    encrypted: bool,
) -> usize {
    // SAFETY: geteuid cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the torture test must run as root"
    );
    let seed = env_u64("BLOBDRIVE_TORTURE_SEED").unwrap_or_else(rand::random);
    let faults = fault_seed_note(&proxy);
    eprintln!(
        "torture {tag}: seed {seed} ({ops} operations; BLOBDRIVE_TORTURE_SEED={seed} {faults} replay it)"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let spec = format!("{}/disk.vhd", unique_container(tag));
    let keys = tempfile::tempdir().unwrap();
    let mut create = vec!["create", &spec, "--size", "32MiB", "--create-container"];
    let key = common::luks::key_file(keys.path());
    let key = key.to_str().unwrap();
    if encrypted {
        create.splice(3..4, ["48MiB", "--encrypt", "--key-file", key]);
        mount_args.extend(["--key-file".to_string(), key.to_string()]);
    }
    let mut d = Drive {
        blob: BD.blob(&spec),
        spec: spec.clone(),
        via: BD.via(
            &proxy.connection_string(),
            &env.iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        ),
        proxy,
        mp: tempfile::Builder::new()
            .prefix("blobdrive-torture.")
            .tempdir()
            .unwrap(),
        disk: None,
        mount_args,
        crypt: None,
    };
    d.via.cmd(&create).cs(&BD.cs()).ok();
    if encrypted {
        d.crypt = Some(common::luks::open_drive(&d.blob, 48 << 20));
    }
    let mut m = Model::new();
    d.mount();
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for _ in 0..ops {
        let roll = rng.gen_range(0..100);
        let op = match roll {
            0..=54 => {
                let (off, len) = range(&mut rng, 128);
                let mut data = vec![0u8; len as usize];
                rng.fill_bytes(&mut data);
                d.disk().write_all_at(&data, off).unwrap();
                m.set(off, &data);
                "write"
            }
            55..=64 => {
                let (off, len) = range(&mut rng, 256);
                discard(d.disk(), off, len);
                m.set(off, &vec![0u8; len as usize]);
                "discard"
            }
            65..=79 => {
                d.disk().sync_all().unwrap();
                m.sync();
                "fsync"
            }
            80..=91 => {
                let (off, len) = range(&mut rng, 512);
                let mut got = vec![0u8; len as usize];
                d.disk().read_exact_at(&mut got, off).unwrap();
                assert!(
                    got == m.now[off as usize..(off + len) as usize],
                    "seed {seed}: read of {len} bytes at {off} differs from what was written"
                );
                "read"
            }
            92..=94 => {
                d.unmount();
                let blob = d.blob_bytes();
                assert!(
                    blob == m.now,
                    "seed {seed}: after a clean unmount the blob differs from what was written"
                );
                m.sync();
                d.mount();
                d.read_all_with_a_disk_cache(&m, seed);
                "unmount"
            }
            95..=97 => {
                d.kill();
                let blob = d.blob_bytes();
                m.check_crash(&blob);
                d.mount();
                d.read_all_with_a_disk_cache(&m, seed);
                "sigkill"
            }
            _ => {
                // The backend stops answering for a few seconds while a write
                // and its fsync wait for it.
                let (off, len) = range(&mut rng, 64);
                let mut data = vec![0u8; len as usize];
                rng.fill_bytes(&mut data);
                d.proxy.paused.store(true, SeqCst);
                let paused = d.proxy.paused.clone();
                let resume = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs(4));
                    paused.store(false, SeqCst);
                });
                d.disk().write_all_at(&data, off).unwrap();
                d.disk().sync_all().unwrap();
                resume.join().unwrap();
                m.set(off, &data);
                m.sync();
                "outage"
            }
        };
        *counts.entry(op).or_default() += 1;
    }
    if d.mount_args.iter().any(|a| a == "--disk-cache") {
        // The disk cache was in use, and still is.
        let mp = d.mp().to_string();
        let stats = json(&d.via.ok(&["stats", &mp, "--json"]));
        let dc = &stats["disk_cache"];
        eprintln!("torture {tag}: disk cache of the last mount: {dc}");
        assert_eq!(dc["on"], true, "{dc}");
    }
    d.unmount();
    assert!(
        d.blob_bytes() == m.now,
        "seed {seed}: the final blob differs from what was written"
    );
    let late = d.proxy.late_commits();
    for l in &late {
        let line = l.head.lines().next().unwrap_or_default();
        let write = l.head.lines().find(|h| h.starts_with("x-ms-page-write"));
        eprintln!("  late: {line} {write:?} -> {:?}", l.status);
    }
    eprintln!(
        "torture {tag}: {counts:?}; {} faults injected, {} late commits ({} refused by the fence)",
        d.proxy.injected().len(),
        late.len(),
        late.iter().filter(|l| l.status == Some(412)).count()
    );
    late.len()
}

#[test]
fn random_io_with_crashes_outages_and_late_commits_matches_a_byte_model() {
    // Short timeouts, so that late commits and stalls cost seconds, not minutes.
    let proxy = Proxy::start(Config {
        rate: 0.05,
        seed: env_u64("BLOBDRIVE_TORTURE_FAULT_SEED").unwrap_or(7),
        stall: Duration::from_secs(3),
        kinds: faultproxy::ALL_AND_LATE,
        ..Config::clean(Azurite::isolated().port)
    });
    let env = vec![("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2".to_string())];
    torture(
        "torture",
        env_u64("BLOBDRIVE_TORTURE_OPS").unwrap_or(300),
        proxy,
        env,
    );
}

/// The same with a disk cache of three quarters of the drive under the memory cache:
/// after each clean remount reads come from it, after each SIGKILL it must be
/// dropped, and its evictions, stores after writes and forgetting after
/// discards and failed writes all run under the faults.
#[test]
fn random_io_with_a_disk_cache_matches_a_byte_model() {
    let proxy = Proxy::start(Config {
        rate: 0.05,
        seed: env_u64("BLOBDRIVE_TORTURE_FAULT_SEED").unwrap_or(13),
        stall: Duration::from_secs(3),
        kinds: faultproxy::ALL_AND_LATE,
        ..Config::clean(Azurite::isolated().port)
    });
    let caches = BD.run_dir().join("disk-caches");
    let _ = std::fs::remove_dir_all(&caches);
    crate::common::util::private_dir(&caches);
    let env = vec![("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2".to_string())];
    torture_with(
        "tortcache",
        env_u64("BLOBDRIVE_TORTURE_OPS").map_or(200, |n| n * 2 / 3),
        proxy,
        env,
        vec![
            "--disk-cache".into(),
            caches.to_str().unwrap().into(),
            "--disk-cache-size".into(),
            "24MiB".into(),
        ],
        false,
    );
}

/// The same on an encrypted drive (LUKS2 under the memory cache): writes of
/// partial 4096-byte sectors, discards, crashes, outages and late commits,
/// the blob's data segment decrypted against the model after every clean
/// unmount and crash.
#[test]
fn random_io_on_an_encrypted_drive_matches_a_byte_model() {
    let proxy = Proxy::start(Config {
        rate: 0.05,
        seed: env_u64("BLOBDRIVE_TORTURE_FAULT_SEED").unwrap_or(17),
        stall: Duration::from_secs(3),
        kinds: faultproxy::ALL_AND_LATE,
        ..Config::clean(Azurite::isolated().port)
    });
    let env = vec![("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2".to_string())];
    torture_with(
        "tortcrypt",
        env_u64("BLOBDRIVE_TORTURE_OPS").map_or(150, |n| n / 2),
        proxy,
        env,
        Vec::new(),
        true,
    );
}

#[test]
fn random_io_with_faults_at_default_settings_matches_a_byte_model() {
    // The shipped retry and timeout settings. Faults that need a timeout to be
    // noticed cost 20 s each here, so the drawn ones answer at once; two Put Page
    // calls are carried out late, after the client gave up on them.
    let proxy = Proxy::start(Config {
        rate: 0.03,
        seed: env_u64("BLOBDRIVE_TORTURE_FAULT_SEED").unwrap_or(11),
        kinds: faultproxy::QUICK,
        hold: Some(Hold::put_pages(2, Duration::from_secs(25))),
        ..Config::clean(Azurite::isolated().port)
    });
    let late = torture(
        "tortdefault",
        env_u64("BLOBDRIVE_TORTURE_OPS").map_or(120, |n| n / 2),
        proxy,
        Vec::new(),
    );
    assert_eq!(
        late, 2,
        "the two held Put Page calls were not carried out late"
    );
}
