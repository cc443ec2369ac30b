//! The blob service client: one async function per REST operation.
//!
//! Each operation describes its request once ([`Request`]); [`BlobService::execute`]
//! signs it afresh for every attempt (the signature covers `x-ms-date`), sends the
//! very same body bytes to the very same range on every retry, and turns failures
//! into [`AzureError`]s. Nothing here knows about disks or FUSE.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;
use tracing::{debug, warn};
use url::Url;

use super::account::{Account, Credential};
use super::error::{AzureError, Op};
use super::ranges::{self, PageRange};
use super::retry::{is_retryable_status, RetryPolicy};
use super::sign;
use super::stats::{ClientStats, StatsSnapshot};
use super::xml::{self, BlobItem};

/// REST API version sent with every request (accepted by Azure and Azurite 3.35).
pub const API_VERSION: &str = "2021-12-02";
/// Largest body of one Put Page call.
pub const MAX_PUT_PAGE: u64 = 4 * 1024 * 1024;
/// Page size: every page-blob offset and length is a multiple of it.
pub const PAGE: u64 = 512;
/// Metadata name of the token that makes a retried create recognise its own blob.
pub const CREATE_TOKEN_META: &str = "blobdrivecreate";
/// Largest page blob.
pub const MAX_PAGE_BLOB: u64 = 8 * 1024 * 1024 * 1024 * 1024;

/// A handle on one account's blob service; cheap to clone, shares connections and
/// counters.
#[derive(Clone)]
pub struct BlobService {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    account: Account,
    policy: RetryPolicy,
    stats: ClientStats,
}

/// What to do with snapshots when deleting a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteSnapshots {
    /// Delete fails with `SnapshotsPresent` if there are any.
    None,
    /// The blob and all its snapshots.
    Include,
    /// Only the snapshots, keeping the blob.
    Only,
}

/// Properties from a HEAD request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobProperties {
    pub content_length: u64,
    pub blob_type: String,
    /// `available`, `leased`, `expired`, `breaking` or `broken`.
    pub lease_state: Option<String>,
    /// `locked` or `unlocked`.
    pub lease_status: Option<String>,
    /// `infinite` or `fixed`, only while leased.
    pub lease_duration: Option<String>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub sequence_number: Option<u64>,
    pub copy_status: Option<String>,
    pub copy_status_description: Option<String>,
    /// `x-ms-meta-*` headers, names without the prefix, lower-cased.
    pub metadata: Vec<(String, String)>,
}

/// Result of a `prevsnapshot` diff query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageDiff {
    pub changed: Vec<PageRange>,
    pub cleared: Vec<PageRange>,
}

/// How a blob's written ranges are fetched: in segments whose size adapts to how
/// fragmented the blob is, because one Get Page Ranges call over a heavily fragmented
/// region can time out on the service while a sparse region is cheap to scan whole.
#[derive(Debug, Clone, Copy)]
pub struct SegmentPlan {
    /// First segment size (150 MB is safe for the worst fragmentation).
    pub initial: u64,
    /// Never smaller than this, even after timeouts.
    pub min: u64,
    /// Never larger than this.
    pub max: u64,
    /// Double the next segment when a segment returned fewer ranges than this.
    pub grow_below: usize,
    /// Halve the next segment when a segment returned more ranges than this.
    pub shrink_above: usize,
}

impl Default for SegmentPlan {
    fn default() -> Self {
        SegmentPlan {
            initial: 128 * 1024 * 1024,
            min: 4 * 1024 * 1024,
            max: 256 * 1024 * 1024 * 1024,
            grow_below: 1000,
            shrink_above: 10_000,
        }
    }
}

/// One request, described once and sent as often as the retry policy allows.
struct Request {
    op: Op,
    target: String,
    method: Method,
    url: Url,
    headers: Vec<(String, String)>,
    body: Bytes,
    /// Statuses that mean success.
    ok: &'static [u16],
    /// Overrides the policy's attempt count (fewer where the caller has a better
    /// fallback than repeating the same call).
    max_attempts: Option<u32>,
}

/// A successful response, body read in full.
struct Response {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    /// Bytes streamed into the caller's buffer (see `execute_into`).
    streamed: usize,
}

