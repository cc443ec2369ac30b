//! Volume ids, sizes and capabilities: what a request asks for, checked before
//! anything is looked up.
//!
//! A volume's id is its drive, `container/NAME.vhd`: the blob is the only
//! record, so a controller that restarts (or a second replica) knows every
//! volume without a database of its own.

use tonic::Status;

use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_capability::AccessType;
use super::proto::{CapacityRange, Volume, VolumeCapability};
use crate::vhd::{MAX_DISK_BYTES, MIB};

/// The StorageClass parameter, carried to NodeStage in the volume's context,
/// that has the node warm the disk cache as the volume is staged
/// (`blobdrive mount --warm`): `"true"` or `"false"`.
pub const WARM_UP: &str = "warmUp";

/// Whether a `warmUp` value asks for a warm-up (none: no); anything but
/// `"true"` or `"false"` is INVALID_ARGUMENT.
pub fn warm_up(value: Option<&String>) -> Result<bool, Status> {
    match value.map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(Status::invalid_argument(format!(
            "{WARM_UP} is \"true\" or \"false\", not '{}'",
            other.escape_debug()
        ))),
    }
}

/// The StorageClass parameter, carried to NodeStage in the volume's context,
/// that gives the volume's memory cache: a Kubernetes quantity (`64Mi`,
/// `1Gi`). Without it the node gives its default (see `budget.rs`).
pub const CACHE_SIZE: &str = "cacheSize";

/// The bytes a `cacheSize` value stands for: a quantity of at least the
/// smallest cache a mount takes; the error says why not, in words.
pub fn check_cache_size(value: &str) -> Result<u64, String> {
    let shown: String = if value.chars().count() <= 32 {
        format!("'{}'", value.escape_debug())
    } else {
        format!("a value of {} characters", value.chars().count())
    };
    let bytes = super::quantity::bytes(value).map_err(|why| format!("{shown}: {why}"))?;
    if bytes < crate::mount::MIN_CACHE_SIZE {
        return Err(format!(
            "{shown} is too small: a volume's cache is at least 32Mi"
        ));
    }
    Ok(bytes)
}

/// The cache a `cacheSize` value asks for (none: `None`); INVALID_ARGUMENT
/// unless [`check_cache_size`] takes it.
pub fn cache_size(value: Option<&String>) -> Result<Option<u64>, Status> {
    value
        .map(|v| {
            check_cache_size(v)
                .map_err(|why| Status::invalid_argument(format!("{CACHE_SIZE} {why}")))
        })
        .transpose()
}

/// The StorageClass parameter, carried to NodeStage in the volume's context,
/// that makes new volumes encrypted drives: `luks2` (see
/// docs/encryption.md). Their passphrase comes from the provisioner's secret
/// (CreateVolume) and the node-stage secret (NodeStageVolume), under the key
/// [`PASSPHRASE`].
pub const ENCRYPTION: &str = "encryption";
/// The key of the secrets that holds an encrypted volume's passphrase.
pub const PASSPHRASE: &str = "passphrase";

/// Whether an `encryption` value asks for an encrypted volume (none: no);
/// anything but `luks2` (or `none`) is INVALID_ARGUMENT.
pub fn encrypted(value: Option<&String>) -> Result<bool, Status> {
    match value.map(String::as_str) {
        None | Some("none") => Ok(false),
        Some("luks2") => Ok(true),
        Some(other) => Err(Status::invalid_argument(format!(
            "{ENCRYPTION} is \"luks2\" or \"none\", not '{}'",
            other.escape_debug()
        ))),
    }
}

/// An encrypted volume's passphrase, from a request's `secrets`; the error
/// (INVALID_ARGUMENT) says which secret lacks it, never what the secrets hold.
pub fn passphrase_in(
    secrets: &std::collections::HashMap<String, String>,
    which: &str,
) -> Result<crate::luks::secret::Secret, Status> {
    match secrets.get(PASSPHRASE) {
        Some(p) if !p.is_empty() => Ok(crate::luks::secret::Secret::from_slice(p.as_bytes())),
        _ => Err(Status::invalid_argument(format!(
            "the volume is encrypted ({ENCRYPTION}: luks2): its passphrase is the key '{PASSPHRASE}' of the {which} secret, which the request does not carry"
        ))),
    }
}

