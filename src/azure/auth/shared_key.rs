//! Shared Key: the [`SharedKey`] authorizer, and the signing it does (the
//! string-to-sign and its HMAC).
//!
//! The signing is kept free of any HTTP client type so it can be tested against
//! fixed vectors: a request is described by its method, URL and headers as plain
//! strings.

use std::fmt;

use base64::Engine;
use hmac::{Hmac, Mac};
use reqwest::Method;
use sha2::Sha256;
use url::Url;

use super::{AuthError, Authorizer};

/// Signs every request with the account key: HMAC-SHA256 over the request, sent as
/// `Authorization: SharedKey account:signature`.
#[derive(Clone)]
pub struct SharedKey {
    account: String,
    key: Vec<u8>,
}

impl SharedKey {
    /// `key` is the decoded account key.
    pub fn new(account: &str, key: Vec<u8>) -> SharedKey {
        SharedKey {
            account: account.to_string(),
            key,
        }
    }
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedKey({}, <redacted>)", self.account)
    }
}

impl Authorizer for SharedKey {
    fn authorize(
        &self,
        method: &Method,
        url: &mut Url,
        headers: &mut Vec<(String, String)>,
    ) -> Result<(), AuthError> {
        let sts = string_to_sign(method.as_str(), url, headers, &self.account);
        headers.push((
            "authorization".into(),
            authorization(&self.account, &self.key, &sts),
        ));
        Ok(())
    }
}

/// The standard headers, in the order the string-to-sign lists them.
const STANDARD_HEADERS: [&str; 11] = [
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
];

/// Builds the Shared Key string-to-sign (version 2009-09-19 and later) for a request.
/// `headers` are (name, value) pairs in any case and order.
pub fn string_to_sign(
    method: &str,
    url: &Url,
    headers: &[(String, String)],
    account: &str,
) -> String {
    let lookup = |name: &str| -> String {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut out = String::with_capacity(256);
    out.push_str(method);
    out.push('\n');
    for h in STANDARD_HEADERS {
        let mut v = lookup(h);
        // Since version 2015-02-21 a zero Content-Length is signed as empty.
        if h == "content-length" && v == "0" {
            v.clear();
        }
        out.push_str(&v);
        out.push('\n');
    }
    out.push_str(&canonicalized_headers(headers));
    out.push_str(&canonicalized_resource(url, account));
    out
}

/// Every `x-ms-*` header, lower-cased, sorted, `name:value\n`.
fn canonicalized_headers(headers: &[(String, String)]) -> String {
    let mut ms: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| k.to_ascii_lowercase().starts_with("x-ms-"))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    ms.sort();
    ms.iter().map(|(k, v)| format!("{k}:{v}\n")).collect()
}

/// `/account/path` then `\nname:value` per query parameter: names lower-cased and
/// sorted, values decoded, several values of one name sorted and comma-joined.
fn canonicalized_resource(url: &Url, account: &str) -> String {
    let mut out = format!("/{account}{}", url.path());
    let mut params: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
        .collect();
    params.sort();
    let mut i = 0;
    while i < params.len() {
        let name = params[i].0.clone();
        let mut values = Vec::new();
        while i < params.len() && params[i].0 == name {
            values.push(params[i].1.clone());
            i += 1;
        }
        out.push('\n');
        out.push_str(&name);
        out.push(':');
        out.push_str(&values.join(","));
    }
    out
}

