//! One JSON record per mount under the run directory, so that any later command
//! (`unmount`, `list`, `stats`) finds the daemon, its socket and what it set up,
//! even after the daemon died.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use std::os::unix::net::UnixListener;

use super::{Mode, MountError};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountRecord {
    pub id: String,
    /// The blob service the drive lives in (no credential), so that two accounts
    /// holding the same container and blob names are never taken for each other.
    #[serde(default)]
    pub endpoint: String,
    pub blob: String,
    /// How the daemon authorises its requests: "account key", "SAS",
    /// "anonymous" or "Entra ID (SOURCE)". Never a secret.
    #[serde(default)]
    pub auth: String,
    pub snapshot: Option<String>,
    pub mountpoint: PathBuf,
    pub mode: Mode,
    pub fuse_dir: PathBuf,
    pub device: Option<String>,
    /// The loop device's disk sequence number right after the root part
    /// attached it: while the device still has it, it is still attached to
    /// this mount's `disk` (`unmount` of a dead daemon detaches it only then).
    #[serde(default)]
    pub device_seq: Option<u64>,
    pub read_only: bool,
    /// The memory cache's limit (`--cache-size`), for `list` and for a CSI
    /// node plugin counting what its staged volumes take of its budget.
    #[serde(default)]
    pub cache_size: Option<u64>,
    /// The uid the worker runs as (its own, from the pool, unless `--run-as`).
    #[serde(default)]
    pub worker_uid: Option<u32>,
    pub pid: u32,
    pub socket: PathBuf,
    pub log: PathBuf,
}

/// `$BLOBDRIVE_RUN_DIR` or `/run/blobdrive`.
pub fn run_dir() -> PathBuf {
    std::env::var_os("BLOBDRIVE_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/blobdrive"))
}

fn mounts_dir() -> PathBuf {
    run_dir().join("mounts")
}

/// A short stable id for a (canonical) mountpoint.
pub fn id_for(mountpoint: &Path) -> String {
    let h = Sha256::digest(mountpoint.as_os_str().as_encoded_bytes());
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

pub fn paths(id: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let d = mounts_dir();
    (
        d.join(format!("{id}.json")),
        d.join(format!("{id}.sock")),
        d.join(format!("{id}.log")),
        d.join(format!("{id}.fuse")),
    )
}

/// Creates the run directory and its `mounts/` (0700), then checks both as
/// [`check_dirs`] does: an existing one a user could write to is refused.
pub fn ensure_dir() -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(mounts_dir())?;
    check_dirs().map_err(std::io::Error::other)
}

/// Checks the run directory and its `mounts/`, where the records root trusts, the
/// daemons' logs and their control sockets live: each must be a directory (not a
/// symlink), this user's (root's), and closed to group and others. A missing one
/// is fine (nothing is mounted). One line naming the path, what is wrong and the
/// fix.
pub fn check_dirs() -> Result<(), String> {
    check_private_dir(&run_dir())?;
    check_private_dir(&mounts_dir())
}

pub(crate) fn check_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(format!(
                "cannot check the run directory {}: {e}",
                dir.display()
            ))
        }
    };
    let why = if !meta.file_type().is_dir() {
        "is not a directory (a symlink or a file in its place)".to_string()
    } else if meta.uid() != 0 {
        format!("belongs to uid {}, not to root", meta.uid())
    } else if meta.mode() & 0o077 != 0 {
        format!(
            "is open to group or others (mode {:04o})",
            meta.mode() & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(format!(
        "refusing the run directory {}: it {why}; blobdrive keeps there the mount records and control sockets it trusts as root, so it must be root's alone (remove it, or chown root and chmod 700 it)",
        dir.display()
    ))
}

/// Opens a file of the run directory for reading: not through a symlink, not
/// blocking, and only a regular file of this user's of at most `max` bytes.
pub(crate) fn read_private(path: &Path, max: u64) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = f.metadata().ok()?;
    // SAFETY: geteuid cannot fail.
    if !meta.is_file() || meta.uid() != unsafe { libc::geteuid() } || meta.len() > max {
        return None;
    }
    let mut text = String::new();
    f.take(max).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Creates (or truncates) a file of the run directory: 0600, never through a
/// symlink.
pub fn create_private(path: &Path, append: bool) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = OpenOptions::new();
    if append {
        o.append(true);
    } else {
        o.write(true).truncate(true);
    }
    o.create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The most a mount record may hold when read back.
const RECORD_MAX_BYTES: u64 = 64 << 10;

/// Writes the record only if none exists for this mountpoint: the lock that makes
/// two concurrent mounts at one place impossible.
pub fn create_exclusive(r: &MountRecord) -> std::io::Result<()> {
    ensure_dir()?;
    let (path, ..) = paths(&r.id);
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?
    };
    // A note left by an earlier mount here that nobody read is stale now.
    let _ = fs::remove_file(outcome_path(&r.id));
    f.write_all(
        serde_json::to_string_pretty(r)
            .expect("serialisable")
            .as_bytes(),
    )
}