impl Request {
    fn header(&mut self, name: &str, value: impl Into<String>) {
        self.headers.push((name.to_string(), value.into()));
    }
}

impl Response {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

impl BlobService {
    /// A client for `account` with the retry policy from the environment.
    pub fn new(account: Account) -> BlobService {
        BlobService::with_policy(account, RetryPolicy::from_env())
    }

    pub fn with_policy(account: Account, policy: RetryPolicy) -> BlobService {
        let http = reqwest::Client::builder()
            .connect_timeout(policy.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .tcp_nodelay(true)
            .user_agent(concat!("blobdrive/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("the HTTP client configuration is static and valid");
        BlobService {
            inner: Arc::new(Inner {
                http,
                account,
                policy,
                stats: ClientStats::default(),
            }),
        }
    }

    pub fn account(&self) -> &Account {
        &self.inner.account
    }

    pub fn policy(&self) -> &RetryPolicy {
        &self.inner.policy
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    pub fn container(&self, name: &str) -> ContainerClient {
        ContainerClient {
            svc: self.clone(),
            name: name.to_string(),
        }
    }

    pub fn blob(&self, container: &str, name: &str) -> BlobClient {
        BlobClient {
            svc: self.clone(),
            container: container.to_string(),
            name: name.to_string(),
            snapshot: None,
        }
    }

    /// URL of a container or blob, with query parameters; never carries a SAS (that
    /// is added per attempt, so it can never reach a log or message).
    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.inner.account.blob_endpoint.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("blob endpoints are http(s) URLs");
            path.pop_if_empty();
            for seg in segments {
                for part in seg.split('/') {
                    path.push(part);
                }
            }
        }
        if !query.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in query {
                q.append_pair(k, v);
            }
        }
        url
    }

    /// Sends `req`, retrying what is worth retrying within the policy's limits.
    async fn execute(&self, req: Request) -> Result<Response, AzureError> {
        self.execute_into(req, None).await
    }

    /// [`Self::execute`], with a successful response's body streamed into `sink`
    /// instead of collected (`Response::streamed` says how much came), which saves
    /// a copy and a fresh allocation per large read. Every attempt starts over.
    async fn execute_into(
        &self,
        req: Request,
        mut sink: Option<&mut [u8]>,
    ) -> Result<Response, AzureError> {
        let policy = &self.inner.policy;
        let max_attempts = req.max_attempts.unwrap_or(policy.max_attempts).max(1);
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let remaining = policy.budget.saturating_sub(started.elapsed());
            // Shorten the last attempts to the budget, but never below what a single
            // small request needs, so the bound holds without spurious timeouts.
            let timeout = policy
                .request_timeout
                .min(remaining.max(Duration::from_secs(2)));
            let failure = match self.attempt(&req, timeout, sink.as_deref_mut()).await {
                Ok(resp) if req.ok.contains(&resp.status) => {
                    debug!(op = %req.op, target = %req.target, status = resp.status, attempt, "ok");
                    return Ok(resp);
                }
                Ok(resp) => {
                    let err = self.service_error(&req, &resp);
                    if !is_retryable_status(resp.status) {
                        debug!(op = %req.op, target = %req.target, status = resp.status, code = ?err.code(), "failed");
                        ClientStats::add(&self.inner.stats.failed_requests, 1);
                        return Err(err);
                    }
                    err
                }
                Err(detail) => AzureError::Unreachable {
                    op: req.op,
                    target: req.target.clone(),
                    detail,
                    attempts: attempt,
                    elapsed: started.elapsed(),
                },
            };
            let delay = policy.backoff(attempt);
            if attempt >= max_attempts || started.elapsed() + delay >= policy.budget {
                warn!(op = %req.op, target = %req.target, attempts = attempt, "giving up: {failure}");
                ClientStats::add(&self.inner.stats.failed_requests, 1);
                return Err(match failure {
                    AzureError::Unreachable {
                        op, target, detail, ..
                    } => AzureError::Unreachable {
                        op,
                        target,
                        detail,
                        attempts: attempt,
                        elapsed: started.elapsed(),
                    },
                    other => other,
                });
            }
            ClientStats::add(&self.inner.stats.retries, 1);
            debug!(op = %req.op, target = %req.target, attempt, ?delay, "retrying after: {failure}");
            tokio::time::sleep(delay).await;
        }
    }

