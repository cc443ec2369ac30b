//! Volume snapshots as blob snapshots: a snapshot's id is its drive's id and
//! the blob snapshot's time (`container/NAME.vhd@TIME`, as `blobdrive` names
//! snapshots everywhere), and the CSI name it was taken as is in its metadata,
//! so taking it again by that name finds it instead of taking another.

use tonic::Status;

use super::proto::{ListSnapshotsResponse, Snapshot};
use super::volume::VolumeId;
use crate::azure::xml::BlobItem;
use crate::azure::{AzureError, BlobClient, BlobService};
use crate::vhd::FOOTER_SIZE;

/// The metadata name of the CSI name a snapshot was taken as.
pub const SNAPSHOT_META: &str = "blobdrive_csi_snapshot";

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
        if !crate::azure::xml::is_snapshot_id(at) {
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
        .filter(|item| !super::clone::taken_for_a_clone(&item.metadata))
        .filter_map(|item| {
            let at = item.snapshot.clone()?;
            let id = SnapshotId::parse(&format!("{container}/{}@{at}", item.name))?;
            Some((id, item))
        })
        .collect())
}

/// Whether a volume copied from a snapshot keeps the snapshot's metadata
/// `name`: not its source's publication (a new volume is published nowhere),
/// the name it was taken as, nor what a clone records of its own.
pub fn kept_by_a_copy(name: &str) -> bool {
    ![
        super::publish::PUBLISHED_META,
        SNAPSHOT_META,
        super::clone::CLONE_FOR_META,
        super::clone::CLONED_FROM_META,
    ]
    .iter()
    .any(|m| name.eq_ignore_ascii_case(m))
}

/// The CSI name `item` was taken as, if any.
pub fn name_of(item: &BlobItem) -> Option<&str> {
    item.metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(SNAPSHOT_META))
        .map(|(_, v)| v.as_str())
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
        for bad in ["vols/pvc-1.vhd", "vols/pvc-1.vhd@", "x@y", "vols/a.vhd@a b"] {
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
