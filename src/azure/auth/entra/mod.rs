//! Microsoft Entra ID sign-in: where a token for `https://storage.azure.com` comes
//! from, and how it is kept fresh for a mount that lives for months.
//!
//! Tokens are fetched with small hand-written HTTP calls over the crate's own
//! reqwest client rather than with the `azure_identity` crate: that crate brings
//! `azure_core` and a second HTTP stack, and has no environment chain, which is the
//! part users rely on. Each source is one file implementing [`TokenSource`]:
//!
//! | source | file | what it calls |
//! |---|---|---|
//! | service principal | [`service_principal`] (+ [`assertion`] for certificates) | the authority's `/{tenant}/oauth2/v2.0/token`, client credentials |
//! | workload identity | [`workload_identity`] | the same, with the federated token file as the assertion |
//! | managed identity | [`managed_identity`] | IMDS, or App Service's `IDENTITY_ENDPOINT` |
//! | Azure CLI | [`azure_cli`] | `az account get-access-token` |
//!
//! [`chain`] picks one in the Azure SDKs' order; [`keeper`] holds its token and
//! renews it in the background; [`super::bearer`] puts it on requests.

pub mod assertion;
pub mod azure_cli;
pub mod chain;
pub mod http;
pub mod jwt;
pub mod keeper;
pub mod managed_identity;
pub mod service_principal;
pub mod workload_identity;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

/// The scope asked of token endpoints that speak OAuth 2.0 v2 (service principal,
/// workload identity, Azure CLI).
pub const SCOPE: &str = "https://storage.azure.com/.default";
/// The resource asked of managed identity endpoints (v1 style).
pub const RESOURCE: &str = "https://storage.azure.com";
/// Public cloud authority; `AZURE_AUTHORITY_HOST` picks another cloud.
pub const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com";

/// A boxed future, so [`TokenSource`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The kinds of source, in the order the chain tries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    ServicePrincipal,
    WorkloadIdentity,
    ManagedIdentity,
    AzureCli,
}

impl SourceKind {
    /// Every kind, in chain order.
    pub const ALL: [SourceKind; 4] = [
        SourceKind::ServicePrincipal,
        SourceKind::WorkloadIdentity,
        SourceKind::ManagedIdentity,
        SourceKind::AzureCli,
    ];

    /// The name `--auth` takes and `info`/`list` show.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::ServicePrincipal => "service-principal",
            SourceKind::WorkloadIdentity => "workload-identity",
            SourceKind::ManagedIdentity => "managed-identity",
            SourceKind::AzureCli => "azure-cli",
        }
    }

    pub fn from_name(name: &str) -> Option<SourceKind> {
        SourceKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An access token and when it stops being valid. `Debug` never shows the token.
#[derive(Clone)]
pub struct AccessToken {
    secret: String,
    /// When the service stops accepting it.
    pub expires_on: SystemTime,
    /// When it was received, to tell its lifetime.
    pub obtained: SystemTime,
}

impl fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AccessToken(<redacted>, expires in {:?})",
            self.expires_on
                .duration_since(SystemTime::now())
                .unwrap_or_default()
        )
    }
}

impl AccessToken {
    pub fn new(secret: String, expires_on: SystemTime) -> AccessToken {
        AccessToken {
            secret,
            expires_on,
            obtained: SystemTime::now(),
        }
    }

    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// How long it was valid for when it came.
    pub fn lifetime(&self) -> Duration {
        self.expires_on
            .duration_since(self.obtained)
            .unwrap_or_default()
    }

    /// When to renew it: 5 minutes before it expires, or at half its lifetime
    /// when it lives less than 10 minutes (as the Azure SDKs do), so a renewal
    /// that fails has time to be tried again before requests need it.
    pub fn renew_at(&self) -> SystemTime {
        let margin = Duration::from_secs(300).min(self.lifetime() / 2);
        self.expires_on - margin
    }
}

/// Seconds since the epoch as a time.
pub fn epoch(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// Why a source gave no token. Messages name the source's inputs (variables,
/// files, endpoints) and never hold a secret.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TokenError {
    /// The source is not set up on this machine (its variables are missing, no
    /// managed identity endpoint answers, `az` is not installed or not signed
    /// in): the chain goes on to the next one.
    #[error("{0}")]
    Unavailable(String),
    /// The source is set up but failed (a wrong secret, an expired federated
    /// token, an endpoint that refuses): the chain stops here and says so, since
    /// falling through to another identity would hide the mistake.
    #[error("{0}")]
    Failed(String),
}

/// One place a token can come from.
pub trait TokenSource: Send + Sync + fmt::Debug {
    fn kind(&self) -> SourceKind;

    /// Gets a fresh token. Called at sign-in and again for every renewal, so a
    /// source re-reads whatever may have changed (a rotated federated token file).
    fn fetch(&self) -> BoxFuture<'_, Result<AccessToken, TokenError>>;
}
