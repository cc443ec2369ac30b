//! A LUKS2 volume: formatted, unlocked with a passphrase, and its passphrases
//! added, removed and changed, each as cryptsetup does it.
//!
//! A keyslot's area is written before the header that names it, and a
//! removed keyslot's area is cleared only after the header that drops it: a
//! stop between the two leaves a header whose every keyslot is whole.

use rand::RngCore;

use super::binary::Binary;
use super::header::{self, Copy, Header};
use super::kdf::{digest_of, same, Hash, Kdf};
use super::metadata::{new_document, Config, DigestEntry, Keyslot, Segment, MAX_OBJECTS};
use super::secret::Secret;
use super::xts::XtsCipher;
use super::{af, HeaderDisk, LuksError, DEFAULT_DATA_OFFSET, DEFAULT_HDR_SIZE};

/// Bytes of the volume key: AES-256-XTS, cryptsetup's default.
pub const KEY_BYTES: usize = 64;
/// Anti-forensic stripes, the only number LUKS2 uses.
pub const STRIPES: u32 = 4000;
/// Keyslot areas are laid out in 4 KiB steps, as cryptsetup lays them.
const AREA_ALIGN: u64 = 4096;
/// PBKDF2 iterations of the volume key's digest. The key is 512 random bits, so
/// the count only slows a wrong passphrase's last step; cryptsetup calibrates
/// it to an eighth of a second, which is about this on current CPUs.
pub const DIGEST_ITERATIONS: u32 = 100_000;

/// How a new keyslot derives its key from the passphrase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdfChoice {
    /// Argon2id with `memory_kib` of memory, four passes and four lanes.
    Argon2id { memory_kib: u32 },
    /// PBKDF2-SHA256 with this many iterations.
    Pbkdf2 { iterations: u32 },
}

/// Argon2id's memory unless told otherwise: 64 MiB, RFC 9106's recommended
/// choice where memory is scarce (with three passes there; four here, the
/// fewest cryptsetup itself allows). A node that stages many drives at once
/// runs one derivation per drive: cryptsetup's default of up to 1 GiB each
/// would not fit a node's memory limits, 64 MiB does.
pub const DEFAULT_ARGON2_MEMORY_KIB: u32 = 64 * 1024;
/// Argon2id's passes.
pub const ARGON2_TIME: u32 = 4;
/// Argon2id's lanes (cryptsetup's default thread count).
pub const ARGON2_LANES: u32 = 4;
/// PBKDF2's iterations when chosen: OWASP's figure for PBKDF2-HMAC-SHA256
/// (600,000) rounded up.
pub const DEFAULT_PBKDF2_ITERATIONS: u32 = 1_000_000;

impl Default for KdfChoice {
    fn default() -> KdfChoice {
        KdfChoice::Argon2id {
            memory_kib: DEFAULT_ARGON2_MEMORY_KIB,
        }
    }
}

impl KdfChoice {
    fn with_salt(self) -> Kdf {
        let mut salt = vec![0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        match self {
            KdfChoice::Argon2id { memory_kib } => Kdf::Argon2 {
                id: true,
                time: ARGON2_TIME,
                memory_kib,
                lanes: ARGON2_LANES,
                salt,
            },
            KdfChoice::Pbkdf2 { iterations } => Kdf::Pbkdf2 {
                hash: Hash::Sha256,
                iterations,
                salt,
            },
        }
    }
}

/// A volume opened with a passphrase.
pub struct Unlocked {
    pub key: Secret,
    pub segment: Segment,
    /// The keyslot the passphrase opened.
    pub keyslot: u32,
    pub header: Header,
}

impl std::fmt::Debug for Unlocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unlocked")
            .field("segment", &self.segment)
            .field("keyslot", &self.keyslot)
            .finish_non_exhaustive()
    }
}

impl Unlocked {
    /// The data segment's cipher.
    pub fn cipher(&self) -> Result<XtsCipher, LuksError> {
        XtsCipher::new(
            self.key.as_bytes(),
            self.segment.sector_size as usize,
            self.segment.iv_tweak,
        )
    }
}

