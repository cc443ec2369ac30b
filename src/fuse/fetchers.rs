//! Fetch workers: reads that must wait for the storage service run here, not on a
//! FUSE thread, so a round trip never stops the daemon from taking the next
//! request. With asynchronous direct I/O (`FUSE_ASYNC_DIO`) the kernel sends a
//! process's queued reads (libaio, io_uring, a loop device in direct-I/O mode) all
//! at once; each that misses the cache becomes a job here, and as many fetches are
//! in flight as there are workers. A read the cache can answer is answered on the
//! FUSE thread itself: a hand-off would only add latency to it.
//!
//! The workers are plain threads because the cache's read path blocks (on its lock,
//! on other fetches, on the backend's runtime); a large read's buffer comes from a
//! small shared pool ([`POOL_KEEP`] idle buffers of 1 MiB: a fresh allocation of
//! 1 MiB per read cost page faults and zeroing, a visible share of the daemon's
//! CPU in a cold sequential read), so idle workers hold no memory of their own, and
//! the bytes handed to them at once are capped ([`MAX_BYTES`]) so the daemon's fixed
//! overhead stays bounded: past the cap a read is served on its FUSE thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use fuser::{Errno, ReplyData};
use tracing::warn;

use crate::device::bufpool::BufPool;
use crate::device::cache::Cache;
use crate::device::Backend;

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

/// Stack of a worker: the read path needs little, and 64 default 8 MiB stacks
/// would only inflate the address space.
const STACK: usize = 256 * 1024;

struct Job {
    offset: u64,
    len: usize,
    reply: ReplyData,
}

/// A pool of threads answering reads that miss the cache.
pub struct Fetchers {
    jobs: SyncSender<Job>,
    /// Bytes of the jobs queued or being served.
    bytes: Arc<AtomicUsize>,
}

impl Fetchers {
    pub fn start<B: Backend>(cache: Arc<Cache<B>>) -> std::io::Result<Self> {
        // Bounded: FUSE threads block (and the kernel queues) once every worker
        // is busy and as many jobs again wait, so memory stays bounded too.
        let (jobs, rx) = sync_channel::<Job>(WORKERS);
        let rx = Arc::new(Mutex::new(rx));
        let bytes = Arc::new(AtomicUsize::new(0));
        let pool = BufPool::new(POOLED, POOL_KEEP);
        for i in 0..WORKERS {
            let (cache, rx, bytes, pool) = (cache.clone(), rx.clone(), bytes.clone(), pool.clone());
            std::thread::Builder::new()
                .name(format!("fetch-{i}"))
                .stack_size(STACK)
                .spawn(move || work(&cache, &rx, &bytes, &pool))?;
        }
        Ok(Fetchers { jobs, bytes })
    }

    /// Queues a read, whose reply is sent when the fetch is done; or, when the
    /// workers already hold [`MAX_BYTES`], gives it back to be served by the caller.
    pub fn read(&self, offset: u64, len: usize, reply: ReplyData) -> Option<ReplyData> {
        let before = self.bytes.fetch_add(len, Ordering::SeqCst);
        if before > 0 && before + len > MAX_BYTES {
            self.bytes.fetch_sub(len, Ordering::SeqCst);
            return Some(reply);
        }
        if let Err(e) = self.jobs.send(Job { offset, len, reply }) {
            // Only when every worker is gone (the daemon is ending).
            self.bytes.fetch_sub(len, Ordering::SeqCst);
            e.0.reply.error(Errno::EIO);
        }
        None
    }
}

fn work<B: Backend>(
    cache: &Cache<B>,
    rx: &Mutex<Receiver<Job>>,
    bytes: &AtomicUsize,
    pool: &BufPool,
) {
    loop {
        // The lock is held only while waiting for a job, never while working.
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        // Large reads (a sequential stream's) take a pooled buffer; small ones (a
        // random read's) a plain allocation, which the heap serves cheaply.
        let mut buf = pool.take_filled(job.len);
        match cache.read(job.offset, &mut buf) {
            Ok(()) => job.reply.data(&buf),
            Err(e) => {
                warn!("read {} bytes at {} failed: {e}", job.len, job.offset);
                job.reply.error(Errno::from_i32(cache.answered_error(&e)));
            }
        }
        pool.give(buf);
        bytes.fetch_sub(job.len, Ordering::SeqCst);
    }
}
