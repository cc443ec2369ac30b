//! A recording proxy on 127.0.0.1 between blobdrive and Azurite: it logs every
//! request that changes one blob (Create, Put Page with its bytes, Clear Pages,
//! Set Blob Properties for the length or the sequence number, metadata, leases,
//! snapshots, deletes) with when it reached the proxy, what the service did with
//! it and when, and when (and whether) its answer went back to blobdrive. Reads
//! pass through unrecorded.
//!
//! It can drop a share of the answers to writes and sequence-number raises: the
//! service carried the request out, and blobdrive sees its connection close
//! instead of the answer, the ambiguous case its retries and write fence are
//! for. And it can plant a fault for the replayer to find: the first Put Page
//! whose bytes hold a marker is answered 201 at once without reaching the
//! service, which gets it only later (or never): a write acknowledged before it
//! is applied.
//!
//! Every time is on one clock, [`Recorder::now`], which the workloads use too.

#![allow(dead_code)] // each test binary uses its own part of it

pub mod request;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::faultproxy::{forward, read_request, status_of};
pub use request::Op;
use request::{response_header, Head};

/// A write acknowledged before it is applied: the first Put Page whose body
/// contains `needle` (as `reader` reads it, once set) is answered 201 by the
/// proxy itself, and reaches the service `apply_after` later (never, if
/// `None`).
#[derive(Clone)]
pub struct Plant {
    pub needle: Vec<u8>,
    pub apply_after: Option<Duration>,
    /// What a Put Page's body says, given where it writes: set for a drive
    /// whose blob holds ciphertext, once it can be decrypted.
    pub reader: Arc<OnceLock<Reader>>,
}

/// Reads a Put Page's body written at a byte of the blob.
pub type Reader = Box<dyn Fn(u64, &[u8]) -> Vec<u8> + Send + Sync>;

pub struct Config {
    pub upstream_port: u16,
    /// The blob recorded, `container/name`; other requests pass unrecorded.
    pub blob: String,
    /// The share (0..1) of answers to writes and raises dropped after the
    /// service carried the request out.
    pub drop_rate: f64,
    /// The seed of the drops.
    pub seed: u64,
    pub plant: Option<Plant>,
}

/// What the service did with a request.
#[derive(Clone, Debug)]
pub struct Service {
    /// When the proxy passed it on.
    pub from: Duration,
    /// When the service's answer reached the proxy (it was carried out, or
    /// refused, between `from` and this).
    pub at: Duration,
    pub status: u16,
    /// The blob's sequence number in the answer (a raise's new number).
    pub sequence: Option<u64>,
    /// A snapshot's name (`x-ms-snapshot`).
    pub snapshot: Option<String>,
    /// `x-ms-error-code` of a refusal.
    pub code: Option<String>,
}

impl Service {
    pub fn applied(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// What became of a request's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Not (yet) answered.
    Pending,
    /// The answer with `status` was handed to blobdrive at `at` (it cannot
    /// have read it earlier).
    Delivered { at: Duration, status: u16 },
    /// The connection was closed at `at` instead of answering.
    Dropped { at: Duration },
}

/// One request that changes the blob.
#[derive(Clone, Debug)]
pub struct Record {
    pub op: Op,
    /// `x-ms-if-sequence-number-eq`: the write fence's number it carries.
    pub fence: Option<u64>,
    /// `x-ms-lease-id`.
    pub lease: Option<String>,
    /// A Put Page's bytes.
    pub body: Arc<Vec<u8>>,
    /// When its first byte reached the proxy (blobdrive sent it before).
    pub sent: Duration,
    /// `None` while the service has not answered it, or never got it.
    pub service: Option<Service>,
    pub answer: Answer,
    /// Answered by the proxy, not the service (a planted fault).
    pub planted: bool,
}

impl Record {
    /// Whether the service carried it out.
    pub fn applied(&self) -> bool {
        self.service.as_ref().is_some_and(Service::applied)
    }
}

struct Shared {
    cfg: Config,
    origin: Instant,
    records: Mutex<Vec<Record>>,
    rng: Mutex<StdRng>,
    planted: AtomicBool,
    /// Requests with an answer still to come (planted ones included).
    open: Mutex<u64>,
}

impl Shared {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn update(&self, id: usize, f: impl FnOnce(&mut Record)) {
        f(&mut self.records.lock().unwrap()[id]);
    }

    fn push(&self, r: Record) -> usize {
        let mut all = self.records.lock().unwrap();
        all.push(r);
        all.len() - 1
    }

    /// Whether this request's answer is to be dropped.
    fn drops(&self, op: &Op) -> bool {
        (op.is_write() || *op == Op::Raise)
            && self.cfg.drop_rate > 0.0
            && self.rng.lock().unwrap().gen_bool(self.cfg.drop_rate)
    }

    /// Whether this request is the one to plant the fault on; claims it if so.
    fn plants(&self, op: &Op, body: &[u8]) -> Option<Plant> {
        let p = self.cfg.plant.as_ref()?;
        let Op::Put { start, .. } = op else {
            return None;
        };
        if self.planted.load(SeqCst) {
            return None;
        }
        let read = p.reader.get().map(|read| read(*start, body));
        let hit = read
            .as_deref()
            .unwrap_or(body)
            .windows(p.needle.len())
            .any(|w| w == p.needle.as_slice());
        (hit && !self.planted.swap(true, SeqCst)).then(|| p.clone())
    }
}

/// The recorder's clock: time since it started.
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Clock {
    pub fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

pub struct Recorder {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Recorder {
    pub fn start(cfg: Config) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            rng: Mutex::new(StdRng::seed_from_u64(cfg.seed)),
            cfg,
            origin: Instant::now(),
            records: Mutex::new(Vec::new()),
            planted: AtomicBool::new(false),
            open: Mutex::new(0),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let s = s.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        Recorder { port, shared }
    }

    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{}/devstoreaccount1;",
            crate::common::azurite::DEV_KEY,
            self.port
        )
    }

