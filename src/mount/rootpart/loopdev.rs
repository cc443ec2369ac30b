//! The worker's requests about the loop device over the FUSE file `disk`
//! (block and fs mode): attaching it, whether it is still attached, taking a
//! new size, detaching it.
//!
//! `disk` is opened beneath the root of the FUSE mount the root part made
//! (found again by the kernel's numbers for it, see `system::fuse`), never by a
//! path through it: the worker answers every lookup there, and a symlink, a
//! device node or another mount in its answer is refused, as is anything but
//! a regular file of that mount. The device is attached through that
//! descriptor, and is this mount's while the kernel says it still serves that
//! attachment (`system::loopdev`); one that let go by itself is forgotten.

use tracing::{info, warn};

use super::channel::{Answer, Request};
use super::errand::{answer_only, failed};
use super::guards::{undone, Guard, LoopOverDisk};
use super::RootPart;
use crate::mount::record;
use crate::mount::system::{self, Attached, Binding, BlockSize, LoopDevice, Now, Serves};
use crate::mount::{Mode, MountError};

impl RootPart {
    /// The requests about the loop device over `disk`.
    pub(super) fn carry_out_for_loop(&mut self, req: Request) -> Answer {
        if self.req.mode == Mode::Raw {
            return Answer::Refused("a raw mount has no loop device".into());
        }
        match req {
            Request::AttachLoop { block_size } => match BlockSize::of(block_size) {
                Some(block) => self.attach_loop(req, block),
                None => Answer::Refused(format!(
                    "a loop device of {block_size}-byte blocks: only 512 and 4096 are served"
                )),
            },
            Request::LoopAttached {} => self.loop_attached(req),
            Request::LoopCapacity {} => {
                let Some(l) = self.attached_loop() else {
                    return Answer::Failed("no loop device is attached".into());
                };
                self.on_errand(req, move || {
                    let grown = l.dev.pinned(&l.binding).and_then(|p| {
                        system::take_new_capacity(&p.file).map_err(|e| {
                            MountError::with_source(format!("cannot grow {}", l.dev), e)
                        })
                    });
                    answer_only(match grown {
                        Ok(n) => Answer::Size(n),
                        Err(e) => Answer::Failed(e.to_string()),
                    })
                })
            }
            Request::DetachLoop {} => self.detach_loop(req),
            other => Answer::Refused(format!("not a loop device request: {other:?}")),
        }
    }

    fn attach_loop(&mut self, req: Request, block: BlockSize) -> Answer {
        let Some(fuse) = self.fuse_id.filter(|_| self.held.fuse.is_some()) else {
            return Answer::Failed("the FUSE mount is gone".into());
        };
        if self.held.loop_dev.is_some() {
            return Answer::Failed("a loop device is attached already".into());
        }
        let dir = self.fuse_dir.clone();
        let read_only = self.req.read_only;
        let how = if read_only {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        self.on_errand(req, move || {
            let attached = system::open_mount_root(&dir, &fuse)
                .and_then(|root| system::open_disk(&root, fuse.dev, how))
                .and_then(|disk| LoopDevice::attach_for_network(&disk, read_only, block));
            Box::new(move |root: &mut RootPart| match attached {
                Ok(a) => {
                    let path = a.pinned.dev.path().to_string();
                    root.adopt_loop(a);
                    Answer::Device(path)
                }
                Err(e) => {
                    warn!("no loop device attached: {e}");
                    Answer::Failed(e.to_string())
                }
            })
        })
    }

    /// Whether the loop device still serves this mount: answered at once
    /// where sysfs's sequence number tells (never by opening the device,
    /// which can wait while another call on it waits on the worker), on an
    /// errand otherwise.
    fn loop_attached(&mut self, req: Request) -> Answer {
        let Some(l) = self.held.loop_dev.as_deref().cloned() else {
            return Answer::Attached(false);
        };
        match l.dev.serves_now(&l.binding) {
            Now::Gone => {
                self.let_go_of_loop(&l.binding);
                Answer::Attached(false)
            }
            Now::Serves => Answer::Attached(true),
            Now::Ask => self.on_errand(req, move || {
                let gone = matches!(l.dev.serves(&l.binding), Serves::No);
                Box::new(move |root: &mut RootPart| {
                    if gone {
                        root.let_go_of_loop(&l.binding);
                    }
                    Answer::Attached(!gone)
                })
            }),
        }
    }

    fn detach_loop(&mut self, req: Request) -> Answer {
        let Some(held) = self.held.loop_dev.as_deref().cloned() else {
            return Answer::Done;
        };
        if self.held.fs.is_some() {
            return Answer::Refused("the filesystem on the loop device is mounted".into());
        }
        self.on_errand(req, move || {
            let done = held.detach();
            Box::new(move |root: &mut RootPart| match done {
                Ok(()) => {
                    info!("detached {}", held.dev);
                    root.forget_loop(&held.binding);
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    /// Takes on the device attached over `disk`, and names it in the record.
    /// Nothing found on an earlier device is taken to be on this one.
    fn adopt_loop(&mut self, a: Attached) {
        let dev = a.pinned.dev.clone();
        self.held.loop_dev = Some(Guard::new(LoopOverDisk {
            dev: dev.clone(),
            binding: a.binding,
        }));
        self.fs = None;
        self.rec.device = Some(dev.path().to_string());
        self.rec.device_seq = a.binding.seq;
        if let Err(e) = record::save(&self.rec) {
            warn!("could not name {dev} in the mount's record: {e}");
        }
    }

    /// The loop device while it still serves this mount, as the kernel says
    /// at once (also when that cannot be told at once); one that
    /// let go (autoclear) is forgotten, its writeback settings put back, and
    /// the filesystem on it with it: a plain umount unmounted it.
    pub(super) fn attached_loop(&mut self) -> Option<LoopOverDisk> {
        let l = self.held.loop_dev.as_deref()?.clone();
        if l.let_go() {
            self.forget_let_go(&l.binding);
            return None;
        }
        Some(l)
    }

    /// The device of the attachment `b` let go by itself, as the kernel said
    /// (see `guards.rs`, [`LoopOverDisk::let_go`]): it is forgotten.
    fn let_go_of_loop(&mut self, b: &Binding) {
        if let Some(l) = self.held.loop_dev.as_ref().filter(|l| l.binding == *b) {
            l.went_by_itself();
        }
        self.forget_let_go(b);
    }

    /// Nothing of the device of the attachment `b`, which let go by itself,
    /// nor of a filesystem on it, is this mount's to undo any more. (A device
    /// lets go only once nothing holds it open, a mounted filesystem
    /// included.)
    fn forget_let_go(&mut self, b: &Binding) {
        if self.forget_loop(b) {
            undone(&mut self.held.fs);
            undone(&mut self.held.frozen);
        }
    }

    /// Takes the device of the attachment `b` out of its guard, if it is
    /// still the one held; whether it was.
    fn forget_loop(&mut self, b: &Binding) -> bool {
        if self.held.loop_dev.as_ref().is_none_or(|l| l.binding != *b) {
            return false;
        }
        undone(&mut self.held.loop_dev);
        self.fs = None;
        true
    }
}
