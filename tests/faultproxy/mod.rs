//! A fault-injecting HTTP proxy on 127.0.0.1, between the daemon and Azurite.
//!
//! Each request is, with probability `rate`, answered with a fault instead of (or
//! after) being forwarded: 503 ServerBusy, 500 InternalError, 408, a reset before
//! the request reaches the server, a reset after the server applied it (the client
//! sees a broken response: the ambiguous case), or a stall past the client's
//! request timeout. Every request also gets a little random latency. Decisions come
//! from a seeded generator, so a run is reproducible in what it injects. The proxy
//! can also play dead (every connection reset) to stand for a lost backend, pause
//! (requests wait, unanswered, as if the server hung: Azurite under SIGSTOP), and
//! hold chosen requests and forward them anyway long after the client gave up on
//! them: a late commit, which the real service can do to any abandoned request.

#![allow(dead_code)] // each test binary uses its own part of the proxy

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Busy503,
    Internal500,
    Timeout408,
    ResetBefore,
    ResetAfter,
    Stall,
    /// Held for `stall`, long past the client's request timeout, then carried
    /// out anyway with nobody listening: a late commit.
    Late,
}

/// Every kind of fault, ordered so that each mix below is a prefix of it: first
/// those that answer at once, then the stall, then the late commit.
pub const ALL_AND_LATE: &[Fault] = &[
    Fault::Busy503,
    Fault::Internal500,
    Fault::Timeout408,
    Fault::ResetBefore,
    Fault::ResetAfter,
    Fault::Stall,
    Fault::Late,
];

/// The faults a proxy injects unless its config names others (late commits only
/// when asked for: each costs a whole request timeout).
pub const ALL: &[Fault] = ALL_AND_LATE.split_at(6).0;

/// The faults that answer at once (none needs a request timeout to be noticed):
/// the mix for tests at the shipped timeouts, where a stall would cost 20 s.
pub const QUICK: &[Fault] = ALL_AND_LATE.split_at(5).0;

/// Requests to hold, then forward anyway: those whose head contains every one of
/// `needles` (case-insensitive), at most `count` of them, each held for `delay`.
#[derive(Clone, Debug)]
pub struct Hold {
    pub needles: Vec<String>,
    pub count: usize,
    pub delay: Duration,
}

impl Hold {
    /// The first `count` Put Page (write) calls, each forwarded `delay` late.
    pub fn put_pages(count: usize, delay: Duration) -> Hold {
        Hold {
            needles: vec!["x-ms-page-write: update".into()],
            count,
            delay,
        }
    }
}

pub struct Config {
    pub upstream_port: u16,
    /// Probability (0..1) that a request is faulted.
    pub rate: f64,
    pub seed: u64,
    /// How long a stall lasts (longer than the client's request timeout).
    pub stall: Duration,
    /// Upper bound of the latency added to every request.
    pub max_latency: Duration,
    /// Requests to hold and then forward anyway (late commits).
    pub hold: Option<Hold>,
    /// The kinds of fault drawn from, with `rate`.
    pub kinds: &'static [Fault],
}

impl Config {
    /// A proxy that forwards everything, with no faults and no added latency.
    /// No faults; the first `count` requests whose head contains `needle` are
    /// each held `delay` and then forwarded anyway (late commits).
    pub fn holding(upstream_port: u16, needle: &str, count: usize, delay: Duration) -> Config {
        Config {
            hold: Some(Hold {
                needles: vec![needle.into()],
                count,
                delay,
            }),
            ..Config::clean(upstream_port)
        }
    }

    pub fn clean(upstream_port: u16) -> Config {
        Config {
            upstream_port,
            rate: 0.0,
            seed: 1,
            stall: Duration::from_secs(1),
            max_latency: Duration::ZERO,
            hold: None,
            kinds: ALL,
        }
    }
}

/// What became of a held request once it was forwarded.
#[derive(Clone, Debug)]
pub struct LateCommit {
    /// The request line and headers as the client sent them.
    pub head: String,
    /// The status the server answered the late request with (nobody listened).
    pub status: Option<u16>,
}

