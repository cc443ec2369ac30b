//! Snapshots of a drive: listing them oldest first (Azurite lists newest first,
//! Azure oldest first, so order is never taken from the service), choosing what a
//! prune deletes, and restoring one onto its base blob.

use serde::Serialize;

use crate::azure::{ranges, AzureError, BlobClient, SegmentPlan};
use crate::drive::{Drive, DriveError};
use crate::vhd::FOOTER_SIZE;

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub snapshot: String,
    /// The same id: snapshot ids are their creation times.
    pub time: String,
    pub allocated_bytes: Option<u64>,
}

/// Snapshots of `blob`, oldest first. Snapshot ids are fixed-width UTC times, so
/// sorting them as text sorts them in time.
pub async fn list(
    blob: &BlobClient,
    with_allocation: bool,
) -> Result<Vec<SnapshotInfo>, AzureError> {
    let items = blob.container().list_blobs(blob.name(), true).await?;
    let mut ids: Vec<String> = items
        .into_iter()
        .filter(|b| b.name == blob.name())
        .filter_map(|b| b.snapshot)
        .collect();
    ids.sort();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let allocated_bytes = if with_allocation {
            let at = blob.at_snapshot(Some(&id));
            let len = at.properties().await?.content_length;
            Some(ranges::total(
                &at.page_ranges_segmented(len, SegmentPlan::default())
                    .await?,
            ))
        } else {
            None
        };
        out.push(SnapshotInfo {
            time: id.clone(),
            snapshot: id,
            allocated_bytes,
        });
    }
    Ok(out)
}

/// Which snapshots `prune --keep N` deletes: all but the newest `keep`.
pub fn to_prune(oldest_first: &[String], keep: usize) -> Vec<String> {
    let n = oldest_first.len().saturating_sub(keep);
    oldest_first[..n].to_vec()
}

/// Puts a snapshot's content back onto its base blob. Refused while the base is
/// leased (mounted): the mount would keep serving old data from its cache.
pub async fn restore(base: &BlobClient, snapshot: &str) -> Result<Restored, DriveError> {
    let props = crate::drive::properties(base).await?;
    crate::drive::check_page_blob(base, &props)?;
    if props.lease_state.as_deref() == Some("leased") {
        return Err(DriveError::Azure(AzureError::Invalid {
            op: crate::azure::Op::Copy,
            target: base.target(),
            reason: "the drive is in use (leased, mounted?): unmount it first".into(),
        }));
    }
    let snap = base.at_snapshot(Some(snapshot));
    let drive = Drive::open(&snap).await?;
    // On the condition of the drive as checked: an attempt given up on that lands
    // after the restore, once the drive has been written again, must not copy the
    // snapshot back over those writes.
    match base.copy_from(&snap, None, props.etag.as_deref()).await {
        // Changed since: by an earlier attempt of this copy that got no answer
        // (the blob then names a new copy, from this snapshot), or by another
        // party, and then nothing was restored.
        Err(e) if e.is_changed_since_read() => {
            let now = base.properties().await?;
            if now.copy_id == props.copy_id || !base.last_copy_was_from(&now, &snap) {
                return Err(DriveError::ChangedUnderfoot {
                    target: base.target(),
                    during: "restored",
                });
            }
        }
        copied => copied?,
    }
    // Verify: the base now has the snapshot's size, footer and page list.
    let after = Drive::open(base).await?;
    let want = snap
        .page_ranges_segmented(drive.props.content_length, SegmentPlan::default())
        .await?;
    let got = base
        .page_ranges_segmented(after.props.content_length, SegmentPlan::default())
        .await?;
    if after.disk_size() != drive.disk_size() || ranges::total(&want) != ranges::total(&got) {
        return Err(DriveError::Azure(AzureError::Protocol {
            op: crate::azure::Op::Copy,
            target: base.target(),
            detail: "after the restore the blob does not match the snapshot".into(),
        }));
    }
    Ok(Restored {
        was: props.content_length.saturating_sub(FOOTER_SIZE),
        now: after.disk_size(),
    })
}

/// A drive's disk size before and after a restore: a snapshot taken before the
/// drive grew brings it back to its old size, which the user must hear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub was: u64,
    pub now: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_newest() {
        let ids: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        assert_eq!(to_prune(&ids, 2), vec!["a", "b"]);
        assert!(to_prune(&ids, 4).is_empty());
        assert!(to_prune(&ids, 10).is_empty());
        assert_eq!(to_prune(&ids, 0).len(), 4);
    }
}
