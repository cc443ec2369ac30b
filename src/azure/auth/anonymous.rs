//! No authorisation: the [`Anonymous`] authorizer, for public containers.

use reqwest::Method;
use url::Url;

use super::{AuthError, Authorizer};

/// Sends requests as they are.
#[derive(Debug, Clone, Copy)]
pub struct Anonymous;

impl Authorizer for Anonymous {
    fn authorize(
        &self,
        _method: &Method,
        _url: &mut Url,
        _headers: &mut Vec<(String, String)>,
    ) -> Result<(), AuthError> {
        Ok(())
    }
}