/// Replaces the record (atomically, via rename).
pub fn save(r: &MountRecord) -> std::io::Result<()> {
    let (path, ..) = paths(&r.id);
    let tmp = path.with_extension("json.tmp");
    create_private(&tmp, false)?.write_all(
        serde_json::to_string_pretty(r)
            .expect("serialisable")
            .as_bytes(),
    )?;
    fs::rename(tmp, path)
}

pub fn remove(id: &str) {
    let (path, sock, ..) = paths(id);
    let _ = fs::remove_file(path);
    let _ = fs::remove_file(sock);
}

/// Where a daemon that stopped with losses leaves what it could not keep.
fn outcome_path(id: &str) -> PathBuf {
    mounts_dir().join(format!("{id}.lost"))
}

/// The most of an outcome note that is read back.
const OUTCOME_MAX_BYTES: u64 = 64 << 10;

/// Leaves `what` (what could not be kept) for the `blobdrive unmount` that comes
/// after a daemon stopped with losses: its record is gone then, which alone would
/// read as a clean stop. Written before the record is removed.
pub fn write_outcome(id: &str, what: &str) -> std::io::Result<()> {
    create_private(&outcome_path(id), false)?.write_all(what.as_bytes())
}

/// Takes (reads and removes) the note a daemon left when it stopped with losses.
pub fn take_outcome(id: &str) -> Option<String> {
    check_dirs().ok()?;
    let path = outcome_path(id);
    let text = read_private(&path, OUTCOME_MAX_BYTES);
    let _ = fs::remove_file(&path);
    text
}

/// Removes a mount's daemon log and its rotated copy: done after a clean unmount
/// (a failed one keeps its log, to be read).
pub fn remove_log(id: &str) {
    let (.., log, _) = paths(id);
    let _ = fs::remove_file(log.with_extension("log.1"));
    let _ = fs::remove_file(log);
}

/// The line each log of a mount starts with (and its continuation after
/// [`rotate_log`]): the program that wrote it, by the path the kernel knows it
/// by, its version and `what`. The Debian package's purge reads it to take the
/// logs its own program left (`(/usr/bin/blobdrive)`), and not those of a
/// blobdrive installed another way, whose failed mounts' logs are kept to be
/// read. Never a secret: `what` names the drive as `container/name`.
pub fn log_header(what: &str) -> String {
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".to_string());
    format!(
        "== blobdrive {} ({exe}): {what}\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// How big a daemon log grows before it is moved aside to `ID.log.1`.
pub const LOG_MAX_BYTES: u64 = 16 << 20;

/// If the log at `path` is larger than `max` and `fd` writes to it, renames it to
/// `ID.log.1` (replacing an older one) and points `fd` at a fresh file at `path`.
/// Returns whether it rotated. A daemon in the foreground (stderr not the file)
/// is left alone.
pub fn rotate_log(path: &Path, max: u64, fd: std::os::fd::RawFd) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path)?;
    if meta.len() <= max {
        return Ok(false);
    }
    // SAFETY: fstat writes only into the zeroed struct it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0
        || st.st_dev != meta.dev()
        || st.st_ino != meta.ino()
    {
        return Ok(false);
    }
    fs::rename(path, path.with_extension("log.1"))?;
    let mut fresh = create_private(path, true)?;
    let older = path.with_extension("log.1");
    fresh.write_all(log_header(&format!("continued from {}", older.display())).as_bytes())?;
    // SAFETY: both descriptors are valid; dup2 atomically replaces `fd`.
    if unsafe { libc::dup2(fresh.as_raw_fd(), fd) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(true)
}

/// Fails when the run directory exists but cannot be read (a user other than
/// root): "nothing is mounted" would then be a lie.
pub fn check_readable() -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 && fs::symlink_metadata(run_dir()).is_ok() {
        return Err(format!(
            "cannot read the run directory {}, where mounts are recorded: it is root's alone; run this as root (sudo)",
            run_dir().display()
        ));
    }
    check_dirs()?;
    let dir = mounts_dir();
    match fs::read_dir(&dir) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "cannot read the run directory {} ({e}), where mounts are recorded: it is root's; run this as root (sudo)",
            dir.display()
        )),
    }
}

