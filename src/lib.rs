//! blobdrive: fixed-VHD Azure page blobs as Linux drives.
//!
//! The library is layered so each part can be tested alone: [`azure`] speaks the
//! Blob REST API and knows nothing of disks, [`vhd`] reads and writes the fixed VHD
//! footer, [`drive`] combines the two into "a page blob that is a valid drive", and
//! the `blobdrive` binary's commands are thin wrappers over these.

// First, so that its `println!` and the rest replace the standard ones in every
// module below (and, through `#[macro_use]`, in the binary).
#[macro_use]
pub mod output;

pub mod azure;
pub mod blobref;
pub mod changes;
pub mod csi;
pub mod device;
pub mod drive;
pub mod encrypted;
pub mod fuse;
pub mod luks;
pub mod mount;
pub mod pool;
pub mod privsep;
pub mod resize;
pub mod secret_file;
pub mod size;
pub mod snapshot;
pub mod transfer;
pub mod vhd;
pub mod words;
