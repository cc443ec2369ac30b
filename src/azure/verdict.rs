//! The retry rules: what the pipeline does after each attempt of a request, as a
//! pure function of the request, the answer and the tries so far.
//!
//! [`verdict`] decides and [`attempt_timeout`] bounds the next attempt;
//! [`super::pipeline`] only carries the decision out (counters, the write fence,
//! the pace gate, the pause). Nothing here sends, sleeps or reads a clock, so each
//! rule has a table test below, and changing one makes a row fail. These rules
//! are the riskiest code of the client: a retry too many sends a write twice, one
//! too few fails an I/O a filesystem then aborts its journal over.

use std::time::{Duration, Instant};

use super::retry::{is_retryable_status, RetryPolicy};

/// Within one try, an attempt is sent only with at least this much of it left.
const MIN_ATTEMPT: Duration = Duration::from_millis(200);
/// Outside one try, the budget never shortens an attempt below this: what a
/// single small request needs, so the bound holds without spurious timeouts.
const MIN_BUDGETED_ATTEMPT: Duration = Duration::from_secs(2);

/// What the rules need to know of a request, the same for all its attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rules {
    /// Every attempt carries the write fence's sequence number (a mount's Put
    /// Page and Clear Pages; see `WriteFence`).
    pub fenced: bool,
    /// A delete: once an attempt's outcome is unknown (it may have been carried
    /// out), a later attempt's 404 means that one did the work.
    pub gone_after_unknown_is_done: bool,
    /// The caller set the request's attempts because it has a better fallback
    /// than repeating the call (a snapshot retries, idempotently, itself): no last
    /// chance on a new connection.
    pub own_attempts: bool,
    /// The wall-clock budget of the whole request, retries included.
    pub budget: Duration,
}

/// What one attempt brought, as the rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// The service answered.
    Status(Status),
    /// Not sent: the credential could not sign it (a token may still come).
    Unsent,
    /// Not sendable: a header is not valid HTTP (nothing was sent).
    Unsendable,
    /// The server's certificate is not trusted: refused in the handshake, before
    /// any of the request was sent.
    Certificate,
    /// No answer (refused, reset, timed out): it may have been carried out.
    Unanswered,
    /// An answer that is not one to the question asked (a ranged read of
    /// another range or cut short, a page list that is no page list, an
    /// encoding never asked for, a body that did not come whole in time): it
    /// is never acted on, and the request is sent again as after a server
    /// error. Its status may have said the work was done, so its outcome is
    /// unknown.
    Garbled,
}

/// An answer of the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Status {
    pub status: u16,
    /// The request counts this status as success.
    pub ok: bool,
    /// The service refused the credential itself (an expired or revoked token),
    /// so a renewed one may be accepted.
    pub token_refused: bool,
    /// The sequence-number fence refused the write: surely not written.
    pub sequence_refused: bool,
    /// 503 `ServerBusy`: refused before it ran.
    pub throttled: bool,
    /// The pause `Retry-After` asks for.
    pub retry_after: Option<Duration>,
}

impl Answer {
    /// Whether the attempt may have been carried out although it did not succeed:
    /// it went unanswered, or the server failed in a way that may come after the
    /// work was done. Not a throttled one: refused before it ran.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Answer::Unanswered | Answer::Garbled => true,
            Answer::Status(s) => is_retryable_status(s.status) && !s.throttled,
            Answer::Unsent | Answer::Unsendable | Answer::Certificate => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Answer::Status(s) => s.retry_after,
            _ => None,
        }
    }
}

