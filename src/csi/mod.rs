//! The CSI driver: Kubernetes' Container Storage Interface (v1.12) served on a
//! unix socket, so a cluster gets blobdrive drives as PersistentVolumes.
//!
//! - `identity.rs`: who the plugin is and what it serves;
//! - `controller.rs`: volumes as drives (create, delete, list, validate,
//!   publish);
//! - `clone.rs`: a volume made from another, copied by the storage service
//!   from a snapshot taken for it;
//! - `copies.rs`: a volume made from a snapshot or a clone is encrypted as
//!   its source is, or not made;
//! - `publish.rs`: which node a volume is published to, and fencing a node
//!   that lost it;
//! - `snapshots.rs`: volume snapshots as blob snapshots, taken once the node
//!   holding the volume flushed it (`flush.rs`);
//! - `metadata.rs`: the SnapshotMetadata service, a snapshot's allocated
//!   blocks and the blocks changed between two, for backup tools;
//! - `node.rs`: the Node service, its calls carried out below it (`node/`):
//!   staging (a blobdrive mount at the staging path, its daemon outliving the
//!   CSI process), publishing (a bind mount), stats, online grow;
//! - `volume.rs`: volume ids, sizes and capabilities, checked before anything is
//!   looked up, as csi-sanity expects.
//!
//! Errors are gRPC statuses as the spec names them: a missing required field is
//! `INVALID_ARGUMENT` before any lookup, an unknown volume `NOT_FOUND` (OK for
//! deletes), a repeated call answers OK with the same answer.

mod attach;
mod authority;
mod budget;
mod cgroup;
mod clone;
mod controller;
mod copies;
mod create;
mod flush;
mod identity;
mod memcg;
mod metadata;
mod node;
mod nodes;
mod origin;
mod parameters;
mod paths;
mod publish;
mod quantity;
mod reclaim;
mod records;
mod snapshots;
mod staged;
mod targets;
mod volume;

use std::path::PathBuf;

use thiserror::Error;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;

use crate::azure::BlobService;

pub use cgroup::{join_in_child, CgroupError, VolumeCgroup};

pub use identity::PLUGIN_NAME;
pub use node::MAX_VOLUMES_PER_NODE;
pub use nodes::{is_node_id, MOST_VOLUMES};
pub use volume::is_container_name;

/// The messages and service traits generated from the CSI spec.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// A status for a failure of the storage service: UNAVAILABLE while it may
/// come back (the CO retries), INTERNAL otherwise.
fn status_of(e: crate::azure::AzureError) -> tonic::Status {
    if e.is_outage() {
        tonic::Status::unavailable(e.to_string())
    } else {
        tonic::Status::internal(e.to_string())
    }
}

/// A status for a drive that cannot be used: the storage service's failures
/// as [`status_of`] says, anything else (not a drive, a footer that does not
/// fit) FAILED_PRECONDITION.
fn status_of_drive(e: crate::drive::DriveError) -> tonic::Status {
    match e {
        crate::drive::DriveError::Azure(a) => status_of(a),
        other => tonic::Status::failed_precondition(other.to_string()),
    }
}

/// Which services a driver process serves: the controller Deployment needs
/// Identity, Controller and SnapshotMetadata (no privileges, no mounts), each
/// node's DaemonSet pod Identity and Node; one process may serve them all (a
/// single host, the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Identity, Controller, SnapshotMetadata and Node.
    All,
    /// Identity, Controller and SnapshotMetadata.
    Controller,
    /// Identity and Node.
    Node,
}

/// What the driver serves, and where its drives live.
#[derive(Clone)]
pub struct Driver {
    /// The services served.
    pub role: Role,
    /// The account's blob service (from the same places as every command).
    pub service: BlobService,
    /// Where volumes go unless a StorageClass names a `container`.
    pub container: Option<String>,
    /// This node's id (NodeGetInfo, and whom ControllerPublish names).
    pub node_id: String,
    /// The cgroup each staged volume's daemon is moved into, so that the node
    /// plugin's container can be killed without its volumes.
    pub volume_cgroup: Option<VolumeCgroup>,
    /// The directory staged volumes keep their disk caches in
    /// (`blobdrive mount --disk-cache`), if the node has one.
    pub disk_cache: Option<PathBuf>,
    /// How many volumes this node takes (NodeGetInfo's max_volumes_per_node,
    /// and what its record tells the controller).
    pub max_volumes: u32,
    /// What the caches of the volumes staged on this node may take together
    /// (`--cache-budget`), in bytes.
    pub cache_budget: u64,
}

