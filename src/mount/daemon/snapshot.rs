//! A consistent snapshot of a mounted drive, taken on the control socket's
//! `snapshot` command.

use tracing::{error, info};

use super::Mounted;
use crate::mount::rootpart::RootClient;
use crate::mount::system;
use crate::mount::MountError;

/// A filesystem frozen for a snapshot: by this process (the descriptor it is
/// thawed on), or by the root part of a split daemon.
enum Frozen {
    Here(std::fs::File),
    ByRoot(RootClient),
}

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
        let frozen = match (&self.loop_dev, &self.fs, &self.root) {
            (Some(_), Some(_), Some(root)) => {
                root.freeze()?;
                Some(Frozen::ByRoot(root.clone()))
            }
            (Some(l), Some(_), None) => {
                Some(Frozen::Here(system::freeze(&self.req.mountpoint, &l.dev)?))
            }
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
            let thawed = match f {
                Frozen::Here(f) => system::thaw(f),
                Frozen::ByRoot(root) => root.thaw(),
            };
            if let Err(e) = thawed {
                error!("could not thaw {mp}: {e}");
            }
        }
        let id = result?;
        info!("consistent snapshot {id} of {}", self.target);
        Ok(id)
    }
}
