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

    const GIB: u64 = 1024 * MIB;

    /// The first 96 bytes of the footer `qemu-img create -f vpc -o
    /// subformat=fixed,force_size=on x.vhd 64M` (qemu 10.0) wrote; the rest is zero.
    const QEMU_64M_HEAD: [u8; 96] = [
        0x63, 0x6f, 0x6e, 0x65, 0x63, 0x74, 0x69, 0x78, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x00,
        0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x32, 0x95, 0xa7, 0x46, 0x71, 0x65,
        0x6d, 0x32, 0x00, 0x05, 0x00, 0x03, 0x57, 0x69, 0x32, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x04,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0xff, 0xff, 0x10, 0xff,
        0x00, 0x00, 0x00, 0x02, 0xff, 0xff, 0xe5, 0x3a, 0xc6, 0xcf, 0xd8, 0x65, 0x92, 0x9e, 0x4f,
        0x82, 0x97, 0xe5, 0x69, 0x0c, 0x60, 0x29, 0x63, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    fn qemu_64m() -> [u8; 512] {
        let mut b = [0u8; 512];
        b[..96].copy_from_slice(&QEMU_64M_HEAD);
        b
    }

    #[test]
    fn round_trip() {
        let f = Footer::new_fixed(64 * MIB).unwrap();
        let b = f.to_bytes();
        let g = Footer::parse_fixed_for_blob(&b, 64 * MIB + 512).unwrap();
        assert_eq!(f, g);
        assert_eq!(g.features, 2);
        assert_eq!(g.format_version, 0x0001_0000);
        assert_eq!(g.data_offset, u64::MAX);
        assert_eq!(&g.creator_app, b"bdrv");
        assert_eq!(g.creator_version, 0x0001_0000);
        assert_eq!(&g.creator_os, b"Wi2k");
        assert_eq!((g.original_size, g.current_size), (64 * MIB, 64 * MIB));
        assert_eq!(g.geometry, Geometry::MAX);
        assert_eq!(g.disk_type, DiskType::Fixed);
        assert_eq!(g.saved_state, 0);
        assert_eq!(uuid::Uuid::from_bytes(g.unique_id).get_version_num(), 4);
        assert_ne!(g.unique_id, Footer::new_fixed(64 * MIB).unwrap().unique_id);
        // Stamped now: after 2024-01-01 (757382400 s after the VHD epoch).
        assert!(g.timestamp > 757_382_400, "{}", g.timestamp);
        assert!(b[85..].iter().all(|&x| x == 0));
    }

    #[test]
    fn fields_sit_at_the_spec_offsets() {
        let f = Footer {
            features: 0x0102_0304,
            format_version: 0x0506_0708,
            data_offset: 0x1112_1314_1516_1718,
            timestamp: 0x2122_2324,
            creator_app: *b"abcd",
            creator_version: 0x3132_3334,
            creator_os: *b"efgh",
            original_size: 0x4142_4344_4546_4748,
            current_size: 0x5152_5354_5556_5758,
            geometry: Geometry {
                cylinders: 0x6162,
                heads: 0x63,
                sectors_per_track: 0x64,
            },
            disk_type: DiskType::Other(0x7172_7374),
            unique_id: *b"0123456789ABCDEF",
            saved_state: 0x99,
        };
        let b = f.to_bytes();
        assert_eq!(&b[0..8], b"conectix");
        assert_eq!(b[8..12], [1, 2, 3, 4]);
        assert_eq!(b[12..16], [5, 6, 7, 8]);
        assert_eq!(b[16..24], [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
        assert_eq!(b[24..28], [0x21, 0x22, 0x23, 0x24]);
        assert_eq!(&b[28..32], b"abcd");
        assert_eq!(b[32..36], [0x31, 0x32, 0x33, 0x34]);
        assert_eq!(&b[36..40], b"efgh");
        assert_eq!(b[40..48], [0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48]);
        assert_eq!(b[48..56], [0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58]);
        assert_eq!(b[56..60], [0x61, 0x62, 0x63, 0x64]);
        assert_eq!(b[60..64], [0x71, 0x72, 0x73, 0x74]);
        assert_eq!(&b[68..84], b"0123456789ABCDEF");
        assert_eq!(b[84], 0x99);
        assert_eq!(Footer::parse(&b).unwrap(), f);
    }

    #[test]
    fn checksum_known_values() {
        assert_eq!(Footer::checksum(&[0u8; 512]), 0xFFFF_FFFF);
        // "conectix" sums to 861.
        let mut b = [0u8; 512];
        b[..8].copy_from_slice(b"conectix");
        assert_eq!(Footer::checksum(&b), !861);
        // The checksum field does not count towards the sum.
        b[64..68].copy_from_slice(&[0xff; 4]);
        assert_eq!(Footer::checksum(&b), !861);
        // The sum wraps rather than overflowing: 508 bytes of 0xff sum to 129540.
        assert_eq!(Footer::checksum(&[0xff; 512]), !(508 * 255));
        // The footer qemu wrote: its stored checksum is ffffe53a.
        assert_eq!(Footer::checksum(&qemu_64m()), 0xFFFF_E53A);
    }

    #[test]
    fn parses_a_footer_qemu_wrote() {
        let f = Footer::parse_fixed_for_blob(&qemu_64m(), 64 * MIB + 512).unwrap();
        assert_eq!(&f.creator_app, b"qem2");
        assert_eq!(&f.creator_os, b"Wi2k");
        assert_eq!(f.current_size, 64 * MIB);
        assert_eq!(f.geometry, Geometry::MAX);
        assert_eq!(f.data_offset, u64::MAX);
        // And writes it back byte for byte.
        assert_eq!(f.to_bytes(), qemu_64m());
    }

    #[test]
    fn longer_input_is_read_from_its_end() {
        let mut image = vec![0xaau8; 4096];
        image.extend_from_slice(&Footer::new_fixed(MIB).unwrap().to_bytes());
        assert_eq!(Footer::parse(&image).unwrap().current_size, MIB);
    }

    #[test]
    fn too_short() {
        let e = Footer::parse(&[0u8; 511]).unwrap_err();
        assert_eq!(e, VhdError::TooShort(511));
        assert!(e.to_string().starts_with("not a VHD"), "{e}");
        assert_eq!(Footer::parse(&[]), Err(VhdError::TooShort(0)));
    }

    #[test]
    fn bad_cookie_shows_what_was_found_printably() {
        let e = Footer::parse(&[b'x'; 512]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a VHD: the last 512 bytes do not start with the cookie \"conectix\" (found \"xxxxxxxx\")"
        );
        let mut b = [0u8; 512];
        b[..8].copy_from_slice(b"ab\"\\\n\x00\xffZ");
        match Footer::parse(&b).unwrap_err() {
            VhdError::BadCookie { found } => assert_eq!(found, r#"ab\"\\\n\x00\xffZ"#),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn damage_is_caught_by_the_checksum() {
        let good = Footer::new_fixed(MIB).unwrap().to_bytes();
        let stored = be32(&good, 64);
        for at in [8, 48, 63, 68, 84, 300, 511] {
            let mut b = good;
            b[at] ^= 0x10;
            match Footer::parse(&b).unwrap_err() {
                VhdError::BadChecksum {
                    stored: s,
                    computed,
                } => {
                    assert_eq!(s, stored);
                    assert_ne!(computed, stored);
                }
                e => panic!("byte {at}: {e:?}"),
            }
        }
        let mut b = good;
        b[64..68].copy_from_slice(&0x1234u32.to_be_bytes());
        let e = Footer::parse(&b).unwrap_err();
        assert_eq!(
            e,
            VhdError::BadChecksum {
                stored: 0x1234,
                computed: stored
            }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "VHD footer checksum mismatch (stored 0x00001234, computed {stored:#010x}): the footer is damaged"
            )
        );
    }

    #[test]
    fn other_kinds_of_vhd_are_refused_by_name() {
        for (t, name) in [
            (DiskType::Dynamic, "dynamic"),
            (DiskType::Differencing, "differencing"),
            (DiskType::Other(0), "type 0"),
            (DiskType::Other(5), "type 5"),
        ] {
            let mut f = Footer::new_fixed(MIB).unwrap();
            f.disk_type = t;
            let b = f.to_bytes();
            // Structure alone is fine: `parse` takes any type.
            assert_eq!(Footer::parse(&b).unwrap().disk_type, t);
            let e = Footer::parse_fixed_for_blob(&b, MIB + 512).unwrap_err();
            assert_eq!(e, VhdError::NotFixed(t));
            assert_eq!(
                e.to_string(),
                format!("{name} VHD: blobdrive needs a fixed VHD; convert it with `qemu-img convert -O vpc -o subformat=fixed,force_size=on`")
            );
        }
        // Even when its size is also wrong: the type is the useful complaint.
        let mut f = Footer::new_fixed(MIB).unwrap();
        f.disk_type = DiskType::Dynamic;
        assert_eq!(
            Footer::parse_fixed_for_blob(&f.to_bytes(), 1234),
            Err(VhdError::NotFixed(DiskType::Dynamic))
        );
    }

    #[test]
    fn size_must_match_the_blob() {
        let b = Footer::new_fixed(MIB).unwrap().to_bytes();
        for blob_len in [MIB, MIB + 511, MIB + 513, 2 * MIB + 512, 0] {
            let e = Footer::parse_fixed_for_blob(&b, blob_len).unwrap_err();
            assert_eq!(
                e,
                VhdError::SizeMismatch {
                    current_size: MIB,
                    blob_len
                }
            );
        }
        assert_eq!(
            Footer::parse_fixed_for_blob(&b, 2 * MIB + 512)
                .unwrap_err()
                .to_string(),
            "VHD footer says the disk is 1048576 bytes but the blob holds 2097664 bytes (expected 1048576 + 512)"
        );
        // A size that would overflow with the footer added is a mismatch, not a panic.
        let mut f = Footer::new_fixed(MIB).unwrap();
        f.current_size = u64::MAX - 100;
        assert!(matches!(
            Footer::parse_fixed_for_blob(&f.to_bytes(), u64::MAX),
            Err(VhdError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn size_must_suit_azure() {
        let mut f = Footer::new_fixed(MIB).unwrap();
        f.current_size = MIB + 512;
        let e = Footer::parse_fixed_for_blob(&f.to_bytes(), MIB + 1024).unwrap_err();
        assert_eq!(e, VhdError::NotWholeMiB(MIB + 512));
        assert_eq!(
            e.to_string(),
            "size 1049088 bytes is not a whole number of MiB (Azure requires it)"
        );
        f.current_size = 0;
        assert_eq!(
            Footer::parse_fixed_for_blob(&f.to_bytes(), 512),
            Err(VhdError::Zero)
        );
        f.current_size = MAX_DISK_BYTES + MIB;
        assert_eq!(
            Footer::parse_fixed_for_blob(&f.to_bytes(), MAX_BLOB_BYTES + 512),
            Err(VhdError::TooLarge(MAX_DISK_BYTES + MIB))
        );

        assert_eq!(Footer::new_fixed(0), Err(VhdError::Zero));
        assert_eq!(Footer::new_fixed(1000), Err(VhdError::NotWholeMiB(1000)));
        assert_eq!(
            Footer::new_fixed(MIB - 512),
            Err(VhdError::NotWholeMiB(MIB - 512))
        );
        assert_eq!(
            Footer::new_fixed(MAX_DISK_BYTES + MIB),
            Err(VhdError::TooLarge(MAX_DISK_BYTES + MIB))
        );
        assert_eq!(
            Footer::new_fixed(u64::MAX),
            Err(VhdError::NotWholeMiB(u64::MAX))
        );
        assert_eq!(MAX_DISK_BYTES, 8_796_091_973_632);
        let max = Footer::new_fixed(MAX_DISK_BYTES).unwrap();
        assert_eq!(
            Footer::parse_fixed_for_blob(&max.to_bytes(), MAX_BLOB_BYTES - MIB + 512)
                .unwrap()
                .current_size,
            MAX_DISK_BYTES
        );
        assert!(Footer::new_fixed(MIB).is_ok());
    }

    #[test]
    fn every_message_is_one_line() {
        let all = [
            VhdError::TooShort(3),
            VhdError::BadCookie {
                found: "\\n".into(),
            },
            VhdError::BadChecksum {
                stored: 1,
                computed: 2,
            },
            VhdError::NotFixed(DiskType::Dynamic),
            VhdError::SizeMismatch {
                current_size: 1,
                blob_len: 2,
            },
            VhdError::NotWholeMiB(1),
            VhdError::TooLarge(1),
            VhdError::Zero,
        ];
        for e in all {
            let s = e.to_string();
            assert!(!s.contains('\n') && !s.is_empty(), "{s:?}");
        }
    }

    #[test]
    fn disk_type_numbers_and_names() {
        for n in 0..8u32 {
            assert_eq!(u32::from(DiskType::from(n)), n);
        }
        assert_eq!(DiskType::from(2), DiskType::Fixed);
        assert_eq!(DiskType::from(3), DiskType::Dynamic);
        assert_eq!(DiskType::from(4), DiskType::Differencing);
        assert_eq!(DiskType::from(6), DiskType::Other(6));
        assert_eq!(DiskType::Fixed.to_string(), "fixed");
        assert_eq!(DiskType::Dynamic.to_string(), "dynamic");
        assert_eq!(DiskType::Differencing.to_string(), "differencing");
        assert_eq!(DiskType::Other(1).to_string(), "type 1");
    }

    fn chs(cylinders: u16, heads: u8, sectors_per_track: u8) -> Geometry {
        Geometry {
            cylinders,
            heads,
            sectors_per_track,
        }
    }

    #[test]
    fn geometry_follows_the_spec() {
        let cases = [
            // Small disks: 17 sectors per track, at least 4 heads.
            (0, chs(0, 4, 17)),
            (MIB, chs(30, 4, 17)),
            // 131072 sectors / 17 = 7710 = 8 heads * 963 cylinders (+ 6).
            (64 * MIB, chs(963, 8, 17)),
            (100 * MIB, chs(1003, 12, 17)),
            (127 * MIB, chs(1019, 15, 17)),
            // 17 spt would need more than 16 heads: 31 spt.
            (200 * MIB, chs(825, 16, 31)),
            // 31 spt would need more than 1024 cylinders * 16 heads: 63 spt.
            (500 * MIB, chs(1015, 16, 63)),
            (GIB, chs(2080, 16, 63)),
            (10 * GIB, chs(20805, 16, 63)),
            // From 65535 * 16 * 63 sectors (31.5 GiB) on: 255 spt.
            (65535 * 16 * 63 * 512 - 512, chs(65534, 16, 63)),
            (65535 * 16 * 63 * 512, chs(16191, 16, 255)),
            (40 * GIB, chs(20560, 16, 255)),
            (127 * GIB, chs(65278, 16, 255)),
            // 65535 * 16 * 255 sectors (about 127.5 GiB) and beyond clamp.
            (65535 * 16 * 255 * 512, Geometry::MAX),
            (128 * GIB, Geometry::MAX),
            (MAX_DISK_BYTES, Geometry::MAX),
            (u64::MAX, Geometry::MAX),
        ];
        for (bytes, want) in cases {
            assert_eq!(Geometry::from_size(bytes), want, "{bytes} bytes");
        }
        // The spec's CHS never describes more than the disk.
        for mib in [1, 3, 64, 100, 1000, 4000, 50_000, 130_000] {
            let g = Geometry::from_size(mib * MIB);
            let chs_bytes =
                u64::from(g.cylinders) * u64::from(g.heads) * u64::from(g.sectors_per_track) * 512;
            assert!(chs_bytes <= mib * MIB, "{mib} MiB");
        }
    }
}
