//! Filesystems on a drive's device: what is there, creating one, mounting it
//! through a checked directory, growing it in place, and freezing it for a
//! consistent snapshot.

use std::os::fd::AsRawFd;
use std::path::Path;

use super::loopdev::{block_size, block_size_to_sector_size};
use super::{confined, run_on, LoopDevice, Pinned};
use crate::mount::MountError;

/// Grows the filesystem of `dev`, mounted at `mountpoint`, to fill the device, in
/// place and while in use. The kernel does it, asked as resize2fs and
/// xfs_growfs ask it (`EXT4_IOC_RESIZE_FS`, `XFS_IOC_FSGROWFSDATA` with the
/// size in the filesystem's blocks), so no tool running as root reads the
/// drive's bytes first. Only if `mountpoint` (not followed if a symlink) is
/// still the root of `dev`'s filesystem.
pub fn grow_fs(dev: &Pinned, fstype: &str, mountpoint: &Path) -> Result<(), MountError> {
    let root = open_root_of(mountpoint, dev, "growing")?;
    let bytes = block_size(&dev.file)
        .map_err(|e| MountError::with_source(format!("cannot read the size of {}", dev), e))?;
    let failed = |e: std::io::Error| {
        MountError::with_source(format!("cannot grow the {fstype} filesystem of {dev}"), e)
    };
    let last_os = || Err(failed(std::io::Error::last_os_error()));
    match fstype {
        "ext4" => {
            // SAFETY: fstatvfs writes only into the zeroed struct it is given.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            if unsafe { libc::fstatvfs(root.as_raw_fd(), &mut st) } != 0 || st.f_bsize == 0 {
                return last_os();
            }
            let blocks: u64 = bytes / st.f_bsize;
            // SAFETY: the ioctl reads one u64, the new size in blocks.
            if unsafe { libc::ioctl(root.as_raw_fd(), EXT4_IOC_RESIZE_FS, &blocks) } != 0 {
                return last_os();
            }
            Ok(())
        }
        "xfs" => {
            // SAFETY: an all-zero geometry is a valid value of this plain C struct.
            let mut geo: XfsGeometryV1 = unsafe { std::mem::zeroed() };
            // SAFETY: the ioctl writes one xfs_fsop_geom_v1 into `geo`.
            if unsafe { libc::ioctl(root.as_raw_fd(), XFS_IOC_FSGEOMETRY_V1, &mut geo) } != 0
                || geo.blocksize == 0
            {
                return last_os();
            }
            let newblocks = bytes / u64::from(geo.blocksize);
            if newblocks <= geo.datablocks {
                return Ok(());
            }
            let grow = XfsGrowfsData {
                newblocks,
                imaxpct: geo.imaxpct,
            };
            // SAFETY: the ioctl reads one xfs_growfs_data.
            if unsafe { libc::ioctl(root.as_raw_fd(), XFS_IOC_FSGROWFSDATA, &grow) } != 0 {
                return last_os();
            }
            Ok(())
        }
        other => Err(MountError::system(format!(
            "a {other} filesystem is not grown by blobdrive"
        ))),
    }
}

/// `_IOW('f', 16, __u64)` of linux/ext4.h.
const EXT4_IOC_RESIZE_FS: libc::c_ulong = 0x4008_6610;
/// `_IOR('X', 100, struct xfs_fsop_geom_v1)` and `_IOW('X', 110, struct
/// xfs_growfs_data)` of xfs_fs.h.
const XFS_IOC_FSGEOMETRY_V1: libc::c_ulong = 0x8070_5864;
const XFS_IOC_FSGROWFSDATA: libc::c_ulong = 0x4010_586e;

/// `struct xfs_fsop_geom_v1` of xfs_fs.h (112 bytes).
#[repr(C)]
struct XfsGeometryV1 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    logblocks: u32,
    sectsize: u32,
    inodesize: u32,
    imaxpct: u32,
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    logstart: u64,
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
}

/// `struct xfs_growfs_data` of xfs_fs.h (16 bytes).
#[repr(C)]
struct XfsGrowfsData {
    newblocks: u64,
    imaxpct: u32,
}

