//! Mount points and directories: opening the checked directory without
//! following links, unmounting, and reading the mount table.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::mount::MountError;

/// Opens the directory `path` without following a symlink in its last part, and
/// only if it still is the directory `id` names (see [`check_same_dir`]): later
/// operations on it go through the descriptor, never the path again.
pub fn open_dir(path: &Path, id: Option<(u64, u64)>) -> Result<std::os::fd::OwnedFd, MountError> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| MountError::system("path contains NUL"))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    let changed = || {
        MountError::system(format!(
            "{} is no longer the directory that was checked before mounting (renamed, replaced or a symlink now): nothing was mounted there",
            path.display()
        ))
    };
    if fd < 0 {
        return Err(changed());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let cannot_use = |e| MountError::with_source(format!("cannot use {}", path.display()), e);
    let meta = std::fs::File::from(fd.try_clone().map_err(cannot_use)?)
        .metadata()
        .map_err(cannot_use)?;
    if id.is_some_and(|id| id != (meta.dev(), meta.ino())) {
        return Err(changed());
    }
    Ok(fd)
}

/// Unmounts `path`; a busy filesystem is [`MountError::Busy`] and stays mounted.
pub fn umount(path: &Path, lazy: bool) -> Result<(), MountError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| MountError::system("path contains NUL"))?;
    // Never through a symlink put in the mountpoint's place since it was checked.
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), flags) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) => Err(MountError::Busy(busy_with(path))),
        Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()), // not mounted (any more)
        _ => Err(MountError::with_source(
            format!("cannot unmount {}", path.display()),
            err,
        )),
    }
}

/// A busy mount at `path`, named with the processes that use it, as a raw
/// mount's `disk` is named with those that hold it open.
fn busy_with(path: &Path) -> String {
    let users = super::procs::users_of(path);
    if users.is_empty() {
        return path.display().to_string();
    }
    format!("{} (in use by {})", path.display(), users.join(", "))
}

/// Whether `path` is a mount point (per /proc/self/mountinfo).
pub fn is_mountpoint(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| unescape_mountinfo(mp) == want)
    })
}

/// Undoes the octal escapes (`\040` for a space) of a path in
/// /proc/self/mountinfo, as the kernel writes them, and in libmount's utab.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| {
            b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with the directories above its last part resolved (the last part
/// itself is not followed, nor asked anything: it may be a mount whose
/// server does not answer); `None` when they do not exist (or it has no last
/// part). The kernel's mount table writes places so.
pub fn resolve(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let parent = path.parent()?.canonicalize().ok()?;
    Some(parent.join(name))
}

/// The device, inode and mode (its type and permissions) of what `fd` is
/// open on, by `fstat`. (For a FUSE file, the server may be asked: call it
/// where waiting on the worker is allowed.)
pub fn id_of(fd: &impl AsRawFd) -> std::io::Result<(u64, u64, libc::mode_t)> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is a stat the call fills.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino, st.st_mode))
}

/// A directory's (device, inode), read without following a symlink.
pub fn dir_id(path: &Path) -> Result<(u64, u64), MountError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| MountError::with_source(format!("cannot use {}", path.display()), e))?;
    if !meta.is_dir() {
        return Err(MountError::system(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    Ok((meta.dev(), meta.ino()))
}

/// Refuses to mount at `path` unless it still is the directory `id` names: the
/// command that checked it ran earlier, and the path may since lead elsewhere
/// (renamed, replaced, or a symlink now).
pub fn check_same_dir(path: &Path, id: Option<(u64, u64)>) -> Result<(), MountError> {
    match id {
        Some(id) => open_dir(path, Some(id)).map(drop),
        None => Ok(()),
    }
}

/// Makes `dir`, private to root (0700): where FUSE is mounted in fs mode.
pub fn make_private_dir(dir: &Path) -> Result<(), MountError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| MountError::with_source(format!("cannot create {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountpoint_that_changed_since_it_was_checked_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mp = tmp.path().join("mnt");
        std::fs::create_dir(&mp).unwrap();
        let id = dir_id(&mp).unwrap();
        assert!(check_same_dir(&mp, Some(id)).is_ok());
        // Replaced by another directory of the same name.
        std::fs::rename(&mp, tmp.path().join("old")).unwrap();
        std::fs::create_dir(&mp).unwrap();
        assert!(check_same_dir(&mp, Some(id)).is_err());
        // A symlink to the directory that was checked.
        std::fs::remove_dir(&mp).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("old"), &mp).unwrap();
        let err = check_same_dir(&mp, Some(id)).unwrap_err().to_string();
        assert!(err.contains("no longer the directory"), "{err}");
    }
}
