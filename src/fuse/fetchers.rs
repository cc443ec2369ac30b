//! Fetch workers: reads that must wait for the storage service run here, not on a
//! FUSE thread, so a round trip never stops the daemon from taking the next
//! request. With asynchronous direct I/O (`FUSE_ASYNC_DIO`) the kernel sends a
//! process's queued reads (libaio, io_uring, a loop device in direct-I/O mode) all
//! at once; each that misses the cache becomes a job here, and as many fetches are
//! in flight as there are workers. A read the cache can answer is answered on the
//! FUSE thread itself: a hand-off would only add latency to it.
//!
//! The workers start as reads come and end when idle ([`Pool`]): an idle mount
//! holds none. (Started all at once and kept, so as not to change the order a
//! mounting ext4's reads arrive in, they made 64 of an idle mount's 93 threads;
//! the read-ahead no longer grows on those reads, and mounting fetches the same
//! 512 KiB either way.)
//!
//! The workers are plain threads because the cache's read path blocks (on its lock,
//! on other fetches, on the backend's runtime); a large read's buffer comes from a
//! small shared pool ([`POOL_KEEP`] idle buffers of 1 MiB: a fresh allocation of
//! 1 MiB per read cost page faults and zeroing, a visible share of the daemon's
//! CPU in a cold sequential read), so idle workers hold no memory of their own, and
//! the bytes handed to them at once are capped ([`MAX_BYTES`]) so the daemon's fixed
//! overhead stays bounded: past the cap a read is served on its FUSE thread.
//!
//! The same workers do the daemon's background fetches (a warm-up of the disk
//! cache: [`BackgroundFetches`]), behind every read waiting for them and at most
//! [`BACKGROUND`] at once, so the rest of the workers are always there for reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fuser::{Errno, ReplyData};

use crate::device::bufpool::BufPool;
use crate::device::cache::Cache;
use crate::device::Backend;
use crate::pool::{Background, Pool};

/// Fetches in flight at once. Past the queue depth applications use (32) with
/// room for read-ahead and a loop device's own queue; the kernel is told to send
/// as many background requests (`max_background`).
pub const WORKERS: usize = 64;

/// Bytes of reads handed to the workers at once (their buffers): 32 MiB, room for
/// 32 reads of 1 MiB (the largest FUSE sends) or thousands of small ones.
const MAX_BYTES: usize = 32 << 20;

/// The largest read FUSE sends (its default of 256 pages): the pooled buffers' size.
const POOLED: usize = 1 << 20;

/// Idle read buffers kept between jobs.
const POOL_KEEP: usize = 8;

/// Background fetches running at once, at most: the warm-up's ranged reads in
/// flight, which leave the other workers to the application's reads.
pub const BACKGROUND: usize = 4;

struct Read {
    offset: u64,
    len: usize,
    reply: ReplyData,
}

/// Work for the daemon that nobody waits on: it runs only while no read waits.
pub type BackgroundJob = Box<dyn FnOnce() + Send>;

enum Job {
    Read(Read),
    Background(BackgroundJob),
}

/// A pool of threads answering reads that miss the cache.
pub struct Fetchers {
    pool: Pool<Job>,
    /// Bytes of the jobs queued or being served.
    bytes: Arc<AtomicUsize>,
}

/// Where the daemon hands background work to the fetch workers. It holds
/// nothing until the FUSE session starts them, and refuses work once they are
/// gone (the drive is coming down).
#[derive(Clone, Default)]
pub struct BackgroundFetches(Arc<OnceLock<Background<Job>>>);

impl BackgroundFetches {
    /// Queues `job` behind every read; gives it back when the workers are not
    /// there (not yet started within `wait`, or gone).
    pub fn run(&self, job: BackgroundJob, wait: Duration) -> Result<(), BackgroundJob> {
        let until = Instant::now() + wait;
        let lane = loop {
            if let Some(lane) = self.0.get() {
                break lane;
            }
            if Instant::now() >= until {
                return Err(job);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        lane.send(Job::Background(job)).map_err(|j| match j {
            Job::Background(job) => job,
            Job::Read(_) => unreachable!("only background jobs are sent here"),
        })
    }
}

impl Fetchers {
    /// Starts the workers (as reads come) over `cache`; `background` is where
    /// the daemon's background work reaches them from now on.
    pub fn start<B: Backend>(
        cache: Arc<Cache<B>>,
        background: &BackgroundFetches,
    ) -> std::io::Result<Self> {
        let bytes = Arc::new(AtomicUsize::new(0));
        let buffers = BufPool::new(POOLED, POOL_KEEP);
        let done = bytes.clone();
        let work = move |job: Job| match job {
            Job::Read(read) => {
                let len = read.len;
                fetch(&cache, &buffers, read);
                done.fetch_sub(len, Ordering::SeqCst);
            }
            Job::Background(job) => job(),
        };
        // Bounded: FUSE threads block (and the kernel queues) once every worker
        // is busy and as many jobs again wait, so memory stays bounded too.
        let pool = Pool::start("fetch", WORKERS, work, |job: Job| match job {
            Job::Read(read) => read.reply.error(Errno::EIO),
            // Dropped: whoever sent it learns from the job's own channel.
            Job::Background(_) => {}
        })?
        .bounded(WORKERS)
        .with_background(BACKGROUND);
        let _ = background.0.set(pool.background());
        Ok(Fetchers { pool, bytes })
    }

    /// Queues a read, whose reply is sent when the fetch is done; or, when the
    /// workers already hold [`MAX_BYTES`], gives it back to be served by the caller.
    pub fn read(&self, offset: u64, len: usize, reply: ReplyData) -> Option<ReplyData> {
        let before = self.bytes.fetch_add(len, Ordering::SeqCst);
        if before > 0 && before + len > MAX_BYTES {
            self.bytes.fetch_sub(len, Ordering::SeqCst);
            return Some(reply);
        }
        self.pool.send(Job::Read(Read { offset, len, reply }));
        None
    }
}

/// Serves one read. Large reads (a sequential stream's) take a pooled buffer;
/// small ones (a random read's) a plain allocation, which the heap serves
/// cheaply.
fn fetch<B: Backend>(cache: &Cache<B>, buffers: &BufPool, job: Read) {
    let mut buf = buffers.take_filled(job.len);
    match cache.read(job.offset, &mut buf) {
        Ok(()) => job.reply.data(&buf),
        Err(e) => job.reply.error(super::failed(
            cache,
            format_args!("read {} bytes at {}", job.len, job.offset),
            &e,
        )),
    }
    buffers.give(buf);
}
