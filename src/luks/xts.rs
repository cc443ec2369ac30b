//! aes-xts-plain64, the cipher of LUKS2's keyslot areas and data segments,
//! over RustCrypto's `aes`.
//!
//! plain64 makes a sector's tweak its number (in 512-byte units, as cryptsetup
//! counts for LUKS2 at every sector size, plus the segment's `iv_tweak`),
//! little-endian in 16 bytes. XTS encrypts each 16-byte block of a sector with
//! a tweak of its own, derived from the sector's and the block's place in it,
//! so a piece of a sector (a 512-byte page of a 4096-byte sector) is encrypted
//! or decrypted alone by running the whole sector through a scratch copy and
//! keeping the piece: no read of the rest of the sector is needed.
//!
//! The mode is the few lines of XTS (a tweak per block, doubled in GF(2^128)
//! from one block to the next, XORed before and after the block cipher) around
//! `aes`'s `encrypt_blocks`, which keeps eight blocks in flight through AES-NI:
//! 3.2-6.4 GiB/s on the project's machine, where the `xts-mode` crate, which
//! hands the cipher one block at a time, ran 400-560 MiB/s, below what the
//! drive itself carries (700 MiB/s written, 1.1 GiB/s read). `xts-mode` is the
//! oracle the tests hold this to, with IEEE 1619's vectors and OpenSSL's answers.
//!
//! The ciphers (with their round keys) live in locked memory and are wiped when
//! dropped (`aes`'s `zeroize` feature wipes the round keys itself too).

use aes::cipher::consts::U16;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::inout::InOutBuf;
use aes::cipher::{BlockDecrypt, BlockEncrypt, BlockSizeUser, KeyInit};
use aes::{Aes128, Aes256};
use zeroize::Zeroize;

use super::secret::Locked;
use super::LuksError;

/// Bytes in the unit the tweak counts, and in a blob's page.
pub const IV_UNIT: u64 = 512;
/// The largest sector size LUKS2 allows.
pub const MAX_SECTOR: usize = 4096;

/// The data key's cipher and the tweak key's, for either key size (in locked
/// pages of their own, so the sizes' difference costs nothing).
#[allow(clippy::large_enum_variant)]
enum Xts {
    Aes128(Aes128, Aes128),
    Aes256(Aes256, Aes256),
}

/// aes-xts-plain64 over a segment (or a keyslot area) of some sector size.
pub struct XtsCipher {
    xts: Locked<Xts>,
    sector: usize,
    iv_tweak: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    Encrypt,
    Decrypt,
    /// Decrypts, but leaves every all-zero 512-byte page as zeros.
    DecryptData,
}

impl XtsCipher {
    /// The cipher for `key` (32 bytes: AES-128-XTS; 64: AES-256-XTS), sectors of
    /// `sector` bytes, tweaks counted from `iv_tweak`.
    pub fn new(key: &[u8], sector: usize, iv_tweak: u64) -> Result<XtsCipher, LuksError> {
        if !matches!(sector, 512 | 1024 | 2048 | 4096) {
            return Err(LuksError::Invalid(format!(
                "a sector size of {sector} bytes"
            )));
        }
        let half = key.len() / 2;
        let xts = match key.len() {
            32 => Locked::new(Xts::Aes128(
                Aes128::new(GenericArray::from_slice(&key[..half])),
                Aes128::new(GenericArray::from_slice(&key[half..])),
            )),
            64 => Locked::new(Xts::Aes256(
                Aes256::new(GenericArray::from_slice(&key[..half])),
                Aes256::new(GenericArray::from_slice(&key[half..])),
            )),
            n => {
                return Err(LuksError::Unsupported(format!(
                    "aes-xts-plain64 with a {}-bit key (blobdrive knows 256 and 512)",
                    n * 8
                )))
            }
        };
        Ok(XtsCipher {
            xts,
            sector,
            iv_tweak,
        })
    }

    pub fn sector_size(&self) -> usize {
        self.sector
    }

    /// Encrypts `buf`, which lies `at` bytes into the segment (both multiples
    /// of 512), in place.
    pub fn encrypt(&self, at: u64, buf: &mut [u8]) {
        self.apply(at, buf, Way::Encrypt);
    }

    /// Decrypts `buf` (see [`Self::encrypt`]) in place, every byte of it (a
    /// keyslot area).
    pub fn decrypt(&self, at: u64, buf: &mut [u8]) {
        self.apply(at, buf, Way::Decrypt);
    }

    /// Decrypts the data segment's `buf` in place, leaving each 512-byte page
    /// that is all zeros as it is: a page the blob never held (a hole) reads as
    /// zeros, as on a drive that is not encrypted, and is not decrypted into
    /// noise. (A written page's ciphertext is all zeros with a chance of one in
    /// 2^4096.)
    pub fn decrypt_data(&self, at: u64, buf: &mut [u8]) {
        self.apply(at, buf, Way::DecryptData);
    }

