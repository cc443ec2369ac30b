//! Encrypted drives: a LUKS2 volume at the start of the drive's disk, its
//! header read and written on the blob itself, and what a mount of one needs
//! (the data segment's cipher, where the segment starts, the plaintext disk's
//! size).
//!
//! The VHD footer stays as it is, plaintext at the blob's end: Azure needs it,
//! and it says only the disk's size. The disk (everything before the footer) is
//! the LUKS2 device, so `cryptsetup` reads a downloaded image as it is, and the
//! data segment fills it to its end ("dynamic"): a drive that grows has a
//! larger segment with nothing in the header changed.

use std::sync::Arc;

use bytes::Bytes;

use crate::azure::{AzureError, BlobClient, WriteFence};
use crate::device::MAX_RUN;
use crate::drive::DriveError;
use crate::luks::volume::{self, Unlocked};
use crate::luks::xts::XtsCipher;
use crate::luks::{HeaderDisk, LuksError};

mod facts;
pub use facts::{facts, Facts};

/// The blob's disk as a LUKS2 header's: reads and writes of its first
/// megabytes. Writes carry the lease when one is held and the write fence
/// (see [`WriteFence`]), as every write of a drive does.
pub struct BlobDisk<'a> {
    blob: &'a BlobClient,
    lease: Option<&'a str>,
    fence: Arc<WriteFence>,
}

impl<'a> BlobDisk<'a> {
    pub fn new(blob: &'a BlobClient, lease: Option<&'a str>) -> BlobDisk<'a> {
        BlobDisk {
            blob,
            lease,
            fence: WriteFence::new(blob.clone(), lease.map(str::to_string)),
        }
    }
}

fn io(e: AzureError) -> LuksError {
    LuksError::Io(e.to_string())
}

impl HeaderDisk for BlobDisk<'_> {
    async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, LuksError> {
        Ok(self
            .blob
            .read(offset, len as u64)
            .await
            .map_err(io)?
            .to_vec())
    }

    async fn write(&self, offset: u64, data: Vec<u8>) -> Result<(), LuksError> {
        let data = Bytes::from(data);
        let mut at = 0;
        while at < data.len() {
            let n = (data.len() - at).min(MAX_RUN as usize);
            self.blob
                .put_pages_fenced(
                    offset + at as u64,
                    data.slice(at..at + n),
                    self.lease,
                    &self.fence,
                )
                .await
                .map_err(io)?;
            at += n;
        }
        Ok(())
    }

    async fn clear(&self, offset: u64, len: u64) -> Result<(), LuksError> {
        self.blob
            .clear_pages_fenced(offset, len, self.lease, &self.fence)
            .await
            .map_err(io)
    }
}

/// Whether the drive's disk (of `disk_size` bytes) holds a LUKS header: the
/// first copy's magic at its start, or the second copy's at any place LUKS2
/// allows for it (16 KiB to 4 MiB: each allowed header size), so that a
/// drive whose first copy is damaged is still known to be encrypted when its
/// header is not cryptsetup's default size. The places are
/// [`crate::luks::header::places`], the ones the header's reader searches, so
/// a disk this calls encrypted is never "not LUKS" to the reader (a header
/// with no whole copy is [`LuksError::Damaged`] there). One 512-byte read for
/// each place, all at once. Only magic numbers are compared; the header itself
/// is read by whoever opens the drive.
pub async fn is_luks(blob: &BlobClient, disk_size: u64) -> Result<bool, AzureError> {
    let mut reads = tokio::task::JoinSet::new();
    for (at, magic) in crate::luks::header::places(disk_size) {
        let blob = blob.clone();
        reads.spawn(
            async move { Ok::<_, AzureError>(blob.read(at, 512).await?.starts_with(magic)) },
        );
    }
    let mut found = false;
    while let Some(read) = reads.join_next().await {
        found |= read.expect("a read of 512 bytes does not panic")?;
    }
    Ok(found)
}

/// What a mount of an encrypted drive serves: the data segment, decrypted.
pub struct Opened {
    pub cipher: XtsCipher,
    /// Where the data segment starts on the disk.
    pub data_offset: u64,
    pub sector_size: u32,
    /// What was found wrong with the header's other copy, to be said once.
    pub warning: Option<String>,
}

/// Opens the encrypted drive on `blob`, whose disk is `disk_size` bytes, with
/// `passphrase`; the volume key lives only in the cipher returned.
pub async fn open(
    blob: &BlobClient,
    passphrase: &[u8],
    disk_size: u64,
) -> Result<Opened, LuksError> {
    let u: Unlocked = volume::unlock(&BlobDisk::new(blob, None), passphrase).await?;
    opened(&u, disk_size)
}

