//! The page blob as a [`Backend`]: ranged reads, parallel Put Page runs carrying the
//! lease id, Clear Pages for discard, and fencing.
//!
//! Fencing: the first answer saying the lease is gone (412/409 lease codes) flips a
//! flag that no write ever passes again, so nothing is written without the lease,
//! not even a retry of a run that was in flight.
//!
//! Outages: one client operation gives up after its retry budget (25 s by
//! default), far shorter than the outages a storage service can have. Here an
//! operation that failed for want of an answer is tried again, as a disk retries
//! a command, until it succeeds or the outage is older than the I/O timeout (5
//! minutes by default; from then on each I/O fails after one try, until the
//! service answers again); during unmount it waits without limit, because the
//! cache then holds the only copy of the data. So a writer or fsync is slowed by
//! an outage, not failed, and [`Health`] says what it waits for.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tracing::{error, warn};

use super::health::{Failed, Health, HealthSnapshot, Pending};
use super::{first_error, Backend, DeviceError, LeaseLoss, MAX_GET};
use crate::azure::pipeline::SEQUENCE_REFUSED;
use crate::azure::{AzureError, BlobClient, WriteFence};

/// How long I/O waits through an outage unless `BLOBDRIVE_IO_TIMEOUT_SECS` says
/// otherwise (read by the command line, passed in as [`RemoteBackend::new`]'s
/// `io_timeout`): as long as a SCSI disk's command timeout is commonly set on
/// cloud VMs.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause between two operations that found the service unreachable (each already
/// retried with backoff inside the client).
const OUTAGE_PAUSE: Duration = Duration::from_secs(1);

/// Put Page calls in flight at once, over all concurrent flush units: enough to
/// fill a link, few enough to stay far below the per-blob request rate.
const PARALLEL: usize = 8;
/// Clear Pages is cheap per call but a huge range can time out server-side.
const MAX_CLEAR: u64 = 1024 * 1024 * 1024;

pub struct RemoteBackend {
    blob: BlobClient,
    lease: Option<String>,
    /// Every write carries the blob's sequence number, so that none the client
    /// gave up on can land after a newer one (see [`WriteFence`]).
    write_fence: Arc<WriteFence>,
    rt: Handle,
    fenced: Arc<LeaseLoss>,
    puts: Arc<Semaphore>,
    patience: Arc<Patience>,
}

/// How long an operation goes on through an outage.
struct Patience {
    io_timeout: Duration,
    /// How long one try past the I/O timeout may take: one request timeout.
    try_time: Duration,
    /// Set at unmount: wait for the service however long it takes.
    unbounded: AtomicBool,
    /// Set by `unmount --discard-dirty`: no I/O waits through an outage any more.
    give_up: AtomicBool,
    /// Since when writes have been refused for their sequence number, with no
    /// write landing since. Each refusal is an answer, not an outage, and is
    /// tried again at once; but once they have gone on for the I/O timeout
    /// (during unmount too) the refused I/O fails, so a service that refuses
    /// for ever cannot hold an fsync or an unmount for ever.
    refusing_since: std::sync::Mutex<Option<Instant>>,
    health: Arc<Health>,
}

impl RemoteBackend {
    /// `lease` is `None` for read-only mounts; every write is then refused.
    /// `io_timeout` bounds how long one I/O waits through an outage.
    pub fn new(
        blob: BlobClient,
        lease: Option<String>,
        rt: Handle,
        io_timeout: Duration,
    ) -> RemoteBackend {
        let try_time = blob.service().policy().request_timeout;
        RemoteBackend {
            write_fence: WriteFence::new(blob.clone(), lease.clone()),
            blob,
            lease,
            rt,
            fenced: Arc::new(LeaseLoss::default()),
            puts: Arc::new(Semaphore::new(PARALLEL)),
            patience: Arc::new(Patience {
                io_timeout,
                try_time,
                unbounded: AtomicBool::new(false),
                give_up: AtomicBool::new(false),
                refusing_since: std::sync::Mutex::new(None),
                health: Arc::new(Health::default()),
            }),
        }
    }

    /// Shared: whether (and when) the lease was lost.
    pub fn fence(&self) -> Arc<LeaseLoss> {
        self.fenced.clone()
    }

