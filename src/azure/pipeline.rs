//! The request pipeline: [`BlobService`], the handle every operation goes through.
//!
//! Each operation describes its request once ([`Request`]); [`BlobService::execute`]
//! authorises it afresh for every attempt (a Shared Key signature covers `x-ms-date`),
//! sends the very same body bytes to the very same range on every retry, and turns
//! failures into [`AzureError`]s. The operations themselves are in [`super::ops`],
//! authorisation behind [`super::auth::Authorizer`]. Nothing here knows about disks or
//! FUSE.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;
use tracing::debug;
use url::Url;

use super::account::Account;
use super::auth::{AuthError, Authorizer};
use super::error::{AzureError, Op};
use super::gate::Gate;
use super::http::{describe, Transport};
use super::ops::fence::SEQUENCE_REFUSED;
use super::ops::{BlobClient, ContainerClient, WriteFence};
use super::retry::RetryPolicy;
use super::scatter::Scatter;
use super::stats::{ClientStats, Outcome, StatsSnapshot};
use super::verdict::{
    attempt_timeout, verdict, Answer, Clock, Fence, Rules, Status, Tries, Verdict,
};
use super::xml;

/// REST API version sent with every request (accepted by Azure and Azurite 3.35).
pub const API_VERSION: &str = "2021-12-02";

tokio::task_local! {
    /// When the operation under way must be over, if it runs as [`one_try`].
    static ONE_TRY: Instant;
}

/// Runs `op` (one or more operations of this client, one after another) as one
/// try that is over by `deadline`, for an I/O past its outage's I/O timeout,
/// which must fail after one try that reached for the service, not after the
/// retry budget (or, with the write fence's raise before a Put Page, two budgets
/// and a last chance each). Every request sent within it goes first on a new
/// connection (the pool may hold connections the outage left dead), is given up
/// at the deadline, and is not sent again once an attempt got no answer: the
/// service is still silent. Answers worth another attempt (a busy service, a
/// write the sequence-number fence refused) are still retried until the
/// deadline, so the first I/O once the service is back succeeds.
///
/// A task-local rather than a parameter because the fence's raise is sent from
/// inside the Put Page's own pipeline run, and it must share the one deadline.
pub async fn one_try<F: std::future::Future>(deadline: Instant, op: F) -> F::Output {
    ONE_TRY.scope(deadline, op).await
}

/// A handle on one account's blob service; cheap to clone, shares connections and
/// counters.
#[derive(Clone)]
pub struct BlobService {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    http: reqwest::Client,
    /// The same client without a connection pool: every request on a connection of
    /// its own. An attempt after one that got no answer goes through it, since the
    /// pool may still hold connections the outage left dead (a request on one fails
    /// while the service answers).
    fresh_http: reqwest::Client,
    account: Account,
    /// Built once from `account.credential`.
    pub(super) auth: Arc<dyn Authorizer>,
    policy: RetryPolicy,
    pub(super) stats: ClientStats,
    /// The client's pace once the service throttles (see [`Gate`]).
    gate: Gate,
}

/// One request, described once and sent as often as the retry policy allows.
pub(super) struct Request {
    pub(super) op: Op,
    pub(super) target: String,
    pub(super) method: Method,
    pub(super) url: Url,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Bytes,
    /// Statuses that mean success.
    pub(super) ok: &'static [u16],
    /// Overrides the policy's attempt count (fewer where the caller has a better
    /// fallback than repeating the same call).
    pub(super) max_attempts: Option<u32>,
    /// For Put Page and Clear Pages of a mount: every attempt carries the fence's
    /// sequence number, and one whose outcome is unknown raises it before the next
    /// (see [`WriteFence`]).
    pub(super) fence: Option<Arc<WriteFence>>,
    /// A delete: once an attempt went unanswered (it may have been carried out),
    /// a later attempt's 404 means that one did the work.
    pub(super) gone_after_unknown_is_done: bool,
}

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

