//! Credentials files (`credentials=FILE` in fstab, `--credentials FILE` on
//! `blobdrive mount`): `KEY=VALUE` lines that become the mount daemon's
//! environment, e.g. `AZURE_STORAGE_CONNECTION_STRING=...` or the Entra ID
//! variables (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, ...).
//!
//! The format is the one systemd's `EnvironmentFile=` reads (blank lines, `#` and
//! `;` comments, an optional `export `, values optionally in single or double
//! quotes), so one file serves fstab and a unit alike. Secrets are the point of
//! such a file, so it must be root's and unreadable by anyone else, and no error
//! ever quotes a line (only its number). Only the names in [`ALLOWED`] are taken.

use std::io::Read;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a credentials file was refused.
#[derive(Debug, Error)]
pub enum CredentialsError {
    #[error("cannot read the credentials file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("the credentials file {0} is not a regular file")]
    NotAFile(PathBuf),
    #[error("the credentials file {path} belongs to uid {uid}, not root: it holds secrets the daemon runs with, so only root may own it (chown root:root {path})")]
    NotRoot { path: PathBuf, uid: u32 },
    #[error("the credentials file {path} is readable or writable by group or others (mode {mode:04o}): it holds secrets; make it root's alone (chmod 600 {path})")]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("the credentials file {0}, line {1}: expected KEY=VALUE")]
    Syntax(PathBuf, usize),
    #[error("the credentials file {0}, line {1}: the text before '=' is not a valid environment variable name (letters, digits and _, not starting with a digit)")]
    BadName(PathBuf, usize),
    #[error("the credentials file {0}, line {1}: a name blobdrive does not take from a credentials file (it takes only {ALLOWED_LIST})")]
    NotAllowed(PathBuf, usize),
    #[error("the credentials file {0} is larger than {MAX_BYTES} bytes: not a credentials file")]
    TooLarge(PathBuf),
    #[error("the credentials file {0}, line {1}: the value of {2} has an unterminated quote")]
    Unterminated(PathBuf, usize, String),
    #[error("the credentials file {0} is not UTF-8 text")]
    NotText(PathBuf),
}

/// The names a credentials file may set: the account and sign-in variables
/// blobdrive reads, its own tuning, and where TLS roots are. Anything else
/// (`LD_PRELOAD`, `PATH`, `HTTPS_PROXY`, ...) would change how the root daemon
/// and the tools it runs behave, so it is refused.
pub const ALLOWED: &[&str] = &[
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_TENANT_ID",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_AUTHORITY_HOST",
    "AZURE_POD_IDENTITY_AUTHORITY_HOST",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "BLOBDRIVE_AUTH",
    "BLOBDRIVE_IDENTITY_CLIENT_ID",
    "BLOBDRIVE_IO_TIMEOUT_SECS",
    "BLOBDRIVE_RETRY_BUDGET_SECS",
    "BLOBDRIVE_REQUEST_TIMEOUT_SECS",
    "BLOBDRIVE_MAX_ATTEMPTS",
    "BLOBDRIVE_FREEZE_LIMIT_SECS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// [`ALLOWED`] as the error message says it.
const ALLOWED_LIST: &str = "AZURE_STORAGE_*, AZURE_TENANT_ID, AZURE_CLIENT_*, AZURE_FEDERATED_TOKEN_FILE, AZURE_AUTHORITY_HOST, AZURE_POD_IDENTITY_AUTHORITY_HOST, IDENTITY_ENDPOINT, IDENTITY_HEADER, BLOBDRIVE_AUTH, BLOBDRIVE_IDENTITY_CLIENT_ID, BLOBDRIVE_*_SECS, BLOBDRIVE_MAX_ATTEMPTS, SSL_CERT_FILE, SSL_CERT_DIR";

/// The largest credentials file read: a few lines of secrets are a few KiB.
pub const MAX_BYTES: u64 = 64 << 10;

/// Reads and checks a credentials file: a regular file owned by root, with no
/// permission for group or others, at most [`MAX_BYTES`], opened and checked
/// as [`crate::secret_file`] does (a symlink is "not a regular file" here).
pub fn load(path: &Path) -> Result<Vec<(String, String)>, CredentialsError> {
    use crate::secret_file::SecretFileError as E;
    let read_err = |e| CredentialsError::Read(path.to_path_buf(), e);
    let file = crate::secret_file::open(path, Some(0), MAX_BYTES).map_err(|e| match e {
        E::Read(e) => read_err(e),
        E::Symlink | E::NotAFile => CredentialsError::NotAFile(path.to_path_buf()),
        E::Owner(uid) => CredentialsError::NotRoot {
            path: path.to_path_buf(),
            uid,
        },
        E::TooOpen(mode) => CredentialsError::TooOpen {
            path: path.to_path_buf(),
            mode,
        },
        E::TooLarge => CredentialsError::TooLarge(path.to_path_buf()),
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(CredentialsError::TooLarge(path.to_path_buf()));
    }
    let text = String::from_utf8(bytes).map_err(|_| CredentialsError::NotText(path.into()))?;
    parse(path, &text)
}

/// Parses `KEY=VALUE` lines; a key given twice keeps its last value.
pub fn parse(path: &Path, text: &str) -> Result<Vec<(String, String)>, CredentialsError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some((key, value)) = line.split_once('=') else {
            return Err(CredentialsError::Syntax(path.into(), n));
        };
        let key = key.trim();
        // Never quoted back: a pasted secret without its `KEY=` lands here (a
        // base64 key holds '+', '/' and '='), and the line number is enough.
        if !valid_name(key) {
            return Err(CredentialsError::BadName(path.into(), n));
        }
        if !ALLOWED.contains(&key) {
            return Err(CredentialsError::NotAllowed(path.into(), n));
        }
        let value = unquote(value.trim())
            .ok_or_else(|| CredentialsError::Unterminated(path.into(), n, key.to_string()))?;
        out.retain(|(k, _)| k != key);
        out.push((key.to_string(), value));
    }
    Ok(out)
}

