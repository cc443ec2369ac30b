//! Workload identity (AKS and other federated setups): the file named by
//! `AZURE_FEDERATED_TOKEN_FILE` holds a token issued by the platform, which is
//! exchanged for an Entra ID token as a client assertion of `AZURE_CLIENT_ID` in
//! `AZURE_TENANT_ID`.
//!
//! The platform rotates the file (kubelet rewrites it well before it expires), so
//! it is read afresh for every renewal: a daemon that kept the first one would stop
//! working after an hour or a day, a failure people report of other mount tools.
//!
//! Who reads it is the source's [`FederatedReader`]: by default this process,
//! with [`read_token_file`]. The walled worker of a split mount daemon
//! ([`crate::privsep`]) cannot (Landlock, and kubelet's token directories may be root's alone),
//! so it is given a reader that asks the mount's root part, which reads the file
//! its own environment names with the same [`read_token_file`].

use std::fmt;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use url::Url;

use super::http::TokenHttp;
use super::service_principal::{authority_http, post_client_credentials};
use super::{epoch, jwt, AccessToken, BoxFuture, SourceKind, TokenError, TokenSource};

/// The largest federated token file read. A Kubernetes service account token
/// is a JWT of one or two KiB; a bound keeps a wrong path (a log, a device) from
/// being read whole, and keeps the text within one line of the split daemon's
/// channel (`mount::rootpart::LINE_MAX`) even with every character escaped.
pub const TOKEN_FILE_MAX: u64 = 16 * 1024;

/// Reads the federated token file's text afresh (see [`read_token_file`]);
/// called at sign-in and for every renewal.
pub type FederatedReader = Arc<dyn Fn() -> io::Result<String> + Send + Sync>;

/// The text of the federated token file `path`, for a token source. Symlinks
/// are followed: kubelet rotates a projected token by swapping its `..data`
/// symlink. Refused: what is not a regular file (a FIFO or a device would
/// block the reader or never end), a file over [`TOKEN_FILE_MAX`] (at most one
/// byte past the bound is read), one that is not UTF-8, and one holding control
/// characters other than tabs and line ends, which no token has.
pub fn read_token_file(path: &Path) -> io::Result<String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(TOKEN_FILE_MAX + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > TOKEN_FILE_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "larger than {} KiB, which no token is",
                TOKEN_FILE_MAX / 1024
            ),
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))?;
    if text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "it holds control characters, which no token has",
        ));
    }
    Ok(text)
}

pub struct WorkloadIdentity {
    token_url: Url,
    client_id: String,
    /// The file, as `AZURE_FEDERATED_TOKEN_FILE` names it, for messages.
    token_file: PathBuf,
    read: FederatedReader,
    http: TokenHttp,
}

impl fmt::Debug for WorkloadIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadIdentity")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

impl WorkloadIdentity {
    /// The source reading `token_file` itself, with [`read_token_file`].
    pub fn new(token_url: Url, client_id: String, token_file: PathBuf) -> WorkloadIdentity {
        let path = token_file.clone();
        let read: FederatedReader = Arc::new(move || read_token_file(&path));
        WorkloadIdentity::with_reader(token_url, client_id, token_file, read)
    }

    /// The source reading the file named `token_file` through `read` (another
    /// process may read it: see the module's doc).
    pub fn with_reader(
        token_url: Url,
        client_id: String,
        token_file: PathBuf,
        read: FederatedReader,
    ) -> WorkloadIdentity {
        WorkloadIdentity {
            token_url,
            client_id,
            token_file,
            read,
            http: authority_http(),
        }
    }

    /// The federated token as it is in the file now, refused with a clear line
    /// when the file cannot be read, is empty, or holds a token that has expired
    /// (the platform stopped rotating it).
    fn read_assertion(&self) -> Result<String, TokenError> {
        let shown = self.token_file.display();
        let text = (self.read)().map_err(|e| {
            TokenError::Failed(format!(
                "cannot read the federated token file AZURE_FEDERATED_TOKEN_FILE={shown}: {e}"
            ))
        })?;
        let token = text.trim().to_string();
        if token.is_empty() {
            return Err(TokenError::Failed(format!(
                "the federated token file {shown} is empty"
            )));
        }
        if let Some(exp) = jwt::expiry(&token) {
            if epoch(exp) <= SystemTime::now() {
                return Err(TokenError::Failed(format!(
                    "the federated token in {shown} has expired (exp {exp}): the platform no longer rotates it (is the service account token projection still mounted?)"
                )));
            }
        }
        Ok(token)
    }
}

