//! The root part before the fork: what needs root and what the worker will
//! need opened for it, then the walls built, then the fork. The child puts the
//! walls up first thing, while it is the only thread, and becomes the worker.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use tracing::{error, info, warn};

use super::channel::Request;
use super::client::RootClient;
use super::guards::{ClaimedRecord, FuseMount, Guard, MadeDir};
use super::watch::signal_fd;
use super::RootPart;
use crate::azure::Account;
use crate::blobref::BlobRef;
use crate::device::diskcache::files;
use crate::luks::secret::Secret;
use crate::mount::record::{self, MountRecord};
use crate::mount::{metrics, system, uids, Mode, MountError, MountRequest, Ready};
use crate::privsep::{Allowed, Walls, WorkerUser};

/// What the worker starts with: its end of the channel, and what the root part
/// opened for it.
pub struct WorkerStart {
    pub client: RootClient,
    /// The `/dev/fuse` descriptor of the FUSE mount at `fuse_dir`.
    pub fuse: OwnedFd,
    pub fuse_dir: PathBuf,
    pub control: UnixListener,
    pub metrics: Option<TcpListener>,
    /// The drive's directory in the `--disk-cache` directory, the worker's.
    pub disk_cache: Option<std::fs::File>,
    /// An encrypted drive's passphrase: the worker's alone (the root part's
    /// copy is wiped as soon as the worker exists).
    pub passphrase: Option<Secret>,
}

/// Which side of the fork this is.
pub enum Split {
    /// The root part, done: the mount's result.
    Root(Result<(), MountError>),
    /// The worker, walled, to serve the drive.
    Worker(WorkerStart),
}

/// What the root part opened for the worker before the fork, and the walls.
struct Opened {
    metrics: Option<TcpListener>,
    /// The `/dev/fuse` descriptor of the FUSE mount.
    fuse: OwnedFd,
    control: UnixListener,
    disk_cache: Option<files::DriveDir>,
    walls: Walls,
}

/// The ends each side keeps of what joins them.
struct Ends {
    worker_channel: UnixStream,
    root_channel: UnixStream,
    /// Where the worker's stderr goes, and where the root part reads it.
    worker_log: OwnedFd,
    root_log: OwnedFd,
    /// The root part's signals (SIGTERM, SIGINT, SIGCHLD), and the mask to
    /// give the worker back.
    signals: OwnedFd,
    old_mask: libc::sigset_t,
}

/// Splits the daemon for `req` into a root part and a worker running as
/// `req.run_as`, or else as a uid of its own from the pool (see the module's
/// doc and `mount::uids`). Must be called while the process has one thread.
/// `ready` hears the mount's outcome once, from the root part.
pub fn split(
    req: &MountRequest,
    account: &Account,
    passphrase: Option<Secret>,
    ready: &mut dyn FnMut(Result<&Ready, String>),
) -> Split {
    let fail = |msg: String, ready: &mut dyn FnMut(Result<&Ready, String>)| {
        ready(Err(msg.clone()));
        Split::Root(Err(MountError::system(msg)))
    };
    // Before anything is done: a kernel too old is refused in one line.
    if let Err(e) = system::check_kernel() {
        return fail(e.to_string(), ready);
    }
    // Held by the root part until the mount is down; a child's copy gives
    // nothing back (see `uids::Claim`).
    let (user, uid_claim) = match uids::worker_for(req.run_as.as_deref()) {
        Ok(u) => u,
        Err(e) => return fail(e, ready),
    };
    let user_name = match &req.run_as {
        Some(name) => name.clone(),
        None => format!("uid {} (its own)", user.uid),
    };
    let blob_ref = match BlobRef::parse(&req.blob) {
        Ok(b) => b,
        Err(e) => return fail(e.to_string(), ready),
    };
    let account = blob_ref.account(account);
    let mut rec = record_for(req, &blob_ref, &account);
    rec.worker_uid = Some(user.uid);
    let fuse_dir = rec.fuse_dir.clone();
    let mut root = RootPart::new(req.clone(), rec.clone());
    let made = prepare(&mut root, &rec, &blob_ref, &account, user).and_then(|opened| {
        if let Some(n) = threads().filter(|&n| n != 1) {
            return Err(MountError::system(format!(
                "cannot start the worker: the daemon runs {n} threads, which it would not wall"
            )));
        }
        Ok((opened, ends()?))
    });
    let (opened, ends) = match made {
        Ok(v) => v,
        Err(e) => {
            root.undo(None);
            return fail(e.to_string(), ready);
        }
    };
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null");
    // SAFETY: getpid cannot fail.
    let root_pid = unsafe { libc::getpid() };
    // SAFETY: the process has one thread (checked above), so the child starts
    // in a consistent state.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        root.undo(None);
        return fail(format!("cannot start the worker: {e}"), ready);
    }
    if pid == 0 {
        // The root part speaks for the mount to `blobdrive mount` and to the
        // service manager; the worker has neither's ends. What it put in
        // place is the root part's to undo: the child's copy undoes nothing
        // (see `guards.rs`).
        drop(root);
        return in_the_child(opened, ends, null.ok(), fuse_dir, root_pid, passphrase);
    }
    // The worker, which opens the drive, has its own copy now; the root part
    // never needs it.
    drop(passphrase);
    let Ends {
        worker_channel,
        root_channel,
        worker_log,
        root_log,
        signals,
        old_mask: _,
    } = ends;
    // The worker holds these now. The root part's copies would keep the FUSE
    // connection alive after the worker died (and every access to it
    // hanging), and the channel and the log pipe open (so their end unseen).
    // The root part keeps a handle of the disk cache's directory, to take it
    // back from the worker's uid once the worker is gone, and holds its lock
    // until then.
    let cache_dir = opened.disk_cache.as_ref().and_then(|d| d.try_clone().ok());
    drop((opened, worker_channel, worker_log, null));
    info!("the worker (pid {pid}) serves the drive as {user_name}");
    let result = root.serve(pid, root_channel, signals, root_log, ready);
    if let Some(dir) = cache_dir {
        if let Err(e) = files::take_back(&dir.dir, user.uid) {
            warn!(
                "cannot take the disk cache's directory back from uid {}: {e}",
                user.uid
            );
        }
    }
    drop(uid_claim);
    Split::Root(result)
}

