//! Mounting FUSE without a FUSE library: the root part of a split daemon mounts
//! it itself and hands the `/dev/fuse` descriptor to the worker, which could
//! neither open `/dev/fuse` (root's alone) nor call mount(2) (its seccomp filter
//! refuses it).

use std::os::fd::{AsRawFd, OwnedFd};

use crate::mount::MountError;

/// Mounts FUSE at the directory `at` (an `O_PATH` descriptor from
/// [`super::open_dir`]) and returns the `/dev/fuse` descriptor that serves it.
/// The options are the ones fuser 0.18 gives today's daemon (its
/// `fuse_mount_sys`): `fd`, `rootmode` from the directory, `user_id=0` and
/// `group_id=0` without `allow_other` (the kernel lets root alone in, as
/// `SessionACL::Owner` did when root served the session), `nodev` and
/// `nosuid`, read-only when asked, and `source` (`blobdrive:<blob>`) as the
/// mount's source.
pub fn mount_fuse(at: &OwnedFd, source: &str, read_only: bool) -> Result<OwnedFd, MountError> {
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| MountError::with_source("cannot open /dev/fuse", e))?
        .into();
    // SAFETY: fstat writes only into the zeroed struct it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(at.as_raw_fd(), &mut st) } != 0 {
        return Err(MountError::with_source(
            "cannot read the mountpoint's mode",
            std::io::Error::last_os_error(),
        ));
    }
    let data = format!(
        "fd={},rootmode={:o},user_id=0,group_id=0",
        dev.as_raw_fd(),
        st.st_mode
    );
    let mut flags = libc::MS_NODEV | libc::MS_NOSUID;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    super::fs::mount_on(source, at, "fuse.blobdrive", flags, &data)
        .map_err(|e| MountError::with_source("cannot mount FUSE", e))?;
    Ok(dev)
}
