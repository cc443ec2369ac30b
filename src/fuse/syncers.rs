//! fsync and close of `disk` are answered by these threads, not by a FUSE thread:
//! a flush waits for the storage service (without limit during an outage, up to
//! the I/O timeout otherwise), and with the loop device in direct-I/O mode the
//! filesystem above can have several flushes outstanding at once (journal commits,
//! fsync of several files). Held by FUSE threads, a few of them took every thread,
//! and then nothing else was answered, not even reads of cached data or `stats`.
//! Flushes run one at a time in the cache anyway (its flush lock); more threads
//! only let more of them wait without holding anything else up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use fuser::{Errno, ReplyEmpty};
use tracing::warn;

use crate::device::cache::Cache;
use crate::device::Backend;

/// Threads waiting on flushes at once; more flushes queue (unbounded: each is one
/// process's fsync or close, and holds no memory).
const SYNCERS: usize = 8;

/// A flush needs little stack.
const STACK: usize = 256 * 1024;

/// Threads that answer fsync and close.
pub struct Syncers {
    jobs: Sender<ReplyEmpty>,
    /// Set when the filesystem is dropped (its FUSE session ended): what is still
    /// queued is answered with EIO at once, not flushed, as nobody waits for it
    /// (flushing it first kept a teardown waiting behind dozens of them).
    closed: Arc<AtomicBool>,
}

impl Drop for Syncers {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Syncers {
    pub fn start<B: Backend>(cache: Arc<Cache<B>>) -> std::io::Result<Self> {
        let (jobs, rx) = channel::<ReplyEmpty>();
        let rx = Arc::new(Mutex::new(rx));
        let closed = Arc::new(AtomicBool::new(false));
        for i in 0..SYNCERS {
            let (cache, rx, closed) = (cache.clone(), rx.clone(), closed.clone());
            std::thread::Builder::new()
                .name(format!("sync-{i}"))
                .stack_size(STACK)
                .spawn(move || work(&cache, &rx, &closed))?;
        }
        Ok(Syncers { jobs, closed })
    }

    /// Queues a flush of everything dirty; `reply` is answered when it is done.
    pub fn flush(&self, reply: ReplyEmpty) {
        if let Err(e) = self.jobs.send(reply) {
            // Only when every thread is gone (the daemon is ending).
            e.0.error(Errno::EIO);
        }
    }
}

fn work<B: Backend>(cache: &Cache<B>, rx: &Mutex<Receiver<ReplyEmpty>>, closed: &AtomicBool) {
    loop {
        // The lock is held only while waiting for a job, never while working.
        let reply = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(reply) => reply,
            Err(_) => return,
        };
        if closed.load(Ordering::SeqCst) {
            reply.error(Errno::EIO);
            continue;
        }
        match cache.flush() {
            Ok(()) => reply.ok(),
            Err(e) => {
                warn!("flush failed: {e}");
                reply.error(Errno::from_i32(e.errno()));
            }
        }
    }
}
