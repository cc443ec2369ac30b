//! Fencing writes the client gave up on, with the page blob's sequence number.
//!
//! A Put Page or Clear Pages that timed out or lost its connection may still be
//! carried out by the service later: it can wait in the network, or run on the
//! server for as long as the server's own timeout allows. Re-sending it and
//! succeeding proves nothing about the first attempt, which could then land on top
//! of a newer write to the same range, bringing old bytes back.
//!
//! So every fenced write carries `x-ms-if-sequence-number-eq: N`, and after any
//! attempt whose outcome is unknown the number is raised (Set Blob Properties,
//! `increment`) before anything is sent again: the abandoned attempt still carries
//! the old number, and the service refuses it with 412 `SequenceNumberConditionNotMet`
//! whenever it arrives, writing nothing. A refusal is a sure "not written", so a
//! write refused for carrying a number that has moved on is simply sent again with
//! the current one. Raising is itself safe to repeat: a late increment only makes
//! the number larger, and the next refusal learns it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use reqwest::Method;
use tracing::{debug, warn};

use super::blob::BlobClient;
use crate::azure::auth::entra::BoxFuture;
use crate::azure::error::{AzureError, Op};
use crate::azure::pipeline::SequenceFence;
use crate::azure::stats::ClientStats;

/// The sequence-number fence of one blob, shared by every write a mount sends.
pub struct WriteFence {
    blob: BlobClient,
    lease: Option<String>,
    numbers: Mutex<Numbers>,
    /// Held while raising, so concurrent writers raise once, not once each.
    raising: tokio::sync::Mutex<()>,
    /// When the latest raise failed for want of an answer.
    unanswered_raise: Mutex<Option<Instant>>,
}

#[derive(Debug, Default)]
struct Numbers {
    /// The number writes carry now; `None` until learnt (the first write raises).
    current: Option<u64>,
    /// The highest number an attempt with an unknown outcome carried.
    abandoned: Option<u64>,
    /// A write carrying `current` was refused for it: the service's number
    /// moved on without this fence (a late increment of its own), so it is
    /// read again before the next attempt.
    stale: bool,
    /// Raises whose answer never came: each may have landed, or land later,
    /// taking the number one further than the fence knows.
    unanswered_raises: u64,
    /// Writes carry `current` and nothing else: never raised, never read
    /// again (see [`WriteFence::pinned`]).
    pinned: bool,
}

impl Numbers {
    /// The current number, if it is known, not refused, and above every
    /// abandoned attempt's.
    fn usable(&self) -> Option<u64> {
        if self.stale {
            return None;
        }
        self.current
            .filter(|c| self.abandoned.is_none_or(|a| a < *c))
    }

    /// Takes `n` as the service's number now: a raise's answer, or the
    /// blob's properties read again. Either is newer than whatever a refusal
    /// said of the number before it (a write refused meanwhile, while a
    /// raise was under way, made it stale; three raises in a row were then
    /// each found stale, and the write failed).
    fn adopt(&mut self, n: u64) {
        self.current = Some(n);
        self.stale = false;
    }

    /// Whether a raise answered `raised` fits what the fence knows: one above
    /// the number it knows, plus one for each raise whose answer was lost.
    /// Lower, or further up, is read again before it is believed; so is any
    /// answer while nothing is known to check it against but the first.
    fn believable(&self, raised: u64) -> bool {
        match self.current {
            Some(c) => raised > c && raised - c <= 1 + self.unanswered_raises,
            None => true,
        }
    }
}

/// The most raises one call of [`WriteFence::number`] sends: a number read
/// again from the blob's properties is the service's own, so one more raise
/// is all it can take to pass every abandoned attempt's.
const MAX_RAISES: usize = 3;

impl WriteFence {
    /// A fence for writes to `blob` under `lease`. Nothing is sent until the first
    /// write, which raises the number: that also fences whatever an earlier mount
    /// left in flight.
    pub fn new(blob: BlobClient, lease: Option<String>) -> Arc<WriteFence> {
        Arc::new(WriteFence {
            blob,
            lease,
            numbers: Mutex::new(Numbers::default()),
            raising: tokio::sync::Mutex::new(()),
            unanswered_raise: Mutex::new(None),
        })
    }

    /// A fence whose writes all carry `number`, the blob's when the writer made
    /// it, and that never raises it nor learns another: once anybody else
    /// raised it (a CSI call finishing a volume a killed call left without its
    /// footer), every write of this fence, sent or late, is refused, and the
    /// next attempt fails (412 `SequenceNumberConditionNotMet`) instead of
    /// writing into what is by then another writer's blob. For a new blob's
    /// first pages, each written once: a late copy of one of this fence's own
    /// writes carries the same bytes to the same range, and every later writer
    /// (a mount, a resize) raises the number past it.
    pub fn pinned(blob: BlobClient, number: u64) -> Arc<WriteFence> {
        let fence = WriteFence::new(blob, None);
        *fence.numbers() = Numbers {
            current: Some(number),
            pinned: true,
            ..Numbers::default()
        };
        fence
    }

