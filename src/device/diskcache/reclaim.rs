//! A drive's cache directory whose owner is a uid another mount's worker now
//! runs as: the mount that left it there was killed before its root part could
//! take it back, and the pool has since given the uid to someone else. What is
//! in it was within that other worker's reach, so none of it is kept.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStringExt;

/// Who a drive's directory was left to, as the uid pool tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftTo {
    /// A pool uid nothing uses now: the directory may be given on.
    Idle,
    /// A pool uid a live mount or a process has now: the directory is taken
    /// back and emptied.
    InUse,
    /// Not a uid of the pool: refused, as any directory of someone else's.
    NotPool,
}

/// How deep a tree the other worker may have made is followed down.
const MAX_DEPTH: usize = 8;

/// Makes `dir` root's alone (so the other uid can no longer add to it by
/// path) and removes everything in it, following no link.
pub fn empty_untrusted(dir: &File) -> std::io::Result<()> {
    // SAFETY: fchown and fchmod on a valid descriptor.
    if unsafe { libc::fchown(dir.as_raw_fd(), 0, 0) } != 0
        || unsafe { libc::fchmod(dir.as_raw_fd(), 0o700) } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    remove_entries(dir, 0)
}

fn remove_entries(dir: &File, depth: usize) -> std::io::Result<()> {
    for name in names_in(dir)? {
        if unlink_at(dir, &name, 0)? {
            continue;
        }
        if depth >= MAX_DEPTH {
            return Err(std::io::Error::other(format!(
                "directories nested more than {MAX_DEPTH} deep"
            )));
        }
        let sub = open_dir_at(dir, &name)?;
        remove_entries(&sub, depth + 1)?;
        if !unlink_at(dir, &name, libc::AT_REMOVEDIR)? {
            return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
        }
    }
    Ok(())
}

/// The names in the directory `dir` (read through its descriptor, not a
/// path).
fn names_in(dir: &File) -> std::io::Result<Vec<CString>> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .map(|e| e.map(|e| CString::new(e.file_name().into_vec()).expect("no NUL in a file name")))
        .collect()
}

/// Unlinks `name` in `dir` (`flags` as for unlinkat(2)): true when it is
/// gone, false when it is a directory and `flags` did not say so.
fn unlink_at(dir: &File, name: &CString, flags: i32) -> std::io::Result<bool> {
    // SAFETY: a valid directory fd and a NUL-terminated name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT) => Ok(true),
        Some(libc::EISDIR) if flags == 0 => Ok(false),
        _ => Err(e),
    }
}

fn open_dir_at(dir: &File, name: &CString) -> std::io::Result<File> {
    // SAFETY: a valid directory fd and a NUL-terminated name; the fd returned
    // is ours.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn an_untrusted_directory_is_emptied_and_root_s_without_following_links() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let top = tempfile::tempdir().unwrap();
        let d = top.path().join("d");
        let outside = top.path().join("outside");
        std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        std::fs::write(d.join("data"), b"x").unwrap();
        std::fs::write(d.join("sub/deeper/f"), b"y").unwrap();
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("sub/link")).unwrap();
        std::fs::hard_link(outside.join("keep"), d.join("index")).unwrap();
        let other = 1_900_000_200;
        for p in [&d, &d.join("sub"), &d.join("data")] {
            std::os::unix::fs::chown(p, Some(other), Some(other)).unwrap();
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let dir = File::open(&d).unwrap();
        empty_untrusted(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (0, 0, 0o700));
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"k");
        // Too deep a tree is an error, not a loop.
        let mut p = d.clone();
        for _ in 0..=MAX_DEPTH + 1 {
            p.push("n");
        }
        std::fs::create_dir_all(&p).unwrap();
        assert!(empty_untrusted(&dir).is_err());
    }
}