/// The volume context a volume made with the StorageClass's `parameters`
/// carries to NodeStage (checked, so a bad value makes nothing).
pub fn context_of(
    parameters: &std::collections::HashMap<String, String>,
) -> Result<std::collections::HashMap<String, String>, Status> {
    let mut context = std::collections::HashMap::new();
    if warm_up(parameters.get(WARM_UP))? {
        context.insert(WARM_UP.to_string(), "true".to_string());
    }
    if cache_size(parameters.get(CACHE_SIZE))?.is_some() {
        context.insert(CACHE_SIZE.to_string(), parameters[CACHE_SIZE].clone());
    }
    if encrypted(parameters.get(ENCRYPTION))? {
        context.insert(ENCRYPTION.to_string(), "luks2".to_string());
    }
    Ok(context)
}

/// A volume asked for with no size: 1 GiB.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The filesystems a volume may carry.
pub const FS_TYPES: [&str; 2] = ["ext4", "xfs"];

/// A volume's drive: its container and blob name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeId {
    pub container: String,
    pub blob: String,
}

impl VolumeId {
    /// The drive a new volume `name` gets in `container`. Kubernetes names
    /// them `pvc-UID`; anything outside letters, digits, `.`, `-` and `_`, or
    /// longer than a blob name allows, is refused.
    pub fn for_name(container: &str, name: &str) -> Result<VolumeId, Status> {
        check_name(name, "volume")?;
        Ok(VolumeId {
            container: container.to_string(),
            blob: format!("{name}.vhd"),
        })
    }

    /// Parses `container/NAME.vhd`; `None` for anything this driver never made
    /// (an unknown volume, NOT_FOUND where the spec asks it).
    pub fn parse(id: &str) -> Option<VolumeId> {
        let (container, blob) = id.split_once('/')?;
        let ok_container = is_container_name(container);
        let name = blob.strip_suffix(".vhd")?;
        let ok_name = !name.is_empty() && name.bytes().all(name_byte);
        (ok_container && ok_name).then(|| VolumeId {
            container: container.to_string(),
            blob: blob.to_string(),
        })
    }

    /// [`VolumeId::parse`], an id this driver never made NOT_FOUND.
    pub fn known(id: &str) -> Result<VolumeId, Status> {
        VolumeId::parse(id).ok_or_else(|| Status::not_found(format!("no volume {id}")))
    }

    /// `container/NAME.vhd`, as a BLOB argument of every command takes it.
    pub fn spec(&self) -> String {
        format!("{}/{}", self.container, self.blob)
    }
}

/// Whether `name` is an Azure container name: 3 to 63 of `a-z`, `0-9` and `-`,
/// starting and ending with a letter or digit, no `--`. That keeps out `..`
/// and `/` (a path), and `$web`, `$logs` and `$root` (on Azure a static
/// website's public container, the service's logs, the account's root).
pub fn is_container_name(name: &str) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (3..=63).contains(&b.len())
        && b.iter().all(|c| alnum(c) || *c == b'-')
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && !name.contains("--")
}

/// The CSI message for volume `id` of `size` bytes (no source).
pub fn message(id: &VolumeId, size: u64) -> Volume {
    Volume {
        capacity_bytes: size as i64,
        volume_id: id.spec(),
        volume_context: Default::default(),
        content_source: None,
        accessible_topology: vec![],
    }
}

/// Whether `b` may be in a volume's or a snapshot's name: letters, digits, `.`,
/// `-`, `_` and `+` (csi-sanity names one `...-vol+1-...`); never a `/`, nor
/// anything a blob's name or metadata would take otherwise.
fn name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+')
}

/// Refuses a `what` (volume, snapshot) name that is not 1 to 200 letters,
/// digits, `.`, `-`, `_` or `+`: Kubernetes names them `pvc-UID` and
/// `snapshot-UID`, and the name goes into a blob's name or metadata.
pub fn check_name(name: &str, what: &str) -> Result<(), Status> {
    let fits = !name.is_empty() && name.len() <= 200 && name.bytes().all(name_byte);
    if fits {
        return Ok(());
    }
    let shown: String = name.chars().take(64).collect();
    Err(Status::invalid_argument(format!(
        "{what} name '{}' must be 1 to 200 letters, digits, '.', '-', '_' or '+'",
        shown.escape_debug()
    )))
}

/// Where a listing starts: its `starting_token` (one of ours: an index), 0
/// when empty; ABORTED for any other.
pub fn starting_at(token: &str) -> Result<usize, Status> {
    match token {
        "" => Ok(0),
        t => t
            .parse()
            .map_err(|_| Status::aborted(format!("starting token '{t}' is not one of ours"))),
    }
}

