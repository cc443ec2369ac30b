//! An entry in libmount's table of userspace mount options (`/run/mount/utab`)
//! that makes util-linux's `umount DIR` (also systemd's at shutdown) run
//! `/sbin/umount.blobdrive DIR` instead of unmounting by itself.
//!
//! Why: a plain umount of the filesystem returns once the kernel let go of it,
//! and the daemon releases the lease a moment later. At shutdown systemd takes
//! the network down right after the mount unit stopped, so that release could
//! be lost and the next boot's mount refused until `lease break`. With the
//! helper, `umount` returns only once the daemon has written everything,
//! released the lease and gone, and systemd stops the network after that.
//!
//! libmount reads `helper=TYPE` from an entry's options for root as well as for
//! users, matching the entry to the mount by its mount ID. Writers take an
//! exclusive `flock` on `utab.lock` and replace the file by a rename, as libmount
//! does. Everything here is best effort: without the entry `umount` simply
//! works as before.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::system::unescape_mountinfo;

/// Where libmount keeps the table.
const UTAB_DIR: &str = "/run/mount";
/// The option that names the helper (`/sbin/umount.blobdrive`).
pub const HELPER_OPTION: &str = "helper=blobdrive";
/// A table larger than this is not ours to rewrite.
const MAX_BYTES: u64 = 1 << 20;

/// Records the helper for the mount on top of `target` (the last one there in
/// /proc/self/mountinfo whose device is the one `target` now shows).
pub fn add(target: &Path, devno: &str) -> Result<(), String> {
    let (id, source) = mount_at(target, devno)?;
    edit(Path::new(UTAB_DIR), |text| {
        with_entry(text, id, &source, target)
    })
}

/// Removes this program's entries for `target` (entries other programs wrote are
/// kept). By target, not by mount ID: mount(8), updating the table after
/// `mount.blobdrive` returned, rewrites the entry without its ID (libmount then
/// matches it by source and target), and only one drive is mounted at a path.
pub fn remove(target: &Path) -> Result<(), String> {
    let dir = Path::new(UTAB_DIR);
    if fs::symlink_metadata(dir.join("utab")).is_err() {
        return Ok(());
    }
    edit(dir, |text| without_entry(text, target))
}

/// Whether the table has an entry of this program's for `target`.
pub fn has_entry(target: &Path) -> bool {
    let table = read_table(&Path::new(UTAB_DIR).join("utab")).unwrap_or_default();
    without_entry(&table, target) != table
}

/// The mount on top of `target` whose device is `devno` (`MAJOR:MINOR`, as the
/// caller knows its own mount: not by a stat of `target`, which would wait on
/// the worker's FUSE answers): its ID and source, from /proc/self/mountinfo.
fn mount_at(target: &Path, devno: &str) -> Result<(u64, String), String> {
    let info = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let want = target.to_string_lossy();
    info.lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS...] - TYPE SOURCE SUPER
            let sep = f.iter().position(|x| *x == "-")?;
            if f.len() <= sep + 2 || f[2] != devno || unescape_mountinfo(f[4]) != want {
                return None;
            }
            Some((f[0].parse().ok()?, unescape_mountinfo(f[sep + 2])))
        })
        .ok_or_else(|| format!("no mount of {devno} at {want} in /proc/self/mountinfo"))
}

/// The table `text` with an entry for mount `id` (replacing any for that ID).
fn with_entry(text: &str, id: u64, source: &str, target: &Path) -> String {
    let mut out: String = text
        .lines()
        .filter(|l| field(l, "ID") != Some(id.to_string()))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!(
        "ID={id} SRC={} TARGET={} ROOT=/ OPTS={HELPER_OPTION}\n",
        mangle(source),
        mangle(&target.to_string_lossy())
    ));
    out
}

