//! One JSON record per mount under the run directory, so that any later command
//! (`unmount`, `list`, `stats`) finds the daemon, its socket and what it set up,
//! even after the daemon died.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Mode;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountRecord {
    pub id: String,
    /// The blob service the drive lives in (no credential), so that two accounts
    /// holding the same container and blob names are never taken for each other.
    #[serde(default)]
    pub endpoint: String,
    pub blob: String,
    pub snapshot: Option<String>,
    pub mountpoint: PathBuf,
    pub mode: Mode,
    pub fuse_dir: PathBuf,
    pub device: Option<String>,
    pub read_only: bool,
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

pub fn ensure_dir() -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(mounts_dir())
}

/// Writes the record only if none exists for this mountpoint: the lock that makes
/// two concurrent mounts at one place impossible.
pub fn create_exclusive(r: &MountRecord) -> std::io::Result<()> {
    ensure_dir()?;
    let (path, ..) = paths(&r.id);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
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
    fs::write(&tmp, serde_json::to_string_pretty(r).expect("serialisable"))?;
    fs::rename(tmp, path)
}

pub fn remove(id: &str) {
    let (path, sock, ..) = paths(id);
    let _ = fs::remove_file(path);
    let _ = fs::remove_file(sock);
}

pub fn load(id: &str) -> Option<MountRecord> {
    let (path, ..) = paths(id);
    serde_json::from_str(&fs::read_to_string(path).ok()?).ok()
}

pub fn load_all() -> Vec<MountRecord> {
    let mut out: Vec<MountRecord> = fs::read_dir(mounts_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_str(&fs::read_to_string(e.path()).ok()?).ok())
        .collect();
    out.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
    out
}

/// Whether the daemon of a record is still running.
pub fn alive(r: &MountRecord) -> bool {
    super::system::pid_alive(r.pid)
}
