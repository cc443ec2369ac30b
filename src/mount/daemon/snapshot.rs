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
            return Err(MountError::System(
                "a read-only mount is not snapshotted through its daemon".into(),
            ));
        }
        let mp = self.req.mountpoint.to_string_lossy().to_string();
        let frozen = if self.fs_mounted {
            system::run("fsfreeze", &["-f", &mp])?;
            true
        } else {
            false
        };
        let result = (|| {
            if let Some(c) = &self.cache {
                c.flush().map_err(|e| {
                    MountError::Data(format!("cannot flush before the snapshot: {e}"))
                })?;
            }
            Ok::<String, MountError>(self.rt.block_on(self.blob.create_snapshot())?)
        })();
        if frozen {
            if let Err(e) = system::run("fsfreeze", &["-u", &mp]) {
                error!("could not thaw {mp}: {e}");
            }
        }
        let id = result?;
        info!("consistent snapshot {id} of {}", self.target);
        Ok(id)
    }
}
