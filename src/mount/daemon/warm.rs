//! The warm-up (`blobdrive warm`, `mount --warm`): fills the disk cache with the
//! drive's allocated pages, fetched by the mount's own fetch workers behind the
//! applications' reads (see `fuse/fetchers.rs`), and the control command that
//! runs one for a client, telling it how far it is.
//!
//! It lists the pages anew (Get Page Ranges, in segments) rather than taking
//! the cache's map: that map also counts what is written but not yet on the
//! blob, and a read-only mount of a live blob counts everything. Its fetches go
//! to the service with the request's retries and no more: a warm-up is not worth
//! waiting through an outage for, and an unmount must not wait on it. What it
//! fetched is stored as a read's fetch is, so a write that lands meanwhile keeps
//! the older bytes out.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::Mounted;
use crate::azure::{BlobClient, SegmentPlan};
use crate::device::cache::Cache;
use crate::device::diskcache::warm::{self, Filled, Unit};
use crate::device::diskcache::DiskCache;
use crate::device::stack::Stack;
use crate::device::DeviceError;
use crate::fuse::{BackgroundFetches, BackgroundJob};
use crate::mount::warmup::{Origin, WarmStatus, Warming};
use crate::size::human;

/// The control command: `warm`, or `warm max-rate=BYTES` (a second).
pub const CMD: &str = "warm";

/// Fills in flight at once: as many as the fetch workers take in the background.
const IN_FLIGHT: usize = crate::fuse::BACKGROUND_FETCHES;

/// How long a warm-up waits for the FUSE session to start the fetch workers (a
/// `mount --warm` starts as soon as the mount is ready).
const WORKERS_WAIT: Duration = Duration::from_secs(10);

/// How often a client of `warm` hears how far it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// One fill's outcome, with the allocated bytes it covered.
type Outcome = (u64, Result<Filled, String>);

