//! The root part after the fork: it answers the worker's requests, passes
//! SIGTERM and SIGINT on to it, and once the worker is gone (done, or dead)
//! takes down what is left of the root part's own work and keeps the mount's
//! record true.

use std::io::BufReader;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use tracing::{error, info, warn};

use super::channel::{answer_one, Answer, Ops, Request};
use crate::azure::auth::entra::workload_identity::read_token_file;
use crate::mount::notify::Notifier;
use crate::mount::record::{self, MountRecord};
use crate::mount::system::filesystem::{self, Prepared, Small};
use crate::mount::system::{self, LoopDevice};
use crate::mount::{utab, Mode, MountError, MountRequest, Ready};

/// What the root part did and still answers for.
pub(super) struct RootPart {
    pub req: MountRequest,
    pub record_id: String,
    /// The mount's record as claimed (saved again when it names a device).
    rec: MountRecord,
    /// Where FUSE is mounted (the user's directory in modes raw and block).
    pub fuse_dir: PathBuf,
    /// The record is this mount's (created exclusively) and not yet released.
    pub record_claimed: bool,
    /// FUSE is mounted at `fuse_dir` by this root part.
    pub fuse_mounted: bool,
    /// libmount's entry for the mountpoint was added.
    pub utab: bool,
    /// The loop device this root part attached over `disk` (block mode), with
    /// its backing file as sysfs named it then: while sysfs still says so, the
    /// device is this mount's.
    loop_dev: Option<(LoopDevice, Option<PathBuf>)>,
    /// The FUSE directory was made by this root part (fs mode: in the run
    /// directory), to be removed at the end.
    pub made_dir: bool,
    /// The filesystem on the loop device as `PrepareFs` found (or made) it.
    fs: Option<Prepared>,
    /// That filesystem is mounted at the mount's directory by this root part.
    fs_mounted: bool,
    /// The filesystem frozen for a snapshot (the descriptor it is thawed on).
    frozen: Option<std::fs::File>,
    /// The mount table, read again only when it changed.
    mount_table: MountTable,
    pub notifier: Option<Notifier>,
    /// The worker's word on the mount, for `blobdrive mount`, not yet passed on.
    said: Option<Result<Ready, String>>,
    /// The worker's word was passed on (it may say it once).
    has_said: bool,
    /// What the worker's `Finished` left as lost.
    losses: Vec<String>,
    /// Why the mount failed, as the worker said it.
    failed: Option<String>,
}

impl RootPart {
    pub fn new(req: MountRequest, rec: MountRecord) -> RootPart {
        RootPart {
            req,
            record_id: rec.id.clone(),
            fuse_dir: rec.fuse_dir.clone(),
            rec,
            record_claimed: false,
            fuse_mounted: false,
            utab: false,
            loop_dev: None,
            made_dir: false,
            fs: None,
            fs_mounted: false,
            frozen: None,
            mount_table: MountTable::default(),
            notifier: Notifier::from_env(),
            said: None,
            has_said: false,
            losses: Vec::new(),
            failed: None,
        }
    }

    /// Undoes what the root part did that is still in place: the loop device
    /// detached, FUSE unmounted (lazily when busy: whatever holds it sees the
    /// drive gone), the utab entry, the record (with `lost`, if any, left for
    /// `blobdrive unmount`).
    pub fn undo(&mut self, lost: Option<String>) {
        self.thaw_if_frozen();
        if self.fs_mounted && self.attached_loop().is_some() {
            self.take_fs_down();
        }
        if let Err(e) = self.detach_loop() {
            error!("{e}");
        }
        if self.fuse_mounted {
            match system::umount(&self.fuse_dir, false) {
                Ok(()) => {}
                Err(e) => {
                    warn!("{e}: detaching it lazily");
                    if let Err(e) = system::umount(&self.fuse_dir, true) {
                        error!("cannot detach {}: {e}", self.fuse_dir.display());
                    }
                }
            }
            self.fuse_mounted = false;
        }
        if std::mem::take(&mut self.made_dir) {
            let _ = std::fs::remove_dir(&self.fuse_dir);
        }
        self.forget_utab();
        if self.record_claimed {
            if let Some(lost) = lost {
                if let Err(e) = record::write_outcome(&self.record_id, &lost) {
                    warn!("could not leave a note of what was lost for `blobdrive unmount`: {e}");
                }
            }
            record::remove(&self.record_id);
            self.record_claimed = false;
        }
    }