    /// One signed attempt. `Err` carries a description of a transport failure, free
    /// of URLs.
    async fn attempt(
        &self,
        req: &Request,
        timeout: Duration,
        sink: Option<&mut [u8]>,
    ) -> Result<Response, String> {
        let account = &self.inner.account;
        let date = httpdate::fmt_http_date(SystemTime::now());
        let mut headers: Vec<(String, String)> = Vec::with_capacity(req.headers.len() + 4);
        headers.push(("x-ms-date".into(), date));
        headers.push(("x-ms-version".into(), API_VERSION.into()));
        headers.extend(req.headers.iter().cloned());
        let has_body_method = req.method == Method::PUT || req.method == Method::POST;
        if has_body_method || !req.body.is_empty() {
            headers.push(("content-length".into(), req.body.len().to_string()));
        }
        let mut url = req.url.clone();
        match &account.credential {
            Credential::SharedKey { key } => {
                let sts = sign::string_to_sign(req.method.as_str(), &url, &headers, &account.name);
                headers.push((
                    "authorization".into(),
                    sign::authorization(&account.name, key, &sts),
                ));
            }
            Credential::Sas(sas) => append_sas(&mut url, sas),
            Credential::Anonymous => {}
        }
        let mut map = HeaderMap::with_capacity(headers.len());
        for (k, v) in &headers {
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
            let value = HeaderValue::from_str(v).map_err(|e| e.to_string())?;
            map.append(name, value);
        }
        let send = async {
            let resp = self
                .inner
                .http
                .request(req.method.clone(), url)
                .headers(map)
                .body(req.body.clone())
                .send()
                .await
                .map_err(describe)?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let mut streamed = 0;
            let body = match sink {
                Some(sink) if req.ok.contains(&status) => {
                    let mut resp = resp;
                    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
                        // More than asked for is kept out of the buffer but counted.
                        if let Some(out) = sink.get_mut(streamed..streamed + chunk.len()) {
                            out.copy_from_slice(&chunk);
                        }
                        streamed += chunk.len();
                    }
                    Bytes::new()
                }
                _ => resp.bytes().await.map_err(describe)?,
            };
            Ok(Response {
                status,
                headers,
                body,
                streamed,
            })
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(r) => r,
            Err(_) => Err(format!("timed out after {:.1}s", timeout.as_secs_f64())),
        }
    }

    fn service_error(&self, req: &Request, resp: &Response) -> AzureError {
        let (body_code, message) = xml::parse_error(&resp.body);
        let code = resp.header("x-ms-error-code").or(body_code);
        AzureError::Service {
            op: req.op,
            target: req.target.clone(),
            status: resp.status,
            code,
            message,
        }
    }
}

/// Appends a SAS token, byte for byte as given, to a URL's query.
fn append_sas(url: &mut Url, sas: &str) {
    let q = match url.query() {
        Some(q) if !q.is_empty() => format!("{q}&{sas}"),
        _ => sas.to_string(),
    };
    url.set_query(Some(&q));
}

/// A transport error without its URL (which could hold a SAS), with its causes.
fn describe(e: reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "connection broke while receiving"
    } else if e.is_request() {
        "request failed"
    } else {
        "transport error"
    };
    let e = e.without_url();
    let mut chain = Vec::new();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(s) = src {
        chain.push(s.to_string());
        src = s.source();
    }
    chain.dedup();
    match chain.last() {
        Some(root) => format!("{kind}: {root}"),
        None => kind.to_string(),
    }
}

/// A container of one account.
#[derive(Clone)]
pub struct ContainerClient {
    svc: BlobService,
    name: String,
}

impl ContainerClient {
    pub fn name(&self) -> &str {
        &self.name
    }

    fn request(
        &self,
        op: Op,
        method: Method,
        query: &[(&str, &str)],
        ok: &'static [u16],
    ) -> Request {
        let mut q = vec![("restype", "container")];
        q.extend_from_slice(query);
        Request {
            op,
            target: self.name.clone(),
            method,
            url: self.svc.url(&[&self.name], &q),
            headers: Vec::new(),
            body: Bytes::new(),
            ok,
            max_attempts: None,
        }
    }