/// The mount's warm-ups: at most one at a time.
pub(super) struct Warmer {
    cache: Arc<Cache<Stack>>,
    blob: BlobClient,
    rt: tokio::runtime::Handle,
    workers: BackgroundFetches,
    pub figures: Arc<Warming>,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Warmer {
    pub fn new(
        cache: Arc<Cache<Stack>>,
        blob: BlobClient,
        rt: tokio::runtime::Handle,
        workers: BackgroundFetches,
    ) -> Warmer {
        Warmer {
            cache,
            blob,
            rt,
            workers,
            figures: Arc::new(Warming::default()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Starts a warm-up on a thread of its own, at most `max_rate` bytes a
    /// second fetched; refused while one runs.
    pub fn start(self: &Arc<Self>, origin: Origin, max_rate: Option<u64>) -> Result<(), String> {
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if !self.figures.begin(origin, max_rate) {
            return Err(
                "a warm-up of this drive is running already; `blobdrive stats` shows how far it is"
                    .into(),
            );
        }
        if let Some(t) = thread.take() {
            let _ = t.join();
        }
        self.stop.store(false, Ordering::SeqCst);
        let me = self.clone();
        match std::thread::Builder::new()
            .name("blobdrive-warm".into())
            .spawn(move || me.run(max_rate))
        {
            Ok(t) => {
                *thread = Some(t);
                Ok(())
            }
            Err(e) => {
                let why = format!("cannot start the warm-up: {e}");
                self.figures.end(false, Some(why.clone()));
                Err(why)
            }
        }
    }

    /// Has the warm-up (if one runs) stop after the fills in flight.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits until the warm-up (if any) is over: nothing of it is in flight
    /// then. (Another waiter may hold its thread: the figures say when.)
    pub fn wait(&self) {
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
        while self.running() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&self) -> bool {
        self.figures.status().is_some_and(|s| s.running)
    }

    fn status(&self) -> WarmStatus {
        self.figures.status().unwrap_or_default()
    }

    fn run(&self, max_rate: Option<u64>) {
        let result = self.warm(max_rate);
        let s = self.status();
        // (A stop that came as the last fill ended stopped nothing.)
        let stopped = self.stopping() && s.done < s.allocated;
        match &result {
            Ok(()) => info!(
                "warm-up {}: {} fetched, {} cached already, {} skipped (no room), in {:.1} s",
                if stopped { "stopped" } else { "done" },
                human(s.fetched),
                human(s.already_cached),
                human(s.skipped),
                s.seconds
            ),
            Err(e) => warn!("warm-up failed: {e}"),
        }
        self.figures.end(stopped, result.err());
    }

    fn warm(&self, max_rate: Option<u64>) -> Result<(), String> {
        let disk = self.cache.backend().disk_cache().cloned().ok_or(
            "the drive is mounted without --disk-cache: a warm-up has nowhere to keep the data",
        )?;
        // The disk cache is the blob's (an encrypted drive's ciphertext, whose
        // data segment starts past its header).
        let size = self.cache.size() + self.cache.backend().data_offset();
        let ranges = self
            .rt
            .block_on(
                self.blob
                    .page_ranges_segmented(size, SegmentPlan::default()),
            )
            .map_err(|e| format!("cannot list the drive's allocated pages: {e}"))?;
        let plan = warm::plan(&ranges, size, disk.slots());
        self.figures.planned(plan.allocated, plan.skipped);
        let (tx, rx) = mpsc::channel::<Outcome>();
        let mut flight = Flight {
            rx,
            figures: &self.figures,
            in_flight: 0,
            failed: None,
        };
        let started = Instant::now();
        let mut to_fetch = 0u64;
        for unit in plan.units {
            while flight.in_flight >= IN_FLIGHT {
                flight.wait_one();
            }
            if flight.failed.is_some() || self.stopping() {
                break;
            }
            if let Some(rate) = max_rate {
                to_fetch += disk.missing_bytes(unit.start, unit.end);
                self.pace(started, to_fetch, rate, &mut flight);
                if self.stopping() {
                    break;
                }
            }
            let job = self.fill_job(&disk, unit, tx.clone());
            if self.workers.run(job, WORKERS_WAIT).is_err() {
                // Its answer (a refusal) is on the channel already.
                flight.in_flight += 1;
                break;
            }
            flight.in_flight += 1;
        }
        while flight.in_flight > 0 {
            flight.wait_one();
        }
        flight.failed.map_or(Ok(()), Err)
    }

    /// Waits until `fetched` bytes are due at `rate` bytes a second since
    /// `started`, taking in what the fills in flight say meanwhile.
    fn pace(&self, started: Instant, fetched: u64, rate: u64, flight: &mut Flight) {
        let due = started + Duration::from_secs_f64(fetched as f64 / rate.max(1) as f64);
        while Instant::now() < due && !self.stopping() {
            std::thread::sleep((due - Instant::now()).min(Duration::from_millis(50)));
            flight.take_done();
        }
    }

    /// The job that fills `unit` and says how it went on `tx`, also when it is
    /// dropped without being run (the fetch workers went away).
    fn fill_job(
        &self,
        disk: &Arc<DiskCache>,
        unit: Unit,
        tx: mpsc::Sender<Outcome>,
    ) -> BackgroundJob {
        let answer = Answer {
            tx,
            allocated: unit.allocated,
            sent: false,
        };
        let (disk, blob, rt) = (disk.clone(), self.blob.clone(), self.rt.clone());
        Box::new(move || {
            let mut answer = answer;
            let filled = disk.fill(unit.start, unit.end, |at, buf| {
                rt.block_on(blob.read_scattered(at, &mut [buf]))
                    .map_err(|e| {
                        DeviceError::Io(format!("reading {} at {at}: {e}", human(buf.len() as u64)))
                    })
            });
            answer.send(filled.map_err(|e| e.to_string()));
        })
    }
}

/// The fills in flight, and what the first that failed said.
struct Flight<'a> {
    rx: mpsc::Receiver<Outcome>,
    figures: &'a Warming,
    in_flight: usize,
    failed: Option<String>,
}

impl Flight<'_> {
    fn count(&mut self, (allocated, result): Outcome) {
        self.in_flight -= 1;
        match result {
            Ok(f) => self.figures.progressed(allocated, f.fetched, f.held),
            Err(e) => {
                self.failed.get_or_insert(e);
            }
        }
    }

    /// Waits for one fill in flight to end.
    fn wait_one(&mut self) {
        // Every job answers, run or dropped, and the warm-up holds a sender.
        if let Ok(o) = self.rx.recv() {
            self.count(o);
        }
    }

    /// Takes in the fills that ended, without waiting.
    fn take_done(&mut self) {
        while let Ok(o) = self.rx.try_recv() {
            self.count(o);
        }
    }
}

/// A fill's answer to the warm-up, sent once: what the fill did, or (when the
/// job is dropped unrun) that the fetch workers are gone.
struct Answer {
    tx: mpsc::Sender<Outcome>,
    allocated: u64,
    sent: bool,
}

impl Answer {
    fn send(&mut self, result: Result<Filled, String>) {
        self.sent = true;
        let _ = self.tx.send((self.allocated, result));
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if !self.sent {
            self.send(Err(
                "the fetch workers are not running (the drive is coming down)".into(),
            ));
        }
    }
}

impl Mounted {
    /// `mount --warm`: starts the warm-up once the mount is ready, in the
    /// background.
    pub(super) fn warm_at_mount(&self) {
        match &self.warmer {
            Some(w) => match w.start(Origin::Mount, self.req.warm_max_rate) {
                Ok(()) => info!("warming the disk cache in the background"),
                Err(e) => warn!("--warm: {e}"),
            },
            None => warn!("--warm: the drive is mounted without --disk-cache; nothing to warm"),
        }
    }

    /// Stops the warm-up, if one runs, and waits until none of its fills is
    /// in flight: the disk cache is final after it.
    pub(super) fn stop_warm_up(&self) {
        if let Some(w) = &self.warmer {
            w.stop();
            w.wait();
        }
    }
}

/// Serves a `warm` command (`args` after the word) on `conn`, on a thread of
/// its own: starts the warm-up, sends `progress STATUS` lines (JSON) while it
/// runs, and ends with `ok STATUS` or `error WHY`. The client going away (or
/// closing its side: Ctrl-C) stops the warm-up.
pub(super) fn serve_client(warmer: Option<Arc<Warmer>>, conn: UnixStream, args: &str) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let refuse = |mut conn: UnixStream, why: &str| {
        let _ = writeln!(conn, "error {why}");
    };
    let Some(warmer) = warmer else {
        return refuse(
            conn,
            "the drive is mounted without --disk-cache: a warm-up has nowhere to keep the data",
        );
    };
    let max_rate = match parse_args(args) {
        Ok(r) => r,
        Err(e) => return refuse(conn, &e),
    };
    if let Err(e) = warmer.start(Origin::Command, max_rate) {
        return refuse(conn, &e);
    }
    let spawned = std::thread::Builder::new()
        .name("blobdrive-warm-client".into())
        .spawn({
            let warmer = warmer.clone();
            move || follow(&warmer, conn)
        });
    if spawned.is_err() {
        warmer.stop();
    }
}

/// `max-rate=BYTES`, or nothing.
fn parse_args(args: &str) -> Result<Option<u64>, String> {
    match args.trim() {
        "" => Ok(None),
        a => a
            .strip_prefix("max-rate=")
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "warm takes max-rate=BYTES (a whole number above 0), not '{}'",
                    a.escape_debug()
                )
            }),
    }
}

