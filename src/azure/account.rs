//! Storage accounts from connection strings, and how requests to them are authorised.
//!
//! A connection string can hold an account key or a SAS; both are secrets, so nothing
//! here ever formats them: `Debug` is written by hand and error messages name only the
//! field that is wrong, never the string itself.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use base64::Engine;
use thiserror::Error;
use url::Url;

use super::auth::{Anonymous, Authorizer, Bearer, Sas, SharedKey};

/// Account name and key of the local emulator (public, documented by Microsoft).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// The emulator's well-known key; not a secret.
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Where the emulator's blob service listens by default.
pub const DEV_BLOB_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// The names a connection string may hold, as Azure spells them.
pub const KNOWN_NAMES: [&str; 11] = [
    "AccountName",
    "AccountKey",
    "DefaultEndpointsProtocol",
    "EndpointSuffix",
    "BlobEndpoint",
    "SharedAccessSignature",
    "UseDevelopmentStorage",
    "DevelopmentStorageProxyUri",
    "QueueEndpoint",
    "TableEndpoint",
    "FileEndpoint",
];

/// The known name an unknown one is most likely a typo of (at most 2 edits away).
fn closest_name(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    KNOWN_NAMES
        .iter()
        .map(|k| (edit_distance(&name, &k.to_ascii_lowercase()), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Why a connection string or blob URL was refused. Never contains the secret.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AccountError {
    /// Entry number (from 1) that has no `=`; the entry is not shown (it may be a
    /// pasted key).
    #[error("connection string: entry {0} is not of the form Name=Value")]
    Malformed(usize),
    /// `name` is None when what stands before `=` does not look like a name (a key
    /// ending in `=` does not) and so is not shown.
    #[error("connection string: {}{}; known names: {}", name.as_ref().map(|n| format!("unknown name '{n}'")).unwrap_or_else(|| "an entry's name is not a known name (not shown: it does not look like one and may be a secret)".to_string()), suggestion.map(|s| format!(" (did you mean {s}?)")).unwrap_or_default(), KNOWN_NAMES.join(", "))]
    UnknownName {
        name: Option<String>,
        suggestion: Option<&'static str>,
    },
    #[error("connection string: {0} is missing")]
    Missing(&'static str),
    #[error("connection string: AccountKey is not valid base64")]
    BadKey,
    #[error("connection string: {field} is not a valid URL")]
    BadUrl { field: &'static str },
    #[error("connection string: BlobEndpoint {endpoint} names no account: an emulator or IP-address endpoint carries the account in its path, as in {expected}")]
    NoAccountInPath { endpoint: String, expected: String },
    #[error("connection string: DefaultEndpointsProtocol must be http or https, not '{0}'")]
    BadProtocol(String),
}

/// How requests are authorised, as parsed. Each service handle turns it once into
/// an [`Authorizer`] ([`Account::authorizer`]).
#[derive(Clone)]
pub enum Credential {
    /// Shared Key: HMAC-SHA256 over each request with the decoded account key.
    SharedKey { key: Vec<u8> },
    /// A SAS token (the query string, without `?`), appended to every URL.
    Sas(String),
    /// No key or SAS was given. As parsed, this means "not said": the command line
    /// turns it into Entra ID when a token source is found (see `--auth`), and keeps
    /// it, unsigned requests for public containers, only when asked to.
    Anonymous,
    /// Entra ID: bearer tokens from one source, renewed in the background.
    Entra(std::sync::Arc<super::auth::entra::keeper::TokenKeeper>),
}

impl Credential {
    /// What `info` and `list` show: the kind of credential and, for Entra ID, its
    /// source; never a secret.
    pub fn describe(&self) -> String {
        match self {
            Credential::SharedKey { .. } => "account key".to_string(),
            Credential::Sas(_) => "SAS".to_string(),
            Credential::Anonymous => "anonymous".to_string(),
            Credential::Entra(k) => format!("Entra ID ({})", k.kind()),
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::SharedKey { .. } => f.write_str("SharedKey(<redacted>)"),
            Credential::Sas(_) => f.write_str("Sas(<redacted>)"),
            Credential::Anonymous => f.write_str("Anonymous"),
            Credential::Entra(k) => write!(f, "Entra({})", k.kind()),
        }
    }
}

/// A storage account's blob service: its endpoint and credential.
#[derive(Clone, Debug)]
pub struct Account {
    /// Account name, used in Shared Key signatures.
    pub name: String,
    /// Base URL of the blob service; path-style endpoints include the account
    /// (`http://127.0.0.1:10000/devstoreaccount1`), virtual-host ones do not.
    pub blob_endpoint: Url,
    pub credential: Credential,
}

impl Account {
    /// The local emulator with its well-known key.
    pub fn development() -> Account {
        Account {
            name: DEV_ACCOUNT.to_string(),
            blob_endpoint: Url::parse(DEV_BLOB_ENDPOINT).expect("constant URL"),
            credential: Credential::SharedKey {
                key: decode_key(DEV_KEY).expect("constant key"),
            },
        }
    }

    /// The authorizer for this account's credential: each service handle makes
    /// one. A new kind of credential is an arm here and its file under `auth`.
    pub fn authorizer(&self) -> Arc<dyn Authorizer> {
        match &self.credential {
            Credential::SharedKey { key } => Arc::new(SharedKey::new(&self.name, key.clone())),
            Credential::Sas(sas) => Arc::new(Sas::new(sas.clone())),
            Credential::Anonymous => Arc::new(Anonymous),
            Credential::Entra(keeper) => Arc::new(Bearer::new(keeper.clone())),
        }
    }

    /// The blob endpoint as messages show it: scheme, host, port and path only, so
    /// neither a query (a SAS someone put in `BlobEndpoint`) nor user info can leak.
    pub fn endpoint_for_messages(&self) -> String {
        let mut url = self.blob_endpoint.clone();
        url.set_query(None);
        url.set_fragment(None);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.as_str().trim_end_matches('/').to_string()
    }

    /// Parses an Azure Storage connection string. Keys are matched case-insensitively.
    pub fn from_connection_string(cs: &str) -> Result<Account, AccountError> {
        let mut name = None;
        let mut key = None;
        let mut protocol = None;
        let mut suffix = None;
        let mut blob_endpoint = None;
        let mut sas = None;
        let mut dev = false;
        let mut dev_proxy = None;
        let parts = cs.split(';').map(str::trim).filter(|p| !p.is_empty());
        for (index, part) in parts.enumerate() {
            // The entry itself is never shown: it may be a secret.
            let (k, v) = part
                .split_once('=')
                .ok_or(AccountError::Malformed(index + 1))?;
            let v = v.trim().to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "accountname" => name = Some(v),
                "accountkey" => key = Some(v),
                "defaultendpointsprotocol" => protocol = Some(v),
                "endpointsuffix" => suffix = Some(v),
                "blobendpoint" => blob_endpoint = Some(v),
                "sharedaccesssignature" => sas = Some(v.trim_start_matches('?').to_string()),
                "usedevelopmentstorage" => dev = v.eq_ignore_ascii_case("true"),
                "developmentstorageproxyuri" => dev_proxy = Some(v),
                // Endpoints of other services are irrelevant to a blob tool.
                "queueendpoint" | "tableendpoint" | "fileendpoint" => {}
                _ => {
                    // Known names are short and all letters; anything else may be
                    // a pasted key (base64 ends in `=`), so it is not shown.
                    let k = k.trim();
                    let name = (k.len() <= 40 && k.chars().all(|c| c.is_ascii_alphabetic()))
                        .then(|| k.to_string());
                    return Err(AccountError::UnknownName {
                        suggestion: name.as_deref().and_then(closest_name),
                        name,
                    });
                }
            }
        }
        if dev {
            let mut account = Account::development();
            if let Some(proxy) = dev_proxy {
                let mut url = Url::parse(&proxy).map_err(|_| AccountError::BadUrl {
                    field: "DevelopmentStorageProxyUri",
                })?;
                url.set_port(Some(10000)).ok();
                url.set_path(DEV_ACCOUNT);
                account.blob_endpoint = url;
            }
            return Ok(account);
        }
        let credential = match (key, sas) {
            (Some(k), _) => Credential::SharedKey {
                key: decode_key(&k)?,
            },
            (None, Some(s)) => Credential::Sas(s),
            (None, None) => Credential::Anonymous,
        };
        let blob_endpoint = match blob_endpoint {
            Some(ep) => {
                let url =
                    Url::parse(ep.trim_end_matches('/')).map_err(|_| AccountError::BadUrl {
                        field: "BlobEndpoint",
                    })?;
                if is_path_style(&url) && account_from_endpoint(&url).is_none() {
                    // Requests would go to /CONTAINER/BLOB, which the emulator reads
                    // as account CONTAINER and answers 400 InvalidResourceName.
                    let shown = Account {
                        name: String::new(),
                        blob_endpoint: url,
                        credential: Credential::Anonymous,
                    }
                    .endpoint_for_messages();
                    let account = name.as_deref().unwrap_or(DEV_ACCOUNT);
                    return Err(AccountError::NoAccountInPath {
                        expected: format!("{shown}/{account}"),
                        endpoint: shown,
                    });
                }
                url
            }
            None => {
                let account = name
                    .as_deref()
                    .ok_or(AccountError::Missing("AccountName"))?;
                let protocol = protocol.unwrap_or_else(|| "https".to_string());
                if protocol != "http" && protocol != "https" {
                    return Err(AccountError::BadProtocol(protocol));
                }
                let suffix = suffix.unwrap_or_else(|| "core.windows.net".to_string());
                Url::parse(&format!("{protocol}://{account}.blob.{suffix}")).map_err(|_| {
                    AccountError::BadUrl {
                        field: "AccountName/EndpointSuffix",
                    }
                })?
            }
        };
        let name = match name {
            Some(n) => n,
            None => {
                account_from_endpoint(&blob_endpoint).ok_or(AccountError::Missing("AccountName"))?
            }
        };
        if matches!(credential, Credential::SharedKey { .. }) && name.is_empty() {
            return Err(AccountError::Missing("AccountName"));
        }
        Ok(Account {
            name,
            blob_endpoint,
            credential,
        })
    }
}

/// Whether URLs on this host carry the account in the path (emulator, IP addresses)
/// rather than in the host name.
pub fn is_path_style(url: &Url) -> bool {
    match url.host_str() {
        Some(h) => {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok()
        }
        None => false,
    }
}

/// The account name an endpoint URL implies: the first path segment for path-style
/// URLs, the first host label otherwise.
pub fn account_from_endpoint(url: &Url) -> Option<String> {
    if is_path_style(url) {
        url.path_segments()?
            .find(|s| !s.is_empty())
            .map(str::to_string)
    } else {
        url.host_str()?.split('.').next().map(str::to_string)
    }
}

fn decode_key(k: &str) -> Result<Vec<u8>, AccountError> {
    base64::engine::general_purpose::STANDARD
        .decode(k.trim())
        .map_err(|_| AccountError::BadKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn development_storage() {
        let a = Account::from_connection_string("UseDevelopmentStorage=true").unwrap();
        assert_eq!(a.name, "devstoreaccount1");
        assert_eq!(
            a.blob_endpoint.as_str(),
            "http://127.0.0.1:10000/devstoreaccount1"
        );
        assert!(matches!(a.credential, Credential::SharedKey { .. }));
    }

    #[test]
    fn real_account_virtual_host() {
        let a = Account::from_connection_string(
            "DefaultEndpointsProtocol=https;AccountName=myacct;AccountKey=AAAA;EndpointSuffix=core.windows.net",
        )
        .unwrap();
        assert_eq!(a.name, "myacct");
        assert_eq!(
            a.blob_endpoint.as_str(),
            "https://myacct.blob.core.windows.net/"
        );
        assert!(!is_path_style(&a.blob_endpoint));
    }

    #[test]
    fn explicit_blob_endpoint_and_sas() {
        let a = Account::from_connection_string(
            "BlobEndpoint=http://127.0.0.1:10001/devstoreaccount1/;SharedAccessSignature=?sv=2021&sig=abc",
        )
        .unwrap();
        assert_eq!(a.name, "devstoreaccount1");
        assert!(is_path_style(&a.blob_endpoint));
        match a.credential {
            Credential::Sas(s) => assert_eq!(s, "sv=2021&sig=abc"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn errors_never_echo_secrets() {
        let e =
            Account::from_connection_string("AccountName=a;AccountKey=!!notbase64!!").unwrap_err();
        assert_eq!(e, AccountError::BadKey);
        assert!(!e.to_string().contains("notbase64"));
        let e = Account::from_connection_string("AccountKey=AAAA").unwrap_err();
        assert_eq!(e, AccountError::Missing("AccountName"));
        let e = Account::from_connection_string("garbage-without-equals").unwrap_err();
        assert_eq!(e, AccountError::Malformed(1));
        assert!(!e.to_string().contains("garbage"), "{e}");
        // A key pasted on its own (base64 ends in '=') is not echoed as a name.
        let e = Account::from_connection_string(&format!("AccountName=a;{DEV_KEY}")).unwrap_err();
        let m = e.to_string();
        assert!(!m.contains("Eby8") && m.contains("not shown"), "{m}");
    }

    #[test]
    fn unknown_names_are_named_with_the_known_ones() {
        let e = Account::from_connection_string("AccountNme=a;AccountKey=c2VjcmV0").unwrap_err();
        let m = e.to_string();
        assert!(m.contains("unknown name 'AccountNme'"), "{m}");
        assert!(m.contains("did you mean AccountName?"), "{m}");
        for k in KNOWN_NAMES {
            assert!(m.contains(k), "{m}");
        }
        assert!(!m.contains("Name=Value") && !m.contains("c2VjcmV0"), "{m}");
        let m = Account::from_connection_string("Frobnicate=1")
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("unknown name 'Frobnicate'") && !m.contains("did you mean"),
            "{m}"
        );
    }

    #[test]
    fn endpoint_for_messages_has_no_secrets() {
        let a = Account::from_connection_string(
            "BlobEndpoint=https://u:pw@acct.blob.core.windows.net/?sv=1&sig=SECRET;SharedAccessSignature=sv=1&sig=SECRET",
        )
        .unwrap();
        assert_eq!(
            a.endpoint_for_messages(),
            "https://acct.blob.core.windows.net"
        );
        assert_eq!(
            Account::development().endpoint_for_messages(),
            DEV_BLOB_ENDPOINT
        );
    }

    #[test]
    fn path_style_endpoint_without_account_says_what_is_expected() {
        let e = Account::from_connection_string(
            "AccountName=devstoreaccount1;AccountKey=AAAA;BlobEndpoint=http://127.0.0.1:10000/",
        )
        .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("BlobEndpoint http://127.0.0.1:10000 names no account")
                && m.contains("as in http://127.0.0.1:10000/devstoreaccount1"),
            "{m}"
        );
        let m = Account::from_connection_string(
            "AccountName=other;BlobEndpoint=http://localhost:9/?sv=1&sig=SECRET",
        )
        .unwrap_err()
        .to_string();
        assert!(m.contains("as in http://localhost:9/other"), "{m}");
        assert!(!m.contains("SECRET"), "{m}");
        // Virtual-host endpoints carry the account in the host name.
        Account::from_connection_string("BlobEndpoint=https://acct.blob.core.windows.net/")
            .unwrap();
    }

    #[test]
    fn debug_redacts() {
        let a = Account::development();
        let d = format!("{a:?}");
        assert!(!d.contains("Eby8"));
        assert!(d.contains("redacted"));
    }
}
