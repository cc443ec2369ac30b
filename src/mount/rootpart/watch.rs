//! What the root part keeps doing whatever it waits for: passing SIGTERM and
//! SIGINT on to the worker, copying the worker's log and keeping it bounded,
//! and taking in the result of the call under way on its own thread (see
//! `errand.rs`); and the duty it owes by a time, a thaw of a filesystem frozen
//! too long.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::channel::{Answer, Request};
use super::errand::{Errand, Finish, CALL_LIMIT};
use super::guards::{undone, Guard};
use super::log::WorkerLog;
use super::RootPart;
use crate::mount::system;

/// The worker, and what the root part watches for it.
pub(super) struct Watch {
    pub worker: libc::pid_t,
    /// SIGTERM, SIGINT and SIGCHLD, blocked and read from here.
    pub signals: OwnedFd,
    pub log: WorkerLog,
}

/// How long the root part sleeps when nothing is owed sooner.
const IDLE: Duration = Duration::from_secs(60);
/// How long the root part waits, once the worker is gone, for a call still
/// under way to end (it does at once: the worker's FUSE connection is gone).
const SETTLE: Duration = Duration::from_secs(30);

impl RootPart {
    /// Waits at most `timeout` for any of `fds` to be readable, passing the
    /// root part's signals on to the worker and copying its log meanwhile;
    /// says which of `fds` are (a `None` never is). Returns early after a
    /// signal too, so that the caller looks whether the worker ended.
    pub(super) fn wait_watching(&mut self, fds: &[Option<RawFd>], timeout: Duration) -> Vec<bool> {
        let until = Instant::now() + timeout;
        loop {
            let mut polled: Vec<libc::pollfd> =
                fds.iter().map(|fd| pollfd(fd.unwrap_or(-1))).collect();
            let (signals, log) = match self.watch.as_mut() {
                Some(w) => (w.signals.as_raw_fd(), w.log.fd().unwrap_or(-1)),
                None => (-1, -1),
            };
            polled.push(pollfd(signals));
            polled.push(pollfd(log));
            let mut left = until.saturating_duration_since(Instant::now());
            if let Some(held) = self.watch.as_ref().and_then(|w| w.log.held_for()) {
                left = left.min(held + Duration::from_millis(10));
            }
            // SAFETY: valid pollfd entries (a negative fd is skipped).
            let n = unsafe {
                libc::poll(
                    polled.as_mut_ptr(),
                    polled.len() as libc::nfds_t,
                    left.as_millis().min(i32::MAX as u128) as libc::c_int,
                )
            };
            let ready = |i: usize| n > 0 && polled[i].revents != 0;
            let signalled = ready(fds.len());
            if let Some(w) = self.watch.as_mut() {
                if signalled {
                    pass_signals_on(w);
                }
                if ready(fds.len() + 1) {
                    w.log.copy();
                }
                w.log.keep_bounded();
            }
            let readable: Vec<bool> = (0..fds.len()).map(ready).collect();
            if readable.iter().any(|&r| r) || signalled || Instant::now() >= until {
                return readable;
            }
        }
    }

    /// How long the root part may sleep before a duty falls due.
    pub(super) fn next_duty_in(&self) -> Duration {
        match self.held.frozen.as_ref().and_then(|f| f.thaw_by) {
            Some(t) => {
                IDLE.min(t.saturating_duration_since(Instant::now()) + Duration::from_millis(10))
            }
            None => IDLE,
        }
    }

    /// The worker asked `req` again: the answer an errand for it left when it
    /// ended after its `Pending`, or, while it is still under way, the wait
    /// for it resumed. `None` when `req` is not such a request.
    pub(super) fn resumed(&mut self, req: &Request) -> Option<Answer> {
        if let Some((asked, answer)) = self.kept.take() {
            if &asked == req {
                return Some(answer);
            }
        }
        let same = self.errand.as_ref()?.asked.as_ref() == Some(req);
        same.then(|| self.wait_for_errand())
    }

    /// Carries `req` out with `work` on a thread of its own, waiting for it
    /// at most [`CALL_LIMIT`]; refused while another call is under way.
    pub(super) fn on_errand(
        &mut self,
        req: Request,
        work: impl FnOnce() -> Finish + Send + 'static,
    ) -> Answer {
        if let Some(e) = &self.errand {
            return Answer::Failed(format!(
                "the root part is still carrying out {}, which the drive has not let finish",
                e.what()
            ));
        }
        match Errand::start(Some(req), work) {
            Ok(e) => self.errand = Some(e),
            Err(e) => return Answer::Failed(format!("cannot start a thread for it: {e}")),
        }
        self.wait_for_errand()
    }

