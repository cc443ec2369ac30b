//! Walls for a process that parses network bytes: it gives up root and every
//! capability, and a kernel filter refuses what it would never need, so that a
//! bug in the code that reads what the storage service sends cannot be turned
//! into control of the host.
//!
//! The walls are built in two steps. [`Walls::prepare`] does everything that
//! allocates, opens files or can fail for ordinary reasons (the user looked up,
//! the seccomp program compiled, the Landlock ruleset made with the paths it
//! allows opened); [`Walls::apply`] then only makes system calls, so that it can
//! run in the child of a fork, before the process starts any thread.
//! Capabilities, `no_new_privs`, Landlock and seccomp are per thread: a thread
//! started before them would keep root's powers.
//!
//! What `apply` leaves, in order:
//! - no capability in any set: the bounding set dropped while it still may be
//!   (CAP_SETPCAP), ambient and inheritable cleared;
//! - no supplementary groups, and all four gids and uids the worker user's
//!   (the kernel clears the permitted and effective sets at that change);
//! - `PR_SET_NO_NEW_PRIVS` (nothing exec'd could gain privileges) and not
//!   dumpable (no core with the account key in it, no ptrace by the same user);
//! - Landlock, where the kernel has it: files only beneath the paths allowed
//!   (read-only ones, and read-write ones such as the disk cache), and (ABI 6)
//!   no signal to a process and no connection to an abstract unix socket
//!   outside the walls (mounts given one user with `--run-as` run their
//!   workers as the same uid; each other mount's has a uid of its own);
//! - seccomp: mount and the new mount API, umount, setns, unshare, new
//!   namespaces through clone, a new process (fork, vfork, a clone that is
//!   not a thread's), ptrace, bpf, perf events, the key syscalls,
//!   module loading, kexec, execve, chroot, pivot_root, swap and reboot answer
//!   EPERM; clone3 answers ENOSYS (its flags are behind a pointer a filter
//!   cannot read; the C library then creates threads with clone).
//!
//! The same walls, with a uid of their own and a seccomp filter that lets the
//! one program start but refuses sockets, confine the filesystem tools the root
//! part runs on a drive's device ([`Purpose::Tool`]).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use thiserror::Error;

/// The user a worker runs as unless told otherwise.
pub const DEFAULT_USER: &str = "blobdrive";

/// The longest user name taken (`useradd`'s limit on Linux).
pub const USER_NAME_MAX: usize = 32;

/// Checks that `name` is a plain user name: a lowercase letter or `_`, then
/// lowercase letters, digits, `_` and `-`, at most [`USER_NAME_MAX`]
/// characters. Nothing else (a uid, a path, `root:root`, shell characters)
/// names the user a worker runs as; the error says what does.
pub fn check_user_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok =
        chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if first_ok && rest_ok && name.len() <= USER_NAME_MAX {
        return Ok(());
    }
    Err(format!(
        "'{}' is not a user name: one starts with a lowercase letter or '_', goes on with lowercase letters, digits, '_' and '-', and has at most {USER_NAME_MAX} characters",
        name.escape_default()
    ))
}

