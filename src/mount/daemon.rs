//! The mount daemon: sets a drive up layer by layer, serves it, and takes it down in
//! the reverse order.
//!
//! Setup order: check the drive, take the lease, learn the written ranges, start
//! the cache and FUSE, attach the loop device, mount the filesystem. Any failure
//! undoes what was done, so a failed mount leaves no FUSE mount, no loop device and
//! no lease. Teardown (unmount or SIGTERM) goes the other way and stops, keeping
//! everything that is left mounted, at the first step that cannot be done safely:
//! a busy filesystem, or dirty data that cannot be written yet.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use serde_json::json;
use tracing::{error, info, warn};

use super::record::{self, MountRecord};
use super::system;
use super::{Mode, MountError, MountRequest, Ready};
use crate::azure::{Account, BlobClient, BlobService, SegmentPlan};
use crate::blobref::BlobRef;
use crate::device::cache::{Cache, CacheConfig};
use crate::device::remote::{self, RemoteBackend};
use crate::device::sparse::SparseMap;
use crate::device::DeviceError;
use crate::drive::Drive;
use crate::fuse::{DiskFs, StatsFn};
use crate::size::human as human_bytes;

/// The daemon's counters as JSON, computed on each call.
type StatsValues = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// How often the lease is renewed: a cheap probe that notices a broken or stolen
/// lease even while nothing is written.
const LEASE_CHECK: Duration = Duration::from_secs(10);
/// Read-ahead threads: as many ranged reads in flight as the widest read-ahead
/// window holds (eight 4 MiB runs), the parallelism the ceiling is measured with.
const PREFETCH_WORKERS: usize = 8;

/// A mounted drive and everything set up for it, in setup order.
struct Mounted {
    req: MountRequest,
    rt: tokio::runtime::Runtime,
    blob: BlobClient,
    target: String,
    lease: Option<String>,
    fenced: Arc<AtomicBool>,
    cache: Option<Arc<Cache<RemoteBackend>>>,
    flusher: Option<JoinHandle<()>>,
    prefetchers: Vec<JoinHandle<()>>,
    session: Option<BackgroundSession>,
    fuse_dir: PathBuf,
    made_fuse_dir: bool,
    device: Option<String>,
    fs_mounted: bool,
    /// The counters `stats` shows, readable from any thread.
    stats: Option<StatsValues>,
    /// Handles open on the FUSE file `disk`, counted by the FUSE layer.
    open_disk: Option<Arc<AtomicUsize>>,
    record_id: String,
    record_written: bool,
}

impl Mounted {
    /// Takes everything down in reverse order and returns what could not be kept
    /// (empty: a clean unmount). Refuses, leaving everything in place (call again
    /// to retry), while the filesystem is busy or the disk file is open. Once the
    /// FUSE mount is gone nothing new can be written, and the daemon waits out any
    /// outage until every cached byte is on the blob: it stops short of that only
    /// when the lease was lost, and then says what was dropped.
    fn teardown(&mut self) -> Result<Vec<String>, MountError> {
        // From here on the cache may hold the only copy of what the filesystem
        // writes back as it unmounts: I/O waits for the service without limit.
        self.set_unbounded_waits(true);
        let result = self.take_down();
        if result.is_err() {
            self.set_unbounded_waits(false);
        }
        result
    }

    fn set_unbounded_waits(&self, on: bool) {
        if let Some(c) = &self.cache {
            c.backend().set_wait_without_limit(on);
        }
    }

