//! A few threads that answer FUSE requests which may wait a long time (see
//! `syncers.rs` and `writers.rs` for which, and why not on a FUSE thread).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

/// Such work needs little stack.
const STACK: usize = 256 * 1024;

/// `threads` threads doing `work` on each job sent, in turn; more jobs queue
/// (unbounded: each is one request the kernel sent, and the kernel bounds those).
pub struct Pool<J: Send + 'static> {
    jobs: Sender<J>,
    /// Set when the pool is dropped (its filesystem's FUSE session ended): jobs
    /// still queued are `refuse`d at once, not done, as nobody waits for them (a
    /// teardown after an aborted connection waited behind dozens of flushes).
    closed: Arc<AtomicBool>,
    refuse: fn(J),
}

impl<J: Send + 'static> Pool<J> {
    pub fn start(
        name: &str,
        threads: usize,
        work: impl Fn(J) + Send + Sync + 'static,
        refuse: fn(J),
    ) -> std::io::Result<Self> {
        let (jobs, rx) = channel::<J>();
        let rx = Arc::new(Mutex::new(rx));
        let closed = Arc::new(AtomicBool::new(false));
        let work = Arc::new(work);
        for i in 0..threads {
            let (rx, closed, work) = (rx.clone(), closed.clone(), work.clone());
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .stack_size(STACK)
                .spawn(move || loop {
                    // The lock is held only while waiting for a job, never while working.
                    let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    };
                    if closed.load(Ordering::SeqCst) {
                        refuse(job);
                    } else {
                        work(job);
                    }
                })?;
        }
        Ok(Pool {
            jobs,
            closed,
            refuse,
        })
    }

    /// Queues `job`; refused at once only when every thread is gone.
    pub fn send(&self, job: J) {
        if let Err(e) = self.jobs.send(job) {
            (self.refuse)(e.0);
        }
    }
}

impl<J: Send + 'static> Drop for Pool<J> {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}