/// Formats a new volume at the start of `disk`: cryptsetup's default layout
/// (two 16 KiB header copies, keyslots up to 16 MiB, data after), a random
/// 512-bit volume key in keyslot 0 under `passphrase`.
pub async fn format<D: HeaderDisk>(
    disk: &D,
    passphrase: &[u8],
    sector_size: u32,
    kdf: KdfChoice,
) -> Result<Unlocked, LuksError> {
    let mut key = Secret::zeroed(KEY_BYTES);
    rand::rngs::OsRng.fill_bytes(key.bytes_mut());
    let hdr_size = DEFAULT_HDR_SIZE;
    let config = Config {
        json_size: hdr_size - super::binary::BINARY_SIZE as u64,
        keyslots_size: DEFAULT_DATA_OFFSET - 2 * hdr_size,
    };
    let segment = Segment {
        offset: DEFAULT_DATA_OFFSET,
        sector_size,
        iv_tweak: 0,
    };
    let (slot, area) = new_keyslot(0, 2 * hdr_size, key.as_bytes(), passphrase, kdf)?;
    let mut digest = DigestEntry {
        id: 0,
        keyslots: vec![0],
        segments: vec![0],
        hash: Hash::Sha256,
        iterations: DIGEST_ITERATIONS,
        salt: vec![0; 32],
        digest: Vec::new(),
    };
    rand::rngs::OsRng.fill_bytes(&mut digest.salt);
    digest.digest = digest_of(key.as_bytes(), digest.hash, &digest.salt, digest.iterations);
    let metadata = new_document(&slot, &segment, &digest, config);
    disk.write(slot.area_offset, area).await?;
    let mut h = Header {
        binary: Binary {
            hdr_size,
            seqid: 0,
            label: [0; 48],
            checksum: Hash::Sha256,
            salt: [0; 64],
            uuid: uuid::Uuid::new_v4().to_string(),
            subsystem: [0; 48],
            hdr_offset: 0,
        },
        metadata: metadata.clone(),
        used: Copy::First,
        other_bad: None,
    };
    header::write(disk, &mut h, metadata).await?;
    Ok(Unlocked {
        key,
        segment,
        keyslot: 0,
        header: h,
    })
}

/// A keyslot holding `key` under `passphrase`, and its area's bytes.
fn new_keyslot(
    id: u32,
    area_offset: u64,
    key: &[u8],
    passphrase: &[u8],
    kdf: KdfChoice,
) -> Result<(Keyslot, Vec<u8>), LuksError> {
    let slot = Keyslot {
        id,
        key_size: key.len(),
        stripes: STRIPES,
        af_hash: Hash::Sha256,
        area_offset,
        area_size: area_size(key.len()),
        area_key_size: KEY_BYTES,
        kdf: kdf.with_salt(),
        priority: 1,
    };
    let slot_key = slot.kdf.derive(passphrase, slot.area_key_size)?;
    // The split key is encrypted where it was made, in locked memory; only
    // the ciphertext leaves it.
    let mut material = af::split(key, STRIPES as usize, slot.af_hash);
    XtsCipher::new(slot_key.as_bytes(), 512, 0)?.encrypt(0, material.bytes_mut());
    let mut area = vec![0u8; slot.area_size as usize];
    area[..material.len()].copy_from_slice(material.as_bytes());
    Ok((slot, area))
}

/// The area a key of `key_len` bytes needs: its stripes, in 4 KiB steps.
fn area_size(key_len: usize) -> u64 {
    (key_len as u64 * u64::from(STRIPES)).next_multiple_of(AREA_ALIGN)
}

/// Opens the volume: the first keyslot (high priority first, never one of
/// priority 0) whose key `passphrase` opens and the digest confirms.
pub async fn unlock<D: HeaderDisk>(disk: &D, passphrase: &[u8]) -> Result<Unlocked, LuksError> {
    let h = header::read(disk).await?;
    unlock_header(disk, h, passphrase).await
}

/// Opens the volume again, keeping the volume key `earlier` holds when the
/// header on `disk` is still the one `earlier` was opened from: no key
/// derivation then (seconds of CPU and up to a GiB of memory for Argon2id),
/// only the header read. A header rewritten since (a keyslot added, removed
/// or changed meanwhile, by this host or another) is opened anew with
/// `passphrase`, as [`unlock`] opens it, so a passphrase removed meanwhile
/// opens nothing. Also says whether the earlier key was kept.
pub async fn reopen<D: HeaderDisk>(
    disk: &D,
    passphrase: &[u8],
    earlier: Option<Unlocked>,
) -> Result<(Unlocked, bool), LuksError> {
    let h = header::read(disk).await?;
    match earlier {
        Some(e) if h.same_version(&e.header) => Ok((Unlocked { header: h, ..e }, true)),
        _ => Ok((unlock_header(disk, h, passphrase).await?, false)),
    }
}

/// Opens the volume whose header `h` was read from `disk`.
async fn unlock_header<D: HeaderDisk>(
    disk: &D,
    h: Header,
    passphrase: &[u8],
) -> Result<Unlocked, LuksError> {
    h.metadata.check_requirements()?;
    let segment = h.metadata.segment()?;
    let mut slots = h.metadata.keyslots()?;
    slots.retain(|k| k.priority > 0);
    slots.sort_by_key(|k| std::cmp::Reverse(k.priority));
    let digests = h.metadata.digests()?;
    for k in slots {
        let Some(d) = digests
            .iter()
            .find(|d| d.keyslots.contains(&k.id) && d.segments.contains(&0))
        else {
            continue;
        };
        if let Some(key) = open_keyslot(disk, &k, d, passphrase).await? {
            return Ok(Unlocked {
                key,
                segment,
                keyslot: k.id,
                header: h,
            });
        }
    }
    Err(LuksError::WrongPassphrase)
}

