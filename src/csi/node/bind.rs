//! NodePublishVolume and NodeUnpublishVolume: a staged volume is published by
//! bind-mounting it (its filesystem, or its loop device's node for a block
//! volume) at the target path, through descriptors opened without following
//! a symlink (see `paths.rs`), and recorded (see `targets.rs`). Unpublishing
//! unmounts and removes only what the record says this driver mounted and made
//! there for that volume.

use std::os::fd::OwnedFd;
use std::path::Path;

use tonic::Status;

use super::stage::staged_at;
use super::{path_arg, NodeService};
use crate::csi::paths::{self, Found};
use crate::csi::proto::volume_capability::AccessType;
use crate::csi::proto::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest};
use crate::csi::targets::{self, Published};
use crate::csi::volume::{self, VolumeId};

fn internal(what: &str, path: &Path, e: std::io::Error) -> Status {
    Status::internal(format!("cannot {what} {}: {e}", path.display()))
}

/// Whether the bind mount `p` records is still there, at its target's root.
pub fn alive(p: &Published) -> bool {
    paths::open_path(&p.target, !p.block).is_ok_and(|fd| is_ours(&fd, p))
}

/// Whether `fd` is open on the root of the bind mount `p` records: that
/// mount, over that directory (or device node). A filesystem shut down after
/// I/O errors (xfs, its volume fenced) answers no stat, so there the mount
/// table says it instead: that mount, of that device, at its root.
fn is_ours(fd: &OwnedFd, p: &Published) -> bool {
    if !paths::mount_id(fd).is_ok_and(|m| m == p.mount_id) {
        return false;
    }
    match paths::id_of(fd) {
        Ok((dev, ino, _)) => (dev, ino) == p.root,
        Err(e) if e.raw_os_error() == Some(libc::EIO) && !p.block => {
            paths::mount_source(p.mount_id)
                .is_some_and(|(dev, root)| dev == p.root.0 && root == "/")
        }
        Err(_) => false,
    }
}

/// Whether a mount of this id is in this process's mount table.
fn mounted(mount_id: u64) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split(' ').next().and_then(|m| m.parse().ok()) == Some(mount_id))
    })
}

pub async fn publish(node: &NodeService, req: NodePublishVolumeRequest) -> Result<(), Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let staging = path_arg(&req.staging_target_path, "staging target path")?;
    let target = path_arg(&req.target_path, "target path")?;
    let Some(cap) = req.volume_capability else {
        return Err(Status::invalid_argument("a volume capability is required"));
    };
    let staging = paths::resolve_arg(&staging, "staging target path")?;
    let target = paths::resolve_arg(&target, "target path")?;
    let Some(staged) = staged_at(&staging) else {
        let id = VolumeId::known(&req.volume_id)?;
        node.volume_properties(&id).await?;
        return Err(Status::failed_precondition(format!(
            "volume {} is not staged at {}",
            req.volume_id,
            staging.display()
        )));
    };
    if staged.blob != req.volume_id {
        return Err(Status::failed_precondition(format!(
            "{} holds volume {}, not {}",
            staging.display(),
            staged.blob,
            req.volume_id
        )));
    }
    let asked = Published {
        volume_id: req.volume_id.clone(),
        target: target.clone(),
        staging: staging.clone(),
        read_only: req.readonly || volume::read_only(&cap),
        block: matches!(cap.access_type, Some(AccessType::Block(_))),
        mount_id: 0,
        root: (0, 0),
        made: None,
    };
    if let Some(p) = targets::at(&target) {
        if alive(&p) {
            let same = p.volume_id == asked.volume_id
                && p.read_only == asked.read_only
                && p.block == asked.block
                && p.staging == asked.staging;
            if same {
                return Ok(());
            }
            return Err(Status::already_exists(format!(
                "{} has volume {} published at it already ({}): unpublish it first",
                target.display(),
                p.volume_id,
                if p.read_only { "read-only" } else { "writable" }
            )));
        }
        targets::forget(&target);
    }
    if crate::mount::system::is_mountpoint(&target) {
        return Err(Status::already_exists(format!(
            "{} holds a mount this driver did not make",
            target.display()
        )));
    }
    let source = if asked.block {
        let dev = staged
            .device
            .clone()
            .ok_or_else(|| Status::failed_precondition("the staged volume has no block device"))?;
        std::path::PathBuf::from(dev)
    } else {
        staging.clone()
    };
    let from = paths::open_path(&source, !asked.block).map_err(|e| internal("open", &source, e))?;
    let published = bind_at(&from, asked)?;
    targets::save(&published).map_err(|e| internal("record the mount at", &target, e))?;
    tracing::info!(
        "published volume {} at {}",
        published.volume_id,
        target.display()
    );
    Ok(())
}

