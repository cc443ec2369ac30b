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
fn an_answer_that_is_not_the_one_asked_for_is_retried_as_a_server_error_never_done() {
    check(&[
        ("plain", on(Answer::Garbled), retry(ms(100))),
        (
            "fenced: its status may have said the write was done",
            on(Answer::Garbled).fenced(),
            retry_fenced(Fence::Abandoned),
        ),
        ("spent", on(Answer::Garbled).attempt(8), GIVE_UP),
        (
            "spent: an answer came, so no last chance on a new connection",
            on(Answer::Garbled).elapsed(secs(25)),
            GIVE_UP,
        ),
        (
            "within one try: the deadline alone ends it",
            on(Answer::Garbled).one_try_left(secs(10)),
            retry(ms(100)),
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
