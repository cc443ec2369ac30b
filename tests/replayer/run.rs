//! One workload from start to report: a new drive created and mounted through
//! the recorder at the shipped settings, the workload run with snapshots and
//! online growth among it, a clean unmount, then the replay of what was
//! recorded.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::bytes::ByteLog;
use super::check::{replay, Oracle, Settings};
use super::files::FileLog;
use super::fscheck::{Fs, Scratch};
use super::fsload::FsLoad;
use super::fsx::{self, FsxRun};
use super::image::{Blob, Pieces};
use super::model::as_carried_out;
use super::rawload::RawLoad;
use super::report::{Report, Step};
use super::snapshots::check_snapshot;
use crate::common::azurite::Azurite;
use crate::common::bd::{Harness, Via};
use crate::common::luks::{key_file, open_drive};
use crate::common::mount::{require_root, Mp};
use crate::common::util::{has_cap_sys_resource, rt};
use crate::recorder::{Config, Op, Plant, Reader, Recorder};

pub const BD: Harness = Harness::new("replay-run");

/// How the drive is mounted and what runs on it.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A filesystem (`--mode fs --mkfs`), with the fs workload.
    Fs(Fs),
    /// The raw disk file (`--mode raw`): fsx on its first quarter, the byte
    /// workload on the rest.
    Raw,
    /// The loop device (`--mode block`), with the byte workload.
    Block,
}

/// One entry of the replay's workloads.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub kind: Kind,
    pub size_mib: u64,
    /// Grown to this size while mounted, half way through.
    pub grow_to_mib: Option<u64>,
    /// Snapshots taken a third of the way and near the end.
    pub snapshots: bool,
    /// Whether the writers run (without them, only the steps above: nothing
    /// else writes or flushes).
    pub writers: bool,
    /// `mount` options besides the mode.
    pub mount_args: &'static [&'static str],
    /// Made with `create --encrypt`, mounted with its key file; its states
    /// decrypted before they are checked.
    pub encrypted: bool,
}

impl Workload {
    fn mode(&self) -> &'static str {
        match self.kind {
            Kind::Fs(_) => "fs",
            Kind::Raw => "raw",
            Kind::Block => "block",
        }
    }
}

/// The drive under test, reached through the recorder.
struct Drive<'a> {
    w: &'a Workload,
    spec: String,
    via: Via,
    mp: Mp,
    /// What `mount` printed (a block mount's loop device).
    printed: String,
    rec: &'a Recorder,
}

