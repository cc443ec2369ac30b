//! What setup has done, one handle per step that teardown must undo. A step's
//! handle is `Some` on `Mounted` exactly while its effect is in place; teardown
//! undoes each explicitly (not in `Drop`: a busy filesystem must be able to
//! refuse, leaving everything as it was). The root part keeps its own account
//! of the same steps, to undo them when the worker dies.

/// The loop device the root part attached over the FUSE file `disk`.
#[derive(Debug)]
pub(super) struct AttachedLoop {
    /// Its path (`/dev/loopN`), for messages: the root part alone acts on it.
    pub dev: String,
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
