//! The worker's requests about the root part's FUSE mount: unmounting it, who
//! holds its file `disk` open, and the size of `disk` as the kernel sees it.

use super::channel::{Answer, Request};
use super::errand::{answer_only, failed};
use super::guards::undone;
use super::RootPart;
use crate::mount::system;

impl RootPart {
    /// The requests about the FUSE mount.
    pub(super) fn carry_out_for_fuse(&mut self, req: Request) -> Answer {
        match req {
            Request::UmountFuse { lazy } => self.umount_fuse(req, lazy),
            Request::Holders {} => {
                if self.held.fuse.is_none() {
                    return Answer::Lines(Vec::new());
                }
                Answer::Lines(system::holders(&self.fuse_dir.join("disk")))
            }
            Request::DiskSize {} => self.disk_size(req),
            other => Answer::Refused(format!("not a FUSE request: {other:?}")),
        }
    }

    fn umount_fuse(&mut self, req: Request, lazy: bool) -> Answer {
        if self.held.fuse.is_none() {
            return Answer::Done;
        }
        let dir = self.fuse_dir.clone();
        self.on_errand(req, move || {
            let done = system::umount(&dir, lazy);
            Box::new(move |root: &mut RootPart| match done {
                Ok(()) => {
                    undone(&mut root.held.fuse);
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    /// The size of `disk`: a stat through the FUSE mount, which lets root
    /// alone in (and waits on the worker's answer, so an errand).
    fn disk_size(&mut self, req: Request) -> Answer {
        if self.held.fuse.is_none() {
            return Answer::Failed("the FUSE mount is gone".into());
        }
        let disk = self.fuse_dir.join("disk");
        self.on_errand(req, move || {
            answer_only(match std::fs::metadata(&disk) {
                Ok(m) => Answer::Size(m.len()),
                Err(e) => Answer::Failed(format!("cannot stat {}: {e}", disk.display())),
            })
        })
    }
}
