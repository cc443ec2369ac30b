//! `probe-walls DIR`, a control command that debug builds alone have (the
//! tests'; release builds and the Debian package do not): the process that
//! serves the control socket, a mount's walled worker, tries what its walls
//! ([`crate::privsep`]) must refuse, and answers one line of JSON saying of each
//! try `refused: ERROR` or `ALLOWED`. The checks from outside (/proc status)
//! show the walls are set; only a try from inside shows the kernel refuses.
//!
//! Each try does no harm if it succeeds: the file is only opened, the program
//! is /bin/true, the tmpfs mounted on the client's empty directory `DIR` is
//! unmounted at once, setuid(0) changes nothing for root (and is asked for on
//! one thread), the new namespace is a thread's that ends right away, and the
//! process forked exits at once.
//!
//! `probe-scope PID NAME` tries what Landlock's scopes refuse: signal 0 (which
//! only asks whether the process may be signalled) to the process PID, and a
//! connection to the abstract unix socket NAME, both the client's, outside the
//! walls.
//!
//! `probe-root REQUEST` sends the request (one line of the channel's JSON) to
//! the root part through the worker's own channel and answers the root part's
//! answer: the tests play a compromised worker with it where taking the
//! channel from outside would race the worker's own requests.

use std::ffi::CString;
use std::io;

use crate::mount::rootpart::{Request, RootClient};

/// The command's word; its argument is the directory to try a mount on.
pub(super) const CMD: &str = "probe-walls";
/// The scopes' command's word; its arguments a process and a socket's name.
pub(super) const SCOPE_CMD: &str = "probe-scope";
/// The word of the command that sends a request of the client's choosing to
/// the root part, as a compromised worker could: its argument the request's
/// JSON line.
pub(super) const ROOT_CMD: &str = "probe-root ";

/// The answer line to `probe-walls DIR`.
pub(super) fn answer(dir: &str) -> String {
    if dir.is_empty() {
        return format!("error {CMD} takes an empty directory to try a mount on");
    }
    let tries = [
        (
            "open /etc/shadow",
            said(std::fs::File::open("/etc/shadow").map(drop)),
        ),
        // Inherited standard streams: opening /dev/null is refused too, and
        // would hide whether the exec is.
        (
            "exec /bin/true",
            said(std::process::Command::new("/bin/true").status().map(drop)),
        ),
        ("mount tmpfs", mount_tmpfs(dir)),
        ("setuid 0", said(setuid_root())),
        ("unshare a UTS namespace", unshare_uts()),
        ("fork", said(fork_and_reap())),
    ];
    let tries: serde_json::Map<_, _> = tries
        .into_iter()
        .map(|(what, said)| (what.to_string(), said.into()))
        .collect();
    serde_json::Value::Object(tries).to_string()
}

/// The answer line to `probe-scope PID NAME`.
pub(super) fn answer_scope(args: &str) -> String {
    let mut words = args.split_whitespace();
    let (Some(pid), Some(name), None) = (
        words.next().and_then(|p| p.parse::<libc::pid_t>().ok()),
        words.next(),
        words.next(),
    ) else {
        return format!("error {SCOPE_CMD} takes a process id and an abstract socket's name");
    };
    // SAFETY: signal 0 sends nothing; it only checks.
    let signal = os_result(unsafe { libc::kill(pid, 0) });
    let connect = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|addr| std::os::unix::net::UnixStream::connect_addr(&addr))
            .map(drop)
    };
    serde_json::json!({
        "signal": said(signal),
        "connect abstract": said(connect),
    })
    .to_string()
}

/// The answer line to `probe-root REQUEST`: the root part's answer, as JSON.
pub(super) fn answer_root(root: &RootClient, json: &str) -> String {
    let req: Request = match serde_json::from_str(json) {
        Ok(r) => r,
        Err(e) => return format!("error not a request: {e}"),
    };
    match root.call(&req) {
        Ok(answer) => serde_json::to_string(&answer).unwrap_or_default(),
        Err(e) => format!("error {e}"),
    }
}

fn said(r: io::Result<()>) -> String {
    match r {
        Ok(()) => "ALLOWED".to_string(),
        Err(e) => format!("refused: {e}"),
    }
}

fn os_result(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// setuid(2) to root on this thread alone (the C library's setuid has every
/// thread of the process make the call).
fn setuid_root() -> io::Result<()> {
    // SAFETY: a system call with an integer argument.
    let rc = unsafe { libc::syscall(libc::SYS_setuid, 0) };
    os_result(rc as libc::c_int)
}

/// A small tmpfs on `dir`, unmounted at once if it was mounted.
fn mount_tmpfs(dir: &str) -> String {
    let Ok(target) = CString::new(dir) else {
        return "refused: the directory has a NUL byte".to_string();
    };
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: valid C strings; the options are a C string too.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            flags,
            c"size=4k".as_ptr().cast(),
        )
    };
    if let Err(e) = os_result(rc) {
        return format!("refused: {e}");
    }
    // SAFETY: a valid C string.
    match os_result(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }) {
        Ok(()) => "ALLOWED (unmounted again)".to_string(),
        Err(e) => format!("ALLOWED (and left mounted on {dir}: {e})"),
    }
}

/// fork(2) of a child that exits at once, reaped.
fn fork_and_reap() -> io::Result<()> {
    // SAFETY: the child only exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(())
}

/// unshare(2) on a thread of its own, which ends with its namespace.
fn unshare_uts() -> String {
    // SAFETY: unshare with a flag; it affects only the calling thread.
    std::thread::spawn(|| said(os_result(unsafe { libc::unshare(libc::CLONE_NEWUTS) })))
        .join()
        .unwrap_or_else(|_| "the thread that tried panicked".to_string())
}

/// In this test process (root, no walls) everything is allowed: the probe can
/// tell an open wall from a closed one, and leaves nothing mounted.
#[cfg(test)]
#[test]
fn for_root_without_walls_every_try_is_allowed_and_nothing_stays_mounted() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(&answer(path)).unwrap();
    let tries = v.as_object().unwrap();
    assert_eq!(tries.len(), 6, "{v}");
    for (what, said) in tries {
        assert!(said.as_str().unwrap().starts_with("ALLOWED"), "{what}: {v}");
    }
    assert_eq!(v["mount tmpfs"], "ALLOWED (unmounted again)");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(path), "left mounted: {mounts}");
    assert!(answer("").starts_with("error "));
}

/// Without walls, signalling a process of this test's and connecting to an
/// abstract socket it listens on are allowed: the probe tells an open scope
/// from a closed one.
#[cfg(test)]
#[test]
fn for_a_process_without_walls_signal_and_abstract_socket_are_allowed() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("blobdrive-probe-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&answer_scope(&format!("{} {name}", std::process::id()))).unwrap();
    assert_eq!(v["signal"], "ALLOWED", "{v}");
    assert_eq!(v["connect abstract"], "ALLOWED", "{v}");
    assert!(answer_scope("x").starts_with("error "));
}
