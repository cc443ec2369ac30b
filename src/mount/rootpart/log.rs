//! The worker's log: its stderr is a pipe the root part copies into the
//! mount's log (the root part's own stderr), which the root part alone can
//! rotate (the worker is walled away from the run directory).
//!
//! The worker chooses every byte of it, and as much as it likes, so the copy
//! is bounded and plain: at most [`WORKER_LOG_PER_WINDOW`] bytes a minute are
//! copied (past that the pipe is left unread until the minute is over, and
//! the worker's writes wait); every control character but newline and tab is
//! escaped, so `cat` of the log shows what the worker wrote instead of acting
//! on it; and the log file itself is held within [`record::LOG_MAX_BYTES`]
//! after every round of the root part's loop, whoever wrote it (the root
//! part's own lines count too): rotated when it is the file in the run
//! directory, started afresh there when someone removed it while the daemon
//! still wrote to it. The root part's own messages that quote the worker (a
//! request it refused) quote at most [`QUOTE_MAX`] characters of it, and what
//! they quote counts in the same window: once it is spent they are left out
//! until the minute is over, so a worker flooding the channel with requests to
//! refuse cannot push the log's earlier lines out either.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::azure::text::escape_log_bytes;
use crate::mount::record;

/// The most of the worker's log copied in a [`WINDOW`].
pub(super) const WORKER_LOG_PER_WINDOW: u64 = record::LOG_MAX_BYTES;
const WINDOW: Duration = Duration::from_secs(60);
/// The most characters of the worker's text one of the root part's messages
/// quotes: enough to tell what it sent, few enough that a flood of them stays
/// small.
pub(super) const QUOTE_MAX: usize = 300;

/// `text` (the worker's) with its control characters escaped, cut to `max`
/// characters (an ellipsis marks a cut).
pub(super) fn quoted(text: &str, max: usize) -> String {
    let mut cut = text
        .char_indices()
        .nth(max)
        .map_or(text, |(i, _)| &text[..i])
        .to_string();
    if cut.len() < text.len() {
        cut.push('…');
    }
    crate::azure::text::escape_controls(&cut)
}

/// The read end of the worker's stderr, and what its copy has done.
pub(super) struct WorkerLog {
    /// `None` once the worker's end closed.
    pipe: Option<OwnedFd>,
    /// The mount's log file, which the root part's stderr writes to (unless
    /// it runs in the foreground).
    path: PathBuf,
    /// The start of a character cut at the end of the last read.
    carry: Vec<u8>,
    window_start: Instant,
    window_bytes: u64,
    /// The pipe is left unread until then: the window's bytes were copied.
    held_until: Option<Instant>,
    /// The root part's messages quoting the worker are left out for the rest
    /// of the window (and said so once).
    quotes_held: bool,
}

impl WorkerLog {
    pub fn new(pipe: OwnedFd, path: PathBuf) -> WorkerLog {
        WorkerLog {
            pipe: Some(pipe),
            path,
            carry: Vec::new(),
            window_start: Instant::now(),
            window_bytes: 0,
            held_until: None,
            quotes_held: false,
        }
    }

    /// Starts a new window once the last one is over.
    fn roll_window(&mut self) {
        if self.window_start.elapsed() >= WINDOW {
            self.window_start = Instant::now();
            self.window_bytes = 0;
            self.quotes_held = false;
        }
    }

    /// What one of the root part's messages may quote of the worker's `text`:
    /// [`quoted`] to [`QUOTE_MAX`], counted in the window; `None` once the
    /// window's bytes are spent (the first time, a line says so).
    pub fn quote(&mut self, text: &str) -> Option<String> {
        self.roll_window();
        if self.window_bytes >= WORKER_LOG_PER_WINDOW {
            if !self.quotes_held {
                self.quotes_held = true;
                warn!("the worker's words filled this minute's share of the log: messages quoting it are left out until the minute is over");
            }
            return None;
        }
        let q = quoted(text, QUOTE_MAX);
        self.window_bytes += q.len() as u64;
        Some(q)
    }

    /// The descriptor to poll for the worker's next bytes: none while they are
    /// held back, or once its end is closed.
    pub fn fd(&mut self) -> Option<RawFd> {
        if self.held_until.is_some_and(|t| Instant::now() >= t) {
            self.held_until = None;
            info!("copying the worker's log again");
        }
        if self.held_until.is_some() {
            return None;
        }
        self.pipe.as_ref().map(|p| p.as_raw_fd())
    }