    /// The clock of every record.
    pub fn now(&self) -> Duration {
        self.shared.now()
    }

    /// That clock, for the workloads to time their own steps on.
    pub fn clock(&self) -> Clock {
        Clock(self.shared.origin)
    }

    /// The records so far, in the order their requests arrived.
    pub fn records(&self) -> Vec<Record> {
        self.shared.records.lock().unwrap().clone()
    }

    /// Waits (two minutes at most) until no request is waiting for the
    /// service: a planted write has landed.
    pub fn wait_until_settled(&self) {
        crate::common::util::wait_for(
            "the recorded requests to settle",
            Duration::from_secs(120),
            || *self.shared.open.lock().unwrap() == 0,
        );
    }
}

fn serve(conn: TcpStream, s: &Arc<Shared>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        // The first byte's arrival is when blobdrive had sent the request.
        if reader.fill_buf().map_or(true, |b| b.is_empty()) {
            return;
        }
        let sent = s.now();
        let Some((head, body)) = read_request(&mut reader) else {
            return;
        };
        let parsed = Head::parse(&head);
        let ours = parsed.as_ref().is_some_and(|h| {
            h.path
                .strip_prefix("/devstoreaccount1/")
                .is_some_and(|p| p == s.cfg.blob)
        });
        let op = parsed.as_ref().filter(|_| ours).and_then(Head::op);
        let answer = match (op, parsed) {
            (Some(op), Some(h)) => record(s, op, &h, &head, body, sent),
            _ => forward(s.cfg.upstream_port, &head, &body),
        };
        match answer {
            Some(r) if writer.write_all(&r).is_ok() => {}
            _ => return,
        }
    }
}

/// Carries out one recorded request: the answer to hand back, `None` to close
/// the connection instead.
fn record(
    s: &Arc<Shared>,
    op: Op,
    h: &Head,
    head: &[u8],
    body: Vec<u8>,
    sent: Duration,
) -> Option<Vec<u8>> {
    let plant = s.plants(&op, &body);
    let drop = plant.is_none() && s.drops(&op);
    let id = s.push(Record {
        fence: h
            .header("x-ms-if-sequence-number-eq")
            .and_then(|v| v.parse().ok()),
        lease: h.header("x-ms-lease-id").map(str::to_string),
        body: Arc::new(if op.is_write() {
            body.clone()
        } else {
            Vec::new()
        }),
        op,
        sent,
        service: None,
        answer: Answer::Pending,
        planted: plant.is_some(),
    });
    *s.open.lock().unwrap() += 1;
    if let Some(p) = plant {
        let answer = planted_answer(h);
        s.update(id, |r| {
            r.answer = Answer::Delivered {
                at: s.now(),
                status: 201,
            }
        });
        let (s, head) = (s.clone(), head.to_vec());
        std::thread::spawn(move || {
            if let Some(after) = p.apply_after {
                std::thread::sleep(after);
                carry_out(&s, id, &head, &body);
            }
            *s.open.lock().unwrap() -= 1;
        });
        return Some(answer);
    }
    let resp = carry_out(s, id, head, &body);
    *s.open.lock().unwrap() -= 1;
    let Some(resp) = resp else {
        s.update(id, |r| r.answer = Answer::Dropped { at: s.now() });
        return None;
    };
    if drop {
        s.update(id, |r| r.answer = Answer::Dropped { at: s.now() });
        return None;
    }
    let status = status_of(&resp).unwrap_or(0);
    // Taken before the answer is written, so blobdrive cannot have it earlier.
    s.update(id, |r| {
        r.answer = Answer::Delivered {
            at: s.now(),
            status,
        }
    });
    Some(resp)
}

/// Passes request `id` on to the service and records what it did.
fn carry_out(s: &Shared, id: usize, head: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    let from = s.now();
    let resp = forward(s.cfg.upstream_port, head, body);
    let at = s.now();
    let resp = resp?;
    s.update(id, |r| {
        r.service = Some(Service {
            from,
            at,
            status: status_of(&resp).unwrap_or(0),
            sequence: response_header(&resp, "x-ms-blob-sequence-number")
                .and_then(|v| v.parse().ok()),
            snapshot: response_header(&resp, "x-ms-snapshot"),
            code: response_header(&resp, "x-ms-error-code"),
        })
    });
    Some(resp)
}

/// The answer the service gives a Put Page that it carried out, made up by the
/// proxy: what the client checks of it (the digests it sent echoed) is there.
fn planted_answer(h: &Head) -> Vec<u8> {
    let mut head = String::from("HTTP/1.1 201 Created\r\nContent-Length: 0\r\n");
    head.push_str("ETag: \"0x8DPLANTED\"\r\nx-ms-request-server-encrypted: false\r\n");
    head.push_str(&format!(
        "Date: {}\r\nx-ms-version: {}\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now()),
        h.header("x-ms-version").unwrap_or("2021-12-02")
    ));
    if let Some(n) = h.header("x-ms-if-sequence-number-eq") {
        head.push_str(&format!("x-ms-blob-sequence-number: {n}\r\n"));
    }
    for echoed in ["content-md5", "x-ms-content-crc64"] {
        if let Some(v) = h.header(echoed) {
            head.push_str(&format!("{echoed}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    head.into_bytes()
}
