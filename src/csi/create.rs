//! CreateVolume: a new drive (a fixed-VHD page blob, as `blobdrive create`
//! makes one), a copy of a snapshot, or a clone of a volume (`clone.rs`: the
//! copy of a snapshot taken for it), recorded with what made it (see
//! `origin.rs`) so that the same name asked again answers as the first call
//! did, and a name asked for something else is ALREADY_EXISTS.

use std::collections::HashMap;

use tonic::Status;

use super::origin::{self, Origin, Source};
use super::proto::{CreateVolumeRequest, Volume};
use super::snapshots::SnapshotId;
use super::volume::{self, VolumeId};
use super::{clone, copies, parameters, status_of, status_of_drive, Driver};
use crate::azure::{BlobClient, BlobProperties, BlobService};
use crate::drive::{self, Cleanup, Drive, DriveError};

/// What a CreateVolume asks for, checked: where, from what, the digest of the
/// rest (see [`parameters::digest`]), and the context the volume carries to
/// NodeStage.
struct Asked<'a> {
    req: &'a CreateVolumeRequest,
    id: VolumeId,
    source: Option<Source>,
    digest: String,
    context: HashMap<String, String>,
}

/// Answers CreateVolume: every field checked before anything is looked up,
/// then the volume found again (a repeat) or made.
pub async fn create_volume(driver: &Driver, req: &CreateVolumeRequest) -> Result<Volume, Status> {
    let asked = check(driver, req)?;
    let blob = driver.service.blob(&asked.id.container, &asked.id.blob);
    if let Some(found) = repeated(&driver.service, &blob, &asked).await? {
        return Ok(found);
    }
    blob.container().create().await.map_err(status_of)?;
    let size = match &asked.source {
        Some(Source::Snapshot(s)) => copy_snapshot(driver, &blob, s, &asked).await?,
        Some(Source::Volume(v)) => {
            let source = VolumeId::parse(v).expect("checked");
            let (blob, asked) = (&blob, &asked);
            let copy = |snapshot: SnapshotId| async move {
                copy_snapshot(driver, blob, &snapshot.spec(), asked).await
            };
            clone::clone_volume(driver, &source, &asked.id, copy).await?
        }
        None => fresh(&blob, &asked).await?,
    };
    Ok(answer(&asked, size))
}

fn check<'a>(driver: &Driver, req: &'a CreateVolumeRequest) -> Result<Asked<'a>, Status> {
    if req.name.is_empty() {
        return Err(Status::invalid_argument("a volume name is required"));
    }
    if let Some(why) = volume::unsupported(&req.volume_capabilities) {
        return Err(Status::invalid_argument(why));
    }
    parameters::check_volume(&req.parameters)?;
    parameters::check_mutable(&req.mutable_parameters)?;
    let source = Source::asked(req.volume_content_source.as_ref());
    match &source {
        Some(Source::Snapshot(s)) if SnapshotId::parse(s).is_none() => {
            return Err(Status::not_found(format!("no snapshot {s}")))
        }
        Some(Source::Volume(v)) if VolumeId::parse(v).is_none() => {
            return Err(Status::not_found(format!("no volume {v}")))
        }
        _ => {}
    }
    let id = VolumeId::for_name(&container_for(driver, &req.parameters)?, &req.name)?;
    if volume::encrypted(req.parameters.get(volume::ENCRYPTION))? {
        // Refused before anything is made: a volume meant to be encrypted is
        // never made plain.
        volume::passphrase_in(&req.secrets, "provisioner")?;
    }
    Ok(Asked {
        req,
        id,
        source,
        digest: parameters::digest(&req.parameters, &req.volume_capabilities),
        context: volume::context_of(&req.parameters)?,
    })
}

/// The container a new volume goes to: the StorageClass's, else the driver's.
fn container_for(driver: &Driver, parameters: &HashMap<String, String>) -> Result<String, Status> {
    parameters
        .get(parameters::CONTAINER)
        .or(driver.container.as_ref())
        .cloned()
        .ok_or_else(|| {
            Status::invalid_argument(
                "no container: give the StorageClass a `container` parameter, or the driver --container",
            )
        })
}

fn answer(asked: &Asked, size: u64) -> Volume {
    let mut v = volume::message(&asked.id, size);
    v.content_source = asked.source.as_ref().map(Source::content_source);
    v.volume_context = asked.context.clone();
    v
}

fn being_made(id: &VolumeId) -> Status {
    Status::aborted(format!(
        "volume {} is being created by another call; try again",
        id.spec()
    ))
}

