//! A mount's figures for Prometheus: `--metrics HOST:PORT` serves `GET /metrics`
//! in the Prometheus text format (0.0.4), and nothing else on that port.
//!
//! The figures are read when a scrape comes, from the counters the I/O path
//! keeps anyway (atomics: recording one takes no lock) and from the snapshots
//! `stats` shows, so serving metrics costs the I/O path nothing. The encoding is
//! the Prometheus project's own Rust client, `prometheus-client`; its histogram
//! type takes a mutex per observation, so the request latencies are kept in
//! per-operation atomic buckets (`azure::stats`) and handed to its encoder.
//!
//! Every name starts `blobdrive_`, every figure carries `drive="container/name"`,
//! and nothing secret (a key, a SAS, a token) is ever in a name or a label: the
//! drive label is the blob's name alone.
//!
//! Here: the figures, read from their sources. The port they are served on is
//! `endpoint.rs`.

mod endpoint;

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tracing::warn;

use crate::azure::stats::{Outcome, LATENCY_BUCKETS};
use crate::azure::BlobService;
use crate::device::cache::Cache;
use crate::device::diskcache::DiskCacheStats;
use crate::device::stack::Stack;
use crate::mount::process_metrics::ProcessFigures;
use crate::mount::warmup::Warming;

pub use endpoint::{bind, check_addr, serve};

/// What a mount is, for `blobdrive_mount_info`: the labels that tell a mount
/// that holds no lease by design (read-only, a snapshot) from one that lost it,
/// for alerts and dashboards to join on.
#[derive(Debug, Clone, Default)]
pub struct MountInfo {
    /// `fs`, `block` or `raw`.
    pub mode: String,
    /// The filesystem mounted (`ext4`, `xfs`); empty unless `mode` is `fs`.
    pub fstype: String,
    /// No writes (`--read-only`, and every snapshot).
    pub read_only: bool,
    /// The snapshot's id; empty for the drive itself.
    pub snapshot: String,
}

/// What the figures are read from.
pub struct Sources {
    pub info: MountInfo,
    pub service: BlobService,
    pub cache: Option<Arc<Cache<Stack>>>,
    /// Whether the mount holds its lease now (false once lost, and for read-only
    /// mounts, which take none).
    pub lease_held: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Its warm-ups, with a disk cache.
    pub warm: Option<Arc<Warming>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("metrics::Sources")
    }
}

impl Collector for Sources {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        mount_info(&mut enc, &self.info)?;
        requests(&mut enc, &self.service)?;
        service(&mut enc, &self.service)?;
        gauge(
            &mut enc,
            "lease_held",
            "1 while the mount holds the blob's lease, 0 once it is lost; always 0 for read-only and snapshot mounts, which take none (see blobdrive_mount_info).",
            None,
            u64::from((self.lease_held)()),
        )?;
        if let Some(cache) = &self.cache {
            cache_figures(&mut enc, cache)?;
            if let Some(tier) = cache.backend().disk_cache() {
                disk_cache(&mut enc, &tier.stats())?;
            }
        }
        if let Some(w) = &self.warm {
            warm_up(&mut enc, w)?;
        }
        Ok(())
    }
}