pub struct Proxy {
    pub port: u16,
    /// The seed of the proxy's draws (to replay a run).
    pub seed: u64,
    pub dead: Arc<AtomicBool>,
    /// While set, requests wait unanswered (nothing is forwarded) until it clears.
    pub paused: Arc<AtomicBool>,
    /// While set, every request is answered 200 with a body that never ends (no
    /// length, zeros until the client hangs up): a hostile endpoint.
    pub endless: Arc<AtomicBool>,
    /// Held requests that were forwarded late, with the server's answer.
    pub late: Arc<Mutex<Vec<LateCommit>>>,
    /// Requests being held right now (not yet forwarded).
    pub holding: Arc<AtomicU64>,
    /// Requests waiting while `paused` is set: how many the client has in flight.
    pub waiting: Arc<AtomicU64>,
    pub faults: Arc<Mutex<Vec<Fault>>>,
    pub requests: Arc<AtomicU64>,
    /// Bytes carried both ways: requests (heads and bodies) and answers.
    pub bytes: Arc<AtomicU64>,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Proxy {
    pub fn start(cfg: Config) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            dead: Arc::new(AtomicBool::new(false)),
            paused: Arc::new(AtomicBool::new(false)),
            endless: Arc::new(AtomicBool::new(false)),
            faults: Arc::new(Mutex::new(Vec::new())),
            requests: Arc::new(AtomicU64::new(0)),
            bytes: Arc::new(AtomicU64::new(0)),
            late: Arc::new(Mutex::new(Vec::new())),
            holding: Arc::new(AtomicU64::new(0)),
            waiting: Arc::new(AtomicU64::new(0)),
            held: AtomicU64::new(0),
            rng: Mutex::new(Rng(cfg.seed)),
            cfg,
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                if s.dead.load(Relaxed) {
                    drop(conn);
                    continue;
                }
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        Proxy {
            port,
            seed: shared.cfg.seed,
            dead: shared.dead.clone(),
            paused: shared.paused.clone(),
            endless: shared.endless.clone(),
            late: shared.late.clone(),
            holding: shared.holding.clone(),
            waiting: shared.waiting.clone(),
            faults: shared.faults.clone(),
            requests: shared.requests.clone(),
            bytes: shared.bytes.clone(),
        }
    }

    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{}/devstoreaccount1;",
            crate::common::azurite::DEV_KEY,
            self.port
        )
    }

    pub fn injected(&self) -> Vec<Fault> {
        self.faults.lock().unwrap().clone()
    }

    /// Waits (a minute at most) until every request held back has been carried
    /// out: the late commits are all counted then.
    pub fn wait_for_held(&self) {
        crate::common::util::wait_for(
            "the held requests to go out",
            Duration::from_secs(60),
            || self.holding.load(Relaxed) == 0,
        );
    }

    /// Waits (`limit` at most) until a request is being held.
    pub fn wait_for_holding(&self, what: &str, limit: Duration) {
        crate::common::util::wait_for(&format!("{what} to be held"), limit, || {
            self.holding.load(Relaxed) > 0
        });
    }

    /// The late commits, once there is one (within `limit`).
    pub fn wait_for_late_commit(&self, limit: Duration) -> Vec<LateCommit> {
        crate::common::util::wait_for("the held request to land", limit, || {
            !self.late_commits().is_empty()
        });
        self.late_commits()
    }

    /// For a scenario that holds one request (`what`) until it is over: checks
    /// that the request is still held (else the run proved nothing), waits for
    /// it to land, and checks that the service refused it (412).
    pub fn held_lands_late_and_is_refused(&self, what: &str) {
        assert!(
            self.late_commits().is_empty(),
            "the held {what} landed before the scenario ended: this run tests nothing"
        );
        self.wait_for_held();
        let late = self.late_commits();
        assert_eq!(late.len(), 1, "{what}: {late:?}");
        assert_eq!(late[0].status, Some(412), "{what}: {late:?}");
    }

    /// The late commits so far.
    pub fn late_commits(&self) -> Vec<LateCommit> {
        self.late.lock().unwrap().clone()
    }
}

/// What every connection's thread shares.
struct Shared {
    cfg: Config,
    dead: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    endless: Arc<AtomicBool>,
    faults: Arc<Mutex<Vec<Fault>>>,
    requests: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    late: Arc<Mutex<Vec<LateCommit>>>,
    holding: Arc<AtomicU64>,
    waiting: Arc<AtomicU64>,
    /// Requests held so far (at most `hold.count`).
    held: AtomicU64,
    rng: Mutex<Rng>,
}

impl Shared {
    /// Holds a request for `delay`, then carries it out with nobody listening.
    fn commit_late(&self, delay: Duration, head: &[u8], body: &[u8]) {
        self.holding.fetch_add(1, Relaxed);
        std::thread::sleep(delay);
        let status = forward(self.cfg.upstream_port, head, body).and_then(|r| status_of(&r));
        self.late.lock().unwrap().push(LateCommit {
            head: String::from_utf8_lossy(head).to_string(),
            status,
        });
        self.holding.fetch_sub(1, Relaxed);
    }

