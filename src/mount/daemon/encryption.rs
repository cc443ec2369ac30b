//! An encrypted drive in the worker: opened with its passphrase right after the
//! drive is read and before its lease is taken (the lease is taken on the
//! condition that the blob is still as read, so the header used is the one
//! under the lease), or found to need one. A wrong passphrase, or one given for
//! a drive that is not encrypted, fails the mount before anything on the blob
//! changes.

use tracing::{info, warn};

use super::Mounted;
use crate::azure::PageRange;
use crate::drive::Drive;
use crate::encrypted;
use crate::luks::volume::Unlocked;
use crate::luks::xts::XtsCipher;
use crate::luks::LuksError;
use crate::mount::MountError;

/// An opened encrypted drive.
pub(super) struct Encryption {
    /// Where the data segment starts on the disk.
    pub data_offset: u64,
    /// The data segment's sector size: also the loop device's logical block
    /// size, as dm-crypt's device has it.
    pub sector_size: u32,
    /// The data segment's cipher, until the cache's stack takes it.
    cipher: Option<XtsCipher>,
    /// What was wrong with the header's other copy.
    pub warning: Option<String>,
}

impl Encryption {
    /// The plaintext disk served for a disk of `disk_size` bytes.
    pub fn served(&self, disk_size: u64) -> u64 {
        let sector = u64::from(self.sector_size);
        disk_size.saturating_sub(self.data_offset) / sector * sector
    }

    /// The cipher and the segment's offset, for the crypto layer.
    pub fn take_cipher(&mut self) -> Option<(XtsCipher, u64)> {
        self.cipher.take().map(|c| (c, self.data_offset))
    }
}

/// Opens `drive` with the mount's passphrase, or makes sure it needs none.
/// The volume `earlier` rounds opened is kept while its header is unchanged
/// (no key derivation again, see [`encrypted::reopen`]); the volume opened, to
/// give the next round (dropped, so wiped, once the drive is leased).
pub(super) fn open_encryption(
    m: &mut Mounted,
    drive: &Drive,
    earlier: Option<Unlocked>,
) -> Result<Option<Unlocked>, MountError> {
    let Some(passphrase) = m.passphrase.as_ref() else {
        if m.rt
            .block_on(encrypted::is_luks(&m.blob, drive.disk_size()))?
        {
            return Err(MountError::system(format!(
                "{} is encrypted (LUKS2): give its passphrase with --key-file FILE (fstab: key-file=PATH), BLOBDRIVE_PASSPHRASE, or a systemd credential named key",
                m.target
            )));
        }
        return Ok(None);
    };
    let (volume, kept) =
        m.rt.block_on(encrypted::reopen(&m.blob, passphrase.as_bytes(), earlier))
            .map_err(|e| refused(&m.target, e))?;
    let opened =
        encrypted::opened(&volume, drive.disk_size()).map_err(|e| refused(&m.target, e))?;
    if let Some(w) = &opened.warning {
        warn!("{}: {w}", m.target);
    }
    if kept {
        info!(
            "{}: its LUKS2 header is as it was when read before: the volume key opened then is kept",
            m.target
        );
    } else {
        info!(
            "{}: encrypted (LUKS2, aes-xts-plain64, {}-byte sectors), data from {} bytes in",
            m.target, opened.sector_size, opened.data_offset
        );
    }
    m.encryption = Some(Encryption {
        data_offset: opened.data_offset,
        sector_size: opened.sector_size,
        cipher: Some(opened.cipher),
        warning: opened.warning,
    });
    Ok(Some(volume))
}

/// Why an encrypted drive was not opened, in one line.
fn refused(target: &str, e: LuksError) -> MountError {
    MountError::system(match e {
        LuksError::NotLuks => format!(
            "{target} is not encrypted (no LUKS2 header at the start of its disk), but a passphrase was given: mount it without one"
        ),
        LuksError::WrongPassphrase => {
            format!("no keyslot of {target} opens with this passphrase: nothing was changed")
        }
        other => format!("cannot open the encrypted drive {target}: {other}"),
    })
}

/// The blob's written ranges, as the plaintext disk of `size` bytes whose
/// first byte is the blob's byte `offset` sees them.
pub(super) fn plain_ranges(ranges: &[PageRange], offset: u64, size: u64) -> Vec<PageRange> {
    ranges
        .iter()
        .filter(|r| r.end > offset && r.start < offset + size)
        .map(|r| {
            PageRange::new(
                r.start.max(offset) - offset,
                r.end.min(offset + size) - offset,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_seen_from_the_data_segment() {
        let r = |s, e| PageRange::new(s, e);
        let blob = [
            r(0, 32768),
            r(40000, 16 << 20),
            r((16 << 20) + 4096, (16 << 20) + 8192),
            r(30 << 20, 40 << 20),
        ];
        assert_eq!(
            plain_ranges(&blob, 16 << 20, 16 << 20),
            vec![r(4096, 8192), r(14 << 20, 16 << 20)]
        );
    }
}
