//! What a request does to the blob, read from its head: the request line and the
//! headers, as the client sent them.

/// A request that changes the blob, or `None` for one that only reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create Blob of a page blob of `len` bytes (all zeros).
    Create { len: u64 },
    /// Put Page: the body written at `start..end`.
    Put { start: u64, end: u64 },
    /// Clear Pages over `start..end`.
    Clear { start: u64, end: u64 },
    /// Set Blob Properties giving the blob a new length.
    Length { len: u64 },
    /// Set Blob Properties raising the sequence number by one.
    Raise,
    /// Set Blob Metadata; `resize` is blobdrive's resize mark (FROM:TO), if set.
    Metadata { resize: Option<(u64, u64)> },
    /// Lease Blob with this `x-ms-lease-action`.
    Lease { action: String },
    /// Snapshot Blob.
    Snapshot,
    /// Delete Blob (the blob with its snapshots).
    Delete,
    /// Any other request that is not a read (its request line).
    Other(String),
}

impl Op {
    /// Whether it is a write of the blob's bytes (Put Page, Clear Pages).
    pub fn is_write(&self) -> bool {
        matches!(self, Op::Put { .. } | Op::Clear { .. })
    }
}

/// A parsed request head.
pub struct Head {
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub query: Vec<(String, String)>,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn parse(raw: &[u8]) -> Option<Head> {
        let text = String::from_utf8_lossy(raw);
        let mut lines = text.split("\r\n");
        let mut first = lines.next()?.split_whitespace();
        let method = first.next()?.to_string();
        let target = first.next()?;
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let query = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_ascii_lowercase(), v.to_string())
            })
            .collect();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Some(Head {
            method,
            path: path.to_string(),
            query,
            headers,
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, name: &str) -> Option<u64> {
        self.header(name)?.parse().ok()
    }

    /// What the request does to the blob; `None` for a read.
    pub fn op(&self) -> Option<Op> {
        if self.method == "GET" || self.method == "HEAD" {
            return None;
        }
        if self.method == "DELETE" && self.param("snapshot").is_none() {
            return Some(Op::Delete);
        }
        let other = || Op::Other(format!("{} {}", self.method, self.path));
        Some(match self.param("comp") {
            Some("page") => self.page_op().unwrap_or_else(other),
            Some("properties") => match self.number("x-ms-blob-content-length") {
                Some(len) => Op::Length { len },
                None if self.header("x-ms-sequence-number-action") == Some("increment") => {
                    Op::Raise
                }
                None => other(),
            },
            Some("metadata") => Op::Metadata {
                resize: self
                    .header("x-ms-meta-blobdrive_resize")
                    .and_then(|v| v.split_once(':'))
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?))),
            },
            Some("lease") => Op::Lease {
                action: self
                    .header("x-ms-lease-action")
                    .unwrap_or_default()
                    .to_string(),
            },
            Some("snapshot") => Op::Snapshot,
            None if self.header("x-ms-blob-type") == Some("PageBlob") => {
                match self.number("x-ms-blob-content-length") {
                    Some(len) => Op::Create { len },
                    None => other(),
                }
            }
            _ => other(),
        })
    }

    /// Put Page or Clear Pages, with its range (`x-ms-range: bytes=S-E`).
    fn page_op(&self) -> Option<Op> {
        let range = self.header("x-ms-range").or(self.header("range"))?;
        let (s, e) = range.strip_prefix("bytes=")?.split_once('-')?;
        let (start, end) = (s.parse().ok()?, e.parse::<u64>().ok()? + 1);
        match self.header("x-ms-page-write")? {
            "update" => Some(Op::Put { start, end }),
            "clear" => Some(Op::Clear { start, end }),
            _ => None,
        }
    }
}

/// A raw HTTP response's header `name` (lower-case), if present.
pub fn response_header(resp: &[u8], name: &str) -> Option<String> {
    let end = resp.windows(4).position(|w| w == b"\r\n\r\n")?;
    String::from_utf8_lossy(&resp[..end])
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}
