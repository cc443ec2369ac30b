//! The hashes and key derivations a LUKS2 header names: the passphrase through
//! Argon2id (or Argon2i) or PBKDF2 into a keyslot's key, and PBKDF2 of the
//! volume key into the digest that tells a right passphrase from a wrong one.
//!
//! Parameters come from the header, which is as hostile as anything read from
//! the network: [`Kdf::check_bounds`] refuses work no node should be asked to
//! do before any of it is done.

use argon2::{Algorithm, Argon2, Params, Version};
use sha2::{Digest as _, Sha256, Sha512};

use super::secret::Secret;
use super::LuksError;

/// A hash a header names (for its checksum, its anti-forensic diffusion, its
/// digests and PBKDF2): cryptsetup's default, SHA-256, and SHA-512.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    pub fn parse(name: &str) -> Result<Hash, LuksError> {
        match name {
            "sha256" => Ok(Hash::Sha256),
            "sha512" => Ok(Hash::Sha512),
            other => Err(LuksError::Unsupported(format!(
                "the hash {other:?} (blobdrive knows sha256 and sha512)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha256 => "sha256",
            Hash::Sha512 => "sha512",
        }
    }

    /// Bytes of its output.
    pub fn output_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha512 => 64,
        }
    }

    /// The hash of the concatenation of `parts`.
    pub fn of(self, parts: &[&[u8]]) -> Vec<u8> {
        match self {
            Hash::Sha256 => {
                let mut h = Sha256::new();
                parts.iter().for_each(|p| h.update(p));
                h.finalize().to_vec()
            }
            Hash::Sha512 => {
                let mut h = Sha512::new();
                parts.iter().for_each(|p| h.update(p));
                h.finalize().to_vec()
            }
        }
    }

    /// PBKDF2-HMAC of `secret` with `salt` into `out`.
    pub fn pbkdf2(self, secret: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        match self {
            Hash::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(secret, salt, iterations, out),
            Hash::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(secret, salt, iterations, out),
        }
    }
}

/// The most memory an Argon2 keyslot may ask for: cryptsetup's own default
/// ceiling (it never picks more than 1 GiB, nor more than half the machine's
/// memory). A header asking for more is refused before any is taken: the
/// worker would be killed for it on a node with memory limits, and whoever can
/// write the blob could make every mount of it try.
pub const MAX_ARGON2_MEMORY_KIB: u32 = 1024 * 1024;
/// The most Argon2 passes a keyslot may ask for; cryptsetup's calibration
/// stays far below it.
pub const MAX_ARGON2_TIME: u32 = 1000;
/// The most Argon2 lanes (cryptsetup allows at most 16 threads).
pub const MAX_ARGON2_LANES: u32 = 16;
/// The most PBKDF2 iterations a keyslot or digest may ask for: cryptsetup
/// keeps the count in a signed 32-bit integer.
pub const MAX_PBKDF2_ITERATIONS: u32 = i32::MAX as u32;

/// How a keyslot's key is derived from the passphrase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kdf {
    Pbkdf2 {
        hash: Hash,
        iterations: u32,
        salt: Vec<u8>,
    },
    Argon2 {
        /// Argon2id, or Argon2i.
        id: bool,
        /// Passes over the memory (cryptsetup's "time").
        time: u32,
        /// KiB of memory.
        memory_kib: u32,
        /// Lanes (cryptsetup's "cpus").
        lanes: u32,
        salt: Vec<u8>,
    },
}

