//! Mounting FUSE without a FUSE library, and opening what is in it without
//! following anything the worker serving it answers.
//!
//! The root part of a split daemon mounts FUSE itself and hands the
//! `/dev/fuse` descriptor to the worker, which could neither open `/dev/fuse`
//! (root's alone) nor call mount(2) (its seccomp filter refuses it). The mount
//! is made with the kernel's mount API (`fsopen`, `fsmount`, `move_mount`), so
//! root has the new mount itself in hand before it is placed, and knows it from
//! then on by the numbers the kernel gave it ([`MountId`]), never by a path.
//! Every lookup in it is answered by the worker, which can answer `disk` with
//! a symlink (to any file of the machine), a device node, or another drive's
//! file: root opens `disk` only beneath the mount's root, refusing symlinks,
//! magic links and other mounts on the way, and uses it only if it is a regular
//! file of that mount.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::newmount::{fs_mount, fs_open, fs_set, move_mount};
use super::{id_of, MountId, RegularFile};
use crate::mount::MountError;

/// What mounting FUSE gives the root part.
pub struct FuseMounted {
    /// The `/dev/fuse` descriptor that serves it (the worker's).
    pub dev: OwnedFd,
    /// The mount, by the kernel's numbers.
    pub id: MountId,
}

/// Mounts FUSE at the directory `at` (an `O_PATH` descriptor from
/// [`super::open_dir`]). The options are the ones fuser 0.18 gives today's
/// daemon (its `fuse_mount_sys`): `fd`, `rootmode` from the directory,
/// `user_id=0` and `group_id=0` without `allow_other` (the kernel lets root
/// alone in, as `SessionACL::Owner` did when root served the session),
/// `nodev` and `nosuid`, read-only when asked, and `source`
/// (`blobdrive:<blob>`) as the mount's source; the type is `fuse.blobdrive`.
pub fn mount_fuse(at: &OwnedFd, source: &str, read_only: bool) -> Result<FuseMounted, MountError> {
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| MountError::with_source("cannot open /dev/fuse", e))?
        .into();
    let fail = |e| MountError::with_source("cannot mount FUSE", e);
    let (_, _, mode) = id_of(at).map_err(fail)?;
    let fs = fs_open(c"fuse").map_err(fail)?;
    let options = [
        ("source", source.to_string()),
        ("subtype", "blobdrive".to_string()),
        ("fd", dev.as_raw_fd().to_string()),
        ("rootmode", format!("{mode:o}")),
        ("user_id", "0".to_string()),
        ("group_id", "0".to_string()),
    ];
    for (key, value) in &options {
        fs_set(&fs, key, Some(value)).map_err(fail)?;
    }
    if read_only {
        fs_set(&fs, "ro", None).map_err(fail)?;
    }
    let mut attrs = MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID;
    if read_only {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    let mount = fs_mount(&fs, attrs).map_err(fail)?;
    let id = MountId::of(&mount).map_err(fail)?;
    move_mount(&mount, at).map_err(fail)?;
    Ok(FuseMounted { dev, id })
}

/// The root of the mount `id` at `path`, opened `O_PATH` (which asks the FUSE
/// server nothing): the directories on the way are the machine's, but what is
/// found there is used only if it is that very mount's root, which cannot
/// change while it is held open.
pub fn open_mount_root(path: &Path, id: &MountId) -> Result<OwnedFd, MountError> {
    let root = open_beneath(
        None,
        path,
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_NO_MAGICLINKS,
    )
    .map_err(|e| MountError::with_source(format!("cannot open {}", path.display()), e))?;
    match MountId::of(&root) {
        Ok(found) if found == *id => Ok(root),
        Ok(_) => Err(MountError::system(format!(
            "{} is no longer the FUSE mount this mount made",
            path.display()
        ))),
        Err(e) => Err(MountError::with_source(
            format!("cannot check {}", path.display()),
            e,
        )),
    }
}