/// The mount's record as the root part claims it: no device yet, and the
/// account named, not yet signed in to (the worker says how it signed in).
fn record_for(req: &MountRequest, blob_ref: &BlobRef, account: &Account) -> MountRecord {
    let id = record::id_for(&req.mountpoint);
    let (_, socket, log, run_fuse_dir) = record::paths(&id);
    MountRecord {
        id,
        endpoint: account.endpoint_for_messages(),
        blob: blob_ref.base().to_string(),
        auth: account.credential.describe(),
        snapshot: blob_ref.snapshot.clone(),
        mountpoint: req.mountpoint.clone(),
        mode: req.mode,
        fuse_dir: match req.mode {
            Mode::Fs => run_fuse_dir,
            Mode::Block | Mode::Raw => req.mountpoint.clone(),
        },
        device: None,
        device_seq: None,
        read_only: req.read_only,
        cache_size: Some(req.cache_size),
        worker_uid: None,
        pid: std::process::id(),
        socket,
        log,
    }
}

/// The channel, the worker's log pipe, and the root part's signals: SIGTERM
/// and SIGINT are the root part's to pass on, SIGCHLD tells it the worker is
/// gone; blocked here and read from a signalfd (the worker unblocks them).
fn ends() -> Result<Ends, MountError> {
    let (worker_channel, root_channel) = UnixStream::pair()
        .map_err(|e| MountError::with_source("cannot make the worker's channel", e))?;
    // The worker's log goes through the root part, which alone may rotate the
    // mount's log file (it holds the run directory).
    let (root_log, worker_log) = super::errand::pipe()
        .map_err(|e| MountError::with_source("cannot make the worker's log pipe", e))?;
    // SAFETY: sigset_t is plain old data, filled in by sigemptyset/sigaddset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to signal sets.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old_mask);
    }
    let signals = signal_fd(&set).map_err(|e| {
        // SAFETY: puts back the mask this function changed.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
        MountError::with_source("cannot watch signals", e)
    })?;
    Ok(Ends {
        worker_channel,
        root_channel,
        worker_log,
        root_log,
        signals,
        old_mask,
    })
}

/// The child after the fork: stdout to /dev/null, stderr to the root part,
/// the signal mask as it was, then the walls up (see [`become_worker`]); a
/// child that cannot wall itself says why and exits at once.
fn in_the_child(
    opened: Opened,
    ends: Ends,
    null: Option<std::fs::File>,
    fuse_dir: PathBuf,
    root_pid: libc::pid_t,
    passphrase: Option<Secret>,
) -> Split {
    let Ends {
        worker_channel,
        root_channel,
        worker_log,
        root_log,
        signals,
        old_mask,
    } = ends;
    drop((root_channel, root_log, signals));
    if let Some(null) = &null {
        // SAFETY: both descriptors are valid; dup2 replaces stdout.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
    // SAFETY: both descriptors are valid; dup2 replaces stderr.
    unsafe { libc::dup2(worker_log.as_raw_fd(), 2) };
    drop((null, worker_log));
    // SAFETY: restores the mask the process had before the fork.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut()) };
    let Opened {
        metrics,
        fuse,
        control,
        disk_cache,
        walls,
    } = opened;
    // The directory; its lock is the root part's to hold.
    let disk_cache = disk_cache.map(|d| d.dir);
    // What the worker is handed; every other descriptor of the root part's
    // closes once the walls are up (the Landlock ruleset's with them).
    let mut kept = vec![
        worker_channel.as_raw_fd(),
        fuse.as_raw_fd(),
        control.as_raw_fd(),
    ];
    kept.extend(metrics.as_ref().map(|m| m.as_raw_fd()));
    kept.extend(disk_cache.as_ref().map(|d| d.as_raw_fd()));
    let client = RootClient::new(worker_channel);
    let walled = become_worker(walls, root_pid).and_then(|()| {
        crate::privsep::close_descriptors_but(&kept)
            .map_err(|e| format!("cannot close the root part's descriptors: {e}"))
    });
    if let Err(why) = walled {
        let message = format!("cannot wall the network-facing part of the mount: {why}");
        error!("{message}");
        client.tell(&Request::Failed { message });
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(1) };
    }
    Split::Worker(WorkerStart {
        client,
        fuse,
        fuse_dir,
        control,
        metrics,
        disk_cache,
        // Locked again: a child does not inherit its parent's memory locks.
        passphrase: passphrase.map(|p| Secret::from_slice(p.as_bytes())),
    })
}

