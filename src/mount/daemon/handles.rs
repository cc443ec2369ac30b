//! What setup has done, one handle per step that teardown must undo. A step's
//! handle is `Some` on `Mounted` exactly while its effect is in place; teardown
//! undoes each explicitly (not in `Drop`: a busy filesystem must be able to
//! refuse, leaving everything as it was).

use std::path::{Path, PathBuf};

use tracing::warn;

use crate::mount::record;
use crate::mount::system::LoopDevice;
use crate::mount::utab;

/// The mount record this daemon created (exclusively, so no other daemon serves
/// the mountpoint): removed at the end, with a note of what was lost, if any.
#[derive(Debug)]
pub(super) struct RecordClaim {
    pub id: String,
}

impl RecordClaim {
    /// Removes the record; `losses` (not empty) are left for `blobdrive unmount`.
    pub fn release(self, losses: &[String]) {
        if !losses.is_empty() {
            if let Err(e) = record::write_outcome(&self.id, &losses.join("; ")) {
                warn!("could not leave a note of what was lost for `blobdrive unmount`: {e}");
            }
        }
        record::remove(&self.id);
    }
}

/// The FUSE directory this daemon made (fs mode, in the run directory).
#[derive(Debug)]
pub(super) struct MadeDir(pub PathBuf);

impl MadeDir {
    pub fn remove(self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The loop device attached over the FUSE file `disk`.
#[derive(Debug)]
pub(super) struct AttachedLoop {
    pub dev: LoopDevice,
    /// Its backing file as the kernel named it right after attaching: when
    /// sysfs stops saying so, the device was detached.
    pub backing: Option<PathBuf>,
    /// It detaches itself when the filesystem's last mount goes (a plain
    /// `umount`): then the daemon stops by itself.
    pub autoclear: bool,
}

/// The filesystem mounted at the user's mountpoint (fs mode).
#[derive(Debug)]
pub(super) struct FsMount {
    /// ext4 or xfs: grown in place with the drive.
    pub fstype: String,
}

/// libmount's table names `umount.blobdrive` for the mount at the user's
/// directory (see `mount::utab`).
#[derive(Debug)]
pub(super) struct UtabEntry(pub PathBuf);

impl UtabEntry {
    pub fn add(mountpoint: &Path) -> Result<UtabEntry, String> {
        utab::add(mountpoint).map(|()| UtabEntry(mountpoint.to_path_buf()))
    }

    pub fn remove(self) {
        if let Err(e) = utab::remove(&self.0) {
            warn!("{e}");
        }
    }
}
