//! The filesystem tools run on a drive's device (blkid, e2fsck, resize2fs,
//! mkfs) parse bytes the worker serves: whoever controls the worker, or writes
//! the blob, chooses them. So none runs as root. Each starts in a child that,
//! before the tool's program replaces it:
//!
//! - enters new mount, network and IPC namespaces: no network at all, and a
//!   root of its own, a small tmpfs holding read-only binds of the system's
//!   directories (`/usr`, `/lib*`, `/bin`, `/sbin`, `/etc`, `/proc`, `/sys`)
//!   and the tool's own, and a `/dev` with only the drive's loop device, owned
//!   by the tool's uid, and `null`, `zero` and `urandom`. The machine's other
//!   mounts are let go of before the tool starts: a copy of another mount
//!   held by a tool would keep that filesystem, and its loop device, busy
//!   after it was unmounted;
//! - marks every descriptor but its standard streams close-on-exec;
//! - puts up the walls of [`crate::privsep`] for a tool: the uid and gid
//!   [`TOOL_USER`] (no account of the system, and not the worker's), no
//!   capability, `no_new_privs`, Landlock (read and run beneath the system's
//!   directories above and the tool's own; read and write its `/dev`; no TCP
//!   port; no signal or abstract socket outside), and seccomp (the worker's
//!   list but `execve`, and no socket at all; the two block device ioctls the
//!   kernel allows root alone, which mkfs.xfs needs, are answered with
//!   success and done by the root part instead: the block size set before the
//!   run, the buffers flushed after).
//!
//! Only its output comes back, read as the tool's answer (a type name, an exit
//! status, an error line to show escaped).

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

use super::loopdev::flush_buffers;
use super::{tool_command, LoopDevice, Pinned, STANDARD_PATH};
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
/// as the module says; its output whatever its exit status. The device is
/// pinned (held open since it was checked to serve the drive) while the tool
/// runs, so the node the tool is given, made from the device's number, is
/// that device still.
pub(super) fn output_on(dev: &Pinned, tool: &str, args: &[&str]) -> Result<Output, MountError> {
    let program = find_program(tool)?;
    let cannot = |why: String| MountError::system(format!("cannot run {tool} confined: {why}"));
    let walls = Walls::prepare_for(Purpose::Tool, TOOL_USER, &allowed_for(&program))
        .map_err(|e| cannot(e.to_string()))?;
    let root = NewRoot::for_tool(dev, &program).map_err(|e| cannot(e.to_string()))?;
    let setup = Setup {
        root,
        walls: Mutex::new(Some(walls)),
    };
    let mut cmd = tool_command(&program.to_string_lossy());
    cmd.args(args);
    // SAFETY: the hook makes system calls only (the walls were built above;
    // `apply` does not allocate), in the child before it runs the tool.
    unsafe { cmd.pre_exec(move || setup.enter()) };
    let out = cmd.output().map_err(|e| cannot(e.to_string()))?;
    // What the tool's BLKFLSBUF asked for, which its walls answered without
    // doing (see privsep's `root_only_block_ioctls`).
    if let Err(e) = flush_buffers(&dev.file) {
        tracing::warn!("cannot flush the buffers of {}: {e}", dev);
    }
    Ok(out)
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

/// The machine's directories a tool sees (those that exist), read-only.
const SYSTEM_DIRS: [&str; 9] = [
    "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys",
];

/// What a tool may open: the system's directories and its own directory
/// (read). (Its `/dev` is allowed in the child, once it is made.)
fn allowed_for(program: &Path) -> Allowed {
    let mut read_only: Vec<PathBuf> = SYSTEM_DIRS.iter().map(PathBuf::from).collect();
    read_only.extend(program.parent().map(Path::to_path_buf));
    Allowed {
        read_only,
        ..Allowed::default()
    }
}

/// Where the tool's root is made, in its mount namespace, before it becomes
/// the root: over the machine's `/dev`, which the tool does not see.
const STAGE: &str = "/dev";

/// The tool's whole view of the files, made in its child (see the module's
/// doc): every path here is where it is before the pivot, under [`STAGE`].
struct NewRoot {
    /// Directories to make, parents first.
    dirs: Vec<CString>,
    /// Read-only binds: the machine's directory, and where it goes.
    binds: Vec<(CString, CString)>,
    /// Symlinks as the machine has them (`/bin` -> `usr/bin`): what each
    /// says, and where it goes.
    links: Vec<(CString, CString)>,
    /// The loop device's node (`STAGE/dev/loopN`), and its device number.
    node: CString,
    rdev: libc::dev_t,
}

impl NewRoot {
    /// The root for a tool run on `dev`, whose node is made from the number
    /// read when root attached it (never from a path looked up now).
    fn for_tool(dev: &LoopDevice, program: &Path) -> std::io::Result<NewRoot> {
        let name = dev.path().strip_prefix("/dev/").unwrap_or_default();
        let rdev = dev.rdev();
        if name.is_empty() || name.contains('/') || rdev.is_none() {
            return Err(std::io::Error::other(format!(
                "{dev} is not a device of /dev whose number was read when it was attached"
            )));
        }
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)
        };
        let staged = |p: &Path| Path::new(STAGE).join(p.strip_prefix("/").unwrap_or(p));
        let mut root = NewRoot {
            dirs: vec![c(&staged(Path::new("/dev")))?],
            binds: Vec::new(),
            links: Vec::new(),
            node: c(&staged(Path::new(dev.path())))?,
            rdev: rdev.unwrap_or_default(),
        };
        let mut seen: Vec<PathBuf> = Vec::new();
        let tool_dir = program.parent().map(Path::to_path_buf);
        for dir in SYSTEM_DIRS.iter().map(PathBuf::from).chain(tool_dir) {
            let Ok(real) = dir.canonicalize() else {
                continue;
            };
            if let Ok(said) = std::fs::read_link(&dir) {
                root.links.push((c(&said)?, c(&staged(&dir))?));
                continue;
            }
            if seen.iter().any(|s| real.starts_with(s)) {
                continue;
            }
            // Each directory on the way, then the bind onto the last.
            for part in dir
                .ancestors()
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .skip(1)
            {
                let target = c(&staged(part))?;
                if !root.dirs.contains(&target) {
                    root.dirs.push(target);
                }
            }
            root.binds.push((c(&real)?, c(&staged(&dir))?));
            seen.push(real);
        }
        Ok(root)
    }
}

