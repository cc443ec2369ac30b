//! Moving images in and out of Azure: sparse upload with resume, sparse download,
//! incremental download between snapshots.
//!
//! Only written data travels: uploads skip zero pages and file holes, downloads
//! fetch only allocated ranges and leave holes as holes. Everything runs as
//! parallel requests of at most 4 MiB.

pub mod download;
pub mod progress;
pub mod upload;

use thiserror::Error;

use crate::azure::AzureError;
use crate::drive::DriveError;

/// Requests in flight at once.
pub const PARALLEL: usize = 8;
/// Largest single request body.
pub const CHUNK: u64 = 4 * 1024 * 1024;

#[derive(Debug, Error)]
pub enum TransferError {
    #[error(transparent)]
    Azure(#[from] AzureError),
    #[error(transparent)]
    Drive(#[from] DriveError),
    /// The cause is in the message, not in the error chain, so that a chain
    /// printed as one line names it once.
    #[error("{path}: {error}")]
    File { path: String, error: std::io::Error },
    #[error("{0}")]
    Refused(String),
}

pub(crate) fn file_err(
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> TransferError + '_ {
    move |error| TransferError::File {
        path: path.display().to_string(),
        error,
    }
}

/// What a transfer did, for the closing line and `--json`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// The disk's size.
    pub image_bytes: u64,
    /// Bytes that crossed the network.
    pub bytes_transferred: u64,
    /// Requests made for data.
    pub requests: u64,
    /// Bytes found already in place (resume) and not sent again.
    pub skipped_bytes: u64,
    pub seconds: f64,
    /// How an incremental download found the changes: "diff" or "full-compare".
    pub method: Option<String>,
    /// `upload --resume` found the upload already finished from the same file.
    pub already_complete: bool,
}
