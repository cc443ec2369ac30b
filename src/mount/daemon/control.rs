//! The control socket: how `blobdrive unmount`, `stats`, `snapshot` and `warm`
//! talk to a running daemon. The daemon side (`serve`: one line in, progress
//! lines and one answer line out), and the client side in `control/client.rs`.
//! Debug builds also answer `probe-walls DIR`, `probe-scope PID NAME` and
//! `probe-root REQUEST`, the tests' look at the worker's walls from inside and
//! their way to speak for it to the root part (see [`probe`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{error, info, warn};

use super::resize::Phase;
use super::stats::{lease_state, StatsValues};
use super::teardown::finished;
use super::warm::{self, Warmer};
use super::Mounted;
use crate::device::cache::Cache;
use crate::device::stack::Stack;
use crate::mount::rootpart::{Request, RootClient};
use crate::mount::MountError;
use crate::size::human as human_bytes;

mod client;
#[cfg(debug_assertions)]
mod probe;

pub use client::{control, control_on, control_watching, control_with_progress};

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
            let h = cache.backend().remote().health();
            if h.stalled >= Duration::from_secs(2) {
                format!(
                    "waiting for {}; {} not yet written, kept in memory",
                    h.waiting_for(),
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

/// Serves the mounted drive until it comes down: commands from the control
/// socket, SIGTERM and SIGINT, and once a second a look at whether the
/// filesystem was unmounted under the daemon or the FUSE mount went away.
pub(super) fn serve(m: &mut Mounted, listener: UnixListener) -> Result<(), MountError> {
    let (tx, rx) = mpsc::channel::<Event>();
    forward_signals(m, tx.clone());
    start_control_thread(m, listener, tx)?;
    info!("serving {} at {}", m.target, m.req.mountpoint.display());
    let mut since_status = 0u32;
    // Why the drive is to come down once it can (SIGTERM, or the filesystem
    // unmounted by a plain umount), while something still holds it.
    let mut stop: Option<&'static str> = None;
    loop {
        if let Some(why) = stop {
            match m.stop_by_itself(why) {
                Some(result) => {
                    let answer = match &result {
                        Ok(()) => "ok".to_string(),
                        Err(e) => format!("failed {e}"),
                    };
                    answer_waiting_unmounts(&rx, &answer);
                    return result;
                }
                None => std::thread::sleep(Duration::from_millis(900)),
            }
        }
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Event::Control(cmd, reply)) => {
                if let Some(ended) = m.carry_out(&cmd, reply, &rx) {
                    return ended;
                }
            }
            Ok(Event::Signal) => {
                if stop.is_none() {
                    info!("signal received: unmounting");
                    m.notify_stopping("unmounting (SIGTERM)");
                    stop = Some("SIGTERM");
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                m.noticed_umount_begun();
                if stop.is_none() && m.noticed_plain_umount() {
                    m.notify_stopping("the filesystem was unmounted: writing back and stopping");
                    stop = Some("umount");
                }
                since_status += 1;
                if since_status >= STATUS_EVERY_SECS {
                    since_status = 0;
                    m.tell_status(&m.status_line());
                }
                let gone = m.session.as_ref().is_some_and(|s| s.guard.is_finished());
                if gone {
                    error!(
                        "the FUSE mount went away underneath; writing what is cached and stopping"
                    );
                    return finished(m.teardown_after_fuse_gone());
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return finished(m.teardown()?),
        }
    }
}

/// Turns SIGTERM and SIGINT into events of the serving loop.
fn forward_signals(m: &Mounted, tx: mpsc::Sender<Event>) {
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
            if tx.send(Event::Signal).is_err() {
                return;
            }
        }
    });
}

/// Accepts control connections on a thread of its own; commands become events
/// of the serving loop (`stats` and a discard request are answered there and
/// then).
fn start_control_thread(
    m: &Mounted,
    listener: UnixListener,
    tx: mpsc::Sender<Event>,
) -> Result<(), MountError> {
    let stats = m.stats.clone();
    let warmer = m.warmer.clone();
    let root = m.root.clone();
    let discard = Discard {
        requested: m.discard.clone(),
        fuse_gone: m.fuse_gone.clone(),
        unmounting_fs: m.unmounting_fs.clone(),
        cache: m.cache.clone(),
    };
    std::thread::Builder::new()
        .name("blobdrive-control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                handle_conn(conn, &tx, stats.as_ref(), &discard, warmer.as_ref(), &root);
            }
        })
        .map(drop)
        .map_err(|e| MountError::with_source("cannot start the control thread", e))
}

