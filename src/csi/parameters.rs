//! The parameters of a StorageClass (CreateVolume) and of a
//! VolumeSnapshotClass (CreateSnapshot): each key is one this driver knows,
//! its value checked, before anything is looked up or made; a key it does not
//! know (a typo such as `contianer`) is INVALID_ARGUMENT naming it, never
//! ignored. The keys the CO adds itself (`csi.storage.k8s.io/...`: the claim's
//! and the volume's names with the provisioner's `--extra-create-metadata`)
//! pass unchecked.
//!
//! A value is never put into an answer or a log for a key this driver does not
//! know: a secret put into the wrong place of a StorageClass stays out of the
//! sidecars' events and logs.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tonic::Status;

use super::proto::VolumeCapability;

/// The StorageClass parameter that names the container of new volumes.
pub const CONTAINER: &str = "container";

/// The prefix of the keys the CO adds to the parameters itself.
pub const CO_PREFIX: &str = "csi.storage.k8s.io/";

/// One parameter: its key, and what it must be (`Err` says why not, about the
/// value without repeating it).
struct Known {
    key: &'static str,
    check: fn(&str) -> Result<(), String>,
}

/// Every StorageClass parameter a volume takes. A new one is a line here and
/// its use where the volume is made.
const VOLUME: &[Known] = &[
    Known {
        key: CONTAINER,
        check: check_container,
    },
    Known {
        key: super::volume::WARM_UP,
        check: check_warm_up,
    },
    Known {
        key: super::volume::CACHE_SIZE,
        check: check_cache_size,
    },
    Known {
        key: super::volume::ENCRYPTION,
        check: check_encryption,
    },
];

/// Every VolumeSnapshotClass parameter a snapshot takes: none yet.
const SNAPSHOT: &[Known] = &[];

/// Refuses `parameters` of CreateVolume (and ValidateVolumeCapabilities)
/// unless every key is a volume's (or the CO's) and its value fits.
pub fn check_volume(parameters: &HashMap<String, String>) -> Result<(), Status> {
    check(parameters, VOLUME, "StorageClass")
}

/// Refuses `parameters` of CreateSnapshot unless every key is the CO's.
pub fn check_snapshot(parameters: &HashMap<String, String>) -> Result<(), Status> {
    check(parameters, SNAPSHOT, "VolumeSnapshotClass")
}

/// Refuses `mutable_parameters`: modifying volumes (MODIFY_VOLUME) is not
/// offered, so none is known.
pub fn check_mutable(parameters: &HashMap<String, String>) -> Result<(), Status> {
    check(parameters, &[], "VolumeAttributesClass")
}

fn check(parameters: &HashMap<String, String>, known: &[Known], class: &str) -> Result<(), Status> {
    let mut keys: Vec<&String> = parameters.keys().collect();
    keys.sort();
    for key in keys {
        if key.starts_with(CO_PREFIX) {
            continue;
        }
        let Some(k) = known.iter().find(|k| k.key == key) else {
            let names: Vec<&str> = known.iter().map(|k| k.key).collect();
            return Err(Status::invalid_argument(format!(
                "unknown {class} parameter '{}' (its value is not shown): {}",
                shown_key(key),
                if names.is_empty() {
                    "none is taken".to_string()
                } else {
                    format!("the parameters taken are {}", names.join(", "))
                }
            )));
        };
        (k.check)(&parameters[key]).map_err(|why| {
            Status::invalid_argument(format!("{class} parameter {}: {why}", k.key))
        })?;
    }
    Ok(())
}

/// A key as an answer may show it: escaped, at most 63 characters of it.
fn shown_key(key: &str) -> String {
    let escaped: String = key.escape_debug().collect();
    match escaped.char_indices().nth(63) {
        Some((cut, _)) => format!("{}...", &escaped[..cut]),
        None => escaped,
    }
}

