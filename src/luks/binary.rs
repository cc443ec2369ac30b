//! The binary part of a LUKS2 header: 4096 bytes, big-endian, at the start of
//! each of the two header copies, followed by the JSON area (`hdr_size` bytes
//! in all). The checksum covers both parts, with its own field zeroed.
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 6 | magic: `LUKS\xba\xbe` (first copy), `SKUL\xba\xbe` (second) |
//! | 6 | 2 | version, 2 |
//! | 8 | 8 | hdr_size: binary header and JSON area |
//! | 16 | 8 | seqid, raised on every update |
//! | 24 | 48 | label |
//! | 72 | 32 | checksum_alg, e.g. `sha256` |
//! | 104 | 64 | salt, random for each copy |
//! | 168 | 40 | uuid, text |
//! | 208 | 48 | subsystem |
//! | 256 | 8 | hdr_offset: where this copy is |
//! | 448 | 64 | csum |

use super::kdf::Hash;
use super::LuksError;

pub const BINARY_SIZE: usize = 4096;
pub const MAGIC_FIRST: &[u8; 6] = b"LUKS\xba\xbe";
pub const MAGIC_SECOND: &[u8; 6] = b"SKUL\xba\xbe";
/// The header sizes LUKS2 allows (binary part and JSON area together), which
/// are also where a second copy may be when the first cannot say.
pub const HDR_SIZES: [u64; 9] = [
    0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000, 0x10_0000, 0x20_0000, 0x40_0000,
];

const CSUM_AT: usize = 448;
const CSUM_LEN: usize = 64;

/// The binary header's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: [u8; 48],
    pub checksum: Hash,
    pub salt: [u8; 64],
    pub uuid: String,
    pub subsystem: [u8; 48],
    pub hdr_offset: u64,
}

impl Binary {
    /// Reads the first 4096 bytes of a copy expected at `offset`: the magic
    /// for that place, version 2, an allowed size, and `hdr_offset` saying it
    /// is there. (The checksum needs the JSON area too: [`verify`].)
    pub fn parse(bytes: &[u8], offset: u64) -> Result<Binary, LuksError> {
        let bad = |why: &str| {
            Err(LuksError::Invalid(format!(
                "header copy at {offset}: {why}"
            )))
        };
        if bytes.len() < BINARY_SIZE {
            return bad("short");
        }
        let magic = if offset == 0 {
            MAGIC_FIRST
        } else {
            MAGIC_SECOND
        };
        if &bytes[..6] != magic {
            return Err(LuksError::NotLuks);
        }
        if be16(bytes, 6) != 2 {
            return Err(LuksError::Unsupported(format!(
                "LUKS version {} (blobdrive reads LUKS2)",
                be16(bytes, 6)
            )));
        }
        let hdr_size = be64(bytes, 8);
        if !HDR_SIZES.contains(&hdr_size) {
            return bad(&format!("a header size of {hdr_size} bytes"));
        }
        let hdr_offset = be64(bytes, 256);
        if hdr_offset != offset {
            return bad(&format!("it says it is at {hdr_offset}"));
        }
        let checksum = Hash::parse(&text(&bytes[72..104]))?;
        let uuid = text(&bytes[168..208]);
        Ok(Binary {
            hdr_size,
            seqid: be64(bytes, 16),
            label: bytes[24..72].try_into().expect("48 bytes"),
            checksum,
            salt: bytes[104..168].try_into().expect("64 bytes"),
            uuid,
            subsystem: bytes[208..256].try_into().expect("48 bytes"),
            hdr_offset,
        })
    }

    /// The 4096 bytes of this copy, its checksum field zero (see [`seal`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; BINARY_SIZE];
        let magic = if self.hdr_offset == 0 {
            MAGIC_FIRST
        } else {
            MAGIC_SECOND
        };
        b[..6].copy_from_slice(magic);
        b[6..8].copy_from_slice(&2u16.to_be_bytes());
        b[8..16].copy_from_slice(&self.hdr_size.to_be_bytes());
        b[16..24].copy_from_slice(&self.seqid.to_be_bytes());
        b[24..72].copy_from_slice(&self.label);
        put_text(&mut b[72..104], self.checksum.name());
        b[104..168].copy_from_slice(&self.salt);
        put_text(&mut b[168..208], &self.uuid);
        b[208..256].copy_from_slice(&self.subsystem);
        b[256..264].copy_from_slice(&self.hdr_offset.to_be_bytes());
        b
    }
}

/// The checksum of a whole copy (`hdr_size` bytes), taken with its checksum
/// field as zeros.
fn checksum_of(copy: &[u8], hash: Hash) -> Vec<u8> {
    let zeros = [0u8; CSUM_LEN];
    hash.of(&[&copy[..CSUM_AT], &zeros, &copy[CSUM_AT + CSUM_LEN..]])
}

/// Whether a whole copy's checksum is right.
pub fn verify(copy: &[u8], hash: Hash) -> bool {
    let want = checksum_of(copy, hash);
    super::kdf::same(&copy[CSUM_AT..CSUM_AT + want.len()], &want)
}

/// Writes a whole copy's checksum into it.
pub fn seal(copy: &mut [u8], hash: Hash) {
    copy[CSUM_AT..CSUM_AT + CSUM_LEN].fill(0);
    let sum = checksum_of(copy, hash);
    copy[CSUM_AT..CSUM_AT + sum.len()].copy_from_slice(&sum);
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A NUL-terminated text field.
fn text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// `s` into a text field, NUL-padded (one NUL at least).
fn put_text(field: &mut [u8], s: &str) {
    let n = s.len().min(field.len() - 1);
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(offset: u64) -> Binary {
        Binary {
            hdr_size: 0x4000,
            seqid: 7,
            label: [0; 48],
            checksum: Hash::Sha256,
            salt: [5; 64],
            uuid: "50cd2a98-10b7-4391-b628-cbf07523e921".into(),
            subsystem: [0; 48],
            hdr_offset: offset,
        }
    }

    #[test]
    fn both_copies_round_trip_with_their_magic() {
        for offset in [0, 0x4000] {
            let b = sample(offset);
            let mut copy = b.to_bytes();
            copy.resize(0x4000, 0);
            seal(&mut copy, Hash::Sha256);
            assert!(verify(&copy, Hash::Sha256));
            assert_eq!(Binary::parse(&copy, offset).unwrap(), b);
            copy[5000] ^= 1;
            assert!(!verify(&copy, Hash::Sha256));
        }
        let first = sample(0).to_bytes();
        assert_eq!(&first[..6], MAGIC_FIRST);
        // A copy is only taken where it says it is.
        assert!(Binary::parse(&first, 0x4000).is_err());
    }

    #[test]
    fn fields_sit_where_cryptsetup_puts_them() {
        let b = sample(0).to_bytes();
        assert_eq!(&b[6..8], &[0, 2]);
        assert_eq!(&b[8..16], &0x4000u64.to_be_bytes());
        assert_eq!(&b[72..79], b"sha256\0");
        assert_eq!(&b[168..172], b"50cd");
        assert!(matches!(
            Binary::parse(&[0u8; 4096], 0),
            Err(LuksError::NotLuks)
        ));
    }
}
