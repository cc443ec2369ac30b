//! The Controller service: volumes as drives. A volume is a fixed-VHD page blob,
//! created and deleted as `blobdrive create` and `delete` do, found again by its
//! id alone (see `volume.rs`).

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::*;
use super::snapshots;
use super::volume::{self, VolumeId};
use super::{clone, publish};
use super::{status_of, Driver};
use crate::azure::{BlobClient, DeleteSnapshots};
use crate::drive::{self, Drive, DriveError};

/// The StorageClass parameter that names the container of new volumes.
pub const CONTAINER_PARAM: &str = "container";

/// The most volumes one ListVolumes page holds when the caller names no limit.
const LIST_PAGE: usize = 500;

pub struct ControllerService {
    driver: Driver,
}

impl ControllerService {
    pub fn new(driver: Driver) -> ControllerService {
        ControllerService { driver }
    }

    fn blob(&self, id: &VolumeId) -> BlobClient {
        self.driver.service.blob(&id.container, &id.blob)
    }

    /// The container a new volume goes to: the StorageClass's, else the driver's.
    fn container_for(&self, parameters: &HashMap<String, String>) -> Result<String, Status> {
        parameters
            .get(CONTAINER_PARAM)
            .or(self.driver.container.as_ref())
            .cloned()
            .ok_or_else(|| {
                Status::invalid_argument(
                    "no container: give the StorageClass a `container` parameter, or the driver --container",
                )
            })
    }

    /// Makes `blob` a new drive with `snapshot`'s bytes, grown to the size asked
    /// for if that is more; returns its disk size.
    async fn copy_snapshot(
        &self,
        blob: &BlobClient,
        snapshot: &snapshots::SnapshotId,
        req: &CreateVolumeRequest,
    ) -> Result<u64, Status> {
        let source = snapshot.blob(&self.driver.service);
        let has = match Drive::open(&source).await {
            Ok(d) => d.disk_size(),
            Err(DriveError::Azure(e)) if e.is_not_found() => {
                return Err(Status::not_found(format!(
                    "no snapshot {}",
                    snapshot.spec()
                )))
            }
            Err(DriveError::BlobMissing(_) | DriveError::ContainerMissing(_)) => {
                return Err(Status::not_found(format!(
                    "no snapshot {}",
                    snapshot.spec()
                )))
            }
            Err(e) => return Err(status_of_drive(e)),
        };
        let range = req.capacity_range.as_ref();
        let asked = match range {
            Some(r) if r.required_bytes > 0 => volume::size_for(range)?,
            _ => has,
        };
        if range.is_some_and(|r| r.limit_bytes > 0 && (r.limit_bytes as u64) < has) {
            return Err(Status::out_of_range(format!(
                "snapshot {} holds {has} bytes, more than the limit asked",
                snapshot.spec()
            )));
        }
        blob.copy_from(&source, None, None)
            .await
            .map_err(status_of)?;
        // The copy brings the snapshot's metadata, not all of which is the
        // new volume's.
        let props = blob.properties().await.map_err(status_of)?;
        let kept: Vec<(&str, &str)> = props
            .metadata
            .iter()
            .filter(|(k, _)| snapshots::kept_by_a_copy(k))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if kept.len() != props.metadata.len() {
            blob.set_metadata_if_match(&kept, None, props.etag.as_deref())
                .await
                .map_err(status_of)?;
        }
        let size = asked.max(has);
        if size > has {
            crate::resize::grow(blob, size)
                .await
                .map_err(status_of_drive)?;
        }
        tracing::info!(
            "made volume {} of {size} bytes from snapshot {}",
            blob.target(),
            snapshot.spec()
        );
        Ok(size)
    }

    /// The drive of volume `id`; `None` when there is no such blob.
    async fn existing(&self, id: &VolumeId) -> Result<Option<Drive>, Status> {
        match Drive::open(&self.blob(id)).await {
            Ok(d) => Ok(Some(d)),
            Err(DriveError::BlobMissing(_) | DriveError::ContainerMissing(_)) => Ok(None),
            Err(DriveError::Azure(e)) if e.is_not_found() => Ok(None),
            Err(e) => Err(status_of_drive(e)),
        }
    }
}

fn status_of_drive(e: DriveError) -> Status {
    match e {
        DriveError::Azure(a) => status_of(a),
        other => Status::failed_precondition(other.to_string()),
    }
}