/// Grows the ext4 filesystem on `dev`, not mounted, to fill the device:
/// `e2fsck -f -p` first (resize2fs refuses a filesystem not checked since it was
/// last mounted; `-p` repairs only what is safe without asking, the journal's
/// replay included), then `resize2fs`. Unlike growing it mounted, this needs no
/// `CAP_SYS_RESOURCE`.
pub fn grow_ext4_unmounted(dev: &Pinned) -> Result<(), MountError> {
    let out = confined::output_on(dev, "e2fsck", &["-f", "-p", dev.path()])?;
    // 0: clean; 1: errors corrected.
    if !matches!(out.status.code(), Some(0 | 1)) {
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let line = said
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("no message");
        let line = crate::azure::text::escape_controls(line);
        return Err(MountError::system(format!(
            "e2fsck -f -p {dev} found what it repairs only when asked ({line}), so the filesystem was not grown"
        )));
    }
    run_on(dev, "resize2fs", &[dev.path()]).map(|_| ())
}

/// `CAP_SYS_RESOURCE` of <linux/capability.h>: growing a mounted ext4 needs it
/// (the kernel checks it in `ext4_resize_begin`); containers often drop it.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has capability `cap` in effect (/proc/self/status).
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|eff| eff >> cap & 1 == 1)
}

/// The total size in bytes of the filesystem mounted at `path` (statvfs).
pub fn fs_size(path: &Path) -> Option<u64> {
    statvfs(path).ok().map(|st| st.f_blocks * st.f_frsize)
}

/// Bytes free for root on the filesystem holding `path` (statvfs).
pub fn free_space(path: &Path) -> Option<u64> {
    statvfs(path).ok().map(|st| st.f_bfree * st.f_frsize)
}

/// statvfs(3) of the filesystem holding `path`.
pub fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `st` a statvfs the call fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// The filesystem type on a device, if any.
pub fn fs_type(dev: &Pinned) -> Result<Option<String>, MountError> {
    let out = confined::output_on(
        dev,
        "blkid",
        &["-p", "-o", "value", "-s", "TYPE", dev.path()],
    )?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok((!t.is_empty()).then_some(t))
        }
        // 2: nothing found.
        Some(2) => Ok(None),
        _ => Err(MountError::system(format!(
            "blkid {dev} failed: {}",
            crate::azure::text::escape_controls(String::from_utf8_lossy(&out.stderr).trim())
        ))),
    }
}

/// Creates a filesystem without discarding the whole disk first (that would be a
/// Clear Pages over every byte of a drive that is already empty).
///
/// It runs only on a drive found blank (see [`super::filesystem::prepare`]):
/// no byte of the disk was ever written, so it reads as zeros. ext4 is told
/// so (`assume_storage_prezeroed`), and marks its inode tables zeroed: otherwise the kernel's ext4lazyinit zeroes them in the background
/// after the first mount, through the loop device as Clear Pages calls that
/// only repeat what the blob already holds. During an outage such a call
/// waits, and the loop device's reads queue behind it (a read of cached data
/// waited for an expired token in a fresh-clone run of entra_mount).
pub fn mkfs(dev: &Pinned, fstype: &str) -> Result<(), MountError> {
    match fstype {
        "ext4" => run_on(
            dev,
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "nodiscard,assume_storage_prezeroed=1",
                dev.path(),
            ],
        )
        .map(|_| ()),
        "xfs" => {
            // Held open (pinned) while the tool runs: the kernel keeps the
            // block size set now until the last opener closes it.
            block_size_to_sector_size(&dev.file).map_err(|e| {
                MountError::with_source(format!("cannot set the block size of {}", dev), e)
            })?;
            run_on(dev, "mkfs.xfs", &["-q", "-f", "-K", dev.path()]).map(|_| ())
        }
        other => Err(MountError::system(format!(
            "--mkfs {other}: only ext4 and xfs are supported"
        ))),
    }
}