    fn take_down(&mut self) -> Result<Vec<String>, MountError> {
        self.refuse_if_disk_open()?;
        if self.fs_mounted {
            system::umount(&self.req.mountpoint, false)?;
            self.fs_mounted = false;
            info!("unmounted {}", self.req.mountpoint.display());
        }
        if let Some(dev) = self.device.clone() {
            system::loop_detach(&dev)?;
            self.device = None;
            info!("detached {dev}");
        }
        // The kernel refuses to unmount FUSE while any handle on `disk` is open,
        // also one opened since the check above; after it, no write can come in.
        if let Some(s) = self.session.take() {
            if let Err(e) = system::umount(&self.fuse_dir, false) {
                self.session = Some(s);
                return Err(match e {
                    MountError::Busy(_) => self.disk_busy(),
                    other => other,
                });
            }
            match s.umount_and_join() {
                // fuser tries to unmount again, and the kernel says it is not mounted.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => warn!("stopping the FUSE session: {e}"),
                Ok(()) => {}
            }
        }
        let mut losses = Vec::new();
        if let Some(cache) = self.cache.clone() {
            if !self.req.read_only {
                losses.extend(self.write_back(&cache));
            }
            cache.close();
        }
        if let Some(f) = self.flusher.take() {
            let _ = f.join();
        }
        for p in self.prefetchers.drain(..) {
            let _ = p.join();
        }
        if let Some(id) = self.lease.take() {
            if self.fenced.load(Ordering::SeqCst) {
                warn!("the lease on {} was lost while mounted", self.target);
            } else if let Err(e) = self.rt.block_on(self.blob.release_lease(&id)) {
                error!("could not release the lease on {}: {e}", self.target);
                losses.push(format!(
                    "the lease on {t} could not be released ({e}): it is still held, so no other host can write the drive; all data is on the blob. Once nothing uses the drive, run `blobdrive lease break {t}`",
                    t = self.target
                ));
            } else {
                info!("released the lease on {}", self.target);
            }
        }
        if self.made_fuse_dir {
            let _ = std::fs::remove_dir(&self.fuse_dir);
            self.made_fuse_dir = false;
        }
        if self.record_written {
            record::remove(&self.record_id);
            self.record_written = false;
        }
        Ok(losses)
    }

    /// Refuses while a process other than the loop device holds `disk` open: its
    /// later writes would have nowhere to go.
    fn refuse_if_disk_open(&self) -> Result<(), MountError> {
        let Some(open) = &self.open_disk else {
            return Ok(());
        };
        let mine = usize::from(self.device.is_some());
        if open.load(Ordering::SeqCst) > mine {
            return Err(self.disk_busy());
        }
        Ok(())
    }

    fn disk_busy(&self) -> MountError {
        let disk = self.fuse_dir.join("disk");
        let holders = system::holders(&disk);
        MountError::Busy(if holders.is_empty() {
            format!("{} (open)", disk.display())
        } else {
            format!("{} (open by {})", disk.display(), holders.join(", "))
        })
    }

