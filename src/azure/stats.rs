//! Request counters, shared by every clone of a service handle.
//!
//! The mount daemon reports these in `stats`; tests use them to prove that a hole
//! costs no request and that writes were coalesced.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use super::error::Op;

/// Live counters (lock-free).
#[derive(Debug, Default)]
pub struct ClientStats {
    pub put_page_requests: AtomicU64,
    pub bytes_uploaded: AtomicU64,
    pub get_requests: AtomicU64,
    pub bytes_downloaded: AtomicU64,
    pub clear_requests: AtomicU64,
    pub page_range_requests: AtomicU64,
    pub other_requests: AtomicU64,
    pub retries: AtomicU64,
    pub failed_requests: AtomicU64,
    /// Times the write fence raised the blob's sequence number (see `ops::fence`).
    pub fence_raises: AtomicU64,
    /// Renewals of a mount's lease that failed, counted by its lease keeper
    /// (the one that finds the lease lost too).
    pub lease_renewal_failures: AtomicU64,
    /// When an attempt last succeeded, in milliseconds since the Unix epoch (0:
    /// never): how long a mount has gone without one, whatever it was doing.
    last_success_unix_ms: AtomicU64,
    /// Why the latest attempt that failed did, until one succeeds: an operation
    /// still retrying has not failed yet, but this already says what it meets.
    last_failure: std::sync::Mutex<Option<String>>,
    /// Every attempt sent, by operation (indexed by `Op as usize`): how it
    /// ended and how long it took, for the metrics.
    attempts: [OpAttempts; Op::ALL.len()],
}

/// How an attempt ended, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A success status.
    Ok,
    /// 503 (or 429): the service asked to slow down; the request did nothing.
    Throttled,
    /// Another 5xx.
    ServerError,
    /// A 3xx or 4xx.
    ClientError,
    /// No answer: refused connection, reset, timeout, an answer cut short or
    /// not the one asked for.
    NoAnswer,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Throttled,
        Outcome::ServerError,
        Outcome::ClientError,
        Outcome::NoAnswer,
    ];

    pub fn of_status(status: u16, ok: bool) -> Outcome {
        match status {
            _ if ok => Outcome::Ok,
            429 | 503 => Outcome::Throttled,
            500..=599 => Outcome::ServerError,
            _ => Outcome::ClientError,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Throttled => "throttled",
            Outcome::ServerError => "server_error",
            Outcome::ClientError => "client_error",
            Outcome::NoAnswer => "no_answer",
        }
    }
}

/// Upper bounds (seconds) of the request latency histogram's buckets: 1 ms to
/// 60 s, about three per decade.
pub const LATENCY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// One operation's attempts: atomics only, so recording one takes no lock.
#[derive(Debug, Default)]
struct OpAttempts {
    by_outcome: [AtomicU64; Outcome::ALL.len()],
    /// Attempts per latency bucket (not cumulative); the last one is past 60 s.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    total_micros: AtomicU64,
}

/// One operation's attempts at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct OpSnapshot {
    pub op: Op,
    /// Attempts by [`Outcome`], in the order of [`Outcome::ALL`].
    pub by_outcome: [u64; Outcome::ALL.len()],
    /// Attempts per bucket of [`LATENCY_BUCKETS`] (each bucket's own, not
    /// cumulative), then those past the last.
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
    pub count: u64,
    pub total_seconds: f64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
    pub put_page_requests: u64,
    pub bytes_uploaded: u64,
    pub get_requests: u64,
    pub bytes_downloaded: u64,
    pub clear_requests: u64,
    pub page_range_requests: u64,
    pub other_requests: u64,
    pub retries: u64,
    pub failed_requests: u64,
    pub lease_renewal_failures: u64,
    /// When an attempt last succeeded (ms since the Unix epoch; 0: never).
    pub last_success_unix_ms: u64,
}

impl ClientStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            put_page_requests: self.put_page_requests.load(Relaxed),
            bytes_uploaded: self.bytes_uploaded.load(Relaxed),
            get_requests: self.get_requests.load(Relaxed),
            bytes_downloaded: self.bytes_downloaded.load(Relaxed),
            clear_requests: self.clear_requests.load(Relaxed),
            page_range_requests: self.page_range_requests.load(Relaxed),
            other_requests: self.other_requests.load(Relaxed),
            retries: self.retries.load(Relaxed),
            failed_requests: self.failed_requests.load(Relaxed),
            lease_renewal_failures: self.lease_renewal_failures.load(Relaxed),
            last_success_unix_ms: self.last_success_unix_ms.load(Relaxed),
        }
    }

    /// An attempt of `op` that was sent ended as `outcome` after `took`.
    pub(crate) fn record_attempt(&self, op: Op, outcome: Outcome, took: std::time::Duration) {
        let a = &self.attempts[op as usize];
        a.by_outcome[outcome as usize].fetch_add(1, Relaxed);
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(LATENCY_BUCKETS.len());
        a.buckets[bucket].fetch_add(1, Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        a.total_micros.fetch_add(micros, Relaxed);
    }

    /// The attempts of every operation that sent any.
    pub fn attempts(&self) -> Vec<OpSnapshot> {
        Op::ALL
            .iter()
            .zip(&self.attempts)
            .filter_map(|(op, a)| {
                let by_outcome = std::array::from_fn(|i| a.by_outcome[i].load(Relaxed));
                let buckets: [u64; LATENCY_BUCKETS.len() + 1] =
                    std::array::from_fn(|i| a.buckets[i].load(Relaxed));
                let count = buckets.iter().sum();
                (count > 0).then(|| OpSnapshot {
                    op: *op,
                    by_outcome,
                    buckets,
                    count,
                    total_seconds: a.total_micros.load(Relaxed) as f64 / 1e6,
                })
            })
            .collect()
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// An attempt failed (`Some`), or one succeeded (`None`).
    pub(crate) fn attempt_ended(&self, failure: Option<String>) {
        if failure.is_none() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            self.last_success_unix_ms.store(now, Relaxed);
        }
        let mut f = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        if failure.is_some() || f.is_some() {
            *f = failure;
        }
    }

    /// Why the latest failed attempt failed, unless one succeeded since.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn attempts_land_in_their_outcome_and_latency_bucket() {
        let s = ClientStats::default();
        s.record_attempt(Op::PutPage, Outcome::Ok, Duration::from_micros(800));
        s.record_attempt(Op::PutPage, Outcome::Ok, Duration::from_millis(30));
        s.record_attempt(Op::PutPage, Outcome::Throttled, Duration::from_secs(90));
        let all = s.attempts();
        assert_eq!(all.len(), 1, "only operations that sent anything");
        let p = &all[0];
        assert_eq!(p.op, Op::PutPage);
        assert_eq!(p.by_outcome, [2, 1, 0, 0, 0]);
        // 0.8 ms in le=0.001, 30 ms in le=0.05, 90 s past the last bucket.
        assert_eq!(p.buckets[0], 1);
        assert_eq!(p.buckets[5], 1);
        assert_eq!(p.buckets[LATENCY_BUCKETS.len()], 1);
        assert_eq!(p.count, 3);
        assert!(
            (p.total_seconds - 90.0308).abs() < 1e-6,
            "{}",
            p.total_seconds
        );
        assert_eq!(Outcome::of_status(201, true), Outcome::Ok);
        assert_eq!(Outcome::of_status(503, false), Outcome::Throttled);
        assert_eq!(Outcome::of_status(500, false), Outcome::ServerError);
        assert_eq!(Outcome::of_status(412, false), Outcome::ClientError);
    }
}