/// The record of mount `id`, if there is one to trust: none is read from a run
/// directory that fails [`check_dirs`], and only a regular root-owned file.
pub fn load(id: &str) -> Option<MountRecord> {
    check_dirs().ok()?;
    let (path, ..) = paths(id);
    serde_json::from_str(&read_private(&path, RECORD_MAX_BYTES)?).ok()
}

/// Every record there is to trust (see [`load`]).
pub fn load_all() -> Vec<MountRecord> {
    if check_dirs().is_err() {
        return Vec::new();
    }
    let mut out: Vec<MountRecord> = fs::read_dir(mounts_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_str(&read_private(&e.path(), RECORD_MAX_BYTES)?).ok())
        .collect();
    out.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    out
}

/// The mountpoint `path` names (canonical, when it exists) and blobdrive's record
/// of a mount there, if any; an error if the records cannot be read (not root).
pub fn at_mountpoint(path: &Path) -> Result<(PathBuf, Option<MountRecord>), String> {
    let mp = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    check_readable()?;
    let rec = load(&id_for(&mp));
    Ok((mp, rec))
}

/// The record of the writable mount of the drive `blob` (its base, not a
/// snapshot) of the account at `endpoint` on this machine, if there is one,
/// running or not: the one whose daemon holds the drive's lease.
pub fn writable_mount(endpoint: &str, blob: &str) -> Option<MountRecord> {
    writable_of(load_all(), endpoint, blob, alive).map(|(m, _)| m)
}

/// [`writable_mount`] at a mountpoint other than `except`, and whether its
/// daemon was running when looked at. Its caller takes that answer rather
/// than asking again: a racing mount's daemon can end between two looks, and
/// asked twice it was first the running holder and then a dead one.
pub fn writable_mount_elsewhere(
    endpoint: &str,
    blob: &str,
    except: Option<&Path>,
) -> Option<(MountRecord, bool)> {
    let records = load_all()
        .into_iter()
        .filter(|m| Some(m.mountpoint.as_path()) != except)
        .collect();
    writable_of(records, endpoint, blob, alive)
}

/// [`writable_mount`] among `records`, a running one first, and whether it
/// runs (each daemon looked at once): mounts racing for one drive each record
/// themselves before they ask for its lease, and a loser's record stays a
/// moment after its daemon is gone, beside the winner's (taken for the
/// holder, it made a loser say the drive's holder had died).
fn writable_of(
    records: Vec<MountRecord>,
    endpoint: &str,
    blob: &str,
    running: impl Fn(&MountRecord) -> bool,
) -> Option<(MountRecord, bool)> {
    let mut found = records.into_iter().filter(|m| {
        m.endpoint == endpoint && m.blob == blob && m.snapshot.is_none() && !m.read_only
    });
    let first = found.next()?;
    if running(&first) {
        return Some((first, true));
    }
    Some(
        found
            .find(|m| running(m))
            .map_or((first, false), |m| (m, true)),
    )
}

/// Names, for a message, the process `pid` that holds a lock (a disk cache's,
/// as /proc/locks tells): the mount whose daemon it is, else the process.
pub fn lock_holder(pid: Option<u32>) -> String {
    let Some(pid) = pid else {
        return "another mount".to_string();
    };
    match load_all().into_iter().find(|m| m.pid == pid) {
        Some(m) => format!("the mount at {} (pid {pid})", m.mountpoint.display()),
        None => {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim())
        }
    }
}

/// Whether the daemon of a record is still running.
pub fn alive(r: &MountRecord) -> bool {
    super::system::pid_alive(r.pid)
}