/// The entries of one page of a listing of `len` (named `what`) from `start`,
/// at most `max` (`default` when 0), and the token of the next page (empty
/// after the last).
pub fn page(
    start: usize,
    len: usize,
    max: i32,
    default: usize,
    what: &str,
) -> Result<(std::ops::Range<usize>, String), Status> {
    if start > len {
        return Err(Status::aborted(format!(
            "starting token {start} is past the {len} {what}"
        )));
    }
    let size = match max {
        n if n < 0 => return Err(Status::invalid_argument("max_entries may not be negative")),
        0 => default,
        n => n as usize,
    };
    let end = start.saturating_add(size).min(len);
    let next = if end < len {
        end.to_string()
    } else {
        String::new()
    };
    Ok((start..end, next))
}

/// The disk size for `range`: the required bytes rounded up to a whole MiB (a
/// VHD's unit), 1 GiB when nothing is required; OUT_OF_RANGE past the limit or
/// the largest drive.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument("capacity may not be negative"));
    }
    let (required, limit) = (required as u64, limit as u64);
    let size = match required {
        0 if limit > 0 => DEFAULT_SIZE.min(limit / MIB * MIB),
        0 => DEFAULT_SIZE,
        r => r.div_ceil(MIB) * MIB,
    };
    if size == 0 || (limit > 0 && size > limit) {
        return Err(Status::out_of_range(format!(
            "no whole number of MiB lies between {required} and {limit} bytes"
        )));
    }
    if size > MAX_DISK_BYTES {
        return Err(Status::out_of_range(format!(
            "{size} bytes is more than a drive can hold ({MAX_DISK_BYTES})"
        )));
    }
    Ok(size)
}

/// Whether an existing drive of `size` bytes satisfies `range`.
pub fn size_fits(size: u64, range: Option<&CapacityRange>) -> bool {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    size >= required.max(0) as u64 && (limit <= 0 || size <= limit as u64)
}

/// The publish context's key that tells the node to mount read-only.
pub const READONLY_CONTEXT: &str = "readonly";

/// Whether `cap` asks only to read.
pub fn read_only(cap: &VolumeCapability) -> bool {
    matches!(
        cap.access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok()),
        Some(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    )
}

/// The one capability a call on a volume names (ControllerPublish,
/// NodeStage), checked: missing, or one that cannot be served, is
/// INVALID_ARGUMENT.
pub fn one_capability(cap: Option<VolumeCapability>) -> Result<VolumeCapability, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("a volume capability is required"))?;
    match unsupported(std::slice::from_ref(&cap)) {
        Some(why) => Err(Status::invalid_argument(why)),
        None => Ok(cap),
    }
}

