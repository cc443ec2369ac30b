//! The Azure CLI's signed-in account: `az account get-access-token --scope
//! https://storage.azure.com/.default --output json`, run afresh for every renewal
//! (the CLI refreshes its own cached tokens, so a daemon keeps working as long as
//! the CLI's login does).
//!
//! `az` runs without this process's secrets in its environment (a client secret,
//! a connection string, an App Service identity header and every `BLOBDRIVE_*`
//! variable are removed); it keeps the rest, which it needs (`HOME`,
//! `AZURE_CONFIG_DIR`, proxies).

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::http::token_from;
use super::{AccessToken, BoxFuture, SourceKind, TokenError, TokenSource, SCOPE};

/// Longest `az` may take (it is a Python program, and may refresh its token).
const AZ_TIMEOUT: Duration = Duration::from_secs(20);

/// Variables that hold secrets `az` has no business seeing.
const SECRET_VARS: [&str; 6] = [
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "IDENTITY_HEADER",
];

#[derive(Debug)]
pub struct AzureCli {
    program: String,
    /// Whether a token ever came: from then on, failures are failures.
    answered: std::sync::atomic::AtomicBool,
}

impl Default for AzureCli {
    fn default() -> Self {
        AzureCli::new("az")
    }
}

impl AzureCli {
    pub fn new(program: &str) -> AzureCli {
        AzureCli {
            program: program.to_string(),
            answered: Default::default(),
        }
    }

    async fn run(&self) -> Result<AccessToken, TokenError> {
        use std::sync::atomic::Ordering;
        if crate::privsep::walled() {
            // A mount's worker runs no program; running `az` as root for it
            // would have root's process read the token service's answers.
            return Err(TokenError::Unavailable(
                "the Azure CLI is not used by a mount's daemon, whose network-facing part may run no program: sign the mount in another way (a service principal, managed identity or workload identity)".to_string(),
            ));
        }
        let probing = !self.answered.load(Ordering::SeqCst);
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args([
            "account",
            "get-access-token",
            "--scope",
            SCOPE,
            "--output",
            "json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        for v in SECRET_VARS {
            cmd.env_remove(v);
        }
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BLOBDRIVE_") {
                cmd.env_remove(k);
            }
        }
        let output = match tokio::time::timeout(AZ_TIMEOUT, cmd.output()).await {
            Err(_) => {
                return Err(TokenError::Failed(format!(
                    "`az account get-access-token` did not finish within {} s",
                    AZ_TIMEOUT.as_secs()
                )))
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TokenError::Unavailable(
                    "no Azure CLI: `az` is not on PATH".to_string(),
                ))
            }
            Ok(Err(e)) => {
                return Err(TokenError::Failed(format!("cannot run `az`: {e}")));
            }
            Ok(Ok(o)) => o,
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let line = stderr
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("no message")
                .trim_start_matches("ERROR: ")
                .to_string();
            let not_logged_in = stderr.contains("az login");
            return Err(if probing && not_logged_in {
                TokenError::Unavailable(format!("Azure CLI not signed in (run `az login`): {line}"))
            } else {
                TokenError::Failed(format!("`az account get-access-token` failed: {line}"))
            });
        }
        let body: Value = serde_json::from_slice(&output.stdout).map_err(|_| {
            TokenError::Failed("`az account get-access-token` printed no JSON".to_string())
        })?;
        let token = token_from(&body)
            .map_err(|e| TokenError::Failed(format!("`az account get-access-token`: {e}")))?;
        self.answered.store(true, Ordering::SeqCst);
        Ok(token)
    }
}

impl TokenSource for AzureCli {
    fn kind(&self) -> SourceKind {
        SourceKind::AzureCli
    }

    fn fetch(&self) -> BoxFuture<'_, Result<AccessToken, TokenError>> {
        Box::pin(self.run())
    }
}