/// What the attempts of one request have shown so far. The pipeline's loop
/// keeps it and changes it only through [`Tries::begin`] and [`Tries::note`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tries {
    /// Attempts sent, the latest included.
    pub sent: u32,
    /// Attempts allowed: the policy's or the request's own, one more for a
    /// renewed token.
    pub allowed: u32,
    /// An attempt's outcome is unknown (see [`Answer::outcome_unknown`]): it may
    /// still be carried out, after a later one.
    pub unknown: bool,
    /// A refused token was renewed already (once a request).
    pub renewed: bool,
    /// The latest attempt got no answer: the next goes on a new connection, since
    /// the pool may hold connections an outage left dead. Within one try, the
    /// first attempt does too.
    pub unanswered: bool,
    /// An attempt went on a new connection, and so surely reached for the service
    /// rather than a connection the pool kept.
    pub fresh_tried: bool,
    /// The one attempt past the budget ([`Verdict::LastChance`]) is under way.
    pub last_chance: bool,
}

impl Tries {
    /// Before the first attempt: `allowed` attempts (at least one), within one
    /// try (see `pipeline::one_try`) or not.
    pub fn new(allowed: u32, in_one_try: bool) -> Tries {
        Tries {
            sent: 0,
            allowed: allowed.max(1),
            unknown: false,
            renewed: false,
            unanswered: in_one_try,
            fresh_tried: false,
            last_chance: false,
        }
    }

    /// Counts an attempt about to be sent; `true`: it goes on a new connection.
    pub fn begin(&mut self) -> bool {
        self.sent += 1;
        let fresh = self.unanswered;
        self.fresh_tried |= fresh;
        fresh
    }

    /// Learns from an attempt's `answer` and the `verdict` on it.
    pub fn note(&mut self, answer: &Answer, verdict: &Verdict) {
        self.unanswered = *answer == Answer::Unanswered;
        self.unknown |= answer.outcome_unknown();
        match verdict {
            Verdict::RenewToken => {
                // The refused attempt surely did nothing: it does not count.
                self.renewed = true;
                self.allowed += 1;
            }
            Verdict::LastChance { .. } => self.last_chance = true,
            _ => {}
        }
    }
}

/// The time the rules look at, read once for each decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Clock {
    /// Since the request's first attempt.
    pub elapsed: Duration,
    /// What is left of the one try the request belongs to, if it does.
    pub left: Option<Duration>,
}

impl Clock {
    /// Now, for a request `started` then, within a try that ends at `deadline`.
    pub fn now(started: Instant, deadline: Option<Instant>) -> Clock {
        let now = Instant::now();
        Clock {
            elapsed: now.saturating_duration_since(started),
            left: deadline.map(|d| d.saturating_duration_since(now)),
        }
    }
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Success: the answer is the result. `after_unanswered`: an earlier
    /// attempt's outcome is unknown, so it may still be carried out after this one.
    Done { after_unanswered: bool },
    /// A delete's 404 after an attempt whose outcome is unknown: that one did the
    /// work, and the answer is the result.
    Gone,
    /// A final error: no further attempt can change it. `noted`: it counts as
    /// the latest failed attempt (`stats`' last failure), as a redirect or an
    /// untrusted certificate do (the endpoint is wrong); a refusal of the request
    /// itself, or one that could not be sent, says nothing of the service.
    Final { noted: bool },
    /// The credential was refused: renew the token and send again at once,
    /// outside the attempt count (the refused attempt surely did nothing).
    RenewToken,
    /// Send again after the pause `after`, the write fence told `fence` first.
    Retry { after: Duration, fence: Fence },
    /// The tries are spent and every attempt went unanswered on a connection the
    /// pool kept, which an outage may have left dead while the service is back:
    /// one more at once, on a new connection, with the full request timeout. So
    /// "one try" is one that reached for the service, and the first I/O after an
    /// outage does not fail on a dead connection.
    LastChance { fence: Fence },
    /// The tries are spent: the failure is the result.
    GiveUp { fence: Fence },
}

impl Verdict {
    /// What the write fence must learn of the attempt.
    pub fn fence(&self) -> Fence {
        match self {
            Verdict::Retry { fence, .. }
            | Verdict::LastChance { fence }
            | Verdict::GiveUp { fence } => *fence,
            _ => Fence::Unchanged,
        }
    }
}

