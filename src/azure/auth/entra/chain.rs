//! Which source signs in: the Azure SDKs' default order (service principal from the
//! environment, workload identity, managed identity, Azure CLI), or the one source
//! `--auth` names.
//!
//! A source whose inputs are missing (variables unset, no identity endpoint, no
//! `az`) is skipped and noted; the first that gives a token is used for the rest of
//! the process's life, renewals included. A source that is set up but fails stops
//! the chain: trying the next identity would hide the mistake behind another
//! identity's "access denied" later, or a confusing "nothing found".

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use url::Url;

use super::assertion::CertificateKey;
use super::azure_cli::AzureCli;
use super::managed_identity::{Endpoint, ManagedIdentity, IMDS_HOST};
use super::service_principal::{token_url, ClientProof, ServicePrincipal};
use super::workload_identity::{FederatedReader, WorkloadIdentity};
use super::{AccessToken, SourceKind, TokenError, TokenSource, DEFAULT_AUTHORITY};

/// The variables the chain reads, read once (so tests can make one without
/// touching the process's environment). `Debug` hides the secrets.
#[derive(Clone, Default)]
pub struct EntraEnv {
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    pub certificate_path: Option<String>,
    pub certificate_password: Option<String>,
    pub federated_token_file: Option<String>,
    pub authority_host: Option<String>,
    /// `AZURE_POD_IDENTITY_AUTHORITY_HOST`: replaces IMDS's host.
    pub imds_host: Option<String>,
    pub identity_endpoint: Option<String>,
    pub identity_header: Option<String>,
    /// A user-assigned managed identity chosen by flag
    /// (`--identity-client-id`, `BLOBDRIVE_IDENTITY_CLIENT_ID`); else
    /// `AZURE_CLIENT_ID` chooses it, as in the SDKs.
    pub identity_client_id: Option<String>,
    /// The Azure CLI program (`az`).
    pub az_program: String,
    /// Who reads `AZURE_FEDERATED_TOKEN_FILE` for workload identity: `None`,
    /// this process; a split mount daemon's worker asks its root part (see
    /// `workload_identity`).
    pub federated_reader: Option<FederatedReader>,
}

impl fmt::Debug for EntraEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntraEnv")
            .field("tenant_id", &self.tenant_id)
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("certificate_path", &self.certificate_path)
            .field("federated_token_file", &self.federated_token_file)
            .field("authority_host", &self.authority_host)
            .field("imds_host", &self.imds_host)
            .field("identity_endpoint", &self.identity_endpoint)
            .field("identity_client_id", &self.identity_client_id)
            .finish_non_exhaustive()
    }
}

/// Env var taking a user-assigned managed identity's client id (what
/// `--identity-client-id` sets).
pub const IDENTITY_CLIENT_ID_ENV: &str = "BLOBDRIVE_IDENTITY_CLIENT_ID";

impl EntraEnv {
    pub fn from_env() -> EntraEnv {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        EntraEnv {
            tenant_id: var("AZURE_TENANT_ID"),
            client_id: var("AZURE_CLIENT_ID"),
            client_secret: var("AZURE_CLIENT_SECRET"),
            certificate_path: var("AZURE_CLIENT_CERTIFICATE_PATH"),
            certificate_password: var("AZURE_CLIENT_CERTIFICATE_PASSWORD"),
            federated_token_file: var("AZURE_FEDERATED_TOKEN_FILE"),
            authority_host: var("AZURE_AUTHORITY_HOST"),
            imds_host: var("AZURE_POD_IDENTITY_AUTHORITY_HOST"),
            identity_endpoint: var("IDENTITY_ENDPOINT"),
            identity_header: var("IDENTITY_HEADER"),
            identity_client_id: var(IDENTITY_CLIENT_ID_ENV),
            az_program: "az".to_string(),
            federated_reader: None,
        }
    }

