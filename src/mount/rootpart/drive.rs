//! The worker's requests about its drive below FUSE: the FUSE mount itself,
//! the loop device over `disk`, and the filesystem on it. Each call that
//! touches the worker's files (the kernel waits on the worker's FUSE answers
//! for it) is an errand (`errand.rs`), its result applied to the root part's
//! account when it ends; the rest (sysfs, the mount table) is answered at
//! once. And what the root part takes down itself once the worker died.

use std::time::Instant;

use tracing::{error, info, warn};

use super::channel::{Answer, Request};
use super::errand::Finish;
use super::server::RootPart;
use crate::mount::system::filesystem::{self, Small};
use crate::mount::system::{self, LoopDevice};
use crate::mount::{Mode, MountError};

/// A failure as the worker hears it: busy stays busy.
fn failed(e: MountError) -> Answer {
    match e {
        MountError::Busy(what) => Answer::Busy(what),
        e => Answer::Failed(e.to_string()),
    }
}

/// The finish of an errand that changes nothing in the root part's account.
fn answer_only(answer: Answer) -> Finish {
    Box::new(move |_: &mut RootPart| answer)
}

impl RootPart {
    /// The requests about FUSE, the loop device and the filesystem.
    pub(super) fn carry_out_on_drive(&mut self, req: Request) -> Answer {
        match req {
            Request::UmountFuse { lazy } => self.umount_fuse(req, lazy),
            Request::AttachLoop {}
            | Request::LoopAttached {}
            | Request::LoopCapacity {}
            | Request::DiskSize {}
            | Request::DetachLoop {} => self.carry_out_for_loop(req),
            _ => self.carry_out_for_fs(req),
        }
    }