    /// How long until held-back bytes are read again.
    pub fn held_for(&self) -> Option<Duration> {
        self.held_until
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// Copies one read of the pipe (at most 64 KiB) into the log, escaped, as
    /// far as the window allows; `false` once there is nothing more to read
    /// now (empty, held back) or ever (closed).
    pub fn copy(&mut self) -> bool {
        if self.held_until.is_some() {
            return false;
        }
        self.roll_window();
        let Some(pipe) = &self.pipe else {
            return false;
        };
        let room = WORKER_LOG_PER_WINDOW.saturating_sub(self.window_bytes);
        let mut buf = [0u8; 64 * 1024];
        let want = buf.len().min(room as usize);
        // SAFETY: reads at most `want` bytes into `buf`.
        let n = unsafe { libc::read(pipe.as_raw_fd(), buf.as_mut_ptr().cast(), want) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return e.raw_os_error() == Some(libc::EINTR);
        }
        if n == 0 && want > 0 {
            self.close();
            return false;
        }
        let n = n as usize;
        self.window_bytes += n as u64;
        let text = escape_log_bytes(&buf[..n], &mut self.carry, false);
        use std::io::Write;
        let _ = std::io::stderr().write_all(&text);
        if self.window_bytes >= WORKER_LOG_PER_WINDOW {
            let until = self.window_start + WINDOW;
            self.held_until = Some(until);
            warn!(
                "the worker wrote {} bytes to its log within a minute: the rest waits {} s",
                self.window_bytes,
                until.saturating_duration_since(Instant::now()).as_secs()
            );
            return false;
        }
        n > 0
    }

    /// What the worker wrote last, once it is gone: read until the pipe is
    /// empty (a process the worker left behind may hold it open still), as
    /// far as the window allows.
    pub fn drain(&mut self) {
        self.held_until = None;
        while self.copy() {}
        self.close();
    }

    fn close(&mut self) {
        if self.pipe.take().is_some() && !self.carry.is_empty() {
            let text = escape_log_bytes(&[], &mut self.carry, true);
            use std::io::Write;
            let _ = std::io::stderr().write_all(&text);
        }
    }

    /// Holds the log file within [`record::LOG_MAX_BYTES`]: called after
    /// every round of the root part's loop (an fstat when nothing is to be
    /// done). A daemon in the foreground, whose stderr is not a file of the
    /// run directory, is left alone.
    pub fn keep_bounded(&self) {
        // SAFETY: fstat writes only into the zeroed struct it is given.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(2, &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
            || (st.st_size as u64) <= record::LOG_MAX_BYTES
        {
            return;
        }
        if st.st_nlink == 0 {
            // Removed while the daemon writes to it: what is written next
            // would fill a file nobody sees (and, on a tmpfs /run, memory).
            self.start_afresh();
            return;
        }
        match record::rotate_log(&self.path, record::LOG_MAX_BYTES, 2) {
            Ok(true) => info!(
                "log rotated: the older part is in {}.1",
                self.path.display()
            ),
            Ok(false) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!("cannot rotate the log {}: {e}", self.path.display()),
        }
    }

    /// Points stderr at a new log file where the removed one was, which
    /// says whose it is first as every mount's log does.
    fn start_afresh(&self) {
        let fresh = record::create_private(&self.path, true).and_then(|mut f| {
            use std::io::Write;
            f.write_all(record::log_header("started afresh: the log was removed").as_bytes())?;
            Ok(f)
        });
        match fresh {
            // SAFETY: both descriptors are valid; dup2 atomically replaces stderr.
            Ok(f) if unsafe { libc::dup2(f.as_raw_fd(), 2) } >= 0 => {
                warn!("the log was removed while the mount ran: a new one is started")
            }
            Ok(_) | Err(_) => {
                // Nowhere to write it: the removed file is emptied instead.
                // SAFETY: ftruncate of our own stderr, a regular file no
                // name leads to any more.
                unsafe { libc::ftruncate(2, 0) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a child of a fork (its stderr is the log): a log past its bound and
    /// removed while written to is started afresh where it was, saying whose
    /// it is, and stderr writes there.
    #[test]
    fn a_log_removed_while_written_to_is_started_afresh_where_it_was() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let (pipe, _writer) = super::super::errand::pipe().unwrap();
        // SAFETY: the child makes system calls and small allocations, then
        // exits; the parent only waits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let ok = (|| {
                let f = record::create_private(&path, true).ok()?;
                // SAFETY: our descriptors; stderr becomes the log, past its bound.
                unsafe {
                    libc::dup2(f.as_raw_fd(), 2);
                    libc::ftruncate(2, record::LOG_MAX_BYTES as libc::off_t + 1);
                }
                std::fs::remove_file(&path).ok()?;
                WorkerLog::new(pipe, path.clone()).keep_bounded();
                // SAFETY: fstat writes only into the zeroed struct it is given.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                unsafe { libc::fstat(2, &mut st) };
                let there = std::fs::metadata(&path).ok()?;
                let text = std::fs::read_to_string(&path).ok()?;
                (there.ino() == st.st_ino && text.starts_with("== blobdrive ")).then_some(())
            })();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok.is_some() { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