    fn authority(&self) -> Result<Url, TokenError> {
        let host = self.authority_host.as_deref().unwrap_or(DEFAULT_AUTHORITY);
        Url::parse(host)
            .map_err(|_| TokenError::Failed(format!("AZURE_AUTHORITY_HOST={host} is not a URL")))
    }

    /// Names of the variables in `names` that are unset.
    fn missing<'a>(&self, names: &[(&'a str, &Option<String>)]) -> Vec<&'a str> {
        names
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect()
    }

    /// The source of `kind` as this environment sets it up, or why it is not.
    pub fn source(&self, kind: SourceKind) -> Result<Arc<dyn TokenSource>, TokenError> {
        match kind {
            SourceKind::ServicePrincipal => self.service_principal(),
            SourceKind::WorkloadIdentity => self.workload_identity(),
            SourceKind::ManagedIdentity => self.managed_identity(),
            SourceKind::AzureCli => Ok(Arc::new(AzureCli::new(&self.az_program))),
        }
    }

    fn service_principal(&self) -> Result<Arc<dyn TokenSource>, TokenError> {
        let mut missing = self.missing(&[
            ("AZURE_TENANT_ID", &self.tenant_id),
            ("AZURE_CLIENT_ID", &self.client_id),
        ]);
        if self.client_secret.is_none() && self.certificate_path.is_none() {
            missing.push("AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH");
        }
        let (Some(tenant), Some(client), true) =
            (&self.tenant_id, &self.client_id, missing.is_empty())
        else {
            return Err(TokenError::Unavailable(format!(
                "no service principal: {} not set",
                missing.join(", ")
            )));
        };
        let url = token_url(&self.authority()?, tenant).map_err(TokenError::Failed)?;
        let proof = match (&self.client_secret, &self.certificate_path) {
            (Some(s), _) => ClientProof::Secret(s.clone()),
            (None, Some(p)) => ClientProof::Certificate(Box::new(
                CertificateKey::load(&PathBuf::from(p), self.certificate_password.is_some())
                    .map_err(TokenError::Failed)?,
            )),
            (None, None) => unreachable!("checked above"),
        };
        Ok(Arc::new(ServicePrincipal::new(url, client.clone(), proof)))
    }

    fn workload_identity(&self) -> Result<Arc<dyn TokenSource>, TokenError> {
        let missing = self.missing(&[
            ("AZURE_FEDERATED_TOKEN_FILE", &self.federated_token_file),
            ("AZURE_TENANT_ID", &self.tenant_id),
            ("AZURE_CLIENT_ID", &self.client_id),
        ]);
        let (Some(file), Some(tenant), Some(client)) =
            (&self.federated_token_file, &self.tenant_id, &self.client_id)
        else {
            return Err(TokenError::Unavailable(format!(
                "no workload identity: {} not set",
                missing.join(", ")
            )));
        };
        let url = token_url(&self.authority()?, tenant).map_err(TokenError::Failed)?;
        let file = PathBuf::from(file);
        Ok(Arc::new(match &self.federated_reader {
            Some(read) => WorkloadIdentity::with_reader(url, client.clone(), file, read.clone()),
            None => WorkloadIdentity::new(url, client.clone(), file),
        }))
    }

    fn managed_identity(&self) -> Result<Arc<dyn TokenSource>, TokenError> {
        let (endpoint, named) = match (&self.identity_endpoint, &self.identity_header) {
            (Some(e), Some(h)) => (
                Endpoint::app_service(e, h.clone()),
                Some("IDENTITY_ENDPOINT"),
            ),
            _ => (
                Endpoint::imds(self.imds_host.as_deref().unwrap_or(IMDS_HOST)),
                self.imds_host
                    .as_ref()
                    .map(|_| "AZURE_POD_IDENTITY_AUTHORITY_HOST"),
            ),
        };
        let endpoint = endpoint.map_err(TokenError::Failed)?;
        // IMDS's own address is link-local and plain http by design; an
        // endpoint a variable names is said once when it is plain off loopback.
        if let Some(var) = named {
            endpoint.warn_if_in_clear(var);
        }
        let client_id = self
            .identity_client_id
            .clone()
            .or_else(|| self.client_id.clone());
        Ok(Arc::new(ManagedIdentity::new(endpoint, client_id)))
    }
}

