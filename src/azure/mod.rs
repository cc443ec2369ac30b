//! The Azure Blob Storage REST client for page blobs.
//!
//! No FUSE, no disks: accounts and signing ([`account`], [`sign`]), one async function
//! per operation ([`client`]), typed errors ([`error`]), retries ([`retry`]) and the XML
//! bodies ([`xml`]).

pub mod account;
pub mod client;
pub mod error;
pub mod ranges;
pub mod retry;
pub mod sign;
pub mod stats;
pub mod xml;

pub use account::{Account, Credential};
pub use client::{
    BlobClient, BlobProperties, BlobService, ContainerClient, DeleteSnapshots, PageDiff,
    SegmentPlan, MAX_PUT_PAGE, PAGE,
};
pub use error::{AzureError, Op};
pub use ranges::PageRange;
pub use retry::RetryPolicy;
pub use stats::StatsSnapshot;
