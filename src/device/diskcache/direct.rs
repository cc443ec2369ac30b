//! Reads of the data file that bypass the kernel's page cache (`O_DIRECT`), into
//! buffers of huge pages.
//!
//! Through the page cache, a warm read from the disk cache went at about 0.55 of
//! the disk's own sequential read speed: hits are 1 MiB slots wherever the index
//! put them, the file's read-ahead cannot follow eight prefetch workers reading
//! them at once, and on the VM's virtio disk a 1 MiB read costs nearly what a
//! 4 MiB one does. A direct read asks the device for exactly the bytes, several
//! slots in one request where they lie next to each other in the file, and the
//! daemon no longer pays for the page cache's own work (finding and adding
//! folios, the file's read-ahead: 38% of its CPU in that read). The bytes are
//! not held twice in memory either.
//!
//! The request's size is what matters, and it depends on the memory the read
//! lands in: one segment per physically contiguous piece, at most 254 on that
//! disk, so into 4 KiB pages a request holds about 1 MiB (1.2 GiB/s in `fio`),
//! and into 2 MiB pages all of a 4 MiB read (3.4 GiB/s). Reads therefore land in
//! bounce buffers of huge pages ([`HugeBuf`]) and are copied out, as the page
//! cache's copy did.
//!
//! Writes stay buffered: the kernel keeps the two coherent (a direct read of a
//! range first writes back its dirty pages). A filesystem that refuses
//! `O_DIRECT` (tmpfs, some FUSE filesystems) gets no direct handle, and a direct
//! read the kernel refuses turns direct reads off for the mount; reads then go
//! through the page cache.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use crate::device::blockmem::HugeBuf;

/// Alignment of direct reads' offsets and lengths: 4 KiB covers every logical
/// block size Linux block devices ask for. (Memory is aligned by [`HugeBuf`].)
pub const ALIGN: usize = 4096;

/// The largest single read through a bounce buffer (one huge page, room for a
/// slot of the data file and more). Longer reads are split.
pub const MAX: usize = 2 << 20;

/// The smallest read worth a bounce buffer: a random read's single piece
/// (64 KiB) goes through the page cache, where the cost of a request matters
/// less than the copy, and a burst of them at queue depth 32 would otherwise
/// each want a buffer.
pub const MIN: usize = 256 << 10;

/// Bounce buffers at most (16 MiB): reads past them, all at once, go through the
/// page cache, so the daemon's memory stays bounded whatever the queue depth.
const BOUNCES: usize = 8;

/// The data file opened a second time with `O_DIRECT`, and the buffers its
/// reads land in.
pub struct DirectReader {
    file: File,
    on: AtomicBool,
    /// Idle bounce buffers, and how many exist (idle or in use).
    pool: Mutex<(Vec<HugeBuf>, usize)>,
}

impl DirectReader {
    /// Direct reads from `file`, a handle opened with `O_DIRECT`.
    pub fn new(file: File) -> DirectReader {
        DirectReader {
            file,
            on: AtomicBool::new(true),
            pool: Mutex::new((Vec::new(), 0)),
        }
    }

