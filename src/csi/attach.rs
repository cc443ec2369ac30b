//! ControllerPublishVolume and ControllerUnpublishVolume (what csi-attacher
//! calls when a pod's volume is attached to a node and detached): each is
//! recorded twice, in the volume's record (who may write it, who reads it:
//! `publish.rs`) and in the node's (how many volumes it holds: `nodes.rs`).
//!
//! A publication is checked against the node's record first (the node must
//! have recorded itself; the same volume again must come with the same
//! arguments; one volume more than the node takes is refused), then written
//! into the volume's record, then into the node's; if the node's refuses it
//! after all (another publication took its last place meanwhile), the
//! volume's entry is taken back out.

use std::collections::HashMap;

use tonic::Status;

use super::nodes::{self, NodeRecord};
use super::proto::{
    ControllerPublishVolumeRequest, ControllerPublishVolumeResponse,
    ControllerUnpublishVolumeRequest,
};
use super::volume::{self, VolumeId};
use super::{publish, Driver};

/// The container the nodes record themselves in: the driver's.
fn nodes_container(driver: &Driver) -> Result<&str, Status> {
    driver.container.as_deref().ok_or_else(|| {
        Status::failed_precondition(
            "the controller has no --container, where the nodes record themselves: give it the node plugins' --container",
        )
    })
}

/// Answers ControllerPublishVolume.
pub async fn publish(
    driver: &Driver,
    req: ControllerPublishVolumeRequest,
) -> Result<ControllerPublishVolumeResponse, Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    if req.node_id.is_empty() {
        return Err(Status::invalid_argument("a node id is required"));
    }
    let cap = volume::one_capability(req.volume_capability)?;
    let id = VolumeId::known(&req.volume_id)?;
    let node = req.node_id.as_str();
    let record = NodeRecord::read(&driver.service, nodes_container(driver)?, node)
        .await?
        .ok_or_else(|| {
            Status::not_found(format!(
                "no node {node}: no node plugin of this driver recorded itself by that id"
            ))
        })?;
    let read_only = req.readonly || volume::read_only(&cap);
    let entry = nodes::publication(read_only, &cap);
    let recorded = match record.publication_of(&id) {
        Some(e) if e == entry => true,
        Some(_) => return Err(nodes::incompatible(&id, node)),
        None if !record.has_room() => return Err(nodes::full(node, record.max())),
        None => false,
    };
    let blob = driver.service.blob(&id.container, &id.blob);
    let newly = if read_only {
        publish::add_reader(&blob, node).await?
    } else {
        publish::publish(&blob, node).await?
    };
    if !recorded {
        if let Err(e) = record.add(&id, &entry, node).await {
            if newly {
                publish::withdraw(&blob, node).await?;
            }
            return Err(e);
        }
    }
    if newly {
        let how = if read_only {
            "read-only"
        } else {
            "for writing"
        };
        tracing::info!("published volume {} to node {node} {how}", id.spec());
    }
    Ok(ControllerPublishVolumeResponse {
        publish_context: HashMap::from([(
            volume::READONLY_CONTEXT.to_string(),
            read_only.to_string(),
        )]),
    })
}

/// Answers ControllerUnpublishVolume: a node that still holds the volume's
/// lease (it never unstaged: dead or cut off) is fenced before the answer (see
/// `publish.rs`), then the node's record lets the volume go.
pub async fn unpublish(
    driver: &Driver,
    req: ControllerUnpublishVolumeRequest,
) -> Result<(), Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let Some(id) = VolumeId::parse(&req.volume_id) else {
        return Ok(());
    };
    let node = (!req.node_id.is_empty()).then_some(req.node_id.as_str());
    let blob = driver.service.blob(&id.container, &id.blob);
    let mut from = publish::unpublish(&blob, node).await?;
    from.extend(node.map(str::to_string));
    forget(driver, &id, &from).await
}

/// Takes volume `id` out of the records of `nodes` (those that recorded
/// themselves; none without a container to look in).
pub async fn forget(driver: &Driver, id: &VolumeId, nodes: &[String]) -> Result<(), Status> {
    let Some(container) = driver.container.as_deref() else {
        return Ok(());
    };
    let mut nodes = nodes.to_vec();
    nodes.sort();
    nodes.dedup();
    for n in &nodes {
        if let Some(record) = NodeRecord::read(&driver.service, container, n).await? {
            record.remove(id).await?;
        }
    }
    Ok(())
}
