//! A local HTTP/1.1 stub that answers with recorded Azure responses.
//!
//! It covers only what Azurite cannot show (real-Azure behaviour); it listens on
//! 127.0.0.1, records every request it gets, and stops with the test.

#![allow(dead_code)] // each test binary uses its own part of the stub

pub mod pageblob;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request as the stub received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Which connection it came on, counting accepted connections from 0.
    pub connection: usize,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Decoded query parameter.
    pub fn query(&self, name: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}

/// What the stub sends back.
pub enum Reply {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Close the connection without answering (a reset as the client sees it).
    Hangup,
    /// These bytes as they are (a status line, headers and a body as a broken
    /// or hostile server writes them), then the connection closed.
    Raw(Vec<u8>),
    /// An answer (200, or another `status` with `headers`) whose body is
    /// `len` bytes of `unit` repeated, written as it goes (never held in
    /// memory): a hostile endpoint's endless answer.
    Stream {
        status: u16,
        headers: Vec<(String, String)>,
        len: u64,
        unit: Vec<u8>,
    },
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply::Respond {
            status,
            headers: vec![],
            body: vec![],
        }
    }

    pub fn xml(status: u16, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: vec![("Content-Type".into(), "application/xml".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    /// A ranged read's answer as Azure sends it: 206, `Content-Range` naming
    /// the range asked (of a blob of `total` bytes), `body` (its bytes), and
    /// their CRC64 when the request asked for it.
    pub fn part(req: &Recorded, total: u64, body: Vec<u8>) -> Reply {
        let asked = req.header("x-ms-range").unwrap_or_default();
        let range = asked.strip_prefix("bytes=").unwrap_or(asked);
        let mut headers = vec![(
            "Content-Range".to_string(),
            format!("bytes {range}/{total}"),
        )];
        if req.header("x-ms-range-get-content-crc64") == Some("true") {
            headers.push((
                "x-ms-content-crc64".to_string(),
                blobdrive::azure::crc64::header(blobdrive::azure::crc64::of(&body)),
            ));
        }
        Reply::Respond {
            status: 206,
            headers,
            body,
        }
    }

    /// An error with its code in `x-ms-error-code` as Azure sends it.
    pub fn error(status: u16, code: &str, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: vec![
                ("x-ms-error-code".into(), code.into()),
                ("Content-Type".into(), "application/xml".into()),
            ],
            body: body.as_bytes().to_vec(),
        }
    }
}

impl Reply {
    /// A List Blobs page of `items` (`<Blob>` elements) naming `marker` as its
    /// NextMarker.
    pub fn listing_page(items: &str, marker: &str) -> Reply {
        let mut body = String::with_capacity(items.len() + 200);
        body.push_str("<?xml version=\"1.0\"?><EnumerationResults><Blobs>");
        body.push_str(items);
        body.push_str(&format!(
            "</Blobs><NextMarker>{marker}</NextMarker></EnumerationResults>"
        ));
        Reply::xml(200, &body)
    }

    /// Adds a header. `Content-Length-Override` sets the Content-Length of a HEAD
    /// answer (which has no body to derive it from).
    pub fn with(mut self, k: &str, v: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((k.into(), v.into()));
        }
        self
    }
}

/// A snapshot of the page blob `name` as a listing names it, with `metadata`
/// as its one metadata entry's value.
pub fn listed_snapshot(name: &str, metadata: &str) -> String {
    format!(
        "<Blob><Name>{name}</Name><Snapshot>2026-11-22T11:05:54.5810000Z</Snapshot><Properties><Content-Length>1049088</Content-Length><BlobType>PageBlob</BlobType></Properties><Metadata><note>{metadata}</note></Metadata></Blob>"
    )
}

type Handler = dyn Fn(&Recorded, usize) -> Reply + Send + Sync;

/// A running stub.
pub struct Stub {
    pub port: u16,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl Stub {
    /// Starts a stub; `handler(request, index)` decides each answer (index counts
    /// requests from 0).
    pub fn start(handler: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = listener.local_addr().unwrap().port();
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let reqs = requests.clone();
        std::thread::spawn(move || {
            for (connection, conn) in listener.incoming().enumerate() {
                let Ok(conn) = conn else { return };
                let reqs = reqs.clone();
                let handler = handler.clone();
                std::thread::spawn(move || serve(conn, connection, reqs, handler));
            }
        });
        Stub { port, requests }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/devstoreaccount1", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(
    conn: TcpStream,
    connection: usize,
    reqs: Arc<Mutex<Vec<Recorded>>>,
    handler: Arc<Handler>,
) {
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let rec = Recorded {
            method: method.clone(),
            target,
            headers,
            body,
            connection,
        };
        let index = {
            let mut r = reqs.lock().unwrap();
            r.push(rec.clone());
            r.len() - 1
        };
        match handler(&rec, index) {
            Reply::Hangup => return,
            Reply::Raw(bytes) => {
                let _ = writer.write_all(&bytes);
                return;
            }
            Reply::Stream {
                status,
                headers,
                len,
                unit,
            } => {
                let mut head =
                    format!("HTTP/1.1 {status} Stub\r\nContent-Type: application/xml\r\n");
                for (k, v) in &headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str(&format!("Content-Length: {len}\r\n\r\n"));
                if writer.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let mut sent = 0u64;
                while sent < len {
                    let n = unit.len().min((len - sent) as usize);
                    if writer.write_all(&unit[..n]).is_err() {
                        return; // the client stopped reading
                    }
                    sent += n as u64;
                }
            }
            Reply::Respond {
                status,
                headers,
                body,
            } => {
                let mut out = format!("HTTP/1.1 {status} Stub\r\n");
                let mut length = body.len().to_string();
                for (k, v) in &headers {
                    if k == "Content-Length-Override" {
                        length = v.clone();
                    } else {
                        out.push_str(&format!("{k}: {v}\r\n"));
                    }
                }
                out.push_str("x-ms-request-id: 00000000-0000-0000-0000-000000000000\r\n");
                out.push_str(&format!("Content-Length: {length}\r\n\r\n"));
                let mut bytes = out.into_bytes();
                if method != "HEAD" {
                    bytes.extend_from_slice(&body);
                }
                if writer.write_all(&bytes).is_err() {
                    return;
                }
            }
        }
    }
}