/// Mounts `dev` at the directory `at` (opened by [`open_dir`], so the mount lands
/// on the directory that was checked, whatever its path leads to by now). A
/// read-only ext4 whose journal needs recovery (a crash-consistent snapshot) is
/// mounted without replaying it. `flags` (e.g. `nosuid`, `noatime`) are mount(8)'s
/// words for the kernel's flags.
pub fn mount_fs(
    dev: &Pinned,
    at: &std::os::fd::OwnedFd,
    fstype: &str,
    read_only: bool,
    flags: &[String],
) -> Result<(), MountError> {
    // A drive made from a snapshot (a restore beside its source, a CSI volume
    // from a snapshot) holds an xfs with its source's UUID, which xfs refuses
    // to mount beside the source unless told not to check. Two mounts of one
    // drive are kept apart by its lease, not by the UUID.
    let data = if fstype == "xfs" { "nouuid" } else { "" };
    if !read_only {
        return mount_at(dev, at, fstype, flags, data);
    }
    let mut ro: Vec<String> = flags.to_vec();
    ro.push("ro".into());
    match mount_at(dev, at, fstype, &ro, data) {
        Ok(()) => Ok(()),
        Err(e) if fstype == "ext4" => mount_at(dev, at, fstype, &ro, "noload").map_err(|_| e),
        Err(e) if fstype == "xfs" => {
            mount_at(dev, at, fstype, &ro, "norecovery,nouuid").map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// The kernel's mount flags for mount(8)'s words; `None` for a word that is not a
/// flag.
fn mount_flag(word: &str) -> Option<(libc::c_ulong, bool)> {
    Some(match word {
        "ro" => (libc::MS_RDONLY, true),
        "rw" => (libc::MS_RDONLY, false),
        "nosuid" => (libc::MS_NOSUID, true),
        "suid" => (libc::MS_NOSUID, false),
        "nodev" => (libc::MS_NODEV, true),
        "dev" => (libc::MS_NODEV, false),
        "noexec" => (libc::MS_NOEXEC, true),
        "exec" => (libc::MS_NOEXEC, false),
        "noatime" => (libc::MS_NOATIME, true),
        "relatime" => (libc::MS_RELATIME, true),
        "strictatime" => (libc::MS_STRICTATIME, true),
        "nodiratime" => (libc::MS_NODIRATIME, true),
        _ => return None,
    })
}

/// mount(2) of `dev` onto the directory `at` through `/proc/self/fd/N`.
fn mount_at(
    dev: &LoopDevice,
    at: &std::os::fd::OwnedFd,
    fstype: &str,
    words: &[String],
    data: &str,
) -> Result<(), MountError> {
    let mut flags: libc::c_ulong = 0;
    for w in words {
        let (bit, on) =
            mount_flag(w).ok_or_else(|| MountError::system(format!("unknown mount option {w}")))?;
        if on {
            flags |= bit;
        } else {
            flags &= !bit;
        }
    }
    mount_on(dev.path(), at, fstype, flags, data).map_err(|e| {
        MountError::with_source(format!("cannot mount the {fstype} filesystem of {dev}"), e)
    })
}

/// mount(2) of `source` (a `fstype` with `flags` and `data`) on the directory
/// `at` opened by [`super::open_dir`], through `/proc/self/fd` so that the
/// mount lands on the directory that was checked, whatever its path leads to
/// now.
pub fn mount_on(
    source: &str,
    at: &std::os::fd::OwnedFd,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let c = |v: &str| {
        std::ffi::CString::new(v).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in a mount argument")
        })
    };
    let (src, target) = (c(source)?, c(&format!("/proc/self/fd/{}", at.as_raw_fd()))?);
    let (ty, data) = (c(fstype)?, c(data)?);
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            ty.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Freezes the filesystem mounted at `mountpoint` (FIFREEZE through a descriptor
/// opened without following a symlink, and only if it is the root of `dev`'s
/// filesystem); thawed by [`thaw`] on the same descriptor.
pub fn freeze(mountpoint: &Path, dev: &LoopDevice) -> Result<std::fs::File, MountError> {
    use std::os::fd::AsRawFd;
    let f = open_root_of(mountpoint, dev, "freezing")?;
    // SAFETY: FIFREEZE on an open directory of the filesystem; the argument is ignored.
    if unsafe { libc::ioctl(f.as_raw_fd(), FIFREEZE, 0) } != 0 {
        return Err(MountError::with_source(
            format!("cannot freeze {}", mountpoint.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(f)
}

/// `mountpoint` opened as a directory without following a symlink, if it is the
/// root of `dev`'s filesystem; otherwise an error saying it is not `doing` it.
fn open_root_of(
    mountpoint: &Path,
    dev: &LoopDevice,
    doing: &str,
) -> Result<std::fs::File, MountError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(mountpoint)
        .map_err(|e| MountError::with_source(format!("cannot open {}", mountpoint.display()), e))?;
    let here = f
        .metadata()
        .map_err(|e| MountError::with_source(format!("cannot check {}", mountpoint.display()), e))?
        .dev();
    if Some(here) != dev.rdev() {
        return Err(MountError::system(format!(
            "{} is not the filesystem of {dev} any more: not {doing} it",
            mountpoint.display()
        )));
    }
    Ok(f)
}

/// Thaws what [`freeze`] froze.
pub fn thaw(frozen: &std::fs::File) -> Result<(), MountError> {
    use std::os::fd::AsRawFd;
    // SAFETY: FITHAW on the descriptor FIFREEZE was given.
    if unsafe { libc::ioctl(frozen.as_raw_fd(), FITHAW, 0) } != 0 {
        return Err(MountError::with_source(
            "cannot thaw",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` of linux/fs.h.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;
