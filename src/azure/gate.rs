//! How fast a client sends requests once the service throttles it.
//!
//! A blob or account over its scalability target answers 503 `ServerBusy`. Azure's
//! targets are rates (requests per second, MiB per second), and each request
//! backing off on its own is not enough: eight flush units sent together kept
//! probing the service and most of them were refused again. Halving the requests
//! in flight (an earlier design) still left one lone request probing whenever the
//! blob's budget ran dry, about one refusal per request served, because one
//! request in flight can already be faster than the target.
//!
//! So the client as a whole paces itself, as a rate-based TCP sender does on loss:
//! the starts of requests are kept at least a gap apart. There is no gap until the
//! service throttles. A throttling answer widens the gap by half, once per window
//! (refusals of requests started before the last widening are the same signal,
//! and are not counted again), and never to less than half again the spacing at
//! which the service has lately been answering: that is about the rate it
//! accepts. Every success narrows it by 1/64, so the rate creeps back up to the
//! target and, with no more throttling, the gap fades away after a few hundred
//! requests.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much a throttling answer widens the gap.
const WIDEN: f64 = 1.5;
/// The fraction of the gap a success takes off.
const NARROW: f64 = 1.0 / 64.0;
/// Below this the gap is dropped: the client no longer paces itself.
const NO_GAP: Duration = Duration::from_micros(50);
/// The gap never grows past this (the service may also ask with `Retry-After`).
const MAX_GAP: Duration = Duration::from_secs(2);
/// A longer pause between two successes is idleness, not the service's pace: the
/// spacing a widening starts from is counted with pauses clipped to this.
const BUSY_SPACING: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct State {
    /// The least time between two requests' starts; zero: no pacing.
    gap: Duration,
    /// When the next request may start.
    next: Instant,
    /// When the last request was served.
    last_served: Option<Instant>,
    /// Moving average of the time between two requests served (pauses clipped).
    spacing: Duration,
    /// Counts widenings: a refusal of a request started before the last one is
    /// not a new signal.
    window: u64,
}

/// The client's pace, shared by all its requests.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            state: Mutex::new(State {
                gap: Duration::ZERO,
                next: Instant::now(),
                last_served: None,
                spacing: Duration::ZERO,
                window: 0,
            }),
        }
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for this request's turn; returns the window it starts in, for
    /// [`Gate::throttled`].
    pub async fn enter(&self) -> u64 {
        let now = Instant::now();
        let (slot, window) = {
            let mut st = self.lock();
            let slot = st.next.max(now);
            st.next = slot + st.gap;
            (slot, st.window)
        };
        if slot > now {
            tokio::time::sleep_until(slot.into()).await;
        }
        window
    }

    /// The service refused a request for being over its target; `window` is what
    /// [`Gate::enter`] gave that request.
    pub fn throttled(&self, window: u64) {
        let mut st = self.lock();
        if window != st.window {
            return;
        }
        st.window += 1;
        let base = st.gap.max(st.spacing).max(NO_GAP * 2);
        st.gap = base.mul_f64(WIDEN).min(MAX_GAP);
        // The budget is spent now: the next start waits a whole gap.
        let now = Instant::now();
        st.next = st.next.max(now + st.gap);
    }

    /// A request was served: go a little faster.
    pub fn succeeded(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        if let Some(last) = st.last_served {
            let since = now.saturating_duration_since(last).min(BUSY_SPACING);
            st.spacing = (st.spacing * 7 + since) / 8;
        }
        st.last_served = Some(now);
        if !st.gap.is_zero() {
            let gap = st.gap.mul_f64(1.0 - NARROW);
            st.gap = if gap < NO_GAP { Duration::ZERO } else { gap };
        }
    }

    /// The least time between two requests' starts now (for tests and stats).
    pub fn gap(&self) -> Duration {
        self.lock().gap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_gap_until_throttled_then_widened_once_per_window_and_narrowed_by_successes() {
        let g = Gate::default();
        let window = g.enter().await;
        for _ in 0..7 {
            assert_eq!(g.enter().await, window);
        }
        assert_eq!(g.gap(), Duration::ZERO);
        g.throttled(window);
        let first = g.gap();
        assert!(
            first > Duration::ZERO && first <= BUSY_SPACING * 2,
            "{first:?}"
        );
        g.throttled(window);
        assert_eq!(g.gap(), first, "a second refusal of the same window");
        let later = g.enter().await;
        g.throttled(later);
        assert_eq!(g.gap(), first.mul_f64(WIDEN), "a refusal of a later window");
        for _ in 0..64 {
            g.succeeded();
        }
        let narrowed = g.gap();
        assert!(narrowed < first.mul_f64(WIDEN * 0.4), "{narrowed:?}");
        for _ in 0..2000 {
            g.succeeded();
        }
        assert_eq!(g.gap(), Duration::ZERO, "the gap fades away");
    }

    #[tokio::test]
    async fn requests_start_a_gap_apart_while_it_lasts() {
        let g = Gate::default();
        let window = g.enter().await;
        g.throttled(window);
        let gap = g.gap();
        let started = Instant::now();
        for _ in 0..5 {
            g.enter().await;
        }
        // The first waits a gap after the refusal, and each one after it another.
        assert!(
            started.elapsed() >= gap * 5,
            "{:?} for gaps of {gap:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn the_gap_never_passes_its_ceiling() {
        let g = Gate::default();
        for _ in 0..40 {
            let w = {
                let mut st = g.lock();
                st.next = Instant::now();
                st.window
            };
            g.throttled(w);
        }
        assert_eq!(g.gap(), MAX_GAP);
    }
}