/// Unmounts the FUSE mount `id` at `path` (lazily when `lazy`), as a
/// filesystem is unmounted once its loop device was checked to be the
/// mount's: only while the mount at `path` is that very mount, its root
/// opened again and checked by the kernel's numbers just before `umount2`,
/// which follows no symlink in the last part ([`super::umount`]). Whatever
/// else is mounted there (over it, or in its place) is left alone, and the
/// refusal says so; a mount the kernel no longer has is unmounted already.
pub fn umount_fuse(path: &Path, id: &MountId, lazy: bool) -> Result<(), MountError> {
    if let Err(e) = open_mount_root(path, id) {
        let table = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|t| MountError::with_source("cannot read the mount table", t))?;
        if id.is_mounted(&table, path) {
            return Err(MountError::system(format!("{e}: not unmounted")));
        }
        return Ok(());
    }
    super::umount(path, lazy)
}

/// The FUSE file `disk`, opened beneath the FUSE mount's root `root` (see
/// [`open_mount_root`]) without following a symlink, a magic link, `..` or
/// another mount, and only if it is a regular file of the mount whose device
/// is `dev`: whatever the worker answered for the name, what is opened is a
/// file it serves. `how`: `O_RDWR`, `O_RDONLY` or `O_PATH` (a stat alone).
pub fn open_disk(root: &OwnedFd, dev: u64, how: libc::c_int) -> Result<RegularFile, MountError> {
    let resolve = libc::RESOLVE_NO_SYMLINKS
        | libc::RESOLVE_BENEATH
        | libc::RESOLVE_NO_MAGICLINKS
        | libc::RESOLVE_NO_XDEV;
    let refused = |why: String| MountError::system(format!("the FUSE file disk is refused: {why}"));
    // (openat2 takes no other flag with O_PATH.)
    let how = if how == libc::O_PATH {
        how
    } else {
        how | libc::O_NOCTTY
    };
    let file: File = open_beneath(Some(root), Path::new("disk"), how, resolve)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("the worker answered it with a symlink".into()),
            Some(libc::EXDEV) => refused("the worker answered it with another mount".into()),
            _ => MountError::with_source("cannot open the FUSE file disk", e),
        })?
        .into();
    let (on, ino, mode) =
        id_of(&file).map_err(|e| MountError::with_source("cannot check the FUSE file disk", e))?;
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refused(format!(
            "the worker answered it with a file of type {:o}, not a regular file",
            mode & libc::S_IFMT
        )));
    }
    if on != dev {
        return Err(refused("it is not a file of the drive's FUSE mount".into()));
    }
    Ok(RegularFile {
        file,
        id: (on, ino),
    })
}

