//! The node's cache budget: the memory the caches of the volumes a node plugin
//! stages may take together (`blobdrive csi --cache-budget`, by default a
//! quarter of the node's memory). Each volume's cache is its StorageClass's
//! `cacheSize`, or else the budget shared by `max_volumes_per_node` volumes
//! (so that many volumes fit it), never less than the smallest cache a mount
//! takes. NodeStage of a volume whose cache does not fit what is left is
//! RESOURCE_EXHAUSTED before anything is made or leased.
//!
//! What is taken is counted from the plugin's records of what it staged
//! (`staged.rs`) whose mounts are alive, plus the volumes being staged right
//! now: a restarted plugin counts the volumes staged before, and a volume
//! whose daemon died no longer holds memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tonic::Status;

use super::staged::{self, Staged};
use crate::mount::record;
use crate::mount::MIN_CACHE_SIZE;
use crate::size::human;

/// The largest cache a volume gets by default: a plain mount's largest default.
pub const MAX_DEFAULT_CACHE: u64 = 1 << 30;

/// The budget when `--cache-budget` is not given: a quarter of the node's
/// memory (`mem_total`), in whole MiB.
pub fn default_total(mem_total: u64) -> u64 {
    (mem_total / 4) & !((1 << 20) - 1)
}

/// The cache a volume gets when its StorageClass names none: `total` shared by
/// `max_volumes` volumes, in whole MiB, between [`MIN_CACHE_SIZE`] and
/// [`MAX_DEFAULT_CACHE`].
pub fn default_cache(total: u64, max_volumes: u64) -> u64 {
    ((total / max_volumes.max(1)) & !((1 << 20) - 1)).clamp(MIN_CACHE_SIZE, MAX_DEFAULT_CACHE)
}

/// A volume counted against the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub volume_id: String,
    pub staging: PathBuf,
    pub cache_size: u64,
}

/// A node plugin that ran on this host, as `blobdrive list` shows it: its
/// budget and what its live volumes take of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeSummary {
    pub node_id: String,
    pub cache_budget: u64,
    pub cache_taken: u64,
    pub volumes: usize,
}

impl std::fmt::Display for NodeSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CSI node {}: cache budget {}, {} taken by {} volume{}",
            self.node_id,
            human(self.cache_budget),
            human(self.cache_taken),
            self.volumes,
            if self.volumes == 1 { "" } else { "s" }
        )
    }
}

/// Each node plugin that ran on this host (`blobdrive list`).
pub fn host_summaries() -> Vec<NodeSummary> {
    staged::budgets()
        .into_iter()
        .map(|b| {
            let budget = Budget {
                total: b.total,
                default_cache: 0,
                node_id: b.node_id.clone(),
                pending: Mutex::new(HashMap::new()),
            };
            let counted = budget.counted();
            NodeSummary {
                node_id: b.node_id,
                cache_budget: b.total,
                cache_taken: counted.iter().map(|c| c.cache_size).sum(),
                volumes: counted.len(),
            }
        })
        .collect()
}

/// A node plugin's budget.
pub struct Budget {
    pub total: u64,
    pub default_cache: u64,
    node_id: String,
    /// The volumes being staged now, by staging path.
    pending: Mutex<HashMap<PathBuf, Counted>>,
}

