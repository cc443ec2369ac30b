//! The fixed VHD footer (VHD specification v1.0): the 512 bytes after the raw disk
//! that make a page blob an Azure drive.
//!
//! Parsing is strict about what decides where the data is and how big it is (cookie,
//! checksum, disk type, sizes), because a wrong footer means a wrong disk size, and a
//! wrong disk size means data written past the end or a filesystem cut short. Fields
//! that tools fill in inconsistently (features, versions, data offset, creator) are
//! kept as read and never judged, so that VHDs from other tools still mount.
//!
//! The size is always taken from `current size`, never from the CHS geometry, which
//! cannot express most sizes exactly.

use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

pub const FOOTER_SIZE: u64 = 512;
pub const MIB: u64 = 1024 * 1024;
/// Largest page blob Azure allows (8 TiB).
pub const MAX_BLOB_BYTES: u64 = 8 * 1024 * 1024 * 1024 * 1024;
/// Largest disk: whole MiB with footer within MAX_BLOB_BYTES => 8 TiB - 1 MiB.
pub const MAX_DISK_BYTES: u64 = MAX_BLOB_BYTES - MIB;

const COOKIE: &[u8; 8] = b"conectix";
/// Seconds from the Unix epoch to the VHD epoch, 2000-01-01T00:00:00Z.
const VHD_EPOCH: u64 = 946_684_800;
/// The spec's value for "no dynamic header", which is what makes a disk fixed.
const FIXED_DATA_OFFSET: u64 = u64::MAX;
/// Bit 1 of the features field is reserved and must always be set.
const FEATURES_RESERVED: u32 = 0x0000_0002;
const FORMAT_VERSION: u32 = 0x0001_0000;
const CREATOR_APP: &[u8; 4] = b"bdrv";
const CREATOR_VERSION: u32 = 0x0001_0000;
/// Windows, which is what Azure expects of the VHDs it is given.
const CREATOR_OS: &[u8; 4] = b"Wi2k";

/// The footer's disk type field; anything but `Fixed` is refused for a drive, and
/// the other kinds are named so the refusal can say what the VHD is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskType {
    Fixed,
    Dynamic,
    Differencing,
    /// None (0), the deprecated 1 and the reserved 5 and 6, kept as numbers
    /// because nobody should meet them and the number is what a bug report needs.
    Other(u32),
}

impl From<u32> for DiskType {
    fn from(v: u32) -> DiskType {
        match v {
            2 => DiskType::Fixed,
            3 => DiskType::Dynamic,
            4 => DiskType::Differencing,
            n => DiskType::Other(n),
        }
    }
}

impl From<DiskType> for u32 {
    fn from(t: DiskType) -> u32 {
        match t {
            DiskType::Fixed => 2,
            DiskType::Dynamic => 3,
            DiskType::Differencing => 4,
            DiskType::Other(n) => n,
        }
    }
}

impl std::fmt::Display for DiskType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskType::Fixed => f.write_str("fixed"),
            DiskType::Dynamic => f.write_str("dynamic"),
            DiskType::Differencing => f.write_str("differencing"),
            DiskType::Other(n) => write!(f, "type {n}"),
        }
    }
}

/// Cylinders, heads and sectors per track, as the footer stores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub cylinders: u16,
    pub heads: u8,
    pub sectors_per_track: u8,
}

impl Geometry {
    /// The largest geometry the footer can hold. Readers that may size a disk from
    /// its CHS (qemu, Virtual PC) take this value to mean "CHS cannot describe this
    /// disk, use `current size`", which is why blobdrive writes it.
    pub const MAX: Geometry = Geometry {
        cylinders: 65535,
        heads: 16,
        sectors_per_track: 255,
    };

    /// CHS for `bytes` by the algorithm of the VHD specification's appendix, which
    /// rounds down: the geometry describes at most `bytes` and usually a little
    /// less. qemu computes the same values (checked in `tests/vhd_qemu.rs`).
    ///
    /// blobdrive does not write this into its footers (see [`Footer::new_fixed`]);
    /// it is here to judge and explain footers other tools wrote.
    pub fn from_size(bytes: u64) -> Geometry {
        const MAX_SECTORS: u64 = 65535 * 16 * 255;
        let total = (bytes / 512).min(MAX_SECTORS);
        let (spt, heads, cyl_times_heads) = if total >= 65535 * 16 * 63 {
            (255, 16, total / 255)
        } else {
            let mut spt = 17;
            let mut cth = total / spt;
            let mut heads = cth.div_ceil(1024).max(4);
            if cth >= heads * 1024 || heads > 16 {
                spt = 31;
                heads = 16;
                cth = total / spt;
            }
            if cth >= heads * 1024 {
                spt = 63;
                heads = 16;
                cth = total / spt;
            }
            (spt, heads, cth)
        };
        // Each value fits its field: total is clamped so cylinders <= 65535, and
        // the branches only ever choose heads <= 16 and spt <= 255.
        Geometry {
            cylinders: (cyl_times_heads / heads) as u16,
            heads: heads as u8,
            sectors_per_track: spt as u8,
        }
    }
}