/// `SharedKey account:signature` for the given string-to-sign.
pub fn authorization(account: &str, key: &[u8], string_to_sign: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(string_to_sign.as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!("SharedKey {account}:{sig}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn put_page_vector() {
        let url =
            Url::parse("http://127.0.0.1:10000/devstoreaccount1/disks/a.vhd?comp=page").unwrap();
        let headers = h(&[
            ("Content-Length", "512"),
            ("x-ms-version", "2021-12-02"),
            ("x-ms-date", "Sun, 22 Nov 2026 11:05:54 GMT"),
            ("x-ms-range", "bytes=0-511"),
            ("x-ms-page-write", "update"),
            ("x-ms-lease-id", "0f0e0d0c-0000-4000-8000-000000000001"),
        ]);
        let sts = string_to_sign("PUT", &url, &headers, "devstoreaccount1");
        let expected = "PUT\n\n\n512\n\n\n\n\n\n\n\n\n\
x-ms-date:Sun, 22 Nov 2026 11:05:54 GMT\n\
x-ms-lease-id:0f0e0d0c-0000-4000-8000-000000000001\n\
x-ms-page-write:update\n\
x-ms-range:bytes=0-511\n\
x-ms-version:2021-12-02\n\
/devstoreaccount1/devstoreaccount1/disks/a.vhd\ncomp:page";
        assert_eq!(sts, expected);
    }

    #[test]
    fn zero_length_and_if_none_match_and_sorted_query() {
        let url = Url::parse(
            "https://acct.blob.core.windows.net/c/b?snapshot=2026-11-22T11%3A05%3A54.5810000Z&comp=pagelist&Include=b&include=a",
        )
        .unwrap();
        let headers = h(&[
            ("Content-Length", "0"),
            ("If-None-Match", "*"),
            ("X-MS-Version", "2021-12-02"),
            ("x-ms-date", "Sun, 22 Nov 2026 11:05:54 GMT"),
        ]);
        let sts = string_to_sign("GET", &url, &headers, "acct");
        let expected = "GET\n\n\n\n\n\n\n\n\n*\n\n\n\
x-ms-date:Sun, 22 Nov 2026 11:05:54 GMT\n\
x-ms-version:2021-12-02\n\
/acct/c/b\ncomp:pagelist\ninclude:a,b\nsnapshot:2026-11-22T11:05:54.5810000Z";
        assert_eq!(sts, expected);
    }

    #[test]
    fn signature_vector() {
        // HMAC-SHA256 with the emulator key over a fixed string: computed independently
        // (Python's hmac module) and pinned, so any change to the encoding or key handling shows up here.
        let key = base64::engine::general_purpose::STANDARD
            .decode(crate::azure::account::DEV_KEY)
            .unwrap();
        let auth = authorization("devstoreaccount1", &key, "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:Sun, 22 Nov 2026 11:05:54 GMT\nx-ms-version:2021-12-02\n/devstoreaccount1/devstoreaccount1/c\nrestype:container");
        assert!(auth.starts_with("SharedKey devstoreaccount1:"));
        let sig = auth.rsplit(':').next().unwrap();
        assert_eq!(sig.len(), 44);
        assert_eq!(sig, PINNED_SIGNATURE);
    }

    const PINNED_SIGNATURE: &str = "US/ENVF2sbxqf+TUZ6h2bZDGy3TsYgafwDmWdy48LiU=";

    #[test]
    fn authorizer_appends_the_signature_and_leaves_the_url() {
        let key = base64::engine::general_purpose::STANDARD
            .decode(crate::azure::account::DEV_KEY)
            .unwrap();
        let auth = SharedKey::new("devstoreaccount1", key.clone());
        let url =
            Url::parse("http://127.0.0.1:10000/devstoreaccount1/c?restype=container").unwrap();
        let mut headers = h(&[
            ("x-ms-date", "Sun, 22 Nov 2026 11:05:54 GMT"),
            ("x-ms-version", "2021-12-02"),
        ]);
        let sts = string_to_sign("GET", &url, &headers, "devstoreaccount1");
        let mut sent = url.clone();
        auth.authorize(&Method::GET, &mut sent, &mut headers)
            .unwrap();
        assert_eq!(sent, url);
        assert_eq!(
            headers.last().unwrap(),
            &(
                "authorization".to_string(),
                authorization("devstoreaccount1", &key, &sts)
            )
        );
        assert!(!format!("{auth:?}").contains("Eby8"));
    }
}
