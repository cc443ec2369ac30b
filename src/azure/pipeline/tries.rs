//! The tries of one request: the loop that carries out each attempt's verdict
//! (the retry rules are `verdict.rs`, a pure function), within the policy's
//! attempts and budget, or within the deadline of one try.

use std::time::{Duration, Instant};

use tracing::debug;

use super::send::{retry_after, token_refused, Failure};
use super::{BlobService, Request, Response, SequenceFence, SEQUENCE_REFUSED};
use crate::azure::error::AzureError;
use crate::azure::scatter::Scatter;
use crate::azure::stats::{ClientStats, Outcome};
use crate::azure::verdict::{
    attempt_timeout, verdict, Answer, Clock, Fence, Status, Tries, Verdict,
};

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

impl BlobService {
    /// Sends `req`, retrying what is worth retrying within the policy's limits.
    pub(in crate::azure) async fn execute(&self, req: Request) -> Result<Response, AzureError> {
        self.execute_into(req, None).await
    }

    /// [`Self::execute`], with a successful response's body streamed into `sink`
    /// instead of collected (`Response::streamed` says how much came), which saves
    /// a copy and a fresh allocation per large read. Every attempt starts over.
    ///
    /// What to do after each attempt is [`verdict`]'s to decide (the retry rules,
    /// with a table test each); this loop only carries it out.
    pub(in crate::azure) async fn execute_into(
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
                tell_fence(f.as_ref(), n, verdict.fence());
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
            Err(Failure::Transport(_) | Failure::Certificate(_) | Failure::Garbled(_)) => {
                Outcome::NoAnswer
            }
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
            Err(Failure::Garbled(_)) => return Answer::Garbled,
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
                detail: crate::azure::http::redirect_message(
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
                detail: crate::azure::http::certificate_message(&req.url, &reason),
            },
            Err(Failure::Garbled(detail)) => AzureError::Garbled {
                op,
                target,
                endpoint: self.inner.account.endpoint_for_messages(),
                detail,
                attempts,
                elapsed: started.elapsed(),
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
}

/// Tells the write fence `f` what the rules found of an attempt that carried
/// `carried`.
fn tell_fence(f: &dyn SequenceFence, carried: u64, fence: Fence) {
    match fence {
        Fence::Unchanged => {}
        Fence::Refused => f.refused(carried),
        Fence::Abandoned => f.abandoned(carried),
    }
}
