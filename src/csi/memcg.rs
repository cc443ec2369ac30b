//! A cgroup of its own for each staged volume's daemon, under the volume
//! cgroup, with a memory limit of the volume's cache plus the daemon's
//! overhead where a memory controller can be had, so that the kernel holds
//! each volume to its share of the node's cache budget.
//!
//! Where the memory controller is: on a cgroup v2 host, in the volume
//! cgroup's own hierarchy (`memory` in its `cgroup.controllers`; the volume
//! cgroup then enables it for its children and sets each one's
//! `memory.max`). On a host that still mounts the cgroup v1 memory hierarchy
//! beside a v2 one without it (systemd's "hybrid" layout), at the same path in
//! that hierarchy (`memory.limit_in_bytes`). Where neither is, the volumes run
//! unlimited, and the node plugin says so once at its start.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::size::human;

/// What a volume's daemon may hold beyond its cache: its overhead (at most
/// 150 MiB: transfer buffers, threads, the runtime), its root part's few
/// MiB, and the kernel memory charged to them (page tables, sockets, the
/// disk cache's page cache, which is reclaimed first).
pub const VOLUME_OVERHEAD: u64 = 192 << 20;

/// Where the volumes' memory is limited, if anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Memory {
    /// The volume cgroup's own (v2) hierarchy: `memory.max` of each child.
    V2,
    /// The v1 memory hierarchy, at this directory (the volume cgroup's path in
    /// it): `memory.limit_in_bytes` of each child.
    V1(PathBuf),
    /// Nowhere; why.
    Unlimited(String),
}

/// The volume cgroup and where its volumes' memory is limited.
#[derive(Debug, Clone)]
pub struct VolumeGroups {
    base: PathBuf,
    pub memory: Memory,
}

/// The cgroups one volume's daemon joins: `cgroup.procs` of each, opened
/// before the fork (see [`join_all_in_child`]).
pub struct Joining {
    pub procs: Vec<OwnedFd>,
}

impl VolumeGroups {
    /// Finds where the volumes under the v2 cgroup `base` can have their
    /// memory limited (see the module's doc), enabling the controller for
    /// `base`'s children when it is there; `mountinfo` is
    /// `/proc/self/mountinfo`'s text.
    pub fn detect(base: &Path, mountinfo: &str) -> VolumeGroups {
        let memory = match v2_memory(base) {
            Ok(true) => Memory::V2,
            Ok(false) => match v1_memory_dir(base, mountinfo) {
                Some(dir) => Memory::V1(dir),
                None => Memory::Unlimited(format!(
                    "the volume cgroup {} has no memory controller (cgroup v2 gives it none, and no cgroup v1 memory hierarchy is mounted)",
                    base.display()
                )),
            },
            Err(why) => Memory::Unlimited(why),
        };
        VolumeGroups {
            base: base.to_path_buf(),
            memory,
        }
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        match &self.memory {
            Memory::V2 => format!(
                "each volume's daemon runs in a cgroup of its own under {}, its memory.max its cache + {}",
                self.base.display(),
                human(VOLUME_OVERHEAD)
            ),
            Memory::V1(dir) => format!(
                "each volume's daemon runs in a cgroup of its own under {} and under {} (cgroup v1 memory), its memory.limit_in_bytes its cache + {}",
                self.base.display(),
                dir.display(),
                human(VOLUME_OVERHEAD)
            ),
            Memory::Unlimited(why) => format!(
                "{why}: volumes' memory is not limited by the kernel, only by their caches"
            ),
        }
    }