/// The volume key keyslot `k` holds, if `passphrase` opens it.
async fn open_keyslot<D: HeaderDisk>(
    disk: &D,
    k: &Keyslot,
    d: &DigestEntry,
    passphrase: &[u8],
) -> Result<Option<Secret>, LuksError> {
    let len = k.key_size * k.stripes as usize;
    let mut area = Secret::from_slice(&disk.read(k.area_offset, len.next_multiple_of(512)).await?);
    let slot_key = k.kdf.derive(passphrase, k.area_key_size)?;
    XtsCipher::new(slot_key.as_bytes(), 512, 0)?.decrypt(0, area.bytes_mut());
    let key = af::merge(area.as_bytes(), k.key_size, k.stripes as usize, k.af_hash);
    let check = digest_of(key.as_bytes(), d.hash, &d.salt, d.iterations);
    Ok(same(&check, &d.digest).then_some(key))
}

/// Adds a keyslot for `new` to the volume `existing` opens; its id.
pub async fn add_key<D: HeaderDisk>(
    disk: &D,
    existing: &[u8],
    new: &[u8],
    kdf: KdfChoice,
) -> Result<u32, LuksError> {
    let mut u = unlock(disk, existing).await?;
    let taken = u.header.metadata.keyslots()?;
    let id = (0..MAX_OBJECTS)
        .find(|i| taken.iter().all(|k| k.id != *i))
        .ok_or_else(|| LuksError::Refused(format!("all {MAX_OBJECTS} keyslots are in use")))?;
    put_keyslot(disk, &mut u, &taken, (id, 1), new, kdf).await?;
    Ok(id)
}

/// Removes the keyslot `passphrase` opens (never the last); its id.
pub async fn remove_key<D: HeaderDisk>(disk: &D, passphrase: &[u8]) -> Result<u32, LuksError> {
    let mut u = unlock(disk, passphrase).await?;
    let slots = u.header.metadata.keyslots()?;
    if slots.len() <= 1 {
        return Err(LuksError::Refused(
            "this passphrase opens the only keyslot: removing it would leave no way into the data (add another first)".into(),
        ));
    }
    let gone = slots
        .iter()
        .find(|k| k.id == u.keyslot)
        .expect("the keyslot that opened")
        .clone();
    let mut m = u.header.metadata.clone();
    m.remove_keyslot(gone.id)?;
    header::write(disk, &mut u.header, m).await?;
    disk.clear(gone.area_offset, gone.area_size).await?;
    Ok(gone.id)
}

/// Puts `new` in place of the passphrase `old` (the same keyslot id, a new
/// area: the header switches from one to the other at once); the id.
pub async fn change_key<D: HeaderDisk>(
    disk: &D,
    old: &[u8],
    new: &[u8],
    kdf: KdfChoice,
) -> Result<u32, LuksError> {
    let mut u = unlock(disk, old).await?;
    let slots = u.header.metadata.keyslots()?;
    let was = slots
        .iter()
        .find(|k| k.id == u.keyslot)
        .expect("the keyslot that opened")
        .clone();
    put_keyslot(disk, &mut u, &slots, (was.id, was.priority), new, kdf).await?;
    disk.clear(was.area_offset, was.area_size).await?;
    Ok(was.id)
}

/// Writes a keyslot holding `u`'s volume key under `new`, with the id and
/// priority `(id, priority)`, in the first free place of the keyslots area
/// (`taken` holds the header's keyslots): its area first, then the header
/// naming it (in place of a keyslot of that id, if there is one).
async fn put_keyslot<D: HeaderDisk>(
    disk: &D,
    u: &mut Unlocked,
    taken: &[Keyslot],
    (id, priority): (u32, u32),
    new: &[u8],
    kdf: KdfChoice,
) -> Result<(), LuksError> {
    let at = free_area(&u.header, taken)?;
    let (mut slot, area) = new_keyslot(id, at, u.key.as_bytes(), new, kdf)?;
    slot.priority = priority;
    disk.write(at, area).await?;
    let mut m = u.header.metadata.clone();
    m.put_keyslot(&slot, digest_for(u)?)?;
    header::write(disk, &mut u.header, m).await
}

/// The digest that vouches for the data segment.
fn digest_for(u: &Unlocked) -> Result<u32, LuksError> {
    u.header
        .metadata
        .digests()?
        .iter()
        .find(|d| d.segments.contains(&0) && d.keyslots.contains(&u.keyslot))
        .map(|d| d.id)
        .ok_or_else(|| LuksError::Invalid("no digest for the data segment".into()))
}

/// The first place in the keyslots area where a new keyslot's area fits.
fn free_area(h: &Header, taken: &[Keyslot]) -> Result<u64, LuksError> {
    let need = area_size(KEY_BYTES);
    let start = 2 * h.binary.hdr_size;
    let end = start + h.metadata.config()?.keyslots_size;
    let mut used: Vec<(u64, u64)> = taken
        .iter()
        .map(|k| (k.area_offset, k.area_offset + k.area_size))
        .collect();
    used.sort_unstable();
    let mut at = start;
    for (s, e) in used {
        if at + need <= s {
            break;
        }
        at = at.max(e.next_multiple_of(AREA_ALIGN));
    }
    if at + need > end {
        return Err(LuksError::Refused(
            "the keyslots area has no room for another keyslot".into(),
        ));
    }
    Ok(at)
}

#[cfg(test)]
mod tests;