/// What the root part does before the fork; each step held by `root` as a
/// guard (see `guards.rs`) as soon as it is in place.
fn prepare(
    root: &mut RootPart,
    rec: &MountRecord,
    blob_ref: &BlobRef,
    account: &Account,
    user: WorkerUser,
) -> Result<Opened, MountError> {
    let req = root.req.clone();
    // Bound first, so an address in use fails the mount before anything is done.
    let metrics = match req.metrics.as_deref().map(metrics::bind) {
        Some(Err(msg)) => return Err(MountError::system(msg)),
        Some(Ok(l)) => Some(l),
        None => None,
    };
    record::claim(rec)?;
    root.held.record = Some(Guard::new(ClaimedRecord {
        id: rec.id.clone(),
        note: None,
    }));
    let at = if req.mode == Mode::Fs {
        // FUSE goes on a private directory of the run directory, the
        // filesystem on the user's.
        system::make_private_dir(&root.fuse_dir)?;
        root.held.dir = Some(Guard::new(MadeDir(root.fuse_dir.clone())));
        system::open_dir(&root.fuse_dir, None)?
    } else {
        system::open_dir(&root.fuse_dir, req.mountpoint_id)?
    };
    let mounted = system::mount_fuse(&at, &format!("blobdrive:{blob_ref}"), req.read_only)
        .map_err(|e| MountError::system(format!("{e} at {}", root.fuse_dir.display())))?;
    root.held.fuse = Some(Guard::new(FuseMount {
        dir: root.fuse_dir.clone(),
        id: mounted.id,
    }));
    root.fuse_id = Some(mounted.id);
    let fuse = mounted.dev;
    let control = record::listen(rec)?;
    // The CA certificates the worker will trust, and a service principal's
    // certificate it will sign in with, read while root may.
    crate::azure::http::load_trust_store();
    crate::azure::auth::entra::assertion::read_certificate_early();
    let mut allowed = Allowed::network_client();
    // The worker's own process figures (`/proc/self`), for its metrics.
    allowed.read_only.push(PathBuf::from("/proc"));
    let disk_cache = match &req.disk_cache {
        Some(parent) => Some(open_disk_cache_for(
            parent,
            blob_ref,
            account,
            user,
            &mut allowed,
        )?),
        None => None,
    };
    let walls = Walls::prepare(user, &allowed).map_err(|e| MountError::system(e.to_string()))?;
    Ok(Opened {
        metrics,
        fuse,
        control,
        disk_cache,
        walls,
    })
}

/// The drive's own directory in the `--disk-cache` directory `parent`, locked
/// (refused while another mount holds it, naming that mount), given to the
/// worker's `user` and allowed to it (by handle) in `allowed`.
fn open_disk_cache_for(
    parent: &std::path::Path,
    blob_ref: &BlobRef,
    account: &Account,
    user: WorkerUser,
    allowed: &mut Allowed,
) -> Result<files::DriveDir, MountError> {
    let name = crate::mount::disk_cache_name(
        account,
        &blob_ref.container,
        &blob_ref.name,
        blob_ref.snapshot.as_deref(),
    );
    let left_to = |uid| uids::pool_id_state(&uids::Places::system(), u64::from(uid));
    let owner = Some((user.uid, user.gid));
    let dir = files::open_drive_dir(parent, &name, owner, &left_to, &record::lock_holder)
        .map_err(MountError::system)?;
    let handle = dir
        .dir
        .try_clone()
        .map_err(|e| MountError::with_source("cannot hand on the disk cache", e))?;
    allowed.read_write_dirs.push(handle);
    Ok(dir)
}

/// In the child: the walls up, then death with the root part arranged (the
/// uid change cleared it) and checked against a root part already gone.
fn become_worker(walls: Walls, root_pid: libc::pid_t) -> Result<(), String> {
    walls.apply().map_err(|e| e.to_string())?;
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(format!(
            "cannot arrange to stop with the root part: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: getppid cannot fail.
    if unsafe { libc::getppid() } != root_pid {
        return Err("the root part is gone".into());
    }
    Ok(())
}

/// How many threads the process runs (`/proc/self/task`).
fn threads() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(|d| d.count())
}
