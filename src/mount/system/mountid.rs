//! A mount as the kernel numbers it, and whether it is still mounted, asked
//! of the kernel by those numbers rather than by a path.
//!
//! The mount id of /proc/self/mountinfo and a filesystem's device number are
//! both given out again, lowest first, as soon as they are free: a FUSE mount
//! made right after another was unmounted often gets both of the old one's
//! (seen: a mount's record kept because another drive's new FUSE mount took
//! its id and device). So a mount is known by the 64-bit id the kernel never
//! gives twice (`STATX_MNT_ID_UNIQUE`, Linux 6.8), and `statmount(2)` says
//! whether it is still mounted. A kernel without them is read the mount table,
//! where the mount's id, device and place together name it.

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::mount::MountError;

/// A mount: its id and its filesystem's device as the mount table writes
/// them, and the id no other mount ever has, where the kernel gives one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountId {
    pub id: u64,
    pub dev: u64,
    pub unique: Option<u64>,
}

/// Refuses, in one line, a kernel older than a mount needs: Linux 5.8, whose
/// statx gives the mount id every mount is known by here, and which brings
/// the rest of what the root part asks of the kernel (the mount API, 5.2;
/// `openat2`, 5.6; `LOOP_CONFIGURE`, 5.8), so that none of those needs a way
/// around it. Asked before a mount does anything.
pub fn check_kernel() -> Result<(), MountError> {
    let too_old = |e: std::io::Error| {
        MountError::system(format!(
            "this kernel is too old to mount a drive: blobdrive needs Linux 5.8 or later (statx gives no mount id here: {e})"
        ))
    };
    let root = std::fs::File::open("/").map_err(|e| MountError::with_source("cannot open /", e))?;
    MountId::of(&root).map(drop).map_err(too_old)
}

/// `statmount(2)`: the same number on every architecture.
const SYS_STATMOUNT: libc::c_long = 457;
/// `STATMOUNT_SB_BASIC` of <linux/mount.h>.
const STATMOUNT_SB_BASIC: u64 = 1;

/// `struct mnt_id_req` of <linux/mount.h>, its first version.
#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

impl MountId {
    /// The mount `fd` is open in, and its filesystem's device (statx,
    /// without asking a FUSE server anything).
    pub fn of(fd: &impl AsRawFd) -> std::io::Result<MountId> {
        let st = statx(fd, libc::STATX_MNT_ID)?;
        if st.stx_mask & libc::STATX_MNT_ID == 0 {
            return Err(std::io::Error::other("the kernel gives no mount id"));
        }
        let unique = statx(fd, libc::STATX_MNT_ID_UNIQUE)
            .ok()
            .filter(|u| u.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0)
            .map(|u| u.stx_mnt_id);
        Ok(MountId {
            id: st.stx_mnt_id,
            dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            unique,
        })
    }

    /// Its device as the mount table writes it.
    pub fn devno(&self) -> String {
        format!("{}:{}", libc::major(self.dev), libc::minor(self.dev))
    }

    /// Whether it is still mounted in this process's mount namespace: asked
    /// by its unique id where the kernel has them, else per the mount table
    /// `mountinfo`, where it is the mount of its id and device at `at`.
    pub fn is_mounted(&self, mountinfo: &str, at: &Path) -> bool {
        if let Some(said) = self.unique.and_then(still_mounted) {
            return said;
        }
        self.listed_in(mountinfo, at)
    }

    /// Whether the mount table `mountinfo` has it at `at` (the kernel writes
    /// the place without links: only its parent is resolved here, as a stat
    /// of a FUSE mount itself would wait for its server).
    pub fn listed_in(&self, mountinfo: &str, at: &Path) -> bool {
        let real = super::resolve(at);
        let place = real.as_deref().unwrap_or(at).to_string_lossy().into_owned();
        let (id, devno) = (self.id.to_string(), self.devno());
        mountinfo.lines().any(|l| {
            let f: Vec<&str> = l.splitn(6, ' ').collect();
            f.len() == 6 && f[0] == id && f[2] == devno && super::unescape_mountinfo(f[4]) == place
        })
    }
}

/// Whether the mount whose unique id is `unique` is mounted in this process's
/// mount namespace (`statmount(2)`); `None` when the kernel cannot say.
fn still_mounted(unique: u64) -> Option<bool> {
    let req = MntIdReq {
        size: std::mem::size_of::<MntIdReq>() as u32,
        spare: 0,
        mnt_id: unique,
        param: STATMOUNT_SB_BASIC,
    };
    let mut buf = vec![0u64; 512];
    // SAFETY: a valid request and a buffer of the size given.
    let rc = unsafe {
        libc::syscall(
            SYS_STATMOUNT,
            &req as *const MntIdReq,
            buf.as_mut_ptr(),
            buf.len() * 8,
            0,
        )
    };
    match rc {
        0 => Some(true),
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) => Some(false),
        _ => None,
    }
}

/// statx(2) of what `fd` is open on, asking for `mask`, without asking a
/// FUSE server anything (`AT_STATX_DONT_SYNC`).
fn statx(fd: &impl AsRawFd, mask: libc::c_uint) -> std::io::Result<libc::statx> {
    // SAFETY: a zeroed statx is a valid out-parameter.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor, an empty C string and a statx to fill.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            mask,
            &mut st,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_is_known_by_its_id_device_and_place_in_the_table() {
        let table = "61 27 0:50 / /tmp/x rw,nosuid - fuse.blobdrive blobdrive:c/d.vhd rw\n\
                     62 27 0:51 / /tmp/y\\040z rw,nosuid - fuse.blobdrive blobdrive:c/e.vhd rw\n\
                     63 61 0:52 / /tmp/x rw - tmpfs tmpfs rw\n";
        let id = |id, minor| MountId {
            id,
            dev: libc::makedev(0, minor),
            unique: None,
        };
        let (x, yz) = (Path::new("/tmp/x"), Path::new("/tmp/y z"));
        assert!(id(61, 50).listed_in(table, x));
        assert!(id(62, 51).listed_in(table, yz));
        // Its id or its device given to another mount since, or elsewhere.
        assert!(!id(61, 51).listed_in(table, x));
        assert!(!id(64, 50).listed_in(table, x));
        assert!(!id(61, 50).listed_in(table, yz));
        assert_eq!(id(61, 50).devno(), "0:50");
    }

    /// A directory's mount, by its numbers: mounted (its unique id asked of
    /// the kernel where it has them, the table otherwise); a unique id no
    /// mount has is not.
    #[test]
    fn a_directory_s_mount_is_mounted_and_a_made_up_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let id = MountId::of(&std::fs::File::open(dir.path()).unwrap()).unwrap();
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(id.is_mounted(&table, Path::new("/")) || id.unique.is_none());
        if let Some(u) = id.unique {
            assert_eq!(still_mounted(u), Some(true));
            assert_eq!(still_mounted(u + (1 << 40)), Some(false));
        }
    }
}
