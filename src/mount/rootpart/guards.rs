//! What the root part has put in place and answers for, each held as a guard
//! that undoes it when dropped: the mount's record claimed, the FUSE directory
//! made, FUSE mounted, the loop device attached, the filesystem mounted and
//! frozen, libmount's entry added.
//!
//! Teardown is dropping what is held ([`InPlace`]: its fields drop in the order
//! they are declared), so a resource that gets a guard is undone on every path
//! that ends the mount, and one added later cannot be left out of one of them.
//! What is undone another way (a request of the worker's carried out, or a
//! loop device that let go by itself) is taken out of its guard with
//! [`Guard::done`], and so is never undone twice.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::time::Instant;

use tracing::{error, info, warn};

use crate::mount::system::{self, Binding, LoopDevice, MountId, Now};
use crate::mount::{record, utab};

/// Something put in place, and how it is undone.
pub(super) trait Undo {
    fn undo(self);
}

/// Holds a thing put in place and undoes it when dropped, unless it was taken
/// out with [`Guard::done`].
pub(super) struct Guard<T: Undo> {
    thing: Option<T>,
    /// The process that put it in place. The root part forks the worker while
    /// it holds some; the child's copies are dropped with the rest of the root
    /// part's state and must undo nothing.
    owner: u32,
}

impl<T: Undo> Guard<T> {
    pub fn new(thing: T) -> Guard<T> {
        Guard {
            thing: Some(thing),
            owner: std::process::id(),
        }
    }

    /// The thing, no longer to be undone by this guard: it was undone another
    /// way, or is handed on (and given a guard again if it is still in place).
    pub fn done(mut self) -> T {
        self.thing
            .take()
            .expect("a guard holds its thing until done")
    }
}

/// Takes the thing in `slot` out of its guard: it was undone another way.
pub(super) fn undone<T: Undo>(slot: &mut Option<Guard<T>>) -> Option<T> {
    slot.take().map(Guard::done)
}

impl<T: Undo> Deref for Guard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.thing
            .as_ref()
            .expect("a guard holds its thing until done")
    }
}

impl<T: Undo> DerefMut for Guard<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.thing
            .as_mut()
            .expect("a guard holds its thing until done")
    }
}

impl<T: Undo> Drop for Guard<T> {
    fn drop(&mut self) {
        if let Some(thing) = self.thing.take() {
            if std::process::id() == self.owner {
                thing.undo();
            }
        }
    }
}

/// Everything the root part holds. The fields are declared in the order they
/// are undone: the reverse of the order they are put in place, what needs the
/// drive first (a frozen filesystem is thawed before anything else, as every
/// writer to it waits), and last what tells others of the mount (libmount's
/// entry, then the record), so that while the rest comes down `blobdrive
/// list`, `unmount` and umount(8) still find it.
#[derive(Default)]
pub(super) struct InPlace {
    pub frozen: Option<Guard<Frozen>>,
    pub fs: Option<Guard<FsMount>>,
    pub loop_dev: Option<Guard<LoopOverDisk>>,
    pub fuse: Option<Guard<FuseMount>>,
    pub dir: Option<Guard<MadeDir>>,
    pub utab: Option<Guard<UtabEntry>>,
    pub record: Option<Guard<ClaimedRecord>>,
}

/// The filesystem frozen for a snapshot: the descriptor it is thawed on.
pub(super) struct Frozen {
    pub file: std::fs::File,
    pub mountpoint: PathBuf,
    /// When the root part thaws it if the worker has not: `None` once a thaw
    /// by the root part failed (it is not tried again before the end).
    pub thaw_by: Option<Instant>,
}

impl Undo for Frozen {
    fn undo(self) {
        match system::thaw(&self.file) {
            Ok(()) => info!("thawed {}", self.mountpoint.display()),
            Err(e) => error!("could not thaw {}: {e}", self.mountpoint.display()),
        }
    }
}

/// The filesystem on the loop device, mounted at the mount's directory.
pub(super) struct FsMount {
    pub mountpoint: PathBuf,
}

impl Undo for FsMount {
    /// Unmounts it after its worker died: lazily when busy (its files are gone
    /// with the drive either way).
    fn undo(self) {
        let mp = &self.mountpoint;
        if let Err(e) = system::umount(mp, false) {
            warn!(
                "{} is busy ({e}): detaching it lazily; its files are gone with the drive",
                mp.display()
            );
            if let Err(e) = system::umount(mp, true) {
                error!("cannot detach {}: {e}", mp.display());
            }
        }
    }
}

