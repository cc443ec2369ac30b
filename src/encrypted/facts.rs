//! What an encrypted drive's header says, read without its passphrase: for
//! `blobdrive info`. The header is read as hostile input, as a mount reads it
//! (each copy bounded by the sizes LUKS2 allows, its checksum and layout
//! checked); a header that cannot be read is said to be so, with why.

use serde::Serialize;

use super::BlobDisk;
use crate::azure::text::escape_controls;
use crate::azure::{AzureError, BlobClient};
use crate::luks::header::{self, Header};
use crate::luks::metadata::CIPHER;
use crate::luks::LuksError;

/// An encrypted drive, as `info --json` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Facts {
    /// "luks2", as `create --json` and the CSI parameter `encryption` say.
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(flatten)]
    pub header: Option<HeaderFacts>,
    /// Why the header could not be read (then `header`'s fields are absent).
    pub problem: Option<String>,
}

/// What a readable header says.
#[derive(Debug, Clone, Serialize)]
pub struct HeaderFacts {
    pub cipher: &'static str,
    pub key_bits: usize,
    pub sector_size: u32,
    /// Where the data segment starts on the disk, in bytes.
    pub data_offset: u64,
    pub keyslots: Vec<KeyslotFacts>,
    pub uuid: String,
    /// The header copy read: "first", or "second" when the first is damaged
    /// or older.
    pub header_copy: &'static str,
    /// What is wrong with the other copy, if anything.
    pub other_copy: Option<String>,
}

/// A keyslot in use: its number and how its key is derived from its
/// passphrase.
#[derive(Debug, Clone, Serialize)]
pub struct KeyslotFacts {
    pub id: u32,
    pub kdf: &'static str,
}

/// The facts of the drive on `blob` (whose disk is `disk_size` bytes), `None`
/// when it is not encrypted (no LUKS header copy where one may be).
pub async fn facts(blob: &BlobClient, disk_size: u64) -> Result<Option<Facts>, AzureError> {
    if !super::is_luks(blob, disk_size).await? {
        return Ok(None);
    }
    let read = header::read(&BlobDisk::new(blob, None)).await;
    let (header, problem) = match read.and_then(|h| header_facts(&h)) {
        Ok(f) => (Some(f), None),
        Err(e) => (None, Some(escape_controls(&e.to_string()))),
    };
    Ok(Some(Facts {
        kind: "luks2",
        header,
        problem,
    }))
}

fn header_facts(h: &Header) -> Result<HeaderFacts, LuksError> {
    let segment = h.metadata.segment()?;
    let keyslots = h.metadata.keyslots()?;
    Ok(HeaderFacts {
        cipher: CIPHER,
        key_bits: keyslots.first().map_or(0, |k| k.key_size * 8),
        sector_size: segment.sector_size,
        data_offset: segment.offset,
        keyslots: keyslots
            .iter()
            .map(|k| KeyslotFacts {
                id: k.id,
                kdf: k.kdf.type_name(),
            })
            .collect(),
        uuid: escape_controls(&h.binary.uuid),
        header_copy: h.used.name(),
        other_copy: h.other_bad.as_deref().map(escape_controls),
    })
}
