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
            Answer::Unanswered => true,
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
        // A server error or throttling; not sent (a token may come); no answer.
        Answer::Status(_) | Answer::Unsent | Answer::Unanswered => again(),
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
mod tests {
    //! One table per rule: each row an attempt's answer in a situation, and the
    //! verdict the rules must reach on it.

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// An answer with `status` that is no success and no particular refusal.
    fn status(status: u16) -> Answer {
        Answer::Status(Status {
            status,
            ok: false,
            token_refused: false,
            sequence_refused: false,
            throttled: false,
            retry_after: None,
        })
    }

    fn with(answer: Answer, change: impl FnOnce(&mut Status)) -> Answer {
        let Answer::Status(mut s) = answer else {
            unreachable!("only answers are changed")
        };
        change(&mut s);
        Answer::Status(s)
    }

    fn ok(code: u16) -> Answer {
        with(status(code), |s| s.ok = true)
    }

    fn token_refused(code: u16) -> Answer {
        with(status(code), |s| s.token_refused = true)
    }

    fn sequence_refused() -> Answer {
        with(status(412), |s| s.sequence_refused = true)
    }

    /// 503 `ServerBusy`, asking for a pause of `retry_after` if any.
    fn busy(retry_after: Option<Duration>) -> Answer {
        with(status(503), |s| {
            s.throttled = true;
            s.retry_after = retry_after;
        })
    }

    /// An attempt and its situation: by default the first attempt of eight of
    /// a plain request, early in its 25 s budget, with a backoff of 100 ms.
    #[derive(Debug, Clone, Copy)]
    struct Case {
        rules: Rules,
        answer: Answer,
        tries: Tries,
        clock: Clock,
        backoff: Duration,
    }

    fn on(answer: Answer) -> Case {
        let mut tries = Tries::new(8, false);
        tries.begin();
        Case {
            rules: Rules {
                fenced: false,
                gone_after_unknown_is_done: false,
                own_attempts: false,
                budget: secs(25),
            },
            answer,
            tries,
            clock: Clock {
                elapsed: ms(100),
                left: None,
            },
            backoff: ms(100),
        }
    }

    impl Case {
        fn fenced(mut self) -> Case {
            self.rules.fenced = true;
            self
        }
        fn delete(mut self) -> Case {
            self.rules.gone_after_unknown_is_done = true;
            self
        }
        /// The caller set `n` attempts.
        fn own_attempts(mut self, n: u32) -> Case {
            self.rules.own_attempts = true;
            self.tries.allowed = n;
            self
        }
        fn unknown(mut self) -> Case {
            self.tries.unknown = true;
            self
        }
        fn renewed(mut self) -> Case {
            self.tries.renewed = true;
            self
        }
        /// The `n`th attempt.
        fn attempt(mut self, n: u32) -> Case {
            self.tries.sent = n;
            self
        }
        fn fresh_tried(mut self) -> Case {
            self.tries.fresh_tried = true;
            self
        }
        fn elapsed(mut self, d: Duration) -> Case {
            self.clock.elapsed = d;
            self
        }
        /// Within one try, with `left` of it left (its first attempt went on a
        /// new connection).
        fn one_try_left(mut self, left: Duration) -> Case {
            self.clock.left = Some(left);
            self.tries.fresh_tried = true;
            self
        }
        fn backoff(mut self, d: Duration) -> Case {
            self.backoff = d;
            self
        }
        fn verdict(&self) -> Verdict {
            verdict(
                &self.rules,
                &self.answer,
                &self.tries,
                &self.clock,
                self.backoff,
            )
        }
    }

    fn check(table: &[(&str, Case, Verdict)]) {
        for (row, case, want) in table {
            assert_eq!(case.verdict(), *want, "{row}: {case:?}");
        }
    }

    fn retry(after: Duration) -> Verdict {
        Verdict::Retry {
            after,
            fence: Fence::Unchanged,
        }
    }

