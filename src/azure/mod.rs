//! The Azure Blob Storage REST client for page blobs.
//!
//! No FUSE, no disks: accounts ([`account`]), how requests are authorised ([`auth`]:
//! Shared Key, SAS, Entra ID tokens), the HTTP client and its TLS trust ([`http`]),
//! the request pipeline with its retries ([`pipeline`]; [`retry`], the limits;
//! `verdict`, the rules of what to do after each attempt) and where
//! a read's body lands ([`scatter`]),
//! one async function per operation grouped by what it acts on ([`ops`]), typed errors
//! ([`error`]) and the XML bodies ([`xml`]).

pub mod account;
pub mod auth;
pub mod crc64;
pub mod error;
pub mod gate;
pub mod http;
pub mod ops;
pub mod pipeline;
pub mod ranges;
pub mod retry;
pub mod scatter;
pub mod stats;
pub mod text;
mod verdict;
pub mod xml;

pub use account::{Account, Credential};
pub use error::{AzureError, Op};
pub use ops::{
    BlobClient, BlobProperties, ContainerClient, DeleteSnapshots, PageDiff, PageWalk, SegmentPlan,
    WriteFence, MAX_PUT_PAGE, PAGE,
};
pub use pipeline::BlobService;
pub use ranges::PageRange;
pub use retry::RetryPolicy;
pub use scatter::Scatter;
pub use stats::StatsSnapshot;