/// Why the walls could not be built or put up.
#[derive(Debug, Error)]
pub enum WallError {
    #[error("no user {0} to run the network-facing part of the mount as; create it with `useradd --system --no-create-home --shell /usr/sbin/nologin {0}` (the Debian package and scripts/install.sh do), or name another with --run-as")]
    NoSuchUser(String),
    #[error("user {0} is root (uid 0); the network-facing part must run as an unprivileged user")]
    RootUser(String),
    #[error("cannot look up user {name}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the seccomp filter: {0}")]
    Seccomp(String),
    #[error("cannot build the Landlock ruleset: {0}")]
    Landlock(String),
    #[error("cannot {what}: {source}")]
    Apply {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// An unprivileged user: the uid and gid a worker takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerUser {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
}

impl WorkerUser {
    /// Looks `name` up in the user database (`getpwnam_r`); root is refused.
    pub fn lookup(name: &str) -> Result<WorkerUser, WallError> {
        let c_name = CString::new(name).map_err(|_| WallError::NoSuchUser(name.to_string()))?;
        let mut buf = vec![0u8; 16 * 1024];
        // SAFETY: passwd is plain old data, filled in by getpwnam_r.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call and buf's length is given.
        let rc = unsafe {
            libc::getpwnam_r(
                c_name.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        if rc != 0 {
            return Err(WallError::Lookup {
                name: name.to_string(),
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        if found.is_null() {
            return Err(WallError::NoSuchUser(name.to_string()));
        }
        if pwd.pw_uid == 0 {
            return Err(WallError::RootUser(name.to_string()));
        }
        Ok(WorkerUser {
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        })
    }
}

/// The files a walled process may still open: beneath each read-only path it
/// may read, beneath each read-write path (or directory opened already) read
/// and write. Paths that do not exist are left out.
#[derive(Debug, Default)]
pub struct Allowed {
    pub read_only: Vec<PathBuf>,
    pub read_write: Vec<PathBuf>,
    /// Directories opened by the root part (the disk cache's), allowed by
    /// their handle: no path is looked up again.
    pub read_write_dirs: Vec<std::fs::File>,
}

impl Allowed {
    /// What a process that speaks HTTPS needs to read: CA stores, and the
    /// resolver's and the C library's configuration.
    pub fn network_client() -> Allowed {
        let read_only = [
            "/etc/ssl",
            "/etc/pki",
            "/etc/ca-certificates",
            "/usr/share/ca-certificates",
            "/usr/local/share/ca-certificates",
            "/etc/resolv.conf",
            "/etc/hosts",
            "/etc/nsswitch.conf",
            "/etc/gai.conf",
            "/etc/host.conf",
            "/etc/localtime",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect();
        Allowed {
            read_only,
            ..Allowed::default()
        }
    }
}

/// Who the walls are for: they differ in what the seccomp filter and Landlock
/// let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A mount's worker: it talks to the storage service (sockets, TCP) and
    /// never runs a program.
    Worker,
    /// A filesystem tool the root part runs on a drive's device (blkid, e2fsck,
    /// mkfs): it must start its own program, and has no use for a socket or a
    /// TCP port.
    Tool,
}

/// The walls, built and ready to put up (see the module's doc).
pub struct Walls {
    user: WorkerUser,
    seccomp: Vec<BpfProgram>,
    landlock: RulesetCreated,
    last_cap: u64,
}

/// How Landlock fared: `Enforced` where the kernel has it (fully or in part).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockState {
    Enforced,
    NotInKernel,
}

impl Walls {
    /// Builds a worker's walls for `user`, allowing the files of `allowed`.
    pub fn prepare(user: WorkerUser, allowed: &Allowed) -> Result<Walls, WallError> {
        Walls::prepare_for(Purpose::Worker, user, allowed)
    }

    /// Builds the walls for `purpose`, run as `user`, allowing the files of
    /// `allowed`.
    pub fn prepare_for(
        purpose: Purpose,
        user: WorkerUser,
        allowed: &Allowed,
    ) -> Result<Walls, WallError> {
        Ok(Walls {
            user,
            seccomp: seccomp_programs(purpose)?,
            landlock: landlock_ruleset(purpose, allowed)?,
            last_cap: last_capability(),
        })
    }

    /// Allows reading and writing beneath the directory `dir` too: for a
    /// directory made after the walls were built (a tool's private `/dev`,
    /// mounted in its child), which no path of [`Allowed`] can name. Landlock
    /// rules hold for a directory itself, not for a mount on it.
    pub fn allow_read_write(mut self, dir: std::os::fd::BorrowedFd) -> Result<Walls, WallError> {
        let abi = ABI::V5;
        self.landlock = self
            .landlock
            .add_rule(PathBeneath::new(
                dir,
                AccessFs::from_all(abi) & !AccessFs::Execute,
            ))
            .map_err(|e| WallError::Landlock(e.to_string()))?;
        Ok(self)
    }

    /// Puts the walls up on the calling thread, which must be the process's
    /// only one. Makes system calls only (no allocation on success).
    pub fn apply(self) -> Result<LandlockState, WallError> {
        drop_capabilities_and_become(self.user, self.last_cap)?;
        prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "set no_new_privs")?;
        // After the uid change, which resets it.
        prctl(libc::PR_SET_DUMPABLE, 0, "make the process not dumpable")?;
        let landlock = match self.landlock.restrict_self() {
            Ok(status) if status.ruleset == RulesetStatus::NotEnforced => {
                LandlockState::NotInKernel
            }
            Ok(_) => LandlockState::Enforced,
            Err(_) => return Err(last_os("enforce the Landlock ruleset")),
        };
        for program in &self.seccomp {
            seccompiler::apply_filter(program).map_err(|_| last_os("load the seccomp filter"))?;
        }
        WALLED.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(landlock)
    }
}

/// Set once this process put its walls up.
static WALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is walled (a mount's worker): what would run a
/// program, which the walls refuse, can say so instead of trying.
pub fn walled() -> bool {
    WALLED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Drops the bounding set (while CAP_SETPCAP still allows it), ambient and
/// supplementary groups, then takes the user's gids and uids (which clears the
/// permitted and effective sets) and clears the inheritable set.
fn drop_capabilities_and_become(user: WorkerUser, last_cap: u64) -> Result<(), WallError> {
    for cap in 0..=last_cap {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            return Err(last_os("drop the capability bounding set"));
        }
    }
    // SAFETY: prctl with integer arguments.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(last_os("clear the ambient capabilities"));
    }
    // SAFETY: an empty list.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(last_os("drop the supplementary groups"));
    }
    // SAFETY: integer arguments.
    if unsafe { libc::setresgid(user.gid, user.gid, user.gid) } != 0 {
        return Err(last_os("change group"));
    }
    // SAFETY: integer arguments.
    if unsafe { libc::setresuid(user.uid, user.uid, user.uid) } != 0 {
        return Err(last_os("change user"));
    }
    clear_capability_sets()
}

/// capset(2) with every set empty: the inheritable set survives a uid change.
fn clear_capability_sets() -> Result<(), WallError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a version-3 header and two data words, as capset(2) takes.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(last_os("clear the capability sets"));
    }
    Ok(())
}

fn prctl(option: libc::c_int, value: libc::c_ulong, what: &'static str) -> Result<(), WallError> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(option, value, 0, 0, 0) } != 0 {
        return Err(last_os(what));
    }
    Ok(())
}