/// The table `text` without this program's entries for `target`.
fn without_entry(text: &str, target: &Path) -> String {
    let target = target.to_string_lossy();
    text.lines()
        .filter(|l| {
            let ours = field(l, "OPTS").is_some_and(|o| o.split(',').any(|x| x == HELPER_OPTION));
            !(ours && field(l, "TARGET").as_deref() == Some(&*target))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The value of `NAME=` in an entry, unescaped.
fn field(line: &str, name: &str) -> Option<String> {
    line.split(' ')
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .map(unescape_mountinfo)
}

/// Escapes what would split a field, as libmount does (`\040` for a space).
fn mangle(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Rewrites `dir/utab` through `change`, under libmount's lock.
fn edit(dir: &Path, change: impl FnOnce(&str) -> String) -> Result<(), String> {
    check_dir(dir)?;
    let lock = OpenOptions::new()
        .read(true)
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join("utab.lock"))
        .map_err(|e| format!("cannot open {}/utab.lock: {e}", dir.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function owns; released when it closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!(
            "cannot lock {}/utab.lock: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    let path = dir.join("utab");
    let old = read_table(&path)?;
    let new = change(&old);
    if new == old {
        return Ok(());
    }
    let tmp: PathBuf = dir.join(format!("utab.blobdrive.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    let written = f
        .write_all(new.as_bytes())
        .and_then(|()| f.set_permissions(fs::Permissions::from_mode(0o644)))
        .and_then(|()| fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    Ok(())
}

/// The table as it is (empty if there is none): a regular file of root's, not
/// through a symlink, of bounded size.
fn read_table(path: &Path) -> Result<String, String> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() || meta.uid() != 0 || meta.len() > MAX_BYTES {
        return Err(format!(
            "{} is not a regular file of root's under {MAX_BYTES} bytes: left alone",
            path.display()
        ));
    }
    let mut text = String::new();
    f.take(MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text)
}

/// `dir` must be root's directory, closed to writes by others; created (0755, as
/// libmount creates it) when missing.
fn check_dir(dir: &Path) -> Result<(), String> {
    if fs::symlink_metadata(dir).is_err() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let meta = fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory of root's closed to others: its table is left alone",
            dir.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_written_and_removed_as_libmount_writes_them() {
        let other = "ID=40 SRC=/dev/sdb1 TARGET=/srv ROOT=/ OPTS=x-foo\n";
        let t = with_entry(other, 57, "/dev/loop3", Path::new("/mnt/my data"));
        assert_eq!(
            t,
            format!("{other}ID=57 SRC=/dev/loop3 TARGET=/mnt/my\\040data ROOT=/ OPTS=helper=blobdrive\n")
        );
        // A second entry for the same ID replaces the first.
        let again = with_entry(&t, 57, "/dev/loop4", Path::new("/mnt/x"));
        assert_eq!(again.lines().count(), 2);
        assert!(again.contains("SRC=/dev/loop4"));
        // Removal takes ours alone, also once mount(8) dropped the ID.
        assert_eq!(without_entry(&t, Path::new("/mnt/my data")), other);
        let no_id = t.replace("ID=57 ", "");
        assert_eq!(without_entry(&no_id, Path::new("/mnt/my data")), other);
        assert_eq!(without_entry(&t, Path::new("/srv")), t);
    }

    #[test]
    fn escapes_round_trip() {
        for s in ["/a b", "/t\tab", "/back\\slash", "/plain", "/ünï"] {
            assert_eq!(unescape_mountinfo(&mangle(s)), s);
        }
        assert_eq!(unescape_mountinfo("/x\\040y\\134z"), "/x y\\z");
        // Not an escape: left as it is.
        assert_eq!(unescape_mountinfo("\\9ab\\"), "\\9ab\\");
    }

    #[test]
    fn the_table_is_edited_under_the_lock_and_only_in_a_closed_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mount");
        edit(&dir, |t| with_entry(t, 9, "src", Path::new("/m"))).unwrap();
        let text = fs::read_to_string(dir.join("utab")).unwrap();
        assert_eq!(
            text,
            "ID=9 SRC=src TARGET=/m ROOT=/ OPTS=helper=blobdrive\n"
        );
        let mode = fs::metadata(dir.join("utab")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert!(dir.join("utab.lock").exists());
        edit(&dir, |t| without_entry(t, Path::new("/m"))).unwrap();
        assert_eq!(fs::read_to_string(dir.join("utab")).unwrap(), "");
        // A directory others can write to is not used.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let err = edit(&dir, |t| t.to_string() + "x\n").unwrap_err();
        assert!(err.contains("closed to others"), "{err}");
        // Nor a table that is a symlink.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        fs::remove_file(dir.join("utab")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("utab")).unwrap();
        assert!(edit(&dir, |t| t.to_string() + "x\n").is_err());
    }
}
