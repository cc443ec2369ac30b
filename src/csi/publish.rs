//! Which node a volume is published to for writing, and fencing a node that
//! lost it.
//!
//! The record is the blob's own metadata (`blobdrive_csi_node`), changed only
//! from the state it was read in (`If-Match` its ETag), so two controllers, or
//! a controller and a retry of its own, never both publish a volume. Fencing is
//! what no lease that lapses on a clock gives: the node's lease is broken and
//! the page blob's sequence number raised before unpublish returns, so every
//! later write of that node (its lease is gone; a write it sent long ago carries
//! an old sequence number) is refused by the service itself.

use std::time::Duration;

use tonic::Status;

use super::status_of;
use crate::azure::{BlobClient, BlobProperties};

/// The metadata name of the node a volume is published to for writing.
pub const PUBLISHED_META: &str = "blobdrive_csi_node";

/// How often a record or a break is tried again when the blob changed between
/// reading it and the conditional request (its node still writing).
const ROUNDS: usize = 3;

/// The node `props` say the volume is published to, if any.
pub fn published_to(props: &BlobProperties) -> Option<&str> {
    props
        .metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(PUBLISHED_META))
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// The blob's properties; NOT_FOUND when there is no such blob.
async fn properties(blob: &BlobClient) -> Result<Option<BlobProperties>, Status> {
    match blob.properties().await {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(status_of(e)),
    }
}

/// `props`' metadata with the publication set to `node` (or taken out).
fn with_node<'a>(props: &'a BlobProperties, node: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut kept: Vec<(&str, &str)> = props
        .metadata
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case(PUBLISHED_META))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Some(n) = node {
        kept.push((PUBLISHED_META, n));
    }
    kept
}

/// Sets the publication in the blob's metadata to `node` (or takes it out),
/// on the condition of the blob as `props` read it; false when it changed
/// since, and nothing was written.
async fn record(
    blob: &BlobClient,
    props: &BlobProperties,
    node: Option<&str>,
) -> Result<bool, Status> {
    let metadata = with_node(props, node);
    match blob
        .set_metadata_if_match(&metadata, None, props.etag.as_deref())
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if e.is_changed_since_read() => Ok(false),
        Err(e) => Err(status_of(e)),
    }
}

/// Publishes the volume to `node` for writing: OK if it already is;
/// FAILED_PRECONDITION while it is published to another node, or held by a
/// mount outside Kubernetes.
pub async fn publish(blob: &BlobClient, node: &str) -> Result<(), Status> {
    for _ in 0..ROUNDS {
        let props = properties(blob)
            .await?
            .ok_or_else(|| Status::not_found(format!("no volume {}", blob.target())))?;
        match published_to(&props) {
            Some(n) if n == node => return Ok(()),
            Some(other) => {
                return Err(Status::failed_precondition(format!(
                    "volume {} is published to node {other}: unpublish it there first",
                    blob.target()
                )))
            }
            None => {}
        }
        if props.lease_state.as_deref() == Some("leased") {
            return Err(Status::failed_precondition(format!(
                "volume {} is in use outside Kubernetes (its lease is held)",
                blob.target()
            )));
        }
        if record(blob, &props, Some(node)).await? {
            return Ok(());
        }
    }
    Err(Status::aborted(format!(
        "volume {} kept changing while it was being published; try again",
        blob.target()
    )))
}

/// Unpublishes the volume from `node` (from any node when `None`): OK when it
/// is not published there. A node that still holds the lease (it never
/// unstaged: dead, or cut off) is fenced first.
pub async fn unpublish(blob: &BlobClient, node: Option<&str>) -> Result<(), Status> {
    for _ in 0..ROUNDS {
        let Some(props) = properties(blob).await? else {
            return Ok(());
        };
        match (published_to(&props), node) {
            (None, _) => return Ok(()),
            (Some(n), Some(asked)) if n != asked => return Ok(()),
            _ => {}
        }
        if props.lease_state.as_deref() == Some("leased") {
            fence(blob, &props).await?;
            continue;
        }
        if record(blob, &props, None).await? {
            return Ok(());
        }
    }
    Err(Status::aborted(format!(
        "volume {} kept changing while it was being unpublished; try again",
        blob.target()
    )))
}

/// Breaks the lease of the node that holds the volume and raises the page
/// blob's sequence number, so that nothing that node sends lands any more.
///
/// The break is sent on the condition of the ETag as read (a copy of it that
/// lands late then breaks no lease taken since), a second apart while the
/// node's writes keep moving the ETag; a node that writes through all of
/// those rounds is cut off unconditionally: a live writer that lost its node's
/// publication must be stopped, and the worst a late copy of that break can do
/// is fence the next node's mount (its I/O fails; nothing acknowledged is
/// lost). The sequence number is raised in every case: that moves the ETag
/// on, so late copies of the conditional breaks are refused.
async fn fence(blob: &BlobClient, props: &BlobProperties) -> Result<(), Status> {
    let mut etag = props.etag.clone();
    let mut broken = false;
    for round in 0..ROUNDS {
        match blob.break_lease_if_match(Some(0), etag.as_deref()).await {
            Ok(_) => {
                broken = true;
                break;
            }
            Err(e) if e.is_changed_since_read() => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if round + 1 < ROUNDS {
                    etag = properties(blob).await?.and_then(|p| p.etag);
                }
            }
            Err(e) if e.code() == Some("LeaseNotPresentWithLeaseOperation") => {
                broken = true;
                break;
            }
            Err(e) => return Err(status_of(e)),
        }
    }
    if !broken {
        tracing::warn!(
            "{}: its node kept writing through {ROUNDS} conditional breaks; breaking its lease unconditionally",
            blob.target()
        );
        match blob.break_lease(Some(0)).await {
            Ok(_) => {}
            Err(e) if e.code() == Some("LeaseNotPresentWithLeaseOperation") => {}
            Err(e) => return Err(status_of(e)),
        }
    }
    blob.increment_sequence_number(None)
        .await
        .map_err(status_of)?;
    tracing::info!(
        "{}: fenced the node it was published to (lease broken, sequence number raised)",
        blob.target()
    );
    Ok(())
}
