//! Whether the storage service is answering, as the daemon's I/O sees it.
//!
//! An outage shows up here, not as an error returned to the kernel: writers and
//! fsync wait through it (see [`super::remote`]), and `stats`, `list` and a waiting
//! `unmount` read this record to say what they are waiting for and for how long.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The outcome of the latest backend operations.
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the earliest operation that has failed since the last success started.
    failing_since: Option<Instant>,
    /// That failure's message (secrets never reach error messages).
    last_error: Option<String>,
}

/// What `stats` shows of [`Health`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthSnapshot {
    /// How long operations have been failing; zero while the service answers.
    pub stalled: Duration,
    /// The latest failure while stalled.
    pub last_error: Option<String>,
}

impl Health {
    /// An operation succeeded: the service answers.
    pub fn succeeded(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.failing_since = None;
        s.last_error = None;
    }

    /// An operation that started at `started` failed with `error`.
    pub fn failed(&self, started: Instant, error: &str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.failing_since = Some(s.failing_since.map_or(started, |t| t.min(started)));
        s.last_error = Some(error.to_string());
    }

    pub fn snapshot(&self) -> HealthSnapshot {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        HealthSnapshot {
            stalled: s.failing_since.map_or(Duration::ZERO, |t| t.elapsed()),
            last_error: s.last_error.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_counts_from_the_first_failed_operation_and_ends_with_a_success() {
        let h = Health::default();
        assert_eq!(h.snapshot(), HealthSnapshot::default());
        let early = Instant::now() - Duration::from_secs(30);
        h.failed(Instant::now(), "later");
        h.failed(early, "earlier start, reported last");
        let s = h.snapshot();
        assert!(s.stalled >= Duration::from_secs(30), "{s:?}");
        assert_eq!(
            s.last_error.as_deref(),
            Some("earlier start, reported last")
        );
        h.succeeded();
        assert_eq!(h.snapshot(), HealthSnapshot::default());
    }
}