    /// Attaches a loop device over `disk` as `setup::attach_loop` does for a
    /// daemon of one process (read-ahead, direct I/O, a writeback limit when
    /// writable), and names it in the record.
    fn attach_loop(&mut self) -> Result<LoopDevice, MountError> {
        if self.loop_dev.is_some() {
            return Err(MountError::system("a loop device is attached already"));
        }
        let dev = LoopDevice::attach_for_network(&self.fuse_dir.join("disk"), self.req.read_only)?;
        self.loop_dev = Some((dev.clone(), dev.backing_file()));
        self.rec.device = Some(dev.path().to_string());
        if let Err(e) = record::save(&self.rec) {
            warn!("could not name {dev} in the mount's record: {e}");
        }
        Ok(dev)
    }

    /// The loop device, while it is still attached over `disk`; one that let go
    /// (autoclear) is forgotten, its writeback settings put back.
    fn attached_loop(&mut self) -> Option<&LoopDevice> {
        let (dev, backing) = self.loop_dev.as_ref()?;
        if backing.is_some() && dev.backing_file() != *backing {
            info!("{dev} let go of the drive by itself");
            dev.released();
            self.loop_dev = None;
            // Autoclear: the filesystem on it was unmounted (a plain umount).
            self.fs_mounted = false;
            self.frozen = None;
            return None;
        }
        self.loop_dev.as_ref().map(|(dev, _)| dev)
    }

    /// Detaches the loop device, if it is still this mount's.
    fn detach_loop(&mut self) -> Result<(), MountError> {
        let Some(dev) = self.attached_loop().cloned() else {
            return Ok(());
        };
        dev.detach()?;
        info!("detached {dev}");
        self.loop_dev = None;
        Ok(())
    }

    fn forget_utab(&mut self) {
        if std::mem::take(&mut self.utab) {
            if let Err(e) = utab::remove(&self.req.mountpoint) {
                warn!("{e}");
            }
        }
    }

