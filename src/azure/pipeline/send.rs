//! One attempt on the wire: signed afresh, sent, and its answer read within the
//! bounds of what such an answer can hold.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;

use super::check::{self, Found, Got};
use super::{BlobService, Request, Response, API_VERSION};
use crate::azure::auth::AuthError;
use crate::azure::error::{AzureError, Op};
use crate::azure::http::{describe, Transport};
use crate::azure::scatter::Scatter;
use crate::azure::xml;

/// The most of an error answer's body that is read: enough for Azure's error XML
/// (a code and a message); the rest of a longer one is never read.
const ERROR_BODY_MAX: usize = 8 << 10;
/// The most a Get Page Ranges answer (one page of one segment) may hold: Azure
/// pages its answers long before this.
const PAGE_LIST_BODY_MAX: usize = 8 << 20;
/// The most a listing answer (one page of up to 5000 blobs) may hold.
const LISTING_BODY_MAX: usize = 16 << 20;
/// The most any other answer may hold (properties, leases, writes: usually empty).
const SMALL_BODY_MAX: usize = 64 << 10;

/// The most of a successful answer's body `req` may bring: its operation's own
/// bound, or for a ranged read the range asked for. An endpoint that sends more
/// (hostile, or broken) fails the attempt instead of filling memory.
fn body_max(req: &Request) -> usize {
    match req.op {
        Op::Read => req
            .headers
            .iter()
            .find(|(k, _)| k == "x-ms-range")
            .and_then(|(_, v)| {
                let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
                let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                usize::try_from(b.checked_sub(a)? + 1).ok()
            })
            .unwrap_or(SMALL_BODY_MAX),
        Op::GetPageRanges => PAGE_LIST_BODY_MAX,
        Op::ListBlobs => LISTING_BODY_MAX,
        _ => SMALL_BODY_MAX,
    }
}