/// What the child does before the tool runs (see the module's doc).
struct Setup {
    root: NewRoot,
    /// Taken in the child, which applies them once.
    walls: Mutex<Option<Walls>>,
}

/// The character devices of the tool's `/dev`: path, major, minor.
const CHAR_DEVICES: [(&std::ffi::CStr, u32, u32); 3] = [
    (c"/dev/dev/null", 1, 3),
    (c"/dev/dev/zero", 1, 5),
    (c"/dev/dev/urandom", 1, 9),
];

impl Setup {
    /// In the child, after fork: system calls only, on what was built before.
    fn enter(&self) -> std::io::Result<()> {
        self.make_root()?;
        // SAFETY: close_range with integer arguments: only the standard
        // streams reach the tool.
        check(unsafe {
            libc::syscall(
                libc::SYS_close_range,
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) as libc::c_int
        })?;
        let walls = self
            .walls
            .lock()
            .ok()
            .and_then(|mut w| w.take())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // Its /dev, new: Landlock knows a directory by its inode, and no
        // path allowed before reaches it.
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

    /// The namespaces, then the tool's root made and pivoted to, the machine's
    /// mounts let go of.
    fn make_root(&self) -> std::io::Result<()> {
        let none = std::ptr::null::<libc::c_char>();
        let r = &self.root;
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
                libc::MS_NOSUID,
                c"mode=0755,size=64k".as_ptr().cast(),
            ))?;
            for dir in &r.dirs {
                check(libc::mkdir(dir.as_ptr(), 0o755))?;
            }
            let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID;
            for (from, to) in &r.binds {
                check(libc::mount(
                    from.as_ptr(),
                    to.as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
                check(libc::mount(none, to.as_ptr(), none, ro, std::ptr::null()))?;
            }
            for (said, at) in &r.links {
                check(libc::symlink(said.as_ptr(), at.as_ptr()))?;
            }
            check(libc::mknod(r.node.as_ptr(), libc::S_IFBLK | 0o600, r.rdev))?;
            check(libc::chown(r.node.as_ptr(), TOOL_USER.uid, TOOL_USER.gid))?;
            for (path, major, minor) in CHAR_DEVICES {
                let rdev = libc::makedev(major, minor);
                check(libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, rdev))?;
                // (mknod took the umask off.)
                check(libc::chmod(path.as_ptr(), 0o666))?;
            }
            check(libc::mkdir(c"/dev/.old".as_ptr(), 0o700))?;
            check(libc::syscall(
                libc::SYS_pivot_root,
                c"/dev".as_ptr(),
                c"/dev/.old".as_ptr(),
            ) as libc::c_int)?;
            check(libc::chdir(c"/".as_ptr()))?;
            // Every mount of the machine's, copied into this namespace, goes.
            check(libc::umount2(c"/.old".as_ptr(), libc::MNT_DETACH))?;
            check(libc::rmdir(c"/.old".as_ptr()))?;
        }
        Ok(())
    }
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
