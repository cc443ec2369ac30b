//! What a volume was made from and with, kept in its blob's metadata by the
//! call that made it: its source (a snapshot, or a volume it was cloned from),
//! the digest of the rest of the request (see [`parameters::digest`]) and the
//! size it was made to have.
//!
//! A CreateVolume asked again by the same name (the provisioner timed out,
//! restarted or lost the answer: all normal) is answered from this record as
//! the first call was, `content_source` included: external-provisioner deletes
//! a volume made for a claim with a data source when an answer lacks it. The
//! same name asked for from another source (or none), with other parameters or
//! another capability is ALREADY_EXISTS.
//!
//! [`parameters::digest`]: super::parameters::digest

use super::proto::volume_content_source::{self, SnapshotSource, VolumeSource};
use super::proto::VolumeContentSource;

/// The metadata name of a volume's source: `snapshot:ID` or `volume:ID`.
pub const SOURCE_META: &str = "blobdrive_csi_source";
/// The metadata name of the digest of what made a volume (or took a snapshot).
pub const DIGEST_META: &str = "blobdrive_csi_request";
/// The metadata name of the size a volume was made to have: a volume made
/// from a source smaller than that is a copy the first call had not grown yet.
pub const SIZE_META: &str = "blobdrive_csi_size";

/// Where a volume's content came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A snapshot's id (`container/NAME.vhd@TIME`).
    Snapshot(String),
    /// A volume's id (`container/NAME.vhd`), for a clone.
    Volume(String),
}

impl Source {
    /// The source a request names; `None` for none (or an empty one).
    pub fn asked(source: Option<&VolumeContentSource>) -> Option<Source> {
        match source?.r#type.as_ref()? {
            volume_content_source::Type::Snapshot(s) => {
                Some(Source::Snapshot(s.snapshot_id.clone()))
            }
            volume_content_source::Type::Volume(v) => Some(Source::Volume(v.volume_id.clone())),
        }
    }

    /// The message a CreateVolume answer carries as `content_source`.
    pub fn content_source(&self) -> VolumeContentSource {
        let r#type = match self {
            Source::Snapshot(id) => volume_content_source::Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            Source::Volume(id) => volume_content_source::Type::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
        };
        VolumeContentSource {
            r#type: Some(r#type),
        }
    }

    fn record(&self) -> String {
        match self {
            Source::Snapshot(id) => format!("snapshot:{id}"),
            Source::Volume(id) => format!("volume:{id}"),
        }
    }

    fn parse(value: &str) -> Option<Source> {
        match value.split_once(':')? {
            ("snapshot", id) => Some(Source::Snapshot(id.to_string())),
            ("volume", id) => Some(Source::Volume(id.to_string())),
            _ => None,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Snapshot(id) => write!(f, "snapshot {id}"),
            Source::Volume(id) => write!(f, "volume {id}"),
        }
    }
}

/// What made a volume, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub source: Option<Source>,
    /// [`parameters::digest`](super::parameters::digest) of the request.
    pub digest: String,
    /// The disk size it was made to have.
    pub size: u64,
}

/// `metadata` (as [`Origin::metadata`] gives it) as the blob calls take it.
pub fn pairs<'a>(metadata: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    metadata.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

impl Origin {
    /// The metadata that records it.
    pub fn metadata(&self) -> Vec<(&'static str, String)> {
        let mut m = vec![
            (DIGEST_META, self.digest.clone()),
            (SIZE_META, self.size.to_string()),
        ];
        if let Some(s) = &self.source {
            m.push((SOURCE_META, s.record()));
        }
        m
    }

    /// The record in a blob's `metadata`; `None` when it has none (a drive
    /// made before the driver kept one, or by hand).
    pub fn read(metadata: &[(String, String)]) -> Option<Origin> {
        let get = |name: &str| {
            metadata
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        Some(Origin {
            digest: get(DIGEST_META)?.to_string(),
            size: get(SIZE_META)?.parse().ok()?,
            source: get(SOURCE_META).and_then(Source::parse),
        })
    }

    /// Why a volume made as `self` is not what a request for `source` with
    /// `digest` asks for; `None` when it is.
    pub fn mismatch(&self, source: Option<&Source>, digest: &str) -> Option<String> {
        let said =
            |s: Option<&Source>| s.map_or_else(|| "no source".to_string(), |s| s.to_string());
        if self.source.as_ref() != source {
            return Some(format!(
                "it was made from {}, and this asks for {}",
                said(self.source.as_ref()),
                said(source)
            ));
        }
        (self.digest != digest)
            .then(|| "it was made with other parameters or capabilities".to_string())
    }

    /// What the metadata of a blob made without a record says, for the same
    /// answer: a request with a source is not what it was made from.
    pub fn unrecorded_mismatch(source: Option<&Source>) -> Option<String> {
        source.map(|s| format!("it was not made from {s} (it has no record of a source)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_tells_what_differs() {
        let snap = Source::Snapshot("vols/a.vhd@2026-11-22T11:05:54.5810000Z".into());
        let made = Origin {
            source: Some(snap.clone()),
            digest: "d1".into(),
            size: 1 << 20,
        };
        let meta: Vec<(String, String)> = made
            .metadata()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(Origin::read(&meta), Some(made.clone()));
        assert_eq!(made.mismatch(Some(&snap), "d1"), None);
        assert!(made.mismatch(None, "d1").unwrap().contains("no source"));
        let other = Source::Volume("vols/b.vhd".into());
        assert!(made
            .mismatch(Some(&other), "d1")
            .unwrap()
            .contains("volume vols/b.vhd"));
        assert!(made.mismatch(Some(&snap), "d2").is_some());
        assert_eq!(Origin::read(&[]), None);
        assert_eq!(Source::asked(Some(&snap.content_source())), Some(snap));
        assert_eq!(Source::asked(None), None);
    }
}
