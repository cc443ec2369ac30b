//! A page blob that is a valid drive: the checks every command makes before it
//! trusts a blob, in one place.
//!
//! Opening reads only the properties and the last 512 bytes, and writes nothing, so
//! a refused blob is left exactly as it was.

use thiserror::Error;

use crate::azure::{AzureError, BlobClient, BlobProperties};
use crate::vhd::{Footer, VhdError, FOOTER_SIZE};

/// Why a blob is not a usable drive.
#[derive(Debug, Error)]
pub enum DriveError {
    #[error(transparent)]
    Azure(#[from] AzureError),
    #[error("container '{0}' does not exist")]
    ContainerMissing(String),
    #[error("blob '{0}' does not exist")]
    BlobMissing(String),
    #[error("'{target}' is {} {kind}, not a page blob: blobdrive drives are page blobs holding a fixed VHD (upload images with `blobdrive upload`)", crate::words::article(kind))]
    NotPageBlob { target: String, kind: String },
    #[error("'{target}' is {len} bytes long: too small for a VHD (at least 1 MiB of disk plus the 512-byte footer)")]
    TooSmall { target: String, len: u64 },
    #[error("'{target}' is {len} bytes long, not a multiple of 512: not a page blob drive")]
    Unaligned { target: String, len: u64 },
    #[error("'{target}': resize incomplete (from {from} to {to} bytes): run `blobdrive resize {target} --size {to}` again to complete it")]
    ResizeIncomplete { target: String, from: u64, to: u64 },
    #[error("'{target}' is {} ({from} bytes); shrinking it to {} ({to} bytes) would cut off data: blobdrive only grows drives", crate::size::human(*from), crate::size::human(*to))]
    Shrink { target: String, from: u64, to: u64 },
    #[error("'{target}' changed while it was being {during} (another party wrote it): nothing was changed; run it again")]
    ChangedUnderfoot {
        target: String,
        during: &'static str,
    },
    #[error("'{target}' is not a drive: its creation stopped before the VHD footer was written; delete it (`blobdrive delete {target} --yes`) and create it again")]
    Unfinished { target: String },
    #[error("'{target}': {source}")]
    Vhd {
        target: String,
        #[source]
        source: VhdError,
    },
    /// The first pages or the footer of a new drive could not be written; the
    /// half-created blob was deleted again, or `cleanup` says why not.
    #[error("{source}{cleanup}")]
    FooterFailed {
        source: Box<AzureError>,
        cleanup: Cleanup,
    },
}

/// What became of the blob a create could not finish.
#[derive(Debug)]
pub enum Cleanup {
    /// Deleted again.
    Deleted,
    /// Left: another party took it over (leased it, raised its sequence
    /// number, wrote its footer, or made it anew), so it is not this create's
    /// to delete.
    TakenOver,
    /// Deleting it failed.
    Failed(Box<AzureError>),
}

impl std::fmt::Display for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cleanup::Deleted => write!(f, " (the half-created blob was deleted again)"),
            Cleanup::TakenOver => write!(
                f,
                " (the half-created blob was left alone: another call took it over)"
            ),
            Cleanup::Failed(c) => write!(f, "; deleting the half-created blob also failed: {c}"),
        }
    }
}

/// Creates a new drive of `size` bytes (whole MiB): a page blob of `size` + 512
/// bytes with only the VHD footer written into its last 512 bytes. Never
/// replaces an existing blob (409 `BlobAlreadyExists`).
pub async fn create(blob: &BlobClient, size: u64) -> Result<(), DriveError> {
    create_with(blob, size, &[], &[]).await
}

