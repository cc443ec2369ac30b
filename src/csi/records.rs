//! The node plugin's own records in the run directory: a directory of JSON
//! files under `csi/` (root's alone like the mount records), one a key (a
//! staging path, a target path, a node id) named by a hash of the key. What
//! they say decides what root unmounts and what a node counts as its own, so
//! every level is checked to be root's alone, records are written whole (a
//! new file renamed over the old) and read back bounded.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::mount::record;

/// The most a record may hold when read back.
const MAX_BYTES: u64 = 16 << 10;

/// One kind of record: the directory `csi/NAME/` of the run directory.
pub struct RecordDir {
    name: &'static str,
}

impl RecordDir {
    pub const fn new(name: &'static str) -> RecordDir {
        RecordDir { name }
    }

    fn dir(&self) -> PathBuf {
        record::run_dir().join("csi").join(self.name)
    }

    /// The record of `key` (its file named `PREFIX` and a hash of it).
    pub fn path_of(&self, prefix: &str, key: &[u8]) -> PathBuf {
        let h = Sha256::digest(key);
        let hex: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
        self.dir().join(format!("{prefix}{hex}.json"))
    }

    /// Makes the directory (0700), each level checked to be root's alone.
    fn ensure(&self) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.dir())?;
        for level in self.levels() {
            record::check_private_dir(&level).map_err(std::io::Error::other)?;
        }
        Ok(())
    }

    fn levels(&self) -> [PathBuf; 3] {
        [record::run_dir(), record::run_dir().join("csi"), self.dir()]
    }

    /// Writes `value` as the record at `path` (atomically: a new file,
    /// synced, renamed over the old).
    pub fn save<T: Serialize>(&self, path: &Path, value: &T) -> std::io::Result<()> {
        self.ensure()?;
        let tmp = path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = record::create_private(&tmp, false)?;
        f.write_all(
            serde_json::to_string_pretty(value)
                .expect("serialisable")
                .as_bytes(),
        )?;
        f.sync_all()?;
        std::fs::rename(tmp, path)
    }

    /// The record at `path`, if it is there and reads as a `T`.
    pub fn read<T: DeserializeOwned>(&self, path: &Path) -> Option<T> {
        let text = record::read_private(path, MAX_BYTES)?;
        serde_json::from_str(&text).ok()
    }

    /// Removes the record at `path`; `what` names it in a warning.
    pub fn remove(&self, path: &Path, what: &Path) {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("cannot remove the record of {}: {e}", what.display()),
        }
    }

    /// The records whose file name starts with `prefix`, when the directory
    /// is there and root's alone at every level (nothing is made for a
    /// reader).
    pub fn all<T: DeserializeOwned>(&self, prefix: &str) -> Vec<T> {
        let private = self
            .levels()
            .iter()
            .all(|level| level.is_dir() && record::check_private_dir(level).is_ok());
        if !private {
            return Vec::new();
        }
        let Ok(entries) = std::fs::read_dir(self.dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .filter_map(|e| self.read(&e.path()))
            .collect()
    }
}
