//! Shared access signatures: the [`Sas`] authorizer, which appends the token to every
//! request's URL and to copy sources.

use std::fmt;

use reqwest::Method;
use url::Url;

use super::{AuthError, Authorizer};

/// A SAS token (the query string, without `?`), appended to every URL.
#[derive(Clone)]
pub struct Sas {
    token: String,
}

impl Sas {
    pub fn new(token: String) -> Sas {
        Sas { token }
    }
}

impl fmt::Debug for Sas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sas(<redacted>)")
    }
}

impl Authorizer for Sas {
    fn authorize(
        &self,
        _method: &Method,
        url: &mut Url,
        _headers: &mut Vec<(String, String)>,
    ) -> Result<(), AuthError> {
        append_sas(url, &self.token);
        Ok(())
    }

    /// The service reads a copy source with the source's own SAS.
    fn authorize_copy_source(&self, url: &mut Url) {
        append_sas(url, &self.token);
    }
}

/// Appends a SAS token, byte for byte as given, to a URL's query.
fn append_sas(url: &mut Url, sas: &str) {
    let q = match url.query() {
        Some(q) if !q.is_empty() => format!("{q}&{sas}"),
        _ => sas.to_string(),
    };
    url.set_query(Some(&q));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_goes_verbatim_after_the_query() {
        let sas = Sas::new("sv=2021-12-02&sig=a%2Bb%3D".into());
        let mut url = Url::parse("http://h/a/c/b?comp=page").unwrap();
        let mut headers = Vec::new();
        sas.authorize(&Method::PUT, &mut url, &mut headers).unwrap();
        assert_eq!(
            url.as_str(),
            "http://h/a/c/b?comp=page&sv=2021-12-02&sig=a%2Bb%3D"
        );
        assert!(headers.is_empty());
        let mut url = Url::parse("http://h/a/c/b").unwrap();
        sas.authorize_copy_source(&mut url);
        assert_eq!(url.as_str(), "http://h/a/c/b?sv=2021-12-02&sig=a%2Bb%3D");
        assert!(!format!("{sas:?}").contains("sig"));
    }
}
