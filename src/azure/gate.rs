//! How many requests a client keeps in flight once the service throttles it.
//!
//! A blob or account over its scalability target answers 503 `ServerBusy`. Each
//! request backing off on its own is not enough: eight flush units sent together
//! keep probing the service, and most of them are refused again (about one refusal
//! per request served, in the WAN benchmark's capped runs). So the client as a whole
//! slows down, as TCP does on loss: a throttling answer halves the number of
//! requests allowed in flight, once per window (refusals of requests sent before
//! the last decrease are the same signal, and are not counted again), and every
//! success raises it again by one request per window of requests. Until the service
//! throttles, there is no limit.

use std::sync::Mutex;

use tokio::sync::Notify;

/// No limit: what the gate allows before any throttling.
const UNLIMITED: f64 = 1024.0;

#[derive(Debug)]
struct State {
    /// Requests allowed in flight (fractional: additive increase adds 1/limit).
    limit: f64,
    in_flight: usize,
    /// Counts decreases: a refusal of a request sent before the last one is not
    /// a new signal.
    window: u64,
}

/// The client's limit on requests in flight, shared by all its requests.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
    freed: Notify,
}

/// A request's place in flight; given back when dropped.
pub struct Pass<'a> {
    gate: &'a Gate,
    window: u64,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            state: Mutex::new(State {
                limit: UNLIMITED,
                in_flight: 0,
                window: 0,
            }),
            freed: Notify::new(),
        }
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until fewer requests than the limit are in flight, and takes a place.
    pub async fn enter(&self) -> Pass<'_> {
        loop {
            let freed = self.freed.notified();
            {
                let mut st = self.lock();
                if (st.in_flight as f64) < st.limit.floor().max(1.0) {
                    st.in_flight += 1;
                    return Pass {
                        gate: self,
                        window: st.window,
                    };
                }
            }
            freed.await;
        }
    }

    /// The service refused a request for being over its target; `window` is the
    /// one its pass was taken in ([`Pass::window`]).
    pub fn throttled(&self, window: u64) {
        let mut st = self.lock();
        if window != st.window {
            return;
        }
        st.window += 1;
        // Half of what was in flight with it (the limit may be far above that).
        st.limit = (st.limit.min(st.in_flight as f64 + 1.0) / 2.0).max(1.0);
    }

    /// A request was served: allow a little more.
    pub fn succeeded(&self) {
        let mut st = self.lock();
        if st.limit < UNLIMITED {
            st.limit = (st.limit + 1.0 / st.limit).min(UNLIMITED);
            drop(st);
            // A request may be waiting for the raised limit. Unlimited, none waits.
            self.freed.notify_waiters();
        }
    }

    /// Requests allowed in flight now (for tests and stats).
    pub fn limit(&self) -> f64 {
        self.lock().limit
    }
}

impl Pass<'_> {
    /// The window this request was sent in.
    pub fn window(&self) -> u64 {
        self.window
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.lock().in_flight -= 1;
        self.gate.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn unlimited_until_throttled_then_halved_once_per_burst_and_raised_by_successes() {
        let g = Gate::default();
        let mut passes: Vec<_> = enter_n(&g, 8).await;
        assert_eq!(g.limit(), UNLIMITED);
        let refused = passes.pop().unwrap();
        let window = refused.window();
        drop(refused);
        g.throttled(window);
        assert_eq!(g.limit(), 4.0, "half of the 8 in flight");
        let refused = passes.pop().unwrap();
        drop(refused);
        g.throttled(window);
        assert_eq!(g.limit(), 4.0, "a second refusal of the same window");
        drop(passes);
        for _ in 0..4 {
            g.succeeded();
        }
        assert!((g.limit() - 5.0).abs() < 0.1, "{}", g.limit());
    }

    #[tokio::test]
    async fn a_request_waits_while_the_limit_is_taken() {
        let g = Gate::default();
        let mut first = enter_n(&g, 3).await;
        let refused = first.pop().unwrap();
        let window = refused.window();
        drop(refused);
        g.throttled(window);
        assert_eq!(g.limit(), 1.5);
        let waiting = tokio::time::timeout(Duration::from_millis(50), g.enter()).await;
        assert!(waiting.is_err(), "entered past the limit");
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), g.enter())
            .await
            .expect("entered once places were freed");
    }

    async fn enter_n(g: &Gate, n: usize) -> Vec<Pass<'_>> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(g.enter().await);
        }
        v
    }
}