    /// The sequence-number fence every write of this backend carries: other writes
    /// under the same lease (a resize's) share it, so none of them given up on can
    /// land after a later write of the mount's.
    pub fn write_fence(&self) -> Arc<WriteFence> {
        self.write_fence.clone()
    }

    /// Whether the service answers, as this backend's operations found it, and
    /// why the latest failed attempt failed.
    pub fn health(&self) -> HealthSnapshot {
        self.patience
            .health
            .snapshot(self.blob.service().last_failure())
    }

    /// Whether I/O waits through an outage without limit (on during unmount: the
    /// cache then holds the only copy of what is not yet written).
    pub fn set_wait_without_limit(&self, on: bool) {
        self.patience.unbounded.store(on, Ordering::SeqCst);
    }

    /// How long I/O waits through an outage (`BLOBDRIVE_IO_TIMEOUT_SECS`).
    pub fn io_timeout(&self) -> Duration {
        self.patience.io_timeout
    }

    /// From now on an outage fails every I/O at once instead of being waited out
    /// (for good: `unmount --discard-dirty`, once nothing new can be written).
    pub fn stop_waiting(&self) {
        self.patience.give_up.store(true, Ordering::SeqCst);
    }

    /// Undoes [`Self::stop_waiting`] when the drive stays mounted after all (an
    /// `unmount --discard-dirty` refused because the filesystem is busy).
    pub fn resume_waiting(&self) {
        self.patience.give_up.store(false, Ordering::SeqCst);
    }

    pub fn blob(&self) -> &BlobClient {
        &self.blob
    }

    fn check_writable(&self) -> Result<&str, DeviceError> {
        if self.fenced.is_lost() {
            return Err(DeviceError::LeaseLost(
                "fenced after an earlier failure".into(),
            ));
        }
        self.lease.as_deref().ok_or(DeviceError::ReadOnly)
    }

    /// One ranged read of at most [`MAX_GET`] into `parts`, waiting through an
    /// outage; part of an I/O that was `issued` then.
    fn read_run(
        &self,
        issued: Instant,
        offset: u64,
        parts: &mut [&mut [u8]],
    ) -> Result<(), DeviceError> {
        self.rt.block_on(async {
            self.patience.check_given_up()?;
            let mut a = self.patience.begin(issued);
            loop {
                let deadline = self.patience.one_try(&mut a)?;
                let read = self.blob.read_scattered(offset, parts);
                let result = match deadline {
                    Some(d) => crate::azure::pipeline::one_try(d, read).await,
                    None => read.await,
                };
                match result {
                    Ok(()) => {
                        self.patience.succeeded(&a);
                        return Ok(());
                    }
                    Err(e) => self.patience.wait_or_fail(&mut a, &self.fenced, e).await?,
                }
            }
        })
    }
}

/// One I/O's way through an outage.
struct Attempt<'a> {
    started: Instant,
    /// Since when it has waited for an answer: its start, or the latest refusal.
    waiting_since: Instant,
    /// When its latest try started.
    tried: Instant,
    warned: bool,
    /// Counts as under way for [`Health`] until the I/O ends.
    _pending: Pending<'a>,
}

impl Patience {
    /// Once `unmount --discard-dirty` gave up on the service and it still does
    /// not answer, an I/O fails at once rather than after its own retries (25 s
    /// by default): the filesystem's last sync at unmount sends many, one after
    /// another, and each would wait that long for what is to be dropped anyway.
    fn check_given_up(&self) -> Result<(), DeviceError> {
        if !self.give_up.load(Ordering::SeqCst) {
            return Ok(());
        }
        match self.health.outage() {
            Some(why) => Err(DeviceError::Io(format!(
                "not sent: the storage service {} ({why}) and unmount --discard-dirty gave up on it",
                failing(self.health.garbled())
            ))),
            None => Ok(()),
        }
    }

