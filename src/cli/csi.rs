//! `blobdrive csi`: the Kubernetes CSI driver (see `blobdrive::csi`).

use anyhow::Result;
use blobdrive::csi::{self, Driver, VolumeCgroup};

use super::Context;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to serve: unix:///PATH (the socket the CSI sidecars and the
    /// kubelet talk to).
    #[arg(long, value_name = "unix:///PATH")]
    pub endpoint: String,
    /// This node's name, as Kubernetes knows it (spec.nodeName).
    #[arg(long, value_name = "ID")]
    pub node_id: String,
    /// The container new volumes go to, unless their StorageClass names one
    /// (parameter `container`); ListVolumes lists it.
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// A cgroup v2 directory (made if missing) that each staged volume's
    /// daemon is moved into, so that killing this plugin's container (all of
    /// its cgroup) leaves the volumes serving. The node DaemonSet passes one
    /// under the host's /sys/fs/cgroup, with hostPID.
    #[arg(long, value_name = "DIR")]
    pub volume_cgroup: Option<std::path::PathBuf>,
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let volume_cgroup = args
        .volume_cgroup
        .as_deref()
        .map(VolumeCgroup::open)
        .transpose()?;
    let driver = Driver {
        service: ctx.service()?,
        container: args.container,
        node_id: args.node_id,
        volume_cgroup,
    };
    ctx.block_on(async move {
        let stop = async {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        };
        csi::serve(driver, &args.endpoint, stop).await
    })??;
    Ok(())
}
