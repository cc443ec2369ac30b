//! Settings read from the environment, once, as a command starts, and passed
//! down to the library (the retry policy to the blob service, both to a mount's
//! daemon in its request): nothing in the library reads them itself.

use std::time::Duration;

use blobdrive::azure::RetryPolicy;
use blobdrive::device::remote::DEFAULT_IO_TIMEOUT;
use blobdrive::mount::{IoSettings, DEFAULT_FREEZE_LIMIT};

/// The retry policy, I/O timeout and freeze limit the environment asks for.
pub fn io_settings() -> IoSettings {
    IoSettings {
        retry: retry_policy(),
        io_timeout: secs("BLOBDRIVE_IO_TIMEOUT_SECS").unwrap_or(DEFAULT_IO_TIMEOUT),
        freeze_limit: secs("BLOBDRIVE_FREEZE_LIMIT_SECS").unwrap_or(DEFAULT_FREEZE_LIMIT),
    }
}

/// The default policy, with `BLOBDRIVE_RETRY_BUDGET_SECS`,
/// `BLOBDRIVE_REQUEST_TIMEOUT_SECS` and `BLOBDRIVE_MAX_ATTEMPTS` applied when set
/// (tests of failure paths use short budgets; operators on slow links long ones).
fn retry_policy() -> RetryPolicy {
    let mut p = RetryPolicy::default();
    if let Some(d) = secs("BLOBDRIVE_RETRY_BUDGET_SECS") {
        p.budget = d;
    }
    if let Some(d) = secs("BLOBDRIVE_REQUEST_TIMEOUT_SECS") {
        p.request_timeout = d;
        p.connect_timeout = p.connect_timeout.min(d);
    }
    if let Some(n) = std::env::var("BLOBDRIVE_MAX_ATTEMPTS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
    {
        p.max_attempts = n;
    }
    p
}

/// The variable `name` as a positive number of seconds, if it is one.
fn secs(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .map(Duration::from_secs_f64)
}