    /// Answers the worker on `conn` until it is gone, then takes down what is
    /// left. `ready` hears the mount's outcome exactly once.
    pub fn serve(
        mut self,
        worker: libc::pid_t,
        conn: UnixStream,
        signals: OwnedFd,
        log: OwnedFd,
        ready: &mut dyn FnMut(Result<&Ready, String>),
    ) -> Result<(), MountError> {
        let mut conn = Some(BufReader::new(conn));
        let mut log = Some(log);
        let log_path = record::paths(&self.record_id).2;
        let mut since_rotation = std::time::Instant::now();
        let status = loop {
            if let Some(status) = reap(worker, false) {
                break status;
            }
            let mut fds = [
                libc::pollfd {
                    fd: conn.as_ref().map_or(-1, |c| c.get_ref().as_raw_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: signals.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: log.as_ref().map_or(-1, |l| l.as_raw_fd()),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: three valid pollfd entries (a negative fd is skipped).
            // SIGCHLD wakes it when the worker ends; the timeout is only for
            // the log's rotation check.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 3, LOG_ROTATION_CHECK_MS) };
            if n < 0 {
                continue;
            }
            if fds[2].revents != 0 && !copy_log(log.as_ref()) {
                log = None;
            }
            if since_rotation.elapsed() >= LOG_ROTATION_CHECK {
                since_rotation = std::time::Instant::now();
                rotate_log(&log_path);
            }
            if fds[0].revents != 0 {
                if let Some(c) = conn.as_mut() {
                    match answer_one(c, &mut self) {
                        Ok(true) => {}
                        Ok(false) => conn = None,
                        Err(e) => {
                            error!("{e}: stopping the worker (pid {worker})");
                            // SAFETY: kill with integer arguments.
                            unsafe { libc::kill(worker, libc::SIGKILL) };
                            conn = None;
                        }
                    }
                }
                self.pass_on_word(ready);
            }
            if fds[1].revents != 0 {
                for sig in read_signals(&signals) {
                    if sig == libc::SIGTERM as u32 || sig == libc::SIGINT as u32 {
                        info!("signal {sig} received: passing it on to the worker (pid {worker})");
                        // SAFETY: kill with integer arguments.
                        unsafe { libc::kill(worker, libc::SIGTERM) };
                    }
                }
            }
            if conn.is_none() {
                // The worker closed its end: it is exiting (or was killed).
                break reap(worker, true).unwrap_or(-1);
            }
        };
        // What the worker logged last (its pipe is closed now that it is gone).
        while copy_log(log.as_ref()) {}
        self.after_worker(worker, status, ready)
    }

    /// Passes the worker's word on the mount to `blobdrive mount`, once.
    fn pass_on_word(&mut self, ready: &mut dyn FnMut(Result<&Ready, String>)) {
        if let Some(word) = self.said.take() {
            self.has_said = true;
            match word {
                Ok(r) => ready(Ok(&r)),
                Err(msg) => {
                    self.failed = Some(msg.clone());
                    ready(Err(msg))
                }
            }
        }
    }

    /// The worker is gone (`status` as `waitpid` gave it): what it left is
    /// taken down, and the record says what happened.
    fn after_worker(
        mut self,
        worker: libc::pid_t,
        status: libc::c_int,
        ready: &mut dyn FnMut(Result<&Ready, String>),
    ) -> Result<(), MountError> {
        let how = describe(status);
        let clean = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        if !self.has_said {
            self.has_said = true;
            let msg = format!(
                "the network-facing part of the mount (pid {worker}) {how} before the drive was ready; see {}",
                record::paths(&self.record_id).2.display()
            );
            ready(Err(msg.clone()));
            self.undo(None);
            return Err(MountError::system(msg));
        }
        let lost = if self.record_claimed {
            // It never said the drive was down: whatever it held is gone.
            let msg = format!(
                "the network-facing part of the mount (pid {worker}) {how} while the drive was mounted: what was written to it but not yet on the blob is lost, and its lease may still be held (`blobdrive lease break` frees it)"
            );
            error!("{msg}");
            if let Some(n) = &self.notifier {
                n.status(&msg);
            }
            Some(msg)
        } else {
            None
        };
        self.undo(lost.clone());
        if let Some(why) = self.failed.take() {
            return Err(MountError::system(why));
        }
        if let Some(lost) = lost {
            return Err(MountError::Data(lost));
        }
        if !self.losses.is_empty() {
            return Err(MountError::Data(self.losses.join("; ")));
        }
        if !clean {
            return Err(MountError::system(format!(
                "the network-facing part of the mount (pid {worker}) {how}"
            )));
        }
        Ok(())
    }
}

impl Ops for RootPart {
    fn carry_out(&mut self, req: Request) -> Answer {
        match plain_words(req) {
            Request::Ready {
                status,
                warnings,
                notes,
                auth,
            } => self.said_ready(status, warnings, notes, auth),
            Request::Failed { message } => {
                if self.has_said || self.said.is_some() {
                    return Answer::Refused("the mount's outcome was said already".into());
                }
                if let Some(n) = &self.notifier {
                    n.status(&format!("mount failed: {message}"));
                }
                self.said = Some(Err(message));
                Answer::Done
            }
            Request::Status { line } => {
                if let Some(n) = &self.notifier {
                    n.status(&line);
                }
                Answer::Done
            }
            Request::Stopping { line } => {
                if let Some(n) = &self.notifier {
                    n.stopping(&line);
                }
                Answer::Done
            }
            Request::UmountFuse { lazy } => {
                if !self.fuse_mounted {
                    return Answer::Done;
                }
                match system::umount(&self.fuse_dir, lazy) {
                    Ok(()) => {
                        self.fuse_mounted = false;
                        Answer::Done
                    }
                    Err(MountError::Busy(what)) => Answer::Busy(what),
                    Err(e) => Answer::Failed(e.to_string()),
                }
            }
            Request::Holders {} => {
                if !self.fuse_mounted {
                    return Answer::Lines(Vec::new());
                }
                Answer::Lines(system::holders(&self.fuse_dir.join("disk")))
            }
            Request::Finished { losses } => {
                self.forget_utab();
                if self.record_claimed {
                    if !losses.is_empty() {
                        if let Err(e) = record::write_outcome(&self.record_id, &losses.join("; ")) {
                            warn!("could not leave a note of what was lost for `blobdrive unmount`: {e}");
                        }
                    }
                    record::remove(&self.record_id);
                    self.record_claimed = false;
                }
                self.losses = losses;
                Answer::Done
            }
            Request::RemoveLog {} => {
                record::remove_log(&self.record_id);
                Answer::Done
            }
            loop_req @ (Request::AttachLoop {}
            | Request::LoopAttached {}
            | Request::LoopCapacity {}
            | Request::DiskSize {}
            | Request::DetachLoop {}) => self.carry_out_for_loop(loop_req),
            fs_req @ (Request::PrepareFs { .. }
            | Request::MountFs { .. }
            | Request::LoopMounted {}
            | Request::UmountFs { .. }
            | Request::Freeze {}
            | Request::Thaw {}
            | Request::CanGrowMountedExt4 {}
            | Request::GrowFs {}) => self.carry_out_for_fs(fs_req),
            Request::FederatedToken {} => {
                federated_token(std::env::var_os(FEDERATED_TOKEN_FILE_ENV).as_deref())
            }
        }
    }
}

impl RootPart {
    /// The worker's `Ready`: libmount's entry added, the record told how the
    /// worker signed in, and the mount's description kept for `blobdrive
    /// mount` and the service manager.
    fn said_ready(
        &mut self,
        status: String,
        warnings: Vec<String>,
        notes: Vec<String>,
        auth: Option<String>,
    ) -> Answer {
        if self.has_said || self.said.is_some() {
            return Answer::Refused("the mount's outcome was said already".into());
        }
        if let Some(auth) = auth {
            // Shown by `list`: the worker's words, bounded and plain.
            self.rec.auth = auth
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || " ()-_.".contains(*c))
                .take(100)
                .collect();
            if let Err(e) = record::save(&self.rec) {
                warn!("could not say how the mount signed in in its record: {e}");
            }
        }
        match utab::add(&self.req.mountpoint) {
            Ok(()) => self.utab = true,
            Err(e) => warn!(
                "a plain umount of {} will not wait for the lease to be released: {e}",
                self.req.mountpoint.display()
            ),
        }
        let fs = self.fs.as_ref().filter(|_| self.fs_mounted);
        self.said = Some(Ok(Ready {
            mountpoint: self.req.mountpoint.clone(),
            mode: self.req.mode,
            device: self.loop_dev.as_ref().map(|(d, _)| d.path().to_string()),
            fstype: fs.map(|f| f.fstype.clone()),
            fuse_dir: self.fuse_dir.clone(),
            read_only: self.req.read_only,
            pid: std::process::id(),
            formatted: fs.is_some_and(|f| f.formatted),
            warnings,
            notes,
        }));
        if let Some(n) = &self.notifier {
            n.ready(&status);
        }
        Answer::Done
    }
}

impl RootPart {
    /// The requests about the loop device over `disk` (block mode) and the
    /// size of `disk`.
    fn carry_out_for_loop(&mut self, req: Request) -> Answer {
        match req {
            Request::AttachLoop {} => {
                if !self.fuse_mounted {
                    return Answer::Failed("the FUSE mount is gone".into());
                }
                match self.attach_loop() {
                    Ok(dev) => Answer::Device(dev.path().to_string()),
                    Err(e) => Answer::Failed(e.to_string()),
                }
            }
            Request::LoopAttached {} => Answer::Attached(self.attached_loop().is_some()),
            Request::LoopCapacity {} => match self.attached_loop() {
                Some(dev) => match dev.take_new_capacity() {
                    Ok(n) => Answer::Size(n),
                    Err(e) => Answer::Failed(e.to_string()),
                },
                None => Answer::Failed("no loop device is attached".into()),
            },
            Request::DiskSize {} => {
                if !self.fuse_mounted {
                    return Answer::Failed("the FUSE mount is gone".into());
                }
                let disk = self.fuse_dir.join("disk");
                match std::fs::metadata(&disk) {
                    Ok(m) => Answer::Size(m.len()),
                    Err(e) => Answer::Failed(format!("cannot stat {}: {e}", disk.display())),
                }
            }
            Request::DetachLoop {} => match self.detach_loop() {
                Ok(()) => Answer::Done,
                Err(MountError::Busy(what)) => Answer::Busy(what),
                Err(e) => Answer::Failed(e.to_string()),
            },
            other => Answer::Refused(format!("not a loop device request: {other:?}")),
        }
    }
}

impl RootPart {
    /// The requests about the filesystem on the loop device (fs mode).
    fn carry_out_for_fs(&mut self, req: Request) -> Answer {
        if self.req.mode != Mode::Fs {
            return Answer::Refused(format!("not a request of --mode {}", self.req.mode));
        }
        if let Request::CanGrowMountedExt4 {} = req {
            return Answer::Flag(system::has_capability(system::CAP_SYS_RESOURCE));
        }
        let Some(dev) = self.attached_loop().cloned() else {
            return Answer::Failed("no loop device is attached".into());
        };
        let failed = |e: MountError| match e {
            MountError::Busy(what) => Answer::Busy(what),
            e => Answer::Failed(e.to_string()),
        };
        match req {
            Request::PrepareFs { zeroed } => {
                if self.fs_mounted {
                    return Answer::Refused("the filesystem is mounted already".into());
                }
                match filesystem::prepare(&dev, &self.req, zeroed) {
                    Ok(p) => {
                        self.fs = Some(p.clone());
                        Answer::Prepared {
                            fstype: p.fstype,
                            formatted: p.formatted,
                            warnings: p.warnings,
                        }
                    }
                    Err(e) => failed(e),
                }
            }
            Request::MountFs { small } => {
                let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.clone()) else {
                    return Answer::Refused("no filesystem was prepared".into());
                };
                if self.fs_mounted {
                    return Answer::Refused("the filesystem is mounted already".into());
                }
                let small = small.map(|(bytes, disk)| Small { bytes, disk });
                match filesystem::mount(&dev, &fstype, &self.req, small) {
                    Ok(done) => {
                        self.fs_mounted = true;
                        Answer::MountedFs {
                            autoclear: done.autoclear,
                            notes: done.notes,
                            warnings: done.warnings,
                        }
                    }
                    Err(e) => failed(e),
                }
            }
            Request::LoopMounted {} => match self.mount_table.loop_mounted(&dev) {
                Some(yes) => Answer::Flag(yes),
                None => Answer::Failed(format!("cannot tell whether {dev} is mounted")),
            },
            Request::UmountFs { lazy } => {
                if !self.fs_mounted {
                    return Answer::Done;
                }
                match system::umount(&self.req.mountpoint, lazy) {
                    Ok(()) => {
                        self.fs_mounted = false;
                        Answer::Done
                    }
                    Err(e) => failed(e),
                }
            }
            Request::Freeze {} => {
                if !self.fs_mounted || self.frozen.is_some() {
                    return Answer::Refused("not a mounted filesystem that is not frozen".into());
                }
                match system::freeze(&self.req.mountpoint, &dev) {
                    Ok(f) => {
                        self.frozen = Some(f);
                        Answer::Done
                    }
                    Err(e) => failed(e),
                }
            }
            Request::Thaw {} => match self.frozen.take() {
                Some(f) => match system::thaw(&f) {
                    Ok(()) => Answer::Done,
                    Err(e) => failed(e),
                },
                None => Answer::Done,
            },
            Request::GrowFs {} => {
                let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.clone()) else {
                    return Answer::Failed("no filesystem is mounted".into());
                };
                if !self.fs_mounted {
                    return Answer::Failed("no filesystem is mounted".into());
                }
                match system::grow_fs(&dev, &fstype, &self.req.mountpoint) {
                    Ok(()) => Answer::Size(system::fs_size(&self.req.mountpoint).unwrap_or(0)),
                    Err(e) => failed(e),
                }
            }
            other => Answer::Refused(format!("not a filesystem request: {other:?}")),
        }
    }