    /// An I/O `issued` then (its runs or ranges may start later, queued behind
    /// the others) begins its way through an outage.
    fn begin(&self, issued: Instant) -> Attempt<'_> {
        Attempt {
            started: issued,
            waiting_since: issued,
            tried: issued,
            warned: false,
            _pending: self.health.begin(),
        }
    }

    /// Whether the outage is older than the I/O timeout, so an I/O gets one try.
    fn past_the_limit(&self) -> bool {
        !self.unbounded.load(Ordering::SeqCst)
            && self
                .health
                .failing_for()
                .is_some_and(|f| f >= self.io_timeout)
    }

    /// See [`Backend::fail_fast_since`].
    fn tried_since(&self, issued: Instant) -> Result<(), DeviceError> {
        if !self.past_the_limit() || !self.health.tried_and_failed_since(issued) {
            return Ok(());
        }
        let why = self.health.outage().unwrap_or_else(|| "no answer".into());
        Err(DeviceError::Io(format!(
            "not sent: the storage service {}, for longer than the I/O timeout ({} s) now, and a try made since this I/O was issued failed ({why})",
            failing(self.health.garbled()),
            self.io_timeout.as_secs()
        )))
    }

    /// Before each try of `a`: the time it must be over by when it is the one
    /// try an I/O gets past the I/O timeout (`None`: the retry budget bounds
    /// it), or the failure if a try already failed past it since the I/O was
    /// issued (a run of the same write queued behind the others, which failed).
    fn one_try(&self, a: &mut Attempt<'_>) -> Result<Option<Instant>, DeviceError> {
        a.tried = Instant::now();
        if !self.past_the_limit() {
            return Ok(None);
        }
        self.tried_since(a.started)?;
        Ok(Some(one_try_deadline(a.started, a.tried, self.try_time)))
    }

    fn succeeded(&self, a: &Attempt<'_>) {
        self.health.succeeded();
        *self
            .refusing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        if a.warned {
            warn!(
                "the storage service answers again after {:.0} s",
                a.started.elapsed().as_secs_f64()
            );
        }
    }

    /// After a failed operation: waits a moment if it is worth trying again (an
    /// outage, within the I/O timeout or without limit, lease still held), and
    /// otherwise returns the failure as the I/O's result.
    async fn wait_or_fail(
        &self,
        a: &mut Attempt<'_>,
        fenced: &LeaseLoss,
        e: AzureError,
    ) -> Result<(), DeviceError> {
        let refused = e.code() == Some(SEQUENCE_REFUSED);
        if refused {
            // A refusal is an answer: whatever outage there was is over (the
            // first write after a long one is often refused, see below), for
            // this I/O too: one that waited through it from before the I/O
            // timeout and is refused once the service is back (the late
            // increments of its abandoned attempts landing first) is sent
            // again, not failed for its age. That failure, a second after the
            // service came back, made ext4 abort its journal.
            self.health.succeeded();
            a.waiting_since = Instant::now();
            let since = *self
                .refusing_since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(a.waiting_since);
            if since.elapsed() >= self.io_timeout || self.give_up.load(Ordering::SeqCst) {
                return Err(DeviceError::Io(format!(
                    "the storage service answers, but has refused writes for their sequence number for {} s, though the number was read again from the blob before each try ({e})",
                    since.elapsed().as_secs()
                )));
            }
        } else {
            let how = if e.is_garbled() {
                Failed::Garbled
            } else {
                Failed::Unanswered
            };
            self.health
                .failed_try(a.waiting_since, a.tried, &e.to_string(), how);
        }
        // The I/O timeout counts from the start of the outage, not of this I/O:
        // once the service has failed everything for that long, each further I/O
        // fails after one try (as a disk's I/O fails fast once its path is gone)
        // instead of every close and fsync waiting out a whole timeout of its own.
        let outage = self
            .health
            .failing_for()
            .unwrap_or_default()
            .max(a.waiting_since.elapsed());
        let within = !self.give_up.load(Ordering::SeqCst)
            && (self.unbounded.load(Ordering::SeqCst) || outage < self.io_timeout);
        // A write the sequence-number fence refused was surely not carried out, so
        // sending it again is as safe as after an outage. The pipeline sends it
        // again itself while its retry budget lasts; one refused when that budget
        // was spent (the first attempt after a long outage, whose late increment
        // had moved the number on) would otherwise fail the I/O, and a failed
        // flush makes a filesystem abort its journal.
        if !(e.is_outage() || refused) || fenced.is_lost() || !within {
            return Err(map_error(fenced, e));
        }
        if refused {
            tokio::time::sleep(OUTAGE_PAUSE).await;
            return Ok(());
        }
        if !a.warned {
            warn!(
                "the storage service {} ({e}); I/O waits for it (up to {} s, without limit during unmount)",
                failing(e.is_garbled()),
                self.io_timeout.as_secs()
            );
            a.warned = true;
        }
        tokio::time::sleep(OUTAGE_PAUSE).await;
        Ok(())
    }

    /// Runs `op` until it succeeds, fails for a reason other than an outage, or the
    /// outage outlasts the I/O timeout.
    /// `issued`: when the I/O it is part of was issued.
    async fn run<T, F, Fut>(
        &self,
        issued: Instant,
        fenced: &LeaseLoss,
        mut op: F,
    ) -> Result<T, DeviceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AzureError>>,
    {
        self.check_given_up()?;
        let mut a = self.begin(issued);
        loop {
            let result = match self.one_try(&mut a)? {
                Some(deadline) => crate::azure::pipeline::one_try(deadline, op()).await,
                None => op().await,
            };
            match result {
                Ok(v) => {
                    self.succeeded(&a);
                    return Ok(v);
                }
                Err(e) => self.wait_or_fail(&mut a, fenced, e).await?,
            }
        }
    }
}

