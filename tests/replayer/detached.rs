//! A filesystem image mounted where nothing else reaches it: attached to a
//! loop device of its own that clears itself once its last user lets go, and
//! mounted with the kernel's mount API as a detached mount (`fsopen`,
//! `fsmount`, never `move_mount`), reachable only through its descriptor
//! (`/proc/self/fd/N`) and unmounted when that closes.
//!
//! Why not a mount namespace of its own: a new namespace copies every mount of
//! the machine, other tests' drives with them, and a copy keeps a drive's
//! filesystem and loop device alive after its unmount (see
//! tests/common/namespace.rs). A detached mount is in no namespace's tree, so
//! no namespace made meanwhile copies it either; and a test that dies leaves
//! nothing behind: its descriptors close.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` of <linux/loop.h>.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Of <linux/mount.h>.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

/// A detached mount of an image's filesystem.
pub struct Detached {
    mount: OwnedFd,
    /// The loop device, `loopN`.
    loop_name: String,
    image: PathBuf,
}

impl Detached {
    /// Mounts the filesystem `fstype` of `image` read-write (the kernel
    /// replays its journal or log, as the mount after a crash does), with
    /// the flags `flags` (`nouuid`). The error says what the kernel said.
    pub fn mount(image: &Path, fstype: &str, flags: &[&str]) -> Result<Detached, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(image)
            .map_err(|e| format!("{}: {e}", image.display()))?;
        // Held until the filesystem has the device open: the device clears
        // itself once its last user lets go.
        let (_dev, loop_name) = attach(&file).map_err(|e| format!("no loop device: {e}"))?;
        let fs = fs_open(fstype).map_err(|e| format!("fsopen {fstype}: {e}"))?;
        fs_set(&fs, "source", Some(&format!("/dev/{loop_name}")))
            .map_err(|e| format!("source: {e}"))?;
        for flag in flags {
            fs_set(&fs, flag, None).map_err(|e| format!("{flag}: {e}"))?;
        }
        let mount = fs_mount(&fs).map_err(|e| format!("{e}: {}", said(&fs)))?;
        Ok(Detached {
            mount,
            loop_name,
            image: image.canonicalize().unwrap(),
        })
    }

    /// `program`, run with the mount's root as `/proc/self/fd/N`, N the
    /// number [`Detached::root`] names.
    pub fn command(&self, program: &str) -> Command {
        let fd = self.mount.as_raw_fd();
        let mut c = Command::new(program);
        // SAFETY: fcntl is async-signal-safe; it changes the child's
        // descriptor table alone.
        unsafe {
            c.pre_exec(move || check(libc::fcntl(fd, libc::F_SETFD, 0)));
        }
        c
    }

    /// The mount's root, for a program [`Detached::command`] runs.
    pub fn root(&self) -> String {
        format!("/proc/self/fd/{}", self.mount.as_raw_fd())
    }

    /// Unmounts: the descriptor closed, then a wait (a minute at most) until
    /// the loop device has let go of the image, so the filesystem is shut
    /// down (a child of another thread, forked but not yet exec'd, may hold
    /// the descriptor a moment longer).
    pub fn unmount(self) {
        let Detached {
            mount,
            loop_name,
            image,
        } = self;
        drop(mount);
        let backing = format!("/sys/block/{loop_name}/loop/backing_file");
        crate::common::util::wait_for(
            &format!("{loop_name} to let go of {}", image.display()),
            Duration::from_secs(60),
            || std::fs::read_to_string(&backing).map_or(true, |b| Path::new(b.trim()) != image),
        );
    }
}

/// Attaches `file` to a free loop device, cleared when its last user closes
/// it: the device, open, and its name.
fn attach(file: &File) -> std::io::Result<(File, String)> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")?;
    loop {
        // SAFETY: an ioctl without arguments on our descriptor.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        check(n)?;
        let name = format!("loop{n}");
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/dev/{name}"))?;
        // SAFETY: all zeros is a valid loop_config.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = file.as_raw_fd() as u32;
        config.info.flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: our descriptor and a loop_config that outlives the call.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &config) };
        match check(rc) {
            Ok(()) => return Ok((dev, name)),
            // Taken by another process since it was free: the next.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn fs_open(fstype: &str) -> std::io::Result<OwnedFd> {
    let name = std::ffi::CString::new(fstype)?;
    // SAFETY: a NUL-terminated string and integer flags.
    owned(unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) } as i32)
}

/// The string option `key` set to `value`, or the flag `key`.
fn fs_set(fs: &OwnedFd, key: &str, value: Option<&str>) -> std::io::Result<()> {
    let key = std::ffi::CString::new(key)?;
    let value = value.map(std::ffi::CString::new).transpose()?;
    let (cmd, ptr) = match &value {
        Some(v) => (FSCONFIG_SET_STRING, v.as_ptr()),
        None => (FSCONFIG_SET_FLAG, std::ptr::null()),
    };
    // SAFETY: NUL-terminated strings (or null for a flag) that outlive it.
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
    check(rc as i32)
}

/// The superblock made (the filesystem read from the device), then the
/// detached mount of it.
fn fs_mount(fs: &OwnedFd) -> std::io::Result<OwnedFd> {
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: integer arguments and null pointers, as the command takes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            none,
            none,
            0,
        )
    };
    check(rc as i32)?;
    // SAFETY: integer arguments.
    owned(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) } as i32)
}

/// What the filesystem said while it was being made (its error first),
/// read from the filesystem context, on one line.
fn said(fs: &OwnedFd) -> String {
    let mut lines = Vec::new();
    let mut buf = [0u8; 1024];
    while lines.len() < 8 {
        // SAFETY: a buffer of ours, its length.
        let n = unsafe { libc::read(fs.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        lines.push(String::from_utf8_lossy(&buf[..n as usize]).into_owned());
    }
    lines.join(" | ")
}

fn owned(fd: i32) -> std::io::Result<OwnedFd> {
    check(fd)?;
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn check(rc: i32) -> std::io::Result<()> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
