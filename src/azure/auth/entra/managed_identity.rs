//! Managed identity: the token endpoint the Azure host itself offers.
//!
//! On VMs, scale sets and AKS nodes that is IMDS
//! (`http://169.254.169.254/metadata/identity/oauth2/token`, header `Metadata:
//! true`); `AZURE_POD_IDENTITY_AUTHORITY_HOST` replaces its host, as the Python SDK
//! allows (pod identity, tests). App Service, Functions and Container Apps give
//! `IDENTITY_ENDPOINT` and `IDENTITY_HEADER` instead. A user-assigned identity is
//! chosen by its client id.
//!
//! Outside Azure nothing answers at IMDS: the first call is a probe with a short
//! connect timeout, and "nothing there" makes the source unavailable so the chain
//! goes on. Once a token came, a later failure is a failure (an outage of the
//! endpoint), never "unavailable".

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::Method;
use url::Url;

use super::http::{error_text, origin, token_from, CallError, TokenHttp};
use super::{AccessToken, BoxFuture, SourceKind, TokenError, TokenSource, RESOURCE};

/// IMDS's well-known address.
pub const IMDS_HOST: &str = "http://169.254.169.254";

/// Where the host's identity endpoint is.
pub enum Endpoint {
    Imds(Url),
    /// App Service style: the URL, and the header value proving the caller runs
    /// on the host (a secret).
    AppService(Url, String),
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Imds(u) => write!(f, "Imds({})", origin(u)),
            Endpoint::AppService(u, _) => write!(f, "AppService({}, <redacted>)", origin(u)),
        }
    }
}

impl Endpoint {
    /// IMDS at `host` (scheme and authority, e.g. `http://127.0.0.1:8080`).
    pub fn imds(host: &str) -> Result<Endpoint, String> {
        let base = host.trim_end_matches('/');
        Url::parse(&format!("{base}/metadata/identity/oauth2/token"))
            .map(Endpoint::Imds)
            .map_err(|_| format!("AZURE_POD_IDENTITY_AUTHORITY_HOST={host} is not a URL"))
    }

    pub fn app_service(endpoint: &str, header: String) -> Result<Endpoint, String> {
        Url::parse(endpoint)
            .map(|u| Endpoint::AppService(u, header))
            .map_err(|_| "IDENTITY_ENDPOINT is not a URL".to_string())
    }

    fn url(&self) -> &Url {
        match self {
            Endpoint::Imds(u) | Endpoint::AppService(u, _) => u,
        }
    }

    /// Says, once per process, that the endpoint `var` named is plain http off
    /// this machine's loopback: the token, and App Service's identity header,
    /// then cross the network unencrypted. That is how Azure's App Service and
    /// pod identity work, so it is allowed, but never silently.
    pub fn warn_if_in_clear(&self, var: &str) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        if crate::azure::auth::may_carry_token(self.url()) {
            return;
        }
        let what = match self {
            Endpoint::Imds(_) => "the token",
            Endpoint::AppService(..) => "the identity header and the token",
        };
        WARNED.call_once(|| {
            tracing::warn!(
                "{var} is plain http to {}, not this machine's loopback: {what} cross the network unencrypted (as Azure App Service and pod identity intend; see docs/security.md)",
                origin(self.url())
            )
        });
    }

    /// Which kind, for messages.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Imds(u) => format!("IMDS at {}", origin(u)),
            Endpoint::AppService(u, _) => format!("IDENTITY_ENDPOINT {}", origin(u)),
        }
    }
}

#[derive(Debug)]
pub struct ManagedIdentity {
    endpoint: Endpoint,
    /// A user-assigned identity's client id; the system-assigned one when `None`.
    client_id: Option<String>,
    http: TokenHttp,
    /// Whether a token ever came: from then on, failures are failures.
    answered: AtomicBool,
}

impl ManagedIdentity {
    pub fn new(endpoint: Endpoint, client_id: Option<String>) -> ManagedIdentity {
        ManagedIdentity {
            endpoint,
            client_id,
            http: TokenHttp::direct(Duration::from_secs(2), Duration::from_secs(10)),
            answered: AtomicBool::new(false),
        }
    }

    fn request_url(&self) -> Url {
        let mut url = self.endpoint.url().clone();
        {
            let mut q = url.query_pairs_mut();
            match self.endpoint {
                Endpoint::Imds(_) => q.append_pair("api-version", "2018-02-01"),
                Endpoint::AppService(..) => q.append_pair("api-version", "2019-08-01"),
            };
            q.append_pair("resource", RESOURCE);
            if let Some(id) = &self.client_id {
                q.append_pair("client_id", id);
            }
        }
        url
    }

    async fn get(&self) -> Result<AccessToken, TokenError> {
        let url = self.request_url();
        let headers: Vec<(&str, &str)> = match &self.endpoint {
            Endpoint::Imds(_) => vec![("Metadata", "true")],
            Endpoint::AppService(_, h) => vec![("X-IDENTITY-HEADER", h.as_str())],
        };
        let probing = !self.answered.load(Ordering::SeqCst);
        let which = self.endpoint.describe();
        let reply = match self.http.call(Method::GET, &url, &headers, None).await {
            Ok(r) => r,
            Err(CallError::Unreachable(m)) if probing => {
                return Err(TokenError::Unavailable(format!(
                    "no managed identity: nothing answered at {which} ({m})"
                )))
            }
            Err(e) => return Err(TokenError::Failed(e.message().to_string())),
        };
        if probing && !reply.body.is_object() {
            // IMDS always answers JSON; a page of something else (a proxy or
            // firewall that intercepts 169.254.169.254) means there is none.
            return Err(TokenError::Unavailable(format!(
                "no managed identity: something other than an identity endpoint answered at {which} ({})",
                error_text(&reply)
            )));
        }
        if reply.status != 200 {
            let why = error_text(&reply);
            // IMDS answers 400 when the machine has no (such) identity.
            return Err(if probing && reply.status == 400 {
                TokenError::Unavailable(format!(
                    "no managed identity: {which} has none for this machine{} ({why})",
                    match &self.client_id {
                        Some(id) => format!(" with client id {id}"),
                        None => String::new(),
                    }
                ))
            } else {
                TokenError::Failed(format!(
                    "the managed identity endpoint ({which}) refused: {why}"
                ))
            });
        }
        let token = token_from(&reply.body).map_err(|e| {
            TokenError::Failed(format!(
                "the managed identity endpoint ({which}) answered oddly: {e}"
            ))
        })?;
        self.answered.store(true, Ordering::SeqCst);
        Ok(token)
    }
}

impl TokenSource for ManagedIdentity {
    fn kind(&self) -> SourceKind {
        SourceKind::ManagedIdentity
    }

    fn fetch(&self) -> BoxFuture<'_, Result<AccessToken, TokenError>> {
        Box::pin(self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_urls() {
        let mi = ManagedIdentity::new(Endpoint::imds(IMDS_HOST).unwrap(), None);
        assert_eq!(
            mi.request_url().as_str(),
            "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com"
        );
        let mi = ManagedIdentity::new(
            Endpoint::app_service("http://127.0.0.1:41741/msi/token", "H".into()).unwrap(),
            Some("abc".into()),
        );
        assert_eq!(
            mi.request_url().as_str(),
            "http://127.0.0.1:41741/msi/token?api-version=2019-08-01&resource=https%3A%2F%2Fstorage.azure.com&client_id=abc"
        );
        assert!(!format!("{mi:?}").contains("\"H\""));
    }
}
