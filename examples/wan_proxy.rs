//! A shaping proxy for the benchmarks' WAN profile: it stands between blobdrive
//! (or any client) and the emulator and makes 127.0.0.1 look like a storage account
//! a few milliseconds away, with Azure's per-blob scalability targets if asked.
//!
//! - **Latency**: every byte waits `--delay-ms` in each direction (a delay line per
//!   direction and connection, so pipelined and parallel traffic keeps its overlap,
//!   as on a real path). Bandwidth is not limited by the path.
//! - **Per-blob caps** (`--blob-requests-s`, `--blob-mib-s`): on arrival at the
//!   "server" end, each request to a blob takes from that blob's token buckets
//!   (requests, and bytes sent by Put Page or asked for by a ranged Get). An empty
//!   bucket gets `503 ServerBusy`, as the service throttles, with `Retry-After`
//!   only if `--retry-after SECONDS` is given (Azure's documentation promises none
//!   for storage and asks clients for exponential backoff); the request is not
//!   forwarded. Requests to containers and the account are free.
//! - **Counters**: `--stats-file` is rewritten every 200 ms with JSON: requests
//!   forwarded, requests refused with 503, and bytes each way.
//!
//! HTTP/1.1 only, as blobdrive speaks it: requests carry `Content-Length` bodies and
//! a connection sends its next request only after the previous answer, so a 503
//! can be written back in place of an answer.
//!
//! usage: wan_proxy --upstream HOST:PORT [--delay-ms MS] [--blob-requests-s N]
//!        [--blob-mib-s N] [--retry-after SECONDS] [--stats-file PATH]
//! Prints the port it listens on (127.0.0.1) on its first line of stdout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

/// How much burst a bucket holds: a quarter of a second of its rate (at least one
/// request, or one 4 MiB Put Page), so a cap holds over short windows too, while a
/// client's handful of parallel requests is not refused for arriving together.
const BURST_S: f64 = 0.25;

#[derive(Clone, Copy)]
struct Caps {
    requests_s: Option<f64>,
    bytes_s: Option<f64>,
}

/// One blob's buckets. Tokens may go negative by one request's worth: a request is
/// admitted while the bucket is positive, as a service measuring over a window does.
struct Buckets {
    requests: f64,
    bytes: f64,
    at: Instant,
}