/// The answer to a request for a volume that exists already: the same as the
/// first call's when it is what this one asks for, ALREADY_EXISTS when it is
/// not; `None` when there is no such volume yet.
async fn repeated(
    svc: &BlobService,
    blob: &BlobClient,
    asked: &Asked<'_>,
) -> Result<Option<Volume>, Status> {
    let props = match blob.properties().await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(status_of(e)),
    };
    if props.copy_status.as_deref() == Some("pending") {
        return Err(being_made(&asked.id));
    }
    let conflict = |why: String| {
        Status::already_exists(format!(
            "volume {} exists and is not the one asked for: {why}",
            asked.id.spec()
        ))
    };
    let recorded = Origin::read(&props.metadata);
    let why = match &recorded {
        Some(o) => o.mismatch(asked.source.as_ref(), &asked.digest),
        None => Origin::unrecorded_mismatch(asked.source.as_ref()),
    };
    if let Some(why) = why {
        return Err(conflict(why));
    }
    if let Some(Source::Volume(v)) = &asked.source {
        // What a first call stopped half-way left of the clone's snapshot.
        clone::tidy(svc, &VolumeId::parse(v).expect("checked"), &asked.id).await?;
    }
    let drive = Drive::from_properties(blob, props.clone()).await;
    if matches!(drive, Err(DriveError::Unfinished { .. }))
        && asked.source.is_none()
        && recorded.is_some()
    {
        // A call for this same volume (its record, kept from the blob's first
        // moment, says so) stopped before the footer: finished by this one.
        let size = finish(blob, &props, asked).await?;
        return Ok(Some(answer(asked, size)));
    }
    let mut size = disk_size(blob, &props, drive)?;
    if let Some(o) = recorded.filter(|o| o.size > size) {
        // The first call copied the source and stopped before growing it.
        crate::resize::grow(blob, o.size)
            .await
            .map_err(status_of_drive)?;
        size = o.size;
    }
    if !volume::size_fits(size, asked.req.capacity_range.as_ref()) {
        return Err(conflict(format!(
            "it has {size} bytes, outside the range asked"
        )));
    }
    Ok(Some(answer(asked, size)))
}

/// The disk size of the drive `blob`, as `drive` (its footer checked) says.
fn disk_size(
    blob: &BlobClient,
    props: &BlobProperties,
    drive: Result<Drive, DriveError>,
) -> Result<u64, Status> {
    match drive {
        Ok(d) => Ok(d.disk_size()),
        Err(e) if gone(&e) => Err(Status::aborted(format!(
            "{} was deleted while it was being looked at; try again",
            blob.target()
        ))),
        // Another call is between creating the blob and writing its footer,
        // or one stopped there (the line says what to do then) that made no
        // record of the volume it was for: not this driver's to finish.
        Err(e @ DriveError::Unfinished { .. }) => Err(Status::aborted(format!(
            "{e} (or another call is creating it: try again)"
        ))),
        Err(e) => Err(Status::failed_precondition(format!(
            "{} ({} bytes) is not a drive this driver can answer for: {e}",
            blob.target(),
            props.content_length
        ))),
    }
}

/// Whether `e` says the blob is not there (any more).
fn gone(e: &DriveError) -> bool {
    match e {
        DriveError::BlobMissing(_) => true,
        DriveError::Azure(e) => e.is_not_found(),
        _ => false,
    }
}

/// Makes a blank drive of the size asked, its record of what made it on the
/// blob from its creation on (so a retry of this call can tell the blob is
/// this volume's if the call stops before the footer).
async fn fresh(blob: &BlobClient, asked: &Asked<'_>) -> Result<u64, Status> {
    let (size, header, metadata) = blank(asked).await?;
    let pairs = origin::pairs(&metadata);
    match drive::create_with(blob, size, &header, &pairs).await {
        Ok(()) => {}
        // Made meanwhile by another call, finished or still writing it.
        Err(DriveError::Azure(e)) if e.code() == Some("BlobAlreadyExists") => {
            return Err(being_made(&asked.id))
        }
        Err(DriveError::Unfinished { .. }) => return Err(being_made(&asked.id)),
        // A retry of this call finished the blob (this one was slow).
        Err(DriveError::FooterFailed {
            cleanup: Cleanup::TakenOver,
            ..
        }) => return Err(being_made(&asked.id)),
        Err(e) => return Err(status_of_drive(e)),
    }
    tracing::info!("created volume {} of {size} bytes", asked.id.spec());
    Ok(size)
}

