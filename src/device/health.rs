//! Whether the storage service is answering, as the daemon's I/O sees it.
//!
//! An outage shows up here, not as an error returned to the kernel: writers and
//! fsync wait through it (see [`super::remote`]), and `stats`, `list` and a waiting
//! `unmount` read this record to say what they are waiting for and for how long.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An operation unanswered for this long counts as a stall even before it fails:
/// one operation's retries can take minutes (each attempt may wait its whole
/// request timeout), and a healthy request takes well under a second.
pub const STALL_AFTER: Duration = Duration::from_secs(10);

/// Two failures this far apart, with no operation under way through both, belong
/// to separate outages: nothing tried in between (the drive was idle) could have
/// shown whether the service answered. Counting them as one would make an old
/// outage look ongoing, and the next blip fail I/O at once (past the I/O timeout).
pub const OUTAGE_GAP: Duration = Duration::from_secs(60);

/// How an operation failed, as an outage's messages tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// No answer came (refused, reset, timed out), or a server error.
    Unanswered,
    /// Answers came, but garbled (none used): the service is not silent, and
    /// saying it has not answered would be false.
    Garbled,
}

/// The outcome of the latest backend operations.
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Operations under way, by a serial number, with their start.
    pending: BTreeMap<u64, Instant>,
    next: u64,
    /// When the earliest operation that has failed since the last success started
    /// (in this outage: see [`OUTAGE_GAP`]).
    failing_since: Option<Instant>,
    /// When an operation last failed.
    last_failed: Option<Instant>,
    /// That failure's message (secrets never reach error messages).
    last_error: Option<String>,
    /// That failure was a garbled answer, not a silence.
    garbled: bool,
    /// When the latest of the tries that failed in this outage started.
    last_failed_try: Option<Instant>,
}

/// What `stats` shows of [`Health`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthSnapshot {
    /// How long operations have been failing; zero while the service answers.
    pub stalled: Duration,
    /// The latest failure while stalled.
    pub last_error: Option<String>,
    /// Operations have failed for want of an answer (an outage), rather than
    /// one waiting long while the service answers (a write it refuses again
    /// and again, say): what a waiting unmount tells apart.
    pub silent: bool,
    /// The latest failure was answers that came garbled (none used), not a
    /// silence: the outage is named so.
    pub garbled: bool,
}

impl HealthSnapshot {
    /// What an I/O waits for, for a waiting unmount or the service manager:
    /// how long, and that the service is silent only when operations failed
    /// for want of an answer (one that answers but refuses again and again
    /// was said to be silent).
    pub fn waiting_for(&self) -> String {
        let why = self.last_error.as_deref().unwrap_or("no answer");
        let secs = self.stalled.as_secs();
        if self.silent && self.garbled {
            format!("the storage service, which has given no usable answer for {secs} s ({why})")
        } else if self.silent {
            format!("the storage service, which has not answered for {secs} s ({why})")
        } else {
            format!("the storage service: an operation has waited {secs} s on it (latest: {why})")
        }
    }
}