impl Drive<'_> {
    /// Sleeps through the workload's `secs`, taking the snapshots and growing
    /// the drive on the way; `grown` hears the new size. Says if it grew.
    fn interleave(&self, secs: u64, grown: impl Fn(u64)) -> Vec<Step> {
        let start = Instant::now();
        let mut steps = Vec::new();
        let clock = self.rec.clock();
        let mut timed = |what: String, f: &dyn Fn()| {
            let began = clock.now();
            f();
            steps.push(Step {
                what,
                began,
                ended: clock.now(),
            });
        };
        let at = |f: f64| {
            std::thread::sleep(
                (start + Duration::from_secs(secs).mul_f64(f))
                    .saturating_duration_since(Instant::now()),
            )
        };
        let snapshot = || {
            self.via.ok(&["snapshot", "create", &self.spec]);
        };
        if self.w.snapshots {
            at(0.3);
            timed("snapshot".into(), &snapshot);
        }
        if let Some(to) = self.w.grow_to_mib {
            at(0.5);
            if matches!(self.w.kind, Kind::Fs(Fs::Ext4)) && !has_cap_sys_resource() {
                eprintln!(
                    "replay {}: no CAP_SYS_RESOURCE here, so ext4 is not grown mounted",
                    self.w.name
                );
            } else {
                timed(format!("grown to {to} MiB"), &|| {
                    self.via
                        .ok(&["resize", self.mp.s(), "--size", &format!("{to}MiB")]);
                });
                grown(to << 20);
            }
        }
        if self.w.snapshots {
            at(0.8);
            timed("snapshot".into(), &snapshot);
        }
        at(1.0);
        steps
    }

    /// The fs workload: its writers, with the snapshots and growth among them.
    fn run_fs(&self, fs: Fs, s: &Settings, marker: Option<Vec<u8>>) -> (Oracle, Vec<Step>) {
        let log = Arc::new(FileLog::marking(marker.map(|m| (0, m))));
        let load = FsLoad::new(self.mp.path(), log.clone(), self.rec.clock());
        let writers: Vec<_> = (0..3u64)
            .filter(|_| self.w.writers)
            .map(|i| {
                let (load, seed) = (load.clone(), s.seed.wrapping_add(i));
                std::thread::spawn(move || match i {
                    0 => load.buffered(seed),
                    1 => load.direct(seed),
                    _ => load.trim(seed),
                })
            })
            .collect();
        let grew = self.interleave(s.secs, |_| {});
        load.stop.store(true, SeqCst);
        for w in writers {
            w.join().expect("a writer failed");
        }
        let scratch = Scratch::new(self.w.name, self.w.encrypted);
        (Oracle::Files { fs, log, scratch }, grew)
    }

    /// The byte workload (and fsx, on a raw drive).
    fn run_bytes(&self, s: &Settings, marker: Option<Vec<u8>>) -> (Oracle, Vec<Step>) {
        let path = match self.w.kind {
            Kind::Block => self.printed.trim().into(),
            _ => self.mp.path().join("disk"),
        };
        let size = self.w.size_mib << 20;
        let flen = if matches!(self.w.kind, Kind::Raw) {
            size / 4
        } else {
            0
        };
        let load = Arc::new(RawLoad {
            path: path.clone(),
            log: Arc::new(ByteLog::default()),
            clock: self.rec.clock(),
            stop: Default::default(),
            from: flen,
            limit: Arc::new(AtomicU64::new(size)),
            marker,
        });
        let writers: Vec<_> = (0..super::rawload::WRITERS)
            .map(|me| {
                let (load, seed) = (load.clone(), s.seed.wrapping_add(me));
                std::thread::spawn(move || load.writer(me, seed))
            })
            .collect();
        let fsx = (flen > 0).then(|| {
            let (clock, seed, ops) = (self.rec.clock(), s.seed, 25 * s.secs);
            let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("{}-fsx", self.w.name));
            std::thread::spawn(move || FsxRun::run(&path, flen, ops, seed, clock, &dir))
        });
        let limit = load.limit.clone();
        let grew = self.interleave(s.secs, |to| limit.store(to, SeqCst));
        let fsx = fsx.map(|t| t.join().expect("fsx failed"));
        load.stop.store(true, SeqCst);
        for w in writers {
            w.join().expect("a writer failed");
        }
        let model = load.log.model(load.limit.load(SeqCst));
        let fsx = fsx.map(|r| (r, fsx::Oracle::default()));
        (
            Oracle::Bytes {
                model,
                from: flen,
                fsx,
            },
            grew,
        )
    }
}

/// The bytes of `blob` (the drive, or a snapshot of it) as the service holds them.
fn read_blob(blob: &blobdrive::azure::BlobClient) -> Vec<u8> {
    let rt = rt();
    let len = rt.block_on(blob.properties()).unwrap().content_length;
    rt.block_on(blob.read(0, len)).unwrap().to_vec()
}

/// What a Put Page on the encrypted drive `blob` (whose disk is `disk_size`
/// bytes) writes, as plaintext: its data segment decrypted by blobdrive's own
/// library, to find a planted fault's write by its plaintext (the checks open
/// the states with cryptsetup and another AES-XTS). The header and what is not
/// whole pages of the segment are read as they are.
fn decrypting(blob: &blobdrive::azure::BlobClient, disk_size: u64) -> Reader {
    let opened = open_drive(blob, disk_size);
    Box::new(move |at, body| {
        let mut plain = body.to_vec();
        if at >= opened.data_offset && at % 512 == 0 && body.len() % 512 == 0 {
            opened
                .cipher
                .decrypt_data(at - opened.data_offset, &mut plain);
        }
        plain
    })
}