    /// Creates the container; `Ok(false)` if it already existed.
    pub async fn create(&self) -> Result<bool, AzureError> {
        match self
            .svc
            .execute(self.request(Op::CreateContainer, Method::PUT, &[], &[201]))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ContainerAlreadyExists") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether the container exists (a 404 is `Ok(false)`, other errors are errors).
    pub async fn exists(&self) -> Result<bool, AzureError> {
        match self
            .svc
            .execute(self.request(Op::ContainerProperties, Method::HEAD, &[], &[200]))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Blobs whose names start with `prefix`, with snapshots if asked; all pages.
    pub async fn list_blobs(
        &self,
        prefix: &str,
        include_snapshots: bool,
    ) -> Result<Vec<BlobItem>, AzureError> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut q: Vec<(&str, &str)> = vec![("comp", "list")];
            if !prefix.is_empty() {
                q.push(("prefix", prefix));
            }
            if include_snapshots {
                q.push(("include", "snapshots"));
            }
            if let Some(m) = marker.as_deref() {
                q.push(("marker", m));
            }
            ClientStats::add(&self.svc.inner.stats.other_requests, 1);
            let resp = self
                .svc
                .execute(self.request(Op::ListBlobs, Method::GET, &q, &[200]))
                .await?;
            let page = xml::parse_blob_list(&resp.body).map_err(|detail| AzureError::Protocol {
                op: Op::ListBlobs,
                target: self.name.clone(),
                detail,
            })?;
            out.extend(page.items);
            match page.next_marker {
                Some(m) => marker = Some(m),
                None => return Ok(out),
            }
        }
    }
}

/// One blob (or one snapshot of it).
#[derive(Clone)]
pub struct BlobClient {
    svc: BlobService,
    container: String,
    name: String,
    snapshot: Option<String>,
}

impl BlobClient {
    pub fn service(&self) -> &BlobService {
        &self.svc
    }