    /// The error of a pinned fence's write once the number moved on.
    fn taken(&self) -> AzureError {
        AzureError::Service {
            op: Op::PutPage,
            target: self.blob.target(),
            status: 412,
            code: Some(crate::azure::pipeline::SEQUENCE_REFUSED.to_string()),
            message: Some(
                "another party raised the sequence number: the blob is no longer this writer's"
                    .into(),
            ),
            denied: None,
        }
    }

    fn numbers(&self) -> std::sync::MutexGuard<'_, Numbers> {
        self.numbers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unanswered_raise(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.unanswered_raise
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The number the next attempt must carry, raised first if an attempt that
    /// carried the current one was abandoned (or none is known yet).
    pub(crate) async fn number(&self) -> Result<u64, AzureError> {
        let pinned = {
            let n = self.numbers();
            n.pinned.then_some((n.current, n.stale))
        };
        match pinned {
            Some((_, true)) => return Err(self.taken()),
            Some((Some(n), false)) => return Ok(n),
            _ => {}
        }
        if let Some(n) = self.numbers().usable() {
            return Ok(n);
        }
        let asked = Instant::now();
        let _one_at_a_time = self.raising.lock().await;
        if let Some(n) = self.numbers().usable() {
            return Ok(n);
        }
        // A raise that got no answer while this writer waited for its turn is
        // this writer's failure too: the service is silent, and raising again
        // one writer after another made a flush of many runs wait for one
        // retry budget per run before it could fail.
        let failed = *self.unanswered_raise();
        if let Some(at) = failed.filter(|at| *at >= asked) {
            return Err(AzureError::Unreachable {
                op: Op::SetProperties,
                target: self.blob.target(),
                endpoint: self.blob.service().account().endpoint_for_messages(),
                detail: "another write's raise of the sequence number went unanswered meanwhile"
                    .into(),
                attempts: 0,
                elapsed: at.saturating_duration_since(asked),
            });
        }
        if self.numbers().stale {
            // A read, not a raise: reading changes nothing on the blob.
            let n = self.read_again().await?;
            if let Some(n) = self.numbers().usable() {
                return Ok(n);
            }
            debug!(
                number = n,
                "read again, still not above an abandoned write's: raising"
            );
        }
        for _ in 0..MAX_RAISES {
            let raised = self.raise().await?;
            if !self.numbers().believable(raised) {
                let known = self.numbers().current;
                let n = self.read_again().await?;
                warn!(
                    target = %self.blob.target(),
                    "a raise of the sequence number from {} was answered with {raised}, which cannot be: read again from the blob, it is {n}",
                    known.map_or("?".into(), |k| k.to_string())
                );
            } else {
                self.numbers().adopt(raised);
            }
            if let Some(n) = self.numbers().usable() {
                return Ok(n);
            }
        }
        let n = self.numbers();
        Err(AzureError::Protocol {
            op: Op::SetProperties,
            target: self.blob.target(),
            detail: format!(
                "sequence number {:?} did not rise above an abandoned write's ({:?}) in {MAX_RAISES} raises",
                n.current, n.abandoned
            ),
        })
    }

    /// Raises the number once: what the service answered.
    async fn raise(&self) -> Result<u64, AzureError> {
        // Boxed: raising sends a request through the pipeline that called us.
        let raised = Box::pin(self.blob.increment_sequence_number(self.lease.as_deref()))
            .await
            .inspect_err(|e| {
                if e.outcome_unknown() {
                    self.numbers().unanswered_raises += 1;
                }
                if matches!(e, AzureError::Unreachable { .. }) {
                    *self.unanswered_raise() = Some(Instant::now());
                }
            })?;
        self.blob
            .service()
            .counters()
            .fence_raises
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(raised)
    }

    /// Reads the number (and the lease) from the blob's properties and takes
    /// it as the number writes carry.
    async fn read_again(&self) -> Result<u64, AzureError> {
        let props = Box::pin(self.blob.properties()).await?;
        let n = props.sequence_number.ok_or_else(|| AzureError::Protocol {
            op: Op::GetProperties,
            target: self.blob.target(),
            detail: "no x-ms-blob-sequence-number in the properties".into(),
        })?;
        debug!(
            number = n,
            lease = props.lease_state.as_deref().unwrap_or("unknown"),
            "read the sequence number again"
        );
        self.numbers().adopt(n);
        Ok(n)
    }

    /// Raises the number now if an abandoned attempt still carries the current
    /// one. For an operation that failed after such an attempt: nothing may be
    /// sent again, but the attempt can still land, and reads in between never
    /// raise the number; once this returns, it is refused whenever it arrives.
    pub async fn settle(&self) -> Result<(), AzureError> {
        let unsettled = {
            let n = self.numbers();
            n.abandoned.is_some() && n.usable().is_none()
        };
        if unsettled {
            self.number().await?;
        }
        Ok(())
    }

    /// An attempt carrying `carried` ended without an answer (timeout, broken
    /// connection, or a server error that may come after the write): it may still
    /// land, so the number must rise before anything is sent again.
    pub(crate) fn abandoned(&self, carried: u64) {
        let mut n = self.numbers();
        if n.pinned {
            // Never raised: a late copy writes the same bytes, or is refused.
            return;
        }
        n.abandoned = Some(n.abandoned.map_or(carried, |a| a.max(carried)));
    }

    /// The service refused an attempt carrying `carried`: nothing was written. If
    /// the number is still the one we know, it moved on behind our back (a late
    /// increment of our own, or a number we should not have believed): read it
    /// again, and the lease with it, before the next attempt.
    pub(crate) fn refused(&self, carried: u64) {
        let mut n = self.numbers();
        if n.current == Some(carried) {
            n.stale = true;
        }
    }

    /// The number writes carry now, if known (for tests and stats).
    pub fn current(&self) -> Option<u64> {
        self.numbers().current
    }
}

impl SequenceFence for WriteFence {
    fn number(&self) -> BoxFuture<'_, Result<u64, AzureError>> {
        Box::pin(WriteFence::number(self))
    }