impl Mounted {
    /// Carries out one command from the control socket and answers it; `Some`
    /// with the daemon's result when the command took the drive down.
    fn carry_out(
        &mut self,
        cmd: &str,
        reply: Reply,
        rx: &mpsc::Receiver<Event>,
    ) -> Option<Result<(), MountError>> {
        match cmd {
            "snapshot" => {
                let answer = match self.consistent_snapshot() {
                    Ok(id) => format!("ok {id}"),
                    Err(e) => format!("error {e}"),
                };
                reply.send(&answer);
            }
            FLUSH_CMD => reply.send(&self.flush_on_request()),
            "unmount" | DISCARD_CMD => return self.unmount_on_request(cmd, reply, rx),
            other if other.starts_with("resize ") => {
                let answer = match other["resize ".len()..].trim().parse::<u64>() {
                    Ok(size) => self.resize_telling(size, &reply),
                    Err(_) => "error resize takes a size in bytes".to_string(),
                };
                reply.send(&answer);
            }
            other => reply.send(&format!("error unknown command '{other}'")),
        }
        None
    }

    /// `resize SIZE`, with a progress line every few seconds to the client saying
    /// what it is doing; the answer line.
    fn resize_telling(&mut self, size: u64, reply: &Reply) -> String {
        let phase: Phase = Arc::new(std::sync::Mutex::new("starting"));
        let (said, started) = (phase.clone(), std::time::Instant::now());
        let status = Box::new(move || {
            format!(
                "resizing to {}: {}, {} s so far",
                human_bytes(size),
                said.lock().unwrap_or_else(|p| p.into_inner()),
                started.elapsed().as_secs()
            )
        });
        let ticker = Ticker::start("resize", vec![reply_sink(reply)], status);
        let answer = match self.resize(size, &phase) {
            Ok(what) => format!("ok {what}"),
            Err(e) => format!("error {e}"),
        };
        ticker.stop();
        answer
    }

    /// `unmount` (or `unmount --discard-dirty`): takes the drive down, telling
    /// the client how it goes; `None` when it was refused (busy) and the drive
    /// stays up.
    fn unmount_on_request(
        &mut self,
        cmd: &str,
        reply: Reply,
        rx: &mpsc::Receiver<Event>,
    ) -> Option<Result<(), MountError>> {
        info!("{cmd} requested");
        self.notify_stopping("unmounting (blobdrive unmount)");
        let mut sinks = vec![reply_sink(&reply)];
        sinks.extend(self.notify_sink());
        let ticker = Ticker::start("unmount", sinks, self.progress_fn());
        let result = self.teardown();
        ticker.stop();
        match result {
            Ok(losses) if losses.is_empty() => {
                // "ok", or "ok NOTE" with something to say all the same.
                let answer = match self.lease_note.take() {
                    Some(note) => format!("ok {note}"),
                    None => "ok".to_string(),
                };
                reply.send(&answer);
                answer_waiting_unmounts(rx, &answer);
                info!("unmounted cleanly");
                self.remove_log();
                Some(Ok(()))
            }
            Ok(losses) => {
                let all = losses.join("; ");
                let answer = format!("failed {all}");
                reply.send(&answer);
                answer_waiting_unmounts(rx, &answer);
                Some(Err(MountError::Data(all)))
            }
            Err(e) => {
                warn!("unmount refused: {e}");
                // A refused `--discard-dirty` leaves no trace for later.
                self.discard.store(false, Ordering::SeqCst);
                if !self.fuse_gone.load(Ordering::SeqCst) {
                    if let Some(c) = &self.cache {
                        c.backend().remote().resume_waiting();
                    }
                }
                reply.send(&format!("error {e}"));
                None
            }
        }
    }
}

/// How often a daemon under a service manager sends it a `STATUS=` line.
const STATUS_EVERY_SECS: u32 = 5;

