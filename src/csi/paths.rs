//! The kubelet's paths as the node plugin uses them: the last part of a
//! staging or target path is never followed (a symlink there is refused, never
//! mounted through), and every bind mount, remount and unmount goes through a
//! descriptor of what was checked (`/proc/self/fd/N`, as `blobdrive mount`
//! mounts its filesystem), so what is mounted on is what was looked at,
//! whatever the path leads to by then.
//!
//! The directories above the last part are the kubelet's own and may be
//! symlinks (`/var/lib/kubelet` moved to another disk): they are resolved
//! once, and the resolved path is the one recorded and compared.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use tonic::Status;

use crate::mount::system::mount_on;
/// The directories above a path's last part resolved, and what a
/// descriptor is open on: as the root part of a mount asks them.
pub use crate::mount::system::{id_of, resolve};

/// [`resolve`] of a path a call needs to use: INVALID_ARGUMENT when its
/// directory does not exist (the CO makes it).
pub fn resolve_arg(path: &Path, what: &str) -> Result<PathBuf, Status> {
    resolve(path).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{what} {}: the directory it is to be in does not exist",
            path.display()
        ))
    })
}

/// What is at a path (its last part not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Nothing,
    Dir((u64, u64)),
    File((u64, u64)),
    /// A symlink, a device node, a socket...
    Other,
}

pub fn found(path: &Path) -> std::io::Result<Found> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(Found::Dir((m.dev(), m.ino()))),
        Ok(m) if m.is_file() => Ok(Found::File((m.dev(), m.ino()))),
        Ok(_) => Ok(Found::Other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Found::Nothing),
        Err(e) => Err(e),
    }
}

/// Opens `path` without following its last part (`O_PATH`): a directory when
/// `dir`, else anything but a symlink. Used for mounting, never for I/O.
///
/// A directory is opened without asking its filesystem anything: `O_DIRECTORY`
/// refuses a symlink already (ENOTDIR), and a filesystem shut down after I/O
/// errors (xfs, once its volume was fenced and its log could not be written)
/// answers every stat with EIO, while its mounts must still be found and
/// taken down.
pub fn open_path(path: &Path, dir: bool) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if dir {
        flags |= libc::O_DIRECTORY;
    }
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if !dir && id_of(&fd)?.2 & libc::S_IFMT == libc::S_IFLNK {
        return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
    }
    Ok(fd)
}

/// The kernel's id of the mount `fd` is open in (`mnt_id` of its fdinfo).
pub fn mount_id(fd: &OwnedFd) -> std::io::Result<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("mnt_id:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| std::io::Error::other("no mnt_id in fdinfo"))
}

/// The device (as `st_dev` numbers it) and the root within its filesystem of
/// the mount `mount_id`, as this process's mount table says: what identifies a
/// mount whose filesystem answers no stat (see [`open_path`]).
pub fn mount_source(mount_id: u64) -> Option<(u64, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    source_per(&info, mount_id)
}

/// [`mount_source`], per the mount table `info` read already.
fn source_per(info: &str, mount_id: u64) -> Option<(u64, String)> {
    let line = info
        .lines()
        .find(|l| l.split(' ').next().and_then(|m| m.parse().ok()) == Some(mount_id))?;
    let mut fields = line.split(' ').skip(2);
    let (major, minor) = fields.next()?.split_once(':')?;
    let root = fields.next()?.to_string();
    Some((
        libc::makedev(major.parse().ok()?, minor.parse().ok()?),
        root,
    ))
}

/// Bind-mounts what `from` is open on onto what `to` is open on.
pub fn bind(from: &OwnedFd, to: &OwnedFd) -> std::io::Result<()> {
    let source = format!("/proc/self/fd/{}", from.as_raw_fd());
    mount_on(&source, to, "", libc::MS_BIND, "")
}

/// Sets the flags of the bind mount whose root `at` is open on: nosuid, and
/// nodev unless it is a block device's node (`device`); read-only if asked.
pub fn restrict(at: &OwnedFd, read_only: bool, device: bool) -> std::io::Result<()> {
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID;
    if !device {
        flags |= libc::MS_NODEV;
    }
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    mount_on("none", at, "", flags, "")
}

/// Unmounts the mount at `path` (its last part not followed) if it still is
/// the mount `mount_id` `fd` was checked to be on: `fd` is closed first (an
/// open descriptor keeps a mount busy), then the path's top mount is looked at
/// again just before it goes.
pub fn unmount(fd: OwnedFd, path: &Path, dir: bool) -> std::io::Result<()> {
    let want = mount_id(&fd)?;
    drop(fd);
    let again = open_path(path, dir)?;
    if mount_id(&again)? != want {
        return Err(std::io::Error::other("the mount there changed meanwhile"));
    }
    drop(again);
    crate::mount::system::umount(path, false).map_err(std::io::Error::other)
}

/// Makes the directory (or, for a block volume, the empty file) `path`, not
/// through a symlink; its (device, inode).
pub fn make(path: &Path, dir: bool) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    if dir {
        std::fs::DirBuilder::new().mode(0o750).create(path)?;
        let m = std::fs::symlink_metadata(path)?;
        return Ok((m.dev(), m.ino()));
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// Removes what [`make`] made at `path` (`made`), if it still is that and
/// empty: never anything else.
pub fn unmake(path: &Path, made: (u64, u64)) {
    let removed = match found(path) {
        Ok(Found::Dir(id)) if id == made => std::fs::remove_dir(path),
        Ok(Found::File(id)) if id == made => {
            match std::fs::symlink_metadata(path).map(|m| m.len()) {
                Ok(0) => std::fs::remove_file(path),
                _ => return,
            }
        }
        _ => return,
    };
    if let Err(e) = removed {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_is_never_opened_through() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(open_path(&real, true).is_ok());
        assert!(open_path(&link, true).is_err());
        assert!(open_path(&link, false).is_err());
        assert_eq!(found(&link).unwrap(), Found::Other);
        let file = dir.path().join("f");
        let made = make(&file, false).unwrap();
        assert!(open_path(&file, false).is_ok());
        // Only what was made, and only while it is empty.
        std::fs::write(&file, "data").unwrap();
        unmake(&file, made);
        assert!(file.exists());
        let d = dir.path().join("d");
        let made = make(&d, true).unwrap();
        unmake(&d, (made.0, made.1 + 1));
        assert!(d.exists());
        unmake(&d, made);
        assert!(!d.exists());
        assert_eq!(
            resolve(&link.join("x")).unwrap(),
            real.canonicalize().unwrap().join("x")
        );
        assert_eq!(resolve(&dir.path().join("none/x")), None);
    }

    #[test]
    fn a_mount_s_device_and_root_are_read_from_the_mount_table() {
        let info = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
618 22 7:3 / /var/lib/kubelet/pods/p/volumes/v/mount rw,nosuid,nodev shared:300 - xfs /dev/loop3 rw
619 22 7:3 /sub /elsewhere rw shared:301 - xfs /dev/loop3 rw
";
        assert_eq!(
            source_per(info, 618),
            Some((libc::makedev(7, 3), "/".to_string()))
        );
        assert_eq!(
            source_per(info, 619),
            Some((libc::makedev(7, 3), "/sub".to_string()))
        );
        assert_eq!(source_per(info, 61), None);
        let mine = open_path(Path::new("/"), true).unwrap();
        let (dev, _, _) = id_of(&mine).unwrap();
        let (seen, _) = mount_source(mount_id(&mine).unwrap()).unwrap();
        assert_eq!(seen, dev);
    }
}
