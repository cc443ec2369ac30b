//! The fixed VHD footer (VHD specification v1.0): the 512 bytes after the raw disk
//! that make a page blob an Azure drive.
//!
//! Parsing is strict (cookie, checksum, disk type, sizes) because a wrong footer
//! means a wrong disk size, and a wrong disk size means data written past the end or
//! a filesystem cut short. The size is always taken from `current size`, never from
//! the CHS geometry, which cannot express most sizes exactly.

use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

pub const FOOTER_SIZE: u64 = 512;
pub const MIB: u64 = 1024 * 1024;
/// Largest page blob Azure allows (8 TiB).
pub const MAX_BLOB_BYTES: u64 = 8 * 1024 * 1024 * 1024 * 1024;
/// Largest disk: a whole number of MiB whose footer still fits in the blob.
pub const MAX_DISK_BYTES: u64 = MAX_BLOB_BYTES - MIB;

const COOKIE: &[u8; 8] = b"conectix";
/// Seconds from the Unix epoch to the VHD epoch, 2000-01-01T00:00:00Z.
const VHD_EPOCH: u64 = 946_684_800;
const FIXED_DATA_OFFSET: u64 = u64::MAX;

/// The footer's disk type field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskType {
    Fixed,
    Dynamic,
    Differencing,
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

/// Cylinders, heads and sectors per track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub cylinders: u16,
    pub heads: u8,
    pub sectors_per_track: u8,
}

impl Geometry {
    /// The largest geometry; qemu reads a footer with it at its `current size`
    /// instead of deriving the size from CHS, which is why blobdrive writes it.
    pub const MAX: Geometry = Geometry {
        cylinders: 65535,
        heads: 16,
        sectors_per_track: 255,
    };

    /// CHS for `bytes` by the algorithm of the VHD specification's appendix.
    pub fn from_size(bytes: u64) -> Geometry {
        let mut total = (bytes / 512).min(65535 * 16 * 255);
        let (spt, heads, cth);
        if total >= 65535 * 16 * 63 {
            spt = 255;
            heads = 16;
            cth = total / spt;
        } else {
            let mut s = 17;
            let mut c = total / s;
            let mut h = c.div_ceil(1024).max(4);
            if c >= h * 1024 || h > 16 {
                s = 31;
                h = 16;
                c = total / s;
            }
            if c >= h * 1024 {
                s = 63;
                h = 16;
                c = total / s;
            }
            spt = s;
            heads = h;
            cth = c;
        }
        total = cth / heads;
        Geometry {
            cylinders: total as u16,
            heads: heads as u8,
            sectors_per_track: spt as u8,
        }
    }
}

/// Why a footer was refused. Each message is one line an operator can act on.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum VhdError {
    #[error("not a VHD: need 512 footer bytes, got {0}")]
    TooShort(usize),
    #[error("not a VHD: the last 512 bytes do not start with the cookie \"conectix\" (found \"{found}\")")]
    BadCookie { found: String },
    #[error("VHD footer checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the footer is damaged")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("{0} VHD: blobdrive needs a fixed VHD; convert it with `qemu-img convert -O vpc -o subformat=fixed,force_size=on`")]
    NotFixed(DiskType),
    #[error("VHD footer says the disk is {current_size} bytes but the blob holds {blob_len} bytes (expected {current_size} + 512)")]
    SizeMismatch { current_size: u64, blob_len: u64 },
    #[error("size {0} bytes is not a whole number of MiB (Azure requires it)")]
    NotWholeMiB(u64),
    #[error("size {0} bytes is over the page-blob maximum of 8 TiB - 1 MiB for a disk")]
    TooLarge(u64),
    #[error("a disk cannot be 0 bytes")]
    Zero,
}

