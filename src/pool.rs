//! Threads for work that may wait a long time: the FUSE requests that must not
//! hold a FUSE thread (see `fuse/fetchers.rs`, `syncers.rs` and `writers.rs`)
//! and the cache's read-ahead (`device/cache/readahead.rs`).
//!
//! Threads are started as jobs come and end after [`IDLE_EXIT`] without one, so
//! an idle mount holds none of them: a node that serves dozens of drives, most
//! of them idle, pays for the threads of the busy ones only. (Pools of fixed
//! threads made one idle mount cost 108 threads, then 93.)

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Such work needs little stack.
const STACK: usize = 256 * 1024;

/// How long a thread waits for a job before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(10);

/// At most `threads` threads doing `work` on each job sent, in turn. More jobs
/// queue: without limit by default (each is one request the kernel sent, and the
/// kernel bounds those), or up to [`Pool::bounded`], past which `send` waits.
pub struct Pool<J: Send + 'static> {
    shared: Arc<Shared<J>>,
}

struct Shared<J> {
    name: String,
    max_threads: usize,
    queue_max: Option<usize>,
    /// How long a thread waits for a job before it ends.
    idle_exit: Duration,
    work: Box<dyn Fn(J) + Send + Sync>,
    /// For jobs nobody will wait for any more: the pool was dropped (its
    /// filesystem's FUSE session ended), so jobs still queued are refused at
    /// once, not done (a teardown after an aborted connection waited behind
    /// dozens of flushes); or no thread could be started.
    refuse: fn(J),
    state: Mutex<State<J>>,
    /// A job was queued, or the pool closed.
    job_ready: Condvar,
    /// A job was taken off a bounded queue.
    room: Condvar,
}

struct State<J> {
    queue: VecDeque<J>,
    threads: usize,
    idle: usize,
    closed: bool,
    started: usize,
}

impl<J: Send + 'static> Pool<J> {
    /// A pool of at most `threads` threads; none is started until a job comes.
    pub fn start(
        name: &str,
        threads: usize,
        work: impl Fn(J) + Send + Sync + 'static,
        refuse: fn(J),
    ) -> std::io::Result<Self> {
        Ok(Pool {
            shared: Arc::new(Shared {
                name: name.to_string(),
                max_threads: threads.max(1),
                queue_max: None,
                idle_exit: IDLE_EXIT,
                work: Box::new(work),
                refuse,
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    closed: false,
                    started: 0,
                }),
                job_ready: Condvar::new(),
                room: Condvar::new(),
            }),
        })
    }

    /// Lets at most `max` jobs wait; `send` then blocks until one is taken, so
    /// what waiting jobs hold stays bounded.
    pub fn bounded(mut self, max: usize) -> Self {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.queue_max = Some(max.max(1));
        }
        self
    }

    /// Ends an idle thread after `after` instead of [`IDLE_EXIT`].
    #[cfg(test)]
    fn idle_exit(mut self, after: Duration) -> Self {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.idle_exit = after;
        }
        self
    }

    /// Queues `job`, starting a thread for it when none is idle and fewer than
    /// the most run; refused at once only when the pool is closed or no thread
    /// could be started at all.
    pub fn send(&self, job: J) {
        let s = &self.shared;
        let mut st = s.lock();
        if let Some(max) = s.queue_max {
            while st.queue.len() >= max && !st.closed {
                st = s.room.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        if st.closed {
            drop(st);
            return (s.refuse)(job);
        }
        st.queue.push_back(job);
        if st.idle > 0 {
            s.job_ready.notify_one();
            return;
        }
        if st.threads < s.max_threads {
            let n = st.started;
            match Shared::spawn(s, n) {
                Ok(()) => {
                    st.threads += 1;
                    st.started += 1;
                }
                Err(e) => {
                    tracing::warn!("cannot start a {} thread: {e}", s.name);
                    if st.threads == 0 {
                        // Nobody would ever take it.
                        let job = st.queue.pop_back().expect("just queued");
                        drop(st);
                        (s.refuse)(job);
                    }
                }
            }
        }
    }

    /// Threads running now.
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.shared.lock().threads
    }
}

impl<J: Send + 'static> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn(this: &Arc<Shared<J>>, n: usize) -> std::io::Result<()> {
        let shared = this.clone();
        std::thread::Builder::new()
            .name(format!("{}-{n}", this.name))
            .stack_size(STACK)
            .spawn(move || shared.run())
            .map(drop)
    }

    /// A thread's life: jobs as they come, until none came for `idle_exit` or
    /// the pool closed with nothing queued.
    fn run(&self) {
        let mut st = self.lock();
        loop {
            if let Some(job) = st.queue.pop_front() {
                let closed = st.closed;
                drop(st);
                self.room.notify_one();
                if closed {
                    (self.refuse)(job);
                } else {
                    (self.work)(job);
                }
                st = self.lock();
                continue;
            }
            if st.closed {
                break;
            }
            st.idle += 1;
            let (next, waited) = self
                .job_ready
                .wait_timeout(st, self.idle_exit)
                .unwrap_or_else(|p| p.into_inner());
            st = next;
            let timed_out = waited.timed_out();
            st.idle -= 1;
            if timed_out && st.queue.is_empty() {
                break;
            }
        }
        st.threads -= 1;
    }
}

impl<J: Send + 'static> Drop for Pool<J> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.closed = true;
        drop(st);
        self.shared.job_ready.notify_all();
        self.shared.room.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn threads_start_with_load_up_to_the_most_and_end_when_idle() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let pool = Pool::start(
            "t",
            4,
            move |_: u32| {
                std::thread::sleep(Duration::from_millis(20));
                d.fetch_add(1, Ordering::SeqCst);
            },
            |_| panic!("refused"),
        )
        .unwrap()
        .idle_exit(Duration::from_millis(200));
        assert_eq!(pool.threads(), 0, "no thread before a job");
        for i in 0..100 {
            pool.send(i);
        }
        let busy = pool.threads();
        assert!((2..=4).contains(&busy), "{busy} threads");
        wait_until("all jobs", || done.load(Ordering::SeqCst) == 100);
        wait_until("idle threads to end", || pool.threads() == 0);
        // And start again when work comes back.
        pool.send(0);
        wait_until("one more job", || done.load(Ordering::SeqCst) == 101);
    }

    #[test]
    fn a_bounded_queue_makes_the_sender_wait_and_loses_nothing() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        let pool = Pool::start(
            "b",
            2,
            move |_: u32| {
                std::thread::sleep(Duration::from_millis(5));
                d.fetch_add(1, Ordering::SeqCst);
            },
            |_| panic!("refused"),
        )
        .unwrap()
        .bounded(3);
        for i in 0..50 {
            pool.send(i);
            assert!(pool.shared.lock().queue.len() <= 3);
        }
        wait_until("all jobs", || done.load(Ordering::SeqCst) == 50);
    }

    #[test]
    fn jobs_queued_when_the_pool_is_dropped_are_refused() {
        static REFUSED: AtomicUsize = AtomicUsize::new(0);
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let g = gate.clone();
        let pool = Pool::start(
            "d",
            1,
            move |_: u32| drop(g.lock().unwrap()),
            |_| {
                REFUSED.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        for i in 0..5 {
            pool.send(i);
        }
        let shared = pool.shared.clone();
        drop(pool);
        drop(held);
        wait_until("the thread to end", || shared.lock().threads == 0);
        // At most the first job was taken before the drop; the rest were refused.
        assert!(REFUSED.load(Ordering::SeqCst) >= 4);
    }
}
