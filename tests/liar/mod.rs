//! A rewriting proxy on 127.0.0.1, between blobdrive and Azurite, that tells
//! chosen lies. Every request is forwarded to Azurite as it came; the answer to
//! a request a [`Rule`] names is rewritten as the rule's [`Lie`] says, as many
//! times as the rule says, and every other answer is passed on as it is. What
//! is really on the blob the tests read beside it, with the Python SDK talking
//! to Azurite directly. Requests are read and forwarded as the fault proxy
//! does (`tests/faultproxy`), which a binary using this one declares too.

#![allow(dead_code)] // each test binary uses its own part of the proxy

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What an answer is turned into.
#[derive(Clone, Debug)]
pub enum Lie {
    /// A 200 with this body (`application/xml`) instead of the service's
    /// answer; the request is still carried out.
    Body(Vec<u8>),
    /// The service's answer, its body gzip-compressed and said to be so
    /// (`Content-Encoding: gzip`), though no encoding was asked for.
    Gzipped,
    /// Every `<Start>` of a page list moved up and every `<End>` down by this
    /// many bytes: ranges off the 512-byte grid, each a little inside the truth.
    RangesInBy(u64),
    /// A ranged read answered with the bytes of the range this many bytes
    /// further on (or back), body and `Content-Range` alike.
    OtherRange(i64),
    /// The body cut to its first this many bytes, `Content-Length` saying so.
    Short(usize),
    /// The answer's header set to this value.
    Header(&'static str, String),
    /// The request carried out, its answer lost: the connection closes.
    AnswerLost,
    /// A 200 page list whose body never ends, one byte a chunk, a chunk every
    /// this long (the request is not forwarded).
    Trickle(Duration),
    /// The request refused with this status and error code, as the service
    /// refuses one (it is not forwarded).
    Refuse(u16, &'static str),
}

/// Which answers to rewrite, how, and how many times.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Every one must be in the request's head (case-insensitive); one that
    /// starts with `!` must not be.
    pub needles: Vec<String>,
    /// How many answers to rewrite (`usize::MAX`: every one).
    pub times: usize,
    pub lie: Lie,
}

impl Rule {
    /// Get Page Ranges answers.
    pub fn page_lists(times: usize, lie: Lie) -> Rule {
        Rule::on(&["comp=pagelist"], times, lie)
    }

    /// Ranged reads (`x-ms-range` on a GET of the blob itself) starting at
    /// `offset`, or all of them.
    pub fn reads(offset: Option<u64>, times: usize, lie: Lie) -> Rule {
        let at = match offset {
            Some(o) => format!("x-ms-range: bytes={o}-"),
            None => "x-ms-range: bytes=".to_string(),
        };
        Rule::on(&["get /", &at, "!comp="], times, lie)
    }

    /// Requests whose head holds every one of `needles`.
    pub fn on(needles: &[&str], times: usize, lie: Lie) -> Rule {
        Rule {
            needles: needles.iter().map(|n| n.to_ascii_lowercase()).collect(),
            times,
            lie,
        }
    }