/// Creates the mount record exclusively: no other daemon serves this mountpoint.
pub fn claim(rec: &MountRecord) -> Result<(), MountError> {
    match create_exclusive(rec) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let msg = match load(&rec.id) {
                Some(old) if alive(&old) => format!(
                    "{} is already in use by blobdrive (pid {}, {})",
                    rec.mountpoint.display(),
                    old.pid,
                    old.blob
                ),
                _ => format!(
                    "a previous mount at {} did not end cleanly; run `blobdrive unmount {}` first",
                    rec.mountpoint.display(),
                    rec.mountpoint.display()
                ),
            };
            Err(MountError::system(msg))
        }
        Err(e) => Err(MountError::with_source("cannot write the mount record", e)),
    }
}

/// The control socket (root's alone), then the record with everything in it.
pub fn listen(rec: &MountRecord) -> Result<UnixListener, MountError> {
    let _ = std::fs::remove_file(&rec.socket);
    let listener = UnixListener::bind(&rec.socket).map_err(|e| {
        MountError::with_source(format!("cannot listen on {}", rec.socket.display()), e)
    })?;
    // Root's alone (its directory already is): see `control::peer_uid` too.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rec.socket, std::fs::Permissions::from_mode(0o600)).map_err(
            |e| MountError::with_source(format!("cannot restrict {}", rec.socket.display()), e),
        )?;
    }
    save(rec).map_err(|e| MountError::with_source("cannot write the mount record", e))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn writable(mountpoint: &str, pid: u32) -> MountRecord {
        MountRecord {
            id: mountpoint.into(),
            endpoint: "e".into(),
            blob: "c/d.vhd".into(),
            auth: String::new(),
            snapshot: None,
            mountpoint: mountpoint.into(),
            mode: Mode::Raw,
            fuse_dir: PathBuf::new(),
            device: None,
            device_seq: None,
            read_only: false,
            cache_size: None,
            worker_uid: None,
            pid,
            socket: PathBuf::new(),
            log: PathBuf::new(),
        }
    }

    #[test]
    fn a_running_writable_mount_is_found_before_a_dead_ones_record() {
        let running = |m: &MountRecord| m.pid == 2;
        let records = vec![writable("/a", 1), writable("/b", 2), writable("/c", 3)];
        let (found, runs) = writable_of(records, "e", "c/d.vhd", running).unwrap();
        assert_eq!((found.mountpoint, runs), (PathBuf::from("/b"), true));
        // None running: the dead one's record, to be cleaned up.
        let records = vec![writable("/a", 1), writable("/c", 3)];
        let (found, runs) = writable_of(records, "e", "c/d.vhd", running).unwrap();
        assert_eq!((found.mountpoint, runs), (PathBuf::from("/a"), false));
        assert!(writable_of(vec![writable("/a", 2)], "e", "x", running).is_none());
    }

    /// A daemon that ends right after it was seen running is still said to
    /// run: each is looked at once, and the answer is the one seen.
    #[test]
    fn each_daemon_is_looked_at_once_and_the_answer_kept() {
        let looks = std::cell::RefCell::new(Vec::new());
        let ending = |m: &MountRecord| {
            looks.borrow_mut().push(m.pid);
            looks.borrow().iter().filter(|p| **p == m.pid).count() == 1
        };
        let records = vec![writable("/a", 1), writable("/b", 2)];
        let (found, runs) = writable_of(records, "e", "c/d.vhd", ending).unwrap();
        assert_eq!((found.mountpoint, runs), (PathBuf::from("/a"), true));
        assert_eq!(*looks.borrow(), vec![1]);
    }

    #[test]
    fn a_log_over_its_limit_is_moved_aside_and_the_writer_follows() {
        let dir = std::env::temp_dir().join(format!("bd-rotate-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.log");
        let mut writer = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        writer.write_all(&[b'a'; 100]).unwrap();
        assert!(!rotate_log(&path, 100, writer.as_raw_fd()).unwrap());
        writer.write_all(b"b").unwrap();
        // Another file's descriptor is never redirected.
        let other = fs::File::open("/dev/null").unwrap();
        assert!(!rotate_log(&path, 100, other.as_raw_fd()).unwrap());
        assert!(rotate_log(&path, 100, writer.as_raw_fd()).unwrap());
        writer.write_all(b"new").unwrap();
        assert_eq!(fs::read(dir.join("x.log.1")).unwrap().len(), 101);
        // The fresh file says whose it is first (see `log_header`).
        let fresh = fs::read_to_string(&path).unwrap();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(
            fresh,
            format!(
                "== blobdrive {} ({}): continued from {}.1\nnew",
                env!("CARGO_PKG_VERSION"),
                exe.display(),
                path.display()
            )
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