/// The least time the one try of an I/O past the I/O timeout is given, however
/// late it starts: enough for a service that answers again (a fresh connection,
/// the sequence number's raise and the write), where the try that came before
/// went out on a connection the outage left dead.
const LAST_TRY: Duration = Duration::from_secs(3);

/// When the one try past the I/O timeout of an I/O `issued` then, starting at
/// `tried`, ends: a request timeout (`try_time`) after the I/O was issued, the
/// time it waited for another flush's try counting (an fsync waited for one
/// under way, then made a try of its own: two and three request timeouts), or
/// [`LAST_TRY`] after it starts if that is later.
fn one_try_deadline(issued: Instant, tried: Instant, try_time: Duration) -> Instant {
    (issued + try_time).max(tried + LAST_TRY)
}

/// What the service does in an outage, in a message: it is silent, or its
/// answers come garbled (none used), which is no silence.
fn failing(garbled: bool) -> &'static str {
    if garbled {
        "gives no usable answer"
    } else {
        "does not answer"
    }
}

/// Turns a service error into a device error, fencing on lease loss.
pub fn map_error(fenced: &LeaseLoss, e: AzureError) -> DeviceError {
    if e.is_lease_lost() {
        if fenced.lose() {
            error!("LEASE LOST: {e}; no further writes will be sent, reads continue");
        }
        DeviceError::LeaseLost(e.to_string())
    } else {
        DeviceError::Io(e.to_string())
    }
}

impl Backend for RemoteBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.read_scattered(offset, &mut [buf])
    }

    /// Bodies stream straight into `parts`. Reads longer than [`MAX_GET`] go out
    /// as parallel ranged GETs of at most that, each waited for by its own thread.
    fn read_scattered(&self, offset: u64, parts: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        let issued = Instant::now();
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total as u64 <= MAX_GET {
            return self.read_run(issued, offset, parts);
        }
        let mut groups = ranged_gets(offset, parts, MAX_GET);
        let results: Vec<Result<(), DeviceError>> = std::thread::scope(|s| {
            let tasks: Vec<_> = groups
                .iter_mut()
                .map(|(at, group)| {
                    let at = *at;
                    s.spawn(move || self.read_run(issued, at, group))
                })
                .collect();
            tasks
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(DeviceError::Io("read thread failed".into())))
                })
                .collect()
        });
        results.into_iter().collect()
    }

    fn reads_scattered(&self) -> bool {
        true
    }

    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError> {
        first_error(self.write_each(runs))
    }

    /// Sends `runs` in parallel.
    fn write_each(&self, runs: Vec<(u64, Bytes)>) -> Vec<Result<(), DeviceError>> {
        self.write_blob(runs, Instant::now())
    }

    fn write_each_issued(
        &self,
        runs: Vec<(u64, Bytes)>,
        issued: Instant,
    ) -> Vec<Result<(), DeviceError>> {
        self.write_blob(runs, issued)
    }

    /// The data is left as it is: a flush that waited for another one (the
    /// background flusher's, another fsync's) had its one try made for it, and
    /// a second would double its wait.
    fn fail_fast_since(&self, issued: Instant) -> Result<(), DeviceError> {
        self.patience.tried_since(issued)
    }

    fn past_the_io_timeout(&self) -> bool {
        self.patience.past_the_limit()
    }

    /// Reads the blob's properties, as one try past the I/O timeout.
    fn probe(&self) -> Result<(), DeviceError> {
        self.rt
            .block_on(
                self.patience
                    .run(Instant::now(), &self.fenced, || self.blob.properties()),
            )
            .map(|_| ())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.discard_blob(offset, len)
    }
}

