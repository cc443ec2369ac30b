//! CreateVolume finishing the blob a call for the same volume left without
//! its footer: the external-provisioner retries CreateVolume for ever, so a
//! provisioner killed while it wrote an encrypted volume's header would leave
//! the PVC pending until an operator deleted the blob by hand (the CLI says
//! to; only CSI, whose calls are retried with the same name and parameters,
//! finishes such a blob).
//!
//! The blob is finished in place, under a short lease taken on the ETag it
//! was judged unfinished by, so nothing changed in between; its sequence
//! number is raised first, so every write of the call that made it (whose
//! writes all carry the new blob's number, see `WriteFence::pinned`), sent
//! or arriving late, is refused, during the lease and after it.

use bytes::Bytes;

use crate::azure::{BlobClient, BlobProperties, WriteFence};
use crate::drive::{self, Drive, DriveError};
use crate::vhd::FOOTER_SIZE;

/// How long the lease held while the blob is finished lasts: a few requests
/// of at most 4 MiB each.
const LEASE_SECS: u32 = 60;

/// Makes the unfinished blob `blob` (as `props`, its properties, say) a
/// drive of `size` bytes whose disk holds `first` and nothing else, with
/// `metadata` (replacing the create token): what `drive::create_with` would
/// have made. `LeaseAlreadyPresent` (another call is finishing it) and
/// [`DriveError::ChangedUnderfoot`] (it changed since `props`) say another
/// call is at work.
pub(super) async fn finish(
    blob: &BlobClient,
    props: &BlobProperties,
    size: u64,
    first: &[(u64, Bytes)],
    metadata: &[(&str, &str)],
) -> Result<(), DriveError> {
    let lease = drive::short_lease(blob, LEASE_SECS, props.etag.as_deref(), "finished").await?;
    let finished = finish_leased(blob, &lease, size, first, metadata).await;
    if let Err(e) = blob.release_lease(&lease).await {
        // It ends by itself within the minute.
        tracing::warn!("could not release the lease on {}: {e}", blob.target());
    }
    finished?;
    tracing::info!(
        "finished volume {} of {size} bytes, which a call stopped before its footer had left",
        blob.target()
    );
    Ok(())
}

/// [`finish`], under `lease`.
async fn finish_leased(
    blob: &BlobClient,
    lease: &str,
    size: u64,
    first: &[(u64, Bytes)],
    metadata: &[(&str, &str)],
) -> Result<(), DriveError> {
    // Checked again under the lease: still no footer.
    let props = drive::properties(blob).await?;
    match Drive::from_properties(blob, props.clone()).await {
        Err(DriveError::Unfinished { .. }) => {}
        Err(DriveError::Azure(e)) => return Err(e.into()),
        _ => {
            return Err(DriveError::ChangedUnderfoot {
                target: blob.target(),
                during: "finished",
            })
        }
    }
    let fence = WriteFence::new(blob.clone(), Some(lease.to_string()));
    // Raised before anything is written: the first call's writes are refused
    // from now on, whenever they come.
    fence.number().await?;
    if props.content_length != size + FOOTER_SIZE {
        blob.resize(size + FOOTER_SIZE, Some(lease), None).await?;
    }
    // The first call's pages go: the disk holds this call's alone.
    for r in blob.page_ranges(None).await? {
        blob.clear_pages_fenced(r.start, r.len(), Some(lease), &fence)
            .await?;
    }
    let footer = drive::footer_page(blob, size)?;
    for (at, data) in first.iter().chain([&footer]) {
        blob.put_pages_fenced(*at, data.clone(), Some(lease), &fence)
            .await?;
    }
    blob.set_metadata(metadata, Some(lease)).await?;
    Ok(())
}