/// Reads `resp`'s body, failing as soon as it passes `max` bytes (by its
/// `Content-Length`, or as it streams in).
async fn body_within(mut resp: reqwest::Response, max: usize) -> Result<Bytes, Transport> {
    let too_long = |n: u64| {
        Transport::Other(format!(
            "the answer's body ({n} bytes or more) is longer than such an answer can be (at most {max} bytes)"
        ))
    };
    if let Some(n) = resp.content_length().filter(|n| *n > max as u64) {
        return Err(too_long(n));
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
        if body.len() + chunk.len() > max {
            return Err(too_long((body.len() + chunk.len()) as u64));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

impl BlobService {
    /// One signed attempt. `Err` says why no answer came, or why the one that
    /// came is not the answer asked for, free of URLs.
    pub(super) async fn attempt(
        &self,
        req: &Request,
        sequence: Option<u64>,
        timeout: Duration,
        fresh: bool,
        sink: Option<&mut Scatter<'_, '_>>,
    ) -> Result<Response, Failure> {
        let (url, map) = self.signed(req, sequence, timeout)?;
        let http = if fresh {
            &self.inner.fresh_http
        } else {
            &self.inner.http
        };
        let mut head_came = false;
        // A deadline for the whole answer, its body included, not only for
        // each piece of it: an answer trickling in a byte at a time ends here.
        let ended =
            tokio::time::timeout(timeout, exchange(http, req, url, map, sink, &mut head_came))
                .await;
        let secs = timeout.as_secs_f64();
        match ended {
            Ok(r) => r,
            Err(_) if head_came => Err(Failure::Garbled(format!(
                "the answer did not come whole within the {secs:.1}s the attempt had"
            ))),
            Err(_) => Err(Failure::Transport(format!("timed out after {secs:.1}s"))),
        }
    }

    /// `req`'s URL and headers for one attempt carrying `sequence`, given up
    /// on by the server after `timeout`, signed afresh.
    fn signed(
        &self,
        req: &Request,
        sequence: Option<u64>,
        timeout: Duration,
    ) -> Result<(url::Url, HeaderMap), Failure> {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let mut headers: Vec<(String, String)> = Vec::with_capacity(req.headers.len() + 5);
        headers.push(("x-ms-date".into(), date));
        headers.push(("x-ms-version".into(), API_VERSION.into()));
        headers.extend(req.headers.iter().cloned());
        if let Some(n) = sequence {
            headers.push(("x-ms-if-sequence-number-eq".into(), n.to_string()));
        }
        let has_body_method = req.method == Method::PUT || req.method == Method::POST;
        if has_body_method || !req.body.is_empty() {
            headers.push(("content-length".into(), req.body.len().to_string()));
        }
        let mut url = req.url.clone();
        // The server stops working on a request after this many seconds, so one the
        // client gave up on does not run on long after (it bounds time on the
        // server, not in the network: that is what the write fence is for).
        url.query_pairs_mut()
            .append_pair("timeout", &timeout.as_secs().max(1).to_string());
        self.inner
            .auth
            .authorize(&req.method, &mut url, &mut headers)
            .map_err(Failure::Unsent)?;
        let mut map = HeaderMap::with_capacity(headers.len());
        for (k, v) in &headers {
            // Never the value in the message: it may be a token.
            let bad = || Failure::Unsendable(format!("header {k} cannot be sent"));
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad())?;
            let value = HeaderValue::from_str(v).map_err(|_| bad())?;
            map.append(name, value);
        }
        Ok((url, map))
    }

    /// The service's error an answer that was not a success stands for.
    pub(super) fn service_error(&self, req: &Request, resp: &Response) -> AzureError {
        let (body_code, message) = xml::parse_error(&resp.body);
        let code = resp.header("x-ms-error-code").or(body_code);
        AzureError::Service {
            op: req.op,
            target: req.target.clone(),
            status: resp.status,
            code,
            message,
            denied: (resp.status == 403)
                .then(|| self.inner.auth.denied(req.op))
                .flatten(),
        }
    }
}

/// Sends `req` on `http` and reads its answer within bounds: a success's
/// body streamed into `sink` if there is one, checked against what the
/// request expects (`check.rs`); `head_came` is set once the answer's status
/// and headers are in.
async fn exchange(
    http: &reqwest::Client,
    req: &Request,
    url: url::Url,
    headers: HeaderMap,
    sink: Option<&mut Scatter<'_, '_>>,
    head_came: &mut bool,
) -> Result<Response, Failure> {
    let resp = http
        .request(req.method.clone(), url)
        .headers(headers)
        .body(req.body.clone())
        .send()
        .await
        .map_err(|e| transport(describe(e)))?;
    *head_came = true;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let answer = |headers, body, streamed, found| Response {
        status,
        headers,
        body,
        streamed,
        found,
        after_unanswered: false,
    };
    if !req.ok.contains(&status) {
        // Only its start is read: the code and message are there.
        let body = crate::azure::http::body_prefix(resp, ERROR_BODY_MAX)
            .await
            .map_err(|e| transport(describe(e)))?;
        return Ok(answer(headers, body, 0, Found::Nothing));
    }
    if let Some(why) = check::unasked_encoding(&headers) {
        return Err(Failure::Garbled(why));
    }
    match sink {
        Some(sink) => {
            stream_into(resp, sink).await?;
            match check::checked(req.expect, status, &headers, Got::Streamed(sink)) {
                Err(why) => Err(Failure::Garbled(why)),
                Ok(found) => Ok(answer(headers, Bytes::new(), sink.filled(), found)),
            }
        }
        None => {
            let body = body_within(resp, body_max(req)).await.map_err(transport)?;
            match check::checked(req.expect, status, &headers, Got::Body(&body)) {
                Err(why) => Err(Failure::Garbled(why)),
                Ok(found) => Ok(answer(headers, body, 0, found)),
            }
        }
    }
}

/// Streams `resp`'s body into `sink` from its start, failing as soon as it
/// passes what the sink holds.
async fn stream_into(
    mut resp: reqwest::Response,
    sink: &mut Scatter<'_, '_>,
) -> Result<(), Failure> {
    sink.restart();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(describe(e)))? {
        if !sink.put(&chunk) {
            return Err(Failure::Transport(format!(
                "the answer is longer than the {} bytes asked for",
                sink.capacity()
            )));
        }
    }
    Ok(())
}

fn transport(t: Transport) -> Failure {
    match t {
        Transport::Certificate(reason) => Failure::Certificate(reason),
        Transport::Other(detail) => Failure::Transport(detail),
    }
}

/// The delay a `Retry-After: SECONDS` header asks for (at most a minute).
pub(super) fn retry_after(resp: &Response) -> Option<Duration> {
    let secs: u64 = resp.header("retry-after")?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(60)))
}

/// Whether the service refused the request's credential itself, so a renewed
/// token may be accepted: any 401 (Azure's answer to an expired or revoked
/// token), or Azurite's 403 for an expired one.
pub(super) fn token_refused(resp: &Response) -> bool {
    resp.status == 401
        || (resp.status == 403
            && resp.header("x-ms-error-code").as_deref() == Some("AuthenticationFailed")
            && String::from_utf8_lossy(&resp.body).contains("Lifetime validation failed"))
}

/// Why an attempt got no answer.
pub(super) enum Failure {
    /// It could not be authorised, so it was not sent.
    Unsent(AuthError),
    /// A header is not valid HTTP (nothing was sent; retrying cannot help).
    Unsendable(String),
    /// The server's certificate is not trusted (rustls's reason).
    Certificate(String),
    /// No answer: refused, reset, timed out.
    Transport(String),
    /// An answer that is not the one asked for (see `check.rs`): why.
    Garbled(String),
}
