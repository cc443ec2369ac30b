//! Workload identity (AKS and other federated setups): the file named by
//! `AZURE_FEDERATED_TOKEN_FILE` holds a token issued by the platform, which is
//! exchanged for an Entra ID token as a client assertion of `AZURE_CLIENT_ID` in
//! `AZURE_TENANT_ID`.
//!
//! The platform rotates the file (kubelet rewrites it well before it expires), so
//! it is read afresh for every renewal: a daemon that kept the first one would stop
//! working after an hour or a day, a failure people report of other mount tools.

use std::path::PathBuf;
use std::time::SystemTime;

use url::Url;

use super::http::TokenHttp;
use super::service_principal::{authority_http, post_client_credentials};
use super::{epoch, jwt, AccessToken, BoxFuture, SourceKind, TokenError, TokenSource};

#[derive(Debug)]
pub struct WorkloadIdentity {
    token_url: Url,
    client_id: String,
    token_file: PathBuf,
    http: TokenHttp,
}

impl WorkloadIdentity {
    pub fn new(token_url: Url, client_id: String, token_file: PathBuf) -> WorkloadIdentity {
        WorkloadIdentity {
            token_url,
            client_id,
            token_file,
            http: authority_http(),
        }
    }

    /// The federated token as it is in the file now, refused with a clear line
    /// when the file cannot be read, is empty, or holds a token that has expired
    /// (the platform stopped rotating it).
    fn read_assertion(&self) -> Result<String, TokenError> {
        let shown = self.token_file.display();
        let text = std::fs::read_to_string(&self.token_file).map_err(|e| {
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
}