/// Makes the target (a directory, or a file for a block volume) unless it is
/// there, bind-mounts `from` on it and sets the mount's flags; what was done,
/// recorded in `p`.
fn bind_at(from: &OwnedFd, mut p: Published) -> Result<Published, Status> {
    let target = p.target.clone();
    let dir = !p.block;
    let id = match paths::found(&target) {
        Ok(Found::Nothing) => {
            let made = paths::make(&target, dir).map_err(|e| internal("make", &target, e))?;
            p.made = Some(made);
            made
        }
        Ok(Found::Dir(id)) if dir => id,
        Ok(Found::File(id)) if !dir => id,
        Ok(_) => {
            return Err(Status::invalid_argument(format!(
                "{} is not {} (a symlink there is not followed)",
                target.display(),
                if dir { "a directory" } else { "a file" }
            )))
        }
        Err(e) => return Err(internal("look at", &target, e)),
    };
    let undo = |p: &Published| {
        if let Some(made) = p.made {
            paths::unmake(&p.target, made);
        }
    };
    let at = match paths::open_path(&target, dir) {
        Ok(fd) if paths::id_of(&fd).is_ok_and(|(d, i, _)| (d, i) == id) => fd,
        _ => {
            undo(&p);
            return Err(Status::aborted(format!(
                "{} changed while it was being published at; try again",
                target.display()
            )));
        }
    };
    if let Err(e) = paths::bind(from, &at) {
        undo(&p);
        return Err(internal("bind-mount the volume at", &target, e));
    }
    let (dev, ino, _) = paths::id_of(from).map_err(|e| internal("check", &target, e))?;
    p.root = (dev, ino);
    let top = paths::open_path(&target, dir).map_err(|e| internal("open", &target, e))?;
    p.mount_id = paths::mount_id(&top).map_err(|e| internal("check", &target, e))?;
    let restricted = if is_ours(&top, &p) && p.mount_id != paths::mount_id(&at).unwrap_or(0) {
        paths::restrict(&top, p.read_only, p.block)
    } else {
        Err(std::io::Error::other(
            "the mount on top is not the one just made",
        ))
    };
    if let Err(e) = restricted {
        if is_ours(&top, &p) {
            let _ = paths::unmount(top, &target, dir);
        }
        undo(&p);
        return Err(internal("restrict the bind mount at", &target, e));
    }
    Ok(p)
}

pub fn unpublish(req: NodeUnpublishVolumeRequest) -> Result<(), Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let asked = path_arg(&req.target_path, "target path")?;
    let Some(target) = paths::resolve(&asked) else {
        return Ok(());
    };
    let Some(p) = targets::at(&target) else {
        // Nothing of this driver's is there: not this volume's to unpublish.
        return Ok(());
    };
    if p.volume_id != req.volume_id {
        tracing::warn!(
            "NodeUnpublishVolume of {} at {}: volume {} is published there, left as it is",
            req.volume_id,
            target.display(),
            p.volume_id
        );
        return Ok(());
    }
    match paths::open_path(&target, !p.block) {
        Ok(fd) if is_ours(&fd, &p) => {
            paths::unmount(fd, &target, !p.block).map_err(|e| internal("unmount", &target, e))?;
        }
        _ if mounted(p.mount_id) => {
            return Err(Status::failed_precondition(format!(
                "the bind mount of volume {} at {} is under another mount: not unmounting what is on top",
                p.volume_id,
                target.display()
            )))
        }
        _ => {}
    }
    if let Some(made) = p.made {
        paths::unmake(&target, made);
    }
    targets::forget(&target);
    Ok(())
}
