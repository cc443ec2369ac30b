//! Client assertions for a service principal's certificate: a JWT signed RS256 with
//! the certificate's private key, carrying the certificate's SHA-1 thumbprint as
//! `x5t` so Entra ID knows which of the app's certificates to check it against.
//!
//! The certificate file is PEM holding the certificate and its unencrypted private
//! key (PKCS#8 or PKCS#1), the form the Azure SDKs take for
//! `AZURE_CLIENT_CERTIFICATE_PATH`. PKCS#12 (`.pfx`) and encrypted keys are
//! refused with the `openssl` command that converts them: reading them would need
//! a PKCS#12 and a PBES2 implementation for a case one command fixes.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;
use serde_json::json;
use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::jwt::b64url;

/// The largest client certificate file read (a certificate chain and its key
/// are a few KiB).
const CERTIFICATE_FILE_MAX: u64 = 1 << 20;

/// The client certificate file as read before this process was walled: a
/// mount's root part reads it while it may (the file is root's, 0600, and
/// Landlock keeps the worker out of its directory), and the worker, signing in
/// after, uses these bytes.
static READ_EARLY: std::sync::OnceLock<(PathBuf, std::io::Result<Vec<u8>>)> =
    std::sync::OnceLock::new();

/// Reads the file `AZURE_CLIENT_CERTIFICATE_PATH` names now, for a sign-in
/// later in a process that may no longer open it (see [`READ_EARLY`]).
pub fn read_certificate_early() {
    if let Some(path) = std::env::var_os("AZURE_CLIENT_CERTIFICATE_PATH") {
        let path = PathBuf::from(path);
        let bytes = read_bounded(&path);
        let _ = READ_EARLY.set((path, bytes));
    }
}

/// The bytes of the certificate file at `path`: as read early, if it was.
fn certificate_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    match READ_EARLY.get() {
        Some((p, Ok(bytes))) if p == path => Ok(bytes.clone()),
        Some((p, Err(e))) if p == path => Err(std::io::Error::new(e.kind(), e.to_string())),
        _ => read_bounded(path),
    }
}

/// Reads at most [`CERTIFICATE_FILE_MAX`] bytes of `path`.
fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(CERTIFICATE_FILE_MAX + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > CERTIFICATE_FILE_MAX {
        return Err(std::io::Error::other(format!(
            "larger than {} KiB",
            CERTIFICATE_FILE_MAX >> 10
        )));
    }
    Ok(bytes)
}

/// A certificate and its key, ready to sign assertions. `Debug` shows only the
/// file and the thumbprint.
pub struct CertificateKey {
    path: PathBuf,
    key: SigningKey<Sha256>,
    /// base64url of the SHA-1 of the certificate's DER.
    x5t: String,
}

impl fmt::Debug for CertificateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CertificateKey({}, x5t {}, <key redacted>)",
            self.path.display(),
            self.x5t
        )
    }
}

/// The PEM blocks of a file: (label, DER).
fn pem_blocks(text: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + 11..];
        let Some(label_end) = after.find("-----") else {
            break;
        };
        let label = after[..label_end].to_string();
        let body_start = &after[label_end + 5..];
        let end_marker = format!("-----END {label}-----");
        let Some(body_end) = body_start.find(&end_marker) else {
            break;
        };
        let b64: String = body_start[..body_end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b64) {
            out.push((label.clone(), der));
        }
        rest = &body_start[body_end + end_marker.len()..];
    }
    out
}