/// What the write fence must learn of a failed attempt that carried its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fence {
    /// Nothing: the request is not fenced, or the attempt surely did nothing.
    Unchanged,
    /// The fence refused it: surely not written, so it is sent again with the
    /// number as it is now (`WriteFence::refused`).
    Refused,
    /// Its outcome is unknown: the number must rise before anything is sent
    /// again (`WriteFence::abandoned`).
    Abandoned,
}

/// What to do after an attempt of a request under `rules` brought `answer`,
/// `tries` (this attempt counted) and `clock` being as they are; `backoff` is the
/// policy's (random) pause before the next attempt.
pub(super) fn verdict(
    rules: &Rules,
    answer: &Answer,
    tries: &Tries,
    clock: &Clock,
    backoff: Duration,
) -> Verdict {
    let again = || again(rules, answer, tries, clock, backoff);
    match answer {
        Answer::Status(s)
            if s.status == 404 && rules.gone_after_unknown_is_done && tries.unknown =>
        {
            Verdict::Gone
        }
        Answer::Status(s) if s.ok => Verdict::Done {
            after_unanswered: tries.unknown,
        },
        Answer::Status(s) if s.token_refused && !tries.renewed => Verdict::RenewToken,
        // A redirect is never followed: final, whatever the operation.
        Answer::Status(s) if (300..400).contains(&s.status) => Verdict::Final { noted: true },
        Answer::Status(s) if rules.fenced && s.sequence_refused => again(),
        Answer::Status(s) if !is_retryable_status(s.status) => Verdict::Final { noted: false },
        // No retry makes a certificate trusted.
        Answer::Certificate => Verdict::Final { noted: true },
        Answer::Unsendable => Verdict::Final { noted: false },
        // A server error or throttling; not sent (a token may come); no
        // answer; an answer that cannot be the one asked for.
        Answer::Status(_) | Answer::Unsent | Answer::Unanswered | Answer::Garbled => again(),
    }
}

/// After a failure worth another attempt: when to send it, or that the tries
/// are spent.
fn again(
    rules: &Rules,
    answer: &Answer,
    tries: &Tries,
    clock: &Clock,
    backoff: Duration,
) -> Verdict {
    let fence = match answer {
        _ if !rules.fenced => Fence::Unchanged,
        Answer::Status(s) if s.sequence_refused => Fence::Refused,
        _ if answer.outcome_unknown() => Fence::Abandoned,
        _ => Fence::Unchanged,
    };
    let unanswered = *answer == Answer::Unanswered;
    // A busy service's `Retry-After` is a floor for the backoff.
    let after = backoff.max(answer.retry_after().unwrap_or_default());
    let spent = tries.sent >= tries.allowed
        || match clock.left {
            // One try: over once an attempt got no answer, or at its deadline.
            Some(left) => unanswered || after >= left,
            None => clock.elapsed + after >= rules.budget,
        };
    if !spent {
        Verdict::Retry { after, fence }
    } else if unanswered && !tries.fresh_tried && !rules.own_attempts {
        Verdict::LastChance { fence }
    } else {
        Verdict::GiveUp { fence }
    }
}

/// How long the next attempt may take: the request timeout, shortened to what is
/// left of the budget but never below [`MIN_BUDGETED_ATTEMPT`], or in full for the
/// last chance on a new connection; within one try, to its deadline however
/// little is left, and `None` once less than [`MIN_ATTEMPT`] is.
pub(super) fn attempt_timeout(
    policy: &RetryPolicy,
    clock: &Clock,
    last_chance: bool,
) -> Option<Duration> {
    match clock.left {
        Some(left) => (left >= MIN_ATTEMPT).then(|| policy.request_timeout.min(left)),
        None if last_chance => Some(policy.request_timeout),
        None => {
            let remaining = policy.budget.saturating_sub(clock.elapsed);
            Some(
                policy
                    .request_timeout
                    .min(remaining.max(MIN_BUDGETED_ATTEMPT)),
            )
        }
    }
}

#[cfg(test)]
mod tests;
