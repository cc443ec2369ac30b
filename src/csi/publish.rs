//! Which nodes a volume is published to, in the volume's own record, and
//! fencing a node that lost it.
//!
//! The record is the blob's own metadata: the node it is published to for
//! writing (`blobdrive_csi_node`), and each node it is published to read-only
//! (`blobdrive_csi_reader_*`). It changes only from the state it was read in
//! (`If-Match` its ETag), so two controllers, or a controller and a retry of
//! its own, never both publish a volume. One writer at a time, and never a
//! reader beside a writer: a read-only mount of a filesystem that another node
//! is writing sees neither what it fsyncs (still in the journal, which a
//! read-only mount does not replay) nor what it writes later, and nothing
//! would tell its pod. Fencing is what no lease that lapses on a clock gives:
//! the node's lease is broken and the page blob's sequence number raised
//! before unpublish returns, so every later write of that node (its lease is
//! gone; a write it sent long ago carries an old sequence number) is refused
//! by the service itself.

use std::time::Duration;

use sha2::{Digest, Sha256};
use tonic::Status;

use super::status_of;
use crate::azure::{BlobClient, BlobProperties};

/// The metadata name of the node a volume is published to for writing.
pub const PUBLISHED_META: &str = "blobdrive_csi_node";

/// The start of the metadata name of a node the volume is published to
/// read-only (the rest a digest of the node's id; its value the id).
const READER_META: &str = "blobdrive_csi_reader_";

/// How often a record or a break is tried again when the blob changed between
/// reading it and the conditional request (its node still writing).
const ROUNDS: usize = 3;

/// The node `props` say the volume is published to for writing, if any.
pub fn published_to(props: &BlobProperties) -> Option<&str> {
    props
        .metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(PUBLISHED_META))
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// The nodes `props` say the volume is published to read-only.
pub fn readers(props: &BlobProperties) -> Vec<&str> {
    props
        .metadata
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with(READER_META))
        .map(|(_, v)| v.as_str())
        .collect()
}

fn reader_key(node: &str) -> String {
    let h = Sha256::digest(node.as_bytes());
    let hex: String = h[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{READER_META}{hex}")
}

fn leased(props: &BlobProperties) -> bool {
    props.lease_state.as_deref() == Some("leased")
}

/// The blob's properties; NOT_FOUND when there is no such blob.
async fn properties(blob: &BlobClient) -> Result<Option<BlobProperties>, Status> {
    match blob.properties().await {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(status_of(e)),
    }
}

/// `props`' metadata with the writer set to `writer` (or taken out) and the
/// readers set to `readers`.
fn with_holders<'a>(
    props: &'a BlobProperties,
    writer: Option<&'a str>,
    readers: &'a [(String, String)],
) -> Vec<(&'a str, &'a str)> {
    let mut kept: Vec<(&str, &str)> = props
        .metadata
        .iter()
        .filter(|(k, _)| {
            !k.eq_ignore_ascii_case(PUBLISHED_META)
                && !k.to_ascii_lowercase().starts_with(READER_META)
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Some(n) = writer {
        kept.push((PUBLISHED_META, n));
    }
    kept.extend(readers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    kept
}

/// The readers' metadata entries of `props`, but `without`'s.
fn readers_but(props: &BlobProperties, without: Option<&str>) -> Vec<(String, String)> {
    readers(props)
        .into_iter()
        .filter(|n| Some(*n) != without)
        .map(|n| (reader_key(n), n.to_string()))
        .collect()
}

/// Sets the publication in the blob's metadata to `writer` and `readers`, on
/// the condition of the blob as `props` read it; false when it changed since,
/// and nothing was written.
async fn record(
    blob: &BlobClient,
    props: &BlobProperties,
    writer: Option<&str>,
    readers: &[(String, String)],
) -> Result<bool, Status> {
    let metadata = with_holders(props, writer, readers);
    match blob
        .set_metadata_if_match(&metadata, None, props.etag.as_deref())
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if e.is_changed_since_read() => Ok(false),
        Err(e) => Err(status_of(e)),
    }
}

fn no_volume(blob: &BlobClient) -> Status {
    Status::not_found(format!("no volume {}", blob.target()))
}

fn kept_changing(blob: &BlobClient, doing: &str) -> Status {
    Status::aborted(format!(
        "volume {} kept changing while it was being {doing}; try again",
        blob.target()
    ))
}

/// Publishes the volume to `node` for writing; true when this recorded it,
/// false when it was already. FAILED_PRECONDITION while it is published to
/// another node (for writing or reading), or held by a mount outside
/// Kubernetes.
pub async fn publish(blob: &BlobClient, node: &str) -> Result<bool, Status> {
    for _ in 0..ROUNDS {
        let props = properties(blob).await?.ok_or_else(|| no_volume(blob))?;
        match published_to(&props) {
            Some(n) if n == node => return Ok(false),
            Some(other) => {
                return Err(Status::failed_precondition(format!(
                    "volume {} is published to node {other}: unpublish it there first",
                    blob.target()
                )))
            }
            None => {}
        }
        let others = readers(&props);
        if !others.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {} is published read-only to node {}: a writer beside it would leave its view stale (a read-only mount sees neither what the writer fsyncs nor what it writes later); unpublish it there first",
                blob.target(),
                others.join(", node ")
            )));
        }
        if leased(&props) {
            return Err(Status::failed_precondition(format!(
                "volume {} is in use outside Kubernetes (its lease is held)",
                blob.target()
            )));
        }
        if record(blob, &props, Some(node), &[]).await? {
            return Ok(true);
        }
    }
    Err(kept_changing(blob, "published"))
}

