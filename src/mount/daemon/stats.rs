//! The daemon's counters as `stats` shows them, on the control socket and in the
//! FUSE file `stats`.

use std::sync::Arc;

use serde_json::json;

use crate::azure::BlobService;
use crate::device::cache::Cache;
use crate::device::stack::Stack;
use crate::device::LeaseLoss;
use crate::mount::warmup::Warming;

/// The daemon's counters as JSON, computed on each call.
pub(super) type StatsValues = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

pub(super) fn lease_state(had_lease: bool, fenced: &LeaseLoss) -> &'static str {
    if fenced.is_lost() {
        "lost"
    } else if had_lease {
        "held"
    } else {
        "none"
    }
}

pub(super) fn stats_value(
    svc: &BlobService,
    cache: Option<&Cache<Stack>>,
    lease: &str,
    warm: Option<&Warming>,
) -> serde_json::Value {
    let s = svc.stats();
    let c = cache.map(|c| c.snapshot()).unwrap_or_default();
    let h = cache
        .map(|c| c.backend().remote().health())
        .unwrap_or_default();
    json!({
        "disk_size": cache.map_or(0, |c| c.size()),
        // An encrypted drive serves its data segment, this far into the disk.
        "encrypted_data_offset": cache.map_or(0, |c| c.backend().data_offset()),
        "put_page_requests": s.put_page_requests,
        "bytes_uploaded": s.bytes_uploaded,
        "get_requests": s.get_requests,
        "bytes_downloaded": s.bytes_downloaded,
        "clear_requests": s.clear_requests,
        "page_range_requests": s.page_range_requests,
        "other_requests": s.other_requests,
        "retries": s.retries,
        "failed_requests": s.failed_requests,
        "lease_renewal_failures": s.lease_renewal_failures,
        "last_success_unix_ms": s.last_success_unix_ms,
        "cache_hits": c.cache_hits,
        "cache_misses": c.cache_misses,
        "hole_reads": c.hole_reads,
        "dirty_bytes": c.dirty_bytes,
        "cached_bytes": c.cached_bytes,
        "cache_size": c.cache_size,
        "bytes_read": c.bytes_read,
        "bytes_written": c.bytes_written,
        "flushes": c.flushes,
        "write_waits": c.write_waits,
        "io_errors": c.io_errors,
        "failed_writes": c.failed_writes,
        "dirty_limit": c.dirty_limit,
        "allocated_bytes": c.allocated_bytes,
        "lease_state": lease,
        "stalled_secs": h.stalled.as_secs_f64(),
        "last_error": h.last_error,
        "disk_cache": cache.and_then(|c| c.backend().disk_cache()).map(|t| t.stats()),
        "warm_up": warm.and_then(Warming::status),
    })
}