    fn retry_fenced(fence: Fence) -> Verdict {
        Verdict::Retry {
            after: ms(100),
            fence,
        }
    }

    const GIVE_UP: Verdict = Verdict::GiveUp {
        fence: Fence::Unchanged,
    };
    const FINAL: Verdict = Verdict::Final { noted: false };
    const FINAL_NOTED: Verdict = Verdict::Final { noted: true };

    #[test]
    fn a_success_is_done_and_says_whether_an_earlier_attempt_may_land_after_it() {
        let done = Verdict::Done {
            after_unanswered: false,
        };
        check(&[
            ("first attempt", on(ok(200)), done),
            ("a status the request counts as success", on(ok(404)), done),
            (
                "after an attempt whose outcome is unknown",
                on(ok(201)).unknown().fenced(),
                Verdict::Done {
                    after_unanswered: true,
                },
            ),
            ("the last attempt allowed", on(ok(200)).attempt(8), done),
        ]);
    }

    #[test]
    fn a_deletes_404_after_an_attempt_of_unknown_outcome_means_that_one_did_it() {
        check(&[
            (
                "delete, unknown before",
                on(status(404)).delete().unknown(),
                Verdict::Gone,
            ),
            ("delete, nothing unknown", on(status(404)).delete(), FINAL),
            ("not a delete", on(status(404)).unknown(), FINAL),
        ]);
    }

    #[test]
    fn a_refused_token_is_renewed_once_outside_the_attempt_count() {
        check(&[
            ("401", on(token_refused(401)), Verdict::RenewToken),
            (
                "Azurite's 403",
                on(token_refused(403)).fenced(),
                Verdict::RenewToken,
            ),
            (
                "attempts spent",
                on(token_refused(401)).attempt(8),
                Verdict::RenewToken,
            ),
            ("renewed already", on(token_refused(401)).renewed(), FINAL),
            ("any other 403", on(status(403)), FINAL),
        ]);
    }

    #[test]
    fn a_redirect_is_never_followed_and_counts_as_a_failed_attempt() {
        check(&[
            ("300", on(status(300)), FINAL_NOTED),
            ("307, fenced", on(status(307)).fenced(), FINAL_NOTED),
            ("399", on(status(399)), FINAL_NOTED),
        ]);
    }

    #[test]
    fn a_write_the_fence_refused_is_sent_again_once_the_fence_learned_the_number() {
        check(&[
            (
                "fenced",
                on(sequence_refused()).fenced(),
                retry_fenced(Fence::Refused),
            ),
            (
                "fenced, attempts spent",
                on(sequence_refused()).fenced().attempt(8),
                Verdict::GiveUp {
                    fence: Fence::Refused,
                },
            ),
            ("not fenced: a plain 412", on(sequence_refused()), FINAL),
        ]);
    }

    #[test]
    fn a_refusal_of_the_request_itself_is_final_and_not_counted_against_the_service() {
        for code in [400, 401, 403, 404, 409, 412, 413, 416] {
            check(&[
                ("plain", on(status(code)), FINAL),
                (
                    "fenced, unknown before",
                    on(status(code)).fenced().unknown(),
                    FINAL,
                ),
            ]);
        }
    }

    #[test]
    fn a_server_error_is_retried_and_raises_the_fence_first() {
        for code in [408, 500, 502, 503, 504] {
            check(&[
                ("plain", on(status(code)), retry(ms(100))),
                (
                    "fenced",
                    on(status(code)).fenced(),
                    retry_fenced(Fence::Abandoned),
                ),
            ]);
        }
    }

    #[test]
    fn a_throttled_request_is_sent_again_as_it_is_after_at_least_its_retry_after() {
        check(&[
            ("fenced, no hint", on(busy(None)).fenced(), retry(ms(100))),
            ("a longer hint", on(busy(Some(secs(3)))), retry(secs(3))),
            ("a shorter hint", on(busy(Some(ms(10)))), retry(ms(100))),
            ("a hint past the budget", on(busy(Some(secs(30)))), GIVE_UP),
        ]);
    }

