//! The worker's requests about the root part's FUSE mount: unmounting it, who
//! holds its file `disk` open, and the size of `disk` as the kernel sees it.

use super::channel::{Answer, Request};
use super::errand::{answer_only, failed};
use super::guards::undone;
use super::RootPart;
use crate::mount::system;
use crate::mount::MountError;

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

    /// Unmounts it while it is still the mount at the FUSE directory (see
    /// `system::umount_fuse`).
    fn umount_fuse(&mut self, req: Request, lazy: bool) -> Answer {
        let Some((dir, id)) = self.held.fuse.as_ref().map(|f| (f.dir.clone(), f.id)) else {
            return Answer::Done;
        };
        self.on_errand(req, move || {
            let done = system::umount_fuse(&dir, &id, lazy);
            Box::new(move |root: &mut RootPart| match done {
                Ok(()) => {
                    undone(&mut root.held.fuse);
                    Answer::Done
                }
                Err(e) => failed(e),
            })
        })
    }

    /// The size of `disk`: a stat of it, opened `O_PATH` beneath the FUSE
    /// mount's root as an attach opens it (a symlink in the worker's answer
    /// is refused, not followed to a file of the machine's), which lets root
    /// alone in (and waits on the worker's answer, so an errand).
    fn disk_size(&mut self, req: Request) -> Answer {
        let Some(fuse) = self.fuse_id.filter(|_| self.held.fuse.is_some()) else {
            return Answer::Failed("the FUSE mount is gone".into());
        };
        let dir = self.fuse_dir.clone();
        self.on_errand(req, move || {
            let size = system::open_mount_root(&dir, &fuse)
                .and_then(|root| system::open_disk(&root, fuse.dev, libc::O_PATH))
                .and_then(|disk| {
                    disk.file
                        .metadata()
                        .map(|m| m.len())
                        .map_err(|e| MountError::with_source("cannot stat the FUSE file disk", e))
                });
            answer_only(match size {
                Ok(n) => Answer::Size(n),
                Err(e) => Answer::Failed(e.to_string()),
            })
        })
    }
}