    fn matches(&self, head: &str) -> bool {
        self.times > 0
            && self.needles.iter().all(|n| match n.strip_prefix('!') {
                Some(absent) => !head.contains(absent),
                None => head.contains(n.as_str()),
            })
    }
}

/// Reads `len` bytes at an offset of a blob (container/blob).
type ReadRange = Arc<dyn Fn(&str, u64, u64) -> Vec<u8> + Send + Sync>;

/// A running liar.
pub struct Liar {
    pub port: u16,
    upstream: u16,
    rules: Arc<Mutex<Vec<Rule>>>,
    /// The request line of each answer lied about, in order.
    told: Arc<Mutex<Vec<String>>>,
    /// Reads the bytes of another range for [`Lie::OtherRange`].
    other: ReadRange,
}

impl Liar {
    /// A liar in front of the Azurite at `upstream`, telling no lie until one
    /// is added; `other` reads a range of a blob for [`Lie::OtherRange`].
    pub fn start(
        upstream: u16,
        other: impl Fn(&str, u64, u64) -> Vec<u8> + Send + Sync + 'static,
    ) -> Liar {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let liar = Liar {
            port: listener.local_addr().unwrap().port(),
            upstream,
            rules: Arc::default(),
            told: Arc::default(),
            other: Arc::new(other),
        };
        let shared = liar.shared();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let s = shared.clone();
                std::thread::spawn(move || serve(conn, &s));
            }
        });
        liar
    }

    fn shared(&self) -> Shared {
        Shared {
            upstream: self.upstream,
            rules: self.rules.clone(),
            told: self.told.clone(),
            other: self.other.clone(),
        }
    }

    /// Tells `rule`'s lie from now on.
    pub fn add(&self, rule: Rule) {
        self.rules.lock().unwrap().push(rule);
    }

    /// Tells no lie any more.
    pub fn clear(&self) {
        self.rules.lock().unwrap().clear();
    }

    /// The request lines of the answers lied about so far.
    pub fn told(&self) -> Vec<String> {
        self.told.lock().unwrap().clone()
    }

    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{}/devstoreaccount1;",
            crate::common::azurite::DEV_KEY,
            self.port
        )
    }
}

#[derive(Clone)]
struct Shared {
    upstream: u16,
    rules: Arc<Mutex<Vec<Rule>>>,
    told: Arc<Mutex<Vec<String>>>,
    other: ReadRange,
}

impl Shared {
    /// The lie to tell about the request `head`, if any (counted as told).
    fn lie_for(&self, head: &[u8]) -> Option<Lie> {
        let text = String::from_utf8_lossy(head).to_ascii_lowercase();
        let mut rules = self.rules.lock().unwrap();
        let rule = rules.iter_mut().find(|r| r.matches(&text))?;
        if rule.times != usize::MAX {
            rule.times -= 1;
        }
        let line = text.lines().next().unwrap_or_default().to_string();
        self.told.lock().unwrap().push(line);
        Some(rule.lie.clone())
    }
}

fn serve(conn: TcpStream, s: &Shared) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    while let Some((head, body)) = crate::faultproxy::read_request(&mut reader) {
        let lie = s.lie_for(&head);
        if let Some(Lie::Trickle(every)) = lie {
            return trickle(&mut writer, every);
        }
        if let Some(Lie::Refuse(status, code)) = lie {
            if writer.write_all(&refusal(status, code)).is_err() {
                return;
            }
            continue;
        }
        let Some(answer) = crate::faultproxy::forward(s.upstream, &head, &body) else {
            return;
        };
        let answer = match lie {
            None => answer,
            Some(Lie::AnswerLost) => return,
            Some(lie) => tell(lie, &head, answer, s),
        };
        if writer.write_all(&answer).is_err() {
            return;
        }
    }
}