    #[test]
    fn an_attempt_not_sent_is_retried_unless_no_attempt_can_send_it() {
        check(&[
            ("no token yet", on(Answer::Unsent).fenced(), retry(ms(100))),
            (
                "no token yet, spent",
                on(Answer::Unsent).attempt(8),
                GIVE_UP,
            ),
            ("a header that is not HTTP", on(Answer::Unsendable), FINAL),
            (
                "untrusted certificate",
                on(Answer::Certificate),
                FINAL_NOTED,
            ),
            (
                "untrusted certificate, fenced",
                on(Answer::Certificate).fenced(),
                FINAL_NOTED,
            ),
        ]);
    }

    #[test]
    fn an_unanswered_attempt_is_retried_and_raises_the_fence_first() {
        check(&[
            ("plain", on(Answer::Unanswered), retry(ms(100))),
            (
                "fenced",
                on(Answer::Unanswered).fenced(),
                retry_fenced(Fence::Abandoned),
            ),
        ]);
    }

    #[test]
    fn the_tries_are_spent_by_the_attempts_or_the_budget() {
        check(&[
            ("attempt 7 of 8", on(status(500)).attempt(7), retry(ms(100))),
            ("attempt 8 of 8", on(status(500)).attempt(8), GIVE_UP),
            (
                "the request's own one attempt",
                on(status(500)).own_attempts(1),
                GIVE_UP,
            ),
            (
                "the pause ends before the budget",
                on(status(500)).elapsed(ms(24_899)),
                retry(ms(100)),
            ),
            (
                "the pause ends at the budget",
                on(status(500)).elapsed(ms(24_900)),
                GIVE_UP,
            ),
            (
                "a long backoff",
                on(status(500)).backoff(secs(26)).elapsed(ms(0)),
                GIVE_UP,
            ),
        ]);
    }

    #[test]
    fn within_one_try_an_unanswered_attempt_or_its_deadline_ends_it() {
        check(&[
            (
                "a server error",
                on(status(500)).one_try_left(secs(10)),
                retry(ms(100)),
            ),
            (
                "the budget does not count",
                on(status(500)).one_try_left(secs(10)).elapsed(secs(60)),
                retry(ms(100)),
            ),
            (
                "the pause ends before the deadline",
                on(status(500)).one_try_left(ms(101)),
                retry(ms(100)),
            ),
            (
                "the pause ends at the deadline",
                on(status(500)).one_try_left(ms(100)),
                GIVE_UP,
            ),
            (
                "a hint past the deadline",
                on(busy(Some(secs(2)))).one_try_left(secs(1)),
                GIVE_UP,
            ),
            (
                "attempts spent",
                on(status(500)).one_try_left(secs(10)).attempt(8),
                GIVE_UP,
            ),
            (
                "no answer",
                on(Answer::Unanswered).one_try_left(secs(10)),
                GIVE_UP,
            ),
        ]);
    }

    #[test]
    fn spent_tries_all_unanswered_on_pooled_connections_get_one_last_chance() {
        let last_chance = Verdict::LastChance {
            fence: Fence::Unchanged,
        };
        check(&[
            (
                "attempts spent",
                on(Answer::Unanswered).attempt(8),
                last_chance,
            ),
            (
                "budget spent",
                on(Answer::Unanswered).elapsed(secs(25)),
                last_chance,
            ),
            (
                "fenced",
                on(Answer::Unanswered).fenced().attempt(8),
                Verdict::LastChance {
                    fence: Fence::Abandoned,
                },
            ),
            (
                "a new connection was tried",
                on(Answer::Unanswered).attempt(8).fresh_tried(),
                GIVE_UP,
            ),
            (
                "the caller set the attempts",
                on(Answer::Unanswered).own_attempts(1),
                GIVE_UP,
            ),
            (
                "the last one was answered",
                on(status(500)).attempt(8),
                GIVE_UP,
            ),
        ]);
    }