/// Creates the drive `spec` of workload `w` through the recorder (its header
/// too, for an encrypted drive: made with `create --encrypt` and a key file)
/// and mounts it; `reader` (a planted fault's, on an encrypted drive) learns
/// to decrypt its writes in between. The mountpoint and what `mount` printed.
fn create_and_mount(
    w: &Workload,
    spec: &str,
    via: &Via,
    reader: Option<&OnceLock<Reader>>,
) -> (Mp, String) {
    let key = w.encrypted.then(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-key", w.name));
        std::fs::create_dir_all(&dir).unwrap();
        key_file(&dir).to_string_lossy().into_owned()
    });
    let key_args = key.as_deref().map(|k| ["--key-file", k]);
    let size = format!("{}MiB", w.size_mib);
    let mut create = vec!["create", spec, "--size", &size];
    if let Some(k) = &key_args {
        create.push("--encrypt");
        create.extend(k);
    }
    via.ok(&create);
    if let Some(reader) = reader {
        reader.get_or_init(|| decrypting(&BD.blob(spec), w.size_mib << 20));
    }
    let mp = via.mp();
    let mut args = vec!["mount", spec, mp.s(), "--mode", w.mode()];
    if let Kind::Fs(fs) = w.kind {
        args.extend(["--mkfs", fs.name()]);
    }
    args.extend(w.mount_args.iter().copied());
    args.extend(key_args.iter().flatten());
    let printed = via.ok(&args);
    (mp, printed)
}

/// Runs workload `w` and replays it; a `plant`ed fault is made in the
/// workload's first write (a file or a write starting with its needle).
pub fn run(w: &Workload, s: &Settings, plant: Option<Plant>) -> Report {
    require_root();
    eprintln!(
        "replay {}: seed {} (BLOBDRIVE_REPLAY_SEED={} replays its choices)",
        w.name, s.seed, s.seed
    );
    let spec = format!("{}/disk.vhd", BD.new_container(w.name));
    let marker = plant.as_ref().map(|p| p.needle.clone());
    let reader = plant
        .as_ref()
        .filter(|_| w.encrypted)
        .map(|p| p.reader.clone());
    let rec = Recorder::start(Config {
        upstream_port: Azurite::shared().port,
        blob: spec.clone(),
        drop_rate: s.drop_rate,
        seed: s.seed,
        plant,
    });
    let via = BD.via(&rec.connection_string(), &[]);
    let (mp, printed) = create_and_mount(w, &spec, &via, reader.as_deref());
    let mounted = rec.now();
    let drive = Drive {
        w,
        spec: spec.clone(),
        via,
        mp,
        printed,
        rec: &rec,
    };
    let (mut oracle, steps) = match w.kind {
        Kind::Fs(fs) => drive.run_fs(fs, s, marker),
        _ => drive.run_bytes(s, marker),
    };
    drive.via.unmount(&drive.mp);
    rec.wait_until_settled();
    let end = rec.now();
    let records = rec.records();
    let mut report = Report {
        workload: w.name.to_string(),
        steps,
        ..Report::default()
    };
    report.count_requests(&records);
    let blob = BD.blob(&spec);
    let held = read_blob(&blob);
    assert!(
        Blob::build(&records, &as_carried_out(&records)).bytes.to_vec() == held,
        "the blob rebuilt from the recorded requests is not the service's: the recording missed one"
    );
    if let Oracle::Files { scratch, .. } = &oracle {
        let disk = Blob {
            bytes: Pieces::from_bytes(&held),
            resize: None,
        };
        scratch.check_decryption(&disk.into_disk().unwrap());
    }
    if let Oracle::Bytes {
        fsx: Some((run, oracle)),
        ..
    } = &mut oracle
    {
        let want = run.final_image(oracle);
        assert!(
            held[..want.len()] == *want,
            "after the unmount the blob does not hold what fsx wrote"
        );
    }
    for (i, r) in records.iter().enumerate() {
        if r.op == Op::Snapshot && r.applied() {
            let name = r.service.as_ref().and_then(|s| s.snapshot.clone());
            let snap = read_blob(&blob.at_snapshot(name.as_deref()));
            check_snapshot(&records, i, snap, &mut oracle, &mut report);
        }
    }
    replay(&records, &mut oracle, s, (mounted, end), &mut report);
    // Past the test harness's capture: the figures are the run's result.
    let _ = writeln!(std::io::stderr(), "{report}");
    report
}