impl CertificateKey {
    /// Reads a PEM file with a certificate and its private key. Errors are one line
    /// naming the file and what to do.
    /// `password_given`: `AZURE_CLIENT_CERTIFICATE_PASSWORD` is set, which only a
    /// PKCS#12 file or an encrypted key would use; the refusals then say so.
    pub fn load(path: &Path, password_given: bool) -> Result<CertificateKey, String> {
        let shown = path.display();
        let password_note = if password_given {
            " (AZURE_CLIENT_CERTIFICATE_PASSWORD is not used: decrypt once with that command)"
        } else {
            ""
        };
        let bytes = certificate_bytes(path).map_err(|e| {
            format!("cannot read the client certificate AZURE_CLIENT_CERTIFICATE_PATH={shown}: {e}")
        })?;
        let text = String::from_utf8_lossy(&bytes);
        if !text.contains("-----BEGIN ") {
            return Err(format!(
                "the client certificate {shown} is not PEM (a PKCS#12/.pfx file?): blobdrive reads PEM holding the certificate and its unencrypted private key; convert it with `openssl pkcs12 -in {shown} -nodes -out cert.pem`{password_note}"
            ));
        }
        let blocks = pem_blocks(&text);
        let cert = blocks
            .iter()
            .find(|(l, _)| l == "CERTIFICATE")
            .map(|(_, der)| der)
            .ok_or_else(|| {
                format!("the client certificate file {shown} holds no CERTIFICATE block")
            })?;
        if blocks.iter().any(|(l, _)| l == "ENCRYPTED PRIVATE KEY") {
            return Err(format!(
                "the private key in {shown} is encrypted; blobdrive needs it unencrypted (file mode 0600): `openssl pkey -in {shown} -out key.pem`, then put it beside the certificate{password_note}"
            ));
        }
        let key = blocks
            .iter()
            .find_map(|(l, der)| match l.as_str() {
                "PRIVATE KEY" => Some(RsaPrivateKey::from_pkcs8_der(der).map_err(|e| e.to_string())),
                "RSA PRIVATE KEY" => {
                    Some(RsaPrivateKey::from_pkcs1_der(der).map_err(|e| e.to_string()))
                }
                _ => None,
            })
            .ok_or_else(|| {
                format!("the client certificate file {shown} holds no private key (PRIVATE KEY or RSA PRIVATE KEY block): put the key in the same PEM file")
            })?
            .map_err(|e| format!("the private key in {shown} is not an RSA key blobdrive can read ({e})"))?;
        Ok(CertificateKey {
            path: path.to_path_buf(),
            key: SigningKey::<Sha256>::new(key),
            x5t: b64url(&Sha1::digest(cert)),
        })
    }

    /// A fresh assertion for `client_id` to present at `token_url` (its audience),
    /// valid for 10 minutes.
    pub fn assertion(&self, client_id: &str, token_url: &str) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let header = json!({"alg": "RS256", "typ": "JWT", "x5t": self.x5t});
        let claims = json!({
            "aud": token_url,
            "iss": client_id,
            "sub": client_id,
            "jti": uuid::Uuid::new_v4().to_string(),
            "nbf": now,
            "iat": now,
            "exp": now + 600,
        });
        let signing_input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = self.key.sign(signing_input.as_bytes()).to_bytes();
        format!("{signing_input}.{}", b64url(&signature))
    }

    pub fn thumbprint(&self) -> &str {
        &self.x5t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_are_found_in_any_order() {
        let text = "junk\n-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nAwQ=\n-----END PRIVATE KEY-----\n";
        let b = pem_blocks(text);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0], ("CERTIFICATE".to_string(), vec![0, 1, 2]));
        assert_eq!(b[1], ("PRIVATE KEY".to_string(), vec![3, 4]));
    }

    #[test]
    fn pfx_and_missing_files_get_one_line_each() {
        let dir = tempfile::tempdir().unwrap();
        let pfx = dir.path().join("c.pfx");
        std::fs::write(&pfx, [0x30, 0x82, 0x01, 0x00, 0xff]).unwrap();
        let m = CertificateKey::load(&pfx, false).unwrap_err();
        assert!(m.contains("not PEM") && m.contains("openssl pkcs12"), "{m}");
        let m = CertificateKey::load(&pfx, true).unwrap_err();
        assert!(
            m.contains("AZURE_CLIENT_CERTIFICATE_PASSWORD is not used"),
            "{m}"
        );
        let m = CertificateKey::load(&dir.path().join("nope.pem"), false).unwrap_err();
        assert!(m.contains("cannot read the client certificate"), "{m}");
        let only_cert = dir.path().join("c.pem");
        std::fs::write(
            &only_cert,
            "-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let m = CertificateKey::load(&only_cert, false).unwrap_err();
        assert!(m.contains("holds no private key"), "{m}");
        assert!(!m.contains('\n'));
    }
}