    fn tweak(&self, sector_start: u64) -> [u8; 16] {
        ((sector_start / IV_UNIT + self.iv_tweak) as u128).to_le_bytes()
    }

    fn apply(&self, at: u64, buf: &mut [u8], way: Way) {
        assert!(
            at.is_multiple_of(IV_UNIT) && (buf.len() as u64).is_multiple_of(IV_UNIT),
            "aes-xts-plain64 on {}+{}: not whole 512-byte pages",
            at,
            buf.len()
        );
        let ss = self.sector as u64;
        let mut pos = 0;
        while pos < buf.len() {
            let abs = at + pos as u64;
            let start = abs / ss * ss;
            let within = (abs - start) as usize;
            let n = (self.sector - within).min(buf.len() - pos);
            let piece = &mut buf[pos..pos + n];
            let tweak = self.tweak(start);
            let zeros = if way == Way::DecryptData {
                zero_pages(piece)
            } else {
                0
            };
            let whole_pages = (n as u64 / IV_UNIT) as u32;
            if zeros != 0 && zeros.count_ones() == whole_pages {
                // A hole: nothing to decrypt.
            } else if within == 0 && n == self.sector && zeros == 0 {
                self.sector_op(piece, tweak, way);
            } else {
                self.through_scratch(piece, within, tweak, way, zeros);
            }
            pos += n;
        }
    }

    /// A piece of a sector, or a sector with holes: the whole sector goes
    /// through a scratch copy, and the piece (less its holes) is copied back.
    fn through_scratch(
        &self,
        piece: &mut [u8],
        within: usize,
        tweak: [u8; 16],
        way: Way,
        zeros: u64,
    ) {
        let mut scratch = [0u8; MAX_SECTOR];
        let sector = &mut scratch[..self.sector];
        sector[within..within + piece.len()].copy_from_slice(piece);
        self.sector_op(sector, tweak, way);
        for (i, page) in piece.chunks_mut(IV_UNIT as usize).enumerate() {
            if zeros & (1 << i) == 0 {
                let from = within + i * IV_UNIT as usize;
                page.copy_from_slice(&sector[from..from + page.len()]);
            }
        }
        scratch.zeroize();
    }

    fn sector_op(&self, sector: &mut [u8], tweak: [u8; 16], way: Way) {
        let encrypt = way == Way::Encrypt;
        match &*self.xts {
            Xts::Aes128(data, t) => xts_sector(data, t, sector, tweak, encrypt),
            Xts::Aes256(data, t) => xts_sector(data, t, sector, tweak, encrypt),
        }
    }
}

/// Blocks handed to the cipher at once: a 512-byte page.
const BATCH: usize = 32;

/// XTS over one sector (a whole number of 16-byte blocks: no stealing, which
/// LUKS2's sector sizes never need).
fn xts_sector<C: BlockEncrypt + BlockDecrypt + BlockSizeUser<BlockSize = U16>>(
    data: &C,
    tweak_cipher: &C,
    sector: &mut [u8],
    iv: [u8; 16],
    encrypt: bool,
) {
    let mut t = GenericArray::from(iv);
    tweak_cipher.encrypt_block(&mut t);
    let mut tweak = u128::from_le_bytes(t.into());
    let mut tweaks = [0u128; BATCH];
    for batch in sector.chunks_mut(16 * BATCH) {
        let n = batch.len() / 16;
        for (i, block) in batch.chunks_exact_mut(16).enumerate() {
            tweaks[i] = tweak;
            xor_block(block, tweak);
            tweak = double(tweak);
        }
        let (blocks, _) = InOutBuf::from(&mut batch[..]).into_chunks();
        if encrypt {
            data.encrypt_blocks_inout(blocks);
        } else {
            data.decrypt_blocks_inout(blocks);
        }
        for (block, t) in batch.chunks_exact_mut(16).zip(&tweaks[..n]) {
            xor_block(block, *t);
        }
    }
}

/// The next block's tweak: multiplication by x in GF(2^128), little-endian.
fn double(t: u128) -> u128 {
    (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 }
}

fn xor_block(block: &mut [u8], t: u128) {
    let b = u128::from_le_bytes(block.try_into().expect("16 bytes")) ^ t;
    block.copy_from_slice(&b.to_le_bytes());
}

/// A bit for each 512-byte page of `piece` (at most eight) that is all zeros.
fn zero_pages(piece: &[u8]) -> u64 {
    piece
        .chunks(IV_UNIT as usize)
        .enumerate()
        .filter(|(_, page)| is_zero(page))
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// Whether every byte of a page is zero; a page of data is told at its first
/// 16 bytes.
fn is_zero(page: &[u8]) -> bool {
    page.chunks(16)
        .all(|c| c.iter().fold(0u8, |m, &b| m | b) == 0)
}

#[cfg(test)]
mod tests;
