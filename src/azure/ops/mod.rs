//! The REST operations, one file per thing they act on: [`container`] (a container),
//! [`blob`] (the blob as a whole, and the [`BlobClient`] type), [`pages`] (its
//! pages), [`lease`] (its lease), [`snapshot`] (its snapshots) and [`fence`] (the
//! sequence number that fences abandoned writes). Each file adds
//! its own `impl` block; all of them send through [`super::pipeline`].

pub mod blob;
pub mod container;
pub mod fence;
pub mod lease;
pub mod pages;
pub mod snapshot;

pub use blob::{BlobClient, BlobProperties, DeleteSnapshots};
pub use container::ContainerClient;
pub use fence::WriteFence;
pub use pages::{PageDiff, SegmentPlan, MAX_PUT_PAGE, PAGE};
