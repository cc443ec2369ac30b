//! Snapshots of a blob: [`BlobClient::create_snapshot`]. Reading a snapshot is
//! [`BlobClient::at_snapshot`] and the ordinary reads.
//!
//! Taking a snapshot is not idempotent: an attempt whose answer was lost may have
//! made one, and simply sending it again would make a second. So each snapshot
//! carries a token in its metadata, and after an unanswered attempt the newest
//! snapshots are looked at for it before anything is sent again.

use std::time::Instant;

use reqwest::Method;

use super::blob::BlobClient;
use crate::azure::error::{AzureError, Op};
use crate::azure::stats::ClientStats;

/// Metadata name of the token that tells a snapshot this client took.
pub const SNAPSHOT_TOKEN_META: &str = "blobdrivesnapshot";
/// How many of the newest snapshots are searched for a lost answer's token.
const SEARCHED: usize = 10;

impl BlobClient {
    /// Takes a snapshot; returns its id (a timestamp). The snapshot keeps the
    /// blob's metadata, plus a token of its own.
    pub async fn create_snapshot(&self) -> Result<String, AzureError> {
        self.create_snapshot_with(&[]).await
    }

    /// [`Self::create_snapshot`] with `extra` metadata on the snapshot (beside
    /// the blob's own): what it is taken as, such as a CSI snapshot's name.
    pub async fn create_snapshot_with(&self, extra: &[(&str, &str)]) -> Result<String, AzureError> {
        if self.snapshot.is_some() {
            return Err(self.invalid(Op::Snapshot, "cannot snapshot a snapshot"));
        }
        // Metadata sent with Snapshot Blob replaces the base's on the snapshot, so
        // the base's is sent along.
        let base = self.properties().await?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let policy = self.svc.policy().clone();
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self.request(Op::Snapshot, Method::PUT, &[("comp", "snapshot")], &[201]);
            // A name given in `extra` replaces the base's (one header each).
            for (k, v) in base.metadata.iter().filter(|(k, _)| {
                k != SNAPSHOT_TOKEN_META && !extra.iter().any(|(e, _)| e.eq_ignore_ascii_case(k))
            }) {
                req.header(&format!("x-ms-meta-{k}"), v.clone());
            }
            for (k, v) in extra {
                req.header(&format!("x-ms-meta-{k}"), v.to_string());
            }
            req.header(&format!("x-ms-meta-{SNAPSHOT_TOKEN_META}"), token.clone());
            req.max_attempts = Some(1);
            self.count(|s| ClientStats::add(&s.other_requests, 1));
            match self.svc.execute(req).await {
                Ok(resp) => {
                    // Printed, and sent back in URLs: a timestamp or nothing.
                    return resp
                        .header("x-ms-snapshot")
                        .filter(|id| crate::azure::xml::is_snapshot_id(id))
                        .ok_or_else(|| AzureError::Protocol {
                            op: Op::Snapshot,
                            target: self.target(),
                            detail: "no snapshot id (a timestamp) in x-ms-snapshot".into(),
                        });
                }
                Err(e) if e.outcome_unknown() => {
                    if let Some(id) = self.snapshot_with_token(&token).await? {
                        return Ok(id);
                    }
                    let delay = policy.backoff(attempt);
                    if attempt >= policy.max_attempts || started.elapsed() + delay >= policy.budget
                    {
                        return Err(e);
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The snapshot, among the newest, whose metadata carries `token`.
    async fn snapshot_with_token(&self, token: &str) -> Result<Option<String>, AzureError> {
        let items = self.container().list_blobs(&self.name, true).await?;
        let mut ids: Vec<String> = items
            .into_iter()
            .filter(|i| i.name == self.name)
            .filter_map(|i| i.snapshot)
            .collect();
        // Snapshot ids are fixed-width timestamps: newest last when sorted.
        ids.sort();
        for id in ids.into_iter().rev().take(SEARCHED) {
            let p = self.at_snapshot(Some(&id)).properties().await?;
            if p.metadata
                .iter()
                .any(|(k, v)| k == SNAPSHOT_TOKEN_META && v == token)
            {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }
}