impl Budget {
    pub fn new(total: u64, max_volumes: u64, node_id: &str) -> Budget {
        let recorded = staged::NodeBudget {
            node_id: node_id.to_string(),
            total,
        };
        if let Err(e) = staged::save_budget(&recorded) {
            tracing::warn!("cannot record node {node_id}'s cache budget for blobdrive list: {e}");
        }
        Budget {
            total,
            default_cache: default_cache(total, max_volumes),
            node_id: node_id.to_string(),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// The volumes counted now: those being staged, and those staged whose
    /// mounts are alive.
    pub fn counted(&self) -> Vec<Counted> {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.counted_with(&pending)
    }

    fn counted_with(&self, pending: &HashMap<PathBuf, Counted>) -> Vec<Counted> {
        let mounts = record::load_all();
        let mut out: Vec<Counted> = pending.values().cloned().collect();
        for s in staged::of_node(&self.node_id) {
            if pending.contains_key(&s.staging) {
                continue;
            }
            let live = mounts
                .iter()
                .find(|r| r.mountpoint == s.staging && r.blob == s.volume_id && record::alive(r));
            if let Some(r) = live {
                out.push(Counted {
                    volume_id: s.volume_id,
                    staging: s.staging,
                    cache_size: r.cache_size.unwrap_or(s.cache_size),
                });
            }
        }
        out.sort_by(|a, b| a.staging.cmp(&b.staging));
        out
    }

    /// Takes `cache_size` of the budget for `volume_id` at `staging`, and
    /// records it staged there, or says (RESOURCE_EXHAUSTED, with the numbers)
    /// that it does not fit. Given back when the reservation is dropped
    /// unkept.
    pub fn reserve(
        &self,
        volume_id: &str,
        staging: &Path,
        cache_size: u64,
    ) -> Result<Reservation<'_>, Status> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let counted = self.counted_with(&pending);
        let taken: u64 = counted.iter().map(|c| c.cache_size).sum();
        let left = self.total.saturating_sub(taken);
        if cache_size > left {
            return Err(Status::resource_exhausted(format!(
                "volume {volume_id} needs a cache of {} (its cacheSize), more than this node's cache budget has left: {} of {} (--cache-budget), {} taken by {} volume{}",
                human(cache_size),
                human(left),
                human(self.total),
                human(taken),
                counted.len(),
                if counted.len() == 1 { "" } else { "s" }
            )));
        }
        staged::save(&Staged {
            node_id: self.node_id.clone(),
            volume_id: volume_id.to_string(),
            staging: staging.to_path_buf(),
            cache_size,
        })
        .map_err(|e| Status::internal(format!("cannot record the staging of {volume_id}: {e}")))?;
        pending.insert(
            staging.to_path_buf(),
            Counted {
                volume_id: volume_id.to_string(),
                staging: staging.to_path_buf(),
                cache_size,
            },
        );
        Ok(Reservation {
            budget: self,
            staging: staging.to_path_buf(),
            kept: false,
        })
    }

    /// Forgets the volume staged at `staging` (it was unstaged, or its mount
    /// is gone), unless it is being staged right now.
    pub fn release(&self, staging: &Path) {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.contains_key(staging) {
            staged::forget(staging);
        }
    }

    /// One line for the log: the budget, what is taken, each volume's cache.
    pub fn summary(&self) -> String {
        let counted = self.counted();
        let taken: u64 = counted.iter().map(|c| c.cache_size).sum();
        let each: Vec<String> = counted
            .iter()
            .map(|c| format!("{} {}", c.volume_id, human(c.cache_size)))
            .collect();
        format!(
            "cache budget {}, {} taken by {} volume{}{}{}; a volume without cacheSize gets {}",
            human(self.total),
            human(taken),
            counted.len(),
            if counted.len() == 1 { "" } else { "s" },
            if each.is_empty() { "" } else { ": " },
            each.join(", "),
            human(self.default_cache)
        )
    }
}

/// A volume's share of the budget while it is being staged.
pub struct Reservation<'a> {
    budget: &'a Budget,
    staging: PathBuf,
    kept: bool,
}

impl Reservation<'_> {
    /// The volume is staged: its record stays and counts from now on.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut pending = self
            .budget
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        pending.remove(&self.staging);
        if !self.kept {
            staged::forget(&self.staging);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cache_lets_max_volumes_fit_the_budget() {
        let gib = 1u64 << 30;
        // 16 GiB of memory: a 4 GiB budget, 64 volumes of 64 MiB.
        assert_eq!(default_total(16 * gib), 4 * gib);
        assert_eq!(default_cache(default_total(16 * gib), 64), 64 << 20);
        for mem in [8 * gib, 24 * gib, 64 * gib, 100 * gib + 12345] {
            let total = default_total(mem);
            let cache = default_cache(total, 64);
            assert!(cache * 64 <= total, "{mem}: {cache} x 64 > {total}");
            assert_eq!(cache % (1 << 20), 0);
        }
        // Never below what a mount takes, nor above a plain mount's default.
        assert_eq!(default_cache(192 << 20, 64), MIN_CACHE_SIZE);
        assert_eq!(default_cache(1 << 40, 64), MAX_DEFAULT_CACHE);
        assert_eq!(default_cache(1 << 30, 0), MAX_DEFAULT_CACHE);
    }
}
