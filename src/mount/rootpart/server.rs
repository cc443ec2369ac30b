//! The root part after the fork: it answers the worker's requests (handing
//! each to the file for its kind), passes SIGTERM and SIGINT on to it, and
//! once the worker is gone (done, or dead) takes down what is left of the root
//! part's own work and keeps the mount's record true.

use std::io::BufReader;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use tracing::{error, warn};

use super::channel::{answer_one, Answer, Ops, Request};
use super::guards::{undone, Guard};
use super::log::{quoted, WorkerLog, QUOTE_MAX};
use super::outcome::plain_words;
use super::token::{federated_token, FEDERATED_TOKEN_FILE_ENV};
use super::watch::Watch;
use super::RootPart;
use crate::mount::record;
use crate::mount::system::Now;
use crate::mount::{MountError, Ready};

impl RootPart {
    /// Undoes what the root part did that is still in place (see
    /// `guards.rs`): the filesystem thawed and unmounted, the loop device
    /// detached, FUSE unmounted (lazily when busy: whatever holds it sees the
    /// drive gone), the FUSE directory removed, then libmount's entry and the
    /// record (with `lost`, if any, left for `blobdrive unmount`), but those
    /// two only once the kernel shows nothing of the mount still mounted: a
    /// mount the root part could not take down stays listed, for `blobdrive
    /// list` and `blobdrive unmount`.
    pub(super) fn undo(&mut self, lost: Option<String>) {
        // A frozen filesystem first: every writer to it waits.
        self.held.frozen = None;
        // The filesystem is unmounted only while the loop device under it is
        // still this mount's: whatever is at the mountpoint otherwise is not
        // this mount's filesystem.
        let last_loop = self.attached_loop();
        if last_loop.is_none() {
            undone(&mut self.held.fs);
        }
        if let (Some(rec), Some(lost)) = (self.held.record.as_mut(), lost) {
            rec.note = Some(lost);
        }
        let (utab, record) = (self.held.utab.take(), self.held.record.take());
        self.held = Default::default();
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        // The device is this mount's no more once it let go (detached just
        // now, with the rest of what was held).
        let last_loop = last_loop.filter(|l| l.dev.serves_now(&l.binding) != Now::Gone);
        let left = self.mounted_per(&table, last_loop.as_ref());
        let fs_left = left.fs != Some(false);
        if table.is_empty() || left.fuse || fs_left {
            error!(
                "the drive is still mounted ({}), and the root part could not take it down: its record stays, for `blobdrive list` and `blobdrive unmount`",
                if fs_left { "its filesystem" } else { "FUSE" }
            );
            utab.map(Guard::done);
            record.map(Guard::done);
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
        let lost = if self.held.record.is_some() && self.failed.is_none() {
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
    /// Logged, quoting as much of the worker's line as the log's bound
    /// allows (see `log.rs`).
    fn refuse(&mut self, why: &str) -> Answer {
        if let Some(q) = self.watch.as_mut().and_then(|w| w.log.quote(why)) {
            warn!("the worker sent a request the root part does not take: {q}");
        }
        Answer::Refused(format!(
            "not a request the root part takes ({})",
            quoted(why, QUOTE_MAX)
        ))
    }

    fn carry_out(&mut self, req: Request) -> Answer {
        let req = plain_words(req);
        // Asked again after `Pending`: the errand's answer, or more waiting.
        if let Some(answer) = self.resumed(&req) {
            return answer;
        }
        match req {
            Request::Ready { .. }
            | Request::Failed { .. }
            | Request::Status { .. }
            | Request::Stopping { .. }
            | Request::Finished { .. }
            | Request::RemoveLog {} => self.carry_out_for_outcome(req),
            Request::FederatedToken {} => {
                federated_token(std::env::var_os(FEDERATED_TOKEN_FILE_ENV).as_deref())
            }
            Request::UmountFuse { .. } | Request::Holders {} | Request::DiskSize {} => {
                self.carry_out_for_fuse(req)
            }
            Request::AttachLoop { .. }
            | Request::LoopAttached {}
            | Request::LoopCapacity {}
            | Request::DetachLoop {} => self.carry_out_for_loop(req),
            Request::PrepareFs { .. }
            | Request::MountFs { .. }
            | Request::LoopMounted {}
            | Request::UmountFs { .. }
            | Request::Freeze {}
            | Request::Thaw {}
            | Request::CanGrowMountedExt4 {}
            | Request::GrowFs {} => self.carry_out_for_fs(req),
        }
    }
}

/// How long one line of the channel may take to arrive whole (once its first
/// byte did) or to be taken.
const LINE_TIME: Duration = Duration::from_secs(5);

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
