//! The worker's requests about the filesystem on the loop device (fs mode):
//! finding or making it, mounting it, whether it is still mounted, unmounting,
//! freezing and thawing it for a snapshot, growing it.

use std::os::fd::AsRawFd;
use std::time::Instant;

use super::channel::{Answer, Request};
use super::errand::{answer_only, failed};
use super::guards::{undone, Frozen, FsMount, Guard, LoopOverDisk};
use super::RootPart;
use crate::mount::system::filesystem::{self, Small};
use crate::mount::system::{self, LoopDevice};
use crate::mount::Mode;

impl RootPart {
    /// The requests about the filesystem on the loop device (fs mode).
    pub(super) fn carry_out_for_fs(&mut self, req: Request) -> Answer {
        if self.req.mode != Mode::Fs {
            return Answer::Refused(format!("not a request of --mode {}", self.req.mode));
        }
        if let Request::CanGrowMountedExt4 {} = req {
            return Answer::Flag(system::has_capability(system::CAP_SYS_RESOURCE));
        }
        let Some(l) = self.attached_loop() else {
            return Answer::Failed("no loop device is attached".into());
        };
        match req {
            Request::PrepareFs { zeroed } => self.prepare_fs(req, l, zeroed),
            Request::MountFs { small } => self.mount_fs(req, l, small),
            Request::LoopMounted {} => match self.mount_table.loop_mounted(&l.dev) {
                Some(yes) => Answer::Flag(yes),
                None => Answer::Failed(format!("cannot tell whether {} is mounted", l.dev)),
            },
            Request::UmountFs { lazy } => {
                if self.held.fs.is_none() {
                    return Answer::Done;
                }
                let mp = self.req.mountpoint.clone();
                self.on_errand(req, move || {
                    let done = system::umount(&mp, lazy);
                    Box::new(move |root: &mut RootPart| match done {
                        Ok(()) => {
                            undone(&mut root.held.fs);
                            Answer::Done
                        }
                        Err(e) => failed(e),
                    })
                })
            }
            Request::Freeze {} => self.freeze(req, l.dev),
            Request::Thaw {} => self.thaw(req),
            Request::GrowFs {} => {
                let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.clone()) else {
                    return Answer::Failed("no filesystem is mounted".into());
                };
                if self.held.fs.is_none() {
                    return Answer::Failed("no filesystem is mounted".into());
                }
                let mp = self.req.mountpoint.clone();
                self.on_errand(req, move || {
                    let grown = l
                        .dev
                        .pinned(&l.binding)
                        .and_then(|p| system::grow_fs(&p, &fstype, &mp));
                    answer_only(match grown {
                        Ok(()) => Answer::Size(system::fs_size(&mp).unwrap_or(0)),
                        Err(e) => failed(e),
                    })
                })
            }
            other => Answer::Refused(format!("not a filesystem request: {other:?}")),
        }
    }

    /// Finds (or makes) the filesystem on the device, held open while it
    /// still serves this mount: what is found is this mount's only while the
    /// same device is.
    fn prepare_fs(&mut self, req: Request, l: LoopOverDisk, zeroed: bool) -> Answer {
        if self.held.fs.is_some() {
            return Answer::Refused("the filesystem is mounted already".into());
        }
        let mount_req = self.req.clone();
        self.on_errand(req, move || {
            let prepared = l
                .dev
                .pinned(&l.binding)
                .and_then(|p| filesystem::prepare(&p, &mount_req, zeroed));
            Box::new(move |root: &mut RootPart| match prepared {
                Ok(p) => {
                    if !root.still_holds(&l) {
                        return Answer::Failed(format!("{} let go of the drive meanwhile", l.dev));
                    }
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

    fn mount_fs(&mut self, req: Request, l: LoopOverDisk, small: Option<(u64, u64)>) -> Answer {
        let Some(fstype) = self.fs.as_ref().map(|f| f.fstype.clone()) else {
            return Answer::Refused("no filesystem was prepared".into());
        };
        if self.held.fs.is_some() {
            return Answer::Refused("the filesystem is mounted already".into());
        }
        let small = small.map(|(bytes, disk)| Small { bytes, disk });
        let mount_req = self.req.clone();
        self.on_errand(req, move || {
            let mounted = l
                .dev
                .pinned(&l.binding)
                .and_then(|p| filesystem::mount(&p, &fstype, &mount_req, small));
            Box::new(move |root: &mut RootPart| match mounted {
                Ok(done) => {
                    let mountpoint = root.req.mountpoint.clone();
                    root.held.fs = Some(Guard::new(FsMount { mountpoint }));
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
        if self.held.fs.is_none() || self.held.frozen.is_some() {
            return Answer::Refused("not a mounted filesystem that is not frozen".into());
        }
        let mp = self.req.mountpoint.clone();
        let limit = self.req.io.freeze_limit;
        self.on_errand(req, move || {
            let frozen = system::freeze(&mp, &dev);
            Box::new(move |root: &mut RootPart| match frozen {
                Ok(file) => {
                    root.held.frozen = Some(Guard::new(Frozen {
                        file,
                        mountpoint: mp,
                        thaw_by: Some(Instant::now() + limit),
                    }));
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    /// Whether `l` is still the device this mount holds.
    fn still_holds(&self, l: &LoopOverDisk) -> bool {
        self.held
            .loop_dev
            .as_ref()
            .is_some_and(|h| h.binding == l.binding)
    }

    fn thaw(&mut self, req: Request) -> Answer {
        if self.errand.is_some() {
            // (Refused by `on_errand`, but the descriptor must stay ours.)
            return self.on_errand(req, || answer_only(Answer::Done));
        }
        let Some(frozen) = undone(&mut self.held.frozen) else {
            return Answer::Done;
        };
        self.on_errand(req, move || {
            let thawed = system::thaw(&frozen.file);
            Box::new(move |root: &mut RootPart| match thawed {
                Ok(()) => Answer::Done,
                Err(e) => {
                    // Still frozen: the root part's thaw comes when it is due.
                    root.held.frozen = Some(Guard::new(frozen));
                    failed(e)
                }
            })
        })
    }
}

/// Whether the loop device is mounted, which an fs-mode worker asks every
/// second (a plain `umount` has begun once it is not): the mount table is read
/// again only when the kernel says it changed (`/proc/self/mountinfo` polls
/// with `POLLPRI` after a mount or unmount), so an idle mount costs no parse.
#[derive(Default)]
pub(super) struct MountTable {
    /// Held open: its poll state tells of changes since the last poll.
    file: Option<std::fs::File>,
    /// The answer as of the last read, per loop device path.
    last: Option<(String, bool)>,
}

impl MountTable {
    pub(super) fn loop_mounted(&mut self, dev: &LoopDevice) -> Option<bool> {
        let changed = match &self.file {
            Some(f) => {
                let mut p = libc::pollfd {
                    fd: f.as_raw_fd(),
                    events: libc::POLLPRI,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; a zero timeout only looks.
                let n = unsafe { libc::poll(&mut p, 1, 0) };
                n != 0
            }
            None => {
                self.file = std::fs::File::open("/proc/self/mountinfo").ok();
                true
            }
        };
        if let Some((path, yes)) = &self.last {
            if !changed && path == dev.path() {
                return Some(*yes);
            }
        }
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let yes = dev.is_mounted_per(&text)?;
        self.last = Some((dev.path().to_string(), yes));
        Some(yes)
    }
}
