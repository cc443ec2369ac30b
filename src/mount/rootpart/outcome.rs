//! The worker's word on the mount: that it is ready (libmount's entry added,
//! the record told how the worker signed in), that it failed, status lines for
//! the service manager, and that the drive is down (the record released, with
//! what was lost) and its log of no more use. The kernel, not the worker, says
//! whether the drive is down, and what `blobdrive mount` prints of the result
//! (the device, the filesystem and whether it was made now) is the root
//! part's own account, given only once the kernel shows it in place. Every
//! word of the worker's that reaches a terminal, the service manager or the
//! record goes there with its control characters escaped, cut short.

use tracing::warn;

use super::channel::{Answer, Request};
use super::guards::{Guard, LoopOverDisk, UtabEntry};
use super::log::quoted;
use super::RootPart;
use crate::mount::record;
use crate::mount::{utab, Mode, Ready};

impl RootPart {
    /// The requests that say how the mount is.
    pub(super) fn carry_out_for_outcome(&mut self, req: Request) -> Answer {
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
            other => Answer::Refused(format!(
                "not a request about the mount's outcome: {other:?}"
            )),
        }
    }

    /// The worker's `Ready`, taken once the kernel shows what the mode puts
    /// in place: libmount's entry added, the record told how the worker signed
    /// in, and the mount's description (the root part's account of it) kept
    /// for `blobdrive mount` and the service manager.
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
        if let Err(why) = self.in_place() {
            warn!("the worker said the drive is ready, but {why}: refused");
            return Answer::Refused(format!("the drive is not ready: {why}"));
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
            Mode::Fs => self.held.loop_dev.as_ref().and_then(|l| l.dev.devno()),
            Mode::Block | Mode::Raw => self.fuse_id.map(|id| id.devno()),
        };
        let added = devno
            .ok_or_else(|| "its device is not known".to_string())
            .and_then(|d| utab::add(&self.req.mountpoint, &d));
        match added {
            Ok(()) => {
                self.held.utab = Some(Guard::new(UtabEntry(self.req.mountpoint.clone())));
            }
            Err(e) => warn!(
                "a plain umount of {} will not wait for the lease to be released: {e}",
                self.req.mountpoint.display()
            ),
        }
        let fs = self.fs.as_ref().filter(|_| self.held.fs.is_some());
        self.said = Some(Ok(Ready {
            mountpoint: self.req.mountpoint.clone(),
            mode: self.req.mode,
            device: self
                .held
                .loop_dev
                .as_ref()
                .map(|l| l.dev.path().to_string()),
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
        self.held.utab = None;
        if let Some(rec) = self.held.record.as_mut() {
            rec.note = (!losses.is_empty()).then(|| losses.join("; "));
        }
        self.held.record = None;
        self.losses = losses;
        Answer::Done
    }

    /// What of this mount the kernel still has mounted, in words: the root
    /// part's FUSE mount or the filesystem on its loop device (see
    /// [`RootPart::mounted_per`]). `None` when neither is. An unreadable
    /// mount table counts as mounted.
    pub(super) fn still_mounted(&mut self) -> Option<String> {
        let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return Some("(the mount table cannot be read, so maybe) the drive".into());
        };
        let l = self.attached_loop();
        let now = self.mounted_per(&table, l.as_ref());
        if now.fuse {
            return Some(format!("FUSE at {}", self.fuse_dir.display()));
        }
        let dev = l?.dev;
        (now.fs != Some(false)).then(|| format!("the filesystem on {dev}"))
    }

    /// What the drive's mode puts in place before it is ready, as the kernel
    /// says it is (raw: the FUSE mount; block: the loop device over `disk`;
    /// fs: the filesystem on it, mounted), so that what `blobdrive mount`
    /// prints of the result is what is there; `Err` says what is missing.
    fn in_place(&mut self) -> Result<(), String> {
        let table = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("the mount table cannot be read ({e})"))?;
        let l = match self.req.mode {
            Mode::Raw => None,
            Mode::Block | Mode::Fs => self.attached_loop(),
        };
        let now = self.mounted_per(&table, l.as_ref());
        if !now.fuse {
            return Err("its FUSE mount is not mounted".into());
        }
        if self.req.mode == Mode::Raw {
            return Ok(());
        }
        let Some(l) = l else {
            return Err("no loop device is attached".into());
        };
        if self.req.mode == Mode::Block {
            return Ok(());
        }
        if self.held.fs.is_none() || self.fs.is_none() || now.fs != Some(true) {
            return Err(format!("no filesystem of {} is mounted", l.dev));
        }
        Ok(())
    }

    /// What of this mount the mount table `table` shows mounted: the root
    /// part's FUSE mount, known by its numbers (by whether it is held, before
    /// they are known), and the filesystem on the loop device `l` (`None`:
    /// it cannot be told; no device, nothing mounted). The one place that
    /// says whether the drive is up or down: for `Ready`, `Finished`,
    /// `RemoveLog` and the root part's own teardown alike.
    pub(super) fn mounted_per(&self, table: &str, l: Option<&LoopOverDisk>) -> Mounted {
        let fuse = match &self.fuse_id {
            Some(id) => id.is_mounted(table, &self.fuse_dir),
            None => self.held.fuse.is_some(),
        };
        let fs = l.map_or(Some(false), |l| l.dev.is_mounted_per(table));
        Mounted { fuse, fs }
    }
}

/// What of a mount the kernel shows mounted (see [`RootPart::mounted_per`]).
pub(super) struct Mounted {
    pub fuse: bool,
    /// The filesystem on the loop device; `None` when that cannot be told.
    pub fs: Option<bool>,
}

/// The worker's words that go on to a terminal, the service manager or the
/// mount's record (warnings, notes, status lines, why it failed, what was
/// lost) with every control character escaped and each cut to [`WORDS_MAX`]
/// characters, at most [`WORDS_MANY`] of a list: a worker that was made to say
/// anything must not reach root's terminal with an escape sequence, nor fill
/// it (or the log, where the daemon's last error goes).
pub(super) fn plain_words(req: Request) -> Request {
    let plain = |w: &str| quoted(w, WORDS_MAX);
    let all = |v: Vec<String>| v.iter().take(WORDS_MANY).map(|w| plain(w)).collect();
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

/// The most characters of one of the worker's words passed on: far more than
/// any the worker writes (a warning naming the mountpoint), few enough that a
/// flood of them stays small.
const WORDS_MAX: usize = 1000;
/// The most words of one list (warnings, notes, losses) passed on.
const WORDS_MANY: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

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
