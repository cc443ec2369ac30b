//! What this node plugin staged where, and with how much cache: one record per
//! staging path in the run directory (`csi/staged/`, root's alone like the
//! mount records), written before the volume's `blobdrive mount` starts and
//! removed when it is unstaged. A node plugin counts its volumes against its
//! cache budget from these (with the mounts they name still alive), so a
//! plugin restarted with volumes staged counts them again; and two plugins on
//! one host (the tests' node-a and node-b) each count only their own.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::mount::record;

/// A volume this plugin staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    /// The node plugin's `--node-id`.
    pub node_id: String,
    pub volume_id: String,
    pub staging: PathBuf,
    /// The volume's memory cache (its daemon's `--cache-size`).
    pub cache_size: u64,
}

/// The most a record may hold when read back.
const MAX_BYTES: u64 = 16 << 10;

fn dir() -> PathBuf {
    record::run_dir().join("csi").join("staged")
}

fn path_of(staging: &Path) -> PathBuf {
    let h = Sha256::digest(staging.as_os_str().as_encoded_bytes());
    let name: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
    dir().join(format!("{name}.json"))
}

/// Makes the run directory's `csi/staged/` (0700), each level checked to be
/// root's alone: the records there decide what a node counts as its own.
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

/// The entries of `csi/staged/` when it is there and root's alone at every
/// level (nothing is made for a reader).
fn entries() -> Vec<std::fs::DirEntry> {
    let d = dir();
    let private = [record::run_dir(), record::run_dir().join("csi"), d.clone()]
        .iter()
        .all(|level| level.is_dir() && record::check_private_dir(level).is_ok());
    if !private {
        return Vec::new();
    }
    std::fs::read_dir(d)
        .map(|e| e.flatten().collect())
        .unwrap_or_default()
}

/// Writes the record (atomically: a new file renamed over the old).
pub fn save(s: &Staged) -> std::io::Result<()> {
    ensure_dir()?;
    let path = path_of(&s.staging);
    let tmp = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = record::create_private(&tmp, false)?;
    f.write_all(
        serde_json::to_string_pretty(s)
            .expect("serialisable")
            .as_bytes(),
    )?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

/// Forgets what was staged at `staging`.
pub fn forget(staging: &Path) {
    match std::fs::remove_file(path_of(staging)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("cannot remove the record of {}: {e}", staging.display()),
    }
}

/// A node plugin's budget as it last started with it, for `blobdrive list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBudget {
    pub node_id: String,
    pub total: u64,
}

fn budget_path(node_id: &str) -> PathBuf {
    let h = Sha256::digest(node_id.as_bytes());
    let name: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
    dir().join(format!("budget-{name}.json"))
}

/// Records node `b.node_id`'s budget (atomically).
pub fn save_budget(b: &NodeBudget) -> std::io::Result<()> {
    ensure_dir()?;
    let path = budget_path(&b.node_id);
    let tmp = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = record::create_private(&tmp, false)?;
    f.write_all(serde_json::to_string(b).expect("serialisable").as_bytes())?;
    std::fs::rename(tmp, path)
}

/// The budgets of the node plugins that ran on this host.
pub fn budgets() -> Vec<NodeBudget> {
    let mut out: Vec<NodeBudget> = entries()
        .into_iter()
        .filter(|e| e.file_name().to_string_lossy().starts_with("budget-"))
        .filter_map(|e| record::read_private(&e.path(), MAX_BYTES))
        .filter_map(|text| serde_json::from_str::<NodeBudget>(&text).ok())
        .filter(|b| budget_path(&b.node_id).exists())
        .collect();
    out.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    out
}

/// The records of node `node_id`.
pub fn of_node(node_id: &str) -> Vec<Staged> {
    entries()
        .into_iter()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter(|e| !e.file_name().to_string_lossy().starts_with("budget-"))
        .filter_map(|e| record::read_private(&e.path(), MAX_BYTES))
        .filter_map(|text| serde_json::from_str::<Staged>(&text).ok())
        .filter(|s| s.node_id == node_id && path_of(&s.staging).exists())
        .collect()
}
