//! fsync and close of `disk` are answered by these threads, not by a FUSE thread:
//! a flush waits for the storage service (without limit during an outage, up to
//! the I/O timeout otherwise), and with the loop device in direct-I/O mode the
//! filesystem above can have several flushes outstanding at once (journal commits,
//! fsync of several files). Held by FUSE threads, a few of them took every thread,
//! and then nothing else was answered, not even reads of cached data or `stats`.
//! Flushes run one at a time in the cache anyway (its flush lock); more threads
//! only let more of them wait without holding anything else up.

use std::sync::Arc;

use fuser::{Errno, ReplyEmpty};

use crate::device::cache::Cache;
use crate::device::Backend;
use crate::pool::Pool;

/// Threads waiting on flushes at once; more flushes queue (each is one process's
/// fsync or close, and holds no memory).
const SYNCERS: usize = 8;

/// Threads that answer fsync and close.
pub struct Syncers(Pool<ReplyEmpty>);

impl Syncers {
    pub fn start<B: Backend>(cache: Arc<Cache<B>>) -> std::io::Result<Self> {
        let work = move |reply: ReplyEmpty| match cache.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(super::failed_write(&cache, format_args!("flush"), &e)),
        };
        Pool::start("sync", SYNCERS, work, |reply| reply.error(Errno::EIO)).map(Syncers)
    }

    /// Queues a flush of everything dirty; `reply` is answered when it is done.
    pub fn flush(&self, reply: ReplyEmpty) {
        self.0.send(reply);
    }
}
