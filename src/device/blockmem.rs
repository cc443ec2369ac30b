//! Memory for cache blocks, mapped and faulted in by the batch.
//!
//! A cache that fills with written or fetched data needs new memory for every
//! block, and on first touch the kernel faults each 4 KiB page in separately: in a
//! profile of a 1 GiB sequential write through a fresh cache, the page-fault entry
//! alone was about 9% of the daemon's CPU (more in a VM, where every exception is
//! dear). Blocks are therefore carved out of 2 MiB-aligned anonymous mappings of
//! [`BATCH`] blocks in transparent huge pages ([`map_huge`]), which the kernel
//! fills in one call.
//! A dropped block gives its pages back to the kernel at once (`MADV_DONTNEED`),
//! and a mapping is unmapped when its last block is dropped; the cache keeps a
//! few freed blocks for reuse and drops the rest, so its memory shrinks after a
//! burst.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Blocks per mapping: 2 MiB of 64 KiB blocks.
pub const BATCH: usize = 32;

/// One anonymous mapping, unmapped when its last block is gone.
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; each block hands out a disjoint part of it.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; no block outlives this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The memory of one cache block, zero when new.
pub enum BlockMem {
    /// Part of a shared mapping, which it keeps alive.
    Mapped {
        ptr: NonNull<u8>,
        size: usize,
        _mapping: Arc<Mapping>,
    },
    /// On the heap, when the kernel refused a mapping.
    Heap(Box<[u8]>),
}

// SAFETY: a mapped block's bytes are reachable only through its own BlockMem.
unsafe impl Send for BlockMem {}
unsafe impl Sync for BlockMem {}

/// Transparent huge pages are 2 MiB on x86-64 and arm64 (with 4 KiB pages).
const HUGE: usize = 2 << 20;

/// `MADV_POPULATE_WRITE` (Linux 5.14): fault the range in, writable, now. Older
/// kernels refuse it and the pages fault in on first touch instead.
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Maps `len` bytes (a multiple of [`HUGE`]) at a 2 MiB boundary, asks for
/// transparent huge pages there, faults them in, and takes the advice back.
///
/// Why huge pages: a cache that fills pays for every new page (a fault, zeroing,
/// the memory cgroup's accounting), and in 2 MiB pages that work is done once per
/// 512 pages. Measured on the 2-core VM, this halved the daemon's CPU for new
/// memory (docs/benchmarks.md). Where THP is off (`never`) the advice does nothing
/// and the mapping is made of small pages, as before.
fn map_huge(len: usize) -> Option<NonNull<u8>> {
    let whole = len + HUGE;
    // SAFETY: an anonymous private mapping with no address hint; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            whole,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let raw = p as usize;
    let base = raw.next_multiple_of(HUGE);
    // SAFETY: the head [raw, base) and the tail [base+len, raw+whole) are parts of
    // the mapping just made that nothing uses: unmapped, they leave exactly
    // [base, base+len) mapped, 2 MiB aligned. Advice on it is only advice.
    unsafe {
        if base > raw {
            libc::munmap(raw as *mut libc::c_void, base - raw);
        }
        if raw + whole > base + len {
            libc::munmap((base + len) as *mut libc::c_void, raw + whole - base - len);
        }
        libc::madvise(base as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        libc::madvise(base as *mut libc::c_void, len, MADV_POPULATE_WRITE);
        // The pages are in; no more huge pages here. khugepaged would otherwise
        // fill a 2 MiB range whose blocks were mostly dropped back into a whole
        // huge page (it collapses ranges with up to 511 of 512 pages missing),
        // and the daemon's memory would grow past its cache.
        libc::madvise(base as *mut libc::c_void, len, libc::MADV_NOHUGEPAGE);
    }
    NonNull::new(base as *mut u8)
}

/// A buffer of its own 2 MiB-aligned mapping in transparent huge pages, for
/// reads that bypass the page cache.
///
/// Why: a direct read's request to the device has one segment per physically
/// contiguous piece of the buffer, and a device allows only so many (254 on the
/// VM's virtio disk). In 4 KiB pages a request then holds at most about 1 MiB,
/// in 2 MiB pages it holds the whole read; on that disk 1 MiB requests read at
/// about 1.2 GiB/s and 4 MiB requests from huge pages at 3.4 GiB/s
/// (docs/benchmarks.md, "direct reads of the disk cache").
pub struct HugeBuf(Mapping);

impl HugeBuf {
    /// At least `len` bytes (rounded up to 2 MiB), faulted in. `None` if the
    /// kernel refuses the mapping.
    pub fn new(len: usize) -> Option<HugeBuf> {
        let len = len.max(1).next_multiple_of(HUGE);
        map_huge(len).map(|base| HugeBuf(Mapping { base, len }))
    }
}

impl Deref for HugeBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: base..base+len is this buffer's own live mapping, initialised
        // (zero) by the kernel.
        unsafe { std::slice::from_raw_parts(self.0.base.as_ptr(), self.0.len) }
    }
}

