//! Volume snapshots as blob snapshots: a snapshot's id is its drive's id and
//! the blob snapshot's time (`container/NAME.vhd@TIME`, as `blobdrive` names
//! snapshots everywhere), and the CSI name it was taken as is in its metadata,
//! so taking it again by that name finds it instead of taking another.

use tonic::Status;

use super::proto::{CreateSnapshotRequest, ListSnapshotsRequest, ListSnapshotsResponse, Snapshot};
use super::volume::VolumeId;
use super::{flush, parameters, status_of, Driver};
use crate::azure::xml::BlobItem;
use crate::azure::{AzureError, BlobClient, BlobService};
use crate::vhd::FOOTER_SIZE;

/// The metadata name of the CSI name a snapshot was taken as.
pub const SNAPSHOT_META: &str = "blobdrive_csi_snapshot";

/// The metadata name of the digest of the parameters a snapshot was taken
/// with (not the volume's own record of what made it, which the snapshot
/// carries along).
const DIGEST_META: &str = "blobdrive_csi_snapshot_request";

/// On a blob snapshot taken for a clone (`clone.rs`): the id of the volume it
/// is copied to. Such a snapshot is no VolumeSnapshot.
pub const CLONE_FOR_META: &str = "blobdrive_csi_clone_for";

/// Whether a listed snapshot was taken for a clone (not a VolumeSnapshot).
fn taken_for_a_clone(metadata: &[(String, String)]) -> bool {
    metadata
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case(CLONE_FOR_META))
}

/// A snapshot of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotId {
    pub volume: VolumeId,
    /// The blob snapshot's time, as the service names it.
    pub at: String,
}

impl SnapshotId {
    /// Parses `container/NAME.vhd@TIME`; `None` for anything this driver never
    /// made.
    pub fn parse(id: &str) -> Option<SnapshotId> {
        let (volume, at) = id.split_once('@')?;
        // Any text but a time names no snapshot this driver took: NOT_FOUND
        // to its callers, never a pair of snapshots to judge.
        if !crate::azure::xml::is_snapshot_id(at) || creation_time(at).is_none() {
            return None;
        }
        Some(SnapshotId {
            volume: VolumeId::parse(volume)?,
            at: at.to_string(),
        })
    }

    pub fn spec(&self) -> String {
        format!("{}@{}", self.volume.spec(), self.at)
    }

    pub fn blob(&self, svc: &BlobService) -> BlobClient {
        svc.blob(&self.volume.container, &self.volume.blob)
            .at_snapshot(Some(&self.at))
    }
}

/// Every snapshot of the volumes in `container`, as listed (with metadata),
/// but those taken for a clone (see `clone.rs`), which are no VolumeSnapshots.
pub async fn in_container(
    svc: &BlobService,
    container: &str,
) -> Result<Vec<(SnapshotId, BlobItem)>, AzureError> {
    let items = match svc.container(container).list_blobs("", true).await {
        Ok(items) => items,
        Err(e) if e.is_not_found() => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    Ok(items
        .into_iter()
        .filter(|item| !taken_for_a_clone(&item.metadata))
        .filter_map(|item| {
            let at = item.snapshot.clone()?;
            let id = SnapshotId::parse(&format!("{container}/{}@{at}", item.name))?;
            Some((id, item))
        })
        .collect())
}

/// The CSI name `item` was taken as, if any.
pub fn name_of(item: &BlobItem) -> Option<&str> {
    item.metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(SNAPSHOT_META))
        .map(|(_, v)| v.as_str())
}

/// The digest of the request `item` was taken with (see
/// [`parameters::digest`]), if it was recorded.
fn digest_of(item: &BlobItem) -> Option<&str> {
    item.metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(DIGEST_META))
        .map(|(_, v)| v.as_str())
}

/// Answers CreateSnapshot: a blob snapshot of the volume, its name and the
/// digest of its parameters in its metadata. The same name asked again
/// answers the snapshot taken then, found by listing; asked of another volume
/// or with other parameters, ALREADY_EXISTS.
pub async fn create(driver: &Driver, req: &CreateSnapshotRequest) -> Result<Snapshot, Status> {
    if req.source_volume_id.is_empty() {
        return Err(Status::invalid_argument("a source volume id is required"));
    }
    if req.name.is_empty() {
        return Err(Status::invalid_argument("a snapshot name is required"));
    }
    super::volume::check_name(&req.name, "snapshot")?;
    parameters::check_snapshot(&req.parameters)?;
    let source = VolumeId::known(&req.source_volume_id)?;
    let digest = parameters::digest(&req.parameters, &[]);
    if let Some(found) = taken_as(driver, &source, &req.name, &digest).await? {
        return Ok(found);
    }
    let blob = driver.service.blob(&source.container, &source.blob);
    let props = match blob.properties().await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => {
            return Err(Status::not_found(format!("no volume {}", source.spec())))
        }
        Err(e) => return Err(status_of(e)),
    };
    flush::before_snapshot(driver, &source, &props).await;
    let at = blob
        .create_snapshot_with(&[(SNAPSHOT_META, &req.name), (DIGEST_META, &digest)])
        .await
        .map_err(status_of)?;
    let id = SnapshotId { volume: source, at };
    tracing::info!("took snapshot {} as {}", id.spec(), req.name);
    Ok(message(&id, props.content_length))
}

