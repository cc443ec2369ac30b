//! `--auth`: which credential a command uses, and turning a blob's account into one
//! with that credential (signing in to Entra ID when it comes to that).
//!
//! Without `--auth` (`auto`): an account key or SAS, when the connection string or
//! the blob URL has one, is used as it is; a blob given without either (a URL, a
//! connection string with only `BlobEndpoint`, `AZURE_STORAGE_ACCOUNT` with
//! `container/name`) signs in with Entra ID through the chain, and when no source
//! is set up anywhere the command fails naming what it tried. Unsigned requests
//! (public containers) are made only with `--auth anonymous`: guessing them would
//! turn a missing login into a confusing "not found" or "access denied".

use std::sync::{Arc, OnceLock};

use anyhow::{bail, Result};
use blobdrive::azure::auth::entra::chain::EntraEnv;
use blobdrive::azure::auth::entra::keeper::TokenKeeper;
use blobdrive::azure::auth::entra::workload_identity::FederatedReader;
use blobdrive::azure::auth::entra::SourceKind;
use blobdrive::azure::auth::may_carry_token;
use blobdrive::azure::{Account, Credential};

/// Env var the `--auth` flag also reads (and the mount daemon gets it through).
pub const AUTH_ENV: &str = "BLOBDRIVE_AUTH";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AuthChoice {
    // Key or SAS when given, else Entra ID through the chain.
    #[default]
    Auto,
    // The connection string's AccountKey (Shared Key).
    Key,
    // The SAS of the blob URL or the connection string.
    Sas,
    // Entra ID, the first source of the chain that is set up.
    Entra,
    // Entra ID: AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET or
    // AZURE_CLIENT_CERTIFICATE_PATH.
    ServicePrincipal,
    // Entra ID: AZURE_FEDERATED_TOKEN_FILE (+ tenant and client id).
    WorkloadIdentity,
    // Entra ID: the host's managed identity (IMDS, or IDENTITY_ENDPOINT).
    ManagedIdentity,
    // Entra ID: the Azure CLI's signed-in account (`az login`).
    AzureCli,
    // No credential: unsigned requests, for public containers.
    Anonymous,
}

impl AuthChoice {
    /// The Entra ID source this choice is limited to (`None`: any, or not Entra).
    fn only_source(self) -> Option<SourceKind> {
        match self {
            AuthChoice::ServicePrincipal => Some(SourceKind::ServicePrincipal),
            AuthChoice::WorkloadIdentity => Some(SourceKind::WorkloadIdentity),
            AuthChoice::ManagedIdentity => Some(SourceKind::ManagedIdentity),
            AuthChoice::AzureCli => Some(SourceKind::AzureCli),
            _ => None,
        }
    }

    /// The value as `--auth` spells it.
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

/// Signs in at most once per process: every blob of a command (and the mount
/// daemon's whole life) shares one token keeper.
#[derive(Default)]
pub struct EntraSession {
    keeper: OnceLock<Arc<TokenKeeper>>,
}

impl EntraSession {
    /// The keeper, signing in first if no blob of this process has yet;
    /// `federated` reads workload identity's token file instead of this process.
    fn keeper(
        &self,
        only: Option<SourceKind>,
        federated: Option<&FederatedReader>,
    ) -> Result<Arc<TokenKeeper>> {
        if let Some(k) = self.keeper.get() {
            return Ok(k.clone());
        }
        let env = EntraEnv {
            federated_reader: federated.cloned(),
            ..EntraEnv::from_env()
        };
        let keeper = TokenKeeper::sign_in(env, only)?;
        Ok(self.keeper.get_or_init(|| keeper).clone())
    }
}

/// `account` with the credential `choice` asks for. `federated`, when given,
/// reads workload identity's federated token file in this process's stead (a
/// mount's walled worker asks its root part).
pub fn apply(
    choice: AuthChoice,
    mut account: Account,
    session: &EntraSession,
    federated: Option<&FederatedReader>,
) -> Result<Account> {
    let given = account.credential.clone();
    let entra = !matches!(
        (choice, &given),
        (AuthChoice::Key | AuthChoice::Sas | AuthChoice::Anonymous, _)
            | (
                AuthChoice::Auto,
                Credential::SharedKey { .. } | Credential::Sas(_)
            )
    );
    if entra && !may_carry_token(&account.blob_endpoint) {
        // Refused before signing in: a token would travel in the clear.
        bail!(
            "an Entra ID token is sent only over https, and the blob endpoint {} is plain http: use https (or give a key or SAS)",
            account.endpoint_for_messages()
        );
    }
    account.credential = match (choice, given) {
        (AuthChoice::Auto, c @ (Credential::SharedKey { .. } | Credential::Sas(_))) => c,
        (AuthChoice::Auto, Credential::Entra(k)) => Credential::Entra(k),
        (AuthChoice::Auto | AuthChoice::Entra, Credential::Anonymous) => {
            Credential::Entra(session.keeper(None, federated)?)
        }
        (AuthChoice::Entra, _) => Credential::Entra(session.keeper(None, federated)?),
        (AuthChoice::Key, c @ Credential::SharedKey { .. }) => c,
        (AuthChoice::Key, _) => bail!(
            "--auth key needs an account key: give a connection string with AccountName and AccountKey"
        ),
        (AuthChoice::Sas, c @ Credential::Sas(_)) => c,
        (AuthChoice::Sas, _) => bail!(
            "--auth sas needs a SAS: give the blob as an https://...?SAS URL or a connection string with SharedAccessSignature"
        ),
        (AuthChoice::Anonymous, _) => Credential::Anonymous,
        (source, _) => Credential::Entra(session.keeper(source.only_source(), federated)?),
    };
    Ok(account)
}