    /// Thaws the filesystem a snapshot froze (the worker died before it asked).
    fn thaw_if_frozen(&mut self) {
        if let Some(f) = self.frozen.take() {
            match system::thaw(&f) {
                Ok(()) => info!("thawed {}", self.req.mountpoint.display()),
                Err(e) => error!("could not thaw {}: {e}", self.req.mountpoint.display()),
            }
        }
    }

    /// Unmounts the filesystem after its worker died: lazily when busy (its
    /// files are gone with the drive either way).
    fn take_fs_down(&mut self) {
        let mp = self.req.mountpoint.clone();
        if let Err(e) = system::umount(&mp, false) {
            warn!(
                "{} is busy ({e}): detaching it lazily; its files are gone with the drive",
                mp.display()
            );
            if let Err(e) = system::umount(&mp, true) {
                error!("cannot detach {}: {e}", mp.display());
                return;
            }
        }
        self.fs_mounted = false;
    }
}

/// The worker's words that go on to a terminal, the service manager or the
/// mount's record (warnings, notes, status lines, why it failed, what was
/// lost) with every control character escaped: a worker that was made to say
/// anything must not reach root's terminal with an escape sequence.
fn plain_words(req: Request) -> Request {
    use crate::azure::text::escape_controls as plain;
    let all = |v: Vec<String>| v.iter().map(|w| plain(w)).collect();
    match req {
        Request::Ready {
            status,
            warnings,
            notes,
            auth,
        } => Request::Ready {
            status: plain(&status),
            warnings: all(warnings),
            notes: all(notes),
            auth,
        },
        Request::Failed { message } => Request::Failed {
            message: plain(&message),
        },
        Request::Status { line } => Request::Status { line: plain(&line) },
        Request::Stopping { line } => Request::Stopping { line: plain(&line) },
        Request::Finished { losses } => Request::Finished {
            losses: all(losses),
        },
        other => other,
    }
}

