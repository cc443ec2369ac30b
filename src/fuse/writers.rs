//! Writes that must wait for room in the cache are answered by these threads, not
//! by a FUSE thread. Past the dirty limit a write waits until dirty data is on the
//! blob, for as long as an outage lasts (up to the I/O timeout): held by FUSE
//! threads, four such writes (the loop device sends many at once) took every
//! thread, and reads of cached data and `stats` waited behind them. A write with
//! room goes in on its FUSE thread at once; only one that would wait comes here,
//! with a copy of its bytes.

use std::sync::Arc;

use fuser::{Errno, ReplyWrite};

use crate::device::cache::Cache;
use crate::device::Backend;
use crate::pool::Pool;

/// Threads waiting for room at once; more writes queue behind them (each holds
/// at most one FUSE request's bytes, 1 MiB, and the kernel bounds how many it has
/// outstanding).
const WRITERS: usize = 8;

/// One write to make once there is room, and its answer.
struct Job {
    offset: u64,
    data: Vec<u8>,
    reply: ReplyWrite,
}

/// Threads that make writes which must wait for room.
pub struct Writers(Pool<Job>);

impl Writers {
    pub fn start<B: Backend>(cache: Arc<Cache<B>>) -> std::io::Result<Self> {
        let work = move |job: Job| match cache.write(job.offset, &job.data) {
            Ok(()) => job.reply.written(job.data.len() as u32),
            Err(e) => job.reply.error(super::failed_write(
                &cache,
                format_args!("write of {} bytes at {}", job.data.len(), job.offset),
                &e,
            )),
        };
        // A write still queued when the session ended was never acknowledged.
        Pool::start("write", WRITERS, work, |job| job.reply.error(Errno::EIO)).map(Writers)
    }

    /// Queues a write of `data` at `offset`; `reply` is answered once it is in.
    pub fn write(&self, offset: u64, data: Vec<u8>, reply: ReplyWrite) {
        self.0.send(Job {
            offset,
            data,
            reply,
        });
    }
}
