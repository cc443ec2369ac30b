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
    /// half-created blob was deleted again (or `cleanup` says why not).
    #[error("{source}{}", match cleanup {
        None => " (the half-created blob was deleted again)".to_string(),
        Some(c) => format!("; deleting the half-created blob also failed: {c}"),
    })]
    FooterFailed {
        source: Box<AzureError>,
        cleanup: Option<Box<AzureError>>,
    },
}

/// Creates a new drive of `size` bytes (whole MiB): a page blob of `size` + 512
/// bytes with only the VHD footer written into its last 512 bytes. Never
/// replaces an existing blob (409 `BlobAlreadyExists`).
pub async fn create(blob: &BlobClient, size: u64) -> Result<(), DriveError> {
    create_with(blob, size, &[]).await
}

/// [`create`], with `first` (pages of the disk: offset and bytes, each at most
/// 4 MiB) written before the footer: an encrypted drive's LUKS2 header. The
/// footer is what makes the blob a drive, so a create stopped before it
/// leaves a blob that no command takes for a drive ([`DriveError::Unfinished`]),
/// never a drive without what `first` holds.
pub async fn create_with(
    blob: &BlobClient,
    size: u64,
    first: &[(u64, bytes::Bytes)],
) -> Result<(), DriveError> {
    let footer = Footer::new_fixed(size).map_err(|source| DriveError::Vhd {
        target: blob.target(),
        source,
    })?;
    match blob.create_page_blob(size + FOOTER_SIZE).await {
        Err(e) if e.code() == Some("BlobAlreadyExists") => {
            // A create stopped half-way is said as such, not as any blob.
            return Err(match Drive::open(blob).await {
                Err(unfinished @ DriveError::Unfinished { .. }) => unfinished,
                _ => e.into(),
            });
        }
        got => got?,
    }
    // The blob exists now but is no drive until its footer is written: if a
    // write fails, remove it again rather than leave a footerless blob behind.
    // Fenced like a mount's writes (see `WriteFence`): a copy given up on that
    // lands after the drive was grown would put a footer where the disk
    // has data by then.
    let fence = crate::azure::WriteFence::new(blob.clone(), None);
    let footer = (size, bytes::Bytes::copy_from_slice(&footer.to_bytes()));
    for (at, data) in first.iter().chain([&footer]) {
        if let Err(source) = blob.put_pages_fenced(*at, data.clone(), None, &fence).await {
            let cleanup = blob
                .delete(crate::azure::DeleteSnapshots::None, None)
                .await
                .err()
                .map(Box::new);
            return Err(DriveError::FooterFailed {
                source: Box::new(source),
                cleanup,
            });
        }
    }
    // The create token has done its job; a finished drive carries no metadata.
    if let Err(e) = blob.set_metadata(&[], None).await {
        tracing::warn!(
            "could not remove the create token from {}: {e}",
            blob.target()
        );
    }
    Ok(())
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