/// A successful response, body read in full.
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// Bytes streamed into the caller's buffer (see `execute_into`).
    pub(super) streamed: usize,
    /// An earlier attempt of this request got no answer: it may still be carried
    /// out, after this one.
    pub(super) after_unanswered: bool,
}

impl Request {
    /// A request with no headers or body, the policy's attempts, no fence: each
    /// operation then adds what it needs.
    pub(super) fn new(
        op: Op,
        target: String,
        method: Method,
        url: Url,
        ok: &'static [u16],
    ) -> Request {
        Request {
            op,
            target,
            method,
            url,
            headers: Vec::new(),
            body: Bytes::new(),
            ok,
            max_attempts: None,
            fence: None,
            gone_after_unknown_is_done: false,
        }
    }

    /// What the retry rules need to know of this request under `policy`.
    fn rules(&self, policy: &RetryPolicy) -> Rules {
        Rules {
            fenced: self.fence.is_some(),
            gone_after_unknown_is_done: self.gone_after_unknown_is_done,
            own_attempts: self.max_attempts.is_some(),
            budget: policy.budget,
        }
    }

    pub(super) fn header(&mut self, name: &str, value: impl Into<String>) {
        self.headers.push((name.to_string(), value.into()));
    }

    /// Sent under the lease `id`, if any (`x-ms-lease-id`).
    pub(super) fn lease(&mut self, id: Option<&str>) {
        if let Some(id) = id {
            self.header("x-ms-lease-id", id);
        }
    }

    /// Carried out only while the blob's ETag is `etag`, if any (`If-Match`; else
    /// 412 `ConditionNotMet`).
    pub(super) fn if_match(&mut self, etag: Option<&str>) {
        if let Some(etag) = etag {
            self.header("If-Match", etag);
        }
    }
}

impl Response {
    pub(super) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

impl BlobService {
    /// A client for `account` with the default retry policy (the command line
    /// passes the one the environment asks for to [`Self::with_policy`]).
    pub fn new(account: Account) -> BlobService {
        BlobService::with_policy(account, RetryPolicy::default())
    }

