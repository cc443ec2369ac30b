//! What every command needs: the account and an async runtime.

use anyhow::{bail, Context as _, Result};
use blobdrive::azure::auth::entra::workload_identity::FederatedReader;
use blobdrive::azure::auth::may_carry_token;
use blobdrive::azure::{Account, BlobClient, BlobService, Credential};
use blobdrive::blobref::BlobRef;
use blobdrive::mount::IoSettings;

use super::auth::{self, AuthChoice, EntraSession};
use super::settings;

/// The parsed global options.
pub struct Context {
    /// The account named by a connection string or `AZURE_STORAGE_CONNECTION_STRING`
    /// (or `AZURE_STORAGE_ACCOUNT`); `None` when nothing names one. There is no
    /// default: blobdrive runs as root, and a default endpoint (the local emulator
    /// on 127.0.0.1:10000 with its public key) would be whatever any local user
    /// listens there with, serving the image root mounts.
    pub account: Option<Account>,
    /// `--auth`.
    pub auth: AuthChoice,
    /// The retry policy and I/O timeout from the environment, read once here.
    pub io: IoSettings,
    entra: EntraSession,
}

/// The account `AZURE_STORAGE_ACCOUNT` names when no connection string is given:
/// the public cloud's endpoint and no key, so Entra ID signs in.
const ACCOUNT_ENV: &str = "AZURE_STORAGE_ACCOUNT";

/// What a command that needs an account says when none is named; one line.
pub const NOT_CONFIGURED: &str = "no storage account is configured: set AZURE_STORAGE_CONNECTION_STRING (or --connection-string), or AZURE_STORAGE_ACCOUNT to sign in with Entra ID, or give a credentials file (--credentials FILE, fstab credentials=FILE); for the local emulator say so: AZURE_STORAGE_CONNECTION_STRING=UseDevelopmentStorage=true";

impl Context {
    pub fn new(connection_string: Option<&str>, auth: AuthChoice) -> Result<Context> {
        let named = std::env::var(ACCOUNT_ENV)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let account = match (
            connection_string.map(str::trim).filter(|s| !s.is_empty()),
            named,
        ) {
            (Some(cs), _) => Some(Account::from_connection_string(cs)?),
            (None, Some(name)) => Some(
                Account::from_connection_string(&format!("AccountName={name}"))
                    .with_context(|| format!("{ACCOUNT_ENV}={name}"))?,
            ),
            (None, None) => None,
        };
        Ok(Context {
            account,
            auth,
            io: settings::io_settings(),
            entra: EntraSession::default(),
        })
    }

    /// The account `r` lives in, with the credential `--auth` asks for (signing in
    /// to Entra ID if it comes to that). A blob given as a URL names its own
    /// service; any other needs a configured account.
    pub fn account_for(&self, r: &BlobRef) -> Result<Account> {
        self.sign_in(self.unsigned_account_for(r)?, None)
    }

    /// The account `r` lives in as configured, before signing in: which
    /// service, not yet with what credential (see [`Context::sign_in`]).
    pub fn unsigned_account_for(&self, r: &BlobRef) -> Result<Account> {
        Ok(match (&self.account, r.has_own_endpoint()) {
            (Some(default), _) => r.account(default),
            (None, true) => r.account(&no_account()),
            (None, false) => bail!("{NOT_CONFIGURED}"),
        })
    }

    /// Gives `account` the credential `--auth` asks for (signing in to Entra ID
    /// if it comes to that), refused if it would travel in the clear.
    /// `federated` reads workload identity's federated token file in this
    /// process's stead (see `auth::apply`).
    pub fn sign_in(
        &self,
        account: Account,
        federated: Option<&FederatedReader>,
    ) -> Result<Account> {
        let account = auth::apply(self.auth, account, &self.entra, federated)?;
        check_transport(&account)?;
        Ok(account)
    }

    /// The configured account's blob service, for a command that works on many
    /// drives (the CSI driver).
    pub fn service(&self) -> Result<BlobService> {
        let Some(account) = self.account.clone() else {
            bail!("{NOT_CONFIGURED}");
        };
        let account = auth::apply(self.auth, account, &self.entra, None)?;
        check_transport(&account)?;
        Ok(BlobService::with_policy(account, self.io.retry.clone()))
    }

    /// Parses a BLOB argument and makes a client for it.
    pub fn blob(&self, spec: &str) -> Result<(BlobRef, BlobClient)> {
        let r = BlobRef::parse(spec)?;
        let svc = BlobService::with_policy(self.account_for(&r)?, self.io.retry.clone());
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

/// The default a blob URL is resolved against when no account is configured: one
/// that matches no real service and carries no credential, so the URL's own SAS
/// (or Entra ID) is all that is used.
fn no_account() -> Account {
    Account {
        name: String::new(),
        blob_endpoint: "https://unconfigured.invalid/"
            .parse()
            .expect("constant URL"),
        credential: Credential::Anonymous,
    }
}

/// Says that a proxy named for plain http is not used (the endpoint is reached
/// directly), so that an operator who meant it learns why it was passed by.
fn say_plain_http_bypasses_proxies() {
    let named: Vec<&str> = blobdrive::azure::http::PLAIN_PROXY_VARS
        .into_iter()
        .filter(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
        .collect();
    if !named.is_empty() {
        eprintln!(
            "warning: {} not used: plain http goes only to this machine's loopback, never through a proxy (a key's signature or SAS would cross the network in the clear)",
            named.join(", ")
        );
    }
}

/// Refuses, before anything is sent, to send a credential (a key's signature, a
/// SAS, a token) in the clear: over plain http it can be read and replayed by
/// anyone on the path, whose unauthenticated answers would then be trusted too.
/// Plain http is fine to this machine's loopback (an emulator, a local proxy).
fn check_transport(account: &Account) -> Result<()> {
    if account.blob_endpoint.scheme() == "http" {
        say_plain_http_bypasses_proxies();
    }
    if matches!(account.credential, Credential::Anonymous)
        || may_carry_token(&account.blob_endpoint)
    {
        return Ok(());
    }
    bail!(
        "the blob endpoint {} is plain http to another machine: an account key, SAS or token is sent only over https (or plain http to this machine's loopback); use an https:// endpoint",
        account.endpoint_for_messages()
    )
}
