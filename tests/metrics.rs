//! `mount --metrics ADDR:PORT`: a mount's figures for Prometheus, checked with
//! Prometheus's own tools (`promtool check metrics`, and a real Prometheus server
//! scraping the mount and answering a query), and moving as the I/O a test does
//! says they must. Prometheus and promtool are Debian's, unpacked into
//! target/tools/prometheus by scripts/install-deps.sh.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::bd::Harness;
use common::mount::require_root;
use common::util::{free_port, http_get as get, json, wait_for, wait_for_some};

const MIB: u64 = 1 << 20;

const BD: Harness = Harness::new("metrics-run");

fn tool(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/tools/prometheus/usr/bin")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-deps.sh",
        p.display()
    );
    p
}

fn scrape(port: u16) -> String {
    let (status, body) = get(port, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    body
}

/// The value of the one sample of `name` whose labels include every `labels` pair.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in:\n{text}");
    found[0]
}

/// A Prometheus server on loopback scraping `targets` every second, stopped (by
/// pid) when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[u16]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let targets: Vec<String> = targets.iter().map(|t| format!("'127.0.0.1:{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: blobdrive\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("log")).unwrap(),
            ))
            .spawn()
            .unwrap();
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// The result of an instant query, once it has any (within 60 s).
    fn query(&self, promql: &str) -> serde_json::Value {
        self.query_until(promql, |r| !r.is_empty())
    }

    /// The result of an instant query, once `done` holds for it (within 60 s).
    fn query_until(
        &self,
        promql: &str,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> serde_json::Value {
        let encoded = encode(promql);
        wait_for_some(
            &format!("Prometheus to have such a result for {promql}"),
            Duration::from_secs(60),
            Duration::from_millis(500),
            || {
                TcpStream::connect(("127.0.0.1", self.port)).ok()?;
                let (status, body) = get(self.port, &format!("/api/v1/query?query={encoded}"));
                let v = json(status.contains(" 200 ").then_some(&body)?);
                let result = &v["data"]["result"];
                result
                    .as_array()
                    .is_some_and(|r| done(r))
                    .then(|| result.clone())
            },
        )
    }
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes and reads known amounts through a raw mount and checks that the
/// figures moved by exactly that, that promtool finds the output clean, and that
/// a Prometheus server scraping the mount answers a query for the Put Page
/// requests.
#[test]
fn metrics_move_with_io_pass_promtool_and_are_scraped_by_prometheus() {
    require_root();
    let spec = BD.new_drive("metrics", "64MiB");
    let mp = BD.mp();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let caches = BD.run_dir().join("disk-caches");
    common::util::private_dir(&caches);
    BD.ok(&[
        "mount",
        &spec,
        mp.s(),
        "--mode",
        "raw",
        "--metrics",
        &addr,
        "--disk-cache",
        caches.to_str().unwrap(),
    ]);
    let drive = spec.as_str();
    let before = scrape(port);
    let at = |text: &str, name: &str| value(text, name, &[("drive", drive)]);
    // Write 3 MiB and fsync; read 1 MiB of it back (cached) and 2 MiB of a hole.
    let disk = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mp.disk())
        .unwrap();
    let data: Vec<u8> = (0..3 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    // In pieces no larger than one FUSE request: the file is opened for direct
    // I/O, so one 3 MiB write is cut where the buffer's pages end, and with a heap
    // buffer not page-aligned those cuts fall inside sectors. A sector written by
    // two requests with a flush between them is rightly sent twice (seen once in
    // a fresh-clone run: 3 MiB + 512 sent), which this test is not about.
    for (i, piece) in data.chunks(256 * 1024).enumerate() {
        disk.write_all_at(piece, MIB + (i * 256 * 1024) as u64)
            .unwrap();
    }
    disk.sync_all().unwrap();
    let mut back = vec![0u8; MIB as usize];
    disk.read_exact_at(&mut back, MIB).unwrap();
    assert_eq!(back, data[..MIB as usize]);
    let mut hole = vec![1u8; 2 * MIB as usize];
    disk.read_exact_at(&mut hole, 32 * MIB).unwrap();
    assert!(hole.iter().all(|b| *b == 0));
    drop(disk);
    let after = scrape(port);
    let moved = |name: &str| at(&after, name) - at(&before, name);
    assert_eq!(moved("blobdrive_written_bytes_total"), (3 * MIB) as f64);
    assert_eq!(moved("blobdrive_sent_bytes_total"), (3 * MIB) as f64);
    assert_eq!(moved("blobdrive_read_bytes_total"), (3 * MIB) as f64);
    assert!(moved("blobdrive_hole_reads_total") >= 1.0);
    assert_eq!(at(&after, "blobdrive_dirty_bytes"), 0.0);
    assert_eq!(at(&after, "blobdrive_lease_held"), 1.0);
    assert_eq!(at(&after, "blobdrive_stalled_seconds"), 0.0);
    // What was written went to the disk cache once on the blob; nothing was
    // read from it (the memory cache answered).
    assert_eq!(
        moved("blobdrive_disk_cache_stored_bytes_total"),
        (3 * MIB) as f64
    );
    assert_eq!(moved("blobdrive_disk_cache_read_bytes_total"), 0.0);
    assert_eq!(
        at(&after, "blobdrive_disk_cache_held_bytes"),
        (3 * MIB) as f64
    );
    assert_eq!(at(&after, "blobdrive_disk_cache_on"), 1.0);
    // What stats --json says, as figures: the disk, the fsync's flush, the
    // dirty limit (half the memory cache), no error, a recent success.
    assert_eq!(at(&after, "blobdrive_disk_size_bytes"), (64 * MIB) as f64);
    assert!(at(&after, "blobdrive_allocated_bytes") >= (3 * MIB) as f64);
    assert!(moved("blobdrive_flushes_total") >= 1.0);
    assert_eq!(
        at(&after, "blobdrive_dirty_limit_bytes"),
        at(&after, "blobdrive_cache_size_bytes") / 2.0
    );
    assert_eq!(at(&after, "blobdrive_write_waits_total"), 0.0);
    assert_eq!(at(&after, "blobdrive_io_errors_total"), 0.0);
    assert_eq!(at(&after, "blobdrive_lease_renewal_failures_total"), 0.0);
    assert_eq!(at(&after, "blobdrive_requests_given_up_total"), 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let last = at(&after, "blobdrive_last_success_timestamp_seconds");
    assert!(now - last < 30.0 && last <= now + 1.0, "{last} {now}");
    // The daemon's own figures, under the standard names.
    let rss = at(&after, "process_resident_memory_bytes");
    assert!(rss > MIB as f64 && rss < (1u64 << 30) as f64, "{rss}");
    assert!(at(&after, "process_open_fds") >= 3.0);
    assert!(at(&after, "process_cpu_seconds_total") > 0.0);
    let started = at(&after, "process_start_time_seconds");
    assert!(started <= now && started > now - 600.0, "{started} {now}");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        value(
            &after,
            "blobdrive_mount_info",
            &[
                ("drive", drive),
                ("mode", "raw"),
                ("fstype", ""),
                ("read_only", "false"),
                ("snapshot", ""),
                ("version", version),
            ],
        ),
        1.0
    );
    let put_ok = value(
        &after,
        "blobdrive_requests_total",
        &[("operation", "put_page"), ("outcome", "ok")],
    );
    // 3 MiB coalesced into runs of at most 4 MiB: one to three requests.
    assert!((1.0..=3.0).contains(&put_ok), "{put_ok}");
    let timed = value(
        &after,
        "blobdrive_request_duration_seconds_count",
        &[("operation", "put_page")],
    );
    assert_eq!(timed, put_ok, "every Put Page attempt is timed");
    let inf = value(
        &after,
        "blobdrive_request_duration_seconds_bucket",
        &[("operation", "put_page"), ("le", "+Inf")],
    );
    assert_eq!(inf, timed);
    // Nothing secret: the account key is nowhere in it.
    let key_part = &common::azurite::DEV_KEY[..16];
    assert!(!after.contains(key_part));
    // Prometheus's own linter.
    let mut check = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(after.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Anything but GET /metrics is refused.
    assert!(get(port, "/").0.contains(" 404 "));
    // A real Prometheus scrapes it and answers for the Put Page requests.
    let prom = Prometheus::start(&[port]);
    let result = prom.query(r#"blobdrive_requests_total{operation="put_page",outcome="ok"}"#);
    let got: f64 = result[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(got, put_ok, "{result}");
    assert_eq!(result[0]["metric"]["drive"], drive, "{result}");
    // Every query of the manual's metrics page and the Grafana dashboard in
    // contrib/ is one Prometheus accepts.
    let dashboard = json(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/contrib/grafana-dashboard.json"
        ))
        .unwrap(),
    );
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    // The page's queries: the lines of its ```promql blocks, comments aside.
    let mut in_promql = false;
    for line in page.lines() {
        if line.starts_with("```") {
            in_promql = line == "```promql";
        } else if in_promql && !line.starts_with('#') && !line.trim().is_empty() {
            queries.push(line.to_string());
        }
    }
    assert!(queries.len() >= 12, "{queries:?}");
    for q in &queries {
        let q = q.replace("$__rate_interval", "1m").replace("$drive", ".*");
        let (status, body) = get(prom.port, &format!("/api/v1/query?query={}", encode(&q)));
        assert!(status.contains(" 200 "), "{q}: {status} {body}");
    }
    drop(prom);
    BD.ok(&["unmount", mp.s()]);
    // The port is free again once the daemon is gone. `unmount` returns when its
    // main thread has exited; the socket closes when the last of its threads has
    // (one finishing a FUSE request can take a moment).
    wait_for(
        &format!("the metrics port {addr} to be released"),
        Duration::from_secs(10),
        || TcpListener::bind(&addr).is_ok(),
    );
}

/// An address in use fails the mount with one line, leaving nothing mounted and
/// the lease free.
#[test]
fn a_metrics_address_in_use_fails_the_mount_with_one_line() {
    require_root();
    let spec = BD.new_drive("metricsbusy", "64MiB");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mp = BD.mp();
    let err = BD
        .cmd(&["mount", &spec, mp.s(), "--metrics", &addr])
        .fails_in_one_line();
    assert!(
        err.contains(&format!("cannot serve metrics on {addr}")),
        "{err}"
    );
    let lease = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(lease["state"], "available");
    let list = BD.ok(&["list", "--json"]);
    assert!(!list.contains(mp.s()), "{list}");
}

/// The lease alert of the manual's metrics page, as Prometheus evaluates it over a writable and a
/// read-only mount of one drive: nothing while the writable one holds its lease
/// (the read-only one holds none by design, and `blobdrive_mount_info` says so),
/// and the writable one alone once its lease is broken from elsewhere.
#[test]
fn the_lease_alert_names_only_a_writable_mount_that_lost_its_lease() {
    require_root();
    let spec = BD.new_drive("metricslease", "64MiB");
    let (writer, reader) = (BD.mp(), BD.mp());
    let (wport, rport) = (free_port(), free_port());
    for (mp, port, ro) in [
        (&writer, wport, None),
        (&reader, rport, Some("--read-only")),
    ] {
        let addr = format!("127.0.0.1:{port}");
        let mut args = vec!["mount", &spec, mp.s(), "--mode", "raw", "--metrics", &addr];
        args.extend(ro);
        BD.ok(&args);
    }
    let info = |port: u16, read_only: &str| {
        value(
            &scrape(port),
            "blobdrive_mount_info",
            &[
                ("drive", spec.as_str()),
                ("read_only", read_only),
                ("mode", "raw"),
            ],
        )
    };
    assert_eq!(info(wport, "false"), 1.0);
    assert_eq!(info(rport, "true"), 1.0);
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let alert = page
        .lines()
        .find(|l| l.starts_with("blobdrive_lease_held == 0"))
        .expect("the lease alert of docs/metrics.md");
    let prom = Prometheus::start(&[wport, rport]);
    // Both scraped, the lease held: the alert names nothing.
    prom.query_until("count(blobdrive_mount_info)", |r| {
        r.first().is_some_and(|v| v["value"][1] == "2")
    });
    let (status, body) = get(prom.port, &format!("/api/v1/query?query={}", encode(alert)));
    assert!(status.contains(" 200 "), "{status} {body}");
    assert_eq!(
        json(&body)["data"]["result"],
        serde_json::json!([]),
        "{alert}"
    );
    common::mount::break_lease_from_elsewhere(&BD.cs(), &spec);
    // The lease keeper's next renewal (within 10 s) finds it gone: the alert
    // fires for the writable mount alone, and that renewal is counted.
    let fired = prom.query(alert);
    let fired = fired.as_array().unwrap();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0]["metric"]["drive"], spec.as_str());
    assert_eq!(
        fired[0]["metric"]["instance"],
        format!("127.0.0.1:{wport}"),
        "{fired:?}"
    );
    drop(prom);
    let drive = [("drive", spec.as_str())];
    let renewal_failures = value(
        &scrape(wport),
        "blobdrive_lease_renewal_failures_total",
        &drive,
    );
    assert!(renewal_failures >= 1.0, "{renewal_failures}");
    // A write now fails, and is counted as an EIO returned.
    let disk = std::fs::OpenOptions::new()
        .write(true)
        .open(writer.disk())
        .unwrap();
    let failed = disk
        .write_all_at(&[7u8; 4096], 0)
        .and_then(|()| disk.sync_all());
    assert!(failed.is_err(), "a write without the lease succeeded");
    drop(disk);
    let eio = value(&scrape(wport), "blobdrive_io_errors_total", &drive);
    assert!(eio >= 1.0, "{eio}");
    BD.ok(&["unmount", reader.s()]);
    // Its lease is gone; whether its unmount says so depends on whether the
    // failed write left anything dirty.
    let _ = BD.cmd(&["unmount", writer.s()]).output();
}

/// The alert rules shipped in contrib/ pass `promtool check rules`, and
/// `promtool test rules` plays them cases (tests/fixtures/prometheus/): the lease
/// alert for a writable mount that lost its lease and never for a read-only
/// one, EIO to applications, a stall.
#[test]
fn the_shipped_alert_rules_pass_promtool() {
    let root = env!("CARGO_MANIFEST_DIR");
    for args in [
        ["check", "rules", "contrib/blobdrive-alerts.yml"],
        ["test", "rules", "tests/fixtures/prometheus/alerts-test.yml"],
    ] {
        let out = Command::new(tool("promtool"))
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