fn last_os(what: &'static str) -> WallError {
    WallError::Apply {
        what,
        source: std::io::Error::last_os_error(),
    }
}

/// The highest capability this kernel knows (`/proc/sys/kernel/cap_last_cap`),
/// so that the bounding set is emptied whole, not only as far as libc knows.
fn last_capability() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// System calls a worker never makes, refused with EPERM.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_userfaultfd,
];

/// The namespace flags of clone(2): a clone that asks for any is refused.
const NEW_NAMESPACES: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// Calls a tool makes that a worker does not: starting its own program.
const TOOL_MAY: &[libc::c_long] = &[libc::SYS_execve, libc::SYS_execveat];

/// The refused calls and namespace clones (EPERM); clone3 (ENOSYS, so that
/// the C library falls back to clone, which is filtered); and for a tool,
/// socket(2) (EACCES: it reads and writes a device, nothing else) and two
/// ioctls of root's (see [`root_only_block_ioctls`]).
fn seccomp_programs(purpose: Purpose) -> Result<Vec<BpfProgram>, WallError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| WallError::Seccomp(format!("{e}")))?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = REFUSED
        .iter()
        .filter(|nr| purpose == Purpose::Worker || !TOOL_MAY.contains(nr))
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let clone_rules = NEW_NAMESPACES
        .iter()
        .map(|&flag| {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| WallError::Seccomp(e.to_string()))?;
    // A new process, not a thread: the walled process stays one, so that its
    // end (its FUSE connection's with it) is the end of all it does.
    let no_thread = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        0,
    )
    .and_then(|c| SeccompRule::new(vec![c]))
    .map_err(|e| WallError::Seccomp(e.to_string()))?;
    let mut clone_rules = clone_rules;
    clone_rules.push(no_thread);
    refused.insert(libc::SYS_clone, clone_rules);
    refused.insert(libc::SYS_fork, Vec::new());
    refused.insert(libc::SYS_vfork, Vec::new());
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
    let eacces = SeccompAction::Errno(libc::EACCES as u32);
    let only = |nr: libc::c_long| [(nr, Vec::new())].into_iter().collect();
    let mut filters = vec![
        SeccompFilter::new(refused, SeccompAction::Allow, eperm, arch),
        SeccompFilter::new(only(libc::SYS_clone3), SeccompAction::Allow, enosys, arch),
    ];
    if purpose == Purpose::Tool {
        filters.push(SeccompFilter::new(
            only(libc::SYS_socket),
            SeccompAction::Allow,
            eacces,
            arch,
        ));
        filters.push(SeccompFilter::new(
            [(libc::SYS_ioctl, root_only_block_ioctls()?)]
                .into_iter()
                .collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(0),
            arch,
        ));
    }
    filters
        .into_iter()
        .map(|f| {
            f.and_then(BpfProgram::try_from)
                .map_err(|e| WallError::Seccomp(e.to_string()))
        })
        .collect()
}