    pub fn container_name(&self) -> &str {
        &self.container
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn snapshot(&self) -> Option<&str> {
        self.snapshot.as_deref()
    }

    /// The same blob at a snapshot (or the base blob with `None`).
    pub fn at_snapshot(&self, snapshot: Option<&str>) -> BlobClient {
        BlobClient {
            snapshot: snapshot.map(str::to_string),
            ..self.clone()
        }
    }

    pub fn container(&self) -> ContainerClient {
        self.svc.container(&self.container)
    }

    /// `container/name` or `container/name@snapshot`: how the blob is named in messages.
    pub fn target(&self) -> String {
        match &self.snapshot {
            Some(s) => format!("{}/{}@{}", self.container, self.name, s),
            None => format!("{}/{}", self.container, self.name),
        }
    }

    fn request(
        &self,
        op: Op,
        method: Method,
        query: &[(&str, &str)],
        ok: &'static [u16],
    ) -> Request {
        let mut q: Vec<(&str, &str)> = query.to_vec();
        if let Some(s) = self.snapshot.as_deref() {
            q.push(("snapshot", s));
        }
        Request {
            op,
            target: self.target(),
            method,
            url: self.svc.url(&[&self.container, &self.name], &q),
            headers: Vec::new(),
            body: Bytes::new(),
            ok,
            max_attempts: None,
        }
    }

    fn invalid(&self, op: Op, reason: impl Into<String>) -> AzureError {
        AzureError::Invalid {
            op,
            target: self.target(),
            reason: reason.into(),
        }
    }

    fn count(&self, f: impl FnOnce(&ClientStats)) {
        f(&self.svc.inner.stats)
    }

    /// Creates an empty page blob of `size` bytes; never replaces an existing blob
    /// (`If-None-Match: *` makes the service refuse with `BlobAlreadyExists`).
    pub async fn create_page_blob(&self, size: u64) -> Result<(), AzureError> {
        if size % PAGE != 0 || size == 0 || size > MAX_PAGE_BLOB {
            return Err(self.invalid(
                Op::CreateBlob,
                format!(
                    "page blob size {size} must be a positive multiple of 512 of at most 8 TiB"
                ),
            ));
        }
        // A create whose answer was lost may have happened; its retry then meets
        // `BlobAlreadyExists`. The token in the metadata tells our own blob from
        // someone else's, so a retried create never replaces, nor wrongly fails.
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut req = self.request(Op::CreateBlob, Method::PUT, &[], &[201]);
        req.header("x-ms-blob-type", "PageBlob");
        req.header("x-ms-blob-content-length", size.to_string());
        req.header("if-none-match", "*");
        req.header(&format!("x-ms-meta-{CREATE_TOKEN_META}"), token.clone());
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        match self.svc.execute(req).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("BlobAlreadyExists") => {
                let ours = self.properties().await.ok().is_some_and(|p| {
                    p.metadata
                        .iter()
                        .any(|(k, v)| k == CREATE_TOKEN_META && *v == token)
                });
                if ours {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    pub async fn properties(&self) -> Result<BlobProperties, AzureError> {
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self
            .svc
            .execute(self.request(Op::GetProperties, Method::HEAD, &[], &[200]))
            .await?;
        let h = |n: &str| resp.header(n);
        let content_length = h("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| AzureError::Protocol {
                op: Op::GetProperties,
                target: self.target(),
                detail: "no Content-Length".into(),
            })?;
        let mut metadata: Vec<(String, String)> = resp
            .headers
            .iter()
            .filter_map(|(k, v)| {
                let k = k.as_str().strip_prefix("x-ms-meta-")?;
                Some((k.to_string(), v.to_str().ok()?.to_string()))
            })
            .collect();
        metadata.sort();
        Ok(BlobProperties {
            content_length,
            blob_type: h("x-ms-blob-type").unwrap_or_default(),
            lease_state: h("x-ms-lease-state"),
            lease_status: h("x-ms-lease-status"),
            lease_duration: h("x-ms-lease-duration"),
            etag: h("etag"),
            last_modified: h("last-modified"),
            sequence_number: h("x-ms-blob-sequence-number").and_then(|v| v.parse().ok()),
            copy_status: h("x-ms-copy-status"),
            copy_status_description: h("x-ms-copy-status-description"),
            metadata,
        })
    }

    /// Reads `buf.len()` bytes at `offset` straight into `buf`; a short answer is
    /// an error.
    pub async fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), AzureError> {
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let req = self.range_get(offset, len);
        let resp = self.svc.execute_into(req, Some(buf)).await?;
        self.count(|s| ClientStats::add(&s.bytes_downloaded, resp.streamed as u64));
        if resp.streamed as u64 != len {
            return Err(self.short_read(offset, len, resp.streamed as u64));
        }
        Ok(())
    }

    /// A counted ranged GET of `len > 0` bytes at `offset`.
    fn range_get(&self, offset: u64, len: u64) -> Request {
        let mut req = self.request(Op::Read, Method::GET, &[], &[200, 206]);
        req.header(
            "x-ms-range",
            format!("bytes={}-{}", offset, offset + len - 1),
        );
        self.count(|s| ClientStats::add(&s.get_requests, 1));
        req
    }

    fn short_read(&self, offset: u64, len: u64, got: u64) -> AzureError {
        AzureError::Protocol {
            op: Op::Read,
            target: self.target(),
            detail: format!(
                "asked for {len} bytes at offset {offset}, got {got} (past the end of the blob?)"
            ),
        }
    }

    /// Reads `len` bytes at `offset`; a short answer is an error, never silently
    /// padded.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, AzureError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let resp = self.svc.execute(self.range_get(offset, len)).await?;
        self.count(|s| ClientStats::add(&s.bytes_downloaded, resp.body.len() as u64));
        if resp.body.len() as u64 != len {
            return Err(self.short_read(offset, len, resp.body.len() as u64));
        }
        Ok(resp.body)
    }

    fn check_pages(&self, op: Op, offset: u64, len: u64) -> Result<(), AzureError> {
        if offset % PAGE != 0 || len % PAGE != 0 || len == 0 {
            return Err(self.invalid(
                op,
                format!("range {offset}+{len} is not a non-empty run of whole 512-byte pages"),
            ));
        }
        if self.snapshot.is_some() {
            return Err(self.invalid(op, "snapshots are read-only"));
        }
        Ok(())
    }

    /// Writes whole pages at `offset`. At most 4 MiB per call: real Azure refuses more
    /// with 413 and Azurite silently accepts, so the client enforces it.
    pub async fn put_pages(
        &self,
        offset: u64,
        data: Bytes,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        let len = data.len() as u64;
        self.check_pages(Op::PutPage, offset, len)?;
        if len > MAX_PUT_PAGE {
            return Err(self.invalid(
                Op::PutPage,
                format!("{len} bytes in one Put Page call; the service takes at most 4 MiB"),
            ));
        }
        let mut req = self.request(Op::PutPage, Method::PUT, &[("comp", "page")], &[201]);
        req.header("x-ms-page-write", "update");
        req.header(
            "x-ms-range",
            format!("bytes={}-{}", offset, offset + len - 1),
        );
        if let Some(id) = lease {
            req.header("x-ms-lease-id", id.to_string());
        }
        req.body = data;
        self.count(|s| ClientStats::add(&s.put_page_requests, 1));
        self.svc.execute(req).await?;
        self.count(|s| ClientStats::add(&s.bytes_uploaded, len));
        Ok(())
    }

    /// Clears (deallocates) whole pages: they read as zeros and cost no storage.
    pub async fn clear_pages(
        &self,
        offset: u64,
        len: u64,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        self.check_pages(Op::ClearPages, offset, len)?;
        let mut req = self.request(Op::ClearPages, Method::PUT, &[("comp", "page")], &[201]);
        req.header("x-ms-page-write", "clear");
        req.header(
            "x-ms-range",
            format!("bytes={}-{}", offset, offset + len - 1),
        );
        if let Some(id) = lease {
            req.header("x-ms-lease-id", id.to_string());
        }
        self.count(|s| ClientStats::add(&s.clear_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// One Get Page Ranges query (all its `NextMarker` pages), unmerged.
    async fn page_list(
        &self,
        range: Option<PageRange>,
        prev_snapshot: Option<&str>,
        max_attempts: Option<u32>,
    ) -> Result<xml::PageListPage, AzureError> {
        let mut all = xml::PageListPage::default();
        let mut marker: Option<String> = None;
        loop {
            let mut q: Vec<(&str, &str)> = vec![("comp", "pagelist")];
            if let Some(p) = prev_snapshot {
                q.push(("prevsnapshot", p));
            }
            if let Some(m) = marker.as_deref() {
                q.push(("marker", m));
            }
            let mut req = self.request(Op::GetPageRanges, Method::GET, &q, &[200]);
            req.max_attempts = max_attempts;
            if let Some(r) = range {
                if r.is_empty() {
                    return Ok(all);
                }
                req.header("x-ms-range", format!("bytes={}-{}", r.start, r.end - 1));
            }
            self.count(|s| ClientStats::add(&s.page_range_requests, 1));
            let resp = self.svc.execute(req).await?;
            let page = xml::parse_page_list(&resp.body).map_err(|detail| AzureError::Protocol {
                op: Op::GetPageRanges,
                target: self.target(),
                detail,
            })?;
            all.ranges.extend(page.ranges);
            all.cleared.extend(page.cleared);
            match page.next_marker {
                Some(m) => marker = Some(m),
                None => return Ok(all),
            }
        }
    }

    /// Written ranges within `range` (whole blob if `None`), merged.
    pub async fn page_ranges(
        &self,
        range: Option<PageRange>,
    ) -> Result<Vec<PageRange>, AzureError> {
        let page = self.page_list(range, None, None).await?;
        Ok(clip(ranges::merge(page.ranges), range))
    }

    /// Ranges changed (`changed`) and cleared (`cleared`) since `prev_snapshot`, as the
    /// service reports them. Azurite ignores `prevsnapshot` and answers with the full
    /// list: callers must not trust this blindly (see the snapshot module).
    pub async fn page_ranges_diff(
        &self,
        prev_snapshot: &str,
        range: Option<PageRange>,
    ) -> Result<PageDiff, AzureError> {
        let page = self.page_list(range, Some(prev_snapshot), None).await?;
        Ok(PageDiff {
            changed: clip(ranges::merge(page.ranges), range),
            cleared: clip(ranges::merge(page.cleared), range),
        })
    }

    /// All written ranges of the first `len` bytes, queried in adaptive segments and
    /// merged across segment edges.
    pub async fn page_ranges_segmented(
        &self,
        len: u64,
        plan: SegmentPlan,
    ) -> Result<Vec<PageRange>, AzureError> {
        let align = |v: u64| (v / PAGE).max(1) * PAGE;
        let mut seg = align(plan.initial.clamp(plan.min, plan.max));
        let mut pos = 0u64;
        let mut found = Vec::new();
        while pos < len {
            let end = (pos + seg).min(len);
            // Where a smaller segment is still possible, fail fast and split instead of
            // repeating a query the service could not finish.
            let attempts = (seg > plan.min).then_some(2);
            match self
                .page_list(Some(PageRange::new(pos, end)), None, attempts)
                .await
            {
                Ok(page) => {
                    let n = page.ranges.len();
                    found.extend(page.ranges);
                    pos = end;
                    if n < plan.grow_below {
                        seg = align((seg.saturating_mul(2)).min(plan.max));
                    } else if n > plan.shrink_above {
                        seg = align((seg / 2).max(plan.min));
                    }
                }
                Err(e)
                    if seg > plan.min
                        && matches!(e.status(), Some(500 | 503) | None)
                        && !matches!(e, AzureError::Invalid { .. }) =>
                {
                    warn!(target = %self.target(), segment = seg, "page ranges query failed, splitting: {e}");
                    seg = align((seg / 2).max(plan.min));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(clip(ranges::merge(found), Some(PageRange::new(0, len))))
    }

    /// Acquires a lease with our own id; `duration` `None` is infinite. Acquiring again
    /// with the same id succeeds, so a retry after a lost answer is safe.
    pub async fn acquire_lease(
        &self,
        proposed_id: &str,
        duration: Option<u32>,
    ) -> Result<String, AzureError> {
        let mut req = self.request(
            Op::AcquireLease,
            Method::PUT,
            &[("comp", "lease")],
            &[200, 201],
        );
        req.header("x-ms-lease-action", "acquire");
        // Always sent: Azurite corrupts the blob's state when it is missing.
        req.header(
            "x-ms-lease-duration",
            duration.map_or("-1".to_string(), |d| d.to_string()),
        );
        req.header("x-ms-proposed-lease-id", proposed_id.to_string());
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self.svc.execute(req).await?;
        Ok(resp
            .header("x-ms-lease-id")
            .unwrap_or_else(|| proposed_id.to_string()))
    }

    async fn lease_action(
        &self,
        op: Op,
        action: &str,
        extra: Vec<(&str, String)>,
        ok: &'static [u16],
    ) -> Result<Response, AzureError> {
        let mut req = self.request(op, Method::PUT, &[("comp", "lease")], ok);
        req.header("x-ms-lease-action", action.to_string());
        for (k, v) in extra {
            req.header(k, v);
        }
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        self.svc.execute(req).await
    }

    pub async fn renew_lease(&self, lease_id: &str) -> Result<(), AzureError> {
        self.lease_action(
            Op::RenewLease,
            "renew",
            vec![("x-ms-lease-id", lease_id.into())],
            &[200],
        )
        .await
        .map(|_| ())
    }

    /// Changes the lease id; returns the new id.
    pub async fn change_lease(
        &self,
        lease_id: &str,
        proposed_id: &str,
    ) -> Result<String, AzureError> {
        let resp = self
            .lease_action(
                Op::ChangeLease,
                "change",
                vec![
                    ("x-ms-lease-id", lease_id.into()),
                    ("x-ms-proposed-lease-id", proposed_id.into()),
                ],
                &[200],
            )
            .await?;
        Ok(resp
            .header("x-ms-lease-id")
            .unwrap_or_else(|| proposed_id.to_string()))
    }

    pub async fn release_lease(&self, lease_id: &str) -> Result<(), AzureError> {
        self.lease_action(
            Op::ReleaseLease,
            "release",
            vec![("x-ms-lease-id", lease_id.into())],
            &[200],
        )
        .await
        .map(|_| ())
    }

    /// Breaks whoever's lease; `period` seconds (0..=60) lets the holder finish, `None`
    /// breaks an infinite lease at once. Returns the seconds until it is broken.
    pub async fn break_lease(&self, period: Option<u32>) -> Result<u32, AzureError> {
        if let Some(p) = period {
            if p > 60 {
                return Err(self.invalid(Op::BreakLease, "break period must be 0 to 60 seconds"));
            }
        }
        let extra = period
            .map(|p| vec![("x-ms-lease-break-period", p.to_string())])
            .unwrap_or_default();
        let resp = self
            .lease_action(Op::BreakLease, "break", extra, &[202])
            .await?;
        Ok(resp
            .header("x-ms-lease-time")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// Takes a snapshot; returns its id (a timestamp).
    pub async fn create_snapshot(&self) -> Result<String, AzureError> {
        if self.snapshot.is_some() {
            return Err(self.invalid(Op::Snapshot, "cannot snapshot a snapshot"));
        }
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self
            .svc
            .execute(self.request(Op::Snapshot, Method::PUT, &[("comp", "snapshot")], &[201]))
            .await?;
        resp.header("x-ms-snapshot")
            .ok_or_else(|| AzureError::Protocol {
                op: Op::Snapshot,
                target: self.target(),
                detail: "no x-ms-snapshot header".into(),
            })
    }

    pub async fn delete(
        &self,
        snapshots: DeleteSnapshots,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        let mut req = self.request(Op::Delete, Method::DELETE, &[], &[202]);
        match snapshots {
            DeleteSnapshots::None => {}
            DeleteSnapshots::Include => req.header("x-ms-delete-snapshots", "include"),
            DeleteSnapshots::Only => req.header("x-ms-delete-snapshots", "only"),
        }
        if let Some(id) = lease {
            req.header("x-ms-lease-id", id.to_string());
        }
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// Replaces the blob's metadata. Names must be valid C# identifiers.
    pub async fn set_metadata(
        &self,
        metadata: &[(&str, &str)],
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        let mut req = self.request(
            Op::SetMetadata,
            Method::PUT,
            &[("comp", "metadata")],
            &[200],
        );
        let mut names = Vec::new();
        for (k, v) in metadata {
            if k.is_empty()
                || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                || k.starts_with(|c: char| c.is_ascii_digit())
            {
                return Err(self.invalid(
                    Op::SetMetadata,
                    format!("metadata name '{k}' is not an identifier"),
                ));
            }
            names.push((format!("x-ms-meta-{k}"), v.to_string()));
        }
        req.headers.extend(names);
        if let Some(id) = lease {
            req.header("x-ms-lease-id", id.to_string());
        }
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// Copies `source` (a blob or snapshot of the same account) over this blob and
    /// waits until the service reports the copy finished.
    pub async fn copy_from(
        &self,
        source: &BlobClient,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        let mut src = source.svc.url(&[&source.container, &source.name], &[]);
        if let Some(s) = source.snapshot.as_deref() {
            src.query_pairs_mut().append_pair("snapshot", s);
        }
        if let Credential::Sas(sas) = &source.svc.inner.account.credential {
            append_sas(&mut src, sas);
        }
        let mut req = self.request(Op::Copy, Method::PUT, &[], &[202]);
        req.header("x-ms-copy-source", src.to_string());
        if let Some(id) = lease {
            req.header("x-ms-lease-id", id.to_string());
        }
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self.svc.execute(req).await?;
        let mut status = resp
            .header("x-ms-copy-status")
            .unwrap_or_else(|| "pending".into());
        let mut delay = Duration::from_millis(100);
        while status == "pending" {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
            let props = self.properties().await?;
            status = props.copy_status.unwrap_or_else(|| "success".into());
            if status != "pending" && status != "success" {
                return Err(AzureError::Protocol {
                    op: Op::Copy,
                    target: self.target(),
                    detail: format!(
                        "copy {status}: {}",
                        props.copy_status_description.unwrap_or_default()
                    ),
                });
            }
        }
        if status != "success" {
            return Err(AzureError::Protocol {
                op: Op::Copy,
                target: self.target(),
                detail: format!("copy {status}"),
            });
        }
        Ok(())
    }
}

/// Restricts merged ranges to `within` (the service may answer with whole pages
/// beyond the asked range).
fn clip(ranges: Vec<PageRange>, within: Option<PageRange>) -> Vec<PageRange> {
    match within {
        None => ranges,
        Some(w) => ranges.iter().filter_map(|r| r.intersect(&w)).collect(),
    }
}
