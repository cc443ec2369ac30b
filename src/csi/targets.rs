//! What this node plugin published where: one record per target path, in the
//! run directory (`csi/published/`, root's alone like the mount records), kept
//! across plugin restarts. NodeUnpublishVolume unmounts and removes only what
//! a record says this driver mounted and made there for that volume id, and
//! NodeGetVolumeStats answers only for a path that is one of its volumes: a
//! path it did not mount (a file, someone's tmpfs, `/proc`) is never touched.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::records::RecordDir;

/// A bind mount this plugin made at a target path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub volume_id: String,
    /// The target path, its directories resolved (see `paths::resolve`).
    pub target: PathBuf,
    pub staging: PathBuf,
    pub read_only: bool,
    /// A block volume: the loop device's node, bound onto a file.
    pub block: bool,
    /// The kernel's id of the bind mount.
    pub mount_id: u64,
    /// The (device, inode) of what was bound (the staged filesystem's root, or
    /// the device node).
    pub root: (u64, u64),
    /// The (device, inode) of the directory or file this plugin made at the
    /// target for it; `None` when it was there before.
    pub made: Option<(u64, u64)>,
}

const RECORDS: RecordDir = RecordDir::new("published");

fn path_of(target: &Path) -> PathBuf {
    RECORDS.path_of("", target.as_os_str().as_encoded_bytes())
}

/// The record of what was published at `target`, if any.
pub fn at(target: &Path) -> Option<Published> {
    RECORDS
        .read::<Published>(&path_of(target))
        .filter(|p| p.target == target)
}

/// Writes the record.
pub fn save(p: &Published) -> std::io::Result<()> {
    RECORDS.save(&path_of(&p.target), p)
}

/// Forgets what was published at `target`.
pub fn forget(target: &Path) {
    RECORDS.remove(&path_of(target), target)
}