/// The snapshot taken already by `name` (in the source's container or the
/// driver's), if any: the same answer, or ALREADY_EXISTS if it was of another
/// volume or with other parameters.
async fn taken_as(
    driver: &Driver,
    source: &VolumeId,
    name: &str,
    digest: &str,
) -> Result<Option<Snapshot>, Status> {
    let mut containers = vec![source.container.clone()];
    containers.extend(driver.container.clone());
    containers.dedup();
    for container in &containers {
        let all = in_container(&driver.service, container)
            .await
            .map_err(status_of)?;
        let Some((id, item)) = all.into_iter().find(|(_, i)| name_of(i) == Some(name)) else {
            continue;
        };
        if id.volume != *source {
            return Err(Status::already_exists(format!(
                "snapshot {name} was taken of volume {}, not {}",
                id.volume.spec(),
                source.spec()
            )));
        }
        if digest_of(&item).is_some_and(|d| d != digest) {
            return Err(Status::already_exists(format!(
                "snapshot {name} was taken with other parameters"
            )));
        }
        let len = item.content_length.unwrap_or_default();
        return Ok(Some(message(&id, len)));
    }
    Ok(None)
}

/// Answers ListSnapshots: by id, by source volume, or every snapshot of the
/// volumes in the driver's container, in pages.
pub async fn list(
    driver: &Driver,
    req: &ListSnapshotsRequest,
) -> Result<ListSnapshotsResponse, Status> {
    let by_id = (!req.snapshot_id.is_empty()).then(|| SnapshotId::parse(&req.snapshot_id));
    let by_source =
        (!req.source_volume_id.is_empty()).then(|| VolumeId::parse(&req.source_volume_id));
    // A snapshot or a volume this driver never made: none to list.
    if matches!(by_id, Some(None)) || matches!(by_source, Some(None)) {
        return Ok(ListSnapshotsResponse::default());
    }
    let (by_id, by_source) = (by_id.flatten(), by_source.flatten());
    let container = by_id
        .as_ref()
        .map(|i| i.volume.container.clone())
        .or_else(|| by_source.as_ref().map(|v| v.container.clone()))
        .or_else(|| driver.container.clone());
    let Some(container) = container else {
        return Err(Status::failed_precondition(
            "ListSnapshots lists the driver's --container, and none was given",
        ));
    };
    let all = in_container(&driver.service, &container)
        .await
        .map_err(status_of)?
        .into_iter()
        .filter(|(id, _)| by_id.as_ref().is_none_or(|want| want == id))
        .filter(|(id, _)| by_source.as_ref().is_none_or(|v| *v == id.volume))
        .map(|(id, item)| message(&id, item.content_length.unwrap_or_default()))
        .collect();
    page(all, &req.starting_token, req.max_entries)
}

/// The CSI message for a snapshot of a `size`-byte blob (footer included).
pub fn message(id: &SnapshotId, blob_len: u64) -> Snapshot {
    Snapshot {
        size_bytes: blob_len.saturating_sub(FOOTER_SIZE) as i64,
        snapshot_id: id.spec(),
        source_volume_id: id.volume.spec(),
        creation_time: creation_time(&id.at),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// A snapshot time (`2026-11-22T11:05:54.5810000Z`) as a protobuf timestamp.
fn creation_time(at: &str) -> Option<prost_types::Timestamp> {
    let (date, time) = at.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let nanos = format!("{frac:0<9}")[..9].parse::<i32>().ok()?;
    Some(prost_types::Timestamp {
        seconds: days_from_civil(y, m, day) * 86_400 + hh * 3600 + mm * 60 + ss,
        nanos,
    })
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// One page of `all` (sorted by id) from `token`, at most `max` (0: all).
pub fn page(
    mut all: Vec<Snapshot>,
    token: &str,
    max: i32,
) -> Result<ListSnapshotsResponse, Status> {
    all.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
    let start = super::volume::starting_at(token)?;
    let (window, next_token) = super::volume::page(start, all.len(), max, usize::MAX, "snapshots")?;
    Ok(ListSnapshotsResponse {
        entries: all
            .drain(window)
            .map(|s| super::proto::list_snapshots_response::Entry { snapshot: Some(s) })
            .collect(),
        next_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_name_their_volume_and_time() {
        let id = SnapshotId::parse("vols/pvc-1.vhd@2026-11-22T11:05:54.5810000Z").unwrap();
        assert_eq!(id.volume.spec(), "vols/pvc-1.vhd");
        assert_eq!(id.spec(), "vols/pvc-1.vhd@2026-11-22T11:05:54.5810000Z");
        for bad in [
            "vols/pvc-1.vhd",
            "vols/pvc-1.vhd@",
            "x@y",
            "vols/a.vhd@a b",
            "vols/a.vhd@notatime",
        ] {
            assert_eq!(SnapshotId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn snapshot_times_become_timestamps() {
        let t = creation_time("2026-11-22T11:05:54.5810000Z").unwrap();
        assert_eq!(t.seconds, 1_795_345_554);
        assert_eq!(t.nanos, 581_000_000);
        assert_eq!(creation_time("1970-01-01T00:00:00Z").unwrap().seconds, 0);
        assert_eq!(creation_time("garbage"), None);
    }
}