    fn umount_fuse(&mut self, req: Request, lazy: bool) -> Answer {
        if !self.fuse_mounted {
            return Answer::Done;
        }
        let dir = self.fuse_dir.clone();
        self.on_errand(req, move || {
            let done = system::umount(&dir, lazy);
            Box::new(move |root: &mut RootPart| match done {
                Ok(()) => {
                    root.fuse_mounted = false;
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    /// The requests about the loop device over `disk` (block mode) and the
    /// size of `disk`.
    fn carry_out_for_loop(&mut self, req: Request) -> Answer {
        let disk = self.fuse_dir.join("disk");
        match req {
            Request::AttachLoop {} => {
                if !self.fuse_mounted {
                    return Answer::Failed("the FUSE mount is gone".into());
                }
                if self.loop_dev.is_some() {
                    return Answer::Failed("a loop device is attached already".into());
                }
                let read_only = self.req.read_only;
                self.on_errand(req, move || {
                    let attached = LoopDevice::attach_for_network(&disk, read_only);
                    Box::new(move |root: &mut RootPart| match attached {
                        Ok(dev) => {
                            root.adopt_loop(&dev);
                            Answer::Device(dev.path().to_string())
                        }
                        Err(e) => Answer::Failed(e.to_string()),
                    })
                })
            }
            Request::LoopAttached {} => Answer::Attached(self.attached_loop().is_some()),
            Request::LoopCapacity {} => {
                let Some(dev) = self.attached_loop().cloned() else {
                    return Answer::Failed("no loop device is attached".into());
                };
                self.on_errand(req, move || {
                    answer_only(match dev.take_new_capacity() {
                        Ok(n) => Answer::Size(n),
                        Err(e) => Answer::Failed(e.to_string()),
                    })
                })
            }
            Request::DiskSize {} => {
                if !self.fuse_mounted {
                    return Answer::Failed("the FUSE mount is gone".into());
                }
                self.on_errand(req, move || {
                    answer_only(match std::fs::metadata(&disk) {
                        Ok(m) => Answer::Size(m.len()),
                        Err(e) => Answer::Failed(format!("cannot stat {}: {e}", disk.display())),
                    })
                })
            }
            Request::DetachLoop {} => {
                let Some(dev) = self.attached_loop().cloned() else {
                    return Answer::Done;
                };
                self.on_errand(req, move || {
                    let done = dev.detach();
                    Box::new(move |root: &mut RootPart| match done {
                        Ok(()) => {
                            info!("detached {dev}");
                            root.loop_dev = None;
                            Answer::Done
                        }
                        Err(e) => failed(e),
                    })
                })
            }
            other => Answer::Refused(format!("not a loop device request: {other:?}")),
        }
    }

    /// The requests about the filesystem on the loop device (fs mode).
    fn carry_out_for_fs(&mut self, req: Request) -> Answer {
        if self.req.mode != Mode::Fs {
            return Answer::Refused(format!("not a request of --mode {}", self.req.mode));
        }
        if let Request::CanGrowMountedExt4 {} = req {
            return Answer::Flag(system::has_capability(system::CAP_SYS_RESOURCE));
        }
        let Some(dev) = self.attached_loop().cloned() else {
            return Answer::Failed("no loop device is attached".into());
        };
        match req {
            Request::PrepareFs { zeroed } => self.prepare_fs(req, dev, zeroed),
            Request::MountFs { small } => self.mount_fs(req, dev, small),
            Request::LoopMounted {} => match self.mount_table.loop_mounted(&dev) {
                Some(yes) => Answer::Flag(yes),
                None => Answer::Failed(format!("cannot tell whether {dev} is mounted")),
            },
            Request::UmountFs { lazy } => {
                if !self.fs_mounted {
                    return Answer::Done;
                }
                let mp = self.req.mountpoint.clone();
                self.on_errand(req, move || {
                    let done = system::umount(&mp, lazy);
                    Box::new(move |root: &mut RootPart| match done {
                        Ok(()) => {
                            root.fs_mounted = false;
                            Answer::Done
                        }
                        Err(e) => failed(e),
                    })
                })
            }
            Request::Freeze {} => self.freeze(req, dev),
            Request::Thaw {} => self.thaw(req),
            Request::GrowFs {} => {
                let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.clone()) else {
                    return Answer::Failed("no filesystem is mounted".into());
                };
                if !self.fs_mounted {
                    return Answer::Failed("no filesystem is mounted".into());
                }
                let mp = self.req.mountpoint.clone();
                self.on_errand(req, move || {
                    answer_only(match system::grow_fs(&dev, &fstype, &mp) {
                        Ok(()) => Answer::Size(system::fs_size(&mp).unwrap_or(0)),
                        Err(e) => failed(e),
                    })
                })
            }
            other => Answer::Refused(format!("not a filesystem request: {other:?}")),
        }
    }

    fn prepare_fs(&mut self, req: Request, dev: LoopDevice, zeroed: bool) -> Answer {
        if self.fs_mounted {
            return Answer::Refused("the filesystem is mounted already".into());
        }
        let mount_req = self.req.clone();
        self.on_errand(req, move || {
            let prepared = filesystem::prepare(&dev, &mount_req, zeroed);
            Box::new(move |root: &mut RootPart| match prepared {
                Ok(p) => {
                    root.fs = Some(p.clone());
                    Answer::Prepared {
                        fstype: p.fstype,
                        formatted: p.formatted,
                        warnings: p.warnings,
                    }
                }
                Err(e) => failed(e),
            })
        })
    }

    fn mount_fs(&mut self, req: Request, dev: LoopDevice, small: Option<(u64, u64)>) -> Answer {
        let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.clone()) else {
            return Answer::Refused("no filesystem was prepared".into());
        };
        if self.fs_mounted {
            return Answer::Refused("the filesystem is mounted already".into());
        }
        let small = small.map(|(bytes, disk)| Small { bytes, disk });
        let mount_req = self.req.clone();
        self.on_errand(req, move || {
            let mounted = filesystem::mount(&dev, &fstype, &mount_req, small);
            Box::new(move |root: &mut RootPart| match mounted {
                Ok(done) => {
                    root.fs_mounted = true;
                    Answer::MountedFs {
                        autoclear: done.autoclear,
                        notes: done.notes,
                        warnings: done.warnings,
                    }
                }
                Err(e) => failed(e),
            })
        })
    }

    /// Freezes the filesystem for a snapshot, to be thawed by the worker's
    /// `Thaw`, or by the root part once `freeze_limit` passed without one.
    fn freeze(&mut self, req: Request, dev: LoopDevice) -> Answer {
        if !self.fs_mounted || self.frozen.is_some() {
            return Answer::Refused("not a mounted filesystem that is not frozen".into());
        }
        let mp = self.req.mountpoint.clone();
        let limit = self.req.io.freeze_limit;
        self.on_errand(req, move || {
            let frozen = system::freeze(&mp, &dev);
            Box::new(move |root: &mut RootPart| match frozen {
                Ok(f) => {
                    root.frozen = Some(f);
                    root.thaw_by = Some(Instant::now() + limit);
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    fn thaw(&mut self, req: Request) -> Answer {
        if self.errand.is_some() {
            // (Refused by `on_errand`, but the descriptor must stay ours.)
            return self.on_errand(req, || answer_only(Answer::Done));
        }
        let Some(f) = self.frozen.take() else {
            return Answer::Done;
        };
        self.on_errand(req, move || {
            let thawed = system::thaw(&f);
            Box::new(move |root: &mut RootPart| match thawed {
                Ok(()) => {
                    root.thaw_by = None;
                    Answer::Done
                }
                Err(e) => {
                    // Still frozen: the root part's thaw comes when it is due.
                    root.frozen = Some(f);
                    failed(e)
                }
            })
        })
    }

    /// Thaws the filesystem a snapshot froze (the worker died before it asked).
    pub(super) fn thaw_if_frozen(&mut self) {
        self.thaw_by = None;
        if let Some(f) = self.frozen.take() {
            match system::thaw(&f) {
                Ok(()) => info!("thawed {}", self.req.mountpoint.display()),
                Err(e) => error!("could not thaw {}: {e}", self.req.mountpoint.display()),
            }
        }
    }

    /// Unmounts the filesystem after its worker died: lazily when busy (its
    /// files are gone with the drive either way).
    pub(super) fn take_fs_down(&mut self) {
        let mp = self.req.mountpoint.clone();
        if let Err(e) = system::umount(&mp, false) {
            warn!(
                "{} is busy ({e}): detaching it lazily; its files are gone with the drive",
                mp.display()
            );
            if let Err(e) = system::umount(&mp, true) {
                error!("cannot detach {}: {e}", mp.display());
                return;
            }
        }
        self.fs_mounted = false;
    }
}