    /// Fills `buf` from `offset` with direct reads, if it can: `Ok(false)` when
    /// offset or length is not aligned, the read is short of [`MIN`], direct
    /// reads are off, or every bounce buffer is in use or none can be mapped (the
    /// caller then reads through the page cache). A read the kernel refuses
    /// (`EINVAL`) turns direct reads off for good.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<bool> {
        if !self.on.load(Relaxed)
            || buf.len() < MIN
            || !buf.len().is_multiple_of(ALIGN)
            || !offset.is_multiple_of(ALIGN as u64)
        {
            return Ok(false);
        }
        let Some(mut bounce) = self.take() else {
            return Ok(false);
        };
        let mut result = Ok(true);
        for (k, part) in buf.chunks_mut(MAX).enumerate() {
            let room = &mut bounce[..part.len()];
            match self.file.read_exact_at(room, offset + (k * MAX) as u64) {
                Ok(()) => part.copy_from_slice(room),
                Err(e) if self.refuses(&e) => {
                    result = Ok(false);
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.give(bounce);
        result
    }

    /// Fills `bufs` in turn from `offset` with one direct read straight into
    /// them, if it can: `Ok(false)` when a buffer is not aligned in memory or
    /// length, the offset is not, or direct reads are off. Cache blocks qualify:
    /// they are 64 KiB parts of huge-page mappings, so a request holds one
    /// segment per block.
    pub fn read_vectored_exact_at(
        &self,
        bufs: &mut [&mut [u8]],
        offset: u64,
    ) -> std::io::Result<bool> {
        if !self.on.load(Relaxed)
            || !offset.is_multiple_of(ALIGN as u64)
            || bufs.iter().any(|b| {
                b.is_empty() || b.len() % ALIGN != 0 || !(b.as_ptr() as usize).is_multiple_of(ALIGN)
            })
        {
            return Ok(false);
        }
        match super::preadv::read_vectored_exact_at(&self.file, bufs, offset) {
            Ok(()) => Ok(true),
            Err(e) if self.refuses(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Whether `e` is the kernel refusing a direct read (`EINVAL`): direct reads
    /// are then off for good.
    fn refuses(&self, e: &std::io::Error) -> bool {
        let refused = e.raw_os_error() == Some(libc::EINVAL);
        if refused {
            self.on.store(false, Relaxed);
        }
        refused
    }

    /// An idle bounce buffer, or a new one while there are fewer than [`BOUNCES`].
    fn take(&self) -> Option<HugeBuf> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = pool.0.pop() {
            return Some(b);
        }
        if pool.1 >= BOUNCES {
            return None;
        }
        pool.1 += 1;
        drop(pool);
        let made = HugeBuf::new(MAX);
        if made.is_none() {
            self.pool.lock().unwrap_or_else(|p| p.into_inner()).1 -= 1;
        }
        made
    }

    fn give(&self, b: HugeBuf) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn direct(path: &std::path::Path) -> Option<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
    }

    #[test]
    fn aligned_reads_come_back_exact_and_others_are_left_to_the_caller() {
        let len = MAX + 3 * ALIGN;
        const { assert!(MIN <= 2 * ALIGN + MAX) };
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, &bytes).unwrap();
        let Some(f) = direct(&path) else {
            eprintln!("skipped: this filesystem refuses O_DIRECT");
            return;
        };
        let r = DirectReader::new(f);
        // Any memory will do (the bytes land in a bounce buffer first), and a
        // read longer than the largest is split.
        let mut out = vec![0u8; MAX + 2 * ALIGN + 1];
        assert!(r.read_exact_at(&mut out[1..], ALIGN as u64).unwrap());
        assert_eq!(&out[1..], &bytes[ALIGN..]);
        // Unaligned offset or length, or a small read: not done.
        let mut some = vec![0u8; MIN];
        assert!(!r.read_exact_at(&mut some, 512).unwrap());
        assert!(!r.read_exact_at(&mut some[..MIN - 512], 0).unwrap());
        assert!(!r.read_exact_at(&mut some[..MIN - ALIGN], 0).unwrap());
        // Past the end of the file: an error, never a short buffer taken as data.
        assert!(r.read_exact_at(&mut some, len as u64).is_err());
        // Every bounce buffer in use: not done (the caller reads through the
        // page cache), and done again once one is back.
        let held: Vec<HugeBuf> = (0..BOUNCES).map(|_| r.take().unwrap()).collect();
        assert!(!r.read_exact_at(&mut some, 0).unwrap());
        for b in held {
            r.give(b);
        }
        assert!(r.read_exact_at(&mut some, 0).unwrap());
        assert_eq!(some, bytes[..MIN]);
    }
}
