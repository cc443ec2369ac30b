//! Threads for work that may wait a long time: the FUSE requests that must not
//! hold a FUSE thread (see `fuse/fetchers.rs`, `syncers.rs` and `writers.rs`)
//! and the cache's read-ahead (`device/cache/readahead.rs`).
//!
//! Threads are started as jobs come and end after [`IDLE_EXIT`] without one, so
//! an idle mount holds none of them: a node that serves dozens of drives, most
//! of them idle, pays for the threads of the busy ones only. (Pools of fixed
//! threads made one idle mount cost 108 threads, then 93.)
//!
//! A pool may also take background jobs ([`Pool::with_background`]): work that
//! nobody waits for (a warm-up of the disk cache), done by the same threads but
//! only when no ordinary job waits, and by a few of them at most, so the
//! ordinary jobs (an application's reads) keep the rest and go first.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
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
    /// Background jobs running at once, at most.
    background_max: usize,
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
    /// Background jobs, taken only while `queue` is empty.
    background: VecDeque<J>,
    /// Background jobs being done now.
    background_running: usize,
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
                background_max: 0,
                idle_exit: IDLE_EXIT,
                work: Box::new(work),
                refuse,
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    background: VecDeque::new(),
                    background_running: 0,
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

    /// Lets the pool take background jobs ([`Pool::background`]), at most `max`
    /// of them running at once.
    pub fn with_background(mut self, max: usize) -> Self {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.background_max = max.max(1);
        }
        self
    }

    /// Where background jobs are sent; it does not keep the pool alive.
    pub fn background(&self) -> Background<J> {
        Background(Arc::downgrade(&self.shared))
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
        if let Some(job) = Shared::wake_or_start(s, &mut st, |st| st.queue.pop_back()) {
            drop(st);
            (s.refuse)(job);
        }
    }

    /// Threads running now.
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.shared.lock().threads
    }
}

/// Sends background jobs to a pool (see [`Pool::with_background`]).
pub struct Background<J>(Weak<Shared<J>>);

impl<J> Clone for Background<J> {
    fn clone(&self) -> Self {
        Background(self.0.clone())
    }
}

impl<J: Send + 'static> Background<J> {
    /// Queues `job` behind every ordinary job; gives it back when the pool is
    /// gone or closed, or no thread could be started to do it.
    pub fn send(&self, job: J) -> Result<(), J> {
        let Some(s) = self.0.upgrade() else {
            return Err(job);
        };
        let mut st = s.lock();
        if st.closed || s.background_max == 0 {
            return Err(job);
        }
        st.background.push_back(job);
        if st.background_running >= s.background_max {
            // A thread finishing a background job takes it.
            return Ok(());
        }
        match Shared::wake_or_start(&s, &mut st, |st| st.background.pop_back()) {
            Some(job) => Err(job),
            None => Ok(()),
        }
    }
}

impl<J: Send + 'static> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes an idle thread for the job just queued, or starts one when none is
    /// idle and fewer than the most run. When no thread runs and none can be
    /// started, nobody would ever take the job: it is taken back out (with
    /// `take_back`) and returned.
    fn wake_or_start(
        this: &Arc<Shared<J>>,
        st: &mut State<J>,
        take_back: impl FnOnce(&mut State<J>) -> Option<J>,
    ) -> Option<J> {
        if st.idle > 0 {
            this.job_ready.notify_one();
            return None;
        }
        if st.threads >= this.max_threads {
            return None;
        }
        match Shared::spawn(this, st.started) {
            Ok(()) => {
                st.threads += 1;
                st.started += 1;
                None
            }
            Err(e) => {
                tracing::warn!("cannot start a {} thread: {e}", this.name);
                if st.threads == 0 {
                    take_back(st)
                } else {
                    None
                }
            }
        }
    }

    /// The next job a thread may take: an ordinary one first, else a background
    /// one while fewer than the most run (`true` with it).
    fn next_job(&self, st: &mut State<J>) -> Option<(J, bool)> {
        if let Some(job) = st.queue.pop_front() {
            return Some((job, false));
        }
        if st.background_running < self.background_max {
            if let Some(job) = st.background.pop_front() {
                st.background_running += 1;
                return Some((job, true));
            }
        }
        None
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
            if let Some((job, background)) = self.next_job(&mut st) {
                let closed = st.closed;
                drop(st);
                if !background {
                    self.room.notify_one();
                }
                if closed {
                    (self.refuse)(job);
                } else {
                    (self.work)(job);
                }
                st = self.lock();
                if background {
                    st.background_running -= 1;
                }
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
            let takeable = !st.queue.is_empty()
                || (!st.background.is_empty() && st.background_running < self.background_max);
            if timed_out && !takeable {
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
        // Nobody waits for background jobs: those not begun are refused now,
        // not left for threads that may be busy for a while yet.
        let background = std::mem::take(&mut st.background);
        drop(st);
        self.shared.job_ready.notify_all();
        self.shared.room.notify_all();
        background.into_iter().for_each(self.shared.refuse);
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
    fn background_jobs_wait_for_ordinary_ones_and_run_few_at_a_time() {
        // Jobs are numbers: below 100 ordinary, from 100 background.
        let started = Arc::new(Mutex::new(Vec::new()));
        let running_bg = Arc::new(AtomicUsize::new(0));
        let most_bg = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        // What each background job saw queued of the ordinary ones as it
        // began, read from the pool itself: the order jobs record themselves
        // in is not the order threads took them (a thread that took the last
        // ordinary job may record it after another began a background one).
        let pool_state = Arc::new(std::sync::OnceLock::<std::sync::Weak<Shared<u32>>>::new());
        let waiting_at_bg = Arc::new(Mutex::new(Vec::new()));
        let (s, r, m, g, ps, w) = (
            started.clone(),
            running_bg.clone(),
            most_bg.clone(),
            gate.clone(),
            pool_state.clone(),
            waiting_at_bg.clone(),
        );
        let pool = Pool::start(
            "bg",
            3,
            move |job: u32| {
                s.lock().unwrap().push(job);
                if job >= 100 {
                    let shared = ps.get().and_then(std::sync::Weak::upgrade);
                    let queued = shared.map_or(usize::MAX, |sh| sh.lock().queue.len());
                    w.lock().unwrap().push(queued);
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    r.fetch_sub(1, Ordering::SeqCst);
                } else {
                    drop(g.lock().unwrap());
                }
            },
            |_| panic!("refused"),
        )
        .unwrap()
        .with_background(2);
        pool_state.set(Arc::downgrade(&pool.shared)).unwrap();
        let bg = pool.background();
        // Every thread busy with an ordinary job held at the gate.
        for i in 0..3 {
            pool.send(i);
        }
        wait_until("three jobs to start", || started.lock().unwrap().len() == 3);
        for i in 100..106 {
            assert!(bg.send(i).is_ok());
        }
        for i in 3..8 {
            pool.send(i);
        }
        drop(held);
        // A background job records what it saw after it records its start.
        wait_until("every job", || {
            started.lock().unwrap().len() == 14 && waiting_at_bg.lock().unwrap().len() == 6
        });
        let order = started.lock().unwrap().clone();
        let waiting = waiting_at_bg.lock().unwrap().clone();
        assert_eq!(waiting.len(), 6, "{order:?}");
        assert!(
            waiting.iter().all(|&n| n == 0),
            "a background job began while ordinary ones waited (queued at each: {waiting:?}): {order:?}"
        );
        assert!(most_bg.load(Ordering::SeqCst) <= 2);
        // Gone with the pool: a background job is given back.
        drop(pool);
        assert_eq!(bg.send(200), Err(200));
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
