//! The Controller service: volumes as drives. A volume is a fixed-VHD page blob,
//! created and deleted as `blobdrive create` and `delete` do, found again by its
//! id alone (see `volume.rs`). CreateVolume is `create.rs`, publishing
//! `attach.rs`, snapshots `snapshots.rs`.

use tonic::{Request, Response, Status};

use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::*;
use super::volume::{self, VolumeId};
use super::{attach, create, parameters, snapshots};
use super::{status_of, status_of_drive, Driver};
use crate::azure::DeleteSnapshots;
use crate::drive::{Drive, DriveError};

/// The most volumes one ListVolumes page holds when the caller names no limit.
const LIST_PAGE: usize = 500;

pub struct ControllerService {
    driver: Driver,
}

impl ControllerService {
    pub fn new(driver: Driver) -> ControllerService {
        ControllerService { driver }
    }

    fn blob(&self, id: &VolumeId) -> crate::azure::BlobClient {
        self.driver.service.blob(&id.container, &id.blob)
    }

    /// Why volume `blob`, in use (leased), cannot be grown where it is used: an
    /// ext4 filesystem on it, and the node it is published to cannot grow a
    /// mounted ext4 (no CAP_SYS_RESOURCE). FAILED_PRECONDITION then tells
    /// csi-resizer to grow it once it is not in use: the blob then, and its
    /// filesystem when it is next staged, neither of which needs the capability.
    async fn not_growable_in_use(
        &self,
        blob: &crate::azure::BlobClient,
        props: &crate::azure::BlobProperties,
    ) -> Result<Option<String>, Status> {
        let (Some(node), Some(container)) = (
            super::publish::published_to(props),
            self.driver.container.as_deref(),
        ) else {
            return Ok(None);
        };
        let record = super::nodes::NodeRecord::read(&self.driver.service, container, node).await?;
        if record.is_none_or(|r| r.grows_mounted_ext4) {
            return Ok(None);
        }
        let head = blob
            .read(0, crate::mount::superblock::HEAD_BYTES as u64)
            .await
            .map_err(status_of)?;
        let ext4 = crate::mount::superblock::detect(&head).is_some_and(|f| f.fstype == "ext4");
        Ok(ext4.then(|| {
            format!(
                "volume {} is in use on node {node}, whose plugin cannot grow a mounted ext4 (it lacks CAP_SYS_RESOURCE): it is grown once it is not in use (stop the pods that use it), its filesystem when it is staged next",
                blob.target()
            )
        }))
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

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = create::create_volume(&self.driver, &request.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
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
        // Deleted while still published (a CO that did not unpublish first):
        // the nodes' records let it go, or it would hold a place there.
        let nodes: Vec<String> = super::publish::published_to(&props)
            .into_iter()
            .chain(super::publish::readers(&props))
            .map(str::to_string)
            .collect();
        attach::forget(&self.driver, &id, &nodes).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Ok(Response::new(
            attach::publish(&self.driver, request.into_inner()).await?,
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        attach::unpublish(&self.driver, request.into_inner()).await?;
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
        let id = VolumeId::known(&req.volume_id)?;
        if self.existing(&id).await?.is_none() {
            return Err(Status::not_found(format!("no volume {}", id.spec())));
        }
        // What cannot be served is said in the message, not confirmed; an
        // unknown parameter is named without its value.
        let refused = volume::unsupported(&req.volume_capabilities)
            .or_else(|| {
                parameters::check_volume(&req.parameters)
                    .err()
                    .map(|s| s.message().to_string())
            })
            .or_else(|| {
                parameters::check_mutable(&req.mutable_parameters)
                    .err()
                    .map(|s| s.message().to_string())
            });
        let answer = match refused {
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
                volume: Some(volume::message(id, *size)),
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
        let snapshot = snapshots::create(&self.driver, &request.into_inner()).await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
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
        Ok(Response::new(
            snapshots::list(&self.driver, &request.into_inner()).await?,
        ))
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
        let id = VolumeId::known(&req.volume_id)?;
        let blob = self.blob(&id);
        let props = match blob.properties().await {
            Ok(p) => p,
            Err(e) if e.is_not_found() => {
                return Err(Status::not_found(format!("no volume {}", id.spec())))
            }
            Err(e) => return Err(status_of(e)),
        };
        // A volume that does not exist is NOT_FOUND whatever size is asked.
        let size = volume::size_for(req.capacity_range.as_ref())?;
        let now = props.content_length.saturating_sub(crate::vhd::FOOTER_SIZE);
        if size <= now {
            return Ok(Response::new(ControllerExpandVolumeResponse {
                capacity_bytes: now as i64,
                node_expansion_required: false,
            }));
        }
        if props.lease_state.as_deref() == Some("leased") {
            if let Some(why) = self.not_growable_in_use(&blob, &props).await? {
                return Err(Status::failed_precondition(why));
            }
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