/// How often the root part checks whether the mount's log outgrew its bound.
const LOG_ROTATION_CHECK: std::time::Duration = std::time::Duration::from_secs(60);
const LOG_ROTATION_CHECK_MS: libc::c_int = 60_000;

/// Whether the loop device is mounted, which an fs-mode worker asks every
/// second (a plain `umount` has begun once it is not): the mount table is read
/// again only when the kernel says it changed (`/proc/self/mountinfo` polls
/// with `POLLPRI` after a mount or unmount), so an idle mount costs no parse.
#[derive(Default)]
struct MountTable {
    /// Held open: its poll state tells of changes since the last poll.
    file: Option<std::fs::File>,
    /// The answer as of the last read, per loop device path.
    last: Option<(String, bool)>,
}

impl MountTable {
    fn loop_mounted(&mut self, dev: &LoopDevice) -> Option<bool> {
        let changed = match &self.file {
            Some(f) => {
                let mut p = libc::pollfd {
                    fd: f.as_raw_fd(),
                    events: libc::POLLPRI,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; a zero timeout only looks.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n != 0
            }
            None => {
                self.file = std::fs::File::open("/proc/self/mountinfo").ok();
                true
            }
        };
        if let Some((path, yes)) = &self.last {
            if !changed && path == dev.path() {
                return Some(*yes);
            }
        }
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let yes = dev.is_mounted_per(&text)?;
        self.last = Some((dev.path().to_string(), yes));
        Some(yes)
    }
}

/// Copies what the worker wrote to its stderr (one read, at most 64 KiB) to
/// the root part's, the mount's log; `false` once the worker's end is closed
/// (or there is no pipe). Copied as bytes, never parsed.
fn copy_log(log: Option<&OwnedFd>) -> bool {
    let Some(log) = log else {
        return false;
    };
    let mut buf = [0u8; 64 * 1024];
    // SAFETY: reads at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::read(log.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
    }
    use std::io::Write;
    let _ = std::io::stderr().write_all(&buf[..n as usize]);
    true
}

