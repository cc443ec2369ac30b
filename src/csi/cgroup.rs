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
    #[error("--volume-cgroup {0}: not a cgroup v2 directory (it has no cgroup.procs)")]
    NotCgroup(String),
}

/// A cgroup v2 directory volume daemons are moved into.
#[derive(Debug, Clone)]
pub struct VolumeCgroup {
    dir: PathBuf,
}

impl VolumeCgroup {
    /// The cgroup at `dir`, made if missing; its parent must be in a cgroup v2
    /// hierarchy (the made directory then has `cgroup.procs`).
    pub fn open(dir: &Path) -> Result<VolumeCgroup, CgroupError> {
        let shown = dir.display().to_string();
        if let Err(source) = std::fs::create_dir(dir) {
            if source.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(CgroupError::Io {
                    path: shown,
                    source,
                });
            }
        }
        if !dir.join("cgroup.procs").is_file() {
            return Err(CgroupError::NotCgroup(shown));
        }
        Ok(VolumeCgroup {
            dir: dir.to_path_buf(),
        })
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
    fn a_directory_outside_cgroup_v2_is_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let err = VolumeCgroup::open(&dir.path().join("vols")).unwrap_err();
        assert!(matches!(err, CgroupError::NotCgroup(_)), "{err}");
        assert!(!err.to_string().contains('\n'));
        let err = VolumeCgroup::open(Path::new("/proc/no/such/dir")).unwrap_err();
        assert!(matches!(err, CgroupError::Io { .. }), "{err}");
    }
}
