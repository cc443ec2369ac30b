//! The request pipeline: [`BlobService`], the handle every operation goes through.
//!
//! Each operation describes its request once ([`Request`]); [`BlobService::execute`]
//! authorises it afresh for every attempt (a Shared Key signature covers `x-ms-date`),
//! sends the very same body bytes to the very same range on every retry, and turns
//! failures into [`AzureError`]s. The operations themselves are in [`super::ops`],
//! authorisation behind [`super::auth::Authorizer`]. Nothing here knows about disks or
//! FUSE, nor about the operations: they use the pipeline, not the other way round.
//!
//! Here: the handle and what a request and its answer are. Sending one attempt
//! and reading its answer within bounds is `send.rs`, and what a successful
//! answer must hold to count as the answer asked for, `check.rs`; the tries of a request
//! (the loop that carries out each attempt's verdict, within the policy's
//! budget or one try's deadline) are `tries.rs`.

mod check;
mod send;
mod tries;

use std::sync::Arc;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::Method;
use url::Url;

use super::account::Account;
use super::auth::entra::BoxFuture;
use super::auth::Authorizer;
use super::error::{AzureError, Op};
use super::gate::Gate;
use super::retry::RetryPolicy;
use super::stats::{ClientStats, StatsSnapshot};
use super::verdict::Rules;

pub(crate) use check::{Expect, Found};
pub use tries::one_try;

/// REST API version sent with every request (accepted by Azure and Azurite 3.35).
pub const API_VERSION: &str = "2021-12-02";

/// The answer the service gives a write whose sequence-number condition failed.
pub const SEQUENCE_REFUSED: &str = "SequenceNumberConditionNotMet";

/// What the pipeline asks of a write's sequence-number fence (the write fence,
/// `ops::fence`, which raises the number with a request of its own through the
/// pipeline): the number each attempt carries, and what became of it.
pub(crate) trait SequenceFence: Send + Sync {
    /// The number the next attempt must carry, raised first when an attempt
    /// that carried the current one was abandoned (or none is known yet).
    fn number(&self) -> BoxFuture<'_, Result<u64, AzureError>>;
    /// An attempt carrying `carried` ended without an answer: it may still land.
    fn abandoned(&self, carried: u64);
    /// The service refused an attempt carrying `carried`: nothing was written.
    fn refused(&self, carried: u64);
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
    /// (see [`SequenceFence`]).
    pub(super) fence: Option<Arc<dyn SequenceFence>>,
    /// A delete: once an attempt went unanswered (it may have been carried out),
    /// a later attempt's 404 means that one did the work.
    pub(super) gone_after_unknown_is_done: bool,
    /// What a successful answer must hold besides its status (see
    /// `check.rs`); one that does not is retried, never returned.
    pub(super) expect: Option<Expect>,
}

/// A successful response, body read in full.
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// Bytes streamed into the caller's buffer (see `execute_into`).
    pub(super) streamed: usize,
    /// What checking the body found in it, when that took parsing it (see
    /// `check.rs`).
    pub(super) found: Found,
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
            expect: None,
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

    /// Sent behind the sequence-number fence `fence`, if any.
    pub(super) fn fenced<F: SequenceFence + 'static>(&mut self, fence: Option<Arc<F>>) {
        self.fence = fence.map(|f| f as Arc<dyn SequenceFence>);
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
}
