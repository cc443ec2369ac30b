//! Leases on a blob: the lease operations of [`BlobClient`] (acquire, renew, change,
//! release, break).

use reqwest::Method;

use super::blob::BlobClient;
use crate::azure::error::{AzureError, Op};
use crate::azure::pipeline::Response;
use crate::azure::stats::ClientStats;

/// A lease taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub id: String,
    /// An attempt before the one that took it got no answer: that copy may still
    /// reach the service, at any time (see [`BlobClient::acquire_lease_if_match`]).
    pub earlier_attempt_unanswered: bool,
}

/// A lease broken, or breaking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// Seconds until it is broken (0: it is).
    pub seconds_left: u32,
    /// An attempt before the one that broke it got no answer: that copy may still
    /// reach the service, at any time.
    pub earlier_attempt_unanswered: bool,
}

impl BlobClient {
    /// Acquires a lease with our own id; `duration` `None` is infinite. Acquiring again
    /// with the same id succeeds, so a retry after a lost answer is safe.
    pub async fn acquire_lease(
        &self,
        proposed_id: &str,
        duration: Option<u32>,
    ) -> Result<String, AzureError> {
        self.acquire_lease_if_match(proposed_id, duration, None)
            .await
            .map(|a| a.id)
    }

    /// [`Self::acquire_lease`] only while the blob's ETag is `etag` (else 412
    /// `ConditionNotMet`). Lease operations leave the ETag as it is, so a retry
    /// still matches; but an attempt given up on that lands after the holder
    /// changed the blob (a write, or a raised sequence number) and released it is
    /// refused, instead of taking the lease again for a holder that is gone.
    pub async fn acquire_lease_if_match(
        &self,
        proposed_id: &str,
        duration: Option<u32>,
        etag: Option<&str>,
    ) -> Result<Acquired, AzureError> {
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
        req.if_match(etag);
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self.svc.execute(req).await?;
        let named = resp.header("x-ms-lease-id");
        if let Some(other) = named.filter(|id| !id.trim().eq_ignore_ascii_case(proposed_id)) {
            return Err(self.let_go_of_unproposed(proposed_id, &other).await);
        }
        Ok(Acquired {
            id: proposed_id.to_string(),
            earlier_attempt_unanswered: resp.after_unanswered,
        })
    }

    /// After an acquire answered with lease id `other`, not the `proposed`
    /// one the service takes a lease under: the answer cannot be believed,
    /// so the lease is let go (under the proposed id, where the service holds
    /// it, else under the one named) and the acquire fails, leaving nothing
    /// leased. Never broken: a lease neither id releases may be another's.
    async fn let_go_of_unproposed(&self, proposed: &str, other: &str) -> AzureError {
        let said = crate::azure::text::service_text(other);
        let released = match self.release_lease(proposed).await {
            Ok(()) => Ok(()),
            Err(_) => self.release_lease(other).await,
        };
        let outcome = match released {
            Ok(()) => "the lease was released, and the blob is not leased".to_string(),
            Err(e) => format!(
                "releasing it failed ({e}); if no one else uses the drive, run `blobdrive lease break {} --yes`",
                self.target()
            ),
        };
        AzureError::Protocol {
            op: Op::AcquireLease,
            target: self.target(),
            detail: format!(
                "the lease was acquired under id '{said}', not the id proposed ({proposed}), which the service always takes: the answer cannot be believed; {outcome}"
            ),
        }
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

    /// Releases our lease. A release whose answer was lost may have been done: its
    /// retry then finds no lease of ours (409). If nobody holds the blob's lease
    /// now, that is what releasing was for, and it succeeded; if another party
    /// holds it, ours was lost and the error stands.
    pub async fn release_lease(&self, lease_id: &str) -> Result<(), AzureError> {
        let result = self
            .lease_action(
                Op::ReleaseLease,
                "release",
                vec![("x-ms-lease-id", lease_id.into())],
                &[200],
            )
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.code(),
                    Some("LeaseNotPresentWithLeaseOperation" | "LeaseIdMismatchWithLeaseOperation")
                ) =>
            {
                let held = self.properties().await?.lease_state.as_deref() == Some("leased");
                if held {
                    Err(e)
                } else {
                    Ok(())
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Breaks whoever's lease; `period` seconds (0..=60) lets the holder finish, `None`
    /// breaks an infinite lease at once. Returns the seconds until it is broken.
    pub async fn break_lease(&self, period: Option<u32>) -> Result<u32, AzureError> {
        self.break_lease_if_match(period, None)
            .await
            .map(|b| b.seconds_left)
    }

    /// [`Self::break_lease`] only while the blob's ETag is `etag` (else 412
    /// `ConditionNotMet`): a copy of the break given up on that lands after the
    /// blob changed (a new holder's writes, or a raised sequence number) is
    /// refused instead of breaking a lease taken since.
    pub async fn break_lease_if_match(
        &self,
        period: Option<u32>,
        etag: Option<&str>,
    ) -> Result<Broken, AzureError> {
        if let Some(p) = period {
            if p > 60 {
                return Err(self.invalid(Op::BreakLease, "break period must be 0 to 60 seconds"));
            }
        }
        let mut extra: Vec<(&str, String)> = period
            .map(|p| vec![("x-ms-lease-break-period", p.to_string())])
            .unwrap_or_default();
        if let Some(etag) = etag {
            extra.push(("If-Match", etag.to_string()));
        }
        let resp = self
            .lease_action(Op::BreakLease, "break", extra, &[202])
            .await?;
        Ok(Broken {
            seconds_left: resp
                .header("x-ms-lease-time")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            earlier_attempt_unanswered: resp.after_unanswered,
        })
    }
}