    fn abandoned(&self, carried: u64) {
        WriteFence::abandoned(self, carried)
    }

    fn refused(&self, carried: u64) {
        WriteFence::refused(self, carried)
    }
}

impl BlobClient {
    /// Raises the page blob's sequence number by one (Set Blob Properties with
    /// `x-ms-sequence-number-action: increment`, which changes no other property)
    /// and returns the new number. Needs the lease id while the blob is leased.
    pub async fn increment_sequence_number(&self, lease: Option<&str>) -> Result<u64, AzureError> {
        let mut req = self.request(
            Op::SetProperties,
            Method::PUT,
            &[("comp", "properties")],
            &[200],
        );
        req.header("x-ms-sequence-number-action", "increment");
        req.lease(lease);
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self.svc.execute(req).await?;
        resp.header("x-ms-blob-sequence-number")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| AzureError::Protocol {
                op: Op::SetProperties,
                target: self.target(),
                detail: "no x-ms-blob-sequence-number in the answer".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a new drive's first writes rely on (`drive::create_with`): the
    /// number it was made with, kept through an attempt given up on, and
    /// once refused never raised nor read again, but an error naming the
    /// refusal, with no request sent (the blob is another writer's by then).
    #[test]
    fn a_pinned_fence_keeps_its_number_and_fails_once_it_was_refused() {
        let account = crate::azure::Account::from_connection_string("UseDevelopmentStorage=true");
        let svc = crate::azure::BlobService::new(account.unwrap());
        let fence = WriteFence::pinned(svc.blob("c", "new.vhd"), 0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(fence.number()).unwrap(), 0);
        fence.abandoned(0);
        assert_eq!(rt.block_on(fence.number()).unwrap(), 0, "not raised");
        fence.refused(0);
        let err = rt.block_on(fence.number()).unwrap_err();
        assert_eq!(
            err.code(),
            Some(crate::azure::pipeline::SEQUENCE_REFUSED),
            "{err}"
        );
        assert_eq!(
            svc.stats().other_requests,
            0,
            "a pinned fence sends nothing"
        );
    }

    #[test]
    fn a_raise_is_believed_only_one_above_the_number_known_or_one_per_lost_raise() {
        let mut n = Numbers::default();
        assert!(n.believable(9_223_372_036_854_775_807), "nothing known yet");
        n.current = Some(4);
        assert!(n.believable(5));
        for told in [0, 3, 4, 6, 44, u64::MAX] {
            assert!(!n.believable(told), "{told} after 4");
        }
        n.unanswered_raises = 2;
        assert!(n.believable(6) && n.believable(7) && !n.believable(8));
    }

    #[test]
    fn a_refused_number_is_not_usable_until_read_again_or_raised() {
        let mut n = Numbers {
            current: Some(4),
            ..Numbers::default()
        };
        n.stale = true;
        assert_eq!(n.usable(), None);
        n.adopt(6);
        assert_eq!(n.usable(), Some(6), "a raise's answer is the number now");
    }

    #[test]
    fn a_number_is_usable_only_above_every_abandoned_attempt() {
        let mut n = Numbers::default();
        assert_eq!(n.usable(), None, "unknown at first: raise");
        n.current = Some(4);
        assert_eq!(n.usable(), Some(4));
        n.abandoned = Some(4);
        assert_eq!(n.usable(), None, "an attempt carrying 4 may still land");
        n.current = Some(5);
        assert_eq!(n.usable(), Some(5));
    }
}