/// Why `caps` cannot be served, if they cannot: one writer on one node at a
/// time (the lease), readers on many; a filesystem of ext4 or xfs, or a block
/// device.
pub fn unsupported(caps: &[VolumeCapability]) -> Option<String> {
    if caps.is_empty() {
        return Some("no volume capability given".into());
    }
    for cap in caps {
        let mode = cap
            .access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok());
        match mode {
            Some(
                Mode::SingleNodeWriter
                | Mode::SingleNodeSingleWriter
                | Mode::SingleNodeMultiWriter
                | Mode::SingleNodeReaderOnly
                | Mode::MultiNodeReaderOnly,
            ) => {}
            Some(Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter) => {
                return Some(
                    "a drive has one writer at a time: writers on several nodes are not served"
                        .into(),
                )
            }
            Some(Mode::Unknown) | None => return Some("an access mode is required".into()),
        }
        match &cap.access_type {
            Some(AccessType::Block(_)) => {}
            Some(AccessType::Mount(m)) => {
                if !m.fs_type.is_empty() && !FS_TYPES.contains(&m.fs_type.as_str()) {
                    return Some(format!(
                        "filesystem '{}' is not served: ext4 or xfs",
                        m.fs_type.escape_debug()
                    ));
                }
            }
            None => return Some("an access type (mount or block) is required".into()),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};

    #[test]
    fn cache_size_is_a_checked_quantity_that_reaches_the_context() {
        let params = |v: &str| std::collections::HashMap::from([(CACHE_SIZE.into(), v.into())]);
        assert_eq!(context_of(&params("64Mi")).unwrap(), params("64Mi"));
        assert_eq!(cache_size(Some(&"1Gi".into())).unwrap(), Some(1 << 30));
        assert_eq!(cache_size(None).unwrap(), None);
        for (bad, why) in [
            ("64MiB", "not a Kubernetes quantity"),
            ("16Mi", "too small"),
            ("-1Gi", "negative"),
            ("", "not a Kubernetes quantity"),
        ] {
            let e = context_of(&params(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(
                e.message().starts_with(CACHE_SIZE) && e.message().contains(why),
                "{bad}: {}",
                e.message()
            );
        }
        let long = "9".repeat(100);
        let e = context_of(&params(&long)).unwrap_err();
        assert!(
            e.message().contains("a value of 100 characters"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn container_names_follow_azures_rules() {
        for good in [
            "vols",
            "abc",
            "a-b-c",
            "kubernetes-volumes",
            &"a".repeat(63),
        ] {
            assert!(is_container_name(good), "{good}");
        }
        for bad in [
            "../etc",
            "$web",
            "$root",
            "ab",
            "a--b",
            "-ab",
            "ab-",
            "Vols",
            "a/b",
            "",
            &"a".repeat(64),
        ] {
            assert!(!is_container_name(bad), "{bad}");
        }
    }

    #[test]
    fn warm_up_is_true_or_false_and_only_true_reaches_the_context() {
        let params = |v: &str| std::collections::HashMap::from([(WARM_UP.into(), v.into())]);
        assert_eq!(context_of(&params("true")).unwrap(), params("true"));
        assert!(context_of(&params("false")).unwrap().is_empty());
        assert!(context_of(&Default::default()).unwrap().is_empty());
        for bad in ["True", "yes", "1", "", "\u{1b}[2J"] {
            let e = context_of(&params(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
            assert!(e.message().starts_with("warmUp is"), "{}", e.message());
            assert!(!e.message().contains('\u{1b}'), "{}", e.message());
        }
    }

    fn cap(mode: Mode, fs: Option<&str>) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(match fs {
                Some(f) => AccessType::Mount(MountVolume {
                    fs_type: f.into(),
                    ..Default::default()
                }),
                None => AccessType::Block(BlockVolume {}),
            }),
        }
    }

    fn range(required: i64, limit: i64) -> CapacityRange {
        CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn sizes_round_up_to_whole_mib_within_the_limit() {
        assert_eq!(size_for(None).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for(Some(&range(1, 0))).unwrap(), MIB);
        assert_eq!(size_for(Some(&range(MIB as i64 + 1, 0))).unwrap(), 2 * MIB);
        assert_eq!(
            size_for(Some(&range(0, 10 * MIB as i64))).unwrap(),
            10 * MIB
        );
        let e = size_for(Some(&range(MIB as i64 + 1, MIB as i64 + 100))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(size_fits(2 * MIB, Some(&range(MIB as i64 + 1, 0))));
        assert!(!size_fits(2 * MIB, Some(&range(3 * MIB as i64, 0))));
    }

    #[test]
    fn ids_are_the_drives_and_strangers_are_not_found() {
        let id = VolumeId::for_name("vols", "pvc-1234").unwrap();
        assert_eq!(id.spec(), "vols/pvc-1234.vhd");
        assert_eq!(VolumeId::parse(&id.spec()), Some(id));
        for bad in [
            "",
            "vols",
            "vols/x",
            "Vols/a.vhd",
            "v/a.vhd",
            "vols/a/b.vhd",
            "-vols/a.vhd",
            "vo--ls/a.vhd",
        ] {
            assert_eq!(VolumeId::parse(bad), None, "{bad}");
        }
        assert!(VolumeId::for_name("vols", "a/../b").is_err());
    }

    #[test]
    fn one_writer_many_readers_and_ext4_xfs_or_block() {
        assert_eq!(
            unsupported(&[cap(Mode::SingleNodeWriter, Some("ext4"))]),
            None
        );
        assert_eq!(unsupported(&[cap(Mode::MultiNodeReaderOnly, None)]), None);
        assert_eq!(unsupported(&[cap(Mode::SingleNodeWriter, Some(""))]), None);
        assert!(unsupported(&[cap(Mode::MultiNodeMultiWriter, Some("ext4"))]).is_some());
        assert!(unsupported(&[cap(Mode::SingleNodeWriter, Some("btrfs"))]).is_some());
        assert!(unsupported(&[]).is_some());
    }
}