/// Opens the encrypted drive on `blob` again with `passphrase`, keeping the
/// volume key of `earlier` while the header is as it was then (see
/// [`volume::reopen`]): a mount that reads its drive again before its lease is
/// taken derives no key again. The volume, and whether the key was kept.
pub async fn reopen(
    blob: &BlobClient,
    passphrase: &[u8],
    earlier: Option<Unlocked>,
) -> Result<(Unlocked, bool), LuksError> {
    volume::reopen(&BlobDisk::new(blob, None), passphrase, earlier).await
}

/// What a mount serves of the volume `u` on a disk of `disk_size` bytes; the
/// cipher holds a copy of the volume key.
pub fn opened(u: &Unlocked, disk_size: u64) -> Result<Opened, LuksError> {
    let min = u.segment.offset + u64::from(u.segment.sector_size);
    if disk_size < min {
        return Err(LuksError::Invalid(format!(
            "its data segment starts at {} bytes, and the disk is {disk_size}",
            u.segment.offset
        )));
    }
    Ok(Opened {
        cipher: u.cipher()?,
        data_offset: u.segment.offset,
        sector_size: u.segment.sector_size,
        warning: u.header.other_bad.as_ref().map(|why| {
            format!("the LUKS2 header's {} copy was used: {why} (`blobdrive key add` or any key change writes both again)", u.header.used.name())
        }),
    })
}

/// The least disk an encrypted drive has: the header's 16 MiB and 1 MiB of data.
pub const MIN_DISK: u64 = crate::luks::DEFAULT_DATA_OFFSET + (1 << 20);

/// A new LUKS2 header (both copies and keyslot 0 under `passphrase`), made in
/// memory: the pages of the disk it takes, for [`crate::drive::create_with`]
/// to write before the footer. The key derivation (seconds of Argon2id) runs
/// here, before the blob exists, and the drive is a drive only once all of its
/// header is on the blob: a create stopped at any point never leaves a drive
/// meant to be encrypted looking plain.
pub async fn new_header(
    passphrase: &[u8],
    sector_size: u32,
    kdf: volume::KdfChoice,
) -> Result<Vec<(u64, Bytes)>, LuksError> {
    let disk = crate::luks::MemDisk::new(crate::luks::DEFAULT_DATA_OFFSET as usize);
    volume::format(&disk, passphrase, sector_size, kdf).await?;
    let bytes = disk.bytes.into_inner().expect("not poisoned");
    Ok(written_pages(&bytes))
}

/// The runs of `disk`'s 512-byte pages that are not all zeros (a fresh blob
/// reads zeros elsewhere), each at most one Put Page long.
fn written_pages(disk: &[u8]) -> Vec<(u64, Bytes)> {
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    for (i, page) in disk.chunks(512).enumerate() {
        if page.iter().all(|&b| b == 0) {
            continue;
        }
        let at = i as u64 * 512;
        match runs.last_mut() {
            Some((start, run))
                if *start + run.len() as u64 == at && run.len() < MAX_RUN as usize =>
            {
                run.extend_from_slice(page)
            }
            _ => runs.push((at, page.to_vec())),
        }
    }
    runs.into_iter()
        .map(|(at, run)| (at, Bytes::from(run)))
        .collect()
}

/// Why a key command did not run.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Luks(#[from] LuksError),
    #[error(transparent)]
    Azure(#[from] AzureError),
    #[error(transparent)]
    Drive(#[from] DriveError),
    #[error("{0} is mounted writable (its lease is held): change its passphrases while it is not mounted")]
    Leased(String),
}

/// How long a key command's lease lasts: an unlock and a keyslot written take
/// a second or two.
const KEY_LEASE_SECS: u32 = 60;

/// Runs `op` on the drive's header under a short lease of its own, so that no
/// mount writes the drive meanwhile; the lease is released whatever `op` did.
/// The lease is taken on the condition of the drive as read, as a resize's
/// is ([`crate::drive::short_lease`]).
pub async fn under_lease<T, F>(blob: &BlobClient, op: F) -> Result<T, KeyError>
where
    F: AsyncFnOnce(&BlobDisk<'_>) -> Result<T, LuksError>,
{
    let read = crate::drive::Drive::open(blob).await?;
    let etag = read.props.etag.as_deref();
    let lease = match crate::drive::short_lease(blob, KEY_LEASE_SECS, etag, "rekeyed").await {
        Err(DriveError::Azure(e)) if e.code() == Some("LeaseAlreadyPresent") => {
            return Err(KeyError::Leased(blob.target()))
        }
        got => got?,
    };
    let done = op(&BlobDisk::new(blob, Some(&lease))).await;
    let released = blob.release_lease(&lease).await;
    let out = done?;
    released?;
    Ok(out)
}
