//! How users name a blob: `container/name.vhd`, `container/name.vhd@SNAPSHOT`, or a
//! full `https://account.blob.core.windows.net/container/name.vhd?SAS` URL.
//!
//! A URL can carry its own account and SAS; its SAS is kept apart from everything that
//! is ever displayed, so messages name the blob as `container/name` only.

use std::fmt;

use thiserror::Error;
use url::Url;

use crate::azure::account::{account_from_endpoint, is_path_style};
use crate::azure::{Account, BlobClient, BlobService, Credential};

/// Why a BLOB argument was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BlobRefError {
    #[error("'{0}' is not a blob: expected container/name.vhd or an https:// URL")]
    Shape(String),
    #[error("invalid container name '{0}': 3 to 63 characters, lower-case letters, digits and single hyphens, starting with a letter or digit")]
    Container(String),
    #[error("invalid snapshot '{0}': expected a time like 2026-11-22T11:05:54.5810000Z (see `blobdrive snapshot list`)")]
    Snapshot(String),
    #[error("invalid blob URL: {0}")]
    Url(String),
    #[error("'{given}' is a snapshot of {other}, not of {this}")]
    OtherBlob {
        given: String,
        other: String,
        this: String,
    },
    #[error("'{0}' names no snapshot: expected a time like 2026-11-22T11:05:54.5810000Z or BLOB@SNAPSHOT")]
    NoSnapshot(String),
}

/// A parsed BLOB argument.
#[derive(Clone)]
pub struct BlobRef {
    pub container: String,
    pub name: String,
    pub snapshot: Option<String>,
    /// Set when the blob was given as a URL: its own endpoint, and SAS if any.
    endpoint: Option<(Url, Option<String>)>,
}

impl fmt::Debug for BlobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobRef({self})")
    }
}