impl DerefMut for HugeBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.0.base.as_ptr(), self.0.len) }
    }
}

impl BlockMem {
    /// `n` blocks of `size` bytes, faulted in together. Falls back to the heap if
    /// the kernel refuses the mapping.
    pub fn batch(n: usize, size: usize) -> Vec<BlockMem> {
        let len = n * size;
        let Some(base) = map_huge(len) else {
            return (0..n).map(|_| BlockMem::on_heap(size)).collect();
        };
        let mapping = Arc::new(Mapping { base, len });
        (0..n)
            .map(|i| BlockMem::Mapped {
                // SAFETY: i * size < len, inside the mapping.
                ptr: unsafe { NonNull::new_unchecked(base.as_ptr().add(i * size)) },
                size,
                _mapping: mapping.clone(),
            })
            .collect()
    }

    fn on_heap(size: usize) -> BlockMem {
        BlockMem::Heap(vec![0u8; size].into_boxed_slice())
    }
}

impl Drop for BlockMem {
    fn drop(&mut self) {
        if let BlockMem::Mapped { ptr, size, .. } = self {
            // SAFETY: ptr..ptr+size is this block's own page-aligned part of a live
            // mapping (the Arc is dropped after this), and nothing uses it again.
            // MADV_DONTNEED frees the pages; the range would read as zeros.
            unsafe { libc::madvise(ptr.as_ptr().cast(), *size, libc::MADV_DONTNEED) };
        }
    }
}

impl Deref for BlockMem {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: ptr..ptr+size is this block's own part of a live mapping,
            // initialised (zero) by the kernel.
            BlockMem::Mapped { ptr, size, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *size)
            },
            BlockMem::Heap(b) => b,
        }
    }
}

impl DerefMut for BlockMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: as in deref; &mut self makes the access exclusive.
            BlockMem::Mapped { ptr, size, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *size)
            },
            BlockMem::Heap(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_zeroed_disjoint_and_outlive_each_other() {
        let mut v = BlockMem::batch(4, 65536);
        assert!(v
            .iter()
            .all(|b| matches!(b, BlockMem::Mapped { .. }) && b.len() == 65536));
        assert!(v.iter().all(|b| b.iter().all(|&x| x == 0)));
        // The batch starts at a huge-page boundary, so it can be one huge page.
        assert_eq!(v[0].as_ptr() as usize % HUGE, 0);
        for (i, b) in v.iter_mut().enumerate() {
            b.fill(i as u8 + 1);
        }
        // Dropping some blocks leaves the others' memory intact.
        let kept = v.split_off(2);
        drop(v);
        assert!(kept[0].iter().all(|&x| x == 3));
        assert!(kept[1].iter().all(|&x| x == 4));
    }

    #[test]
    fn huge_buffers_are_aligned_whole_and_writable() {
        let mut b = HugeBuf::new(HUGE + 1).expect("a mapping");
        assert_eq!(b.len(), 2 * HUGE);
        assert_eq!(b.as_ptr() as usize % HUGE, 0);
        assert!(b.iter().all(|&x| x == 0));
        b[2 * HUGE - 1] = 9;
        assert_eq!(b[2 * HUGE - 1], 9);
    }

    #[test]
    fn heap_fallback_behaves_the_same() {
        let mut b = BlockMem::on_heap(4096);
        assert!(matches!(b, BlockMem::Heap(_)));
        b[4095] = 7;
        assert_eq!(b[4095], 7);
        assert!(b[..4095].iter().all(|&x| x == 0));
    }
}
