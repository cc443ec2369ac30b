//! A consistent snapshot of a mounted drive, taken on the control socket's
//! `snapshot` command.

use tracing::{error, info};

use super::Mounted;
use crate::mount::system;
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
        let frozen = match (&self.loop_dev, &self.fs) {
            (Some(l), Some(_)) => Some(system::freeze(&self.req.mountpoint, &l.dev)?),
            _ => None,
        };
        let result = (|| {
            if let Some(c) = &self.cache {
                c.flush().map_err(|e| {
                    MountError::Data(format!("cannot flush before the snapshot: {e}"))
                })?;
            }
            Ok::<String, MountError>(self.rt.block_on(self.blob.create_snapshot())?)
        })();
        if let Some(f) = &frozen {
            if let Err(e) = system::thaw(f) {
                error!("could not thaw {mp}: {e}");
            }
        }
        let id = result?;
        info!("consistent snapshot {id} of {}", self.target);
        Ok(id)
    }
}
