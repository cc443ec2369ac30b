//! An in-memory backend with request counters, for tests of the cache that need
//! no network and must count what would have been sent.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use bytes::Bytes;

use super::{fill_parts, Backend, DeviceError, MAX_GET, MAX_RUN, SECTOR};

#[derive(Default)]
pub struct MemBackend {
    data: Mutex<Vec<u8>>,
    pub reads: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Latency added to every read, so tests can catch fetches in flight.
    pub read_delay_us: AtomicU64,
    /// Latency added to every write call, so tests can catch flushes in flight.
    pub write_delay_us: AtomicU64,
    pub writes: AtomicU64,
    pub discards: AtomicU64,
    /// When set, every write and discard fails (a backend that went away).
    pub fail_writes: std::sync::atomic::AtomicBool,
    /// When set, the backend has a local copy of everything ([`Backend::read_local`]
    /// serves every read), as a disk cache that holds the whole drive.
    pub local: std::sync::atomic::AtomicBool,
    /// Reads served by `read_local`, and their bytes.
    pub local_reads: AtomicU64,
    pub local_bytes: AtomicU64,
    /// When set, the backend reads straight into scattered parts
    /// ([`Backend::reads_scattered`]), as the blob's does without a disk cache.
    pub scattered: std::sync::atomic::AtomicBool,
    /// Reads served by `read_scattered`.
    pub scattered_reads: AtomicU64,
}

impl MemBackend {
    pub fn new(size: u64) -> MemBackend {
        MemBackend {
            data: Mutex::new(vec![0; size as usize]),
            ..Default::default()
        }
    }

    pub fn contents(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }

    /// Waits the latency set for reads (`read_delay_us`).
    fn read_delay(&self) {
        let delay = self.read_delay_us.load(Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
    }

    /// Grows the disk to `size` bytes of zeros past the old end, as a resized blob.
    pub fn grow(&self, size: u64) {
        self.data.lock().unwrap().resize(size as usize, 0);
    }
}

fn check(offset: u64, len: u64, size: usize) -> Result<(), DeviceError> {
    if !offset.is_multiple_of(SECTOR) || !len.is_multiple_of(SECTOR) || offset + len > size as u64 {
        return Err(DeviceError::OutOfRange { offset, len });
    }
    Ok(())
}

impl Backend for MemBackend {
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.read_delay();
        let data = self.data.lock().unwrap();
        check(offset, buf.len() as u64, data.len())?;
        self.reads.fetch_add(1, Relaxed);
        self.bytes_read.fetch_add(buf.len() as u64, Relaxed);
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn reads_scattered(&self) -> bool {
        self.scattered.load(Relaxed)
    }

    fn read_scattered(&self, offset: u64, parts: &mut [&mut [u8]]) -> Result<(), DeviceError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(len as u64 <= MAX_GET, "read over {MAX_GET} bytes");
        self.read_delay();
        let data = self.data.lock().unwrap();
        check(offset, len as u64, data.len())?;
        self.reads.fetch_add(1, Relaxed);
        self.scattered_reads.fetch_add(1, Relaxed);
        self.bytes_read.fetch_add(len as u64, Relaxed);
        fill_parts(parts, &data[offset as usize..]);
        Ok(())
    }

    fn has_local(&self) -> bool {
        self.local.load(Relaxed)
    }

    fn read_local(&self, offset: u64, blocks: &mut [&mut [u8]]) -> bool {
        if !self.local.load(Relaxed) {
            return false;
        }
        self.read_delay();
        let data = self.data.lock().unwrap();
        let copied = fill_parts(blocks, &data[offset as usize..]);
        self.local_reads.fetch_add(1, Relaxed);
        self.local_bytes.fetch_add(copied as u64, Relaxed);
        true
    }

    fn write_runs(&self, runs: Vec<(u64, Bytes)>) -> Result<(), DeviceError> {
        if self.fail_writes.load(Relaxed) {
            return Err(DeviceError::Io("backend unavailable".into()));
        }
        let delay = self.write_delay_us.load(Relaxed);
        if delay > 0 {
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        let mut data = self.data.lock().unwrap();
        for (offset, bytes) in runs {
            check(offset, bytes.len() as u64, data.len())?;
            assert!(bytes.len() as u64 <= MAX_RUN, "run over 4 MiB");
            self.writes.fetch_add(1, Relaxed);
            data[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if self.fail_writes.load(Relaxed) {
            return Err(DeviceError::Io("backend unavailable".into()));
        }
        let mut data = self.data.lock().unwrap();
        check(offset, len, data.len())?;
        self.discards.fetch_add(1, Relaxed);
        data[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
}