/// A parsed footer; `to_bytes` computes the checksum, so it is not a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub features: u32,
    pub format_version: u32,
    pub data_offset: u64,
    pub timestamp: u32,
    pub creator_app: [u8; 4],
    pub creator_version: u32,
    pub creator_os: [u8; 4],
    pub original_size: u64,
    pub current_size: u64,
    pub geometry: Geometry,
    pub disk_type: DiskType,
    pub unique_id: [u8; 16],
    pub saved_state: u8,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Footer {
    /// A fixed-disk footer for `size` bytes, stamped now, with a fresh id.
    pub fn new_fixed(size: u64) -> Result<Footer, VhdError> {
        check_disk_size(size)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(VHD_EPOCH);
        Ok(Footer {
            features: 2,
            format_version: 0x0001_0000,
            data_offset: FIXED_DATA_OFFSET,
            timestamp: now.saturating_sub(VHD_EPOCH).min(u32::MAX as u64) as u32,
            creator_app: *b"bdrv",
            creator_version: 0x0001_0000,
            creator_os: *b"Wi2k",
            original_size: size,
            current_size: size,
            // Not `from_size`: CHS cannot express most sizes, and readers that size a
            // disk from CHS (qemu) would see a smaller disk than Azure does.
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

    /// One's complement of the byte sum, the checksum field counted as zero.
    pub fn checksum(bytes: &[u8; 512]) -> u32 {
        let sum = bytes
            .iter()
            .enumerate()
            .filter(|(i, _)| !(64..68).contains(i))
            .fold(0u32, |acc, (_, &b)| acc.wrapping_add(b as u32));
        !sum
    }

    /// Parses any footer whose cookie and checksum are right, whatever its type.
    pub fn parse(bytes: &[u8]) -> Result<Footer, VhdError> {
        let b: &[u8; 512] = bytes
            .get(..512)
            .and_then(|s| s.try_into().ok())
            .ok_or(VhdError::TooShort(bytes.len()))?;
        if &b[0..8] != COOKIE {
            let found = b[0..8]
                .iter()
                .map(|&c| {
                    if c.is_ascii_graphic() || c == b' ' {
                        (c as char).to_string()
                    } else {
                        format!("\\x{c:02x}")
                    }
                })
                .collect();
            return Err(VhdError::BadCookie { found });
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
            creator_app: b[28..32].try_into().expect("4 bytes"),
            creator_version: be32(b, 32),
            creator_os: b[36..40].try_into().expect("4 bytes"),
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

    /// Everything a drive needs: a valid fixed-disk footer whose size, a whole number
    /// of MiB, plus the footer is exactly the blob's length.
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

/// Azure's rules for a fixed VHD's disk size.
pub fn check_disk_size(size: u64) -> Result<(), VhdError> {
    if size == 0 {
        return Err(VhdError::Zero);
    }
    if size % MIB != 0 {
        return Err(VhdError::NotWholeMiB(size));
    }
    if size > MAX_DISK_BYTES {
        return Err(VhdError::TooLarge(size));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let f = Footer::new_fixed(64 * MIB).unwrap();
        let b = f.to_bytes();
        assert_eq!(&b[0..8], b"conectix");
        let g = Footer::parse_fixed_for_blob(&b, 64 * MIB + 512).unwrap();
        assert_eq!(f, g);
        assert_eq!(g.disk_type, DiskType::Fixed);
        assert_eq!(&g.creator_os, b"Wi2k");
        assert!(b[85..].iter().all(|&x| x == 0));
    }

    #[test]
    fn checksum_detects_damage() {
        let mut b = Footer::new_fixed(MIB).unwrap().to_bytes();
        b[200] = 1;
        assert!(matches!(
            Footer::parse(&b),
            Err(VhdError::BadChecksum { .. })
        ));
        // The checksum field itself does not count towards the sum.
        let b = Footer::new_fixed(MIB).unwrap().to_bytes();
        assert_eq!(Footer::checksum(&b), be32(&b, 64));
    }

    #[test]
    fn refusals_name_the_problem() {
        assert_eq!(Footer::parse(&[0u8; 10]), Err(VhdError::TooShort(10)));
        let e = Footer::parse(&[b'x'; 512]).unwrap_err();
        assert!(e.to_string().contains("conectix") && e.to_string().contains("xxxxxxxx"));
        let mut f = Footer::new_fixed(MIB).unwrap();
        f.disk_type = DiskType::Dynamic;
        let e = Footer::parse_fixed_for_blob(&f.to_bytes(), MIB + 512).unwrap_err();
        assert_eq!(e, VhdError::NotFixed(DiskType::Dynamic));
        assert!(
            e.to_string().starts_with("dynamic VHD") && e.to_string().contains("qemu-img convert")
        );
        f.disk_type = DiskType::Differencing;
        assert!(Footer::parse_fixed_for_blob(&f.to_bytes(), MIB + 512)
            .unwrap_err()
            .to_string()
            .starts_with("differencing VHD"));
        let f = Footer::new_fixed(MIB).unwrap();
        assert_eq!(
            Footer::parse_fixed_for_blob(&f.to_bytes(), 2 * MIB + 512),
            Err(VhdError::SizeMismatch {
                current_size: MIB,
                blob_len: 2 * MIB + 512
            })
        );
        let mut f = Footer::new_fixed(MIB).unwrap();
        f.current_size = MIB + 512;
        assert_eq!(
            Footer::parse_fixed_for_blob(&f.to_bytes(), MIB + 1024),
            Err(VhdError::NotWholeMiB(MIB + 512))
        );
        assert_eq!(Footer::new_fixed(0), Err(VhdError::Zero));
        assert_eq!(Footer::new_fixed(1000), Err(VhdError::NotWholeMiB(1000)));
        assert_eq!(
            Footer::new_fixed(MAX_DISK_BYTES + MIB),
            Err(VhdError::TooLarge(MAX_DISK_BYTES + MIB))
        );
        assert!(Footer::new_fixed(MAX_DISK_BYTES).is_ok());
    }

    #[test]
    fn geometry_follows_the_spec() {
        // 64 MiB: 131072 sectors -> 17 spt first, then 31 spt needed? cth = 7710,
        // heads = 8 -> 7710 < 8192, so 17 spt / 8 heads / 963 cylinders.
        assert_eq!(
            Geometry::from_size(64 * MIB),
            Geometry {
                cylinders: 963,
                heads: 8,
                sectors_per_track: 17
            }
        );
        // 1 GiB: 2097152 sectors; 17 spt gives heads 121 > 16, 31 spt gives
        // cth 67650 >= 16384, so 63 spt: cth 33288, 2080 cylinders.
        assert_eq!(
            Geometry::from_size(1 << 30),
            Geometry {
                cylinders: 2080,
                heads: 16,
                sectors_per_track: 63
            }
        );
        // At and beyond 65535*16*63 sectors: 255 spt, clamped at the maximum.
        assert_eq!(
            Geometry::from_size(65535 * 16 * 63 * 512),
            Geometry {
                cylinders: 16191,
                heads: 16,
                sectors_per_track: 255
            }
        );
        assert_eq!(Geometry::from_size(4 << 40), Geometry::MAX);
    }
}
