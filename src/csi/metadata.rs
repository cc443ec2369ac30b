//! The SnapshotMetadata service: which blocks of a snapshot hold data, and
//! which changed between two snapshots of a volume, for backup tools (through
//! the external-snapshot-metadata sidecar). The extents come from
//! [`crate::changes`]: Get Page Ranges, with `prevsnapshot` for a delta.
//!
//! Extents are VARIABLE_LENGTH, in bytes of the volume's disk (a VHD footer is
//! never one), sorted and disjoint across the whole stream, at most
//! `max_results` in a message. A stream is produced as it is sent: the task
//! making it waits while the client has not taken the last messages, so what
//! it holds is a few messages and a page of the service's answer.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::proto::snapshot_metadata_server::SnapshotMetadata;
use super::proto::{
    BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use super::snapshots::SnapshotId;
use crate::azure::{BlobService, PageRange};
use crate::changes::{self, ChangesError, Extents};

/// Extents in a message when the client names no limit: about 20 KiB of it.
pub const DEFAULT_MAX_RESULTS: usize = 1000;
/// The most extents in a message, whatever the client asks: what is held
/// stays small (the spec lets the plugin send fewer than asked).
pub const MOST_RESULTS: usize = 10_000;
/// Messages made ahead of the client.
const AHEAD: usize = 2;

pub struct MetadataService {
    service: BlobService,
}

impl MetadataService {
    pub fn new(service: BlobService) -> MetadataService {
        MetadataService { service }
    }

    /// The snapshot `id` names; NOT_FOUND for an id this driver never made.
    fn snapshot(&self, id: &str, field: &str) -> Result<SnapshotId, Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument(format!("{field} is required")));
        }
        SnapshotId::parse(id).ok_or_else(|| Status::not_found(format!("no snapshot {id}")))
    }
}

/// The offset a stream starts at: not negative.
fn starting_offset(offset: i64) -> Result<u64, Status> {
    u64::try_from(offset)
        .map_err(|_| Status::invalid_argument(format!("starting_offset {offset} is negative")))
}

/// Extents in a message: `max_results`, or the default when 0.
fn batch_size(max_results: i32) -> Result<usize, Status> {
    match max_results {
        n if n < 0 => Err(Status::invalid_argument(format!(
            "max_results {n} is negative"
        ))),
        0 => Ok(DEFAULT_MAX_RESULTS),
        n => Ok((n as usize).min(MOST_RESULTS)),
    }
}

/// The status of a stream that could not start, as the spec names them.
fn status_of(e: ChangesError) -> Status {
    if e.is_not_found() {
        return Status::not_found(e.to_string());
    }
    match e {
        ChangesError::PastTheEnd { .. } => Status::out_of_range(e.to_string()),
        ChangesError::NotASnapshot(_)
        | ChangesError::OtherDrive { .. }
        | ChangesError::NotOlder { .. } => Status::invalid_argument(e.to_string()),
        ChangesError::Azure(a) | ChangesError::Drive(crate::drive::DriveError::Azure(a)) => {
            super::status_of(a)
        }
        ChangesError::Drive(d) => Status::failed_precondition(d.to_string()),
    }
}

fn blocks(extents: Vec<PageRange>) -> Vec<BlockMetadata> {
    extents
        .into_iter()
        .map(|r| BlockMetadata {
            byte_offset: r.start as i64,
            size_bytes: r.len() as i64,
        })
        .collect()
}

/// Sends `extents` as messages of at most `max` blocks made by `message`
/// (from the disk's size and the blocks), from a task of its own; at least one
/// message, so that even an empty stream tells the volume's size.
fn stream<T: Send + 'static>(
    mut extents: Extents,
    max: usize,
    message: fn(i64, Vec<BlockMetadata>) -> T,
) -> ReceiverStream<Result<T, Status>> {
    let (tx, rx) = mpsc::channel(AHEAD);
    let capacity = extents.disk_size() as i64;
    tokio::spawn(async move {
        let mut sent = 0usize;
        loop {
            let next = match extents.next_batch(max).await {
                Ok(Some(batch)) => Ok(message(capacity, blocks(batch))),
                Ok(None) if sent == 0 => Ok(message(capacity, vec![])),
                Ok(None) => break,
                Err(e) => Err(super::status_of(e)),
            };
            let failed = next.is_err();
            // The client went away: nothing more to make.
            if tx.send(next).await.is_err() || failed {
                break;
            }
            sent += 1;
        }
        tracing::debug!(
            "sent {sent} messages of extents by {:?}, at most {} ranges held",
            extents.method(),
            extents.peak_held()
        );
    });
    ReceiverStream::new(rx)
}

#[tonic::async_trait]
impl SnapshotMetadata for MetadataService {
    type GetMetadataAllocatedStream = ReceiverStream<Result<GetMetadataAllocatedResponse, Status>>;
    type GetMetadataDeltaStream = ReceiverStream<Result<GetMetadataDeltaResponse, Status>>;

    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let req = request.into_inner();
        let id = self.snapshot(&req.snapshot_id, "snapshot_id")?;
        let from = starting_offset(req.starting_offset)?;
        let max = batch_size(req.max_results)?;
        let extents = changes::allocated(&id.blob(&self.service), from)
            .await
            .map_err(status_of)?;
        Ok(Response::new(stream(extents, max, |capacity, blocks| {
            GetMetadataAllocatedResponse {
                block_metadata_type: BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: capacity,
                block_metadata: blocks,
            }
        })))
    }

    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let req = request.into_inner();
        let base = self.snapshot(&req.base_snapshot_id, "base_snapshot_id")?;
        let target = self.snapshot(&req.target_snapshot_id, "target_snapshot_id")?;
        let from = starting_offset(req.starting_offset)?;
        let max = batch_size(req.max_results)?;
        let extents = changes::delta(&base.blob(&self.service), &target.blob(&self.service), from)
            .await
            .map_err(status_of)?;
        Ok(Response::new(stream(extents, max, |capacity, blocks| {
            GetMetadataDeltaResponse {
                block_metadata_type: BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: capacity,
                block_metadata: blocks,
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_limits_are_checked_before_any_lookup() {
        assert_eq!(starting_offset(0).unwrap(), 0);
        assert_eq!(starting_offset(4096).unwrap(), 4096);
        let e = starting_offset(-1).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(batch_size(0).unwrap(), DEFAULT_MAX_RESULTS);
        assert_eq!(batch_size(3).unwrap(), 3);
        assert_eq!(batch_size(i32::MAX).unwrap(), MOST_RESULTS);
        assert_eq!(
            batch_size(-3).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