/// Why a footer or a size was refused. Each message is one line an operator can
/// act on without knowing the VHD format.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum VhdError {
    #[error("not a VHD: a VHD ends in a 512-byte footer but there are only {0} bytes")]
    TooShort(usize),
    #[error(
        "not a VHD: the last 512 bytes do not start with the cookie \"conectix\" (found \"{found}\")"
    )]
    BadCookie { found: String },
    #[error(
        "VHD footer checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the footer is damaged"
    )]
    BadChecksum { stored: u32, computed: u32 },
    #[error(
        "{0} VHD: blobdrive needs a fixed VHD; convert it with `qemu-img convert -O vpc -o subformat=fixed,force_size=on`"
    )]
    NotFixed(DiskType),
    #[error(
        "VHD footer says the disk is {current_size} bytes but the blob holds {blob_len} bytes (expected {current_size} + 512)"
    )]
    SizeMismatch { current_size: u64, blob_len: u64 },
    #[error("size {0} bytes is not a whole number of MiB (Azure requires it)")]
    NotWholeMiB(u64),
    #[error(
        "size {0} bytes is over the largest Azure disk, 8 TiB - 1 MiB ({MAX_DISK_BYTES} bytes), which with its footer fills an 8 TiB page blob"
    )]
    TooLarge(u64),
    #[error("size 0 bytes: a disk must be at least 1 MiB")]
    Zero,
}

/// A parsed footer. The checksum is not a field because `to_bytes` computes it:
/// a footer edited in memory can never be written with a stale one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub features: u32,
    pub format_version: u32,
    pub data_offset: u64,
    /// Seconds since 2000-01-01T00:00:00Z.
    pub timestamp: u32,
    pub creator_app: [u8; 4],
    pub creator_version: u32,
    pub creator_os: [u8; 4],
    pub original_size: u64,
    /// The disk's size in bytes; the only size blobdrive believes.
    pub current_size: u64,
    pub geometry: Geometry,
    pub disk_type: DiskType,
    pub unique_id: [u8; 16],
    pub saved_state: u8,
}

fn be32(b: &[u8; 512], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8; 512], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