/// The value of the header `name` (lower case) in a request's or answer's head.
fn header_of(head: &[u8], name: &str) -> Option<String> {
    String::from_utf8_lossy(head).lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// An answer taken apart: its status line, headers and (de-chunked) body.
struct Answer {
    status_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn parse(raw: &[u8]) -> Option<Answer> {
        let head_len = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = String::from_utf8_lossy(&raw[..head_len]).to_string();
        let mut lines = head.split("\r\n");
        let status_line = lines.next()?.to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        let rest = &raw[head_len..];
        let body = if chunked {
            dechunk(rest)?
        } else {
            rest.to_vec()
        };
        Some(Answer {
            status_line,
            headers,
            body,
        })
    }

    fn status(&self) -> u16 {
        self.status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, name: &str, value: &str) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self.headers.push((name.to_string(), value.to_string()));
    }

    /// The answer as sent: its body whole, with a `Content-Length` saying so.
    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.status_line);
        for (k, v) in &self.headers {
            let lower = k.to_ascii_lowercase();
            if ["content-length", "transfer-encoding", "connection"].contains(&lower.as_str()) {
                continue;
            }
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str(&format!("Content-Length: {}\r\n\r\n", self.body.len()));
        let mut out = out.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// The answer `raw` to the request `head` with `lie` told.
fn tell(lie: Lie, head: &[u8], raw: Vec<u8>, s: &Shared) -> Vec<u8> {
    let Some(mut a) = Answer::parse(&raw) else {
        return raw;
    };
    match lie {
        Lie::Body(body) => {
            a.status_line = "HTTP/1.1 200 OK".into();
            a.set("Content-Type", "application/xml");
            a.body = body;
        }
        Lie::Gzipped => {
            a.body = gzip(&a.body);
            a.set("Content-Encoding", "gzip");
        }
        Lie::RangesInBy(n) => a.body = ranges_in_by(&a.body, n),
        Lie::OtherRange(by) => other_range(&mut a, head, by, s),
        Lie::Short(keep) => a.body.truncate(keep),
        Lie::Header(name, value) => a.set(name, &value),
        Lie::AnswerLost | Lie::Trickle(_) | Lie::Refuse(..) => {
            unreachable!("told before forwarding")
        }
    }
    a.bytes()
}

/// An error answer as the service sends one.
fn refusal(status: u16, code: &str) -> Vec<u8> {
    Answer {
        status_line: format!("HTTP/1.1 {status} Refused"),
        headers: vec![
            ("x-ms-error-code".into(), code.into()),
            ("Content-Type".into(), "application/xml".into()),
        ],
        body: format!("<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{code}</Code><Message>told by the test's liar</Message></Error>").into_bytes(),
    }
    .bytes()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut child = Command::new("gzip")
        .arg("-c")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run gzip");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    out.stdout
}

/// A page list with every range moved `n` bytes in at both ends.
fn ranges_in_by(body: &[u8], n: u64) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let moved = |text: &str, tag: &str, delta: i64| -> String {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(&open) {
            let value_at = at + open.len();
            let Some(len) = rest[value_at..].find(&close) else {
                break;
            };
            let v: i64 = rest[value_at..value_at + len].trim().parse().unwrap();
            out.push_str(&rest[..value_at]);
            out.push_str(&(v + delta).to_string());
            rest = &rest[value_at + len..];
        }
        out.push_str(rest);
        out
    };
    let text = moved(&text, "Start", n as i64);
    moved(&text, "End", -(n as i64)).into_bytes()
}

/// The ranged read's answer replaced by the range `by` bytes away.
fn other_range(a: &mut Answer, head: &[u8], by: i64, s: &Shared) {
    let asked = header_of(head, "x-ms-range").expect("a ranged read");
    let (from, to) = asked
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .expect("bytes=S-E");
    let (from, to): (i64, i64) = (from.parse().unwrap(), to.parse().unwrap());
    let (from, to) = (from + by, to + by);
    let total = a
        .header("content-range")
        .and_then(|r| r.rsplit_once('/'))
        .map(|(_, t)| t.to_string())
        .unwrap_or_else(|| "*".into());
    let line = String::from_utf8_lossy(head);
    let path = line.split_whitespace().nth(1).unwrap_or_default();
    let path = path.split('?').next().unwrap_or_default();
    // /devstoreaccount1/CONTAINER/BLOB
    let spec = path.splitn(3, '/').nth(2).unwrap_or_default().to_string();
    a.body = (s.other)(&spec, from as u64, (to - from + 1) as u64);
    a.set("Content-Range", &format!("bytes {from}-{to}/{total}"));
}

/// A 200 page list that never ends, a byte at a time.
fn trickle(w: &mut TcpStream, every: Duration) {
    let started = Instant::now();
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nTransfer-Encoding: chunked\r\n\r\n";
    if w.write_all(head.as_bytes()).is_err() {
        return;
    }
    let start = b"<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList>";
    let unit = b"<PageRange><Start>0</Start><End>511</End></PageRange>";
    let bytes = start.iter().chain(unit.iter().cycle());
    // Ten minutes at most: a client that never hangs up does not keep the
    // thread for ever.
    for b in bytes {
        if started.elapsed() > Duration::from_secs(600) {
            return;
        }
        let chunk = [b'1', b'\r', b'\n', *b, b'\r', b'\n'];
        if w.write_all(&chunk).and_then(|_| w.flush()).is_err() {
            return;
        }
        std::thread::sleep(every);
    }
}