    pub fn with_policy(account: Account, policy: RetryPolicy) -> BlobService {
        let http = super::http::client_builder(policy.connect_timeout)
            .build()
            .expect("the HTTP client configuration is static and valid");
        let fresh_http = super::http::client_builder(policy.connect_timeout)
            .pool_max_idle_per_host(0)
            .build()
            .expect("the HTTP client configuration is static and valid");
        BlobService {
            inner: Arc::new(Inner {
                http,
                fresh_http,
                auth: account.authorizer(),
                account,
                policy,
                stats: ClientStats::default(),
                gate: Gate::default(),
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

    /// Why the latest failed attempt failed, unless one succeeded since.
    pub fn last_failure(&self) -> Option<String> {
        self.inner.stats.last_failure()
    }

    /// The live counters, for figures `stats` does not show (the metrics).
    pub fn counters(&self) -> &ClientStats {
        &self.inner.stats
    }

    /// Token renewals tried and failed, when the credential renews tokens.
    pub fn token_renewals(&self) -> Option<(u64, u64)> {
        self.inner.auth.renewals()
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
    pub(super) fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
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
    pub(super) async fn execute(&self, req: Request) -> Result<Response, AzureError> {
        self.execute_into(req, None).await
    }

    /// [`Self::execute`], with a successful response's body streamed into `sink`
    /// instead of collected (`Response::streamed` says how much came), which saves
    /// a copy and a fresh allocation per large read. Every attempt starts over.
    ///
    /// What to do after each attempt is [`verdict`]'s to decide (the retry rules,
    /// with a table test each); this loop only carries it out.
    pub(super) async fn execute_into(
        &self,
        req: Request,
        mut sink: Option<&mut Scatter<'_, '_>>,
    ) -> Result<Response, AzureError> {
        let policy = &self.inner.policy;
        let rules = req.rules(policy);
        let started = Instant::now();
        // The end of the one try this request belongs to, if it does (see `one_try`).
        let deadline = ONE_TRY.try_with(|d| *d).ok();
        let allowed = req.max_attempts.unwrap_or(policy.max_attempts);
        let mut tries = Tries::new(allowed, deadline.is_some());
        loop {
            let fresh = tries.begin();
            let carried = match &req.fence {
                Some(f) => Some(f.number().await?),
                None => None,
            };
            let clock = Clock::now(started, deadline);
            let Some(timeout) = attempt_timeout(policy, &clock, tries.last_chance) else {
                return Err(self.out_of_time(&req, tries.sent - 1, started));
            };
            let window = self.inner.gate.enter().await;
            let sent_at = Instant::now();
            let answer = self
                .attempt(&req, carried, timeout, fresh, sink.as_deref_mut())
                .await;
            self.count_attempt(&req, &answer, sent_at);
            let seen = self.seen(&req, &answer);
            if matches!(seen, Answer::Status(s) if s.throttled) {
                self.inner.gate.throttled(window);
            }
            let clock = Clock::now(started, deadline);
            let verdict = verdict(&rules, &seen, &tries, &clock, policy.backoff(tries.sent));
            tries.note(&seen, &verdict);
            if let (Some(f), Some(n)) = (&req.fence, carried) {
                tell_fence(f, n, verdict.fence());
            }
            let attempt = tries.sent;
            match verdict {
                Verdict::Done { .. } | Verdict::Gone => {
                    return Ok(self.answered(&req, answer, verdict, attempt))
                }
                Verdict::RenewToken => {
                    let err = self.error_of(&req, answer, attempt, started);
                    self.renew_token(&req, err).await?;
                }
                _ => {
                    if let Some(pause) = self.failed(&req, answer, verdict, attempt, started)? {
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }

    /// Counts an attempt sent at `sent_at` by how it ended (one never sent is
    /// not counted).
    fn count_attempt(&self, req: &Request, answer: &Result<Response, Failure>, sent_at: Instant) {
        let outcome = match answer {
            Ok(resp) => Outcome::of_status(resp.status, req.ok.contains(&resp.status)),
            Err(Failure::Transport(_)) | Err(Failure::Certificate(_)) => Outcome::NoAnswer,
            Err(Failure::Unsent(_)) | Err(Failure::Unsendable(_)) => return,
        };
        self.inner
            .stats
            .record_attempt(req.op, outcome, sent_at.elapsed());
    }

    /// What the retry rules need to know of an attempt's `answer`.
    fn seen(&self, req: &Request, answer: &Result<Response, Failure>) -> Answer {
        let resp = match answer {
            Ok(resp) => resp,
            Err(Failure::Unsent(_)) => return Answer::Unsent,
            Err(Failure::Unsendable(_)) => return Answer::Unsendable,
            Err(Failure::Certificate(_)) => return Answer::Certificate,
            Err(Failure::Transport(_)) => return Answer::Unanswered,
        };
        let ok = req.ok.contains(&resp.status);
        // A success's body is data, not an error to read a code from.
        let err = (!ok).then(|| self.service_error(req, resp));
        Answer::Status(Status {
            status: resp.status,
            ok,
            token_refused: token_refused(resp),
            sequence_refused: err
                .as_ref()
                .is_some_and(|e| e.code() == Some(SEQUENCE_REFUSED)),
            throttled: err.as_ref().is_some_and(AzureError::is_throttled),
            retry_after: retry_after(resp),
        })
    }

    /// The response of an attempt the rules found to be the request's result
    /// (`verdict`: done, or gone).
    fn answered(
        &self,
        req: &Request,
        answer: Result<Response, Failure>,
        verdict: Verdict,
        attempt: u32,
    ) -> Response {
        let Ok(mut resp) = answer else {
            unreachable!("the rules find a result only in an answer")
        };
        self.inner.stats.attempt_ended(None);
        if let Verdict::Done { after_unanswered } = verdict {
            self.inner.gate.succeeded();
            resp.after_unanswered = after_unanswered;
            debug!(op = %req.op, target = %req.target, status = resp.status, attempt, "ok");
        } else {
            debug!(op = %req.op, target = %req.target, attempt, "gone: an earlier attempt did it");
        }
        resp
    }

    /// Carries out a `verdict` on a failed attempt: the request's error if it
    /// is final or the tries are spent, else the pause before the next attempt
    /// (`None`: at once).
    fn failed(
        &self,
        req: &Request,
        answer: Result<Response, Failure>,
        verdict: Verdict,
        attempt: u32,
        started: Instant,
    ) -> Result<Option<Duration>, AzureError> {
        let failure = self.error_of(req, answer, attempt, started);
        let (op, target) = (req.op, &req.target);
        let noted = !matches!(verdict, Verdict::Final { noted: false });
        if noted {
            self.inner.stats.attempt_ended(Some(failure.to_string()));
        }
        match verdict {
            Verdict::Retry { after, .. } => {
                ClientStats::add(&self.inner.stats.retries, 1);
                debug!(%op, %target, attempt, ?after, "retrying after: {failure}");
                Ok(Some(after))
            }
            Verdict::LastChance { .. } => {
                debug!(%op, %target, attempt, "trying once more on a new connection: {failure}");
                ClientStats::add(&self.inner.stats.retries, 1);
                Ok(None)
            }
            // The tries are spent, or the failure is final. The error itself is
            // what callers report (the daemon logs its own warnings where it
            // waits): logging it here too, above debug, printed it twice.
            _ => {
                let end = match verdict {
                    Verdict::GiveUp { .. } => "giving up",
                    _ => "failed",
                };
                debug!(%op, %target, attempts = attempt, "{end}: {failure}");
                ClientStats::add(&self.inner.stats.failed_requests, 1);
                Err(failure)
            }
        }
    }

    /// The error an attempt that was not the request's result stands for.
    fn error_of(
        &self,
        req: &Request,
        answer: Result<Response, Failure>,
        attempts: u32,
        started: Instant,
    ) -> AzureError {
        let (op, target) = (req.op, req.target.clone());
        match answer {
            Ok(resp) if (300..400).contains(&resp.status) => AzureError::Protocol {
                op,
                target,
                detail: super::http::redirect_message(
                    resp.status,
                    resp.header("location").as_deref(),
                ),
            },
            Ok(resp) => self.service_error(req, &resp),
            Err(Failure::Unsent(e)) => AzureError::NotAuthorized {
                op,
                target,
                detail: e.0,
            },
            Err(Failure::Unsendable(reason)) => AzureError::Invalid { op, target, reason },
            Err(Failure::Certificate(reason)) => AzureError::Certificate {
                op,
                target,
                detail: super::http::certificate_message(&req.url, &reason),
            },
            Err(Failure::Transport(detail)) => AzureError::Unreachable {
                op,
                target,
                endpoint: self.inner.account.endpoint_for_messages(),
                detail,
                attempts,
                elapsed: started.elapsed(),
            },
        }
    }

    /// After the service refused the token (`err`): has the credential renew it,
    /// so the request is sent again at once; `err` if the credential has no token
    /// to renew.
    async fn renew_token(&self, req: &Request, err: AzureError) -> Result<(), AzureError> {
        let Some(renewal) = self.inner.auth.renew() else {
            ClientStats::add(&self.inner.stats.failed_requests, 1);
            return Err(err);
        };
        debug!(op = %req.op, target = %req.target, "token refused: renewing it and trying again: {err}");
        if let Err(e) = renewal.await {
            debug!("renewal after 401 failed: {e}");
        }
        self.inner.stats.attempt_ended(Some(err.to_string()));
        Ok(())
    }

    /// One signed attempt. `Err` says why no answer came, free of URLs.
    async fn attempt(
        &self,
        req: &Request,
        sequence: Option<u64>,
        timeout: Duration,
        fresh: bool,
        sink: Option<&mut Scatter<'_, '_>>,
    ) -> Result<Response, Failure> {
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
        let http = if fresh {
            &self.inner.fresh_http
        } else {
            &self.inner.http
        };
        let send = async {
            let resp = http
                .request(req.method.clone(), url)
                .headers(map)
                .body(req.body.clone())
                .send()
                .await
                .map_err(describe)?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let mut streamed = 0;
            let success = req.ok.contains(&status);
            let body = match sink {
                Some(sink) if success => {
                    let mut resp = resp;
                    sink.restart();
                    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
                        if !sink.put(&chunk) {
                            return Err(Transport::Other(format!(
                                "the answer is longer than the {} bytes asked for",
                                sink.capacity()
                            )));
                        }
                    }
                    streamed = sink.filled();
                    Bytes::new()
                }
                _ if success => body_within(resp, body_max(req)).await?,
                // Only its start is read: the code and message are there.
                _ => super::http::body_prefix(resp, ERROR_BODY_MAX)
                    .await
                    .map_err(describe)?,
            };
            Ok(Response {
                status,
                headers,
                body,
                streamed,
                after_unanswered: false,
            })
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(r) => r.map_err(|t| match t {
                Transport::Certificate(reason) => Failure::Certificate(reason),
                Transport::Other(detail) => Failure::Transport(detail),
            }),
            Err(_) => Err(Failure::Transport(format!(
                "timed out after {:.1}s",
                timeout.as_secs_f64()
            ))),
        }
    }

    /// The error of a request whose try ran out of time before (another) attempt
    /// could be sent: the fence's raise before it took the time, or waiting for
    /// another writer's raise.
    fn out_of_time(&self, req: &Request, attempts: u32, started: Instant) -> AzureError {
        ClientStats::add(&self.inner.stats.failed_requests, 1);
        AzureError::Unreachable {
            op: req.op,
            target: req.target.clone(),
            endpoint: self.inner.account.endpoint_for_messages(),
            detail: "no time left in this try (the outage is older than the I/O timeout)".into(),
            attempts,
            elapsed: started.elapsed(),
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
            denied: (resp.status == 403)
                .then(|| self.inner.auth.denied(req.op))
                .flatten(),
        }
    }
}

/// The delay a `Retry-After: SECONDS` header asks for (at most a minute).
fn retry_after(resp: &Response) -> Option<Duration> {
    let secs: u64 = resp.header("retry-after")?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(60)))
}

/// Whether the service refused the request's credential itself, so a renewed
/// token may be accepted: any 401 (Azure's answer to an expired or revoked
/// token), or Azurite's 403 for an expired one.
fn token_refused(resp: &Response) -> bool {
    resp.status == 401
        || (resp.status == 403
            && resp.header("x-ms-error-code").as_deref() == Some("AuthenticationFailed")
            && String::from_utf8_lossy(&resp.body).contains("Lifetime validation failed"))
}

/// Tells the write fence `f` what the rules found of an attempt that carried
/// `carried`.
fn tell_fence(f: &WriteFence, carried: u64, fence: Fence) {
    match fence {
        Fence::Unchanged => {}
        Fence::Refused => f.refused(carried),
        Fence::Abandoned => f.abandoned(carried),
    }
}

/// Why an attempt got no answer.
enum Failure {
    /// It could not be authorised, so it was not sent.
    Unsent(AuthError),
    /// A header is not valid HTTP (nothing was sent; retrying cannot help).
    Unsendable(String),
    /// The server's certificate is not trusted (rustls's reason).
    Certificate(String),
    /// No answer: refused, reset, timed out.
    Transport(String),
}