#[derive(Default)]
struct Counters {
    forwarded: AtomicU64,
    refused: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

struct Shared {
    upstream: String,
    delay: Duration,
    caps: Caps,
    /// `Retry-After` sent with each 503, if any.
    retry_after: Option<String>,
    blobs: Mutex<HashMap<String, Buckets>>,
    counters: Counters,
}

impl Shared {
    /// Takes a request's cost from its blob's buckets; false when over the cap.
    fn admit(&self, blob: &str, bytes: u64) -> bool {
        let caps = self.caps;
        if caps.requests_s.is_none() && caps.bytes_s.is_none() {
            return true;
        }
        let now = Instant::now();
        let mut blobs = self.blobs.lock().unwrap();
        let b = blobs.entry(blob.to_string()).or_insert(Buckets {
            requests: caps.requests_s.map_or(0.0, |r| (r * BURST_S).max(1.0)),
            bytes: caps
                .bytes_s
                .map_or(0.0, |r| (r * BURST_S).max(4.0 * 1048576.0)),
            at: now,
        });
        let dt = now.duration_since(b.at).as_secs_f64();
        b.at = now;
        if let Some(r) = caps.requests_s {
            b.requests = (b.requests + r * dt).min((r * BURST_S).max(1.0));
        }
        if let Some(r) = caps.bytes_s {
            b.bytes = (b.bytes + r * dt).min((r * BURST_S).max(4.0 * 1048576.0));
        }
        let over = (caps.requests_s.is_some() && b.requests <= 0.0)
            || (caps.bytes_s.is_some() && b.bytes <= 0.0);
        if over {
            return false;
        }
        b.requests -= 1.0;
        b.bytes -= bytes as f64;
        true
    }
}

/// One request read whole from the client.
struct Request {
    bytes: Vec<u8>,
    /// The blob it acts on (path without query), if it names one.
    blob: Option<String>,
    /// Bytes it moves: its body, or the range it reads.
    cost: u64,
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(upstream) = arg(&args, "--upstream") else {
        eprintln!("usage: wan_proxy --upstream HOST:PORT [--delay-ms MS] [--blob-requests-s N] [--blob-mib-s N] [--retry-after SECONDS] [--stats-file PATH]");
        std::process::exit(2);
    };
    let num = |name: &str| arg(&args, name).map(|v| v.parse::<f64>().expect(name));
    let shared = Arc::new(Shared {
        upstream,
        delay: Duration::from_secs_f64(num("--delay-ms").unwrap_or(0.0) / 1000.0),
        caps: Caps {
            requests_s: num("--blob-requests-s"),
            bytes_s: num("--blob-mib-s").map(|m| m * 1048576.0),
        },
        retry_after: arg(&args, "--retry-after"),
        blobs: Mutex::new(HashMap::new()),
        counters: Counters::default(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().unwrap().port());
    if let Some(path) = arg(&args, "--stats-file") {
        let s = shared.clone();
        tokio::spawn(async move {
            loop {
                let c = &s.counters;
                let json = format!(
                    "{{\"forwarded\": {}, \"refused_503\": {}, \"bytes_up\": {}, \"bytes_down\": {}}}\n",
                    c.forwarded.load(Relaxed),
                    c.refused.load(Relaxed),
                    c.bytes_up.load(Relaxed),
                    c.bytes_down.load(Relaxed)
                );
                let tmp = format!("{path}.tmp");
                if std::fs::write(&tmp, json).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    loop {
        let (client, _) = listener.accept().await.expect("accept");
        let s = shared.clone();
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(&s.upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                serve(s, client, server).await;
            }
        });
    }
}

/// Carries one connection: client requests through the up delay line to the
/// server end (where caps apply), server bytes through the down delay line.
async fn serve(s: Arc<Shared>, client: TcpStream, server: TcpStream) {
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let (down_tx, down_rx) = unbounded_channel::<(Instant, Vec<u8>)>();
    let (up_tx, up_rx) = unbounded_channel::<(Instant, Request)>();
    let writer = tokio::spawn(write_down(down_rx, client_w));
    let server_end = tokio::spawn(server_end(s.clone(), up_rx, server_w, down_tx.clone()));
    let reader = tokio::spawn(read_down(s.clone(), server_r, down_tx));
    read_requests(&s, client_r, up_tx).await;
    // The client closed: let what is in flight finish, then close the server side.
    let _ = server_end.await;
    reader.abort();
    let _ = writer.await;
}

/// Parses requests off the client's stream and puts each on the up delay line.
async fn read_requests(s: &Shared, mut r: OwnedReadHalf, up: UnboundedSender<(Instant, Request)>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        let head_end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let body_len = header(&head, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < head_end + body_len {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let rest = buf.split_off(head_end + body_len);
        let bytes = std::mem::replace(&mut buf, rest);
        s.counters.bytes_up.fetch_add(bytes.len() as u64, Relaxed);
        let (blob, cost) = classify(&head, body_len as u64);
        let req = Request { bytes, blob, cost };
        if up.send((Instant::now() + s.delay, req)).is_err() {
            return;
        }
    }
}

/// The server end of the up line: applies the caps when a request arrives, then
/// forwards it or answers 503 down the line.
async fn server_end(
    s: Arc<Shared>,
    mut up: UnboundedReceiver<(Instant, Request)>,
    mut w: OwnedWriteHalf,
    down: UnboundedSender<(Instant, Vec<u8>)>,
) {
    while let Some((at, req)) = up.recv().await {
        tokio::time::sleep_until(at).await;
        if let Some(blob) = &req.blob {
            if !s.admit(blob, req.cost) {
                s.counters.refused.fetch_add(1, Relaxed);
                let body = "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>ServerBusy</Code><Message>Operations per second is over the blob limit.</Message></Error>";
                let hint = s
                    .retry_after
                    .as_ref()
                    .map(|v| format!("Retry-After: {v}\r\n"))
                    .unwrap_or_default();
                let resp = format!(
                    "HTTP/1.1 503 The server is busy.\r\nContent-Type: application/xml\r\nx-ms-error-code: ServerBusy\r\n{hint}Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = down.send((Instant::now() + s.delay, resp.into_bytes()));
                continue;
            }
        }
        s.counters.forwarded.fetch_add(1, Relaxed);
        if w.write_all(&req.bytes).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// Puts the server's bytes on the down delay line as they come.
async fn read_down(
    s: Arc<Shared>,
    mut r: OwnedReadHalf,
    down: UnboundedSender<(Instant, Vec<u8>)>,
) {
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                // The server closed (an idle keep-alive connection, say): the
                // client's side closes too, once what came before has arrived.
                let _ = down.send((Instant::now() + s.delay, Vec::new()));
                return;
            }
            Ok(n) => {
                s.counters.bytes_down.fetch_add(n as u64, Relaxed);
                if down
                    .send((Instant::now() + s.delay, chunk[..n].to_vec()))
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// The client end of the down line; an empty message closes the connection.
async fn write_down(mut down: UnboundedReceiver<(Instant, Vec<u8>)>, mut w: OwnedWriteHalf) {
    while let Some((at, bytes)) = down.recv().await {
        tokio::time::sleep_until(at).await;
        if bytes.is_empty() || w.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The blob a request acts on and the bytes it moves. Paths are
/// `/ACCOUNT/CONTAINER/BLOB` on the emulator and `/CONTAINER/BLOB` on Azure; a
/// container's own requests carry `restype=container`.
fn classify(head: &str, body_len: u64) -> (Option<String>, u64) {
    let target = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let segments = path.trim_matches('/').split('/').count();
    let blob = (segments >= 2 && !query.contains("restype=container")).then(|| path.to_string());
    let range = header(head, "x-ms-range")
        .or_else(|| header(head, "range"))
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?));
    let reads = head.starts_with("GET ") && !query.contains("comp=");
    (blob, if reads { range.unwrap_or(0) } else { body_len })
}
