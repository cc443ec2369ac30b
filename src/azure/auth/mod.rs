//! How a request is authorised: one small interface, [`Authorizer`], and one file per
//! kind of credential ([`shared_key`], [`sas`], [`anonymous`], [`bearer`] for Entra ID
//! tokens, whose sources are under [`entra`]).
//!
//! The pipeline builds one authorizer per service handle from the parsed
//! [`Credential`](super::account::Credential)
//! ([`Account::authorizer`](super::account::Account::authorizer)) and calls it
//! once per attempt, after every other header is in place. A new kind of
//! credential is a new file here implementing [`Authorizer`], plus its arm in
//! `Account::authorizer` (and its parsing in `account`).

use std::fmt;

use reqwest::Method;
use thiserror::Error;
use url::Url;

use super::error::Op;

pub mod anonymous;
pub mod bearer;
pub mod entra;
pub mod sas;
pub mod shared_key;

pub use anonymous::Anonymous;
pub use bearer::Bearer;
pub use entra::BoxFuture;
pub use sas::Sas;
pub use shared_key::SharedKey;

/// Why a request could not be authorised. Never holds the secret.
///
/// Nothing was sent. The pipeline retries within its policy (a token may be on its
/// way), and if no attempt could be authorised the operation fails with
/// [`AzureError::NotAuthorized`](super::AzureError::NotAuthorized) carrying this
/// message, which a mount waits out like an outage.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot authorise the request: {0}")]
pub struct AuthError(pub String);

/// Whether a token (or any credential: a key's signature, a SAS) may be sent to
/// `url`: https, or plain http to this machine.
pub fn may_carry_token(url: &Url) -> bool {
    url.scheme() == "https" || is_loopback(url)
}

fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Authorises requests to one account.
///
/// `Debug` is required so a service handle can be inspected, and implementations must
/// write it by hand so that no secret (key, token, signature) ever appears in it.
pub trait Authorizer: Send + Sync + fmt::Debug {
    /// Authorises one attempt of a request, just before it is sent.
    ///
    /// `headers` are exactly the headers that will be sent, in order (`x-ms-date`,
    /// `x-ms-version`, the operation's own, `content-length` where there is one);
    /// `url` is the full request URL with its query. An implementation may add
    /// headers (Shared Key adds `authorization`) or extend the URL's query (SAS).
    /// Called afresh for every attempt, since a signature covers `x-ms-date`.
    ///
    /// It is synchronous and must not block or wait on the network: a credential
    /// whose secret is obtained from elsewhere (a bearer token, say) fetches and
    /// refreshes it in the background and reads its cached value here, returning
    /// [`AuthError`] when it has none.
    fn authorize(
        &self,
        method: &Method,
        url: &mut Url,
        headers: &mut Vec<(String, String)>,
    ) -> Result<(), AuthError>;

    /// Makes `url`, a blob of this account, readable by the service itself as the
    /// source of a copy (`x-ms-copy-source`). Nothing by default: the service
    /// accepts a source of the same account under the destination's own
    /// authorisation, or a public one.
    fn authorize_copy_source(&self, _url: &mut Url) {}

    /// Gets a new secret after the service refused the current one (401), if this
    /// credential has one to get; the pipeline then retries once.
    fn renew(&self) -> Option<BoxFuture<'_, Result<(), AuthError>>> {
        None
    }

    /// Token renewals tried and failed, for a credential that renews tokens.
    fn renewals(&self) -> Option<(u64, u64)> {
        None
    }

    /// What a 403 for `op` means with this credential, when it knows better than
    /// the generic advice.
    fn denied(&self, _op: Op) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::azure::account::{Account, Credential};

    #[test]
    fn loopback_is_told_apart() {
        for (u, yes) in [
            ("http://127.0.0.1:10000/a", true),
            ("http://localhost/a", true),
            ("http://[::1]:1/a", true),
            ("http://10.0.0.1/a", false),
            ("http://acct.blob.core.windows.net/a", false),
        ] {
            assert_eq!(is_loopback(&Url::parse(u).unwrap()), yes, "{u}");
        }
    }

    #[test]
    fn debug_never_shows_secrets() {
        let mut account = Account::development();
        let d = format!("{:?}", account.authorizer());
        assert!(!d.contains("Eby8"), "{d}");
        assert!(d.contains("redacted"), "{d}");
        account.credential = Credential::Sas("sv=2021-12-02&sig=TOPSECRET".into());
        let d = format!("{:?}", account.authorizer());
        assert!(!d.contains("TOPSECRET"), "{d}");
        assert!(d.contains("redacted"), "{d}");
        account.credential = Credential::Anonymous;
        assert_eq!(format!("{:?}", account.authorizer()), "Anonymous");
        let token = entra::AccessToken::new(
            "eyJTOPSECRET".into(),
            std::time::SystemTime::now() + std::time::Duration::from_secs(3600),
        );
        assert!(!format!("{token:?}").contains("TOPSECRET"));
        let source: Arc<dyn entra::TokenSource> =
            Arc::new(entra::azure_cli::AzureCli::new("/nonexistent/az"));
        account.credential = Credential::Entra(entra::keeper::TokenKeeper::start(source, token));
        let d = format!("{:?} {:?}", account.authorizer(), account.credential);
        assert!(!d.contains("TOPSECRET") && d.contains("azure-cli"), "{d}");
        assert_eq!(account.credential.describe(), "Entra ID (azure-cli)");
    }
}