/// [`create`], with `first` (pages of the disk: offset and bytes, each at most
/// 4 MiB) written before the footer: an encrypted drive's LUKS2 header; and
/// `metadata` on the blob from its creation on (beside the create token,
/// which is removed once the footer is written). The footer is what makes
/// the blob a drive, so a create stopped before it leaves a blob that no
/// command takes for a drive ([`DriveError::Unfinished`]), never a drive
/// without what `first` holds.
pub async fn create_with(
    blob: &BlobClient,
    size: u64,
    first: &[(u64, bytes::Bytes)],
    metadata: &[(&str, &str)],
) -> Result<(), DriveError> {
    let footer = footer_page(blob, size)?;
    let token = match blob
        .create_page_blob_with(size + FOOTER_SIZE, metadata)
        .await
    {
        Err(e) if e.code() == Some("BlobAlreadyExists") => {
            // A create stopped half-way is said as such, not as any blob.
            return Err(match Drive::open(blob).await {
                Err(unfinished @ DriveError::Unfinished { .. }) => unfinished,
                _ => e.into(),
            });
        }
        got => got?,
    };
    // The blob exists now but is no drive until its footer is written: if a
    // write fails, remove it again rather than leave a footerless blob behind.
    // Every write carries the new blob's sequence number, 0 (see
    // `WriteFence::pinned`): a copy given up on that lands after the drive
    // was grown or mounted (each raises the number) is refused, and so is
    // every write, however late, once a CSI call finishing the blob (a
    // killed call's, as it looks from there) raised it.
    let fence = crate::azure::WriteFence::pinned(blob.clone(), 0);
    for (at, data) in first.iter().chain([&footer]) {
        if let Err(source) = blob.put_pages_fenced(*at, data.clone(), None, &fence).await {
            return Err(DriveError::FooterFailed {
                source: Box::new(source),
                cleanup: delete_unfinished(blob, &token).await,
            });
        }
    }
    // The create token has done its job; a finished drive carries no token.
    if let Err(e) = blob.set_metadata(metadata, None).await {
        tracing::warn!(
            "could not remove the create token from {}: {e}",
            blob.target()
        );
    }
    Ok(())
}

/// The footer of a new fixed VHD of `size` bytes, where it goes: the page
/// after the disk.
pub fn footer_page(blob: &BlobClient, size: u64) -> Result<(u64, bytes::Bytes), DriveError> {
    let footer = Footer::new_fixed(size).map_err(|source| DriveError::Vhd {
        target: blob.target(),
        source,
    })?;
    Ok((size, bytes::Bytes::copy_from_slice(&footer.to_bytes())))
}

/// Deletes the blob a create made with `token` and could not finish, only
/// while it is still that create's alone: its token, no lease, sequence
/// number 0 (nobody raised it) and no footer, the delete conditioned on the
/// ETag all that was read with, so nobody's write can come in between.
async fn delete_unfinished(blob: &BlobClient, token: &str) -> Cleanup {
    let props = match blob.properties().await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return Cleanup::Deleted,
        Err(e) => return Cleanup::Failed(Box::new(e)),
    };
    let meta = crate::azure::ops::blob::CREATE_TOKEN_META;
    let ours = props
        .metadata
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case(meta) && v == token);
    let leased = matches!(props.lease_state.as_deref(), Some("leased" | "breaking"));
    if !ours || leased || props.sequence_number != Some(0) {
        return Cleanup::TakenOver;
    }
    let etag = props.etag.clone();
    match Drive::from_properties(blob, props).await {
        Err(DriveError::Unfinished { .. }) => {}
        Err(DriveError::Azure(e)) => return Cleanup::Failed(Box::new(e)),
        _ => return Cleanup::TakenOver,
    }
    let delete = blob.delete_if_match(crate::azure::DeleteSnapshots::None, None, etag.as_deref());
    match delete.await {
        Ok(()) => Cleanup::Deleted,
        Err(e) if e.is_not_found() => Cleanup::Deleted,
        // Changed, leased meanwhile, or deleted by an attempt whose answer was
        // lost (Azurite answers its retry 412): looked at to tell which.
        Err(e) if e.status() == Some(412) => match blob.properties().await {
            Err(e) if e.is_not_found() => Cleanup::Deleted,
            _ => Cleanup::TakenOver,
        },
        Err(e) => Cleanup::Failed(Box::new(e)),
    }
}

/// A blob checked to be a fixed-VHD drive.
#[derive(Debug, Clone)]
pub struct Drive {
    pub props: BlobProperties,
    pub footer: Footer,
}

/// The metadata that marks a resize under way (`crate::resize`): `FROM:TO`,
/// the disk's sizes. A drive that carries it is not whole, and opening refuses
/// it.
pub const RESIZE_MARKER: &str = "blobdrive_resize";