fn four(b: &[u8; 512], at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

impl Footer {
    /// A fixed-disk footer for `size` bytes, stamped now, with a fresh random id so
    /// that disks copied from one another can still be told apart.
    ///
    /// The geometry is [`Geometry::MAX`], not [`Geometry::from_size`]: the spec's
    /// CHS rounds down and cannot express most sizes, and a reader that sizes the
    /// disk from CHS would see a smaller disk than Azure does and lose its tail.
    /// qemu is such a reader: before 10.0 it used CHS for every creator it did not
    /// know (so for `bdrv`), and every version still does for `vpc ` and `qemu`;
    /// all of them use `current size` when the geometry is the maximum. It is also
    /// what `qemu-img create -o force_size=on` writes, so Azure's own tooling sees
    /// footers of the shape it already accepts.
    pub fn new_fixed(size: u64) -> Result<Footer, VhdError> {
        check_disk_size(size)?;
        // A clock before 1970 or after 2136 cannot be stored; the timestamp is
        // informational, so clamp rather than refuse to make a disk.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(VHD_EPOCH);
        let timestamp = now.saturating_sub(VHD_EPOCH).min(u64::from(u32::MAX)) as u32;
        Ok(Footer {
            features: FEATURES_RESERVED,
            format_version: FORMAT_VERSION,
            data_offset: FIXED_DATA_OFFSET,
            timestamp,
            creator_app: *CREATOR_APP,
            creator_version: CREATOR_VERSION,
            creator_os: *CREATOR_OS,
            original_size: size,
            current_size: size,
            geometry: Geometry::MAX,
            disk_type: DiskType::Fixed,
            unique_id: *uuid::Uuid::new_v4().as_bytes(),
            saved_state: 0,
        })
    }

    /// The 512 footer bytes, checksum included.
    pub fn to_bytes(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[0..8].copy_from_slice(COOKIE);
        b[8..12].copy_from_slice(&self.features.to_be_bytes());
        b[12..16].copy_from_slice(&self.format_version.to_be_bytes());
        b[16..24].copy_from_slice(&self.data_offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.timestamp.to_be_bytes());
        b[28..32].copy_from_slice(&self.creator_app);
        b[32..36].copy_from_slice(&self.creator_version.to_be_bytes());
        b[36..40].copy_from_slice(&self.creator_os);
        b[40..48].copy_from_slice(&self.original_size.to_be_bytes());
        b[48..56].copy_from_slice(&self.current_size.to_be_bytes());
        b[56..58].copy_from_slice(&self.geometry.cylinders.to_be_bytes());
        b[58] = self.geometry.heads;
        b[59] = self.geometry.sectors_per_track;
        b[60..64].copy_from_slice(&u32::from(self.disk_type).to_be_bytes());
        b[68..84].copy_from_slice(&self.unique_id);
        b[84] = self.saved_state;
        let sum = Footer::checksum(&b);
        b[64..68].copy_from_slice(&sum.to_be_bytes());
        b
    }

    /// The spec's checksum: one's complement of the wrapping byte sum, with the
    /// checksum field (bytes 64..68) counted as zero so that the same function both
    /// computes it for writing and checks it for reading.
    pub fn checksum(bytes: &[u8; 512]) -> u32 {
        let sum = bytes[..64]
            .iter()
            .chain(&bytes[68..])
            .fold(0u32, |acc, &b| acc.wrapping_add(u32::from(b)));
        !sum
    }

    /// Parses any footer whose cookie and checksum are right, whatever its type, so
    /// that callers can say what a refused VHD is. The footer is a file's last 512
    /// bytes, so a longer slice is read from its end.
    pub fn parse(bytes: &[u8]) -> Result<Footer, VhdError> {
        let start = bytes
            .len()
            .checked_sub(512)
            .ok_or(VhdError::TooShort(bytes.len()))?;
        let b: &[u8; 512] = bytes[start..].try_into().expect("exactly 512 bytes");
        if &b[0..8] != COOKIE {
            return Err(VhdError::BadCookie {
                found: b[0..8].escape_ascii().to_string(),
            });
        }
        let stored = be32(b, 64);
        let computed = Footer::checksum(b);
        if stored != computed {
            return Err(VhdError::BadChecksum { stored, computed });
        }
        Ok(Footer {
            features: be32(b, 8),
            format_version: be32(b, 12),
            data_offset: be64(b, 16),
            timestamp: be32(b, 24),
            creator_app: four(b, 28),
            creator_version: be32(b, 32),
            creator_os: four(b, 36),
            original_size: be64(b, 40),
            current_size: be64(b, 48),
            geometry: Geometry {
                cylinders: u16::from_be_bytes([b[56], b[57]]),
                heads: b[58],
                sectors_per_track: b[59],
            },
            disk_type: DiskType::from(be32(b, 60)),
            unique_id: b[68..84].try_into().expect("16 bytes"),
            saved_state: b[84],
        })
    }

    /// Everything a drive needs from the footer at the end of a blob of `blob_len`
    /// bytes: a valid fixed-disk footer whose size, a whole number of MiB, plus the
    /// footer is exactly the blob's length. The type is checked before the size
    /// because a dynamic VHD's sizes mean something else, and "convert it" is the
    /// useful answer.
    pub fn parse_fixed_for_blob(bytes: &[u8], blob_len: u64) -> Result<Footer, VhdError> {
        let f = Footer::parse(bytes)?;
        if f.disk_type != DiskType::Fixed {
            return Err(VhdError::NotFixed(f.disk_type));
        }
        if f.current_size.checked_add(FOOTER_SIZE) != Some(blob_len) {
            return Err(VhdError::SizeMismatch {
                current_size: f.current_size,
                blob_len,
            });
        }
        check_disk_size(f.current_size)?;
        Ok(f)
    }
}

/// Azure's rules for a fixed VHD's disk size, shared by building and checking so a
/// disk blobdrive makes is always one it will mount.
pub fn check_disk_size(size: u64) -> Result<(), VhdError> {
    if size == 0 {
        return Err(VhdError::Zero);
    }
    if !size.is_multiple_of(MIB) {
        return Err(VhdError::NotWholeMiB(size));
    }
    if size > MAX_DISK_BYTES {
        return Err(VhdError::TooLarge(size));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
