//! A consistent snapshot of a mounted drive, taken on the control socket's
//! `snapshot` command.

use tracing::{error, info};

use super::Mounted;
use crate::mount::MountError;

impl Mounted {
    /// A snapshot whose content is what the filesystem had at one moment: freeze it
    /// (fs mode), write every cached byte, snapshot, thaw (always, also on errors).
    pub(super) fn consistent_snapshot(&mut self) -> Result<String, MountError> {
        if self.req.read_only {
            return Err(MountError::system(
                "a read-only mount is not snapshotted through its daemon",
            ));
        }
        let mp = self.req.mountpoint.to_string_lossy().to_string();
        // The root part freezes the filesystem (fs mode), and thaws it when
        // the worker dies before it asks.
        let frozen = self.loop_dev.is_some() && self.fs.is_some();
        if frozen {
            self.root.freeze()?;
        }
        let result = (|| {
            if let Some(c) = &self.cache {
                c.flush().map_err(|e| {
                    MountError::Data(format!("cannot flush before the snapshot: {e}"))
                })?;
            }
            Ok::<String, MountError>(self.rt.block_on(self.blob.create_snapshot())?)
        })();
        if frozen {
            if let Err(e) = self.root.thaw() {
                error!("could not thaw {mp}: {e}");
            }
        }
        let id = result?;
        info!("consistent snapshot {id} of {}", self.target);
        Ok(id)
    }

    /// `flush`: writes everything the drive acknowledged so far to the blob,
    /// so that a snapshot taken next (by someone else: a CSI controller) holds
    /// it, as a disk's snapshot holds every write it completed. The answer:
    /// `ok`, or `error` and why.
    pub(super) fn flush_on_request(&self) -> String {
        let Some(c) = self.cache.as_ref().filter(|_| !self.req.read_only) else {
            return "ok".to_string();
        };
        match c.flush() {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error {e}"),
        }
    }
}