fn valid_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A value in single quotes is taken as it is; in double quotes, `\"` and `\\`
/// stand for `"` and `\`. `None` for an opening quote that is never closed.
fn unquote(v: &str) -> Option<String> {
    if let Some(rest) = v.strip_prefix('\'') {
        return rest.strip_suffix('\'').map(str::to_string);
    }
    if let Some(rest) = v.strip_prefix('"') {
        let inner = rest.strip_suffix('"')?;
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next() {
                    Some(e @ ('"' | '\\')) => out.push(e),
                    Some(other) => {
                        out.push('\\');
                        out.push(other);
                    }
                    None => out.push('\\'),
                }
            } else {
                out.push(c);
            }
        }
        return Some(out);
    }
    Some(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn p() -> &'static Path {
        Path::new("/etc/blobdrive/x.env")
    }

    #[test]
    fn lines_comments_quotes_and_export() {
        let text = "# account\n\n; also a comment\nAZURE_STORAGE_CONNECTION_STRING=AccountName=a;AccountKey=k==;BlobEndpoint=http://h/a\nexport AZURE_TENANT_ID = 'abc def'\nAZURE_CLIENT_SECRET=\"q\\\"x\\\\y\"\nAZURE_TENANT_ID=second\n";
        let got = parse(p(), text).unwrap();
        assert_eq!(
            got,
            vec![
                (
                    "AZURE_STORAGE_CONNECTION_STRING".to_string(),
                    "AccountName=a;AccountKey=k==;BlobEndpoint=http://h/a".to_string()
                ),
                ("AZURE_CLIENT_SECRET".to_string(), "q\"x\\y".to_string()),
                ("AZURE_TENANT_ID".to_string(), "second".to_string()),
            ]
        );
    }

    #[test]
    fn errors_name_the_line_and_never_the_secret() {
        let e = parse(p(), "AZURE_TENANT_ID=1\nsupersecretkeywithoutname\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the credentials file /etc/blobdrive/x.env, line 2: expected KEY=VALUE"
        );
        let e = parse(
            p(),
            "Eby8vdM02xNOcq FlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFP+x=y\n",
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("Eby8"), "{e}");
        let e = parse(p(), "1BAD=x\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("1BAD"), "{e}");
        // A short name with '+' or '/' in it is a pasted secret: never echoed.
        let e = parse(p(), "abc+/def=x\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("abc+/def"), "{e}");
        // Names that would change how the root daemon and its tools run.
        for name in ["LD_PRELOAD", "PATH", "HTTPS_PROXY", "BLOBDRIVE_RUN_DIR"] {
            let e = parse(p(), &format!("AZURE_TENANT_ID=t\n{name}=/tmp/x\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("line 2") && e.contains("does not take") && !e.contains(name),
                "{e}"
            );
        }
        let e = parse(p(), "AZURE_CLIENT_SECRET=\"open secret\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unterminated") && !e.contains("open secret"),
            "{e}"
        );
    }

    #[test]
    fn only_a_file_of_roots_alone_is_read() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: ownership checks need root to make root-owned files");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("acct.env");
        std::fs::write(&f, "AZURE_STORAGE_CONNECTION_STRING=x\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&f).unwrap().len(), 1);
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = load(&f).unwrap_err().to_string();
            assert!(
                e.contains("group or others") && e.contains("chmod 600"),
                "{e}"
            );
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).unwrap();
        std::os::unix::fs::chown(&f, Some(1234), None).unwrap();
        let e = load(&f).unwrap_err().to_string();
        assert!(e.contains("uid 1234, not root"), "{e}");
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = load(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
        // A symlink to a good file, a FIFO (which would block), a huge file.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&f, Some(0), None).unwrap();
        let link = dir.path().join("link.env");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let e = load(&link).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let fifo = dir.path().join("fifo.env");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir.path().join("big.env");
        std::fs::write(&big, "#".repeat(MAX_BYTES as usize + 1)).unwrap();
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = load(&big).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }
}
