//! The kernel's mount API (`fsopen`, `fsconfig`, `fsmount`, `move_mount`):
//! a filesystem set up through a descriptor and mounted as a new mount that is
//! in no mount namespace until it is placed, and is unmounted when its last
//! descriptor closes if it never is. FUSE is mounted so (`fuse.rs`), and the
//! crash-state replay mounts each state it checks so, detached.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `fsopen(2)` of the filesystem type `name`.
pub fn fs_open(name: &std::ffi::CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: a valid C string and integer flags.
    let fd =
        unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) } as libc::c_int;
    owned(fd)
}

/// `fsconfig(2)`: the string option `key` set to `value`, or the flag `key`.
pub fn fs_set(fs: &OwnedFd, key: &str, value: Option<&str>) -> std::io::Result<()> {
    let c = |v: &str| {
        std::ffi::CString::new(v)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let key = c(key)?;
    let value = value.map(c).transpose()?;
    let (cmd, ptr) = match &value {
        Some(v) => (FSCONFIG_SET_STRING, v.as_ptr()),
        None => (FSCONFIG_SET_FLAG, std::ptr::null()),
    };
    // SAFETY: valid C strings (or null for a flag) that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            key.as_ptr(),
            ptr,
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `fsconfig(FSCONFIG_CMD_CREATE)`, then `fsmount(2)` with the mount
/// attributes `attrs`: the new mount, not yet placed anywhere.
pub fn fs_mount(fs: &OwnedFd, attrs: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: integer arguments and null pointers, as the command takes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) }
        as libc::c_int;
    owned(fd)
}

/// `move_mount(2)` of the new mount `mount` onto the directory `at`.
pub fn move_mount(mount: &OwnedFd, at: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: descriptors of ours and empty C strings.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            c"".as_ptr(),
            at.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn owned(fd: libc::c_int) -> std::io::Result<OwnedFd> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Of <linux/mount.h>.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
