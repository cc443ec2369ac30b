//! Growing a mounted drive, on the control socket's `resize SIZE` command.
//!
//! The blob goes through the same steps as an offline resize (`crate::resize`),
//! but under the daemon's own lease, with the old footer's clear fenced like
//! every write of the mount; the length is set while write-back is paused, so
//! that it can be made conditional on the blob as it is. Only once the blob is
//! complete does each layer above learn the new size, bottom up: the cache, the
//! FUSE file `disk`, the loop device, the filesystem. Nothing is unmounted and
//! I/O goes on throughout. A failure part way is reported with what grew, and
//! running the same resize again finishes it (every step can be done again).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::info;

use super::Mounted;
use crate::drive::DriveError;
use crate::mount::MountError;
use crate::resize::{self, Plan, Step, STEPS};
use crate::size::human;

/// What a resize under way is doing, for the progress lines its client hears
/// (a large filesystem takes minutes to grow, and a flush under way is waited
/// for first).
pub(super) type Phase = Arc<Mutex<&'static str>>;

fn set(phase: &Phase, what: &'static str) {
    *phase.lock().unwrap_or_else(|p| p.into_inner()) = what;
}

/// What each step does, as a progress line says it.
fn doing(step: Step) -> &'static str {
    match step {
        Step::Mark => "marking the resize on the blob",
        Step::Grow => "setting the blob's length (once write-back has paused)",
        Step::Footer => "writing the footer for the new size",
        Step::ClearOld => "clearing the old footer",
        Step::Unmark => "removing the resize's mark",
    }
}

impl Mounted {
    /// Grows the drive to a disk of `size` bytes, keeping `phase` up to date;
    /// says what grew.
    pub(super) fn resize(&mut self, size: u64, phase: &Phase) -> Result<String, MountError> {
        if self.req.read_only {
            return Err(MountError::system(format!(
                "the mount at {} is read-only: resize the drive where it is mounted writable, or while it is not mounted",
                self.req.mountpoint.display()
            )));
        }
        let (Some(cache), Some(lease)) = (self.cache.clone(), self.lease.clone()) else {
            return Err(MountError::system("the drive is not set up"));
        };
        if cache.is_fenced() {
            return Err(MountError::system(format!(
                "the lease on {} was lost: nothing is written to it any more",
                self.target
            )));
        }
        if self.fs.as_ref().is_some_and(|f| f.fstype == "ext4")
            && !self.root.can_grow_mounted_ext4()
        {
            // Refused before anything changes: the blob and the device would
            // grow, the filesystem not.
            let mp = self.req.mountpoint.display();
            return Err(MountError::system(format!(
                "growing a mounted ext4 filesystem needs the capability CAP_SYS_RESOURCE, which this daemon does not have (a container that drops it?); nothing was changed. Grow it unmounted instead: `blobdrive unmount {mp}`, `blobdrive resize {} --size {}MiB`, then mount it again, which grows the filesystem to fill the disk",
                self.target,
                size >> 20
            )));
        }
        // An encrypted drive serves its data segment: the disk less its header.
        let before = cache.size() + cache.backend().data_offset();
        if size < before {
            return Err(DriveError::Shrink {
                target: self.target.clone(),
                from: before,
                to: size,
            }
            .into());
        }
        let from = match self.rt.block_on(resize::plan(&self.blob, size))? {
            Plan::Unchanged(_) => before,
            Plan::Grow(growth) => {
                let fence = cache.backend().remote().write_fence();
                for step in STEPS {
                    set(phase, doing(step));
                    let run = || {
                        self.rt
                            .block_on(growth.run(&self.blob, step, &lease, &fence))
                    };
                    match step {
                        Step::Grow => cache.with_writeback_paused(run)?,
                        _ => run()?,
                    }
                }
                info!(
                    "{}: the blob grew from {} to {} bytes of disk",
                    self.target, growth.from, size
                );
                growth.from
            }
        };
        let served = self.encryption.as_ref().map_or(size, |e| e.served(size));
        cache.grow(served);
        let grown = self.grow_layers(served, phase).map_err(|e| {
            MountError::system(format!(
                "{} grew to {}, but {e}; run the same resize again to finish",
                self.target,
                human(size)
            ))
        })?;
        let what = if from == size {
            format!("{} was already {}", self.target, human(size))
        } else {
            format!(
                "grew {} from {} to {}",
                self.target,
                human(from),
                human(size)
            )
        };
        info!("{what}: {grown}");
        Ok(format!("{what}; {grown}"))
    }

    /// Gets the new size through every layer above the cache; says what they hold.
    fn grow_layers(&self, size: u64, phase: &Phase) -> Result<String, MountError> {
        set(phase, "giving the disk file its new size");
        let disk = self.fuse_dir.join("disk");
        // The FUSE mount lets root alone in: the root part looks.
        let disk_len = || self.root.disk_size().unwrap_or(0);
        if let Some(s) = &self.session {
            // Not cached by the kernel (never looked up) is fine too.
            let _ = crate::fuse::forget_disk_attrs(s);
        }
        // A kernel that ignored the notice drops the old size within the
        // attribute timeout (1 s).
        let mut len = disk_len();
        for _ in 0..3 {
            if len == size {
                break;
            }
            std::thread::sleep(Duration::from_millis(600));
            len = disk_len();
        }
        if len != size {
            return Err(MountError::system(format!(
                "{} still shows {len} bytes",
                disk.display()
            )));
        }
        let Some(dev) = self.loop_dev.as_ref().map(|l| &l.dev) else {
            return Ok(format!("{} is {} bytes", disk.display(), size));
        };
        set(phase, "giving the loop device its new size");
        let dev_len = self.root.loop_capacity()?;
        if dev_len != size {
            return Err(MountError::system(format!(
                "{dev} still has {dev_len} bytes after taking the new capacity"
            )));
        }
        let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.as_str()) else {
            return Ok(format!(
                "{dev} is {size} bytes: grow what is on it yourself (resize2fs, xfs_growfs, growpart)"
            ));
        };
        let mp = &self.req.mountpoint;
        set(phase, "growing the filesystem to fill the disk");
        let now = self
            .root
            .grow_fs()
            .map(|n| (n > 0).then_some(n))
            .map_err(|e| {
                MountError::with_source(format!("growing the {fstype} filesystem failed"), e)
            })?;
        // XFS writes its secondary superblocks after the grow's own commit and
        // flushes nothing after them: until the next flush a crash left a
        // primary superblock the others disagree with (the kernel mounts it,
        // xfs_repair finds the superblocks in conflict and, with none of the
        // others written, would undo the grow). Once the resize has returned,
        // the grown filesystem is whole on the blob.
        set(phase, "writing the grown filesystem to the blob");
        if let Some(cache) = &self.cache {
            cache.flush().map_err(|e| {
                MountError::Data(format!("cannot write the grown {fstype} filesystem: {e}"))
            })?;
        }
        Ok(format!(
            "the {fstype} filesystem at {} grew to {}",
            mp.display(),
            now.map_or_else(|| "?".to_string(), human)
        ))
    }
}