/// The loop device attached over `disk`, and the attachment root made: while
/// the device still serves it (by the kernel's numbers, see
/// `system::loopdev`), the device is this mount's.
#[derive(Clone)]
pub(super) struct LoopOverDisk {
    pub dev: LoopDevice,
    pub binding: Binding,
}

impl LoopOverDisk {
    /// Detaches it from `disk`, if it still serves this mount.
    pub fn detach(&self) -> Result<(), crate::mount::MountError> {
        self.dev.detach(&self.binding)
    }

    /// It let go of `disk` by itself (autoclear, once the filesystem on it
    /// was unmounted), as the kernel says without waiting on anyone: it is no
    /// longer this mount's to detach, and its writeback settings are put
    /// back. `false` also when that cannot be told.
    pub fn let_go(&self) -> bool {
        if self.dev.serves_now(&self.binding) == Now::Gone {
            self.went_by_itself();
            return true;
        }
        false
    }

    /// What is done once the kernel said it let go by itself: said so, and
    /// its writeback settings put back.
    pub fn went_by_itself(&self) {
        info!("{} let go of the drive by itself", self.dev);
        self.dev.released();
    }
}

impl Undo for LoopOverDisk {
    fn undo(self) {
        if self.let_go() {
            return;
        }
        match self.detach() {
            Ok(()) => info!("detached {}", self.dev),
            Err(e) => error!("{e}"),
        }
    }
}

/// FUSE mounted at the FUSE directory by this root part, known by the
/// kernel's numbers for it.
pub(super) struct FuseMount {
    pub dir: PathBuf,
    pub id: MountId,
}

impl Undo for FuseMount {
    /// Unmounts it while it is still the mount at its directory, lazily when
    /// busy: whatever holds it sees the drive gone.
    fn undo(self) {
        if let Err(e) = system::umount_fuse(&self.dir, &self.id, false) {
            warn!("{e}: detaching it lazily");
            if let Err(e) = system::umount_fuse(&self.dir, &self.id, true) {
                error!("cannot detach {}: {e}", self.dir.display());
            }
        }
    }
}

/// The FUSE directory, made by this root part (fs mode: in the run directory).
pub(super) struct MadeDir(pub PathBuf);

impl Undo for MadeDir {
    fn undo(self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// libmount's entry for the mountpoint.
pub(super) struct UtabEntry(pub PathBuf);

impl Undo for UtabEntry {
    fn undo(self) {
        if let Err(e) = utab::remove(&self.0) {
            warn!("{e}");
        }
    }
}

/// The mount's record, this mount's (created exclusively).
pub(super) struct ClaimedRecord {
    pub id: String,
    /// What was lost, left with the record's end for `blobdrive unmount`.
    pub note: Option<String>,
}

impl Undo for ClaimedRecord {
    fn undo(self) {
        if let Some(lost) = &self.note {
            if let Err(e) = record::write_outcome(&self.id, lost) {
                warn!("could not leave a note of what was lost for `blobdrive unmount`: {e}");
            }
        }
        record::remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Undoing it writes its name down.
    struct Step(&'static str, Arc<Mutex<Vec<&'static str>>>);

    impl Undo for Step {
        fn undo(self) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    #[test]
    fn a_guard_undoes_once_when_dropped_and_not_when_done_or_in_another_process() {
        let undone = Arc::new(Mutex::new(Vec::new()));
        drop(Guard::new(Step("dropped", undone.clone())));
        let kept = Guard::new(Step("done", undone.clone())).done();
        assert_eq!(kept.0, "done");
        drop(kept);
        let mut forked = Guard::new(Step("forked", undone.clone()));
        forked.owner += 1;
        drop(forked);
        assert_eq!(*undone.lock().unwrap(), ["dropped"]);
    }

    #[test]
    fn a_made_directory_is_removed_when_its_guard_drops_and_kept_when_done() {
        let tmp = tempfile::tempdir().unwrap();
        let (gone, kept) = (tmp.path().join("gone"), tmp.path().join("kept"));
        std::fs::create_dir(&gone).unwrap();
        std::fs::create_dir(&kept).unwrap();
        let mut held = InPlace {
            dir: Some(Guard::new(MadeDir(gone.clone()))),
            ..InPlace::default()
        };
        let _ = Guard::new(MadeDir(kept.clone())).done();
        undone(&mut held.dir);
        assert!(gone.is_dir(), "taken out with done: not undone");
        held.dir = Some(Guard::new(MadeDir(gone.clone())));
        drop(held);
        assert!(!gone.exists() && kept.is_dir());
    }
}