/// An operation under way, until dropped.
pub struct Pending<'a> {
    health: &'a Health,
    id: u64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.health.state().pending.remove(&self.id);
    }
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks an operation as under way until the guard is dropped.
    pub fn begin(&self) -> Pending<'_> {
        let mut s = self.state();
        let id = s.next;
        s.next += 1;
        s.pending.insert(id, Instant::now());
        Pending { health: self, id }
    }

    /// An operation succeeded: the service answers.
    pub fn succeeded(&self) {
        let mut s = self.state();
        s.failing_since = None;
        s.last_failed = None;
        s.last_error = None;
        s.garbled = false;
        s.last_failed_try = None;
    }

    /// An operation that started at `started` failed with `error`, for want of
    /// an answer.
    pub fn failed(&self, started: Instant, error: &str) {
        self.failed_try(started, started, error, Failed::Unanswered);
    }

    /// An operation that started at `started` failed with `error` (`how`), in
    /// its try that started at `tried`.
    pub fn failed_try(&self, started: Instant, tried: Instant, error: &str, how: Failed) {
        self.failed_at(started, Instant::now(), error);
        let mut s = self.state();
        s.last_failed_try = Some(s.last_failed_try.map_or(tried, |t| t.max(tried)));
        s.garbled = how == Failed::Garbled;
    }

    fn failed_at(&self, started: Instant, now: Instant, error: &str) {
        let mut s = self.state();
        // The outage goes on if this operation was already under way at the last
        // failure (it has failed ever since), or that failure was recent.
        let goes_on = s.last_failed.is_some_and(|last| {
            started <= last || now.saturating_duration_since(last) <= OUTAGE_GAP
        });
        s.failing_since = match s.failing_since {
            Some(t) if goes_on => Some(t.min(started)),
            _ => Some(started),
        };
        s.last_failed = Some(now);
        s.last_error = Some(error.to_string());
    }

    /// Whether a try that started at `t` or later has failed, in an outage that
    /// still goes on. One that started earlier does not count: it may have been
    /// sent while the service was silent and cut off just after it came back.
    pub fn tried_and_failed_since(&self, t: Instant) -> bool {
        let s = self.state();
        s.failing_since.is_some() && s.last_failed_try.is_some_and(|l| l >= t)
    }

    /// Why operations fail, while they do (`None` while the service answers).
    pub fn outage(&self) -> Option<String> {
        let s = self.state();
        s.failing_since?;
        Some(s.last_error.clone().unwrap_or_else(|| "no answer".into()))
    }

    /// Whether the latest failure of an outage still under way was answers
    /// that came garbled, rather than no answer.
    pub fn garbled(&self) -> bool {
        let s = self.state();
        s.failing_since.is_some() && s.garbled
    }

    /// How long operations have been failing: since the earliest one that failed
    /// since the last success started; `None` while the service answers.
    pub fn failing_for(&self) -> Option<Duration> {
        self.state().failing_since.map(|t| t.elapsed())
    }

    /// The stall: since the first operation failed, or since the oldest one still
    /// under way started, once that is [`STALL_AFTER`] old. `latest_attempt` is why
    /// the latest attempt failed (an operation that still retries has not failed).
    pub fn snapshot(&self, latest_attempt: Option<String>) -> HealthSnapshot {
        let s = self.state();
        let failed = s.failing_since.map_or(Duration::ZERO, |t| t.elapsed());
        let waiting = s
            .pending
            .values()
            .min()
            .map_or(Duration::ZERO, |t| t.elapsed());
        let waiting = if waiting >= STALL_AFTER {
            waiting
        } else {
            Duration::ZERO
        };
        let stalled = failed.max(waiting);
        HealthSnapshot {
            stalled,
            last_error: (!stalled.is_zero())
                .then(|| s.last_error.clone().or(latest_attempt))
                .flatten(),
            silent: !failed.is_zero(),
            garbled: !failed.is_zero() && s.garbled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_from_the_first_failed_operation_and_ends_with_a_success() {
        let h = Health::default();
        assert_eq!(h.snapshot(None), HealthSnapshot::default());
        let early = Instant::now() - Duration::from_secs(30);
        h.failed(Instant::now(), "later");
        h.failed(early, "earlier start, reported last");
        let s = h.snapshot(None);
        assert!(s.stalled >= Duration::from_secs(30), "{s:?}");
        assert_eq!(
            s.last_error.as_deref(),
            Some("earlier start, reported last")
        );
        assert!(h.failing_for().unwrap() >= Duration::from_secs(30));
        h.succeeded();
        assert_eq!(h.snapshot(None), HealthSnapshot::default());
        assert_eq!(h.failing_for(), None);
    }

    #[test]
    fn failures_with_a_quiet_gap_between_them_are_separate_outages() {
        let h = Health::default();
        let t0 = Instant::now() - Duration::from_secs(1000);
        h.failed_at(t0, t0 + Duration::from_secs(25), "first");
        // Another operation fails soon after: the same outage.
        let t1 = t0 + Duration::from_secs(40);
        h.failed_at(t1, t1 + Duration::from_secs(25), "second");
        assert!(h.failing_for().unwrap() >= Duration::from_secs(1000));
        // An operation under way all along fails again much later: still the same.
        h.failed_at(
            t0 + Duration::from_secs(30),
            t0 + Duration::from_secs(400),
            "retrying",
        );
        assert!(h.failing_for().unwrap() >= Duration::from_secs(1000));
        // After a quiet spell, an operation that started since fails: a new outage.
        let later = Instant::now() - Duration::from_secs(5);
        h.failed_at(later, Instant::now(), "after a quiet spell");
        let f = h.failing_for().unwrap();
        assert!(
            f >= Duration::from_secs(5) && f < Duration::from_secs(100),
            "{f:?}"
        );
    }

    #[test]
    fn an_operation_unanswered_for_long_is_a_stall_before_it_fails() {
        let h = Health::default();
        let op = h.begin();
        assert_eq!(
            h.snapshot(Some("timed out".into())),
            HealthSnapshot::default()
        );
        h.state()
            .pending
            .insert(op.id, Instant::now() - STALL_AFTER);
        let s = h.snapshot(Some("timed out".into()));
        assert!(s.stalled >= STALL_AFTER, "{s:?}");
        assert_eq!(s.last_error.as_deref(), Some("timed out"));
        assert!(!s.silent, "nothing failed for want of an answer yet");
        assert!(
            s.waiting_for().contains("an operation has waited")
                && !s.waiting_for().contains("not answered"),
            "{s:?}"
        );
        h.failed(Instant::now(), "no answer in 20 s");
        let s = h.snapshot(None);
        assert!(s.silent && s.waiting_for().contains("has not answered for"));
        // Answers that came garbled are no silence, and not called one.
        h.failed_try(
            Instant::now(),
            Instant::now(),
            "answers garbled",
            Failed::Garbled,
        );
        let s = h.snapshot(None);
        let said = s.waiting_for();
        assert!(s.silent && s.garbled, "{s:?}");
        assert!(
            said.contains("no usable answer for") && !said.contains("not answered"),
            "{said}"
        );
        assert!(h.garbled());
        h.failed(Instant::now(), "no answer in 20 s");
        assert!(!h.snapshot(None).garbled && !h.garbled());
        h.succeeded();
        drop(op);
        assert_eq!(h.snapshot(None), HealthSnapshot::default());
    }
}
