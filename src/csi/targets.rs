//! What this node plugin published where: one record per target path, in the
//! run directory (`csi/published/`, root's alone like the mount records), kept
//! across plugin restarts. NodeUnpublishVolume unmounts and removes only what
//! a record says this driver mounted and made there for that volume id, and
//! NodeGetVolumeStats answers only for a path that is one of its volumes: a
//! path it did not mount (a file, someone's tmpfs, `/proc`) is never touched.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::mount::record;

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

/// The most a record may hold when read back.
const MAX_BYTES: u64 = 16 << 10;

fn dir() -> PathBuf {
    record::run_dir().join("csi").join("published")
}

fn path_of(target: &Path) -> PathBuf {
    let h = Sha256::digest(target.as_os_str().as_encoded_bytes());
    let name: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
    dir().join(format!("{name}.json"))
}

/// The record of what was published at `target`, if any.
pub fn at(target: &Path) -> Option<Published> {
    let text = record::read_private(&path_of(target), MAX_BYTES)?;
    serde_json::from_str::<Published>(&text)
        .ok()
        .filter(|p| p.target == target)
}

/// Makes the run directory's `csi/published/` (0700), each level checked to be
/// root's alone: records there decide what root unmounts.
fn ensure_dir() -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let d = dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&d)?;
    for level in [record::run_dir(), record::run_dir().join("csi"), d] {
        record::check_private_dir(&level).map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// Writes the record (atomically: a new file renamed over the old).
pub fn save(p: &Published) -> std::io::Result<()> {
    ensure_dir()?;
    let path = path_of(&p.target);
    let tmp = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = record::create_private(&tmp, false)?;
    f.write_all(
        serde_json::to_string_pretty(p)
            .expect("serialisable")
            .as_bytes(),
    )?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

/// Forgets what was published at `target`.
pub fn forget(target: &Path) {
    match std::fs::remove_file(path_of(target)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove the record of {}: {e}", target.display()),
    }
}