impl fmt::Display for BlobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.container, self.name)?;
        if let Some(s) = &self.snapshot {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

impl BlobRef {
    pub fn parse(spec: &str) -> Result<BlobRef, BlobRefError> {
        let spec = spec.trim();
        if spec.starts_with("https://") || spec.starts_with("http://") {
            return parse_url(spec);
        }
        let (path, snapshot) = split_snapshot(spec)?;
        let (container, name) = path
            .split_once('/')
            .filter(|(c, n)| !c.is_empty() && !n.is_empty() && !n.ends_with('/'))
            .ok_or_else(|| BlobRefError::Shape(spec.to_string()))?;
        check_container(container)?;
        Ok(BlobRef {
            container: container.to_string(),
            name: name.to_string(),
            snapshot,
            endpoint: None,
        })
    }

    /// The same blob without its snapshot.
    pub fn base(&self) -> BlobRef {
        BlobRef {
            snapshot: None,
            ..self.clone()
        }
    }

    /// The snapshot id in `spec`, a snapshot of this blob named as the tool prints it
    /// (`container/name.vhd@2026-...Z`), as a bare time (`2026-...Z`) or as a URL
    /// with `snapshot=`. A snapshot of another blob is refused, never silently taken
    /// as a snapshot of this one.
    pub fn snapshot_of(&self, spec: &str) -> Result<String, BlobRefError> {
        let spec = spec.trim();
        if !spec.contains('@') && !spec.starts_with("https://") && !spec.starts_with("http://") {
            check_snapshot(spec)?;
            return Ok(spec.to_string());
        }
        let other = BlobRef::parse(spec)?;
        let Some(id) = other.snapshot.clone() else {
            return Err(BlobRefError::NoSnapshot(spec.to_string()));
        };
        let same_account = match (&self.endpoint, &other.endpoint) {
            (Some((a, _)), Some((b, _))) => a == b,
            _ => true,
        };
        if other.container != self.container || other.name != self.name || !same_account {
            return Err(BlobRefError::OtherBlob {
                given: other.to_string(),
                other: other.base().to_string(),
                this: self.base().to_string(),
            });
        }
        Ok(id)
    }

    /// Whether the blob came as a URL (with its own account).
    pub fn has_own_endpoint(&self) -> bool {
        self.endpoint.is_some()
    }

    /// The account this blob lives in: the URL's own (with its SAS, or with the
    /// default account's credential when it is the same account), else `default`.
    pub fn account(&self, default: &Account) -> Account {
        match &self.endpoint {
            None => default.clone(),
            Some((endpoint, sas)) => {
                let name = account_from_endpoint(endpoint).unwrap_or_default();
                let credential = match sas {
                    Some(s) => Credential::Sas(s.clone()),
                    // The same service (scheme, host and port: emulators on one
                    // host differ by port) and account: its credential.
                    None if name == default.name
                        && endpoint.origin() == default.blob_endpoint.origin() =>
                    {
                        default.credential.clone()
                    }
                    None => Credential::Anonymous,
                };
                Account {
                    name,
                    blob_endpoint: endpoint.clone(),
                    credential,
                }
            }
        }
    }

    /// A client for this blob on `svc` (which must be for [`BlobRef::account`]).
    pub fn client(&self, svc: &BlobService) -> BlobClient {
        svc.blob(&self.container, &self.name)
            .at_snapshot(self.snapshot.as_deref())
    }
}

fn parse_url(spec: &str) -> Result<BlobRef, BlobRefError> {
    let url = Url::parse(spec).map_err(|e| BlobRefError::Url(e.to_string()))?;
    let segments: Vec<String> = url
        .path_segments()
        .map(|s| {
            s.map(|p| {
                percent_encoding::percent_decode_str(p)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect()
        })
        .unwrap_or_default();
    let skip = usize::from(is_path_style(&url));
    if segments.len() < skip + 2 {
        return Err(BlobRefError::Url(
            "expected .../container/name in the path".to_string(),
        ));
    }
    let mut endpoint = url.clone();
    endpoint.set_query(None);
    endpoint.set_fragment(None);
    endpoint.set_path(if skip == 1 { &segments[0] } else { "" });
    let container = segments[skip].clone();
    let name = segments[skip + 1..].join("/");
    if name.is_empty() {
        return Err(BlobRefError::Url(
            "no blob name after the container".to_string(),
        ));
    }
    check_container(&container)?;
    // Split the query into the snapshot (ours to handle) and the SAS (opaque, kept
    // byte for byte as the user gave it).
    let mut snapshot = None;
    let mut sas_parts = Vec::new();
    if let Some(q) = url.query() {
        for part in q.split('&').filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some(("snapshot", v)) => {
                    let v = percent_encoding::percent_decode_str(v)
                        .decode_utf8_lossy()
                        .into_owned();
                    check_snapshot(&v)?;
                    snapshot = Some(v);
                }
                _ => sas_parts.push(part),
            }
        }
    }
    let (name, at_snapshot) = split_snapshot(&name)?;
    let snapshot = snapshot.or(at_snapshot);
    let sas = (!sas_parts.is_empty()).then(|| sas_parts.join("&"));
    Ok(BlobRef {
        container,
        name: name.to_string(),
        snapshot,
        endpoint: Some((endpoint, sas)),
    })
}

/// `name@SNAPSHOT` → (name, snapshot). An `@` followed by something that is not a
/// snapshot time is an error rather than part of the name: a typo in a snapshot must
/// never silently address the base blob.
fn split_snapshot(spec: &str) -> Result<(&str, Option<String>), BlobRefError> {
    match spec.rsplit_once('@') {
        Some((path, snap)) => {
            check_snapshot(snap)?;
            Ok((path, Some(snap.to_string())))
        }
        None => Ok((spec, None)),
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fffffff]Z`.
fn check_snapshot(s: &str) -> Result<(), BlobRefError> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|x| x.iter().all(u8::is_ascii_digit));
    let ok = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[b.len() - 1] == b'Z'
        && (b.len() == 20
            || (b[19] == b'.' && b.len() > 21 && b.len() <= 28 && digits(20..b.len() - 1)));
    if ok {
        Ok(())
    } else {
        Err(BlobRefError::Snapshot(s.to_string()))
    }
}

fn check_container(c: &str) -> Result<(), BlobRefError> {
    let ok = (3..=63).contains(&c.len())
        && c.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !c.starts_with('-')
        && !c.ends_with('-')
        && !c.contains("--");
    // `$root` and friends are valid special containers.
    if ok || c == "$root" {
        Ok(())
    } else {
        Err(BlobRefError::Container(c.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_form() {
        let b = BlobRef::parse("disks/a/b.vhd").unwrap();
        assert_eq!(
            (b.container.as_str(), b.name.as_str()),
            ("disks", "a/b.vhd")
        );
        assert_eq!(b.snapshot, None);
        let b = BlobRef::parse("disks/a.vhd@2026-11-22T11:05:54.5810000Z").unwrap();
        assert_eq!(b.snapshot.as_deref(), Some("2026-11-22T11:05:54.5810000Z"));
        assert_eq!(b.to_string(), "disks/a.vhd@2026-11-22T11:05:54.5810000Z");
        assert_eq!(b.base().to_string(), "disks/a.vhd");
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            BlobRef::parse("nocontainer"),
            Err(BlobRefError::Shape(_))
        ));
        assert!(matches!(
            BlobRef::parse("disks/"),
            Err(BlobRefError::Shape(_))
        ));
        assert!(matches!(
            BlobRef::parse("Disks/a.vhd"),
            Err(BlobRefError::Container(_))
        ));
        assert!(matches!(
            BlobRef::parse("ab/a.vhd"),
            Err(BlobRefError::Container(_))
        ));
        assert!(matches!(
            BlobRef::parse("disks/a.vhd@yesterday"),
            Err(BlobRefError::Snapshot(_))
        ));
    }

    #[test]
    fn a_snapshot_is_named_bare_as_printed_or_as_a_url() {
        let id = "2026-11-22T11:05:54.5810000Z";
        let b = BlobRef::parse("disks/a.vhd").unwrap();
        assert_eq!(b.snapshot_of(id).unwrap(), id);
        assert_eq!(b.snapshot_of(&format!("disks/a.vhd@{id}")).unwrap(), id);
        assert_eq!(b.snapshot_of(&format!(" disks/a.vhd@{id} ")).unwrap(), id);
        // Given with its snapshot, the command's blob still takes others by name.
        let at = BlobRef::parse(&format!("disks/a.vhd@{id}")).unwrap();
        assert_eq!(at.snapshot_of(&format!("disks/a.vhd@{id}")).unwrap(), id);
        let url = BlobRef::parse("http://127.0.0.1:10000/devstoreaccount1/disks/a.vhd").unwrap();
        assert_eq!(
            url.snapshot_of(&format!(
                "http://127.0.0.1:10000/devstoreaccount1/disks/a.vhd?snapshot={id}"
            ))
            .unwrap(),
            id
        );
        assert_eq!(url.snapshot_of(&format!("disks/a.vhd@{id}")).unwrap(), id);
        let e = b.snapshot_of(&format!("disks/b.vhd@{id}")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("'disks/b.vhd@{id}' is a snapshot of disks/b.vhd, not of disks/a.vhd")
        );
        assert!(matches!(
            url.snapshot_of(&format!(
                "http://127.0.0.2:10000/devstoreaccount1/disks/a.vhd?snapshot={id}"
            )),
            Err(BlobRefError::OtherBlob { .. })
        ));
        assert!(matches!(
            b.snapshot_of("disks/a.vhd@yesterday"),
            Err(BlobRefError::Snapshot(_))
        ));
        assert!(matches!(
            b.snapshot_of("yesterday"),
            Err(BlobRefError::Snapshot(_))
        ));
        assert!(matches!(
            b.snapshot_of("https://acct.blob.core.windows.net/disks/a.vhd"),
            Err(BlobRefError::NoSnapshot(_))
        ));
    }

    #[test]
    fn url_with_sas_and_snapshot() {
        let b = BlobRef::parse(
            "https://acct.blob.core.windows.net/disks/a.vhd?snapshot=2026-11-22T11%3A05%3A54.5810000Z&sv=2021-12-02&sig=SECRET%2Bx",
        )
        .unwrap();
        assert_eq!(b.to_string(), "disks/a.vhd@2026-11-22T11:05:54.5810000Z");
        assert!(!format!("{b:?}").contains("SECRET"));
        let a = b.account(&Account::development());
        assert_eq!(a.name, "acct");
        assert_eq!(
            a.blob_endpoint.as_str(),
            "https://acct.blob.core.windows.net/"
        );
        match a.credential {
            Credential::Sas(s) => assert_eq!(s, "sv=2021-12-02&sig=SECRET%2Bx"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn path_style_url_uses_default_key_for_same_account() {
        let b = BlobRef::parse("http://127.0.0.1:10000/devstoreaccount1/disks/a.vhd").unwrap();
        let a = b.account(&Account::development());
        assert_eq!(a.name, "devstoreaccount1");
        assert_eq!(
            a.blob_endpoint.as_str(),
            "http://127.0.0.1:10000/devstoreaccount1"
        );
        assert!(matches!(a.credential, Credential::SharedKey { .. }));
    }
}
