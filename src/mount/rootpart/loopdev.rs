//! The worker's requests about the loop device over the FUSE file `disk`
//! (block and fs mode): attaching it, whether it is still attached, taking a
//! new size, detaching it. The device is this mount's while sysfs names
//! `disk` as its backing file; one that let go by itself is forgotten.

use tracing::{info, warn};

use super::channel::{Answer, Request};
use super::errand::{answer_only, failed};
use super::guards::{undone, Guard, LoopOverDisk};
use super::RootPart;
use crate::mount::record;
use crate::mount::system::LoopDevice;

impl RootPart {
    /// The requests about the loop device over `disk`.
    pub(super) fn carry_out_for_loop(&mut self, req: Request) -> Answer {
        match req {
            Request::AttachLoop {} => self.attach_loop(req),
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
            Request::DetachLoop {} => self.detach_loop(req),
            other => Answer::Refused(format!("not a loop device request: {other:?}")),
        }
    }

    fn attach_loop(&mut self, req: Request) -> Answer {
        if self.held.fuse.is_none() {
            return Answer::Failed("the FUSE mount is gone".into());
        }
        if self.held.loop_dev.is_some() {
            return Answer::Failed("a loop device is attached already".into());
        }
        let disk = self.fuse_dir.join("disk");
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

    fn detach_loop(&mut self, req: Request) -> Answer {
        if self.attached_loop().is_none() {
            return Answer::Done;
        }
        let Some(held) = self.held.loop_dev.as_deref().cloned() else {
            return Answer::Done;
        };
        self.on_errand(req, move || {
            let done = held.detach();
            let dev = held.dev;
            Box::new(move |root: &mut RootPart| match done {
                Ok(()) => {
                    info!("detached {dev}");
                    undone(&mut root.held.loop_dev);
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    /// Takes on `dev`, attached over `disk`, and names it in the record.
    fn adopt_loop(&mut self, dev: &LoopDevice) {
        self.held.loop_dev = Some(Guard::new(LoopOverDisk::new(dev)));
        self.rec.device = Some(dev.path().to_string());
        if let Err(e) = record::save(&self.rec) {
            warn!("could not name {dev} in the mount's record: {e}");
        }
    }

    /// The loop device, while it is still attached over `disk`; one that let
    /// go (autoclear) is forgotten, its writeback settings put back, and the
    /// filesystem on it with it: a plain umount unmounted it.
    pub(super) fn attached_loop(&mut self) -> Option<&LoopDevice> {
        if self.held.loop_dev.as_ref()?.let_go() {
            undone(&mut self.held.loop_dev);
            undone(&mut self.held.fs);
            undone(&mut self.held.frozen);
            return None;
        }
        self.held.loop_dev.as_ref().map(|l| &l.dev)
    }
}