/// Publishes the volume to `node` for reading only; true when this recorded
/// it. FAILED_PRECONDITION while a writer holds it (published for writing, or
/// its lease held): refused rather than served stale.
pub async fn add_reader(blob: &BlobClient, node: &str) -> Result<bool, Status> {
    for _ in 0..ROUNDS {
        let props = properties(blob).await?.ok_or_else(|| no_volume(blob))?;
        if let Some(writer) = published_to(&props) {
            return Err(Status::failed_precondition(format!(
                "volume {} is published for writing to node {writer}: a read-only mount beside a live writer would not see what it writes (nor, for ext4, what it fsyncs), so it is refused; unpublish it from node {writer} first",
                blob.target()
            )));
        }
        if leased(&props) {
            return Err(Status::failed_precondition(format!(
                "volume {} is held by a writer (its lease is held): a read-only mount beside it would not see what it writes; take the writer down first",
                blob.target()
            )));
        }
        if readers(&props).contains(&node) {
            return Ok(false);
        }
        let mut all = readers_but(&props, None);
        all.push((reader_key(node), node.to_string()));
        if record(blob, &props, None, &all).await? {
            return Ok(true);
        }
    }
    Err(kept_changing(blob, "published"))
}

/// Unpublishes the volume from `node` (from every node when `None`): OK when
/// it is not published there. A writer that still holds the lease (it never
/// unstaged: dead, or cut off) is fenced first. Returns the nodes it was
/// taken from.
pub async fn unpublish(blob: &BlobClient, node: Option<&str>) -> Result<Vec<String>, Status> {
    for _ in 0..ROUNDS {
        let Some(props) = properties(blob).await? else {
            return Ok(vec![]);
        };
        let writer = published_to(&props).filter(|w| node.is_none_or(|n| n == *w));
        let gone: Vec<String> = readers(&props)
            .into_iter()
            .filter(|r| node.is_none_or(|n| n == *r))
            .map(str::to_string)
            .collect();
        if writer.is_none() && gone.is_empty() {
            return Ok(vec![]);
        }
        if writer.is_some() && leased(&props) {
            fence(blob, &props).await?;
            continue;
        }
        let left: Vec<(String, String)> = match node {
            Some(n) => readers_but(&props, Some(n)),
            None => vec![],
        };
        let keep_writer = published_to(&props).filter(|_| writer.is_none());
        if record(blob, &props, keep_writer, &left).await? {
            return Ok(writer.map(str::to_string).into_iter().chain(gone).collect());
        }
    }
    Err(kept_changing(blob, "unpublished"))
}

/// Takes `node`'s publication back out after [`publish`] or [`add_reader`]
/// recorded it, when the node's own record refused it (no lease was taken
/// meanwhile: the node was never told it may stage the volume).
pub async fn withdraw(blob: &BlobClient, node: &str) -> Result<(), Status> {
    for _ in 0..ROUNDS {
        let Some(props) = properties(blob).await? else {
            return Ok(());
        };
        let writer = published_to(&props).filter(|w| *w != node);
        if record(blob, &props, writer, &readers_but(&props, Some(node))).await? {
            return Ok(());
        }
    }
    Err(kept_changing(blob, "unpublished"))
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
