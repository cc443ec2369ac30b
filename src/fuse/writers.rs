//! Writes that must wait for room in the cache are answered by these threads, not
//! by a FUSE thread. Past the dirty limit a write waits until dirty data is on the
//! blob, for as long as an outage lasts (up to the I/O timeout): held by FUSE
//! threads, four such writes (the loop device sends many at once) took every
//! thread, and reads of cached data and `stats` waited behind them. A write with
//! room goes in on its FUSE thread at once; only one that would wait comes here,
//! with a copy of its bytes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use fuser::{Errno, ReplyWrite};
use tracing::warn;

use crate::device::cache::Cache;
use crate::device::Backend;

/// Threads waiting for room at once; more writes queue behind them (each holds
/// at most one FUSE request's bytes, 1 MiB, and the kernel bounds how many it has
/// outstanding).
const WRITERS: usize = 8;

/// A write needs little stack.
const STACK: usize = 256 * 1024;

/// One write to make once there is room, and its answer.
struct Job {
    offset: u64,
    data: Vec<u8>,
    reply: ReplyWrite,
}

/// Threads that make writes which must wait for room.
pub struct Writers {
    jobs: Sender<Job>,
    /// Set when the filesystem is dropped (its FUSE session ended): writes still
    /// queued were never acknowledged and nobody waits for them, so they are
    /// dropped with EIO rather than made.
    closed: Arc<AtomicBool>,
}

impl Drop for Writers {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

impl Writers {
    pub fn start<B: Backend>(cache: Arc<Cache<B>>) -> std::io::Result<Self> {
        let (jobs, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let closed = Arc::new(AtomicBool::new(false));
        for i in 0..WRITERS {
            let (cache, rx, closed) = (cache.clone(), rx.clone(), closed.clone());
            std::thread::Builder::new()
                .name(format!("write-{i}"))
                .stack_size(STACK)
                .spawn(move || work(&cache, &rx, &closed))?;
        }
        Ok(Writers { jobs, closed })
    }

    /// Queues a write of `data` at `offset`; `reply` is answered once it is in.
    pub fn write(&self, offset: u64, data: Vec<u8>, reply: ReplyWrite) {
        if let Err(e) = self.jobs.send(Job {
            offset,
            data,
            reply,
        }) {
            // Only when every thread is gone (the daemon is ending).
            e.0.reply.error(Errno::EIO);
        }
    }
}

fn work<B: Backend>(cache: &Cache<B>, rx: &Mutex<Receiver<Job>>, closed: &AtomicBool) {
    loop {
        // The lock is held only while waiting for a job, never while working.
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        if closed.load(Ordering::SeqCst) {
            job.reply.error(Errno::EIO);
            continue;
        }
        match cache.write(job.offset, &job.data) {
            Ok(()) => job.reply.written(job.data.len() as u32),
            Err(e) => {
                warn!(
                    "write of {} bytes at {} failed: {e}",
                    job.data.len(),
                    job.offset
                );
                job.reply.error(Errno::from_i32(e.errno()));
            }
        }
    }
}
