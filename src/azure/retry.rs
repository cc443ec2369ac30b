//! How long and how often to retry, and which failures are worth retrying.
//!
//! Every limit is explicit so a dead endpoint turns into an error within a bounded
//! time instead of a hang: the budget caps the whole operation, the request timeout
//! caps one attempt, and no attempt starts after the budget is spent.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Retry limits for one logical operation. The command line reads them from the
/// environment (`BLOBDRIVE_RETRY_BUDGET_SECS`, `BLOBDRIVE_REQUEST_TIMEOUT_SECS`,
/// `BLOBDRIVE_MAX_ATTEMPTS`) and passes them in; a mount's daemon gets them in its
/// request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    /// First backoff ceiling; doubles per attempt (full jitter below it).
    pub base_delay: Duration,
    /// Largest backoff ceiling.
    pub max_delay: Duration,
    /// Wall-clock budget of the whole operation, retries included.
    pub budget: Duration,
    /// Longest a single attempt (connect, send, receive the whole body) may take.
    pub request_timeout: Duration,
    /// Longest a TCP/TLS connect may take.
    pub connect_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(4),
            budget: Duration::from_secs(25),
            request_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Backoff before attempt `attempt + 1` (attempt counts from 1): a random delay
    /// below an exponentially growing ceiling, so many clients do not retry in step.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let ceiling = exp.min(self.max_delay);
        let nanos = ceiling.as_nanos().max(1) as u64;
        Duration::from_nanos(rand::thread_rng().gen_range(nanos / 2..=nanos))
    }
}

/// Statuses worth another attempt: the service was busy or failed internally, or a
/// gateway/timeout answered for it.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 500 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        for attempt in 1..20 {
            let d = p.backoff(attempt);
            assert!(d <= p.max_delay, "{d:?}");
        }
        assert!(p.backoff(1) <= Duration::from_millis(100));
        assert!(p.backoff(6) >= Duration::from_millis(1600));
    }

    #[test]
    fn retryable() {
        for s in [408, 500, 503] {
            assert!(is_retryable_status(s));
        }
        for s in [400, 403, 404, 409, 412, 413, 416] {
            assert!(!is_retryable_status(s));
        }
    }
}
