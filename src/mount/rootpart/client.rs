//! The worker's end of the channel to the root part (see `channel.rs`): one
//! request at a time, from any of the worker's threads, each answered or
//! refused.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use super::channel::{exchange, Answer, ChannelError, Request};
use crate::mount::system::filesystem::{MountedFs, Prepared, Small};
use crate::mount::MountError;

/// The worker's end of the channel: one request at a time, from any thread.
#[derive(Clone)]
pub struct RootClient {
    conn: Arc<Mutex<BufReader<UnixStream>>>,
}

impl RootClient {
    pub fn new(stream: UnixStream) -> RootClient {
        RootClient {
            conn: Arc::new(Mutex::new(BufReader::new(stream))),
        }
    }

    /// Sends `req` and waits for its answer, asking again for as long as the
    /// root part says it is still under way.
    pub fn call(&self, req: &Request) -> Result<Answer, ChannelError> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match exchange(&mut conn, req)? {
                Answer::Pending(what) => tracing::debug!("still under way: {what}"),
                answer => return Ok(answer),
            }
        }
    }

    /// Tells the service manager something, unless another request is under
    /// way (the root part may wait minutes in an unmount the worker asked
    /// for): a status line is best effort and must not hold up its sender (an
    /// unmount's progress lines to its client come from the same thread).
    pub fn tell_if_free(&self, req: &Request) {
        let mut conn = match self.conn.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if let Err(e) = exchange(&mut conn, req) {
            tracing::debug!("could not tell the root part {req:?}: {e}");
        }
    }

    /// Sends `req`; `Ok` when it was done, the root part's reason otherwise.
    pub fn done(&self, req: &Request) -> Result<(), MountError> {
        match self.call(req)? {
            Answer::Done => Ok(()),
            other => Err(other.into_error()),
        }
    }

    /// Tells the service manager something; best effort, as `Notifier` is.
    pub fn tell(&self, req: &Request) {
        if let Err(e) = self.done(req) {
            tracing::debug!("could not tell the root part {req:?}: {e}");
        }
    }

    /// Unmounts the FUSE mount (see [`Request::UmountFuse`]).
    pub fn umount_fuse(&self, lazy: bool) -> Result<(), MountError> {
        self.done(&Request::UmountFuse { lazy })
    }

    /// The processes holding `disk` open, as `Mounted::disk_busy` names them.
    pub fn holders(&self) -> Vec<String> {
        match self.call(&Request::Holders {}) {
            Ok(Answer::Lines(l)) => l,
            _ => Vec::new(),
        }
    }

    /// Attaches the loop device over `disk`, of logical blocks of `block_size`
    /// bytes (see [`Request::AttachLoop`]); its path.
    pub fn attach_loop(&self, block_size: u32) -> Result<String, MountError> {
        match self.call(&Request::AttachLoop { block_size })? {
            Answer::Device(dev) => Ok(dev),
            other => Err(other.into_error()),
        }
    }

    /// Whether the loop device is still attached over `disk`; `None` when the
    /// root part cannot be asked (then nothing is concluded).
    pub fn loop_attached(&self) -> Option<bool> {
        match self.call(&Request::LoopAttached {}) {
            Ok(Answer::Attached(yes)) => Some(yes),
            _ => None,
        }
    }

    /// Makes the loop device take the new size of `disk`; its size now.
    pub fn loop_capacity(&self) -> Result<u64, MountError> {
        self.size(&Request::LoopCapacity {})
    }

    /// The size of `disk` as the kernel sees it.
    pub fn disk_size(&self) -> Result<u64, MountError> {
        self.size(&Request::DiskSize {})
    }

    fn size(&self, req: &Request) -> Result<u64, MountError> {
        match self.call(req)? {
            Answer::Size(n) => Ok(n),
            other => Err(other.into_error()),
        }
    }

    /// Detaches the loop device (see [`Request::DetachLoop`]).
    pub fn detach_loop(&self) -> Result<(), MountError> {
        self.done(&Request::DetachLoop {})
    }

    /// The filesystem to mount (see [`Request::PrepareFs`]).
    pub fn prepare_fs(&self, zeroed: bool) -> Result<Prepared, MountError> {
        match self.call(&Request::PrepareFs { zeroed })? {
            Answer::Prepared {
                fstype,
                formatted,
                warnings,
            } => Ok(Prepared {
                fstype,
                formatted,
                warnings,
            }),
            other => Err(other.into_error()),
        }
    }

    /// Mounts the filesystem (see [`Request::MountFs`]).
    pub fn mount_fs(&self, small: Option<Small>) -> Result<MountedFs, MountError> {
        let small = small.map(|s| (s.bytes, s.disk));
        match self.call(&Request::MountFs { small })? {
            Answer::MountedFs {
                autoclear,
                notes,
                warnings,
            } => Ok(MountedFs {
                autoclear,
                notes,
                warnings,
            }),
            other => Err(other.into_error()),
        }
    }

    /// Whether any mount has the loop device as its source; `None` when that
    /// cannot be told.
    pub fn loop_mounted(&self) -> Option<bool> {
        self.flag(&Request::LoopMounted {}).ok()
    }

    /// Unmounts the filesystem (see [`Request::UmountFs`]).
    pub fn umount_fs(&self, lazy: bool) -> Result<(), MountError> {
        self.done(&Request::UmountFs { lazy })
    }

    pub fn freeze(&self) -> Result<(), MountError> {
        self.done(&Request::Freeze {})
    }

    pub fn thaw(&self) -> Result<(), MountError> {
        self.done(&Request::Thaw {})
    }

    /// Whether the root part may grow a mounted ext4.
    pub fn can_grow_mounted_ext4(&self) -> bool {
        self.flag(&Request::CanGrowMountedExt4 {}).unwrap_or(false)
    }

    /// Grows the mounted filesystem to fill its device; its size now.
    pub fn grow_fs(&self) -> Result<u64, MountError> {
        self.size(&Request::GrowFs {})
    }

    fn flag(&self, req: &Request) -> Result<bool, MountError> {
        match self.call(req)? {
            Answer::Flag(yes) => Ok(yes),
            other => Err(other.into_error()),
        }
    }

    /// The federated token file's text, as the root part read it now (see
    /// [`Request::FederatedToken`]): a workload identity source's reader.
    pub fn federated_token(&self) -> std::io::Result<String> {
        match self.call(&Request::FederatedToken {}) {
            Ok(Answer::Text(text)) => Ok(text),
            Ok(Answer::Failed(why)) => Err(std::io::Error::other(why)),
            Ok(other) => Err(std::io::Error::other(other.into_error().to_string())),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
}

impl Answer {
    fn into_error(self) -> MountError {
        match self {
            Answer::Busy(what) => MountError::Busy(what),
            Answer::Failed(why) => MountError::system(why),
            Answer::Refused(why) => MountError::system(format!("the root part refused: {why}")),
            Answer::Done
            | Answer::Lines(_)
            | Answer::Device(_)
            | Answer::Attached(_)
            | Answer::Size(_)
            | Answer::Flag(_)
            | Answer::Prepared { .. }
            | Answer::MountedFs { .. }
            | Answer::Text(_)
            | Answer::Pending(_) => MountError::system("an answer that does not fit the request"),
        }
    }
}
