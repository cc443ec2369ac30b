//! What this node plugin staged where, and with how much cache: one record per
//! staging path in the run directory (`csi/staged/`, root's alone like the
//! mount records), written before the volume's `blobdrive mount` starts and
//! removed when it is unstaged. A node plugin counts its volumes against its
//! cache budget from these (with the mounts they name still alive), so a
//! plugin restarted with volumes staged counts them again; and two plugins on
//! one host (the tests' node-a and node-b) each count only their own.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::records::RecordDir;

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

const RECORDS: RecordDir = RecordDir::new("staged");

/// The name budgets' records start with (staged volumes' never do: theirs
/// are a hash alone).
const BUDGET: &str = "budget-";

fn path_of(staging: &Path) -> PathBuf {
    RECORDS.path_of("", staging.as_os_str().as_encoded_bytes())
}

/// Writes the record.
pub fn save(s: &Staged) -> std::io::Result<()> {
    RECORDS.save(&path_of(&s.staging), s)
}

/// Forgets what was staged at `staging`.
pub fn forget(staging: &Path) {
    RECORDS.remove(&path_of(staging), staging)
}

/// A node plugin's budget as it last started with it, for `blobdrive list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeBudget {
    pub node_id: String,
    pub total: u64,
}

fn budget_path(node_id: &str) -> PathBuf {
    RECORDS.path_of(BUDGET, node_id.as_bytes())
}

/// Records node `b.node_id`'s budget.
pub fn save_budget(b: &NodeBudget) -> std::io::Result<()> {
    RECORDS.save(&budget_path(&b.node_id), b)
}

/// The budgets of the node plugins that ran on this host.
pub fn budgets() -> Vec<NodeBudget> {
    let mut out: Vec<NodeBudget> = RECORDS
        .all::<NodeBudget>(BUDGET)
        .into_iter()
        .filter(|b| budget_path(&b.node_id).exists())
        .collect();
    out.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    out
}

/// The records of node `node_id` (a budget's record does not read as one).
pub fn of_node(node_id: &str) -> Vec<Staged> {
    RECORDS
        .all::<Staged>("")
        .into_iter()
        .filter(|s| s.node_id == node_id && path_of(&s.staging).exists())
        .collect()
}
