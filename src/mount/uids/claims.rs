//! The ids live mounts hold: a file per id in the claims directory, naming the
//! process holding it (its pid and start time, so a pid reused by another
//! process is not taken for the holder), made and read under a lock held by
//! whoever picks an id, so that two mounts starting at once never pick the
//! same one.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The most of a claim file read back (`PID START\n`).
const CLAIM_MAX: u64 = 64;

/// The file naming the id given last (not a number, so never read as a
/// claim).
const LAST_GIVEN: &str = "last";

/// A process, named so that a reuse of its pid is told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its start time (`/proc/PID/stat` field 22).
    pub start: u64,
}

impl Holder {
    fn line(&self) -> String {
        format!("{} {}\n", self.pid, self.start)
    }

    fn parse(text: &str) -> Option<Holder> {
        let mut f = text.split_whitespace();
        let holder = Holder {
            pid: f.next()?.parse().ok()?,
            start: f.next()?.parse().ok()?,
        };
        f.next().is_none().then_some(holder)
    }
}

/// The claims directory, checked to be this user's (root's) alone at every
/// level from the run directory down: what is in it decides which ids a
/// worker may be given.
pub struct ClaimsDir {
    path: PathBuf,
}

/// The lock of a claims directory, held until dropped.
pub struct Locked {
    _file: File,
}

impl ClaimsDir {
    /// The directory at `path` (made 0700 with any missing parent), checked:
    /// a directory, not a link, this user's, closed to group and others; and
    /// each level above it from `checked_from` down a directory of this
    /// user's that no one else can write to (so no one else can put another
    /// in its place).
    pub fn open(path: &Path, checked_from: &Path) -> std::io::Result<ClaimsDir> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
        check_private(path, 0o077)?;
        let mut level = path.to_path_buf();
        while level != checked_from && level.pop() && level.starts_with(checked_from) {
            check_private(&level, 0o022)?;
        }
        Ok(ClaimsDir {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the directory's lock (flock on `lock` in it), waiting for it.
    pub fn lock(&self) -> std::io::Result<Locked> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.path.join("lock"))?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Locked { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Every claim in the directory: (id, holder). A file that is not a
    /// claim (another name, a link, too long, not parsing) is passed over.
    pub fn read(&self) -> std::io::Result<Vec<(u64, Holder)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.path)?.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            if let Some(holder) = read_claim(&entry.path()) {
                out.push((id, holder));
            }
        }
        Ok(out)
    }

    /// Records `id` as `holder`'s; fails if a claim of it is there.
    pub fn write(&self, id: u64, holder: Holder) -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.path.join(id.to_string()))?;
        f.write_all(holder.line().as_bytes())
    }

    /// The id given last (recorded by [`ClaimsDir::set_last_given`]), if a
    /// readable record of it is there.
    pub fn last_given(&self) -> Option<u64> {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(self.path.join(LAST_GIVEN))
            .ok()?;
        if !f.metadata().ok()?.is_file() {
            return None;
        }
        let mut text = String::new();
        f.take(CLAIM_MAX).read_to_string(&mut text).ok()?;
        text.trim().parse().ok()
    }

    /// Records `id` as the id given last, so that the next pick starts after
    /// it. Not recording it only makes ids come back sooner.
    pub fn set_last_given(&self, id: u64) {
        let new = self.path.join(format!("{LAST_GIVEN}.new"));
        let written = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&new)
            .and_then(|mut f| f.write_all(format!("{id}\n").as_bytes()))
            .and_then(|()| std::fs::rename(&new, self.path.join(LAST_GIVEN)));
        if let Err(e) = written {
            tracing::warn!("cannot record uid {id} as the last given: {e}");
        }
    }

    /// Removes the claim of `id` if `holder` (when given) holds it.
    pub fn remove(&self, id: u64, holder: Option<Holder>) {
        let path = self.path.join(id.to_string());
        if holder.is_some() && read_claim(&path) != holder {
            return;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot remove the claim of uid {id}: {e}"),
        }
    }
}

fn read_claim(path: &Path) -> Option<Holder> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(CLAIM_MAX).read_to_string(&mut text).ok()?;
    Holder::parse(&text)
}

/// A directory of this user's, not a link, with none of the mode bits
/// `forbidden` (0o077: closed to group and others; 0o022: writable by no one
/// else).
fn check_private(dir: &Path, forbidden: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() || meta.uid() != me || meta.mode() & forbidden != 0 {
        return Err(std::io::Error::other(format!(
            "{} must be a directory of uid {me}'s, {} (it is uid {}, mode {:o}{})",
            dir.display(),
            if forbidden == 0o077 {
                "closed to group and others"
            } else {
                "writable by no one else"
            },
            meta.uid(),
            meta.mode() & 0o7777,
            if meta.file_type().is_symlink() {
                ", a symbolic link"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn claims_are_written_once_read_back_and_removed_only_by_their_holder() {
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = ClaimsDir::open(&top.path().join("uids"), top.path()).unwrap();
        let a = Holder { pid: 10, start: 5 };
        let b = Holder { pid: 11, start: 6 };
        dir.write(100000, a).unwrap();
        assert!(dir.write(100000, b).is_err(), "one claim an id");
        dir.write(100001, b).unwrap();
        std::fs::write(dir.path().join("100002"), "garbage").unwrap();
        std::os::unix::fs::symlink(dir.path().join("100000"), dir.path().join("100003")).unwrap();
        let mut claims = dir.read().unwrap();
        claims.sort_by_key(|c| c.0);
        assert_eq!(claims, vec![(100000, a), (100001, b)]);
        dir.remove(100000, Some(b));
        assert_eq!(dir.read().unwrap().len(), 2, "not b's to remove");
        dir.remove(100000, Some(a));
        dir.remove(100001, None);
        assert!(dir.read().unwrap().is_empty());
        drop(dir.lock().unwrap());
    }

    #[test]
    fn a_claims_directory_others_could_write_to_is_refused() {
        let top = tempfile::tempdir().unwrap();
        // A run directory others may read, not write: the claims, 0700, in it.
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        ClaimsDir::open(&top.path().join("uids"), top.path()).unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        let err = ClaimsDir::open(&top.path().join("uids"), top.path())
            .err()
            .unwrap();
        assert!(err.to_string().contains("writable by no one else"), "{err}");
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let open = top.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = ClaimsDir::open(&open, top.path()).err().unwrap();
        assert!(
            err.to_string().contains("closed to group and others"),
            "{err}"
        );
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let real = top.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, top.path().join("link")).unwrap();
        let err = ClaimsDir::open(&top.path().join("link"), top.path())
            .err()
            .unwrap();
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }
}
