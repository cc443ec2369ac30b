//! The Controller service: volumes as drives. A volume is a fixed-VHD page blob,
//! created and deleted as `blobdrive create` and `delete` do, found again by its
//! id alone (see `volume.rs`).

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{self, rpc};
use super::proto::*;
use super::volume::{self, VolumeId};
use super::Driver;
use crate::azure::{AzureError, BlobClient, DeleteSnapshots};
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

/// A status for a failure of the storage service: UNAVAILABLE while it may
/// come back (the CO retries), INTERNAL otherwise.
fn status_of(e: AzureError) -> Status {
    if e.is_outage() {
        Status::unavailable(e.to_string())
    } else {
        Status::internal(e.to_string())
    }
}

fn status_of_drive(e: DriveError) -> Status {
    match e {
        DriveError::Azure(a) => status_of(a),
        other => Status::failed_precondition(other.to_string()),
    }
}

fn volume(id: &VolumeId, size: u64, source: Option<VolumeContentSource>) -> Volume {
    Volume {
        capacity_bytes: size as i64,
        volume_id: id.spec(),
        volume_context: HashMap::new(),
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
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volumes from a snapshot or another volume are not served yet",
            ));
        }
        let size = volume::size_for(req.capacity_range.as_ref())?;
        let id = VolumeId::for_name(&self.container_for(&req.parameters)?, &req.name)?;
        if let Some(d) = self.existing(&id).await? {
            // The same name again: the same volume if its size still fits.
            if !volume::size_fits(d.disk_size(), req.capacity_range.as_ref()) {
                return Err(Status::already_exists(format!(
                    "volume {} exists with {} bytes, outside the range asked",
                    id.spec(),
                    d.disk_size()
                )));
            }
            return Ok(Response::new(CreateVolumeResponse {
                volume: Some(volume(&id, d.disk_size(), None)),
            }));
        }
        let blob = self.blob(&id);
        match blob.container().create().await {
            Ok(_) => {}
            Err(e) => return Err(status_of(e)),
        }
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
            volume: Some(volume(&id, size, None)),
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

    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "PUBLISH_UNPUBLISH_VOLUME is not offered",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "PUBLISH_UNPUBLISH_VOLUME is not offered",
        ))
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
        let start: usize = match req.starting_token.as_str() {
            "" => 0,
            t => t
                .parse()
                .map_err(|_| Status::aborted(format!("starting token '{t}' is not one of ours")))?,
        };
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
        if start > all.len() {
            return Err(Status::aborted(format!(
                "starting token {start} is past the {} volumes",
                all.len()
            )));
        }
        let page = match req.max_entries {
            n if n < 0 => return Err(Status::invalid_argument("max_entries may not be negative")),
            0 => LIST_PAGE,
            n => n as usize,
        };
        let end = (start + page).min(all.len());
        let entries = all[start..end]
            .iter()
            .map(|(id, size)| list_volumes_response::Entry {
                volume: Some(volume(id, *size, None)),
                status: None,
            })
            .collect();
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token: if end < all.len() {
                end.to_string()
            } else {
                String::new()
            },
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
        let capabilities = [rpc::Type::CreateDeleteVolume, rpc::Type::ListVolumes]
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
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented(
            "CREATE_DELETE_SNAPSHOT is not offered",
        ))
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented(
            "CREATE_DELETE_SNAPSHOT is not offered",
        ))
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("LIST_SNAPSHOTS is not offered"))
    }

    async fn get_snapshot(
        &self,
        _: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        Err(Status::unimplemented("GET_SNAPSHOT is not offered"))
    }

    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("EXPAND_VOLUME is not offered"))
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
