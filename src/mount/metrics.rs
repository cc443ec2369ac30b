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

use std::borrow::Cow;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use tracing::{debug, warn};

use crate::azure::stats::{Outcome, LATENCY_BUCKETS};
use crate::azure::BlobService;
use crate::device::cache::Cache;
use crate::device::diskcache::DiskCacheStats;
use crate::device::stack::Stack;
use crate::mount::process_metrics::ProcessFigures;

/// Longest request head read from a scraper, and how long it may take.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

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
    pub warm: Option<Arc<super::warmup::Warming>>,
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
            w.encode(&mut enc)?;
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

pub(crate) fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: u64,
) -> Result<(), std::fmt::Error> {
    enc.encode_descriptor(name, help, unit, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&v, None)
}

pub(crate) fn gauge(
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

/// What `--metrics` takes, for messages.
const ADDR_FORMS: &str = "expected HOST:PORT, e.g. 127.0.0.1:9101, [::1]:9101 or localhost:9101";

/// Checks that `addr` reads as HOST:PORT (an IPv4 address, an IPv6 one in
/// brackets, or a host name, then a port number) without resolving the name:
/// fstab options are checked at boot, maybe before any name can be looked up.
pub fn check_addr(addr: &str) -> Result<(), String> {
    let bad = || ADDR_FORMS.to_string();
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        }
    };
    host_ok.then_some(()).ok_or_else(bad)
}

/// Binds the metrics port: done before the mount is set up, so an address in use
/// fails the mount with one line and nothing done. A host name is looked up
/// (`localhost` in /etc/hosts) and the first of its addresses that can be bound
/// is.
pub fn bind(addr: &str) -> Result<TcpListener, String> {
    check_addr(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| format!("--metrics {addr}: cannot look up its host: {e}"))?
        .collect();
    TcpListener::bind(&addrs[..]).map_err(|e| format!("cannot serve metrics on {addr}: {e}"))
}