/// Moves the mount's log aside once it outgrew [`record::LOG_MAX_BYTES`] (see
/// `record::rotate_log`): the root part's stderr is the log, and the worker's
/// reaches it through the root part.
fn rotate_log(log: &std::path::Path) {
    match record::rotate_log(log, record::LOG_MAX_BYTES, 2) {
        Ok(true) => info!("log rotated: the older part is in {}.1", log.display()),
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!("cannot rotate the log {}: {e}", log.display()),
    }
}

/// The variable naming workload identity's federated token file.
const FEDERATED_TOKEN_FILE_ENV: &str = "AZURE_FEDERATED_TOKEN_FILE";

/// The answer to [`Request::FederatedToken`]: the text of `file` (the root
/// part's own `AZURE_FEDERATED_TOKEN_FILE`), read afresh, within the bounds of
/// `read_token_file` (so the answer fits one line of the channel). The path
/// is the platform's, through symlinks (kubelet swaps one to rotate the
/// token); the worker has no say in it.
fn federated_token(file: Option<&std::ffi::OsStr>) -> Answer {
    let Some(file) = file.filter(|f| !f.is_empty()) else {
        return Answer::Failed(format!("{FEDERATED_TOKEN_FILE_ENV} is not set"));
    };
    let path = std::path::Path::new(file);
    match read_token_file(path) {
        Ok(text) => Answer::Text(text),
        Err(e) => Answer::Failed(format!("the root part cannot read it: {e}")),
    }
}

