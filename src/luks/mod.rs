//! LUKS2, as cryptsetup lays it out, read and written in user space: a drive's
//! disk starts with the two copies of a LUKS2 header and its keyslots (16 MiB
//! by default) and the rest is the data segment, aes-xts-plain64, so that any
//! Linux host opens a downloaded image with `cryptsetup open`.
//!
//! The parts, each testable alone: [`binary`] (the 4096-byte binary header and
//! its checksum), [`metadata`] (the JSON area), [`header`] (both copies: the
//! newer valid one is used, so a damaged first copy falls back to the second),
//! [`kdf`] (Argon2 and PBKDF2, with bounds on what a header may ask), [`af`]
//! (the anti-forensic splitter), [`xts`] (the cipher), [`secret`] (locked,
//! wiped memory for keys), and [`volume`]: formatting, unlocking, and adding,
//! removing and changing passphrases, over any [`HeaderDisk`].

pub mod af;
pub mod binary;
pub mod header;
pub mod kdf;
pub mod metadata;
pub mod secret;
pub mod volume;
pub mod xts;

use thiserror::Error;

/// Where cryptsetup puts the data by default: after two 16 KiB header copies
/// and a keyslots area that fills the rest of the first 16 MiB.
pub const DEFAULT_DATA_OFFSET: u64 = 16 << 20;
/// The size of each header copy (binary part and JSON area) blobdrive writes:
/// cryptsetup's default.
pub const DEFAULT_HDR_SIZE: u64 = 16 << 10;

/// Why a LUKS2 operation failed.
#[derive(Debug, Error)]
pub enum LuksError {
    #[error("no LUKS header at the start of the disk")]
    NotLuks,
    #[error("no keyslot opens with this passphrase")]
    WrongPassphrase,
    #[error("the LUKS2 header is not valid: {0}")]
    Invalid(String),
    /// A header copy's magic is where one may be, but no copy is whole.
    #[error("the LUKS2 header is damaged (both copies): {0}")]
    Damaged(String),
    #[error("blobdrive does not serve {0}")]
    Unsupported(String),
    #[error("{0}")]
    TooCostly(String),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Io(String),
}

/// The disk a header lives on: a blob's, or a file or memory in tests. Offsets
/// and lengths are whole 512-byte pages.
#[allow(async_fn_in_trait)]
pub trait HeaderDisk {
    /// `len` bytes from `offset`.
    async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, LuksError>;
    /// Writes `data` at `offset`.
    async fn write(&self, offset: u64, data: Vec<u8>) -> Result<(), LuksError>;
    /// Makes `[offset, offset + len)` read as zeros (Clear Pages, on a blob).
    async fn clear(&self, offset: u64, len: u64) -> Result<(), LuksError>;
}

/// A disk in memory, for tests (here and of the layers above).
#[derive(Debug, Default)]
pub struct MemDisk {
    pub bytes: std::sync::Mutex<Vec<u8>>,
}

impl MemDisk {
    pub fn new(size: usize) -> MemDisk {
        MemDisk {
            bytes: std::sync::Mutex::new(vec![0; size]),
        }
    }

    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>, LuksError> {
        let size = self.bytes.lock().expect("not poisoned").len();
        let start = offset as usize;
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(start..end),
            _ => Err(LuksError::Io(format!(
                "{offset}+{len} is past the end ({size})"
            ))),
        }
    }
}

impl HeaderDisk for MemDisk {
    async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, LuksError> {
        let r = self.range(offset, len)?;
        Ok(self.bytes.lock().expect("not poisoned")[r].to_vec())
    }
    async fn write(&self, offset: u64, data: Vec<u8>) -> Result<(), LuksError> {
        let r = self.range(offset, data.len())?;
        self.bytes.lock().expect("not poisoned")[r].copy_from_slice(&data);
        Ok(())
    }
    async fn clear(&self, offset: u64, len: u64) -> Result<(), LuksError> {
        let r = self.range(offset, len as usize)?;
        self.bytes.lock().expect("not poisoned")[r].fill(0);
        Ok(())
    }
}