/// The source that signed in, and its first token.
pub struct SignedIn {
    pub source: Arc<dyn TokenSource>,
    pub token: AccessToken,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SignInError {
    /// No source is set up here; `tried` says, per source, why not.
    #[error("no Entra ID credential found (tried {}); give the blob an account key or SAS, set one of these up (e.g. `az login`), or pass --auth anonymous for a public container", tried.join("; "))]
    NothingFound { tried: Vec<String> },
    /// The source that is set up failed.
    #[error("Entra ID sign-in through {kind} failed: {message}")]
    Failed { kind: SourceKind, message: String },
    /// This process could not start what signing in needs (a thread, a runtime).
    #[error("cannot sign in to Entra ID: {0}")]
    Setup(String),
}

/// Signs in with the first source that is set up, in chain order, or with `only`.
pub async fn sign_in(env: &EntraEnv, only: Option<SourceKind>) -> Result<SignedIn, SignInError> {
    let kinds: Vec<SourceKind> = match only {
        Some(k) => vec![k],
        None => SourceKind::ALL.to_vec(),
    };
    let mut tried = Vec::new();
    for kind in kinds {
        let attempt = match env.source(kind) {
            Ok(source) => source.fetch().await.map(|token| SignedIn { source, token }),
            Err(e) => Err(e),
        };
        match attempt {
            Ok(signed_in) => return Ok(signed_in),
            Err(TokenError::Unavailable(why)) if only.is_none() => {
                tried.push(format!("{kind}: {why}"))
            }
            // A source asked for by name that is not set up is its failure.
            Err(TokenError::Unavailable(message)) | Err(TokenError::Failed(message)) => {
                return Err(SignInError::Failed { kind, message })
            }
        }
    }
    Err(SignInError::NothingFound { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing_here() -> EntraEnv {
        EntraEnv {
            // A closed port: IMDS refuses at once.
            imds_host: Some("http://127.0.0.1:9".into()),
            az_program: "/nonexistent/az".into(),
            ..EntraEnv::default()
        }
    }

    #[tokio::test]
    async fn nothing_set_up_names_every_source_tried() {
        let e = sign_in(&nothing_here(), None).await.err().unwrap();
        let m = e.to_string();
        for part in [
            "service-principal: no service principal: AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH not set",
            "workload-identity: no workload identity: AZURE_FEDERATED_TOKEN_FILE",
            "managed-identity: no managed identity: nothing answered at IMDS at http://127.0.0.1:9",
            "azure-cli: no Azure CLI",
            "--auth anonymous",
        ] {
            assert!(m.contains(part), "{part:?} missing in {m}");
        }
        assert!(!m.contains('\n'));
    }

    #[tokio::test]
    async fn a_source_set_up_but_failing_stops_the_chain() {
        let env = EntraEnv {
            tenant_id: Some("t".into()),
            client_id: Some("c".into()),
            client_secret: Some("TOPSECRET".into()),
            authority_host: Some("http://login.example".into()),
            ..nothing_here()
        };
        let m = sign_in(&env, None).await.err().unwrap().to_string();
        assert!(
            m.starts_with("Entra ID sign-in through service-principal failed: AZURE_AUTHORITY_HOST must be an https:// URL"),
            "{m}"
        );
        assert!(!m.contains("TOPSECRET"));
        assert!(!format!("{env:?}").contains("TOPSECRET"));
        // Asked for by name, an unset source is an error, not a skip.
        let m = sign_in(&nothing_here(), Some(SourceKind::WorkloadIdentity))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            m.contains("through workload-identity failed: no workload identity"),
            "{m}"
        );
    }
}
