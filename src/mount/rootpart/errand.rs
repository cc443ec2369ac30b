//! Root-side calls that touch the worker's files, each on a thread of its own.
//!
//! A stat of the FUSE file `disk`, a loop device's attach or detach, a
//! filesystem's mount, unmount, freeze or growth: each waits, in the kernel,
//! for the worker to answer FUSE requests, and a worker that does not answer
//! (stopped, wedged, or made to) would hold the root part there, deaf to
//! SIGTERM and to everything else. So the root part's own thread never makes
//! such a call: an [`Errand`] does, on a thread, while the root part waits for
//! it at most [`CALL_LIMIT`], passing signals on and copying the worker's log
//! meanwhile. An errand still under way then is answered
//! [`Answer::Pending`](super::Answer::Pending), and the worker asks again (an
//! unmount waiting out an outage legitimately takes as long as the outage):
//! each call is bounded, the work goes on. One errand at a time; its result is
//! applied to the root part's account when it ends, whether or not anyone
//! still waits for it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::time::Duration;

use super::channel::{Answer, Request};
use super::RootPart;
use crate::mount::MountError;

/// The longest the root part waits for an errand before it answers the
/// request [`Answer::Pending`] and goes on with its other duties.
pub(super) const CALL_LIMIT: Duration = Duration::from_secs(5);

/// What an errand's thread hands back: applied by the root part's own thread
/// to its account of what is in place, giving the answer.
pub(super) type Finish = Box<dyn FnOnce(&mut RootPart) -> Answer + Send>;

/// The finish of an errand that changes nothing in the root part's account.
pub(super) fn answer_only(answer: Answer) -> Finish {
    Box::new(move |_: &mut RootPart| answer)
}

/// A failure as the worker hears it: busy stays busy.
pub(super) fn failed(e: MountError) -> Answer {
    match e {
        MountError::Busy(what) => Answer::Busy(what),
        e => Answer::Failed(e.to_string()),
    }
}

/// A call under way on a thread of its own.
pub(super) struct Errand {
    /// The worker's request it carries out (asking it again waits for this
    /// one); `None` for the root part's own (a thaw it owed).
    pub asked: Option<Request>,
    /// Readable once the errand is done.
    wake: OwnedFd,
    done: mpsc::Receiver<Finish>,
}

impl Errand {
    /// Starts `work` on a thread of its own.
    pub fn start(
        asked: Option<Request>,
        work: impl FnOnce() -> Finish + Send + 'static,
    ) -> std::io::Result<Errand> {
        let (wake, ring) = pipe()?;
        let (tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("blobdrive-root-call".into())
            .spawn(move || {
                let _ = tx.send(work());
                // SAFETY: writes one byte from a valid buffer to our pipe.
                unsafe { libc::write(ring.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            })?;
        Ok(Errand { asked, wake, done })
    }

    /// What to poll to learn that it is done.
    pub fn fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Its result, once it is done.
    pub fn finished(&self) -> Option<Finish> {
        self.done.try_recv().ok()
    }

    /// What it carries out, for messages.
    pub fn what(&self) -> String {
        match &self.asked {
            Some(req) => request_name(req),
            None => "thaw".to_string(),
        }
    }
}

/// The name a request goes by on the channel (`disk_size`, `umount_fs`).
pub(super) fn request_name(req: &Request) -> String {
    serde_json::to_value(req)
        .ok()
        .and_then(|v| v["op"].as_str().map(str::to_string))
        .unwrap_or_else(|| "a request".to_string())
}

/// A pipe (read end, write end), both ends closed on exec, the read end not
/// blocking.
pub(super) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let flags = libc::fcntl(r.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(r.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((r, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_errand_wakes_its_waiter_once_done_and_names_its_request() {
        let (go, gate) = mpsc::channel::<()>();
        let e = Errand::start(Some(Request::DiskSize {}), move || {
            let _ = gate.recv();
            Box::new(|_: &mut RootPart| Answer::Size(7)) as Finish
        })
        .unwrap();
        assert_eq!(e.what(), "disk_size");
        assert!(e.finished().is_none(), "not done before it was let go");
        go.send(()).unwrap();
        let mut p = libc::pollfd {
            fd: e.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 10_000) }, 1);
        assert!(e.finished().is_some());
    }
}