/// The resize under way on a blob, from its metadata: (FROM, TO).
pub fn resize_pending(props: &BlobProperties) -> Option<(u64, u64)> {
    let (_, v) = props
        .metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(RESIZE_MARKER))?;
    let (from, to) = v.split_once(':')?;
    Some((from.parse().ok()?, to.parse().ok()?))
}

impl Drive {
    /// The disk's size in bytes (the footer's current size).
    pub fn disk_size(&self) -> u64 {
        self.footer.current_size
    }

    /// Reads properties and footer of `blob` and checks it is a fixed-VHD page blob.
    pub async fn open(blob: &BlobClient) -> Result<Drive, DriveError> {
        Drive::from_properties(blob, properties(blob).await?).await
    }

    /// [`Drive::open`] for properties the caller has already read: reads only the
    /// footer.
    pub async fn from_properties(
        blob: &BlobClient,
        props: BlobProperties,
    ) -> Result<Drive, DriveError> {
        check_page_blob(blob, &props)?;
        if let Some((from, to)) = resize_pending(&props) {
            return Err(DriveError::ResizeIncomplete {
                target: blob.target(),
                from,
                to,
            });
        }
        let len = props.content_length;
        if !len.is_multiple_of(512) {
            return Err(DriveError::Unaligned {
                target: blob.target(),
                len,
            });
        }
        if len < FOOTER_SIZE + 1024 * 1024 {
            return Err(DriveError::TooSmall {
                target: blob.target(),
                len,
            });
        }
        let tail = blob.read(len - FOOTER_SIZE, FOOTER_SIZE).await?;
        let footer = Footer::parse_fixed_for_blob(&tail, len).map_err(|source| {
            let target = blob.target();
            match unfinished(&props, &tail) {
                true => DriveError::Unfinished { target },
                false => DriveError::Vhd { target, source },
            }
        })?;
        Ok(Drive { props, footer })
    }
}

/// Takes a short lease of `secs` seconds on `blob` for a command that changes
/// it (a resize, a key change), on the condition of `etag`, the blob as the
/// command read it: so what the command decided is the blob's under the lease,
/// and a copy of this acquire given up on that lands after the command ended
/// (and changed the blob) is refused instead of leasing the drive to nobody.
/// `during` names the command in [`DriveError::ChangedUnderfoot`]. A lease
/// held by someone else is `LeaseAlreadyPresent`, as the service says it.
pub async fn short_lease(
    blob: &BlobClient,
    secs: u32,
    etag: Option<&str>,
    during: &'static str,
) -> Result<String, DriveError> {
    let id = uuid::Uuid::new_v4().to_string();
    match blob.acquire_lease_if_match(&id, Some(secs), etag).await {
        Err(e) if e.is_changed_since_read() => Err(DriveError::ChangedUnderfoot {
            target: blob.target(),
            during,
        }),
        got => Ok(got?.id),
    }
}

/// Whether a blob whose footer is not one is what a `create` stopped before
/// its footer leaves: the create's token in its metadata and no footer at all.
fn unfinished(props: &BlobProperties, tail: &[u8]) -> bool {
    let token = crate::azure::ops::blob::CREATE_TOKEN_META;
    props
        .metadata
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case(token))
        && tail.iter().all(|&b| b == 0)
}

/// Properties of `blob`, with a 404 turned into "which of container or blob is
/// missing" (a HEAD answer has no body to say it, and not every server sends the
/// error code header).
pub async fn properties(blob: &BlobClient) -> Result<BlobProperties, DriveError> {
    match blob.properties().await {
        Ok(p) => Ok(p),
        Err(e) if e.is_not_found() => {
            if e.code() == Some("ContainerNotFound") || !blob.container().exists().await? {
                Err(DriveError::ContainerMissing(
                    blob.container_name().to_string(),
                ))
            } else {
                Err(DriveError::BlobMissing(blob.target()))
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Refuses block and append blobs by name.
pub fn check_page_blob(blob: &BlobClient, props: &BlobProperties) -> Result<(), DriveError> {
    if props.blob_type != "PageBlob" {
        let kind = match props.blob_type.as_str() {
            "BlockBlob" => "block blob".to_string(),
            "AppendBlob" => "append blob".to_string(),
            other => format!("blob of type '{other}'"),
        };
        return Err(DriveError::NotPageBlob {
            target: blob.target(),
            kind,
        });
    }
    Ok(())
}
