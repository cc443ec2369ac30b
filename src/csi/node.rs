//! The Node service: its state (the driver, the volumes' cgroups, the cache
//! budget) and the calls it answers, each carried out by a file below this
//! one: staging (`node/stage.rs`: a blobdrive mount at the staging path, its
//! daemon outliving the CSI process), publishing (`node/bind.rs`: a bind
//! mount), the volume's statistics and growing it online (`node/usage.rs`);
//! and who this node is (recorded in the account for the controller:
//! `nodes.rs`). Those files build on the service here ([`NodeService`],
//! [`path_arg`]); this file alone hands them the calls, so imports run one way.

mod bind;
mod stage;
mod usage;

use std::path::PathBuf;

use tonic::{Request, Response, Status};

use super::budget::Budget;
use super::memcg::{self, VolumeGroups};
use super::proto::node_server::Node;
use super::proto::node_service_capability::{self, rpc};
use super::proto::*;
use super::volume::VolumeId;
use super::{nodes, Driver};
use crate::azure::BlobProperties;

/// How many volumes a node takes unless told (NodeGetInfo): an idle mounted
/// volume holds a few MiB and threads that end when idle; loop devices and
/// the kernel's FUSE connections are the bound that is left.
pub const MAX_VOLUMES_PER_NODE: u32 = 64;

pub struct NodeService {
    driver: Driver,
    /// Where the volumes' daemons go, apart from this plugin's cgroup, each
    /// into a cgroup of its own.
    groups: Option<VolumeGroups>,
    /// What the volumes' caches may take together, and what they take.
    budget: Budget,
}

impl NodeService {
    /// The node service; says in the log what its volumes' caches may take
    /// and take already (a restarted plugin counts the volumes staged before
    /// it), and whether the kernel limits each volume's memory.
    pub fn new(driver: Driver) -> NodeService {
        let node_id = &driver.node_id;
        let max = u64::from(driver.max_volumes);
        let budget = Budget::new(driver.cache_budget, max, node_id);
        tracing::info!("node {node_id}: {}", budget.summary());
        if budget.default_cache * max > budget.total {
            tracing::warn!(
                "node {node_id}: the cache budget holds {} volumes of the default cache, fewer than the {max} the node takes",
                budget.total / budget.default_cache
            );
        }
        let groups = driver.volume_cgroup.as_ref().map(|c| {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            VolumeGroups::detect(c.dir(), &mountinfo)
        });
        match &groups {
            Some(g) if matches!(g.memory, memcg::Memory::Unlimited(_)) => {
                tracing::warn!("node {node_id}: {}", g.describe())
            }
            Some(g) => tracing::info!("node {node_id}: {}", g.describe()),
            None => tracing::warn!(
                "node {node_id}: no --volume-cgroup: volumes' memory is not limited by the kernel, only by their caches"
            ),
        }
        NodeService {
            driver,
            groups,
            budget,
        }
    }

    pub fn node_id(&self) -> &str {
        &self.driver.node_id
    }

    /// Where the volumes' daemons go, each into a cgroup of its own, apart
    /// from this plugin's cgroup.
    pub fn volume_groups(&self) -> Option<&VolumeGroups> {
        self.groups.as_ref()
    }

    /// The node's cache budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The mount's options for the node's disk cache, and for a warm-up when
    /// the volume asks for one (started as the mount is ready, which NodeStage
    /// does not wait for). A volume that asks for a warm-up on a node without
    /// a disk cache is staged without one, saying so in the log.
    pub fn disk_cache_args(&self, spec: &str, warm: bool) -> Vec<String> {
        let Some(dir) = &self.driver.disk_cache else {
            if warm {
                tracing::warn!(
                    "volume {spec} asks for warmUp, but this node has no --disk-cache: staged without a warm-up"
                );
            }
            return Vec::new();
        };
        let mut args = vec!["--disk-cache".to_string(), dir.display().to_string()];
        if warm {
            args.push("--warm".to_string());
        }
        args
    }

    /// The properties of the volume's blob; NOT_FOUND when there is none (a
    /// volume that does not exist, unlike one not staged here).
    pub async fn volume_properties(&self, id: &VolumeId) -> Result<BlobProperties, Status> {
        match self
            .driver
            .service
            .blob(&id.container, &id.blob)
            .properties()
            .await
        {
            Ok(p) => Ok(p),
            Err(e) if e.is_not_found() => {
                Err(Status::not_found(format!("no volume {}", id.spec())))
            }
            Err(e) => Err(super::status_of(e)),
        }
    }
}

/// Records `driver`'s node in its container (see `nodes.rs`): at the node
/// plugin's start, so the controller knows it before NodeGetInfo is called.
pub async fn register(driver: &Driver) -> Result<(), Status> {
    let container = driver.container.as_deref().ok_or_else(|| {
        Status::failed_precondition("the node plugin has no --container to record itself in")
    })?;
    nodes::register(
        &driver.service,
        container,
        &driver.node_id,
        driver.max_volumes,
    )
    .await
}

/// A required path of a call, which must be absolute.
pub fn path_arg(p: &str, what: &str) -> Result<PathBuf, Status> {
    if p.is_empty() {
        return Err(Status::invalid_argument(format!("a {what} is required")));
    }
    if !p.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "{what} {p} is not absolute"
        )));
    }
    Ok(PathBuf::from(p))
}

fn rpc_capability(t: rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        stage::stage(self, request.into_inner()).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        stage::unstage(self, request.into_inner()).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        bind::publish(self, request.into_inner()).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        bind::unpublish(request.into_inner())?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Ok(Response::new(usage::stats(request.into_inner())?))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Ok(Response::new(usage::expand(request.into_inner()).await?))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc_capability(rpc::Type::StageUnstageVolume),
                rpc_capability(rpc::Type::GetVolumeStats),
                rpc_capability(rpc::Type::ExpandVolume),
            ],
        }))
    }

    /// Records this node in the account again (node-driver-registrar calls
    /// this before the kubelet uses the node, so the controller can publish
    /// to it), then says who it is.
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        register(&self.driver).await?;
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.driver.node_id.clone(),
            max_volumes_per_node: self.driver.max_volumes.into(),
            accessible_topology: None,
        }))
    }
}