/// The worker's status once it has exited; waits for it when `block`.
fn reap(worker: libc::pid_t, block: bool) -> Option<libc::c_int> {
    let mut status = 0;
    loop {
        let flags = if block { 0 } else { libc::WNOHANG };
        // SAFETY: waitpid writes only `status`.
        let rc = unsafe { libc::waitpid(worker, &mut status, flags) };
        if rc == worker {
            return Some(status);
        }
        if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

/// How the worker ended, in words.
fn describe(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("was killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("ended ({status})")
    }
}

/// A signalfd for `set` (blocked already); the signals each read returns.
pub(super) fn signal_fd(set: &libc::sigset_t) -> std::io::Result<OwnedFd> {
    // SAFETY: `set` is a valid signal set.
    let fd = unsafe { libc::signalfd(-1, set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn read_signals(fd: &OwnedFd) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        // SAFETY: signalfd_siginfo is plain old data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reads at most `size` bytes into `info`.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        if n as usize != size {
            return out;
        }
        out.push(info.ssi_signo);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_federated_token_is_the_named_file_s_text_or_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "eyJ.a.b\n").unwrap();
        assert_eq!(
            federated_token(Some(f.as_os_str())),
            Answer::Text("eyJ.a.b\n".into())
        );
        let unset = federated_token(None);
        assert!(
            matches!(&unset, Answer::Failed(m) if m.contains("AZURE_FEDERATED_TOKEN_FILE is not set")),
            "{unset:?}"
        );
        assert!(matches!(
            federated_token(Some(std::ffi::OsStr::new(""))),
            Answer::Failed(_)
        ));
        let missing = federated_token(Some(dir.path().join("nope").as_os_str()));
        assert!(
            matches!(&missing, Answer::Failed(m) if m.contains("No such file")),
            "{missing:?}"
        );
        // The largest file it takes, every character one that JSON escapes:
        // the answer still fits one line of the channel.
        std::fs::write(&f, "\"\\\n".repeat(16 * 1024 / 3)).unwrap();
        let answer = federated_token(Some(f.as_os_str()));
        let line = serde_json::to_vec(&answer).unwrap();
        assert!(matches!(answer, Answer::Text(_)));
        assert!(line.len() <= super::super::LINE_MAX, "{}", line.len());
    }

    #[test]
    fn the_workers_words_reach_terminals_and_the_service_manager_plain() {
        let hostile = "ok\x1b[2J\x1b]0;owned\x07\nMAINPID=1";
        let said = plain_words(Request::Ready {
            status: hostile.into(),
            warnings: vec![hostile.into()],
            notes: vec![hostile.into()],
            auth: None,
        });
        let Request::Ready {
            status,
            warnings,
            notes,
            ..
        } = said
        else {
            panic!("{said:?}")
        };
        for text in [status, warnings[0].clone(), notes[0].clone()] {
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert!(text.starts_with("ok\\u{1b}[2J"), "{text:?}");
        }
        for req in [
            Request::Failed {
                message: hostile.into(),
            },
            Request::Status {
                line: hostile.into(),
            },
            Request::Stopping {
                line: hostile.into(),
            },
            Request::Finished {
                losses: vec![hostile.into()],
            },
        ] {
            let text = match plain_words(req) {
                Request::Failed { message } => message,
                Request::Status { line } | Request::Stopping { line } => line,
                Request::Finished { losses } => losses.concat(),
                other => panic!("{other:?}"),
            };
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
    }
}
