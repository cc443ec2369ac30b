//! What every command needs: the default account and an async runtime.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _, Result};
use blobdrive::azure::account::DEV_BLOB_ENDPOINT;
use blobdrive::azure::{Account, BlobClient, BlobService};
use blobdrive::blobref::BlobRef;

use super::auth::{self, AuthChoice, EntraSession};

/// The parsed global options.
pub struct Context {
    pub account: Account,
    /// Whether a connection string (or `AZURE_STORAGE_ACCOUNT`) was given; without
    /// one the account is the local emulator's, which a new user may not have
    /// running.
    pub configured: bool,
    /// `--auth`.
    pub auth: AuthChoice,
    entra: EntraSession,
}

/// The account `AZURE_STORAGE_ACCOUNT` names when no connection string is given:
/// the public cloud's endpoint and no key, so Entra ID signs in.
const ACCOUNT_ENV: &str = "AZURE_STORAGE_ACCOUNT";

/// What to do when the default emulator does not answer; one line.
const NOT_CONFIGURED_HINT: &str = "no connection string is set, so the local emulator was tried: set AZURE_STORAGE_CONNECTION_STRING (or --connection-string) to your storage account's connection string, or start an emulator with `scripts/azurite.sh start DIR` and point AZURE_STORAGE_CONNECTION_STRING at it (see the README)";

impl Context {
    pub fn new(connection_string: Option<&str>, auth: AuthChoice) -> Result<Context> {
        let named = std::env::var(ACCOUNT_ENV)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let (account, configured) = match (
            connection_string.map(str::trim).filter(|s| !s.is_empty()),
            named,
        ) {
            (Some(cs), _) => (Account::from_connection_string(cs)?, true),
            (None, Some(name)) => (
                Account::from_connection_string(&format!("AccountName={name}"))
                    .with_context(|| format!("{ACCOUNT_ENV}={name}"))?,
                true,
            ),
            (None, None) => (Account::development(), false),
        };
        Ok(Context {
            account,
            configured,
            auth,
            entra: EntraSession::default(),
        })
    }

    /// The account `r` lives in, with the credential `--auth` asks for (signing in
    /// to Entra ID if it comes to that).
    pub fn account_for(&self, r: &BlobRef) -> Result<Account> {
        let account = r.account(&self.account);
        if !self.configured && !r.has_own_endpoint() {
            emulator_listens(&account)?;
        }
        auth::apply(self.auth, account, &self.entra)
    }

    /// Parses a BLOB argument and makes a client for it.
    pub fn blob(&self, spec: &str) -> Result<(BlobRef, BlobClient)> {
        let r = BlobRef::parse(spec)?;
        let svc = BlobService::new(self.account_for(&r)?);
        let client = r.client(&svc);
        Ok((r, client))
    }

    /// Runs a future to completion on a fresh runtime. Commands are short-lived, so
    /// a small runtime per command keeps `main` free of async.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        Ok(rt.block_on(f))
    }
}

/// With no connection string, fails at once when nothing listens where the default
/// emulator would: a refused connection on this machine's loopback is not an outage
/// that retries could wait out (and the user has configured nothing that might come
/// back), so eight attempts over several seconds would only delay the advice. Only
/// the default emulator endpoint is checked; configured endpoints, loopback ones
/// included, keep the full retry policy.
fn emulator_listens(account: &Account) -> Result<()> {
    if account.endpoint_for_messages() != DEV_BLOB_ENDPOINT {
        return Ok(());
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], 10000));
    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => bail!(
            "cannot reach the storage service at {DEV_BLOB_ENDPOINT}: connection refused (nothing listens on 127.0.0.1:10000); {NOT_CONFIGURED_HINT}"
        ),
        // Anything else (a slow answer, a firewall) goes to the normal retries.
        _ => Ok(()),
    }
}

/// Adds what to do to an error of a command run without a connection string whose
/// default emulator did not answer (also when the error came back from the mount
/// daemon as text).
pub fn explain(err: anyhow::Error, configured: bool) -> anyhow::Error {
    let text = format!("{err:#}");
    let marker = format!("no answer from the storage service at {DEV_BLOB_ENDPOINT} ");
    if configured || !text.contains(&marker) || text.contains(NOT_CONFIGURED_HINT) {
        return err;
    }
    anyhow!("{text}; {NOT_CONFIGURED_HINT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanswered_default_emulator_gets_the_advice_once() {
        let e = anyhow!(
            "cannot read disks/a.vhd: no answer from the storage service at {DEV_BLOB_ENDPOINT} after 8 attempt(s) in 9.0s (timed out)"
        );
        let m = format!("{:#}", explain(e, false));
        assert!(m.contains("AZURE_STORAGE_CONNECTION_STRING"), "{m}");
        assert_eq!(m.matches(NOT_CONFIGURED_HINT).count(), 1, "{m}");
        let again = format!("{:#}", explain(anyhow!("{m}"), false));
        assert_eq!(again, m);
        let e = anyhow!("cannot read disks/a.vhd: no answer from the storage service at {DEV_BLOB_ENDPOINT} after 1 attempt(s)");
        assert!(!format!("{:#}", explain(e, true)).contains("scripts/azurite.sh"));
        let e = anyhow!("cannot read x/y: no answer from the storage service at http://10.0.0.1/acct after 1 attempt(s)");
        assert!(!format!("{:#}", explain(e, false)).contains("scripts/azurite.sh"));
    }
}