pub use budget::NodeSummary;

/// For `blobdrive list`: each node plugin's cache budget on this host, and
/// what its volumes take of it (a line each as text).
pub fn cache_budgets_here() -> Vec<NodeSummary> {
    budget::host_summaries()
}

/// The cache budget of a node with `mem_total` bytes of memory when
/// `--cache-budget` is not given: a quarter of it.
pub fn default_cache_budget(mem_total: u64) -> u64 {
    budget::default_total(mem_total)
}

/// Why the driver could not start.
#[derive(Debug, Error)]
pub enum CsiError {
    #[error("--endpoint {0}: expected unix:///PATH (an absolute path)")]
    Endpoint(String),
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} exists and is not a socket: not replacing it")]
    NotASocket(String),
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The socket path of a `unix:///PATH` endpoint (also `unix:/PATH`).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CsiError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| CsiError::Endpoint(endpoint.to_string()))?;
    Ok(PathBuf::from(path))
}

/// Binds the socket at `path`: a socket left by an earlier run (a restarted
/// node plugin) is replaced, anything else is refused. Only root can connect
/// (0600): the sidecars run as root beside the driver.
fn bind(path: &std::path::Path) -> Result<UnixListener, CsiError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let shown = path.display().to_string();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => return Err(CsiError::NotASocket(shown)),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| CsiError::Listen {
        path: shown.clone(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        CsiError::Listen {
            path: shown,
            source,
        }
    })?;
    Ok(listener)
}

/// How long a node plugin's start waits to record the node in the account.
const REGISTER_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves Identity and the services of the driver's role on `endpoint` until
/// `stop` resolves.
pub async fn serve(
    driver: Driver,
    endpoint: &str,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), CsiError> {
    let path = socket_path(endpoint)?;
    if driver.role != Role::Controller {
        // Recorded before the socket is there, so the controller knows this
        // node as soon as the kubelet can; a storage service out of reach
        // delays the start by a few seconds only (NodeGetInfo records it
        // again, and fails if it cannot).
        let said = match tokio::time::timeout(REGISTER_LIMIT, node::register(&driver)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.message().to_string()),
            Err(_) => Some(format!("no answer in {} s", REGISTER_LIMIT.as_secs())),
        };
        if let Some(why) = said {
            tracing::warn!("cannot record this node in the account yet: {why}");
        }
    }
    let listener = bind(&path)?;
    let controller = (driver.role != Role::Node).then(|| {
        proto::controller_server::ControllerServer::new(controller::ControllerService::new(
            driver.clone(),
        ))
    });
    let metadata = (driver.role != Role::Node).then(|| {
        proto::snapshot_metadata_server::SnapshotMetadataServer::new(
            metadata::MetadataService::new(driver.service.clone()),
        )
    });
    let node = (driver.role != Role::Controller)
        .then(|| proto::node_server::NodeServer::new(node::NodeService::new(driver.clone())));
    // The controller's requests to flush a volume before its snapshot.
    let flusher = match (&node, &driver.container) {
        (Some(_), Some(container)) => Some(tokio::spawn(flush::serve(
            driver.service.clone(),
            container.clone(),
            driver.node_id.clone(),
        ))),
        _ => None,
    };
    // Said once the services are made (the node's has logged its budget).
    tracing::info!("CSI driver {PLUGIN_NAME} serving on {}", path.display());
    let result = tonic::transport::Server::builder()
        .add_service(proto::identity_server::IdentityServer::new(
            identity::IdentityService {
                snapshot_metadata: metadata.is_some(),
            },
        ))
        .add_optional_service(controller)
        .add_optional_service(metadata)
        .add_optional_service(node)
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).map(|c| c.map(authority::AnyAuthority::new)),
            stop,
        )
        .await;
    if let Some(f) = flusher {
        f.abort();
    }
    let _ = std::fs::remove_file(&path);
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_absolute_unix_endpoint_is_taken() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        for bad in ["/csi/csi.sock", "tcp://127.0.0.1:1", "unix://csi.sock"] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }
}