    /// Writes every cached byte, waiting out outages (the backend does not give up
    /// during unmount). Returns what was dropped if the lease was lost.
    fn write_back(&self, cache: &Cache<RemoteBackend>) -> Option<String> {
        let mut pause = Duration::from_secs(1);
        loop {
            match cache.flush() {
                Ok(()) => return None,
                Err(DeviceError::LeaseLost(e)) => {
                    let msg = format!(
                        "the lease on {} was lost, so {} written to the drive but not yet on the blob were dropped ({e})",
                        self.target,
                        human_bytes(cache.dirty_bytes())
                    );
                    error!("{msg}");
                    return Some(msg);
                }
                Err(e) => {
                    // Not an outage (those are waited out below this): keep the data
                    // and try again; a waiting `unmount` shows this error.
                    warn!(
                        "unmount cannot write {} yet: {e}; trying again in {} s",
                        human_bytes(cache.dirty_bytes()),
                        pause.as_secs()
                    );
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// A snapshot whose content is what the filesystem had at one moment: freeze it
    /// (fs mode), write every cached byte, snapshot, thaw (always, also on errors).
    fn consistent_snapshot(&mut self) -> Result<String, MountError> {
        if self.req.read_only {
            return Err(MountError::System(
                "a read-only mount is not snapshotted through its daemon".into(),
            ));
        }
        let mp = self.req.mountpoint.to_string_lossy().to_string();
        let frozen = if self.fs_mounted {
            system::run("fsfreeze", &["-f", &mp])?;
            true
        } else {
            false
        };
        let result = (|| {
            if let Some(c) = &self.cache {
                c.flush().map_err(|e| {
                    MountError::Data(format!("cannot flush before the snapshot: {e}"))
                })?;
            }
            Ok::<String, MountError>(self.rt.block_on(self.blob.create_snapshot())?)
        })();
        if frozen {
            if let Err(e) = system::run("fsfreeze", &["-u", &mp]) {
                error!("could not thaw {mp}: {e}");
            }
        }
        let id = result?;
        info!("consistent snapshot {id} of {}", self.target);
        Ok(id)
    }

    /// What a waiting `unmount` is told: what is left to write and, during an
    /// outage, how long the service has not answered and why.
    fn progress_fn(&self) -> Box<dyn Fn() -> String + Send> {
        let Some(cache) = self.cache.clone() else {
            return Box::new(|| "unmounting".to_string());
        };
        let health = cache.backend().health();
        Box::new(move || {
            let dirty = cache.dirty_bytes();
            let h = health.snapshot();
            if h.stalled >= Duration::from_secs(2) {
                format!(
                    "waiting for the storage service, which has not answered for {} s ({}); {} not yet written, kept in memory",
                    h.stalled.as_secs(),
                    h.last_error.as_deref().unwrap_or("no answer"),
                    human_bytes(dirty)
                )
            } else if dirty > 0 {
                format!("writing {} of cached data to the blob", human_bytes(dirty))
            } else {
                "unmounting".to_string()
            }
        })
    }
}

fn lease_state(had_lease: bool, fenced: &AtomicBool) -> &'static str {
    if fenced.load(Ordering::SeqCst) {
        "lost"
    } else if had_lease {
        "held"
    } else {
        "none"
    }
}

fn stats_value(
    svc: &BlobService,
    cache: Option<&Cache<RemoteBackend>>,
    lease: &str,
) -> serde_json::Value {
    let s = svc.stats();
    let c = cache.map(|c| c.snapshot()).unwrap_or_default();
    let h = cache
        .map(|c| c.backend().health().snapshot())
        .unwrap_or_default();
    json!({
        "put_page_requests": s.put_page_requests,
        "bytes_uploaded": s.bytes_uploaded,
        "get_requests": s.get_requests,
        "bytes_downloaded": s.bytes_downloaded,
        "clear_requests": s.clear_requests,
        "page_range_requests": s.page_range_requests,
        "other_requests": s.other_requests,
        "retries": s.retries,
        "failed_requests": s.failed_requests,
        "cache_hits": c.cache_hits,
        "cache_misses": c.cache_misses,
        "hole_reads": c.hole_reads,
        "dirty_bytes": c.dirty_bytes,
        "cached_bytes": c.cached_bytes,
        "cache_size": c.cache_size,
        "bytes_read": c.bytes_read,
        "bytes_written": c.bytes_written,
        "flushes": c.flushes,
        "write_waits": c.write_waits,
        "allocated_bytes": c.allocated_bytes,
        "lease_state": lease,
        "stalled_secs": h.stalled.as_secs_f64(),
        "last_error": h.last_error,
    })
}

enum Event {
    Control(String, Reply),
    Signal,
}

/// The connection a command came on. The thread that carries the command out
/// writes the answer itself before it goes on: after `unmount` the process exits
/// right away, and an answer handed to another thread could be lost with it (the
/// client would then see the connection close with no answer).
struct Reply(UnixStream);

impl Reply {
    fn send(mut self, answer: &str) {
        let _ = self.0.set_write_timeout(Some(Duration::from_secs(5)));
        let _ = writeln!(self.0, "{answer}");
    }
}

/// Runs a mount until it is unmounted. `ready` is called exactly once: with the
/// mount's description when it is usable, or with the reason it failed (after
/// everything was undone).
pub fn run(
    req: MountRequest,
    account: Account,
    ready: &mut dyn FnMut(Result<&Ready, String>),
) -> Result<(), MountError> {
    limit_malloc_arenas();
    let blob_ref = match BlobRef::parse(&req.blob) {
        Ok(b) => b,
        Err(e) => {
            ready(Err(e.to_string()));
            return Err(MountError::System(e.to_string()));
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .thread_name("blobdrive-io")
        .build()
        .map_err(|e| MountError::System(format!("cannot start the I/O runtime: {e}")))?;
    let svc = BlobService::new(blob_ref.account(&account));
    let blob = blob_ref.client(&svc);
    let id = record::id_for(&req.mountpoint);
    let (_, socket_path, log_path, run_fuse_dir) = record::paths(&id);
    let fuse_dir = match req.mode {
        Mode::Fs => run_fuse_dir,
        Mode::Block | Mode::Raw => req.mountpoint.clone(),
    };
    let mut m = Mounted {
        req: req.clone(),
        rt,
        blob: blob.clone(),
        target: blob_ref.to_string(),
        lease: None,
        fenced: Arc::new(AtomicBool::new(false)),
        cache: None,
        flusher: None,
        prefetchers: Vec::new(),
        session: None,
        fuse_dir,
        made_fuse_dir: false,
        device: None,
        fs_mounted: false,
        open_disk: None,
        stats: None,
        record_id: id.clone(),
        record_written: false,
    };
    let rec = MountRecord {
        id: id.clone(),
        endpoint: svc.account().blob_endpoint.to_string(),
        blob: blob_ref.base().to_string(),
        snapshot: blob_ref.snapshot.clone(),
        mountpoint: req.mountpoint.clone(),
        mode: req.mode,
        fuse_dir: m.fuse_dir.clone(),
        device: None,
        read_only: req.read_only,
        pid: std::process::id(),
        socket: socket_path.clone(),
        log: log_path,
    };
    let setup = setup(&mut m, rec);
    let (ready_info, listener) = match setup {
        Ok(v) => v,
        Err(e) => {
            let msg = e.to_string();
            match m.teardown() {
                Ok(losses) => losses.iter().for_each(|l| error!("{l}")),
                Err(t) => error!("cleaning up after a failed mount: {t}"),
            }
            ready(Err(msg));
            return Err(e);
        }
    };
    ready(Ok(&ready_info));
    serve(&mut m, listener)
}

/// glibc gives each thread that allocates its own arena; with FUSE, I/O and flush
/// threads all touching cache-sized buffers, freed memory would sit in many arenas
/// and the daemon's footprint would grow far past the cache size. Two arenas keep it
/// close to what is really in use.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only adjusts allocator tuning; called before threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn setup(m: &mut Mounted, mut rec: MountRecord) -> Result<(Ready, UnixListener), MountError> {
    match record::create_exclusive(&rec) {
        Ok(()) => m.record_written = true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let msg = match record::load(&rec.id) {
                Some(old) if record::alive(&old) => format!(
                    "{} is already in use by blobdrive (pid {}, {})",
                    rec.mountpoint.display(),
                    old.pid,
                    old.blob
                ),
                _ => format!(
                    "a previous mount at {} did not end cleanly; run `blobdrive unmount {}` first",
                    rec.mountpoint.display(),
                    rec.mountpoint.display()
                ),
            };
            return Err(MountError::System(msg));
        }
        Err(e) => {
            return Err(MountError::System(format!(
                "cannot write the mount record: {e}"
            )))
        }
    }
    let drive = m.rt.block_on(Drive::open(&m.blob))?;
    let size = drive.disk_size();
    if !m.req.read_only {
        let id = uuid::Uuid::new_v4().to_string();
        match m.rt.block_on(m.blob.acquire_lease(&id, None)) {
            Ok(got) => m.lease = Some(got),
            Err(e) if e.code() == Some("LeaseAlreadyPresent") => {
                return Err(MountError::System(format!(
                    "{} is in use: another mount holds its lease (on this or another host). Mount it --read-only, or if its host is dead run `blobdrive lease break {}`",
                    m.target, m.target
                )))
            }
            Err(e) => return Err(e.into()),
        }
        info!("acquired the lease on {}", m.target);
    }
    let ranges =
        m.rt.block_on(m.blob.page_ranges_segmented(size, SegmentPlan::default()))?;
    info!(
        "{}: {} bytes disk, {} written ranges",
        m.target,
        size,
        ranges.len()
    );
    let backend = RemoteBackend::new(
        m.blob.clone(),
        m.lease.clone(),
        m.rt.handle().clone(),
        remote::io_timeout_from_env(),
    );
    m.fenced = backend.fence();
    let cache = Arc::new(Cache::new(
        backend,
        size,
        SparseMap::from_ranges(&ranges),
        CacheConfig::with_capacity(m.req.cache_size),
        m.req.read_only,
        m.fenced.clone(),
    ));
    m.cache = Some(cache.clone());
    for i in 0..PREFETCH_WORKERS {
        let c = cache.clone();
        let worker = std::thread::Builder::new()
            .name(format!("blobdrive-ra{i}"))
            .spawn(move || c.run_prefetcher())
            .map_err(|e| MountError::System(format!("cannot start read-ahead: {e}")))?;
        m.prefetchers.push(worker);
    }
    if !m.req.read_only {
        let c = cache.clone();
        m.flusher = Some(
            std::thread::Builder::new()
                .name("blobdrive-flush".into())
                .spawn(move || c.run_flusher())
                .map_err(|e| MountError::System(format!("cannot start the flusher: {e}")))?,
        );
        if let Some(id) = m.lease.clone() {
            spawn_lease_keeper(m, id);
        }
    }

    // FUSE.
    if m.req.mode == Mode::Fs {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&m.fuse_dir)
            .map_err(|e| {
                MountError::System(format!("cannot create {}: {e}", m.fuse_dir.display()))
            })?;
        m.made_fuse_dir = true;
    }
    let svc = m.blob.service().clone();
    let stats_cache = cache.clone();
    let fenced = m.fenced.clone();
    let had_lease = m.lease.is_some();
    let values: StatsValues =
        Arc::new(move || stats_value(&svc, Some(&stats_cache), lease_state(had_lease, &fenced)));
    m.stats = Some(values.clone());
    let stats: StatsFn =
        Arc::new(move || serde_json::to_string_pretty(&values()).unwrap_or_default() + "\n");
    let fs = DiskFs::new(cache.clone(), stats, m.req.read_only, m.req.uid, m.req.gid);
    m.open_disk = Some(fs.open_disk_handles());
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("blobdrive:{}", m.target)),
        MountOption::Subtype("blobdrive".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        if m.req.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(4);
    config.clone_fd = true;
    m.session = Some(fuser::spawn_mount(fs, &m.fuse_dir, &config).map_err(|e| {
        MountError::System(format!(
            "cannot mount FUSE at {}: {e}",
            m.fuse_dir.display()
        ))
    })?);
    // Loop device and filesystem.
    let mut fstype = None;
    let mut formatted = false;
    if m.req.mode != Mode::Raw {
        let dev = system::loop_attach(&m.fuse_dir.join("disk"), m.req.read_only)?;
        system::loop_readahead(&dev, 4096);
        m.device = Some(dev.clone());
        rec.device = Some(dev.clone());
        info!("attached {dev}");
    }
    if m.req.mode == Mode::Fs {
        let dev = m.device.clone().expect("attached");
        let found = system::fs_type(&dev)?;
        let t = match (found, m.req.mkfs.as_deref()) {
            (Some(t), Some(wanted)) => {
                warn!("--mkfs {wanted} ignored: the disk already holds a {t} filesystem, which is mounted as it is");
                t
            }
            (Some(t), None) => t,
            (None, Some(wanted)) => {
                if m.req.read_only {
                    return Err(MountError::System("--mkfs needs a writable mount".into()));
                }
                system::mkfs(&dev, wanted)?;
                formatted = true;
                wanted.to_string()
            }
            (None, None) => {
                return Err(MountError::System(format!(
                    "{} holds no filesystem: add --mkfs ext4 (or xfs) to create one, or use --mode block or --mode raw",
                    m.target
                )))
            }
        };
        system::mount_fs(&dev, &m.req.mountpoint, &t, m.req.read_only)?;
        m.fs_mounted = true;
        fstype = Some(t);
    }
    // Control socket, then the record with everything in it.
    let _ = std::fs::remove_file(&rec.socket);
    let listener = UnixListener::bind(&rec.socket).map_err(|e| {
        MountError::System(format!("cannot listen on {}: {e}", rec.socket.display()))
    })?;
    record::save(&rec)
        .map_err(|e| MountError::System(format!("cannot write the mount record: {e}")))?;
    let ready = Ready {
        mountpoint: m.req.mountpoint.clone(),
        mode: m.req.mode,
        device: m.device.clone(),
        fstype,
        fuse_dir: m.fuse_dir.clone(),
        read_only: m.req.read_only,
        pid: std::process::id(),
        formatted,
    };
    Ok((ready, listener))
}

/// Renews the lease every [`LEASE_CHECK`]: any lease error means another party
/// broke or took it, and the drive is fenced at once.
fn spawn_lease_keeper(m: &Mounted, id: String) {
    let blob = m.blob.clone();
    let fenced = m.fenced.clone();
    let target = m.target.clone();
    m.rt.spawn(async move {
        loop {
            tokio::time::sleep(LEASE_CHECK).await;
            if fenced.load(Ordering::SeqCst) {
                return;
            }
            match blob.renew_lease(&id).await {
                Ok(()) => {}
                Err(e) if matches!(e.status(), Some(409 | 412)) => {
                    if !fenced.swap(true, Ordering::SeqCst) {
                        error!("LEASE LOST on {target}: {e}; every further write fails, reads continue");
                    }
                    return;
                }
                Err(e) => warn!("lease check on {target} failed (will retry): {e}"),
            }
        }
    });
}

fn serve(m: &mut Mounted, listener: UnixListener) -> Result<(), MountError> {
    let (tx, rx) = mpsc::channel::<Event>();
    let sig_tx = tx.clone();
    m.rt.spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
            if sig_tx.send(Event::Signal).is_err() {
                return;
            }
        }
    });
    let stats = m.stats.clone();
    std::thread::Builder::new()
        .name("blobdrive-control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                handle_conn(conn, &tx, stats.as_ref());
            }
        })
        .map_err(|e| MountError::System(format!("cannot start the control thread: {e}")))?;
    info!("serving {} at {}", m.target, m.req.mountpoint.display());
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Event::Control(cmd, reply)) => match cmd.as_str() {
                "snapshot" => {
                    let answer = match m.consistent_snapshot() {
                        Ok(id) => format!("ok {id}"),
                        Err(e) => format!("error {e}"),
                    };
                    reply.send(&answer);
                }
                "unmount" => {
                    info!("unmount requested");
                    let ticker = Ticker::start(&reply, m.progress_fn());
                    let result = m.teardown();
                    ticker.stop();
                    match result {
                        Ok(losses) if losses.is_empty() => {
                            reply.send("ok");
                            info!("unmounted cleanly");
                            return Ok(());
                        }
                        Ok(losses) => {
                            let all = losses.join("; ");
                            reply.send(&format!("failed {all}"));
                            return Err(MountError::Data(all));
                        }
                        Err(e) => {
                            warn!("unmount refused: {e}");
                            reply.send(&format!("error {e}"));
                        }
                    }
                }
                other => {
                    reply.send(&format!("error unknown command '{other}'"));
                }
            },
            Ok(Event::Signal) => {
                info!("signal received: unmounting");
                match m.teardown() {
                    Ok(losses) => return finished(losses),
                    Err(e) => error!("cannot unmount yet: {e}"),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let gone = m.session.as_ref().is_some_and(|s| s.guard.is_finished());
                if gone {
                    error!(
                        "the FUSE mount went away underneath; writing what is cached and stopping"
                    );
                    m.session = None;
                    return finished(m.teardown()?);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return finished(m.teardown()?),
        }
    }
}

