//! A filesystem image mounted where nothing else reaches it: attached to a
//! loop device of its own (by blobdrive's own attach, as a mount's root part
//! does) that clears itself once its last user lets go, and
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

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use blobdrive::mount::system::newmount::{fs_mount, fs_open, fs_set};
use blobdrive::mount::system::{set_autoclear, Binding, BlockSize, LoopDevice, Now};

/// A detached mount of an image's filesystem.
pub struct Detached {
    mount: OwnedFd,
    /// The loop device, and what it was attached to.
    dev: LoopDevice,
    binding: Binding,
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
        // 512-byte logical blocks: any filesystem's sector size is at least
        // that, so every state mounts whatever sector size it was made with.
        let attached = LoopDevice::attach_through(&file, false, BlockSize::B512)
            .map_err(|e| format!("no loop device: {e}"))?;
        // Held open until the filesystem has the device: it clears itself
        // once its last user lets go.
        let (pinned, binding) = (attached.pinned, attached.binding);
        if let Err(e) = set_autoclear(&pinned.file) {
            let _ = pinned.dev.detach(&binding);
            return Err(format!("{pinned}: autoclear: {e}"));
        }
        let name = std::ffi::CString::new(fstype).unwrap();
        let fs = fs_open(&name).map_err(|e| format!("fsopen {fstype}: {e}"))?;
        fs_set(&fs, "source", Some(pinned.path())).map_err(|e| format!("source: {e}"))?;
        for flag in flags {
            fs_set(&fs, flag, None).map_err(|e| format!("{flag}: {e}"))?;
        }
        let mount = fs_mount(&fs, 0).map_err(|e| format!("{e}: {}", said(&fs)))?;
        Ok(Detached {
            mount,
            dev: pinned.dev.clone(),
            binding,
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
    /// the descriptor a moment longer). Not waited for on a kernel without
    /// disk sequence numbers.
    pub fn unmount(self) {
        let Detached {
            mount,
            dev,
            binding,
        } = self;
        drop(mount);
        crate::common::util::wait_for(
            &format!("{dev} to let go of the state's image"),
            Duration::from_secs(60),
            || dev.serves_now(&binding) != Now::Serves,
        );
    }
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

fn check(rc: i32) -> std::io::Result<()> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
