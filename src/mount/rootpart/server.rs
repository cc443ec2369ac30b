//! The root part after the fork: it answers the worker's requests, passes
//! SIGTERM and SIGINT on to it, and once the worker is gone (done, or dead)
//! takes down what is left of the root part's own work and keeps the mount's
//! record true.

use std::io::BufReader;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::channel::{answer_one, Answer, Ops, Request};
use super::errand::Errand;
use super::log::WorkerLog;
use super::watch::Watch;
use crate::azure::auth::entra::workload_identity::read_token_file;
use crate::mount::notify::Notifier;
use crate::mount::record::{self, MountRecord};
use crate::mount::system::filesystem::Prepared;
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
    /// The FUSE mount's device (`0:N` in /proc/self/mountinfo), as the kernel
    /// named it right after mounting: how the root part tells its own FUSE
    /// mount is still there.
    pub fuse_id: Option<String>,
    /// The loop device this root part attached over `disk` (block mode), with
    /// its backing file as sysfs named it then: while sysfs still says so, the
    /// device is this mount's.
    pub(super) loop_dev: Option<(LoopDevice, Option<PathBuf>)>,
    /// The FUSE directory was made by this root part (fs mode: in the run
    /// directory), to be removed at the end.
    pub made_dir: bool,
    /// The filesystem on the loop device as `PrepareFs` found (or made) it.
    pub(super) fs: Option<Prepared>,
    /// That filesystem is mounted at the mount's directory by this root part.
    pub(super) fs_mounted: bool,
    /// The filesystem frozen for a snapshot (the descriptor it is thawed on).
    pub(super) frozen: Option<std::fs::File>,
    /// When a filesystem frozen and not thawed is thawed by the root part.
    pub(super) thaw_by: Option<Instant>,
    /// The mount table, read again only when it changed.
    pub(super) mount_table: MountTable,
    /// The worker, the root part's signals and the worker's log, once served.
    pub(super) watch: Option<Watch>,
    /// The call under way on a thread of its own (see `errand.rs`).
    pub(super) errand: Option<Errand>,
    /// The answer of an errand that ended after its request was answered
    /// `Pending`, for the worker's asking again.
    pub(super) kept: Option<(Request, Answer)>,
    /// The worker asked for the log to be removed (after a clean unmount):
    /// done as the root part ends, when nothing writes to it any more.
    remove_log: bool,
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
            fuse_id: None,
            loop_dev: None,
            made_dir: false,
            fs: None,
            fs_mounted: false,
            frozen: None,
            thaw_by: None,
            mount_table: MountTable::default(),
            watch: None,
            errand: None,
            kept: None,
            remove_log: false,
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

    /// Takes on `dev`, attached over `disk` (see `drive.rs`), and names it in
    /// the record.
    pub(super) fn adopt_loop(&mut self, dev: &LoopDevice) {
        self.loop_dev = Some((dev.clone(), dev.backing_file()));
        self.rec.device = Some(dev.path().to_string());
        if let Err(e) = record::save(&self.rec) {
            warn!("could not name {dev} in the mount's record: {e}");
        }
    }

    /// The loop device, while it is still attached over `disk`; one that let go
    /// (autoclear) is forgotten, its writeback settings put back.
    pub(super) fn attached_loop(&mut self) -> Option<&LoopDevice> {
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
    /// left. `ready` hears the mount's outcome exactly once. The loop never
    /// waits on the worker's files (see `errand.rs`), so SIGTERM is passed on
    /// and the log copied whatever the worker does.
    pub fn serve(
        mut self,
        worker: libc::pid_t,
        conn: UnixStream,
        signals: OwnedFd,
        log: OwnedFd,
        ready: &mut dyn FnMut(Result<&Ready, String>),
    ) -> Result<(), MountError> {
        // A request must arrive whole, and its answer be taken, within
        // LINE_TIME: half a line must not hold the root part.
        let _ = conn.set_read_timeout(Some(LINE_TIME));
        let _ = conn.set_write_timeout(Some(LINE_TIME));
        let mut conn = Some(BufReader::new(conn));
        let log_path = record::paths(&self.record_id).2;
        self.watch = Some(Watch {
            worker,
            signals,
            log: WorkerLog::new(log, log_path),
        });
        let status = loop {
            if let Some(status) = reap(worker, false) {
                break status;
            }
            let conn_fd = conn.as_ref().map(|c| c.get_ref().as_raw_fd());
            let errand_fd = self.errand.as_ref().map(|e| e.fd());
            let wait = self.next_duty_in();
            let readable = self.wait_watching(&[conn_fd, errand_fd], wait);
            if readable[1] {
                self.errand_done_meanwhile();
            }
            self.thaw_if_overdue();
            if readable[0] {
                if let Some(c) = conn.as_mut() {
                    match answer_one(c, &mut self) {
                        Ok(true) => {}
                        // The worker closed its end: it is exiting (or was
                        // killed); SIGCHLD says when it is gone.
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
        };
        if let Some(w) = self.watch.as_mut() {
            // What the worker logged last.
            w.log.drain();
        }
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
        // A call still under way ends now that the worker's FUSE connection is
        // gone; what it did is taken into account before the rest is undone.
        self.settle_errand();
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
        let lost = if self.record_claimed && self.failed.is_none() {
            // It never said the drive was down: whatever it held is gone. (A
            // mount that failed never served: nothing was lost.)
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
        if self.remove_log {
            // Nothing writes to it after this: the root part ends.
            record::remove_log(&self.record_id);
        }
        Ok(())
    }
}

impl Ops for RootPart {
    fn carry_out(&mut self, req: Request) -> Answer {
        let req = plain_words(req);
        // Asked again after `Pending`: the errand's answer, or more waiting.
        if let Some(answer) = self.resumed(&req) {
            return answer;
        }
        match req {
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
            Request::Holders {} => {
                if !self.fuse_mounted {
                    return Answer::Lines(Vec::new());
                }
                Answer::Lines(system::holders(&self.fuse_dir.join("disk")))
            }
            Request::Finished { losses } => self.finished(losses),
            Request::RemoveLog {} => match self.still_mounted() {
                Some(what) => {
                    Answer::Refused(format!("the mount's log stays while {what} is mounted"))
                }
                None => {
                    self.remove_log = true;
                    Answer::Done
                }
            },
            Request::FederatedToken {} => {
                federated_token(std::env::var_os(FEDERATED_TOKEN_FILE_ENV).as_deref())
            }
            drive_req => self.carry_out_on_drive(drive_req),
        }
    }
}

impl RootPart {
    /// The worker's `Finished`: the drive is down, so the record (with
    /// `losses` left for `blobdrive unmount`) and libmount's entry go. The
    /// kernel, not the worker, says whether it is: while the root part's own
    /// FUSE mount or the filesystem on its loop device is still mounted, the
    /// request is refused and the record stays, so a worker cannot make a
    /// mount vanish from `blobdrive list` and `unmount`.
    fn finished(&mut self, losses: Vec<String>) -> Answer {
        if let Some(what) = self.still_mounted() {
            warn!(
                "the worker said the drive is down, but {what} is still mounted: the record stays"
            );
            return Answer::Refused(format!("the drive is not down: {what} is still mounted"));
        }
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

    /// What of this mount the kernel still has mounted, in words: the root
    /// part's FUSE mount (known by its device and its place), the filesystem
    /// on its loop device (while the device is still this mount's). `None` when neither is. An unreadable mount table counts as
    /// mounted.
    pub(super) fn still_mounted(&mut self) -> Option<String> {
        let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return Some("(the mount table cannot be read, so maybe) the drive".into());
        };
        let fuse = match &self.fuse_id {
            Some(id) => system::mounted_with_id(&table, id, "fuse.blobdrive", &self.fuse_dir),
            None => self.fuse_mounted,
        };
        if fuse {
            return Some(format!("FUSE at {}", self.fuse_dir.display()));
        }
        let dev = self.attached_loop().cloned()?;
        (dev.is_mounted_per(&table) != Some(false)).then(|| format!("the filesystem on {dev}"))
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
        // The mount at the mountpoint is the root part's own, known by its
        // device: a stat of the mountpoint would wait on the worker's FUSE.
        let devno = match self.req.mode {
            Mode::Fs => self.loop_dev.as_ref().and_then(|(d, _)| d.devno()),
            Mode::Block | Mode::Raw => self.fuse_id.clone(),
        };
        let added = devno
            .ok_or_else(|| "its device is not known".to_string())
            .and_then(|d| utab::add(&self.req.mountpoint, &d));
        match added {
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

/// How long one line of the channel may take to arrive whole (once its first
/// byte did) or to be taken.
const LINE_TIME: Duration = Duration::from_secs(5);

/// Whether the loop device is mounted, which an fs-mode worker asks every
/// second (a plain `umount` has begun once it is not): the mount table is read
/// again only when the kernel says it changed (`/proc/self/mountinfo` polls
/// with `POLLPRI` after a mount or unmount), so an idle mount costs no parse.
#[derive(Default)]
pub(super) struct MountTable {
    /// Held open: its poll state tells of changes since the last poll.
    file: Option<std::fs::File>,
    /// The answer as of the last read, per loop device path.
    last: Option<(String, bool)>,
}

impl MountTable {
    pub(super) fn loop_mounted(&mut self, dev: &LoopDevice) -> Option<bool> {
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

pub(super) fn read_signals(fd: &OwnedFd) -> Vec<u32> {
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