/// `parts` (consecutive from `offset`), cut where needed, in groups of at most
/// `max` bytes: one ranged GET each, with the offset it starts at.
fn ranged_gets<'a>(
    offset: u64,
    parts: &'a mut [&mut [u8]],
    max: u64,
) -> Vec<(u64, Vec<&'a mut [u8]>)> {
    let mut groups: Vec<(u64, Vec<&'a mut [u8]>)> = Vec::new();
    let (mut at, mut group_len) = (offset, 0);
    for part in parts.iter_mut() {
        for piece in part.chunks_mut(max as usize) {
            if groups.is_empty() || group_len + piece.len() as u64 > max {
                groups.push((at, Vec::new()));
                group_len = 0;
            }
            group_len += piece.len() as u64;
            at += piece.len() as u64;
            groups.last_mut().expect("pushed").1.push(piece);
        }
    }
    groups
}

impl RemoteBackend {
    /// Sends `runs`, part of an I/O `issued` then, in parallel; one result per
    /// run, in order.
    fn write_blob(&self, runs: Vec<(u64, Bytes)>, issued: Instant) -> Vec<Result<(), DeviceError>> {
        let lease = match self.check_writable() {
            Ok(l) => l.to_string(),
            Err(e) => return vec![Err(e); runs.len().max(1)],
        };
        let sem = self.puts.clone();
        let fenced = self.fenced.clone();
        let results =
            self.rt.block_on(async {
                let mut tasks = Vec::with_capacity(runs.len());
                for (offset, data) in runs {
                    let blob = self.blob.clone();
                    let lease = lease.clone();
                    let sem = sem.clone();
                    let fenced = fenced.clone();
                    let patience = self.patience.clone();
                    let wf = self.write_fence.clone();
                    tasks.push(tokio::spawn(async move {
                        let _permit = sem.acquire_owned().await.expect("semaphore open");
                        if fenced.is_lost() {
                            return Err(DeviceError::LeaseLost("fenced".into()));
                        }
                        patience
                            .run(issued, &fenced, || {
                                blob.put_pages_fenced(offset, data.clone(), Some(&lease), &wf)
                            })
                            .await
                    }));
                }
                let mut out = Vec::with_capacity(tasks.len());
                for t in tasks {
                    out.push(t.await.unwrap_or_else(|e| {
                        Err(DeviceError::Io(format!("write task failed: {e}")))
                    }));
                }
                out
            });
        results
    }

    fn discard_blob(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let lease = self.check_writable()?.to_string();
        let issued = Instant::now();
        let mut pos = offset;
        while pos < offset + len {
            let l = (offset + len - pos).min(MAX_CLEAR);
            let cleared = self
                .rt
                .block_on(self.patience.run(issued, &self.fenced, || {
                    self.blob
                        .clear_pages_fenced(pos, l, Some(&lease), &self.write_fence)
                }));
            if let Err(e) = cleared {
                // The last attempt may still be carried out, long after the cache
                // took the range back from the blob: fence it now, or it could
                // clear pages under bytes a read cached meanwhile.
                if let Err(f) = self.rt.block_on(self.write_fence.settle()) {
                    warn!("could not fence a Clear Pages that got no answer: {f}");
                }
                return Err(e);
            }
            pos += l;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
