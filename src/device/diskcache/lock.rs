//! The lock of a drive's cache directory: one mount at a time uses it.
//!
//! A split daemon's root part takes the lock before it changes anything in the
//! directory (empties it, gives it to its worker's uid) and holds it until it
//! has taken the directory back once the mount is down. So a directory a live
//! mount holds is refused to every other mount, read-only or not, and left as
//! it is; a lock whose holder is gone (a SIGKILLed mount) is held by nobody and
//! taken over.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;

/// The lock file's name in a drive's directory.
const LOCK: &str = "lock";

/// Says who holds a lock: given the pid /proc/locks names (none when it names
/// nobody or cannot be read), a few words ("the mount at /data").
pub type Holder<'a> = &'a dyn Fn(Option<u32>) -> String;

/// The refusal of a directory another holds: one line, naming the holder.
fn in_use(shown: &str, lock: &File, holder: Holder) -> String {
    format!(
        "the disk cache {shown} is in use by {}: give this mount another --disk-cache directory, or none (nothing in it was changed)",
        holder(lock_holder(lock))
    )
}

/// Opens `lock` in `dir` (no link followed, never blocking on a FIFO), with
/// `flags` added (`O_CREAT`, `O_EXCL`).
fn open_lock(dir: &File, flags: i32) -> std::io::Result<File> {
    let n = CString::new(LOCK).expect("no NUL");
    // SAFETY: a valid directory fd and NUL-terminated name; the fd returned is ours.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            n.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | flags,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Whether `f` is a lock file of the cache's own making: regular, one link,
/// root's (this process's) or `left_by`'s (the uid the directory was left to).
fn is_own(f: &File, left_by: u32) -> bool {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    f.metadata().is_ok_and(|m| {
        m.file_type().is_file() && m.nlink() == 1 && [0, me, left_by].contains(&m.uid())
    })
}

/// Takes `f`'s lock without waiting: false when someone else holds it.
fn try_lock(f: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a valid descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e)
}

/// Locks the lock file the directory `dir` already has, before anything in it
/// is changed: `Ok(None)` when it has none of the cache's own (see
/// [`is_own`]), an error naming the holder (see [`Holder`]) when a live mount
/// holds it. `shown` names the directory.
pub fn lock_existing(
    dir: &File,
    shown: &str,
    left_by: u32,
    holder: Holder,
) -> Result<Option<File>, String> {
    let f = match open_lock(dir, 0) {
        Ok(f) if is_own(&f, left_by) => f,
        Ok(_) => return Ok(None),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ELOOP | libc::ENXIO)
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(format!("cannot open {shown}/{LOCK}: {e}")),
    };
    match try_lock(&f) {
        Ok(true) => Ok(Some(f)),
        Ok(false) => Err(in_use(shown, &f, holder)),
        Err(e) => Err(format!("cannot lock {shown}/{LOCK}: {e}")),
    }
}

/// Makes the lock file of the directory `dir` (a trusted one: root's, or
/// being given to the worker) and locks it; a `lock` name that is not the
/// cache's own file (a link, a directory, another's) is replaced.
pub fn lock_new(dir: &File, shown: &str, holder: Holder) -> Result<File, String> {
    let cannot = |e: std::io::Error| format!("cannot make {shown}/{LOCK}: {e}");
    let f = match open_lock(dir, libc::O_CREAT) {
        Ok(f) if is_own(&f, 0) => f,
        _ => {
            let n = CString::new(LOCK).expect("no NUL");
            for flags in [0, libc::AT_REMOVEDIR] {
                // SAFETY: a valid directory fd and NUL-terminated name.
                unsafe { libc::unlinkat(dir.as_raw_fd(), n.as_ptr(), flags) };
            }
            open_lock(dir, libc::O_CREAT | libc::O_EXCL).map_err(cannot)?
        }
    };
    match try_lock(&f) {
        Ok(true) => Ok(f),
        Ok(false) => Err(in_use(shown, &f, holder)),
        Err(e) => Err(format!("cannot lock {shown}/{LOCK}: {e}")),
    }
}

/// The process holding the flock on `f`, as /proc/locks names it.
pub fn lock_holder(f: &File) -> Option<u32> {
    let m = f.metadata().ok()?;
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&text, libc::major(m.dev()), libc::minor(m.dev()), m.ino())
}

/// In /proc/locks' `text`, the pid of the flock held on the file of device
/// `major:minor` and inode `ino`. Lines read `N: FLOCK ADVISORY WRITE PID
/// MAJ:MIN:INO START END`, the device in hex; a waiter's line (`-> ...`) has
/// one field more before the type, and is not the holder.
fn holder_in(text: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let text = "1: POSIX  ADVISORY  WRITE 99 fd:01:42 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4711 fd:01:42 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 4712 fd:01:42 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 5 103:0a:42 0 EOF\n";
        assert_eq!(holder_in(text, 0xfd, 1, 42), Some(4711));
        assert_eq!(holder_in(text, 0x103, 0x0a, 42), Some(5));
        assert_eq!(holder_in(text, 0xfd, 1, 43), None);
    }

    #[test]
    fn a_held_lock_is_refused_naming_its_holder_and_a_free_one_taken() {
        let d = tempfile::tempdir().unwrap();
        let dir = File::open(d.path()).unwrap();
        let named = |pid: Option<u32>| format!("pid {pid:?}");
        assert!(lock_existing(&dir, "d", 0, &named).unwrap().is_none());
        let held = lock_new(&dir, "d", &named).unwrap();
        let err = lock_existing(&dir, "d", 0, &named).unwrap_err();
        let me = std::process::id();
        assert!(err.contains(&format!("in use by pid Some({me})")), "{err}");
        assert!(lock_new(&dir, "d", &named).is_err());
        drop(held);
        let again = lock_existing(&dir, "d", 0, &named).unwrap();
        assert!(again.is_some());
        drop(again);
        // A lock name that is not the cache's own file is replaced.
        std::fs::remove_file(d.path().join(LOCK)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join(LOCK)).unwrap();
        assert!(lock_existing(&dir, "d", 0, &named).unwrap().is_none());
        let _l = lock_new(&dir, "d", &named).unwrap();
        assert!(!d.path().join(LOCK).is_symlink());
    }
}