/// The daemon's result once it took everything down: an error naming whatever
/// could not be kept, so its exit status tells.
fn finished(losses: Vec<String>) -> Result<(), MountError> {
    if losses.is_empty() {
        return Ok(());
    }
    for l in &losses {
        error!("{l}");
    }
    Err(MountError::Data(losses.join("; ")))
}

/// Every few seconds, tells the `unmount` that waits on `reply` what the teardown
/// is doing (writing cached data, waiting for the service), on lines of their own
/// before the answer.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How often a waiting `unmount` hears from the daemon.
const TICK: Duration = Duration::from_secs(3);

impl Ticker {
    fn start(reply: &Reply, status: Box<dyn Fn() -> String + Send>) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = reply.0.try_clone().ok().and_then(|mut conn| {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("blobdrive-progress".into())
                .spawn(move || {
                    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
                    let mut waited = Duration::ZERO;
                    while !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(100));
                        waited += Duration::from_millis(100);
                        if waited >= TICK {
                            waited = Duration::ZERO;
                            let line = status();
                            info!("unmount: {line}");
                            if writeln!(conn, "progress {line}").is_err() {
                                // The client went away; the teardown goes on.
                                return;
                            }
                        }
                    }
                })
                .ok()
        });
        Ticker { stop, thread }
    }

    /// Stops the ticker; no progress line follows once this returns.
    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one command line and answers it: `stats` here and now (also while the
/// main thread is busy taking the drive down), the rest by handing it, with its
/// connection, to the main thread.
fn handle_conn(conn: UnixStream, tx: &mpsc::Sender<Event>, stats: Option<&StatsValues>) {
    // A client that never sends its line must not hold up the commands after it.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let cmd = line.trim();
    if let ("stats", Some(values)) = (cmd, stats) {
        return Reply(conn).send(&values().to_string());
    }
    let _ = tx.send(Event::Control(cmd.to_string(), Reply(conn)));
}

/// Sends one command to a running daemon and returns its one-line answer.
pub fn control(
    socket: &std::path::Path,
    cmd: &str,
    timeout: Option<Duration>,
) -> std::io::Result<String> {
    control_with_progress(socket, cmd, timeout, &mut |_| {})
}

/// Like [`control`], handing every `progress` line that comes before the answer
/// to `on_progress` (an `unmount` waiting out an outage hears why it waits).
pub fn control_with_progress(
    socket: &std::path::Path,
    cmd: &str,
    timeout: Option<Duration>,
    on_progress: &mut dyn FnMut(&str),
) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(timeout)?;
    writeln!(s, "{cmd}")?;
    let mut reader = BufReader::new(s);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection without answering",
            ));
        }
        let line = line.trim_end();
        match line.strip_prefix("progress ") {
            Some(p) => on_progress(p),
            None => return Ok(line.to_string()),
        }
    }
}
