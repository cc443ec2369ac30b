//! The filesystem of an fs-mode mount, from the loop device to the user's
//! directory: found (or made, with `--mkfs`), grown to fill its disk when the
//! drive grew while it was not mounted, mounted, and the loop device set to go
//! with it. The root part of a mount does this on its worker's requests; each
//! step is one call here, so the steps are the same in every daemon.

use tracing::{info, warn};

use super::{
    fs_type, grow_ext4_unmounted, grow_fs, mkfs, mount_fs, open_dir, set_autoclear, Pinned,
};
use crate::mount::{hardened_fs_flags, MountError, MountRequest, MOUNTABLE_FS};
use crate::size::human;
use crate::words::article;

/// The filesystem found on the device, or made on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    pub fstype: String,
    /// It was made now (`--mkfs` on a blank disk).
    pub formatted: bool,
    pub warnings: Vec<String>,
}

/// What mounting it did besides mounting it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountedFs {
    /// The loop device detaches itself when the filesystem is unmounted.
    pub autoclear: bool,
    /// What was done that the user should hear of (a filesystem grown).
    pub notes: Vec<String>,
    pub warnings: Vec<String>,
}

/// The filesystem on `dev`, made first if it is blank and the mount asked for
/// one (`--mkfs`); refused unless it is one blobdrive mounts. `zeroed`: no
/// byte of the drive was ever written (see [`mkfs`]): its page list says so
/// and its first and last MiB, read from the service, are zeros. A drive
/// that is not is never formatted, whatever blkid finds on it or not.
pub fn prepare(dev: &Pinned, req: &MountRequest, zeroed: bool) -> Result<Prepared, MountError> {
    let mut out = Prepared::default();
    let t = match (fs_type(dev)?, req.mkfs.as_deref()) {
        // What mkfs asks for is there already: it formats only a blank disk,
        // so an fstab line keeps it for good, and every later mount (every
        // boot) finds the filesystem it made. Nothing to say.
        (Some(t), Some(wanted)) if t == wanted => t,
        (Some(t), Some(wanted)) => {
            let w = format!("the disk already holds {} {t} filesystem, not the {wanted} that mkfs asks for: it is mounted as it is, and nothing was formatted", article(&t));
            warn!("{w}");
            out.warnings.push(w);
            t
        }
        (Some(t), None) => t,
        (None, Some(wanted)) => {
            if req.read_only {
                return Err(MountError::system("--mkfs needs a writable mount"));
            }
            if !zeroed {
                return Err(MountError::system(format!(
                    "refusing --mkfs on {}: data was written to it, and blkid finds no filesystem on it; --mkfs formats only an empty drive, and nothing was formatted",
                    req.blob
                )));
            }
            mkfs(dev, wanted)?;
            out.formatted = true;
            wanted.to_string()
        }
        (None, None) => {
            return Err(MountError::system(format!(
                "{} holds no filesystem: add --mkfs ext4 (or xfs) to create one, or use --mode block or --mode raw",
                req.blob
            )))
        }
    };
    if !MOUNTABLE_FS.contains(&t.as_str()) {
        // Checked before anything mounts it (no journal replay, nothing written).
        return Err(MountError::system(format!(
            "{} holds {} {t} filesystem; blobdrive mounts only ext4 and xfs (use --mode block for the device)",
            req.blob,
            article(&t)
        )));
    }
    out.fstype = t;
    Ok(out)
}

/// A filesystem smaller than its disk, to be grown as it is mounted.
#[derive(Debug, Clone, Copy)]
pub struct Small {
    /// Its size as its superblock says.
    pub bytes: u64,
    /// The disk's.
    pub disk: u64,
}

/// Mounts the filesystem `fstype` of `dev` at the user's directory (checked to
/// be the one the mount was asked for), growing it first when it is `small`
/// (ext4 before it is mounted, xfs once it is), then sets the device to detach
/// itself when the filesystem is unmounted: a plain `umount` is the daemon's
/// cue to write back and stop.
pub fn mount(
    dev: &Pinned,
    fstype: &str,
    req: &MountRequest,
    small: Option<Small>,
) -> Result<MountedFs, MountError> {
    let before = small.and_then(|s| fit_to_disk(dev, fstype, s, req, false));
    let at = open_dir(&req.mountpoint, req.mountpoint_id)?;
    mount_fs(
        dev,
        &at,
        fstype,
        req.read_only,
        &hardened_fs_flags(&req.fs_flags),
    )?;
    let mut out = MountedFs::default();
    match set_autoclear(&dev.file) {
        Ok(()) => out.autoclear = true,
        Err(e) => {
            let w = format!("cannot set autoclear on {}: {e}: a plain umount of {} will leave the daemon running; take the drive down with `blobdrive unmount`", dev, req.mountpoint.display());
            warn!("{w}");
            out.warnings.push(w);
        }
    }
    let after = small.and_then(|s| fit_to_disk(dev, fstype, s, req, true));
    for said in [before, after].into_iter().flatten() {
        match said {
            Ok(note) => out.notes.push(note),
            Err(w) => out.warnings.push(w),
        }
    }
    Ok(out)
}

/// Grows a filesystem smaller than its disk (the drive grew while it was not
/// mounted) where it can be: ext4 before it is mounted, xfs once it is
/// (`mounted` says which call this is; the other does nothing). `Ok` says what
/// was done, `Err` why not and the one step that does it.
fn fit_to_disk(
    dev: &Pinned,
    fstype: &str,
    small: Small,
    req: &MountRequest,
    mounted: bool,
) -> Option<Result<String, String>> {
    if mounted != (fstype == "xfs") {
        return None;
    }
    let said = |verb: &str| {
        format!(
            "the {fstype} filesystem {verb} {} on a {} disk (the drive grew while it was not mounted)",
            human(small.bytes),
            human(small.disk)
        )
    };
    let what = said("was");
    let by_hand = match fstype {
        "xfs" => format!("xfs_growfs -d {}", req.mountpoint.display()),
        _ => "e2fsck -f, then resize2fs, on the device of a --mode block mount".to_string(),
    };
    if req.read_only {
        return Some(Err(format!(
            "{}: a writable mount grows it to fill the disk",
            said("is")
        )));
    }
    let grown = match fstype {
        "ext4" => grow_ext4_unmounted(dev),
        other => grow_fs(dev, other, &req.mountpoint),
    };
    Some(match grown {
        Ok(()) => {
            info!("{what}: grew it to fill the disk");
            Ok(format!("{what}: grew it to fill the disk"))
        }
        Err(e) => Err(format!("{what}; growing it failed ({e}): {by_hand}")),
    })
}