fn volume(
    id: &VolumeId,
    size: u64,
    source: Option<VolumeContentSource>,
    context: HashMap<String, String>,
) -> Volume {
    Volume {
        capacity_bytes: size as i64,
        volume_id: id.spec(),
        volume_context: context,
        content_source: source,
        accessible_topology: vec![],
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(Status::invalid_argument("a volume name is required"));
        }
        if let Some(why) = volume::unsupported(&req.volume_capabilities) {
            return Err(Status::invalid_argument(why));
        }
        let from = match req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => None,
            Some(volume_content_source::Type::Snapshot(s)) => Some(
                snapshots::SnapshotId::parse(&s.snapshot_id)
                    .ok_or_else(|| Status::not_found(format!("no snapshot {}", s.snapshot_id)))?,
            ),
            Some(volume_content_source::Type::Volume(_)) => None,
        };
        let clone_of = clone::source_asked(req.volume_content_source.as_ref())?;
        let id = VolumeId::for_name(&self.container_for(&req.parameters)?, &req.name)?;
        let context = volume::context_of(&req.parameters)?;
        if let Some(d) = self.existing(&id).await? {
            // The same name again: the same volume if its size still fits.
            if !volume::size_fits(d.disk_size(), req.capacity_range.as_ref()) {
                return Err(Status::already_exists(format!(
                    "volume {} exists with {} bytes, outside the range asked",
                    id.spec(),
                    d.disk_size()
                )));
            }
            let source = clone::repeated(
                &self.driver.service,
                &d.props,
                req.volume_content_source.as_ref(),
                &id,
            )
            .await?;
            return Ok(Response::new(CreateVolumeResponse {
                volume: Some(volume(&id, d.disk_size(), source, context)),
            }));
        }
        let blob = self.blob(&id);
        match blob.container().create().await {
            Ok(_) => {}
            Err(e) => return Err(status_of(e)),
        }
        if let Some(source) = clone_of {
            let (blob, req_ref) = (&blob, &req);
            let copy = |snapshot| async move { self.copy_snapshot(blob, &snapshot, req_ref).await };
            let size = clone::clone_volume(&self.driver.service, &source, &id, copy).await?;
            let volume = volume(&id, size, req.volume_content_source.clone(), context);
            return Ok(Response::new(CreateVolumeResponse {
                volume: Some(volume),
            }));
        }
        if let Some(snapshot) = from {
            let size = self.copy_snapshot(&blob, &snapshot, &req).await?;
            let source = req.volume_content_source.clone();
            return Ok(Response::new(CreateVolumeResponse {
                volume: Some(volume(&id, size, source, context)),
            }));
        }
        let size = volume::size_for(req.capacity_range.as_ref())?;
        match drive::create(&blob, size).await {
            Ok(()) => {}
            // Made meanwhile by another call of the same name: answered as above.
            Err(DriveError::Azure(e)) if e.code() == Some("BlobAlreadyExists") => {
                return Err(Status::aborted(format!(
                    "volume {} is being created by another call; try again",
                    id.spec()
                )))
            }
            Err(e) => return Err(status_of_drive(e)),
        }
        tracing::info!("created volume {} of {size} bytes", id.spec());
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume(&id, size, None, context)),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        // An id this driver never made names no volume: deleted, as asked.
        let Some(id) = VolumeId::parse(&req.volume_id) else {
            return Ok(Response::new(DeleteVolumeResponse {}));
        };
        let blob = self.blob(&id);
        let props = match blob.properties().await {
            Ok(p) => p,
            Err(e) if e.is_not_found() => return Ok(Response::new(DeleteVolumeResponse {})),
            Err(e) => return Err(status_of(e)),
        };
        if props.lease_state.as_deref() == Some("leased") {
            return Err(Status::failed_precondition(format!(
                "volume {} is in use (a node holds its lease): unpublish it first",
                id.spec()
            )));
        }
        // Snapshots of it stay usable: a volume that has them is not deleted.
        match blob
            .delete_if_match(DeleteSnapshots::None, None, props.etag.as_deref())
            .await
        {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            // A retry after an attempt that did the work (Azurite answers it so).
            Err(e) if e.is_changed_since_read() && self.existing(&id).await?.is_none() => {}
            Err(e) if e.code() == Some("SnapshotsPresent") => {
                return Err(Status::failed_precondition(format!(
                    "volume {} has snapshots: delete them first",
                    id.spec()
                )))
            }
            Err(e) if e.is_changed_since_read() => {
                return Err(Status::aborted(format!(
                    "volume {} changed while it was being deleted; try again",
                    id.spec()
                )))
            }
            Err(e) => return Err(status_of(e)),
        }
        tracing::info!("deleted volume {}", id.spec());
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    /// Publishing for writing records the node on the blob: one node at a
    /// time. A read-only publication records nothing (a read-only mount takes
    /// no lease, and many nodes may hold one).
    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        if req.node_id.is_empty() {
            return Err(Status::invalid_argument("a node id is required"));
        }
        let Some(cap) = req.volume_capability else {
            return Err(Status::invalid_argument("a volume capability is required"));
        };
        if let Some(why) = volume::unsupported(std::slice::from_ref(&cap)) {
            return Err(Status::invalid_argument(why));
        }
        let id = VolumeId::parse(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
        let readonly = req.readonly || volume::read_only(&cap);
        if readonly {
            if self.existing(&id).await?.is_none() {
                return Err(Status::not_found(format!("no volume {}", id.spec())));
            }
        } else {
            publish::publish(&self.blob(&id), &req.node_id).await?;
            tracing::info!("published volume {} to node {}", id.spec(), req.node_id);
        }
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(
                volume::READONLY_CONTEXT.to_string(),
                readonly.to_string(),
            )]),
        }))
    }

    /// Unpublishing a node that still holds the volume's lease (it never
    /// unstaged: dead or cut off) fences it before answering: see `publish.rs`.
    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        let Some(id) = VolumeId::parse(&req.volume_id) else {
            return Ok(Response::new(ControllerUnpublishVolumeResponse {}));
        };
        let node = (!req.node_id.is_empty()).then_some(req.node_id.as_str());
        publish::unpublish(&self.blob(&id), node).await?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume capabilities are required"));
        }
        let id = VolumeId::parse(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
        if self.existing(&id).await?.is_none() {
            return Err(Status::not_found(format!("no volume {}", id.spec())));
        }
        let answer = match volume::unsupported(&req.volume_capabilities) {
            Some(why) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            },
            None => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        };
        Ok(Response::new(answer))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let Some(container) = self.driver.container.clone() else {
            return Err(Status::failed_precondition(
                "ListVolumes lists the driver's --container, and none was given",
            ));
        };
        let start = volume::starting_at(&req.starting_token)?;
        let items = match self
            .driver
            .service
            .container(&container)
            .list_blobs("", false)
            .await
        {
            Ok(items) => items,
            Err(e) if e.is_not_found() => vec![],
            Err(e) => return Err(status_of(e)),
        };
        let mut all: Vec<(VolumeId, u64)> = items
            .into_iter()
            .filter(|b| b.blob_type.as_deref() == Some("PageBlob"))
            .filter_map(|b| {
                let id = VolumeId::parse(&format!("{container}/{}", b.name))?;
                let size = b.content_length?.checked_sub(crate::vhd::FOOTER_SIZE)?;
                Some((id, size))
            })
            .collect();
        all.sort_by(|a, b| a.0.blob.cmp(&b.0.blob));
        let (window, next_token) =
            volume::page(start, all.len(), req.max_entries, LIST_PAGE, "volumes")?;
        let entries = all[window]
            .iter()
            .map(|(id, size)| list_volumes_response::Entry {
                volume: Some(volume(id, *size, None, HashMap::new())),
                status: None,
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Err(Status::unimplemented("GET_CAPACITY is not offered"))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = [
            rpc::Type::CreateDeleteVolume,
            rpc::Type::PublishUnpublishVolume,
            rpc::Type::PublishReadonly,
            rpc::Type::ListVolumes,
            rpc::Type::CreateDeleteSnapshot,
            rpc::Type::ListSnapshots,
            rpc::Type::ExpandVolume,
            rpc::Type::CloneVolume,
        ]
        .into_iter()
        .map(|t| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        if req.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("a source volume id is required"));
        }
        if req.name.is_empty() {
            return Err(Status::invalid_argument("a snapshot name is required"));
        }
        volume::check_name(&req.name, "snapshot")?;
        let source = VolumeId::parse(&req.source_volume_id)
            .ok_or_else(|| Status::not_found(format!("no volume {}", req.source_volume_id)))?;
        // Taken already by this name: the same answer, or ALREADY_EXISTS if it
        // was of another volume.
        let mut containers = vec![source.container.clone()];
        containers.extend(self.driver.container.clone());
        containers.dedup();
        for container in &containers {
            let all = snapshots::in_container(&self.driver.service, container)
                .await
                .map_err(status_of)?;
            let taken = all
                .into_iter()
                .find(|(_, item)| snapshots::name_of(item) == Some(req.name.as_str()));
            if let Some((id, item)) = taken {
                if id.volume != source {
                    return Err(Status::already_exists(format!(
                        "snapshot {} was taken of volume {}, not {}",
                        req.name,
                        id.volume.spec(),
                        source.spec()
                    )));
                }
                let len = item.content_length.unwrap_or_default();
                return Ok(Response::new(CreateSnapshotResponse {
                    snapshot: Some(snapshots::message(&id, len)),
                }));
            }
        }
        let blob = self.blob(&source);
        let props = match blob.properties().await {
            Ok(p) => p,
            Err(e) if e.is_not_found() => {
                return Err(Status::not_found(format!("no volume {}", source.spec())))
            }
            Err(e) => return Err(status_of(e)),
        };
        let at = blob
            .create_snapshot_with(&[(snapshots::SNAPSHOT_META, &req.name)])
            .await
            .map_err(status_of)?;
        let id = snapshots::SnapshotId { volume: source, at };
        tracing::info!("took snapshot {} as {}", id.spec(), req.name);
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshots::message(&id, props.content_length)),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let req = request.into_inner();
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("a snapshot id is required"));
        }
        let Some(id) = snapshots::SnapshotId::parse(&req.snapshot_id) else {
            return Ok(Response::new(DeleteSnapshotResponse {}));
        };
        match id
            .blob(&self.driver.service)
            .delete(DeleteSnapshots::None, None)
            .await
        {
            Ok(()) => tracing::info!("deleted snapshot {}", id.spec()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(status_of(e)),
        }
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let by_id =
            (!req.snapshot_id.is_empty()).then(|| snapshots::SnapshotId::parse(&req.snapshot_id));
        let by_source =
            (!req.source_volume_id.is_empty()).then(|| VolumeId::parse(&req.source_volume_id));
        // A snapshot or a volume this driver never made: none to list.
        if matches!(by_id, Some(None)) || matches!(by_source, Some(None)) {
            return Ok(Response::new(ListSnapshotsResponse::default()));
        }
        let (by_id, by_source) = (by_id.flatten(), by_source.flatten());
        let container = by_id
            .as_ref()
            .map(|i| i.volume.container.clone())
            .or_else(|| by_source.as_ref().map(|v| v.container.clone()))
            .or_else(|| self.driver.container.clone());
        let Some(container) = container else {
            return Err(Status::failed_precondition(
                "ListSnapshots lists the driver's --container, and none was given",
            ));
        };
        let all = snapshots::in_container(&self.driver.service, &container)
            .await
            .map_err(status_of)?
            .into_iter()
            .filter(|(id, _)| by_id.as_ref().is_none_or(|want| want == id))
            .filter(|(id, _)| by_source.as_ref().is_none_or(|v| *v == id.volume))
            .map(|(id, item)| snapshots::message(&id, item.content_length.unwrap_or_default()))
            .collect();
        Ok(Response::new(snapshots::page(
            all,
            &req.starting_token,
            req.max_entries,
        )?))
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        Err(Status::unimplemented("GET_SNAPSHOT is not offered"))
    }

    /// Grows the drive when no node holds it; a drive a node has mounted is
    /// grown by that node, online (`node_expansion_required`).
    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        if req.capacity_range.is_none() {
            return Err(Status::invalid_argument("a capacity range is required"));
        }
        let size = volume::size_for(req.capacity_range.as_ref())?;
        let id = VolumeId::parse(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
        let blob = self.blob(&id);
        let props = match blob.properties().await {
            Ok(p) => p,
            Err(e) if e.is_not_found() => {
                return Err(Status::not_found(format!("no volume {}", id.spec())))
            }
            Err(e) => return Err(status_of(e)),
        };
        let now = props.content_length.saturating_sub(crate::vhd::FOOTER_SIZE);
        if size <= now {
            return Ok(Response::new(ControllerExpandVolumeResponse {
                capacity_bytes: now as i64,
                node_expansion_required: false,
            }));
        }
        if props.lease_state.as_deref() == Some("leased") {
            return Ok(Response::new(ControllerExpandVolumeResponse {
                capacity_bytes: size as i64,
                node_expansion_required: true,
            }));
        }
        crate::resize::grow(&blob, size)
            .await
            .map_err(status_of_drive)?;
        tracing::info!("grew volume {} to {size} bytes", id.spec());
        // A filesystem on it is grown when a node mounts it next.
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: size as i64,
            node_expansion_required: true,
        }))
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented("GET_VOLUME is not offered"))
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented("MODIFY_VOLUME is not offered"))
    }
}
