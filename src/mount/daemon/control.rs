//! The control socket: how `blobdrive unmount`, `stats` and `snapshot` talk to a
//! running daemon. The daemon side (`serve`: one line in, progress lines and one
//! answer line out) and the client side (`control`, `control_with_progress`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{error, info, warn};

use super::stats::StatsValues;
use super::teardown::finished;
use super::Mounted;
use crate::device::cache::Cache;
use crate::device::remote::RemoteBackend;
use crate::mount::{record, MountError};
use crate::size::human as human_bytes;

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

impl Mounted {
    /// What a waiting `unmount` is told: what is left to write and, during an
    /// outage, how long the service has not answered and why.
    fn progress_fn(&self) -> Box<dyn Fn() -> String + Send> {
        let Some(cache) = self.cache.clone() else {
            return Box::new(|| "unmounting".to_string());
        };
        Box::new(move || {
            let dirty = cache.dirty_bytes();
            let h = cache.backend().health();
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

pub(super) fn serve(m: &mut Mounted, listener: UnixListener) -> Result<(), MountError> {
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
    let discard = Discard {
        requested: m.discard.clone(),
        fuse_gone: m.fuse_gone.clone(),
        cache: m.cache.clone(),
    };
    std::thread::Builder::new()
        .name("blobdrive-control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                handle_conn(conn, &tx, stats.as_ref(), &discard);
            }
        })
        .map_err(|e| MountError::System(format!("cannot start the control thread: {e}")))?;
    info!("serving {} at {}", m.target, m.req.mountpoint.display());
    let (.., log, _) = record::paths(&m.record_id);
    let mut since_rotation_check = 0u32;
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
                "unmount" | DISCARD_CMD => {
                    info!("{cmd} requested");
                    let ticker = Ticker::start(&reply, m.progress_fn());
                    let result = m.teardown();
                    ticker.stop();
                    match result {
                        Ok(losses) if losses.is_empty() => {
                            reply.send("ok");
                            answer_waiting_unmounts(&rx, "ok");
                            info!("unmounted cleanly");
                            record::remove_log(&m.record_id);
                            return Ok(());
                        }
                        Ok(losses) => {
                            let all = losses.join("; ");
                            let answer = format!("failed {all}");
                            reply.send(&answer);
                            answer_waiting_unmounts(&rx, &answer);
                            return Err(MountError::Data(all));
                        }
                        Err(e) => {
                            warn!("unmount refused: {e}");
                            // A refused `--discard-dirty` leaves no trace for later.
                            m.discard.store(false, Ordering::SeqCst);
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
                    Ok(losses) => {
                        if losses.is_empty() {
                            record::remove_log(&m.record_id);
                        }
                        return finished(losses);
                    }
                    Err(e) => error!("cannot unmount yet: {e}"),
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                rotate_log(&log, &mut since_rotation_check);
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

/// Once a minute, moves the daemon's log (its stderr) aside to `ID.log.1` when
/// it outgrew [`record::LOG_MAX_BYTES`], so a long-lived mount's log stays bounded.
fn rotate_log(log: &std::path::Path, ticks: &mut u32) {
    *ticks += 1;
    if *ticks < 60 {
        return;
    }
    *ticks = 0;
    match record::rotate_log(log, record::LOG_MAX_BYTES, 2) {
        Ok(true) => info!("log rotated: the older part is in {}.1", log.display()),
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!("cannot rotate the log {}: {e}", log.display()),
    }
}

/// An `unmount` (e.g. `--discard-dirty`) sent while a teardown waited gets that
/// teardown's answer: the process exits right after.
fn answer_waiting_unmounts(rx: &mpsc::Receiver<Event>, answer: &str) {
    while let Ok(ev) = rx.try_recv() {
        if let Event::Control(c, r) = ev {
            if c.starts_with("unmount") {
                r.send(answer);
            }
        }
    }
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

/// The control command of `unmount --discard-dirty`.
pub const DISCARD_CMD: &str = "unmount discard-dirty";

/// What the control thread needs to make a teardown stop waiting.
struct Discard {
    requested: Arc<AtomicBool>,
    fuse_gone: Arc<AtomicBool>,
    cache: Option<Arc<Cache<RemoteBackend>>>,
}

impl Discard {
    /// Marks the request; if the FUSE mount is already gone (a teardown waiting
    /// out an outage), its I/O stops waiting at once. Otherwise the teardown
    /// does that itself once nothing new can be written.
    fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        if self.fuse_gone.load(Ordering::SeqCst) {
            if let Some(c) = &self.cache {
                c.backend().stop_waiting();
            }
        }
    }
}

/// Reads one command line and answers it: `stats` here and now (also while the
/// main thread is busy taking the drive down), the rest by handing it, with its
/// connection, to the main thread.
fn handle_conn(
    conn: UnixStream,
    tx: &mpsc::Sender<Event>,
    stats: Option<&StatsValues>,
    discard: &Discard,
) {
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
    if cmd == DISCARD_CMD {
        warn!("unmount --discard-dirty: data that cannot be written will be dropped");
        discard.request();
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