/// The block device ioctls the kernel allows CAP_SYS_ADMIN alone, and
/// mkfs.xfs gives up without: a tool's filter answers them with success and
/// does not carry them out; the root part does instead, as root, around the
/// tool's run (`system::confined`). `BLKBSZSET`: it sets the device's block
/// size to its sector size first, which is what mkfs.xfs asks for, and holds
/// it open meanwhile. `BLKFLSBUF`: it writes and drops the device's buffers
/// once the tool is done.
fn root_only_block_ioctls() -> Result<Vec<SeccompRule>, WallError> {
    /// `_IOW(0x12, 113, size_t)` and `_IO(0x12, 97)` of linux/fs.h.
    const BLKBSZSET: u64 = 0x4008_1271;
    const BLKFLSBUF: u64 = 0x1261;
    [BLKBSZSET, BLKFLSBUF]
        .into_iter()
        .map(|request| {
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                .and_then(|c| SeccompRule::new(vec![c]))
                .map_err(|e| WallError::Seccomp(e.to_string()))
        })
        .collect()
}

/// The Landlock ruleset for `allowed`: best effort, as the kernel has Landlock
/// or not (the other walls hold without it; [`Walls::apply`] says which).
/// Signals and abstract unix sockets are scoped (ABI 6) for every purpose: a
/// walled process reaches no process outside its walls that way, another
/// mount's worker of the same user (`--run-as`) included. A tool handles TCP too (ABI 4),
/// with no port allowed.
fn landlock_ruleset(purpose: Purpose, allowed: &Allowed) -> Result<RulesetCreated, WallError> {
    let abi = ABI::V5;
    let err = |e: &dyn std::fmt::Display| WallError::Landlock(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| err(&e))?
        .scope(Scope::from_all(ABI::V6))
        .map_err(|e| err(&e))?;
    if purpose == Purpose::Tool {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(ABI::V4))
            .map_err(|e| err(&e))?;
    }
    let mut ruleset = ruleset.create().map_err(|e| err(&e))?;
    let rules = [
        (&allowed.read_only, AccessFs::from_read(abi)),
        (
            &allowed.read_write,
            AccessFs::from_all(abi) & !AccessFs::Execute,
        ),
    ];
    for (paths, access) in rules {
        for path in paths.iter().filter(|p| Path::exists(p)) {
            let fd = PathFd::new(path).map_err(|e| err(&e))?;
            // A file (not a directory) takes only the rights a file has.
            let access = if path.is_dir() {
                access
            } else {
                access & AccessFs::from_file(abi)
            };
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| err(&e))?;
        }
    }
    for dir in &allowed.read_write_dirs {
        ruleset = ruleset
            .add_rule(PathBeneath::new(
                dir,
                AccessFs::from_all(abi) & !AccessFs::Execute,
            ))
            .map_err(|e| err(&e))?;
    }
    Ok(ruleset)
}

/// Closes every descriptor above standard error: what the process that
/// started this one left open (a shell's redirection, a service manager's or a
/// node plugin's sockets) must not reach a mount's daemon, whose worker would
/// hold it behind its walls. Called first thing, before anything is opened.
pub fn close_inherited_descriptors() -> std::io::Result<()> {
    close_range(3, libc::c_uint::MAX)
}

/// Closes every descriptor above standard error but `keep`: what a walled
/// process was handed, and nothing its parent held besides.
pub fn close_descriptors_but(keep: &[std::os::fd::RawFd]) -> std::io::Result<()> {
    let mut keep: Vec<libc::c_uint> = keep
        .iter()
        .filter(|&&fd| fd > 2)
        .map(|&fd| fd as libc::c_uint)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from: libc::c_uint = 3;
    for fd in keep {
        if fd > from {
            close_range(from, fd - 1)?;
        }
        from = fd + 1;
    }
    close_range(from, libc::c_uint::MAX)
}

/// close_range(2) of `first..=last`; on a kernel without it (before 5.9),
/// close(2) of each up to the descriptor limit.
fn close_range(first: libc::c_uint, last: libc::c_uint) -> std::io::Result<()> {
    // SAFETY: close_range with integer arguments; the descriptors it closes
    // are owned by nothing that uses them after this (see the callers).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(e);
    }
    // SAFETY: a zeroed rlimit is a valid out-parameter.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes only `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let end = u64::from(last).min(lim.rlim_cur.min(1 << 20));
    for fd in u64::from(first)..=end {
        // SAFETY: as above; a descriptor not open is EBADF, which is fine.
        unsafe { libc::close(fd as libc::c_int) };
    }
    Ok(())
}

#[cfg(test)]
mod tests;