/// Finishes in place the blank drive a call for this same volume created and
/// stopped before its footer (see `reclaim.rs`), as [`fresh`] makes one.
async fn finish(
    blob: &BlobClient,
    props: &BlobProperties,
    asked: &Asked<'_>,
) -> Result<u64, Status> {
    let (size, header, metadata) = blank(asked).await?;
    let pairs = origin::pairs(&metadata);
    match super::reclaim::finish(blob, props, size, &header, &pairs).await {
        Ok(()) => Ok(size),
        Err(DriveError::Azure(e)) if e.code() == Some("LeaseAlreadyPresent") => {
            Err(being_made(&asked.id))
        }
        Err(DriveError::ChangedUnderfoot { .. }) => Err(being_made(&asked.id)),
        Err(e) => Err(status_of_drive(e)),
    }
}

/// The first pages of a new volume: an encrypted one's LUKS2 header, made
/// with the provisioner secret's passphrase, written before its footer, so
/// it is never a plain drive that looks finished.
async fn header_for(asked: &Asked<'_>) -> Result<Vec<(u64, bytes::Bytes)>, Status> {
    if !asked.context.contains_key(volume::ENCRYPTION) {
        return Ok(Vec::new());
    }
    let passphrase = volume::passphrase_in(&asked.req.secrets, "provisioner")?;
    let sector = 4096;
    crate::encrypted::new_header(passphrase.as_bytes(), sector, Default::default())
        .await
        .map_err(|e| Status::internal(format!("cannot make the LUKS2 header: {e}")))
}

/// A new blank volume for `asked`: its disk size, its first pages (see
/// [`header_for`]) and the metadata recording what made it.
async fn blank(
    asked: &Asked<'_>,
) -> Result<(u64, Vec<(u64, bytes::Bytes)>, Vec<(&'static str, String)>), Status> {
    let size = volume::size_for(asked.req.capacity_range.as_ref())?;
    let header = header_for(asked).await?;
    let record = Origin {
        source: None,
        digest: asked.digest.clone(),
        size,
    };
    Ok((size, header, record.metadata()))
}

/// Makes `blob` a new drive with the bytes of snapshot `spec`, grown to the
/// size asked for if that is more; returns its disk size. The copy brings the
/// record of what made it (and nothing of the snapshot's metadata: not its
/// source's publication, nor the name it was taken as).
async fn copy_snapshot(
    driver: &Driver,
    blob: &BlobClient,
    spec: &str,
    asked: &Asked<'_>,
) -> Result<u64, Status> {
    // What the request named: a clone's snapshot is the driver's own, taken
    // for the copy and deleted after, and no answer names it.
    let named = match &asked.source {
        Some(Source::Volume(v)) => format!("volume {v}"),
        _ => format!("snapshot {spec}"),
    };
    let missing = || Status::not_found(format!("no {named}"));
    let snapshot = SnapshotId::parse(spec).ok_or_else(missing)?;
    let source = snapshot.blob(&driver.service);
    let has = match Drive::open(&source).await {
        Ok(d) => d.disk_size(),
        Err(DriveError::Azure(e)) if e.is_not_found() => return Err(missing()),
        Err(DriveError::BlobMissing(_) | DriveError::ContainerMissing(_)) => return Err(missing()),
        Err(e) => return Err(status_of_drive(e)),
    };
    let range = asked.req.capacity_range.as_ref();
    let wanted = match range {
        Some(r) if r.required_bytes > 0 => volume::size_for(range)?,
        _ => has,
    };
    if range.is_some_and(|r| r.limit_bytes > 0 && (r.limit_bytes as u64) < has) {
        return Err(Status::out_of_range(format!(
            "{named} holds {has} bytes, more than the limit asked"
        )));
    }
    copies::check(&source, has, &named, asked.req).await?;
    let size = wanted.max(has);
    let origin = Origin {
        source: asked.source.clone(),
        digest: asked.digest.clone(),
        size,
    };
    let metadata = origin.metadata();
    let pairs = origin::pairs(&metadata);
    match blob.copy_new_from(&source, &pairs).await {
        Ok(()) => {}
        Err(e) if e.code() == Some("BlobAlreadyExists") || e.is_changed_since_read() => {
            return Err(being_made(&asked.id))
        }
        Err(e) => return Err(status_of(e)),
    }
    if size > has {
        crate::resize::grow(blob, size)
            .await
            .map_err(status_of_drive)?;
    }
    tracing::info!(
        "made volume {} of {size} bytes from snapshot {spec}",
        blob.target()
    );
    Ok(size)
}
