//! Processes: whether a daemon is alive, and who holds a file open.

use std::path::Path;

pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as i32, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A zombie (dead, not yet reaped) is not a running daemon.
    exists && is_zombie(Path::new(&format!("/proc/{pid}/stat"))) != Some(true)
}

/// Whether the process or thread whose `stat` file is at `stat` is a zombie;
/// `None` if that cannot be read.
fn is_zombie(stat: &Path) -> Option<bool> {
    let text = std::fs::read_to_string(stat).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.trim_start().starts_with('Z'))
}

/// The state of process `pid`'s main thread as /proc says it (`R`, `S`, `D`,
/// `T` stopped, `t` stopped by a debugger, `Z`); `None` when it is gone.
pub fn state(pid: u32) -> Option<char> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The processes whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|t| {
                    let (_, rest) = t.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Whether any thread of process `pid` is still running. A process's main
/// thread can be a zombie while its other threads are still being killed, and
/// its sockets and files close only when the last of them is gone.
pub fn threads_running(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| is_zombie(&t.path().join("stat")) == Some(false))
}

/// The processes that keep the mount at `mountpoint` busy, as "pid N
/// (name)": those whose working or root directory, an open file or a mapped
/// one (a program run from it, a library) is in it, found in /proc by the
/// paths the kernel names them by (nothing is looked up through the mount:
/// no stat that could wait on a FUSE server). Bounded: a process's maps are
/// read up to 4 MiB.
pub fn users_of(mountpoint: &Path) -> Vec<String> {
    let inside = |p: &Path| p.starts_with(mountpoint);
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let dir = p.path();
        let by_link = ["cwd", "root", "exe"]
            .iter()
            .any(|l| std::fs::read_link(dir.join(l)).is_ok_and(|t| inside(&t)));
        let uses = by_link
            || std::fs::read_dir(dir.join("fd")).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| inside(&t)))
            })
            || maps_name(&dir.join("maps"), mountpoint);
        if uses {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            found.push(format!("pid {pid} ({})", comm.trim()));
        }
    }
    found
}

/// Whether the maps file `maps` names a file in `mountpoint`.
fn maps_name(maps: &Path, mountpoint: &Path) -> bool {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(maps).and_then(|f| f.take(4 << 20).read_to_string(&mut text));
    read.is_ok()
        && text.lines().any(|l| {
            l.split_whitespace()
                .nth(5)
                .is_some_and(|p| Path::new(p).starts_with(mountpoint))
        })
}

/// The processes holding `path` open, as "pid N (name)", found in /proc.
pub fn holders(path: &Path) -> Vec<String> {
    processes()
        .filter(|(dir, _)| {
            std::fs::read_dir(dir.join("fd")).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
            })
        })
        .map(|(dir, pid)| named(&dir, pid))
        .collect()
}

/// The mount namespaces where a mount has the device `devno` (`MAJOR:MINOR`)
/// as its source, each as "a mount of it in the mount namespace of pid N
/// (name)", by the first process found in it.
pub fn mounted_in_namespaces(devno: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    processes()
        .filter(|(dir, _)| {
            std::fs::read_link(dir.join("ns/mnt")).is_ok_and(|ns| seen.insert(ns))
                && std::fs::read_to_string(dir.join("mountinfo"))
                    .is_ok_and(|t| t.lines().any(|l| l.split(' ').nth(2) == Some(devno)))
        })
        .map(|(dir, pid)| {
            format!(
                "a mount of it in the mount namespace of {}",
                named(&dir, pid)
            )
        })
        .collect()
}

/// The processes of /proc: their directory and pid.
fn processes() -> impl Iterator<Item = (std::path::PathBuf, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| {
            let pid = p.file_name().to_str()?.to_string();
            pid.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| (p.path(), pid))
        })
}

/// "pid N (name)".
fn named(dir: &Path, pid: String) -> String {
    let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
    format!("pid {pid} ({})", comm.trim())
}