/// Serves `GET /metrics` on `listener` for as long as the process lives, each
/// connection on a thread of its own (at most [`MAX_CLIENTS`] at once), so that
/// a client that trickles its request cannot hold back a scrape; every request
/// must arrive whole within [`CLIENT_TIMEOUT`].
pub fn serve(listener: TcpListener, registry: Registry) {
    let registry = Arc::new(registry);
    let clients = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let Some(slot) = ClientSlot::take(&clients) else {
                    debug!("a metrics client turned away: {MAX_CLIENTS} already connected");
                    continue;
                };
                let registry = registry.clone();
                // The slot goes with the closure: dropped with it if no thread
                // could be started, at the thread's end otherwise.
                let spawned = std::thread::Builder::new()
                    .name("blobdrive-metrics".into())
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let _slot = slot;
                        if let Err(e) = answer(stream, &registry) {
                            debug!("a metrics client: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    warn!("cannot start a thread for a metrics client: {e}");
                }
            }
            Err(e) => {
                debug!("accepting a metrics client: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Most metrics clients served at once: a scraper or two, with room for a few
/// that hang; past it a connection is closed unanswered.
const MAX_CLIENTS: usize = 16;

/// One of the [`MAX_CLIENTS`] places, given back when dropped.
struct ClientSlot(Arc<AtomicUsize>);

impl ClientSlot {
    fn take(clients: &Arc<AtomicUsize>) -> Option<ClientSlot> {
        clients
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_CLIENTS).then_some(n + 1)
            })
            .ok()
            .map(|_| ClientSlot(clients.clone()))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads one request head (bounded in size, and in time as a whole: a client
/// sending a byte every few seconds is cut off at [`CLIENT_TIMEOUT`]) and
/// answers it.
fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= MAX_REQUEST_HEAD {
            return reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request head too long\n",
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request did not arrive whole in time",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => reply(
            &mut stream,
            "200 OK",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            &render(registry),
        ),
        (_, "/metrics") => reply(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n",
        ),
        _ => reply(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "only /metrics is served here\n",
        ),
    }
}

fn reply(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::{Account, Credential};

    fn sources() -> Sources {
        let account = Account {
            name: "devstoreaccount1".into(),
            blob_endpoint: "http://127.0.0.1:9/devstoreaccount1".parse().unwrap(),
            credential: Credential::Anonymous,
        };
        Sources {
            info: MountInfo {
                mode: "fs".into(),
                fstype: "ext4".into(),
                read_only: false,
                snapshot: String::new(),
            },
            service: BlobService::new(account),
            cache: None,
            lease_held: Arc::new(|| true),
            warm: None,
        }
    }

    #[test]
    fn names_follow_the_conventions_and_carry_the_drive() {
        let text = render(&registry("disks/data.vhd", sources()));
        for want in [
            "# TYPE blobdrive_retries_total counter\n",
            "blobdrive_retries_total{drive=\"disks/data.vhd\"} 0\n",
            "# TYPE blobdrive_sent_bytes_total counter\n",
            "# TYPE blobdrive_lease_held gauge\n",
            "blobdrive_lease_held{drive=\"disks/data.vhd\"} 1\n",
            "# TYPE blobdrive_token_renewals_total counter\n",
            "# TYPE blobdrive_mount_info gauge\n",
            "# TYPE blobdrive_requests_given_up_total counter\n",
            "# TYPE blobdrive_last_success_timestamp_seconds gauge\n",
            "# TYPE process_resident_memory_bytes gauge\n",
            "# TYPE process_cpu_seconds_total counter\n",
            "process_open_fds{drive=\"disks/data.vhd\"} ",
            concat!(
                "blobdrive_mount_info{drive=\"disks/data.vhd\",mode=\"fs\",fstype=\"ext4\",read_only=\"false\",snapshot=\"\",version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1\n"
            ),
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }

    #[test]
    fn only_get_metrics_is_served() {
        let listener = bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reg = registry("c/d.vhd", sources());
        std::thread::spawn(move || serve(listener, reg));
        let ask = |req: &str| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        };
        let ok = ask("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
        assert!(
            ok.contains("blobdrive_lease_held{drive=\"c/d.vhd\"} 1"),
            "{ok}"
        );
        assert!(ask("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let long = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
        let mut c = TcpStream::connect(addr).unwrap();
        let _ = c.write_all(long.as_bytes());
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        // A second bind of the same address fails with one line.
        let err = bind(&addr.to_string()).unwrap_err();
        assert!(
            err.contains("cannot serve metrics on") && !err.contains('\n'),
            "{err}"
        );
        for bad in [
            "localhost",
            "127.0.0.1",
            ":9101",
            "a b:1",
            "[::1:9101",
            "h:99999",
        ] {
            assert!(bind(bad).unwrap_err().contains("HOST:PORT"), "{bad}");
        }
        // A host name is looked up.
        let named = bind("localhost:0").unwrap();
        assert!(named.local_addr().unwrap().ip().is_loopback());
    }

    #[test]
    fn a_client_that_trickles_its_request_neither_holds_the_port_nor_stays() {
        let listener = bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reg = registry("c/d.vhd", sources());
        std::thread::spawn(move || serve(listener, reg));
        // One byte a second, never a whole request.
        let slow = TcpStream::connect(addr).unwrap();
        let trickle = {
            let mut w = slow.try_clone().unwrap();
            std::thread::spawn(move || {
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(20) {
                    if w.write_all(b"G").is_err() {
                        return started.elapsed();
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                started.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out)
                .expect("a scrape answered while another client trickles");
            assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        }
        // The server hangs up on the trickling client (its writes then fail)
        // once the whole request's time is up, though bytes keep coming.
        let took = trickle.join().unwrap();
        drop(slow);
        assert!(
            took < Duration::from_secs(20),
            "the trickling client was kept for {took:?}"
        );
    }
}