impl TokenSource for WorkloadIdentity {
    fn kind(&self) -> SourceKind {
        SourceKind::WorkloadIdentity
    }

    fn fetch(&self) -> BoxFuture<'_, Result<AccessToken, TokenError>> {
        Box::pin(async move {
            let assertion = self.read_assertion()?;
            post_client_credentials(
                &self.http,
                &self.token_url,
                &self.client_id,
                None,
                Some(&assertion),
            )
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(file: PathBuf) -> WorkloadIdentity {
        WorkloadIdentity::new(
            Url::parse("https://127.0.0.1:1/t/oauth2/v2.0/token").unwrap(),
            "id".into(),
            file,
        )
    }

    #[test]
    fn unreadable_empty_and_expired_files_are_refused_before_any_request() {
        let dir = tempfile::tempdir().unwrap();
        let missing = source(dir.path().join("nope"));
        let m = missing.read_assertion().unwrap_err().to_string();
        assert!(m.contains("cannot read the federated token file"), "{m}");
        let f = dir.path().join("token");
        std::fs::write(&f, "\n").unwrap();
        let m = source(f.clone()).read_assertion().unwrap_err().to_string();
        assert!(m.contains("is empty"), "{m}");
        let expired = format!("a.{}.c", jwt::b64url(br#"{"exp":1000}"#));
        std::fs::write(&f, &expired).unwrap();
        let m = source(f.clone()).read_assertion().unwrap_err().to_string();
        assert!(m.contains("has expired") && !m.contains(&expired), "{m}");
        let fresh = format!("a.{}.c", jwt::b64url(br#"{"exp":99999999999}"#));
        std::fs::write(&f, &fresh).unwrap();
        assert_eq!(source(f).read_assertion().unwrap(), fresh);
    }

    #[test]
    fn the_file_is_read_through_symlinks_and_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // kubelet's layout: token -> ..data/token, ..data -> the current version.
        std::fs::create_dir(d.join("..v1")).unwrap();
        std::fs::write(d.join("..v1/token"), "one\n").unwrap();
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/token", d.join("token")).unwrap();
        assert_eq!(read_token_file(&d.join("token")).unwrap(), "one\n");
        std::fs::create_dir(d.join("..v2")).unwrap();
        std::fs::write(d.join("..v2/token"), "two").unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..tmp")).unwrap();
        std::fs::rename(d.join("..tmp"), d.join("..data")).unwrap();
        assert_eq!(read_token_file(&d.join("token")).unwrap(), "two");

        let f = d.join("big");
        std::fs::write(&f, vec![b'a'; TOKEN_FILE_MAX as usize]).unwrap();
        assert_eq!(read_token_file(&f).unwrap().len(), TOKEN_FILE_MAX as usize);
        std::fs::write(&f, vec![b'a'; TOKEN_FILE_MAX as usize + 1]).unwrap();
        let e = read_token_file(&f).unwrap_err().to_string();
        assert!(e.contains("larger than 16 KiB"), "{e}");
        std::fs::write(&f, b"a.b\x1b[2J.c").unwrap();
        let e = read_token_file(&f).unwrap_err().to_string();
        assert!(e.contains("control characters"), "{e}");
        std::fs::write(&f, b"a.\xff.c").unwrap();
        assert!(read_token_file(&f).is_err());
        // A FIFO would block the reader: refused without reading.
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_token_file(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(read_token_file(Path::new("/dev/zero")).is_err());
    }

    #[test]
    fn another_reader_stands_in_for_the_file() {
        let fresh = format!("a.{}.c", jwt::b64url(br#"{"exp":99999999999}"#));
        let given = fresh.clone();
        let s = WorkloadIdentity::with_reader(
            Url::parse("https://127.0.0.1:1/t/oauth2/v2.0/token").unwrap(),
            "id".into(),
            PathBuf::from("/var/run/secrets/token"),
            Arc::new(move || Ok(format!("{given}\n"))),
        );
        assert_eq!(s.read_assertion().unwrap(), fresh);
        let failing = WorkloadIdentity::with_reader(
            Url::parse("https://127.0.0.1:1/t/oauth2/v2.0/token").unwrap(),
            "id".into(),
            PathBuf::from("/var/run/secrets/token"),
            Arc::new(|| Err(io::Error::other("the root part says no"))),
        );
        let m = failing.read_assertion().unwrap_err().to_string();
        assert!(
            m.contains("AZURE_FEDERATED_TOKEN_FILE=/var/run/secrets/token: the root part says no"),
            "{m}"
        );
    }
}