    /// Waits at most [`CALL_LIMIT`] for the errand under way: its answer, or
    /// `Pending`.
    fn wait_for_errand(&mut self) -> Answer {
        let until = Instant::now() + CALL_LIMIT;
        loop {
            if let Some((_, finish)) = self.errand_finished() {
                return finish(self);
            }
            let Some(e) = &self.errand else {
                return Answer::Failed("nothing is under way".into());
            };
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Answer::Pending(format!(
                    "{} has gone on for {} s",
                    e.what(),
                    CALL_LIMIT.as_secs()
                ));
            }
            let fd = e.fd();
            self.wait_watching(&[Some(fd)], left);
        }
    }

    /// The errand under way, once it is done: what it was asked, and its
    /// result to apply.
    fn errand_finished(&mut self) -> Option<(Option<Request>, Finish)> {
        let finish = self.errand.as_ref()?.finished()?;
        let e = self.errand.take()?;
        Some((e.asked, finish))
    }

    /// An errand that ended while nobody waited for it: its result applied,
    /// its answer kept for the worker's asking again.
    pub(super) fn errand_done_meanwhile(&mut self) {
        if let Some((asked, finish)) = self.errand_finished() {
            let answer = finish(self);
            self.kept = asked.map(|a| (a, answer));
        }
    }

    /// Once the worker is gone: the errand still under way, if any, ends (its
    /// FUSE requests fail now) and its result is applied.
    pub(super) fn settle_errand(&mut self) {
        let until = Instant::now() + SETTLE;
        while let Some(fd) = self.errand.as_ref().map(|e| e.fd()) {
            if Instant::now() >= until {
                warn!(
                    "{} did not end with the worker: going on without it",
                    self.errand.as_ref().map(|e| e.what()).unwrap_or_default()
                );
                self.errand = None;
                return;
            }
            self.wait_watching(&[Some(fd)], Duration::from_secs(1));
            self.errand_done_meanwhile();
        }
        self.kept = None;
    }

    /// A filesystem frozen past its time without a thaw (a worker that froze it
    /// and never asked for the thaw, or could not) is thawed by the root part:
    /// every writer to it waits while it is frozen.
    pub(super) fn thaw_if_overdue(&mut self) {
        let due = self.held.frozen.as_ref().and_then(|f| f.thaw_by);
        if self.errand.is_some() || due.is_none_or(|t| Instant::now() < t) {
            return;
        }
        let Some(mut frozen) = undone(&mut self.held.frozen) else {
            return;
        };
        warn!(
            "{} was frozen for {} s and not thawed: thawing it",
            frozen.mountpoint.display(),
            self.req.io.freeze_limit.as_secs()
        );
        let started = Errand::start(None, move || {
            let thawed = system::thaw(&frozen.file);
            Box::new(move |root: &mut RootPart| {
                let mp = frozen.mountpoint.display();
                match thawed {
                    Ok(()) => info!("thawed {mp}"),
                    Err(e) => {
                        warn!("could not thaw {mp}: {e}");
                        // Not tried again: it stays frozen until the end.
                        frozen.thaw_by = None;
                        root.held.frozen = Some(Guard::new(frozen));
                    }
                }
                Answer::Done
            }) as Finish
        });
        match started {
            Ok(e) => self.errand = Some(e),
            Err(e) => warn!(
                "cannot start the thaw of {}: {e}",
                self.req.mountpoint.display()
            ),
        }
    }
}

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// SIGTERM and SIGINT go on to the worker, which takes the drive down;
/// SIGCHLD needs nothing here (the worker is reaped by the loop).
fn pass_signals_on(w: &Watch) {
    for sig in read_signals(&w.signals) {
        if sig == libc::SIGTERM as u32 || sig == libc::SIGINT as u32 {
            info!(
                "signal {sig} received: passing it on to the worker (pid {})",
                w.worker
            );
            // SAFETY: kill with integer arguments.
            unsafe { libc::kill(w.worker, libc::SIGTERM) };
        }
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