impl Mounted {
    /// Takes the drive down because `why` (SIGTERM, a plain umount) asked for it,
    /// not a `blobdrive unmount` waiting for an answer. `None` while that cannot be
    /// done yet (the filesystem is busy, a process holds `disk`): the caller tries
    /// again, so the drive comes down as soon as it is let go. Otherwise the
    /// daemon's result: every byte on the blob and the lease released, or what
    /// could not be kept.
    fn stop_by_itself(&mut self, why: &str) -> Option<Result<(), MountError>> {
        let ticker = Ticker::start(
            "unmount",
            self.notify_sink().into_iter().collect(),
            self.progress_fn(),
        );
        let result = self.teardown();
        ticker.stop();
        match result {
            Ok(losses) => {
                if losses.is_empty() {
                    info!("unmounted cleanly ({why})");
                    self.remove_log();
                }
                Some(finished(losses))
            }
            Err(e) => {
                if !self.stop_refused_logged {
                    error!("cannot unmount yet ({why}): {e}; trying again every second or two");
                    self.tell_status(&format!("stopping, but cannot unmount yet: {e}"));
                    self.stop_refused_logged = true;
                }
                None
            }
        }
    }

    /// One line for the service manager: what is served, what is not yet on the
    /// blob, the lease, and an outage if there is one.
    pub(super) fn status_line(&self) -> String {
        let dirty = self.cache.as_ref().map_or(0, |c| c.dirty_bytes());
        let lease = lease_state(self.lease.is_some(), &self.fenced);
        let mut line = format!(
            "serving {} at {}; {} not yet on the blob; lease {lease}",
            self.target,
            self.req.mountpoint.display(),
            human_bytes(dirty)
        );
        if let Some(c) = &self.cache {
            let h = c.backend().remote().health();
            if h.stalled >= Duration::from_secs(2) {
                line.push_str(&format!("; waiting for {}", h.waiting_for()));
            }
        }
        line
    }

    /// Has the root part remove the log of a drive that came down cleanly.
    fn remove_log(&self) {
        self.root.tell(&Request::RemoveLog {});
    }

    /// A `STATUS=` line for the service manager, which the root part, the
    /// unit's main process, passes on, when a service manager listens.
    pub(super) fn tell_status(&self, line: &str) {
        if under_service_manager() {
            self.root
                .tell_if_free(&Request::Status { line: line.into() });
        }
    }

    fn notify_stopping(&self, status: &str) {
        if under_service_manager() {
            self.root.tell(&Request::Stopping {
                line: status.into(),
            });
        }
    }

    /// Progress lines of a teardown as `STATUS=` for the service manager.
    fn notify_sink(&self) -> Option<Sink> {
        if !under_service_manager() {
            return None;
        }
        let root = self.root.clone();
        Some(Box::new(move |line| {
            root.tell_if_free(&Request::Status { line: line.into() });
            true
        }))
    }
}

