//! Credentials files (`credentials=FILE` in fstab, `--credentials FILE` on
//! `blobdrive mount`): `KEY=VALUE` lines that become the mount daemon's
//! environment, e.g. `AZURE_STORAGE_CONNECTION_STRING=...` or the Entra ID
//! variables (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, ...).
//!
//! The format is the one systemd's `EnvironmentFile=` reads (blank lines, `#` and
//! `;` comments, an optional `export `, values optionally in single or double
//! quotes), so one file serves fstab and a unit alike. Secrets are the point of
//! such a file, so it must be root's and unreadable by anyone else, and no error
//! ever quotes a value (only the line number and the key).

use std::io::Read;
use std::os::unix::fs::MetadataExt;
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
    #[error("the credentials file {0}, line {1}: {2} is not a valid environment variable name (letters, digits and _, not starting with a digit)")]
    BadName(PathBuf, usize, String),
    #[error("the credentials file {0}, line {1}: the value of {2} has an unterminated quote")]
    Unterminated(PathBuf, usize, String),
    #[error("the credentials file {0} is not UTF-8 text")]
    NotText(PathBuf),
}

/// Reads and checks a credentials file: a regular file owned by root, with no
/// permission for group or others. The checks are made on the opened file, so
/// the file read is the file checked.
pub fn load(path: &Path) -> Result<Vec<(String, String)>, CredentialsError> {
    let read_err = |e| CredentialsError::Read(path.to_path_buf(), e);
    let mut file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(CredentialsError::NotAFile(path.to_path_buf()));
    }
    if meta.uid() != 0 {
        return Err(CredentialsError::NotRoot {
            path: path.to_path_buf(),
            uid: meta.uid(),
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(CredentialsError::TooOpen {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(read_err)?;
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
        if !valid_name(key) {
            // A pasted secret without its `KEY=` may land here: name at most a
            // short prefix-free description, never the text.
            let shown = if key.len() <= 40 && !key.contains(char::is_whitespace) {
                format!("'{key}'")
            } else {
                "the text before '='".to_string()
            };
            return Err(CredentialsError::BadName(path.into(), n, shown));
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
        let e = parse(p(), "A=1\nsupersecretkeywithoutname\n").unwrap_err();
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
        assert!(e.contains("'1BAD'"), "{e}");
        let e = parse(p(), "K=\"open secret\n").unwrap_err().to_string();
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
    }
}
