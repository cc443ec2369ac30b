//! The drive's block layers below the memory cache, composed once at start-up,
//! as s3backer stacks its stores: the blob ([`RemoteBackend`]), under the disk
//! tier ([`DiskTier`]) when the mount has a disk cache, under the crypto layer
//! ([`CryptLayer`]) when the drive is encrypted. The memory cache asks the top
//! layer; the daemon keeps a handle on each layer it acts on.
//!
//! The crypto layer sits right under the memory cache: the memory cache holds
//! plaintext (what the filesystem reads again is not decrypted again), and
//! every byte below it, in the disk cache's files and on the blob, is
//! ciphertext.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::crypt::CryptLayer;
use super::diskcache::tier::DiskTier;
use super::diskcache::DiskCache;
use super::remote::RemoteBackend;
use super::{Backend, DeviceError};
use crate::luks::xts::XtsCipher;

/// A mounted drive's layers below the memory cache.
pub struct Stack {
    /// The layer the memory cache asks.
    top: Arc<dyn Backend>,
    remote: Arc<RemoteBackend>,
    disk: Option<Arc<DiskCache>>,
    /// Where the disk the memory cache sees starts on the blob's: an encrypted
    /// drive's data segment; 0 otherwise.
    data_offset: u64,
}

impl Stack {
    /// `remote`, under `disk` if the mount has a disk cache, under the
    /// crypto layer if the drive is encrypted (its data segment's cipher and
    /// where the segment starts).
    pub fn new(
        remote: RemoteBackend,
        disk: Option<Arc<DiskCache>>,
        crypt: Option<(XtsCipher, u64)>,
    ) -> Stack {
        let remote = Arc::new(remote);
        let below: Arc<dyn Backend> = match &disk {
            Some(cache) => Arc::new(DiskTier::new(cache.clone(), remote.clone())),
            None => remote.clone(),
        };
        let data_offset = crypt.as_ref().map_or(0, |(_, offset)| *offset);
        let top: Arc<dyn Backend> = match crypt {
            Some((cipher, offset)) => Arc::new(CryptLayer::new(below, cipher, offset)),
            None => below,
        };
        Stack {
            top,
            remote,
            disk,
            data_offset,
        }
    }

    /// The blob's layer: its health, its waits through outages, its fences.
    pub fn remote(&self) -> &RemoteBackend {
        &self.remote
    }

    /// Where the disk the memory cache sees starts on the blob's (an encrypted
    /// drive's data segment; 0 otherwise).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The disk cache, if the mount has one.
    pub fn disk_cache(&self) -> Option<&Arc<DiskCache>> {
        self.disk.as_ref()
    }
}

/// Everything goes to the top layer.
impl Backend for Stack {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.top.read(offset, buf)
    }
    fn read_scattered(&self, offset: u64, parts: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        self.top.read_scattered(offset, parts)
    }
    fn reads_scattered(&self) -> bool {
        self.top.reads_scattered()
    }
    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError> {
        self.top.write_runs(runs)
    }
    fn write_each(&self, runs: Vec<(u64, Bytes)>) -> Vec<Result<(), DeviceError>> {
        self.top.write_each(runs)
    }
    fn write_each_issued(
        &self,
        runs: Vec<(u64, Bytes)>,
        issued: Instant,
    ) -> Vec<Result<(), DeviceError>> {
        self.top.write_each_issued(runs, issued)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        self.top.discard(offset, len)
    }
    fn read_local(&self, offset: u64, blocks: &mut [&mut [u8]]) -> bool {
        self.top.read_local(offset, blocks)
    }
    fn has_local(&self) -> bool {
        self.top.has_local()
    }
    fn fail_fast_since(&self, issued: Instant) -> Result<(), DeviceError> {
        self.top.fail_fast_since(issued)
    }
    fn past_the_io_timeout(&self) -> bool {
        self.top.past_the_io_timeout()
    }
    fn probe(&self) -> Result<(), DeviceError> {
        self.top.probe()
    }
}