    /// Makes the cgroups of volume `name` (a child of the volume cgroup, and
    /// of the v1 memory directory when that is where memory is limited), sets
    /// the memory limit to `cache_size` + [`VOLUME_OVERHEAD`], and opens
    /// their `cgroup.procs` for the daemon to join.
    pub fn for_volume(&self, name: &str, cache_size: u64) -> std::io::Result<Joining> {
        let limit = (cache_size + VOLUME_OVERHEAD).to_string();
        let mut dirs = vec![self.base.join(name)];
        if let Memory::V1(dir) = &self.memory {
            dirs.push(dir.join(name));
        }
        for dir in &dirs {
            make_dir(dir)?;
        }
        match &self.memory {
            Memory::V2 => std::fs::write(dirs[0].join("memory.max"), &limit)?,
            Memory::V1(_) => std::fs::write(dirs[1].join("memory.limit_in_bytes"), &limit)?,
            Memory::Unlimited(_) => {}
        }
        let procs = dirs
            .iter()
            .map(|d| {
                File::options()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Joining { procs })
    }

    /// Removes volume `name`'s cgroups once its daemon is gone (a cgroup with
    /// a process left in it stays; the next stage of that volume reuses it).
    pub fn remove_volume(&self, name: &str) {
        let mut dirs = vec![self.base.join(name)];
        if let Memory::V1(dir) = &self.memory {
            dirs.push(dir.join(name));
        }
        for dir in dirs {
            for _ in 0..50 {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        }
    }
}

/// The cgroup directory of a volume's daemon: named by its staging path's
/// mount record id, so unstaging finds it again.
pub fn volume_name(staging: &Path) -> String {
    format!("vol-{}", crate::mount::record::id_for(staging))
}

/// Moves the calling process into every cgroup of `joining`. Only write(2) on
/// open descriptors: safe between fork and exec.
pub fn join_all_in_child(joining: &Joining) -> std::io::Result<()> {
    for procs in &joining.procs {
        super::cgroup::join_in_child(procs)?;
    }
    Ok(())
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Whether the v2 cgroup `base` can give its children the memory controller,
/// enabling it for them; `Err` says why it is there but cannot be used.
fn v2_memory(base: &Path) -> Result<bool, String> {
    let controllers = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Ok(false);
    }
    let control = base.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&control).unwrap_or_default();
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(true);
    }
    std::fs::write(&control, "+memory").map_err(|e| {
        format!(
            "cannot enable the memory controller for the volumes in {} ({e}; a cgroup with processes of its own cannot)",
            base.display()
        )
    })?;
    Ok(true)
}

/// The directory at `base`'s path in the cgroup v1 memory hierarchy, made if
/// missing, when `mountinfo` shows that hierarchy mounted and `base` in a v2
/// one.
fn v1_memory_dir(base: &Path, mountinfo: &str) -> Option<PathBuf> {
    let mounts: Vec<(&str, &str, &str)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            Some((point, r.next()?, r.nth(1)?))
        })
        .collect();
    let v2_root = mounts
        .iter()
        .filter(|(point, fstype, _)| *fstype == "cgroup2" && base.starts_with(point))
        .map(|(point, _, _)| Path::new(point))
        .max_by_key(|p| p.as_os_str().len())?;
    let relative = base.strip_prefix(v2_root).ok()?;
    let v1 = mounts.iter().find(|(_, fstype, options)| {
        *fstype == "cgroup" && options.split(',').any(|o| o == "memory")
    })?;
    let dir = Path::new(v1.0).join(relative);
    let mut level = Path::new(v1.0).to_path_buf();
    for part in relative.components() {
        level.push(part);
        make_dir(&level).ok()?;
    }
    dir.join("memory.limit_in_bytes").is_file().then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
40 35 0:35 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
41 35 0:36 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu\n";

    #[test]
    fn a_hybrid_host_limits_memory_at_the_same_path_in_the_v1_hierarchy() {
        let top = tempfile::tempdir().unwrap();
        let v2 = top.path().join("unified");
        let v1 = top.path().join("memory");
        std::fs::create_dir_all(v2.join("blobdrive")).unwrap();
        std::fs::create_dir_all(&v1).unwrap();
        let mountinfo = HYBRID.replace("/sys/fs/cgroup", &top.path().display().to_string());
        let base = v2.join("blobdrive");
        // A real v1 directory has memory.limit_in_bytes; a plain one has not.
        assert!(v1_memory_dir(&base, &mountinfo).is_none());
        std::fs::write(v1.join("blobdrive").join("memory.limit_in_bytes"), "0").unwrap();
        assert_eq!(v1_memory_dir(&base, &mountinfo), Some(v1.join("blobdrive")));
        // No memory hierarchy: unlimited, saying why.
        let groups = VolumeGroups::detect(&base, &mountinfo.replace("rw,memory", "rw,pids"));
        assert!(
            matches!(&groups.memory, Memory::Unlimited(why) if why.contains("no memory controller")),
            "{groups:?}"
        );
        assert!(groups.describe().contains("not limited by the kernel"));
    }

    #[test]
    fn a_v2_cgroup_with_the_memory_controller_gives_it_to_its_children() {
        let top = tempfile::tempdir().unwrap();
        std::fs::write(
            top.path().join("cgroup.controllers"),
            "cpu io memory pids\n",
        )
        .unwrap();
        std::fs::write(top.path().join("cgroup.subtree_control"), "").unwrap();
        assert_eq!(v2_memory(top.path()), Ok(true));
        assert_eq!(
            std::fs::read_to_string(top.path().join("cgroup.subtree_control")).unwrap(),
            "+memory"
        );
        std::fs::write(top.path().join("cgroup.controllers"), "cpu pids\n").unwrap();
        assert_eq!(v2_memory(top.path()), Ok(false));
    }
}
