//! `blobdrive csi`: the Kubernetes CSI driver (see `blobdrive::csi`).

use anyhow::Result;
use blobdrive::csi::{self, Driver, Role, VolumeCgroup};

use super::Context;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Kubernetes runs it twice: the controller Deployment serves `--role controller` beside
the csi-provisioner, csi-attacher, csi-snapshotter, csi-resizer and csi-snapshot-metadata
sidecars, and the node DaemonSet serves `--role node` on every node beside node-driver-registrar
(privileged, hostPID, the kubelet's directory with Bidirectional mount propagation).
The source's deploy/kubernetes/ has the manifests; the manual's kubernetes.md says how
to deploy them (/usr/share/doc/blobdrive/docs/ with the package, docs/ in the source).

Volumes are drives (fixed VHD page blobs) named container/NAME.vhd. Each node plugin
records itself in --container (blobdrive-csi/nodes/NODE), and the controller publishes
only to a node that did, no more volumes than it takes. A volume is published for
writing to one node at a time, and read-only to many, never beside a writer.
Unpublishing it from a node that never unstaged it
(the node died or was cut off) breaks that node's lease and raises the blob's
sequence number before it answers, so the node's late writes are refused by the
storage service itself and its I/O fails with EIO: failover by fencing, not by a
clock.

Backup tools ask the controller, through csi-snapshot-metadata, which blocks of a
snapshot hold data and which changed between two snapshots (the CSI SnapshotMetadata
service): the storage service's Get Page Ranges, with its snapshot diff.

Each staged volume is a `blobdrive mount` whose daemon outlives this process: a
node plugin killed or restarted leaves its volumes serving, and takes them down
again when asked. With --volume-cgroup the daemons also leave the plugin's cgroup,
which a container runtime kills whole, each into a cgroup of its own there whose
memory is limited to its cache and the daemon's overhead where the host has a
memory controller for it. The volumes' caches share the node's --cache-budget.
Each volume's network-facing part runs as a uid of its own (see blobdrive-mount(8)).

The account comes from the same places as every command (AZURE_STORAGE_CONNECTION_STRING
or Entra ID; see blobdrive(8)). The socket is root's alone (mode 600).

Example, one host serving every role:
  blobdrive csi --endpoint unix:///run/csi/csi.sock --node-id \"$(hostname)\" --container volumes")]
pub struct Args {
    /// Where to serve: unix:///PATH (the socket the CSI sidecars and the
    /// kubelet talk to).
    #[arg(long, value_name = "unix:///PATH")]
    pub endpoint: String,
    /// This node's name, as Kubernetes knows it (spec.nodeName); required
    /// unless --role controller.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Which services to serve: the controller's (a Deployment), the node's
    /// (a DaemonSet), or all (one host).
    #[arg(long, value_enum, default_value_t = Role::All)]
    pub role: Role,
    /// The container new volumes go to, unless their StorageClass names one
    /// (parameter `container`); ListVolumes lists it. The node plugins record
    /// themselves there and the controller looks for them there, so every
    /// role is given the same one (required unless --role controller).
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// How many volumes this node takes at most (NodeGetInfo's
    /// max_volumes_per_node; the controller refuses one more with
    /// RESOURCE_EXHAUSTED).
    #[arg(long, value_name = "N", default_value_t = csi::MAX_VOLUMES_PER_NODE,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(csi::MOST_VOLUMES)))]
    pub max_volumes_per_node: u32,
    /// A cgroup v2 directory (made if missing, in a cgroup v2 directory) that
    /// each staged volume's daemon is moved into, so that killing this
    /// plugin's container (all of its cgroup) leaves the volumes serving. The
    /// node DaemonSet passes one under the host's /sys/fs/cgroup, with hostPID.
    #[arg(long, value_name = "DIR")]
    pub volume_cgroup: Option<std::path::PathBuf>,
    /// A directory on a local disk where every volume staged on this node keeps
    /// a disk cache (`blobdrive mount --disk-cache`); it must be root's and
    /// writable by no one else. Volumes of a StorageClass with `warmUp: "true"`
    /// fill theirs as they are staged (`mount --warm`).
    #[arg(long, value_name = "DIR")]
    pub disk_cache: Option<std::path::PathBuf>,
    /// The memory the caches of the volumes staged on this node may take
    /// together (e.g. 4GiB; default: a quarter of the node's memory). A
    /// volume's cache is its StorageClass's `cacheSize`, or else this budget
    /// shared by max_volumes_per_node volumes (at least 32 MiB); a volume
    /// whose cache does not fit what is left is refused (RESOURCE_EXHAUSTED,
    /// nothing made or leased), and staged when the kubelet asks again once
    /// another volume has left the node.
    #[arg(long, value_name = "SIZE")]
    pub cache_budget: Option<String>,
}

/// The node's cache budget: `--cache-budget` (checked: at least one volume's
/// smallest cache, at most the node's memory), or a quarter of the memory.
fn cache_budget(asked: Option<&str>) -> Result<u64> {
    use blobdrive::mount::{mem_total, MIN_CACHE_SIZE};
    use blobdrive::size::human;
    let memory = mem_total();
    let Some(text) = asked else {
        return Ok(csi::default_cache_budget(memory.unwrap_or(4 << 30)));
    };
    let budget =
        blobdrive::size::parse_size(text).map_err(|e| anyhow::anyhow!("--cache-budget: {e}"))?;
    if budget < MIN_CACHE_SIZE {
        anyhow::bail!(
            "--cache-budget {} is too small: a volume's cache is at least {}",
            human(budget),
            human(MIN_CACHE_SIZE)
        );
    }
    if let Some(total) = memory.filter(|&t| budget > t) {
        anyhow::bail!(
            "--cache-budget {} is more than this node's memory ({})",
            human(budget),
            human(total)
        );
    }
    Ok(budget)
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    // Every argument is checked before anything is made (the volume cgroup,
    // the socket).
    csi::socket_path(&args.endpoint)?;
    let serves_node = args.role != Role::Controller;
    let node_id = match (serves_node, args.node_id) {
        (_, Some(id)) if !csi::is_node_id(&id) => anyhow::bail!(
            "--node-id {:?}: 1 to 253 letters, digits, '.', '-' and '_' (a Kubernetes node name)",
            id
        ),
        (_, Some(id)) => id,
        (false, None) => String::new(),
        (true, None) => anyhow::bail!(
            "--node-id is required to serve the node service (or give --role controller)"
        ),
    };
    match &args.container {
        Some(c) if !csi::is_container_name(c) => anyhow::bail!(
            "--container {c:?}: not a container name (3 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit, no '--')"
        ),
        None if serves_node => anyhow::bail!(
            "--container is required to serve the node service: the node records itself there, where the controller looks for it"
        ),
        _ => {}
    }
    let cache_budget = cache_budget(args.cache_budget.as_deref())?;
    let disk_cache = match &args.disk_cache {
        Some(dir) => {
            let dir = std::path::absolute(dir)?;
            blobdrive::device::diskcache::files::check_dir(&dir)
                .map_err(|e| anyhow::anyhow!("--disk-cache: {e}"))?;
            Some(dir)
        }
        None => None,
    };
    let service = ctx.service()?;
    let volume_cgroup = args
        .volume_cgroup
        .as_deref()
        .map(VolumeCgroup::open)
        .transpose()?;
    let driver = Driver {
        role: args.role,
        service,
        container: args.container,
        node_id,
        volume_cgroup,
        disk_cache,
        max_volumes: args.max_volumes_per_node,
        cache_budget,
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
