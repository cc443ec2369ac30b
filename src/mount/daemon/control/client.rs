//! The client side of the control socket: `blobdrive unmount`, `stats`,
//! `resize` and `snapshot create` send one command line and read progress
//! lines up to one answer line.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The longest answer line a client reads (the stats JSON is a few KiB).
const ANSWER_LINE_MAX: u64 = 1 << 20;

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
///
/// The worker serves the socket, so every line it sends is its word, which a
/// worker made to say anything could fill with escape sequences for root's
/// terminal: progress lines and the answer come back with every control
/// character shown as `\u{..}` (a JSON answer has none of its own: JSON
/// escapes them, and whoever prints its strings escapes them again).
pub fn control_with_progress(
    socket: &std::path::Path,
    cmd: &str,
    timeout: Option<Duration>,
    on_progress: &mut dyn FnMut(&str),
) -> std::io::Result<String> {
    control_on(UnixStream::connect(socket)?, cmd, timeout, on_progress)
}

/// Like [`control_with_progress`], on a connection already open (a client that
/// needs its descriptor: `warm` closes its side on Ctrl-C). `timeout` bounds
/// each wait for a line.
pub fn control_on(
    s: UnixStream,
    cmd: &str,
    timeout: Option<Duration>,
    on_progress: &mut dyn FnMut(&str),
) -> std::io::Result<String> {
    s.set_read_timeout(timeout)?;
    ask(s, cmd, on_progress, None)
}

/// Like [`control_with_progress`] without a time limit, but with
/// `still_answers` asked every second while the answer is awaited, and after
/// each progress line: once it says why the daemon cannot answer (a part of
/// it stopped), the wait ends with that, an error of kind `TimedOut`.
pub fn control_watching(
    socket: &std::path::Path,
    cmd: &str,
    on_progress: &mut dyn FnMut(&str),
    still_answers: &mut dyn FnMut() -> Result<(), String>,
) -> std::io::Result<String> {
    let s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    ask(s, cmd, on_progress, Some(still_answers))
}

/// Sends `cmd` on `s` and reads progress lines up to the answer (see
/// [`control_with_progress`]); with `watch`, a read that times out asks it
/// whether to go on waiting.
fn ask(
    mut s: UnixStream,
    cmd: &str,
    on_progress: &mut dyn FnMut(&str),
    mut watch: Option<&mut dyn FnMut() -> Result<(), String>>,
) -> std::io::Result<String> {
    use std::io::ErrorKind;
    writeln!(s, "{cmd}")?;
    let mut reader = BufReader::new(s);
    let mut line = Vec::new();
    let check = |watch: &mut Option<&mut dyn FnMut() -> Result<(), String>>| match watch {
        Some(w) => w().map_err(|why| std::io::Error::new(ErrorKind::TimedOut, why)),
        None => Ok(()),
    };
    loop {
        let room = ANSWER_LINE_MAX.saturating_sub(line.len() as u64);
        match (&mut reader).take(room).read_until(b'\n', &mut line) {
            Err(e)
                if watch.is_some()
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                check(&mut watch)?;
                continue;
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") && line.len() as u64 >= ANSWER_LINE_MAX {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                "the daemon's answer is too long",
            ));
        }
        if line.is_empty() {
            return Err(std::io::Error::new(
                ErrorKind::UnexpectedEof,
                "the daemon closed the connection without answering",
            ));
        }
        let text = crate::azure::text::escape_controls(String::from_utf8_lossy(&line).trim_end());
        line.clear();
        match text.strip_prefix("progress ") {
            Some(p) => {
                on_progress(p);
                check(&mut watch)?;
            }
            None => return Ok(text),
        }
    }
}