/// Tells the client on `conn` how the warm-up goes until it ends; stops it if
/// the client goes away.
fn follow(warmer: &Warmer, mut conn: UnixStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let mut next = Instant::now() + PROGRESS_EVERY;
    let mut stopped = false;
    while warmer.running() {
        if stopped {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let tell = Instant::now() >= next;
        if client_gone(&mut conn) || (tell && !send(&mut conn, "progress", &warmer.status())) {
            warmer.stop();
            stopped = true;
        }
        if tell {
            next = Instant::now() + PROGRESS_EVERY;
        }
    }
    warmer.wait();
    let end = warmer.status();
    match &end.error {
        Some(e) => {
            let _ = writeln!(conn, "error {e}");
        }
        None => {
            send(&mut conn, "ok", &end);
        }
    }
}

/// Whether the client closed its side of `conn` (or it broke), waiting for
/// its word up to the connection's read timeout.
fn client_gone(conn: &mut UnixStream) -> bool {
    let mut buf = [0u8; 64];
    match conn.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// Sends `word STATUS` (JSON); whether the client took it.
fn send(conn: &mut UnixStream, word: &str, status: &WarmStatus) -> bool {
    let json = serde_json::to_string(status).unwrap_or_default();
    writeln!(conn, "{word} {json}").is_ok()
}

#[cfg(test)]
mod tests {
    use super::parse_args;

    #[test]
    fn the_command_takes_a_rate_or_nothing() {
        assert_eq!(parse_args(""), Ok(None));
        assert_eq!(parse_args(" max-rate=1048576 "), Ok(Some(1 << 20)));
        for bad in ["max-rate=0", "max-rate=1MiB", "fast", "max-rate=-1"] {
            assert!(parse_args(bad).is_err(), "{bad}");
        }
    }
}
