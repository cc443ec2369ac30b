//! A mount's two processes seen from outside, and its worker played as a
//! compromised one would be: stopped, its descriptors taken with
//! `pidfd_getfd` (its channel to the root part, its stderr), and requests of
//! its choosing sent on that channel. As root: the worker is not dumpable, and
//! only a process with CAP_SYS_PTRACE may take its descriptors.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The processes of a mount: its daemon (the record's pid, the root part)
/// and its children (the worker).
pub fn mount_processes(daemon: u64) -> Vec<u64> {
    let mut out = vec![daemon];
    out.extend(children(daemon));
    out
}

/// The processes whose parent is `pid`.
pub fn children(pid: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid, ...
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        if after.split(' ').nth(1).and_then(|p| p.parse().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// The worker of the mount whose root part is `daemon`.
pub fn worker_of(daemon: u64) -> u64 {
    let kids = children(daemon);
    assert_eq!(kids.len(), 1, "one worker under the root part {daemon}");
    kids[0]
}

/// What `pid`'s descriptors lead to, by number.
pub fn fd_links(pid: u64) -> Vec<(u32, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.parse().ok()?;
                    let link = std::fs::read_link(e.path()).ok()?;
                    Some((n, link.to_string_lossy().into_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A line of /proc/PID/status (`SigPnd`, `ShdPnd`, `State`), as written.
pub fn status_field(pid: u64, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Whether signal `sig` is pending for process `pid` (shared or its own).
pub fn signal_pending(pid: u64, sig: i32) -> bool {
    ["ShdPnd", "SigPnd"].iter().any(|f| {
        u64::from_str_radix(&status_field(pid, f), 16).is_ok_and(|m| m >> (sig - 1) & 1 == 1)
    })
}

/// A process stopped (SIGSTOP) until this is dropped (SIGCONT).
pub struct Stopped(pub u64);

impl Stopped {
    pub fn new(pid: u64) -> Stopped {
        // SAFETY: kill with integer arguments, to a process of the test's mount.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        super::util::wait_for("the process to stop", Duration::from_secs(10), || {
            status_field(pid, "State").starts_with('T')
        });
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

/// A copy of descriptor `fd` of process `pid` (pidfd_getfd).
pub fn take_fd(pid: u64, fd: u32) -> OwnedFd {
    // SAFETY: pidfd_open with integer arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open {pid}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor of ours.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd with a pidfd of ours and integer arguments.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    assert!(
        got >= 0,
        "pidfd_getfd {pid} {fd}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor of ours.
    unsafe { OwnedFd::from_raw_fd(got as i32) }
}

/// The pid of the process that made the unix socket `fd` is connected to
/// (SO_PEERCRED); `None` for another kind of socket or one not connected.
fn peer_pid(fd: &OwnedFd) -> Option<i32> {
    // SAFETY: a zeroed ucred is a valid out-parameter for getsockopt.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writing at most `len` bytes to `cred`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

/// The worker's end of its channel to the root part `daemon`, taken from it:
/// the one socket it holds whose peer the root part made (both ends of the
/// socketpair were made before the fork).
pub fn channel_of(worker: u64, daemon: u64) -> UnixStream {
    for (n, link) in fd_links(worker) {
        if !link.starts_with("socket:") {
            continue;
        }
        let fd = take_fd(worker, n);
        if peer_pid(&fd) == Some(daemon as i32) {
            let s = UnixStream::from(fd);
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            return s;
        }
    }
    panic!("no channel to {daemon} among the descriptors of {worker}");
}

/// Sends `line` (one JSON request) on `channel` as the worker would, and
/// reads the root part's one-line answer; `Err` when none came within the
/// channel's read timeout.
pub fn ask(channel: &UnixStream, line: &str) -> std::io::Result<String> {
    let mut w = channel;
    w.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(channel).read_line(&mut answer)?;
    Ok(answer.trim_end().to_string())
}

/// [`ask`], asking again for as long as the root part answers that the call
/// is still under way (as the worker does): a loaded machine can take a call
/// past the root part's bound, and that answer says nothing of its outcome.
pub fn ask_until_answered(channel: &UnixStream, line: &str) -> std::io::Result<String> {
    let mut answer = ask(channel, line)?;
    // Each pending answer comes after the root part's 5 s: two minutes in all.
    for _ in 0..24 {
        if !answer.starts_with(r#"{"pending":"#) {
            break;
        }
        answer = ask(channel, line)?;
    }
    Ok(answer)
}

/// An integer socket option of the socket `fd`.
fn sockopt(fd: &OwnedFd, opt: libc::c_int) -> Option<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writing at most `len` bytes to `v`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(v)
}

/// The control socket the worker listens on, taken from it: the one unix
/// socket it holds that accepts connections. Connections to the socket's
/// path are then the taker's to accept while the worker is stopped.
pub fn listener_of(worker: u64) -> std::os::unix::net::UnixListener {
    for (n, link) in fd_links(worker) {
        if !link.starts_with("socket:") {
            continue;
        }
        let fd = take_fd(worker, n);
        if sockopt(&fd, libc::SO_ACCEPTCONN) == Some(1)
            && sockopt(&fd, libc::SO_DOMAIN) == Some(libc::AF_UNIX)
        {
            return fd.into();
        }
    }
    panic!("no listening unix socket among the descriptors of {worker}");
}

/// The worker's `/dev/fuse` descriptor, taken from it: requests of the
/// drive's FUSE mount read from it are the taker's to answer while the worker
/// is stopped, and notifications written to it are the kernel's to act on.
pub fn fuse_of(worker: u64) -> OwnedFd {
    let (n, _) = fd_links(worker)
        .into_iter()
        .find(|(_, link)| link == "/dev/fuse")
        .unwrap_or_else(|| panic!("no /dev/fuse among the descriptors of {worker}"));
    take_fd(worker, n)
}