    #[test]
    fn the_tries_learn_from_each_attempt() {
        // At least one attempt; the first on a pooled connection, unless within
        // one try.
        assert_eq!(Tries::new(0, false).allowed, 1);
        let mut t = Tries::new(8, false);
        assert!(!t.begin());
        assert_eq!((t.sent, t.fresh_tried), (1, false));
        assert!(Tries::new(8, true).begin());
        // No answer: unknown, and the next attempt on a new connection.
        let v = retry(ms(1));
        t.note(&Answer::Unanswered, &v);
        assert!(t.unanswered && t.unknown);
        assert!(t.begin());
        assert!(t.fresh_tried);
        // An answer: the next on a pooled connection; unknown stays.
        t.note(&busy(None), &v);
        assert!(!t.unanswered && t.unknown);
        assert!(!t.begin());
        // Which answers leave the outcome unknown.
        for (row, answer, unknown) in [
            ("server error", status(500), true),
            ("throttled", busy(None), false),
            ("refused by the fence", sequence_refused(), false),
            ("a refusal", status(409), false),
            ("not sent", Answer::Unsent, false),
            ("success", ok(200), false),
        ] {
            let mut t = Tries::new(8, false);
            t.note(&answer, &v);
            assert_eq!(t.unknown, unknown, "{row}");
        }
        // A renewed token adds an attempt, once; a last chance is noted.
        let mut t = Tries::new(8, false);
        t.note(&token_refused(401), &Verdict::RenewToken);
        assert_eq!((t.renewed, t.allowed, t.last_chance), (true, 9, false));
        let last = Verdict::LastChance {
            fence: Fence::Unchanged,
        };
        t.note(&Answer::Unanswered, &last);
        assert_eq!((t.allowed, t.last_chance), (9, true));
    }

    #[test]
    fn an_attempt_takes_the_request_timeout_cut_to_the_budget_or_the_deadline() {
        let p = RetryPolicy::default(); // 20 s a request, 25 s in all
        let at = |elapsed: Duration, left: Option<Duration>| Clock { elapsed, left };
        for (row, clock, last_chance, want) in [
            ("the first", at(secs(0), None), false, Some(secs(20))),
            (
                "budget half spent",
                at(ms(12_500), None),
                false,
                Some(ms(12_500)),
            ),
            (
                "budget nearly spent",
                at(secs(24), None),
                false,
                Some(secs(2)),
            ),
            ("budget spent", at(secs(30), None), false, Some(secs(2))),
            ("the last chance", at(secs(30), None), true, Some(secs(20))),
            (
                "one try, long left",
                at(secs(0), Some(secs(60))),
                false,
                Some(secs(20)),
            ),
            (
                "one try, 10 s left",
                at(secs(0), Some(secs(10))),
                false,
                Some(secs(10)),
            ),
            (
                "one try, last chance",
                at(secs(0), Some(secs(1))),
                true,
                Some(secs(1)),
            ),
            (
                "one try, just enough",
                at(secs(0), Some(ms(200))),
                false,
                Some(ms(200)),
            ),
            (
                "one try, too little",
                at(secs(0), Some(ms(199))),
                false,
                None,
            ),
        ] {
            assert_eq!(attempt_timeout(&p, &clock, last_chance), want, "{row}");
        }
    }

    #[test]
    fn only_failures_worth_another_attempt_tell_the_fence() {
        assert_eq!(Verdict::RenewToken.fence(), Fence::Unchanged);
        assert_eq!(FINAL.fence(), Fence::Unchanged);
        for fence in [Fence::Refused, Fence::Abandoned] {
            assert_eq!(retry_fenced(fence).fence(), fence);
            assert_eq!(Verdict::LastChance { fence }.fence(), fence);
            assert_eq!(Verdict::GiveUp { fence }.fence(), fence);
        }
    }
}