/// Whether a service manager listens for this mount's word (`NOTIFY_SOCKET`,
/// which reaches only a `--foreground` daemon; the root part holds the socket).
fn under_service_manager() -> bool {
    std::env::var_os(crate::mount::notify::NOTIFY_SOCKET_ENV).is_some()
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

/// Where a progress line goes; `false` once it can take no more (the client of
/// a waiting `unmount` went away).
type Sink = Box<dyn FnMut(&str) -> bool + Send>;

/// The waiting `unmount` on `reply` hears `progress LINE` lines.
fn reply_sink(reply: &Reply) -> Sink {
    match reply.0.try_clone() {
        Ok(mut conn) => {
            let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
            Box::new(move |line| writeln!(conn, "progress {line}").is_ok())
        }
        Err(_) => Box::new(|_| false),
    }
}

impl Ticker {
    /// Every [`TICK`], logs `status()` (after `what:`) and hands it to `sinks`.
    fn start(
        what: &'static str,
        mut sinks: Vec<Sink>,
        status: Box<dyn Fn() -> String + Send>,
    ) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("blobdrive-progress".into())
            .spawn(move || {
                let mut waited = Duration::ZERO;
                while !stop2.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                    waited += Duration::from_millis(100);
                    if waited >= TICK {
                        waited = Duration::ZERO;
                        let line = status();
                        info!("{what}: {line}");
                        // A sink that went away is dropped; the teardown goes on.
                        sinks.retain_mut(|sink| sink(&line));
                    }
                }
            })
            .ok();
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

/// The control command that writes everything the drive acknowledged so far
/// to the blob (a CSI node's, before its volume is snapshotted).
pub const FLUSH_CMD: &str = "flush";

/// What the control thread needs to make a teardown stop waiting.
struct Discard {
    requested: Arc<AtomicBool>,
    fuse_gone: Arc<AtomicBool>,
    unmounting_fs: Arc<AtomicBool>,
    cache: Option<Arc<Cache<Stack>>>,
}

impl Discard {
    /// Marks the request; if the FUSE mount is already gone (a teardown waiting
    /// out an outage), or the filesystem's unmount is under way (its last sync,
    /// in the kernel, waits on the daemon's I/O), that I/O stops waiting at once.
    /// Otherwise the teardown does that itself once nothing new can be written.
    fn request(&self) {
        self.requested.store(true, Ordering::SeqCst);
        if self.fuse_gone.load(Ordering::SeqCst) || self.unmounting_fs.load(Ordering::SeqCst) {
            if let Some(c) = &self.cache {
                c.backend().remote().stop_waiting();
            }
        }
    }
}

/// Reads one command line and answers it: `stats` (and in debug builds
/// `probe-walls`) here and now, `warm` on a thread of its own (also while the main thread is busy taking the
/// drive down), the rest by handing it, with its connection, to the main thread.
fn handle_conn(
    conn: UnixStream,
    tx: &mpsc::Sender<Event>,
    stats: Option<&StatsValues>,
    discard: &Discard,
    warmer: Option<&Arc<Warmer>>,
    root: &RootClient,
) {
    // Only root may steer a root daemon: the socket is 0600 in a 0700 directory,
    // and the peer is checked too, so a socket made reachable by mistake (a
    // chmod, a bind mount) still serves nobody else.
    match peer_uid(&conn) {
        Some(0) => {}
        other => {
            warn!("refused a control connection from uid {other:?}: only root may use it");
            return;
        }
    }
    // A client that never sends its line must not hold up the commands after it.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    if reader
        .take(CONTROL_LINE_MAX as u64)
        .read_line(&mut line)
        .is_err()
    {
        return;
    }
    if !line.ends_with('\n') && line.len() >= CONTROL_LINE_MAX {
        return Reply(conn).send("error command too long");
    }
    let cmd = line.trim();
    if let ("stats", Some(values)) = (cmd, stats) {
        return Reply(conn).send(&values().to_string());
    }
    #[cfg(debug_assertions)]
    if let Some(dir) = cmd
        .strip_prefix(probe::CMD)
        .filter(|rest| rest.is_empty() || rest.starts_with(' '))
    {
        return Reply(conn).send(&probe::answer(dir.trim()));
    }
    if let Some(args) = cmd
        .strip_prefix(warm::CMD)
        .filter(|rest| rest.is_empty() || rest.starts_with(' '))
    {
        // On a thread of its own: it lasts as long as the warm-up.
        return warm::serve_client(warmer.cloned(), conn, args);
    }
    #[cfg(debug_assertions)]
    if let Some(args) = cmd.strip_prefix(probe::SCOPE_CMD) {
        return Reply(conn).send(&probe::answer_scope(args));
    }
    #[cfg(debug_assertions)]
    if let Some(json) = cmd.strip_prefix(probe::ROOT_CMD) {
        return Reply(conn).send(&probe::answer_root(root, json));
    }
    #[cfg(not(debug_assertions))]
    let _ = root;
    if cmd == DISCARD_CMD {
        warn!("unmount --discard-dirty: data that cannot be written will be dropped");
        discard.request();
    }
    let _ = tx.send(Event::Control(cmd.to_string(), Reply(conn)));
}

/// The longest command line the daemon reads (commands are a word or two).
const CONTROL_LINE_MAX: usize = 4096;

/// The uid of the process at the other end of `conn` (`SO_PEERCRED`).
fn peer_uid(conn: &UnixStream) -> Option<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed ucred is a valid out-parameter for getsockopt.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt on an open socket, writing at most `len` bytes to `cred`.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}
