//! Cloning a volume: CreateVolume with another volume as its content source.
//! The new volume gets the source's bytes as they were at one point in time,
//! copied by the storage service: a snapshot of the source is taken for the
//! copy, the new blob is a Copy Blob of that snapshot (no byte of it passes
//! through the controller), and the snapshot is deleted after.
//!
//! The snapshot is marked with the new volume's id, so that a call retried
//! after one that stopped half-way finds it and copies from it (the same point
//! in time) instead of taking another, and a repeat that finds the volume made
//! deletes what such a call left. Marked snapshots are no VolumeSnapshots:
//! ListSnapshots does not list them. The new volume records which volume it
//! was cloned from (`CLONED_FROM_META`, besides the record of what made it that
//! a repeated CreateVolume answers from: `origin.rs`).

use std::future::Future;

use tonic::Status;

use super::snapshots::{SnapshotId, CLONE_FOR_META};
use super::volume::VolumeId;
use super::{flush, status_of, Driver};
use crate::azure::{BlobService, DeleteSnapshots};
use crate::drive::{Drive, DriveError};

/// On a cloned volume: the id of the volume it was cloned from.
pub const CLONED_FROM_META: &str = "blobdrive_csi_cloned_from";

fn meta<'a>(metadata: &'a [(String, String)], name: &str) -> Option<&'a str> {
    metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Makes volume `target` a copy of volume `source` at one point in time:
/// `copy` makes the target from a snapshot (the copy of a snapshot
/// CreateVolume makes, grown to the size asked) and answers its size.
pub async fn clone_volume<F, Fut>(
    driver: &Driver,
    source: &VolumeId,
    target: &VolumeId,
    copy: F,
) -> Result<u64, Status>
where
    F: FnOnce(SnapshotId) -> Fut,
    Fut: Future<Output = Result<u64, Status>>,
{
    let svc = &driver.service;
    let at = match left_for(svc, source, target).await?.into_iter().next() {
        Some(at) => at,
        None => take_snapshot(driver, source, target).await?,
    };
    let snapshot = SnapshotId {
        volume: source.clone(),
        at,
    };
    let size = match copy(snapshot).await {
        Ok(size) => size,
        Err(e) => {
            // No clone was made (too large for the limit asked, or the copy
            // failed): nothing of it is left behind.
            if let Err(left) = tidy(svc, source, target).await {
                tracing::warn!(
                    "a snapshot taken for cloning {} is left: {left}",
                    target.spec()
                );
            }
            return Err(e);
        }
    };
    let blob = svc.blob(&target.container, &target.blob);
    let props = blob.properties().await.map_err(status_of)?;
    let mut kept: Vec<(&str, &str)> = props
        .metadata
        .iter()
        .filter(|(k, _)| {
            !k.eq_ignore_ascii_case(CLONED_FROM_META) && !k.eq_ignore_ascii_case(CLONE_FOR_META)
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let from = source.spec();
    kept.push((CLONED_FROM_META, &from));
    blob.set_metadata_if_match(&kept, None, props.etag.as_deref())
        .await
        .map_err(status_of)?;
    tidy(svc, source, target).await?;
    tracing::info!(
        "cloned volume {} of {size} bytes from volume {}",
        target.spec(),
        source.spec()
    );
    Ok(size)
}

/// Takes the snapshot of `source` a clone to `target` copies from, once the
/// node holding the source flushed it (see `flush.rs`): the clone has every
/// write that node acknowledged. NOT_FOUND when there is no such volume.
async fn take_snapshot(
    driver: &Driver,
    source: &VolumeId,
    target: &VolumeId,
) -> Result<String, Status> {
    let blob = driver.service.blob(&source.container, &source.blob);
    let missing = || Status::not_found(format!("no volume {}", source.spec()));
    match Drive::open(&blob).await {
        Ok(drive) => flush::before_snapshot(driver, source, &drive.props).await,
        Err(DriveError::BlobMissing(_) | DriveError::ContainerMissing(_)) => return Err(missing()),
        Err(DriveError::Azure(e)) if e.is_not_found() => return Err(missing()),
        Err(DriveError::Azure(e)) => return Err(status_of(e)),
        Err(e) => return Err(Status::failed_precondition(e.to_string())),
    }
    let id = target.spec();
    blob.create_snapshot_with(&[(CLONE_FOR_META, &id)])
        .await
        .map_err(status_of)
}

/// The snapshots of `source` taken for a clone to `target`, oldest first.
async fn left_for(
    svc: &BlobService,
    source: &VolumeId,
    target: &VolumeId,
) -> Result<Vec<String>, Status> {
    let items = match svc
        .container(&source.container)
        .list_blobs(&source.blob, true)
        .await
    {
        Ok(items) => items,
        Err(e) if e.is_not_found() => vec![],
        Err(e) => return Err(status_of(e)),
    };
    let id = target.spec();
    let mut found: Vec<String> = items
        .into_iter()
        .filter(|i| i.name == source.blob && meta(&i.metadata, CLONE_FOR_META) == Some(&id))
        .filter_map(|i| i.snapshot)
        .collect();
    found.sort();
    Ok(found)
}

/// Deletes the snapshots of `source` taken for a clone to `target`.
pub async fn tidy(svc: &BlobService, source: &VolumeId, target: &VolumeId) -> Result<(), Status> {
    let blob = svc.blob(&source.container, &source.blob);
    for at in left_for(svc, source, target).await? {
        match blob
            .at_snapshot(Some(&at))
            .delete(DeleteSnapshots::None, None)
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(status_of(e)),
        }
    }
    Ok(())
}
