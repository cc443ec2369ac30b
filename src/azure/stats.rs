//! Request counters, shared by every clone of a service handle.
//!
//! The mount daemon reports these in `stats`; tests use them to prove that a hole
//! costs no request and that writes were coalesced.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

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
    /// Why the latest attempt that failed did, until one succeeds: an operation
    /// still retrying has not failed yet, but this already says what it meets.
    last_failure: std::sync::Mutex<Option<String>>,
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
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    /// An attempt failed (`Some`), or one succeeded (`None`).
    pub(crate) fn attempt_ended(&self, failure: Option<String>) {
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
