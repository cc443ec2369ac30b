//! The cgroup a node plugin's volume daemons live in, apart from the plugin's.
//!
//! A container runtime stops a container by killing every process in its
//! cgroup (cgroup v2's `cgroup.kill`, or each pid it lists). A volume daemon
//! started by the node plugin inherits the plugin's cgroup, so restarting the
//! DaemonSet would kill every volume's daemon with it and leave its mounts
//! dead (ENOTCONN). Each `blobdrive mount` the plugin runs is therefore put
//! into a cgroup of its own choosing before it execs, and the daemon it starts
//! stays there when the plugin's container goes.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why the volume cgroup cannot be used.
#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("--volume-cgroup {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--volume-cgroup {0}: not a directory of a cgroup v2 hierarchy (nor one to be made in one): give a directory under the cgroup2 mount, e.g. /sys/fs/cgroup/blobdrive")]
    NotCgroup(String),
}

/// `CGROUP2_SUPER_MAGIC` of <linux/magic.h>: statfs(2)'s type of a cgroup v2
/// hierarchy (a v1 hierarchy's directories have a `cgroup.procs` too, so the
/// file alone does not tell them apart).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// A cgroup v2 directory volume daemons are moved into.
#[derive(Debug, Clone)]
pub struct VolumeCgroup {
    dir: PathBuf,
}

impl VolumeCgroup {
    /// The cgroup at `dir`, made if missing. Checked before anything is made:
    /// `dir`, or the parent it is to be made in, must be a directory of a
    /// cgroup v2 hierarchy, so a wrong path (a typo, a v1 hierarchy, a plain
    /// directory) is refused without leaving a directory behind.
    pub fn open(dir: &Path) -> Result<VolumeCgroup, CgroupError> {
        let shown = dir.display().to_string();
        let io = |source| CgroupError::Io {
            path: shown.clone(),
            source,
        };
        let exists = match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => true,
            Ok(_) => return Err(CgroupError::NotCgroup(shown)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(e)),
        };
        let checked = if exists {
            dir
        } else {
            dir.parent().unwrap_or(Path::new("/"))
        };
        if !on_cgroup2(checked).map_err(io)? {
            return Err(CgroupError::NotCgroup(shown));
        }
        if !exists {
            std::fs::create_dir(dir).map_err(io)?;
        }
        if !dir.join("cgroup.procs").is_file() {
            return Err(CgroupError::NotCgroup(shown));
        }
        Ok(VolumeCgroup {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Opens `cgroup.procs` for a child about to be started: the child writes
    /// "0" to it between fork and exec (see [`join_in_child`]), so it is never
    /// in the plugin's cgroup after its exec.
    pub fn procs(&self) -> std::io::Result<OwnedFd> {
        Ok(File::options()
            .write(true)
            .open(self.dir.join("cgroup.procs"))?
            .into())
    }
}

/// Whether the directory `dir` is in a cgroup v2 hierarchy (statfs(2)).
fn on_cgroup2(dir: &Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed statfs is a valid out-parameter.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `st` a statfs the call fills.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`.
/// Only write(2) on an open descriptor: safe between fork and exec.
pub fn join_in_child(procs: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: write(2) of a 1-byte static buffer to a descriptor we own.
    let n = unsafe { libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) };
    if n == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_outside_cgroup_v2_is_refused_in_one_line_and_not_made() {
        let dir = tempfile::tempdir().unwrap();
        let err = VolumeCgroup::open(&dir.path().join("vols")).unwrap_err();
        assert!(matches!(err, CgroupError::NotCgroup(_)), "{err}");
        assert!(!err.to_string().contains('\n'));
        assert!(
            !dir.path().join("vols").exists(),
            "a directory was left behind"
        );
        let err = VolumeCgroup::open(Path::new("/proc/no/such/dir")).unwrap_err();
        assert!(matches!(err, CgroupError::Io { .. }), "{err}");
    }
}
