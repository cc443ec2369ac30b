//! The anti-forensic splitter (LUKS1's, which LUKS2 keyslots use as `"af":
//! {"type": "luks1"}`): a key is stored as `stripes` blocks of its length,
//! all but the last random, chained through a hash-based diffusion, so that
//! wiping any one block of the keyslot area destroys the key.

use rand::RngCore;

use super::kdf::Hash;
use super::secret::Secret;

/// The diffusion: each hash-length piece `i` of `block` becomes the hash of
/// the piece's index (4 bytes, big-endian) followed by the piece, the last
/// piece cut to what is left.
fn diffuse(block: &mut [u8], hash: Hash) {
    let n = hash.output_len();
    for (i, piece) in block.chunks_mut(n).enumerate() {
        let h = hash.of(&[&(i as u32).to_be_bytes(), piece]);
        let len = piece.len();
        piece.copy_from_slice(&h[..len]);
    }
}

/// `key` split into `stripes` blocks (`key.len() * stripes` bytes).
pub fn split(key: &[u8], stripes: usize, hash: Hash) -> Secret {
    let len = key.len();
    let mut out = Secret::zeroed(len * stripes);
    let mut d = Secret::zeroed(len);
    {
        let material = out.bytes_mut();
        rand::rngs::OsRng.fill_bytes(&mut material[..len * (stripes - 1)]);
        for stripe in material[..len * (stripes - 1)].chunks(len) {
            xor_into(d.bytes_mut(), stripe);
            diffuse(d.bytes_mut(), hash);
        }
        let last = &mut material[len * (stripes - 1)..];
        last.copy_from_slice(d.as_bytes());
        xor_into(last, key);
    }
    out
}

/// The key `material` (`stripes` blocks of `len` bytes) was split from.
pub fn merge(material: &[u8], len: usize, stripes: usize, hash: Hash) -> Secret {
    let mut d = Secret::zeroed(len);
    for stripe in material[..len * (stripes - 1)].chunks(len) {
        xor_into(d.bytes_mut(), stripe);
        diffuse(d.bytes_mut(), hash);
    }
    xor_into(d.bytes_mut(), &material[len * (stripes - 1)..len * stripes]);
    d
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    dst.iter_mut().zip(src).for_each(|(d, s)| *d ^= s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_undoes_split_and_any_stripe_destroys_the_key() {
        let key: Vec<u8> = (0..64).collect();
        let material = split(&key, 4000, Hash::Sha256);
        assert_eq!(material.len(), 64 * 4000);
        assert_eq!(
            merge(material.as_bytes(), 64, 4000, Hash::Sha256).as_bytes(),
            &key[..]
        );
        let mut damaged = material.as_bytes().to_vec();
        damaged[64 * 17 + 3] ^= 1;
        assert_ne!(merge(&damaged, 64, 4000, Hash::Sha256).as_bytes(), &key[..]);
        // Two splits of one key differ (the stripes are random).
        assert_ne!(
            split(&key, 4000, Hash::Sha256).as_bytes(),
            material.as_bytes()
        );
    }

    #[test]
    fn diffusion_hashes_each_piece_with_its_index() {
        // A 40-byte block under SHA-256: a 32-byte piece and an 8-byte one.
        let mut block = [7u8; 40];
        diffuse(&mut block, Hash::Sha256);
        let first = Hash::Sha256.of(&[&0u32.to_be_bytes(), &[7u8; 32]]);
        let second = Hash::Sha256.of(&[&1u32.to_be_bytes(), &[7u8; 8]]);
        assert_eq!(&block[..32], &first[..]);
        assert_eq!(&block[32..], &second[..8]);
    }
}