/// Every attempt sent, by operation and outcome, and how long each took.
fn requests(enc: &mut DescriptorEncoder, svc: &BlobService) -> Result<(), std::fmt::Error> {
    let attempts = svc.counters().attempts();
    let mut m = enc.encode_descriptor(
        "requests",
        "Requests sent to the storage service (each attempt, retries included), by operation and how they ended.",
        None,
        MetricType::Counter,
    )?;
    for a in &attempts {
        for (outcome, n) in Outcome::ALL.iter().zip(a.by_outcome) {
            let labels = [
                ("operation", a.op.metric_name()),
                ("outcome", outcome.label()),
            ];
            m.encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "request_duration",
        "Time from sending a request to its whole answer (or to giving up on it), by operation.",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    for a in &attempts {
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(a.buckets)
            .collect();
        m.encode_family(&[("operation", a.op.metric_name())])?
            .encode_histogram::<NoLabelSet>(a.total_seconds, a.count, &buckets, None)?;
    }
    let throttled: u64 = attempts
        .iter()
        .map(|a| a.by_outcome[Outcome::Throttled as usize])
        .sum();
    counter(
        enc,
        "throttled_requests",
        "Requests the service refused as too many (503 ServerBusy, 429); they did nothing and are sent again.",
        None,
        throttled,
    )
}

/// The client's own counters: retries, operations given up on, bytes, the
/// fence, the lease and token renewals, the last success.
fn service(enc: &mut DescriptorEncoder, svc: &BlobService) -> Result<(), std::fmt::Error> {
    let s = svc.stats();
    counter(
        enc,
        "retries",
        "Requests sent again after an attempt failed.",
        None,
        s.retries,
    )?;
    counter(
        enc,
        "requests_given_up",
        "Service operations the client gave up on after their retries, or that were refused for good (a 4xx, including refusals the daemon expects and handles, such as a conditional request). Not failed application I/O: a mount asks again through an outage, so this rises while no application sees an error (blobdrive_io_errors_total counts those).",
        None,
        s.failed_requests,
    )?;
    counter(
        enc,
        "sent",
        "Page data sent to the storage service (Put Page bodies).",
        Some(&Unit::Bytes),
        s.bytes_uploaded,
    )?;
    counter(
        enc,
        "received",
        "Blob data received from the storage service (Get Blob bodies).",
        Some(&Unit::Bytes),
        s.bytes_downloaded,
    )?;
    counter(
        enc,
        "fence_raises",
        "Times the blob's sequence number was raised to fence off a write whose outcome was unknown.",
        None,
        svc.counters().fence_raises.load(Ordering::Relaxed),
    )?;
    counter(
        enc,
        "lease_renewal_failures",
        "Renewals of the mount's lease (one every 10 s) that failed, the one that found it lost included.",
        None,
        s.lease_renewal_failures,
    )?;
    gauge(
        enc,
        "last_success_timestamp",
        "When a request to the storage service last succeeded (Unix time; 0 before the first).",
        Some(&Unit::Seconds),
        s.last_success_unix_ms as f64 / 1000.0,
    )?;
    let (renewals, renewal_failures) = svc.token_renewals().unwrap_or((0, 0));
    counter(
        enc,
        "token_renewals",
        "Entra ID token renewals tried (0 for other credentials).",
        None,
        renewals,
    )?;
    counter(
        enc,
        "token_renewal_failures",
        "Entra ID token renewals that failed.",
        None,
        renewal_failures,
    )
}

/// The memory cache's figures and what the drive's users did through it.
fn cache_figures(enc: &mut DescriptorEncoder, cache: &Cache<Stack>) -> Result<(), std::fmt::Error> {
    let c = cache.snapshot();
    let h = cache.backend().remote().health();
    for (name, help, v) in [
        ("cache_hits", "Reads answered from the memory cache.", c.cache_hits),
        ("cache_misses", "Reads that had to fetch from the storage service.", c.cache_misses),
        ("hole_reads", "Reads of never-written ranges, answered with zeros without a request.", c.hole_reads),
        ("flushes", "Flushes of everything dirty (an fsync, a close, an unmount) that had data to write.", c.flushes),
        ("write_waits", "Writes that waited for room because the dirty data was at its limit (blobdrive_dirty_limit_bytes).", c.write_waits),
        ("io_errors", "Reads, writes, fsyncs and discards of the drive's users answered with EIO: data they did not get, or that may not be on the blob.", c.io_errors),
    ] {
        counter(enc, name, help, None, v)?;
    }
    for (name, help, v) in [
        (
            "read",
            "Bytes read from the drive by its users.",
            c.bytes_read,
        ),
        (
            "written",
            "Bytes written to the drive by its users.",
            c.bytes_written,
        ),
    ] {
        counter(enc, name, help, Some(&Unit::Bytes), v)?;
    }
    for (name, help, v) in [
        ("disk_size", "The disk's size as served now (a resize changes it).", cache.size()),
        ("allocated", "Bytes of the disk the blob holds pages for (written and not cleared).", c.allocated_bytes),
        ("cached", "Bytes held in the memory cache.", c.cached_bytes),
        ("cache_size", "The memory cache's limit (--cache-size).", c.cache_size),
        ("dirty", "Bytes written to the drive and not yet on the blob.", c.dirty_bytes),
        ("dirty_limit", "The most dirty data the cache holds before writes wait for room (half of --cache-size).", c.dirty_limit),
    ] {
        gauge(enc, name, help, Some(&Unit::Bytes), v)?;
    }
    gauge(
        enc,
        "stalled",
        "How long the storage service has not answered (0 while it answers).",
        Some(&Unit::Seconds),
        h.stalled.as_secs_f64(),
    )
}

/// `blobdrive_mount_info{mode,fstype,read_only,snapshot,version} 1`, the
/// convention for facts that are not figures (as `node_uname_info`): a gauge of
/// 1 whose labels say what the mount is.
fn mount_info(enc: &mut DescriptorEncoder, info: &MountInfo) -> Result<(), std::fmt::Error> {
    let labels = [
        ("mode", info.mode.as_str()),
        ("fstype", info.fstype.as_str()),
        ("read_only", if info.read_only { "true" } else { "false" }),
        ("snapshot", info.snapshot.as_str()),
        ("version", env!("CARGO_PKG_VERSION")),
    ];
    enc.encode_descriptor(
        "mount_info",
        "1 for every mount; its labels say what it is: mode, the filesystem mounted (fs mode), read_only (--read-only and snapshots, which hold no lease), the snapshot, blobdrive's version.",
        None,
        MetricType::Gauge,
    )?
    .encode_family(&labels)?
    .encode_gauge(&1u64)
}

/// The disk cache's figures (`--disk-cache`).
fn disk_cache(enc: &mut DescriptorEncoder, d: &DiskCacheStats) -> Result<(), std::fmt::Error> {
    gauge(
        enc,
        "disk_cache_on",
        "1 while the disk cache serves, 0 once a failure of its disk turned it off.",
        None,
        u64::from(d.on),
    )?;
    counter(
        enc,
        "disk_cache_hits",
        "64 KiB blocks read from the disk cache.",
        None,
        d.hits,
    )?;
    counter(
        enc,
        "disk_cache_misses",
        "64 KiB blocks the disk cache did not hold (or failed their checksum), read from the storage service.",
        None,
        d.misses,
    )?;
    counter(
        enc,
        "disk_cache_read",
        "Bytes read from the disk cache.",
        Some(&Unit::Bytes),
        d.hit_bytes,
    )?;
    counter(
        enc,
        "disk_cache_stored",
        "Bytes written into the disk cache.",
        Some(&Unit::Bytes),
        d.stored_bytes,
    )?;
    counter(
        enc,
        "disk_cache_evictions",
        "1 MiB chunks dropped from the disk cache to stay within its size.",
        None,
        d.evictions,
    )?;
    counter(
        enc,
        "disk_cache_checksum_failures",
        "Blocks whose bytes on the cache disk did not match their crc32c (read from the service instead).",
        None,
        d.checksum_failures,
    )?;
    gauge(
        enc,
        "disk_cache_held",
        "Bytes of the drive the disk cache holds.",
        Some(&Unit::Bytes),
        d.bytes,
    )?;
    gauge(
        enc,
        "disk_cache_size",
        "The disk cache's limit (--disk-cache-size).",
        Some(&Unit::Bytes),
        d.size_limit,
    )
}

/// The figures of the mount's warm-ups.
fn warm_up(enc: &mut DescriptorEncoder, w: &Warming) -> Result<(), std::fmt::Error> {
    let s = w.status().unwrap_or_default();
    gauge(
        enc,
        "warm_up_running",
        "1 while a warm-up fills the disk cache (blobdrive warm, mount --warm).",
        None,
        u64::from(s.running),
    )?;
    gauge(
        enc,
        "warm_up_done",
        "Bytes of allocated pages the current (or last) warm-up went through.",
        Some(&Unit::Bytes),
        s.done,
    )?;
    gauge(
        enc,
        "warm_up_allocated",
        "Bytes of allocated pages the current (or last) warm-up goes through in all.",
        Some(&Unit::Bytes),
        s.allocated,
    )?;
    counter(
        enc,
        "warm_up_fetched",
        "Bytes warm-ups read from the storage service into the disk cache.",
        Some(&Unit::Bytes),
        w.fetched_total(),
    )
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: u64,
) -> Result<(), std::fmt::Error> {
    enc.encode_descriptor(name, help, unit, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: impl prometheus_client::encoding::EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    enc.encode_descriptor(name, help, unit, MetricType::Gauge)?
        .encode_gauge(&v)
}

/// The registry of one drive's figures: prefix `blobdrive` (but for the daemon's
/// process figures, under their standard names), label `drive`.
pub fn registry(drive: &str, sources: Sources) -> Registry {
    let mut r = Registry::with_labels(
        [(Cow::Borrowed("drive"), Cow::Owned(drive.to_string()))].into_iter(),
    );
    r.register_collector(Box::new(ProcessFigures));
    r.sub_registry_with_prefix("blobdrive")
        .register_collector(Box::new(sources));
    r
}

/// The text a scrape gets.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, registry) {
        warn!("cannot encode the metrics: {e}");
    }
    out
}

#[cfg(test)]
mod tests;
