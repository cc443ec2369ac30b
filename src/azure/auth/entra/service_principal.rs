//! A service principal from the environment (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`,
//! and `AZURE_CLIENT_SECRET` or `AZURE_CLIENT_CERTIFICATE_PATH`): the OAuth 2.0
//! client credentials grant at `{authority}/{tenant}/oauth2/v2.0/token`.
//!
//! [`post_client_credentials`] is shared with workload identity, which differs only
//! in where its assertion comes from.

use std::fmt;
use std::time::Duration;

use reqwest::Method;
use url::Url;

use super::assertion::CertificateKey;
use super::http::{error_text, token_from, CallError, TokenHttp};
use super::{AccessToken, BoxFuture, SourceKind, TokenError, TokenSource, SCOPE};

/// How a service principal proves who it is.
pub enum ClientProof {
    Secret(String),
    Certificate(Box<CertificateKey>),
}

impl fmt::Debug for ClientProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientProof::Secret(_) => f.write_str("Secret(<redacted>)"),
            ClientProof::Certificate(c) => write!(f, "{c:?}"),
        }
    }
}

#[derive(Debug)]
pub struct ServicePrincipal {
    token_url: Url,
    client_id: String,
    proof: ClientProof,
    http: TokenHttp,
}

/// `{authority}/{tenant}/oauth2/v2.0/token`; the authority must be https (a secret
/// or assertion is sent to it).
pub fn token_url(authority: &Url, tenant: &str) -> Result<Url, String> {
    if authority.scheme() != "https" {
        return Err(format!(
            "AZURE_AUTHORITY_HOST must be an https:// URL, not {}",
            super::http::origin(authority)
        ));
    }
    let valid_tenant = !tenant.is_empty()
        && tenant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if !valid_tenant {
        return Err("AZURE_TENANT_ID must be a tenant id (GUID) or domain name".to_string());
    }
    let base = authority.as_str().trim_end_matches('/');
    Url::parse(&format!("{base}/{tenant}/oauth2/v2.0/token"))
        .map_err(|e| format!("AZURE_AUTHORITY_HOST does not make a valid URL: {e}"))
}

/// The HTTP client for authority hosts.
pub fn authority_http() -> TokenHttp {
    TokenHttp::new(Duration::from_secs(5), Duration::from_secs(15))
}

impl ServicePrincipal {
    pub fn new(token_url: Url, client_id: String, proof: ClientProof) -> ServicePrincipal {
        ServicePrincipal {
            token_url,
            client_id,
            proof,
            http: authority_http(),
        }
    }
}

/// Sends a client credentials grant with either a secret or an assertion, and
/// reads the token. Every failure is [`TokenError::Failed`]: the source was set up
/// on purpose, so its failure is the answer.
pub async fn post_client_credentials(
    http: &TokenHttp,
    token_url: &Url,
    client_id: &str,
    secret: Option<&str>,
    assertion: Option<&str>,
) -> Result<AccessToken, TokenError> {
    let mut form = vec![
        ("grant_type", "client_credentials"),
        ("client_id", client_id),
        ("scope", SCOPE),
    ];
    if let Some(s) = secret {
        form.push(("client_secret", s));
    }
    if let Some(a) = assertion {
        form.push((
            "client_assertion_type",
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
        ));
        form.push(("client_assertion", a));
    }
    let reply = http
        .call(Method::POST, token_url, &[], Some(&form))
        .await
        .map_err(|e| match e {
            CallError::Unreachable(m) | CallError::Certificate(m) => TokenError::Failed(m),
        })?;
    if reply.status != 200 {
        return Err(TokenError::Failed(format!(
            "the token endpoint {} refused: {}",
            super::http::origin(token_url),
            error_text(&reply)
        )));
    }
    token_from(&reply.body).map_err(|e| {
        TokenError::Failed(format!(
            "the token endpoint {} answered oddly: {e}",
            super::http::origin(token_url)
        ))
    })
}

impl TokenSource for ServicePrincipal {
    fn kind(&self) -> SourceKind {
        SourceKind::ServicePrincipal
    }

    fn fetch(&self) -> BoxFuture<'_, Result<AccessToken, TokenError>> {
        Box::pin(async move {
            match &self.proof {
                ClientProof::Secret(s) => {
                    post_client_credentials(
                        &self.http,
                        &self.token_url,
                        &self.client_id,
                        Some(s),
                        None,
                    )
                    .await
                }
                ClientProof::Certificate(c) => {
                    let a = c.assertion(&self.client_id, self.token_url.as_str());
                    post_client_credentials(
                        &self.http,
                        &self.token_url,
                        &self.client_id,
                        None,
                        Some(&a),
                    )
                    .await
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_url_needs_https_and_a_plain_tenant() {
        let a = Url::parse("https://login.microsoftonline.us/").unwrap();
        assert_eq!(
            token_url(&a, "contoso.onmicrosoft.com").unwrap().as_str(),
            "https://login.microsoftonline.us/contoso.onmicrosoft.com/oauth2/v2.0/token"
        );
        let m = token_url(&Url::parse("http://127.0.0.1:1").unwrap(), "t").unwrap_err();
        assert!(m.contains("must be an https:// URL"), "{m}");
        assert!(token_url(&a, "../x").is_err());
    }

    #[test]
    fn debug_hides_the_secret() {
        let sp = ServicePrincipal::new(
            Url::parse("https://h/t/oauth2/v2.0/token").unwrap(),
            "id".into(),
            ClientProof::Secret("TOPSECRET".into()),
        );
        assert!(!format!("{sp:?}").contains("TOPSECRET"));
    }
}