impl Kdf {
    /// The header's name for it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Kdf::Pbkdf2 { .. } => "pbkdf2",
            Kdf::Argon2 { id: true, .. } => "argon2id",
            Kdf::Argon2 { id: false, .. } => "argon2i",
        }
    }

    /// Refuses parameters past what any node is asked to afford, and those
    /// the algorithms themselves refuse.
    pub fn check_bounds(&self) -> Result<(), LuksError> {
        match self {
            Kdf::Pbkdf2 { iterations, .. } => {
                if *iterations == 0 || *iterations > MAX_PBKDF2_ITERATIONS {
                    return Err(LuksError::Invalid(format!(
                        "a keyslot asks for {iterations} PBKDF2 iterations"
                    )));
                }
            }
            Kdf::Argon2 {
                time,
                memory_kib,
                lanes,
                ..
            } => {
                if *memory_kib > MAX_ARGON2_MEMORY_KIB {
                    return Err(LuksError::TooCostly(format!(
                        "a keyslot asks for {} MiB of memory for Argon2, more than the {} MiB blobdrive allows (cryptsetup's own ceiling); add a keyslot with less (cryptsetup luksAddKey --pbkdf-memory) and use that passphrase",
                        memory_kib / 1024,
                        MAX_ARGON2_MEMORY_KIB / 1024
                    )));
                }
                if *time == 0 || *time > MAX_ARGON2_TIME {
                    return Err(LuksError::TooCostly(format!(
                        "a keyslot asks for {time} Argon2 passes (at most {MAX_ARGON2_TIME})"
                    )));
                }
                if *lanes == 0 || *lanes > MAX_ARGON2_LANES {
                    return Err(LuksError::Invalid(format!(
                        "a keyslot asks for {lanes} Argon2 lanes (1 to {MAX_ARGON2_LANES})"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The keyslot's key: `len` bytes derived from `passphrase`.
    pub fn derive(&self, passphrase: &[u8], len: usize) -> Result<Secret, LuksError> {
        self.check_bounds()?;
        let mut key = Secret::zeroed(len);
        match self {
            Kdf::Pbkdf2 {
                hash,
                iterations,
                salt,
            } => hash.pbkdf2(passphrase, salt, *iterations, key.bytes_mut()),
            Kdf::Argon2 {
                id,
                time,
                memory_kib,
                lanes,
                salt,
            } => {
                let params = Params::new(*memory_kib, *time, *lanes, Some(len))
                    .map_err(|e| LuksError::Invalid(format!("Argon2 parameters: {e}")))?;
                let algorithm = if *id {
                    Algorithm::Argon2id
                } else {
                    Algorithm::Argon2i
                };
                Argon2::new(algorithm, Version::V0x13, params)
                    .hash_password_into(passphrase, salt, key.bytes_mut())
                    .map_err(|e| match e {
                        argon2::Error::MemoryTooLittle | argon2::Error::MemoryTooMuch => {
                            LuksError::TooCostly(format!("Argon2: {e}"))
                        }
                        _ => LuksError::Invalid(format!("Argon2: {e}")),
                    })?;
            }
        }
        Ok(key)
    }
}

/// The digest of a volume key: PBKDF2 of it, as long as the hash's output.
pub fn digest_of(key: &[u8], hash: Hash, salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = vec![0u8; hash.output_len()];
    hash.pbkdf2(key, salt, iterations, &mut out);
    out
}

/// Whether two byte strings are equal, in time that does not depend on where
/// they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pbkdf2_sha256_matches_rfc_7914() {
        // RFC 7914 section 11: PBKDF2-HMAC-SHA256 (P="passwd", S="salt", c=1).
        let mut out = [0u8; 64];
        Hash::Sha256.pbkdf2(b"passwd", b"salt", 1, &mut out);
        assert_eq!(hex(&out[..16]), "55ac046e56e3089fec1691c22544b605");
    }

    #[test]
    fn argon2i_matches_the_reference_implementations_example() {
        // The example of the reference implementation's README (Argon2i,
        // version 1.3, no secret and no associated data, as LUKS2 uses it):
        // `echo -n password | argon2 somesalt -t 2 -m 16 -p 4 -l 24`.
        let kdf = Kdf::Argon2 {
            id: false,
            time: 2,
            memory_kib: 1 << 16,
            lanes: 4,
            salt: b"somesalt".to_vec(),
        };
        let key = kdf.derive(b"password", 24).unwrap();
        assert_eq!(
            hex(key.as_bytes()),
            "45d7ac72e76f242b20b77b9bf9bf9d5915894e669a24e6c6"
        );
    }

    #[test]
    fn costly_parameters_are_refused_before_any_work() {
        let kdf = Kdf::Argon2 {
            id: true,
            time: 4,
            memory_kib: 4 * 1024 * 1024,
            lanes: 4,
            salt: vec![0; 32],
        };
        let e = kdf.derive(b"x", 64).unwrap_err();
        assert!(matches!(e, LuksError::TooCostly(_)), "{e}");
        assert!(e.to_string().contains("4096 MiB"), "{e}");
        let kdf = Kdf::Pbkdf2 {
            hash: Hash::Sha256,
            iterations: 0,
            salt: vec![0; 32],
        };
        assert!(kdf.derive(b"x", 64).is_err());
    }

    #[test]
    fn equal_compares_whole_strings() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
