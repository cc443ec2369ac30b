//! Reads of the data file that bypass the kernel's page cache (`O_DIRECT`).
//!
//! The disk cache is itself a cache: keeping its bytes in the page cache as well
//! holds them twice, crowds out the pages of the filesystem on the drive, and
//! costs the daemon the page cache's own work on every read (finding and adding
//! folios, the file's read-ahead, accounting): 38% of the daemon's CPU in a warm
//! sequential read from the disk cache, in a profile (docs/benchmarks.md). A
//! direct read asks the device for exactly the bytes and has them land in the
//! caller's buffer where it is aligned (read-ahead's are), else in an aligned
//! buffer of ours, from which they are copied as the page cache's copy did.
//!
//! Writes stay buffered: the kernel keeps the two coherent (a direct read of a
//! range first writes back its dirty pages). A filesystem that refuses
//! `O_DIRECT` (tmpfs, some FUSE filesystems) gets no direct handle, and a
//! direct read the kernel refuses turns direct reads off for the mount; reads
//! then go through the page cache as before.

use std::alloc::{alloc, dealloc, Layout};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

/// Alignment of direct reads: buffer, offset and length. 4 KiB covers every
/// logical block size and DMA alignment Linux block devices ask for.
pub const ALIGN: usize = 4096;

/// Aligned buffers kept between reads: as many as prefetch workers usually
/// read at once; more are made when needed and freed after.
const KEEP: usize = 8;

/// A heap buffer aligned to [`ALIGN`], whose length is a multiple of it.
struct Aligned {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value alone.
unsafe impl Send for Aligned {}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = Layout::from_size_align(len, ALIGN).expect("a valid layout");
        // SAFETY: len > 0 (callers pass whole pieces).
        let p = unsafe { alloc(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Aligned { ptr, len }
    }

    fn slice(&mut self, n: usize) -> &mut [u8] {
        assert!(n <= self.len);
        // SAFETY: ptr..ptr+len is ours; the bytes may be uninitialised, but
        // they are only ever written by the kernel's read before being read,
        // and `read_exact_at` fails rather than leave any of them unwritten.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), n) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, ALIGN),
            )
        };
    }
}

/// The data file opened a second time with `O_DIRECT`, and the buffers its
/// reads land in.
pub struct DirectReader {
    file: File,
    /// The largest read: one slot of the data file.
    max: usize,
    on: AtomicBool,
    pool: Mutex<Vec<Aligned>>,
}

impl DirectReader {
    /// Reads of at most `max` bytes (a multiple of [`ALIGN`]) from `file`, a
    /// handle opened with `O_DIRECT`.
    pub fn new(file: File, max: usize) -> DirectReader {
        DirectReader {
            file,
            max,
            on: AtomicBool::new(true),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// Fills `buf` from `offset` with a direct read, if it can: `Ok(false)`
    /// when the read is not aligned, too large, or direct reads are off (the
    /// caller reads through the page cache instead). A direct read the kernel
    /// refuses (`EINVAL`) turns direct reads off for good.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<bool> {
        let n = buf.len();
        if !self.on.load(Relaxed)
            || n == 0
            || n > self.max
            || n % ALIGN != 0
            || offset % ALIGN as u64 != 0
        {
            return Ok(false);
        }
        // Aligned memory (read-ahead's runs) is read into as it is; anything else
        // through an aligned buffer of our own.
        let result = if buf.as_ptr().align_offset(ALIGN) == 0 {
            self.file.read_exact_at(buf, offset)
        } else {
            let mut bounce = self.take();
            let r = self.file.read_exact_at(bounce.slice(n), offset);
            if r.is_ok() {
                buf.copy_from_slice(bounce.slice(n));
            }
            self.give(bounce);
            r
        };
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.on.store(false, Relaxed);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn take(&self) -> Aligned {
        let kept = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        kept.unwrap_or_else(|| Aligned::new(self.max))
    }

    fn give(&self, b: Aligned) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < KEEP {
            pool.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    fn direct(path: &std::path::Path) -> Option<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()
    }

    #[test]
    fn aligned_reads_come_back_exact_and_others_are_left_to_the_caller() {
        let bytes: Vec<u8> = (0..4 * ALIGN).map(|i| (i * 7 % 251) as u8).collect();
        let (_dir, path) = file_with(&bytes);
        let Some(f) = direct(&path) else {
            eprintln!("skipped: this filesystem refuses O_DIRECT");
            return;
        };
        let r = DirectReader::new(f, 2 * ALIGN);
        // An unaligned target buffer is fine: the bytes land in an aligned one.
        let mut out = vec![0u8; 2 * ALIGN + 1];
        assert!(r.read_exact_at(&mut out[1..], ALIGN as u64).unwrap());
        assert_eq!(&out[1..], &bytes[ALIGN..3 * ALIGN]);
        // Aligned memory is read into directly.
        let mut room = vec![0u8; 3 * ALIGN];
        let skip = room.as_ptr().align_offset(ALIGN);
        let window = &mut room[skip..skip + ALIGN];
        assert!(r.read_exact_at(window, 3 * ALIGN as u64).unwrap());
        assert_eq!(window, &bytes[3 * ALIGN..]);
        // Unaligned offset or length, or more than the largest read: not done.
        let mut small = vec![0u8; ALIGN];
        assert!(!r.read_exact_at(&mut small, 512).unwrap());
        assert!(!r.read_exact_at(&mut small[..512], 0).unwrap());
        let mut big = vec![0u8; 4 * ALIGN];
        assert!(!r.read_exact_at(&mut big, 0).unwrap());
        // Past the end of the file: an error, never a short buffer taken as data.
        assert!(r.read_exact_at(&mut small, 4 * ALIGN as u64).is_err());
    }
}
