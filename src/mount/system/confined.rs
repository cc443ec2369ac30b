//! The filesystem tools run on a drive's device (blkid, e2fsck, resize2fs,
//! mkfs) parse bytes the worker serves: whoever controls the worker, or writes
//! the blob, chooses them. So none runs as root. Each starts in a child that,
//! before the tool's program replaces it:
//!
//! - enters new mount, network and IPC namespaces: no network at all, and a
//!   `/dev` of its own (a small tmpfs) holding only the drive's loop device,
//!   owned by the tool's uid, and `null`, `zero` and `urandom`;
//! - marks every descriptor but its standard streams close-on-exec;
//! - puts up the walls of [`crate::privsep`] for a tool: the uid and gid
//!   [`TOOL_USER`] (no account of the system, and not the worker's), no
//!   capability, `no_new_privs`, Landlock (read and run beneath `/usr`, `/lib*`,
//!   `/bin`, `/sbin` and the tool's own directory; read `/etc`, `/proc`, `/sys`;
//!   read and write the private `/dev`; no TCP port; no signal or abstract
//!   socket outside), and seccomp (the worker's list but `execve`, and no
//!   socket at all).
//!
//! Only its output comes back, read as the tool's answer (a type name, an exit
//! status, an error line to show escaped).

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

use super::{tool_command, LoopDevice, STANDARD_PATH};
use crate::mount::MountError;
use crate::privsep::{Allowed, Purpose, WallError, Walls, WorkerUser};

/// The uid and gid the tools run as: no account of the system has them
/// (`systemd` leaves 65520 to 65533 unused), the worker's user is another, and
/// the tool reaches nothing of either beyond its own private `/dev`.
pub const TOOL_USER: WorkerUser = WorkerUser {
    uid: 65533,
    gid: 65533,
};

/// Runs `tool` with `args` on `dev` (named in `args` by its path), confined
/// as the module says; its output whatever its exit status.
pub(super) fn output_on(dev: &LoopDevice, tool: &str, args: &[&str]) -> Result<Output, MountError> {
    let program = find_program(tool)?;
    let cannot = |why: String| MountError::system(format!("cannot run {tool} confined: {why}"));
    let walls = Walls::prepare_for(Purpose::Tool, TOOL_USER, &allowed_for(&program))
        .map_err(|e| cannot(e.to_string()))?;
    let node = DeviceNode::of(dev).map_err(|e| cannot(e.to_string()))?;
    let setup = Setup {
        node,
        walls: Mutex::new(Some(walls)),
    };
    let mut cmd = tool_command(&program.to_string_lossy());
    cmd.args(args);
    // SAFETY: the hook makes system calls only (the walls were built above;
    // `apply` does not allocate), in the child before it runs the tool.
    unsafe { cmd.pre_exec(move || setup.enter()) };
    cmd.output().map_err(|e| cannot(e.to_string()))
}

/// The tool's program, looked up in `PATH` (the standard places when unset):
/// its own directory is the one outside the system's a tool may run from.
fn find_program(tool: &str) -> Result<PathBuf, MountError> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| STANDARD_PATH.into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| MountError::system(format!("cannot run {tool}: it is not installed")))
}

/// What a tool may open: the system's programs and libraries, its own
/// directory, configuration and the kernel's views (read).
fn allowed_for(program: &Path) -> Allowed {
    let mut read_only: Vec<PathBuf> = [
        "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys",
    ]
    .into_iter()
    .map(PathBuf::from)
    .collect();
    read_only.extend(program.parent().map(Path::to_path_buf));
    // (Its private /dev is allowed in the child, once it is mounted.)
    Allowed {
        read_only,
        ..Allowed::default()
    }
}

/// The loop device as the tool's `/dev` holds it: its path there (the same as
/// in the real `/dev`, so the tool's messages name it) and its device number.
struct DeviceNode {
    path: CString,
    rdev: libc::dev_t,
}

impl DeviceNode {
    fn of(dev: &LoopDevice) -> std::io::Result<DeviceNode> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let name = dev.path().strip_prefix("/dev/").unwrap_or_default();
        let meta = std::fs::metadata(dev.path())?;
        if name.is_empty() || name.contains('/') || !meta.file_type().is_block_device() {
            return Err(std::io::Error::other(format!(
                "{dev} is not a block device of /dev"
            )));
        }
        Ok(DeviceNode {
            path: CString::new(dev.path()).map_err(std::io::Error::other)?,
            rdev: meta.rdev(),
        })
    }
}

/// What the child does before the tool runs (see the module's doc).
struct Setup {
    node: DeviceNode,
    /// Taken in the child, which applies them once.
    walls: Mutex<Option<Walls>>,
}

/// The character devices of the private `/dev`: path, major, minor.
const CHAR_DEVICES: [(&std::ffi::CStr, u32, u32); 3] = [
    (c"/dev/null", 1, 3),
    (c"/dev/zero", 1, 5),
    (c"/dev/urandom", 1, 9),
];

impl Setup {
    /// In the child, after fork: system calls only, on what was built before.
    fn enter(&self) -> std::io::Result<()> {
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: each call below takes integers and NUL-terminated strings
        // that outlive it; they change only this child, which then execs.
        unsafe {
            check(libc::unshare(
                libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC,
            ))?;
            // Nothing mounted here is seen outside.
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                c"/dev".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"mode=0755,size=64k".as_ptr().cast(),
            ))?;
            let node = self.node.path.as_ptr();
            check(libc::mknod(node, libc::S_IFBLK | 0o600, self.node.rdev))?;
            check(libc::chown(node, TOOL_USER.uid, TOOL_USER.gid))?;
            for (path, major, minor) in CHAR_DEVICES {
                check(libc::mknod(
                    path.as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(major, minor),
                ))?;
                // (mknod took the umask off.)
                check(libc::chmod(path.as_ptr(), 0o666))?;
            }
            // Only the standard streams reach the tool.
            check(libc::syscall(
                libc::SYS_close_range,
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) as libc::c_int)?;
        }
        let walls = self
            .walls
            .lock()
            .ok()
            .and_then(|mut w| w.take())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // The private /dev, which Landlock knows by its own inode: a rule on
        // the /dev it covers does not reach into it.
        // SAFETY: a valid C string; the descriptor is ours until the exec.
        let dev = unsafe {
            libc::open(
                c"/dev".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        check(dev)?;
        // SAFETY: `dev` is open (checked above) and outlives the borrow.
        let dev = unsafe { std::os::fd::BorrowedFd::borrow_raw(dev) };
        let os_error = |e: WallError| match e {
            WallError::Apply { source, .. } => source,
            _ => std::io::Error::from_raw_os_error(libc::EPERM),
        };
        walls
            .allow_read_write(dev)
            .map_err(os_error)?
            .apply()
            .map(drop)
            .map_err(os_error)
    }
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
