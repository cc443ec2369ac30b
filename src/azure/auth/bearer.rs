//! Entra ID bearer tokens: the [`Bearer`] authorizer, which sends the current token
//! of a [`TokenKeeper`] as `Authorization: Bearer`.
//!
//! A token is as good as a password for an hour, so it is sent only over https, or
//! plain http to this machine's loopback (a local proxy or test stub), never over
//! the network in the clear.

use std::fmt;
use std::sync::Arc;

use reqwest::Method;
use url::Url;

use super::entra::keeper::TokenKeeper;
use super::{may_carry_token, AuthError, Authorizer, BoxFuture};
use crate::azure::error::Op;

pub struct Bearer {
    keeper: Arc<TokenKeeper>,
}

impl Bearer {
    pub fn new(keeper: Arc<TokenKeeper>) -> Bearer {
        Bearer { keeper }
    }
}

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bearer({}, <redacted>)", self.keeper.kind())
    }
}

impl Authorizer for Bearer {
    fn authorize(
        &self,
        _method: &Method,
        url: &mut Url,
        headers: &mut Vec<(String, String)>,
    ) -> Result<(), AuthError> {
        if !may_carry_token(url) {
            return Err(AuthError(format!(
                "an Entra ID token is sent only over https, and the blob endpoint {} is plain http",
                url.origin().ascii_serialization()
            )));
        }
        let token = self.keeper.bearer()?;
        headers.push(("authorization".into(), format!("Bearer {token}")));
        Ok(())
    }

    fn renew(&self) -> Option<BoxFuture<'_, Result<(), AuthError>>> {
        Some(Box::pin(self.keeper.renew_now()))
    }

    fn renewals(&self) -> Option<(u64, u64)> {
        Some(self.keeper.renewals())
    }

    fn denied(&self, op: Op) -> Option<String> {
        let (role, why) = if op.is_read() {
            (
                "Storage Blob Data Reader",
                "to read; \"Storage Blob Data Contributor\" to write",
            )
        } else {
            (
                "Storage Blob Data Contributor",
                "to write, lease and snapshot",
            )
        };
        Some(format!(
            "access denied: the identity signed in through {} has no data access here; it needs the role \"{role}\" ({why}) on the storage account or container (role assignments can take a few minutes to apply)",
            self.keeper.kind()
        ))
    }
}