/// openat2(2) of `path` beneath `dir` (or from the working directory) with
/// `resolve`'s restrictions. (Linux 5.6: a mount refuses to start on a kernel
/// older than the 5.8 it needs, see `mountid.rs`.)
fn open_beneath(
    dir: Option<&OwnedFd>,
    path: &Path,
    flags: libc::c_int,
    resolve: u64,
) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: an all-zero open_how is a valid value of this plain C struct.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: `c` is a valid path and `how` an open_how of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            at,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    } as libc::c_int;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Of <linux/mount.h>.
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// `dir` opened as `open_mount_root` opens a FUSE mount's root.
    fn root_of(dir: &Path) -> (OwnedFd, u64) {
        let id = MountId::of(&File::open(dir).unwrap()).unwrap();
        (open_mount_root(dir, &id).unwrap(), id.dev)
    }

    /// Whatever `disk` is answered with, only a regular file of the mount is
    /// opened: a symlink (to a file of root's), a FIFO and a directory are
    /// refused, and so is a regular file of another filesystem.
    #[test]
    fn disk_is_opened_only_as_a_regular_file_of_the_mount_without_following_links() {
        let secret = tempfile::NamedTempFile::new().unwrap();
        let refused = |make: &dyn Fn(&Path), want: &str| {
            let dir = tempfile::tempdir().unwrap();
            make(&dir.path().join("disk"));
            let (root, dev) = root_of(dir.path());
            for how in [libc::O_RDWR, libc::O_PATH] {
                let err = open_disk(&root, dev, how).err().map(|e| e.to_string());
                assert!(
                    err.as_deref().is_some_and(|e| e.contains(want)),
                    "{err:?}, wanted {want}"
                );
            }
        };
        refused(
            &|p| std::os::unix::fs::symlink(secret.path(), p).unwrap(),
            "a symlink",
        );
        refused(
            &|p| std::os::unix::fs::symlink("/proc/self/root/etc/passwd", p).unwrap(),
            "a symlink",
        );
        refused(
            &|p| {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid C string.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            },
            "not a regular file",
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("disk")).unwrap();
        let (root, dev) = root_of(dir.path());
        let err = open_disk(&root, dev, libc::O_PATH).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(open_disk(&root, dev, libc::O_RDWR).is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("disk"), b"bytes").unwrap();
        let (root, dev) = root_of(dir.path());
        let f = open_disk(&root, dev, libc::O_RDONLY).unwrap();
        assert_eq!(f.file.metadata().unwrap().len(), 5);
        let meta = std::fs::metadata(dir.path().join("disk")).unwrap();
        assert_eq!(f.id, (meta.dev(), meta.ino()));
        let err = open_disk(&root, dev + 1, libc::O_RDONLY).unwrap_err();
        assert!(
            err.to_string()
                .contains("not a file of the drive's FUSE mount"),
            "{err}"
        );
    }

    /// The mount at `dir` now, by its numbers.
    fn mount_at(dir: &Path) -> MountId {
        MountId::of(&File::open(dir).unwrap()).unwrap()
    }

    /// A tmpfs mounted at `dir` (over whatever is mounted there).
    fn tmpfs_at(dir: &Path) {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: valid C strings and no data.
        let rc = unsafe {
            libc::mount(
                c"none".as_ptr(),
                c.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }

    /// Unmounts (lazily) whatever a test left mounted at its directory,
    /// down to the directory's own filesystem, of device `.1`.
    struct Unmount<'a>(&'a Path, u64);

    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            for _ in 0..4 {
                if mount_at(self.0).dev == self.1 {
                    return;
                }
                let _ = super::super::umount(self.0, true);
            }
        }
    }

    /// The FUSE mount is unmounted by its numbers: while another mount is
    /// over it at its directory, that one is left alone and the unmount
    /// refused; once it is the mount there, it is unmounted; once gone, there
    /// is nothing to do.
    #[test]
    fn only_the_mount_named_is_unmounted_not_one_mounted_over_it() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let _cleanup = Unmount(dir.path(), mount_at(dir.path()).dev);
        tmpfs_at(dir.path());
        let ours = mount_at(dir.path());
        tmpfs_at(dir.path());
        let over = mount_at(dir.path());
        let err = umount_fuse(dir.path(), &ours, false).unwrap_err();
        assert!(err.to_string().contains("not unmounted"), "{err}");
        assert_eq!(mount_at(dir.path()), over, "the mount over it stays");
        umount_fuse(dir.path(), &over, false).unwrap();
        assert_eq!(mount_at(dir.path()), ours);
        umount_fuse(dir.path(), &ours, true).unwrap();
        assert_ne!(mount_at(dir.path()).dev, ours.dev);
        umount_fuse(dir.path(), &ours, false).unwrap();
    }

    #[test]
    fn a_mount_root_is_opened_only_if_it_is_the_mount_named() {
        let dir = tempfile::tempdir().unwrap();
        let meta = std::fs::metadata(dir.path()).unwrap();
        let id = MountId::of(&File::open(dir.path()).unwrap()).unwrap();
        assert_eq!(id.dev, meta.dev());
        assert!(open_mount_root(dir.path(), &id).is_ok());
        let other = MountId {
            id: id.id + 1,
            ..id
        };
        let err = open_mount_root(dir.path(), &other).unwrap_err();
        assert!(
            err.to_string().contains("no longer the FUSE mount"),
            "{err}"
        );
    }
}