fn check_container(value: &str) -> Result<(), String> {
    if super::volume::is_container_name(value) {
        return Ok(());
    }
    Err(format!(
        "'{}' is not a container name: 3 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit, no '--'",
        shown_key(value)
    ))
}

fn check_warm_up(value: &str) -> Result<(), String> {
    super::volume::warm_up(Some(&value.to_string()))
        .map(drop)
        .map_err(|s| s.message().to_string())
}

fn check_encryption(value: &str) -> Result<(), String> {
    super::volume::encrypted(Some(&value.to_string()))
        .map(drop)
        .map_err(|s| s.message().to_string())
}

fn check_cache_size(value: &str) -> Result<(), String> {
    super::volume::check_cache_size(value).map(drop)
}

/// What a request asked of a volume or a snapshot besides its name, its size
/// and its source, as a short digest kept with it: the parameters (but
/// `container`, which is in the volume's id already, so naming the driver's
/// own container or leaving it out is the same volume) and, for a volume, the
/// capabilities (in any order). A repeat of the name with another digest asks
/// for something else: ALREADY_EXISTS.
pub fn digest(parameters: &HashMap<String, String>, caps: &[VolumeCapability]) -> String {
    let mut pairs: Vec<(&String, &String)> = parameters
        .iter()
        .filter(|(k, _)| k.as_str() != CONTAINER)
        .collect();
    pairs.sort();
    let mut encoded: Vec<Vec<u8>> = caps.iter().map(prost::Message::encode_to_vec).collect();
    encoded.sort();
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    for (k, v) in pairs {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    field(b"capabilities");
    for c in &encoded {
        field(c);
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::proto::volume_capability::{AccessMode, AccessType, MountVolume};

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unknown_keys_are_named_without_their_values_and_the_cos_pass() {
        let ok = params(&[
            ("container", "vols"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]);
        assert!(check_volume(&ok).is_ok());
        let e = check_volume(&params(&[("contianer", "s3cr3t-value")])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("'contianer'"), "{}", e.message());
        assert!(!e.message().contains("s3cr3t"), "{}", e.message());
        let e = check_volume(&params(&[("container", "../etc")])).unwrap_err();
        assert!(
            e.message().contains("not a container name"),
            "{}",
            e.message()
        );
        assert!(check_snapshot(&params(&[("container", "vols")])).is_err());
        assert!(
            check_snapshot(&params(&[("csi.storage.k8s.io/volumesnapshot/name", "s")])).is_ok()
        );
        assert!(check_volume(&params(&[("cacheSize", "64Mi")])).is_ok());
        let e = check_volume(&params(&[("cacheSize", "64MiB")])).unwrap_err();
        assert!(
            e.message().starts_with(
                "StorageClass parameter cacheSize: '64MiB': not a Kubernetes quantity"
            ),
            "{}",
            e.message()
        );
        let long = "k".repeat(500);
        let e = check_mutable(&params(&[(long.as_str(), "v")])).unwrap_err();
        assert!(e.message().len() < 300, "{}", e.message());
    }

    #[test]
    fn digests_ignore_order_and_the_container_but_not_the_rest() {
        let cap = |fs: &str| VolumeCapability {
            access_mode: Some(AccessMode { mode: 1 }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            })),
        };
        let a = params(&[("csi.storage.k8s.io/pvc/name", "x"), ("container", "c1")]);
        let b = params(&[("csi.storage.k8s.io/pvc/name", "x")]);
        let c = params(&[("csi.storage.k8s.io/pvc/name", "y")]);
        let two = [cap("ext4"), cap("xfs")];
        let swapped = [cap("xfs"), cap("ext4")];
        assert_eq!(digest(&a, &two), digest(&b, &swapped));
        assert_ne!(digest(&b, &two), digest(&c, &two));
        assert_ne!(digest(&b, &two), digest(&b, &[cap("ext4")]));
        assert_eq!(digest(&b, &two).len(), 32);
    }
}
