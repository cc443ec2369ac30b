//! An encrypted drive's state as any Linux host would read it: cryptsetup
//! reads the state's LUKS2 header and unlocks its keyslot with the passphrase
//! (the volume key, where the data segment starts and its sector size, all
//! from cryptsetup), and the xts-mode crate (RustCrypto's AES-XTS, not
//! blobdrive's) decrypts the data segment. A 512-byte page the blob does not
//! hold (never written, or cleared) stays zeros, as blobdrive serves it.
//!
//! cryptsetup runs once per distinct header: a state whose header is, byte for
//! byte, one cryptsetup has opened gives the same answers. (`cryptsetup open`
//! would map the state through dm-crypt, which this machine's kernel lacks, and
//! decrypt the pages the blob does not hold into noise.)

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockCipher, BlockDecrypt, BlockEncrypt, KeyInit};
use xts_mode::Xts128;

use super::image::Pieces;
use crate::common::luks::sector_size;
use crate::common::luks::PASSPHRASE;
use crate::common::luks::{cryptsetup_accepts, data_offset, decrypt_image, dump_volume_key};

/// The unit of LUKS2's tweak, and of what the blob holds or not.
const PAGE: usize = 512;

/// A header cryptsetup opened, and what it said.
struct Opened {
    /// The disk's bytes before the data segment: the header, its copy and the
    /// keyslots.
    header: Vec<u8>,
    key: Vec<u8>,
    sector: usize,
}

/// The headers opened so far.
#[derive(Default)]
pub struct Unsealer {
    opened: Mutex<Vec<Opened>>,
}

impl Unsealer {
    /// Writes the plaintext disk of `disk` (a state of an encrypted drive) to
    /// `image`, as a sparse file; `sealed` is where its ciphertext is written
    /// for cryptsetup when its header is new. The error: what cryptsetup
    /// could not do.
    pub fn write_plaintext(
        &self,
        disk: &Pieces,
        sealed: &Path,
        image: &Path,
    ) -> Result<(), String> {
        let mut opened = self.opened.lock().unwrap();
        let known = opened
            .iter()
            .position(|o| disk.read(0, o.header.len()) == o.header);
        let o = match known {
            Some(i) => &opened[i],
            None => {
                opened.push(open(disk, sealed)?);
                opened.last().unwrap()
            }
        };
        let offset = o.header.len();
        assert!(
            offset % Pieces::PIECE == 0,
            "the data segment starts at byte {offset}, inside a piece of the state"
        );
        let _ = std::fs::remove_file(image);
        let f = std::fs::File::create(image).unwrap();
        f.set_len((disk.len() - offset) as u64).unwrap();
        for (at, piece) in disk.written().filter(|(at, _)| *at as usize >= offset) {
            let at = at as usize - offset;
            let mut plain = piece.to_vec();
            decrypt(&o.key, o.sector, at, &mut plain);
            f.write_all_at(&plain, at as u64).unwrap();
        }
        Ok(())
    }
}

impl Unsealer {
    /// Holds this decryption to another of the same state `disk`: OpenSSL's
    /// AES-XTS with the volume key cryptsetup dumps (`decrypt_image`), its
    /// files in `dir`.
    pub fn assert_agrees_with_openssl(&self, disk: &Pieces, dir: &Path) {
        let (sealed, image) = (dir.join("sealed.img"), dir.join("plain.img"));
        self.write_plaintext(disk, &sealed, &image).unwrap();
        let ours = std::fs::read(&image).unwrap();
        super::fscheck::write_sparse(disk, &sealed);
        let theirs = decrypt_image(&sealed, disk.len() as u64);
        for f in [sealed, image] {
            std::fs::remove_file(f).unwrap();
        }
        assert!(
            ours == theirs,
            "the xts-mode crate and OpenSSL decrypt the drive differently with cryptsetup's volume key"
        );
    }
}

/// What cryptsetup says of the header of `disk`, written to `sealed` for it.
fn open(disk: &Pieces, sealed: &Path) -> Result<Opened, String> {
    super::fscheck::write_sparse(disk, sealed);
    if !cryptsetup_accepts(sealed, PASSPHRASE) {
        return Err("cryptsetup does not open its LUKS2 header with the passphrase".into());
    }
    let offset = data_offset(sealed) as usize;
    let opened = Opened {
        header: disk.read(0, offset),
        key: dump_volume_key(sealed, PASSPHRASE),
        sector: sector_size(sealed),
    };
    std::fs::remove_file(sealed).unwrap();
    Ok(opened)
}

/// Decrypts `buf`, whole sectors of `sector` bytes starting at byte `at` of
/// the data segment, with the volume key `key` (two AES keys: 256 or 512
/// bits in all); a 512-byte page all zeros stays so. LUKS2 counts the tweak
/// in 512-byte units whatever the sector size.
fn decrypt(key: &[u8], sector: usize, at: usize, buf: &mut [u8]) {
    match key.len() {
        32 => decrypt_with::<aes::Aes128>(key, sector, at, buf),
        64 => decrypt_with::<aes::Aes256>(key, sector, at, buf),
        n => panic!("a volume key of {n} bytes: not aes-xts-plain64's"),
    }
}

fn decrypt_with<C>(key: &[u8], sector: usize, at: usize, buf: &mut [u8])
where
    C: BlockCipher + BlockEncrypt + BlockDecrypt + KeyInit,
{
    let (a, b) = key.split_at(key.len() / 2);
    let xts = Xts128::new(
        C::new(GenericArray::from_slice(a)),
        C::new(GenericArray::from_slice(b)),
    );
    for (i, s) in buf.chunks_mut(sector).enumerate() {
        let holes: Vec<bool> = s.chunks(PAGE).map(|p| p.iter().all(|b| *b == 0)).collect();
        if holes.iter().all(|h| *h) {
            continue;
        }
        let tweak = ((at + i * sector) / PAGE) as u128;
        xts.decrypt_sector(s, tweak.to_le_bytes());
        for (page, _) in s.chunks_mut(PAGE).zip(&holes).filter(|(_, h)| **h) {
            page.fill(0);
        }
    }
}