    /// Whether this request is one to hold and forward late; counts it if so.
    fn take_hold(&self, head: &[u8]) -> Option<Duration> {
        let h = self.cfg.hold.as_ref()?;
        let text = String::from_utf8_lossy(head).to_ascii_lowercase();
        if !h
            .needles
            .iter()
            .all(|n| text.contains(&n.to_ascii_lowercase()))
        {
            return None;
        }
        let n = self.held.fetch_add(1, Relaxed);
        (n < h.count as u64).then_some(h.delay)
    }
}

/// One request from `r`: its head and body (`None` once the client is gone).
pub fn read_request(r: &mut BufReader<TcpStream>) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        let end = line == b"\r\n";
        head.extend_from_slice(&line);
        if end {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// Forwards one request on a fresh upstream connection; returns the raw response.
pub fn forward(port: u16, head: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    let mut up = TcpStream::connect(("127.0.0.1", port)).ok()?;
    up.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.split("\r\n") {
        if line.to_ascii_lowercase().starts_with("connection:") || line.is_empty() {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    up.write_all(out.as_bytes()).ok()?;
    up.write_all(body).ok()?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp).ok()?;
    // Keep the client's connection alive: drop the upstream's close.
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&resp[..split]).to_string();
    let kept: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect::<Vec<_>>()
        .join("\r\n");
    let mut fixed = kept.into_bytes();
    fixed.extend_from_slice(&resp[split..]);
    Some(fixed)
}

fn error_response(status: u16, code: &str) -> Vec<u8> {
    let body = format!("<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error>");
    format!(
        "HTTP/1.1 {status} Injected\r\nx-ms-error-code: {code}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status code of a raw HTTP response.
pub fn status_of(resp: &[u8]) -> Option<u16> {
    let line = resp.split(|b| *b == b'\n').next()?;
    String::from_utf8_lossy(line)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn serve(conn: TcpStream, s: &Shared) {
    let cfg = &s.cfg;
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    while let Some((head, body)) = read_request(&mut reader) {
        if s.dead.load(Relaxed) {
            return;
        }
        s.requests.fetch_add(1, Relaxed);
        s.bytes.fetch_add((head.len() + body.len()) as u64, Relaxed);
        if s.paused.load(Relaxed) {
            s.waiting.fetch_add(1, Relaxed);
            while s.paused.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            s.waiting.fetch_sub(1, Relaxed);
        }
        if s.endless.load(Relaxed) {
            let _ = writer.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
            let zeros = vec![0u8; 64 << 10];
            while writer.write_all(&zeros).is_ok() {}
            return;
        }
        if let Some(delay) = s.take_hold(&head) {
            // The client gives up long before this; the request lands anyway.
            return s.commit_late(delay, &head, &body);
        }
        let (fault, latency) = {
            let mut g = s.rng.lock().unwrap();
            let kinds = cfg.kinds;
            let fault = (g.unit() < cfg.rate && !kinds.is_empty())
                .then(|| kinds[(g.next() % kinds.len() as u64) as usize]);
            let latency =
                Duration::from_micros(g.next() % (cfg.max_latency.as_micros() as u64 + 1));
            (fault, latency)
        };
        std::thread::sleep(latency);
        if let Some(f) = fault {
            s.faults.lock().unwrap().push(f);
        }
        let resp = match fault {
            Some(Fault::Busy503) => error_response(503, "ServerBusy"),
            Some(Fault::Internal500) => error_response(500, "InternalError"),
            Some(Fault::Timeout408) => error_response(408, "RequestTimeout"),
            Some(Fault::ResetBefore) => return,
            Some(Fault::Stall) => {
                std::thread::sleep(cfg.stall);
                return;
            }
            Some(Fault::Late) => return s.commit_late(cfg.stall, &head, &body),
            Some(Fault::ResetAfter) => {
                // The server applies the request; the client sees half an answer.
                if let Some(r) = forward(cfg.upstream_port, &head, &body) {
                    let _ = writer.write_all(&r[..r.len().min(12)]);
                }
                return;
            }
            None => match forward(cfg.upstream_port, &head, &body) {
                Some(r) => r,
                None => return,
            },
        };
        s.bytes.fetch_add(resp.len() as u64, Relaxed);
        if writer.write_all(&resp).is_err() {
            return;
        }
    }
}
