//! Snapshots of a blob: [`BlobClient::create_snapshot`]. Reading a snapshot is
//! [`BlobClient::at_snapshot`] and the ordinary reads.

use reqwest::Method;

use super::blob::BlobClient;
use crate::azure::error::{AzureError, Op};
use crate::azure::stats::ClientStats;

impl BlobClient {
    /// Takes a snapshot; returns its id (a timestamp).
    pub async fn create_snapshot(&self) -> Result<String, AzureError> {
        if self.snapshot.is_some() {
            return Err(self.invalid(Op::Snapshot, "cannot snapshot a snapshot"));
        }
        self.count(|s| ClientStats::add(&s.other_requests, 1));
        let resp = self
            .svc
            .execute(self.request(Op::Snapshot, Method::PUT, &[("comp", "snapshot")], &[201]))
            .await?;
        resp.header("x-ms-snapshot")
            .ok_or_else(|| AzureError::Protocol {
                op: Op::Snapshot,
                target: self.target(),
                detail: "no x-ms-snapshot header".into(),
            })
    }
}
