//! Memory for key material: pages of its own, locked (never swapped out), and
//! wiped before they are given back.
//!
//! A passphrase, a volume key and the ciphers' expanded round keys each live in an
//! allocation of whole pages, so that unlocking one never unlocks the page of
//! another (`munlock` does not count: the first call unlocks a page for all its
//! users). If the process may not lock memory (a small `RLIMIT_MEMLOCK`), the
//! secret is kept all the same, unlocked, and that is said once in the log: a
//! mount is not refused for it, as cryptsetup refuses none.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use zeroize::Zeroize;

/// The page size assumed for alignment (every Linux target blobdrive builds for
/// has 4 KiB pages or larger multiples of it; a larger page only means two
/// secrets may share one, still locked while either lives).
const PAGE: usize = 4096;

/// Whether a failure to lock was already logged.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Zeroed pages of our own, locked while they live, wiped before they are freed.
struct Pages {
    ptr: NonNull<u8>,
    layout: Layout,
    locked: bool,
}

impl Pages {
    /// At least `len` bytes (at least one page), aligned for `align`.
    fn new(len: usize, align: usize) -> Pages {
        let size = len.max(1).next_multiple_of(PAGE);
        let layout = Layout::from_size_align(size, PAGE.max(align)).expect("a page-aligned layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let locked = lock(ptr.as_ptr(), size);
        Pages {
            ptr,
            layout,
            locked,
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        let base = self.ptr.as_ptr();
        // SAFETY: the pages are ours alone; they are wiped, unlocked and freed
        // with the layout they were made with.
        unsafe {
            std::slice::from_raw_parts_mut(base, self.layout.size()).zeroize();
            if self.locked {
                libc::munlock(base as *const libc::c_void, self.layout.size());
            }
            dealloc(base, self.layout);
        }
    }
}

// SAFETY: `Pages` is a plain owned allocation.
unsafe impl Send for Pages {}
// SAFETY: shared access reads only.
unsafe impl Sync for Pages {}

/// Locks `len` bytes at `at` into memory; false (logged once) when not allowed.
fn lock(at: *const u8, len: usize) -> bool {
    // SAFETY: the range is one live allocation of ours.
    let ok = unsafe { libc::mlock(at as *const libc::c_void, len) } == 0;
    if !ok && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "could not lock key material into memory ({}): it may be swapped out",
            std::io::Error::last_os_error()
        );
    }
    ok
}

/// A `T` (a cipher with its round keys) in locked pages of its own, wiped after
/// `T`'s own drop.
pub struct Locked<T> {
    pages: Pages,
    _owns: std::marker::PhantomData<T>,
}

// SAFETY: `Locked<T>` owns its `T` as a `Box<T>` would.
unsafe impl<T: Send> Send for Locked<T> {}
// SAFETY: shared access hands out `&T` only.
unsafe impl<T: Sync> Sync for Locked<T> {}

impl<T> Locked<T> {
    /// Moves `value` into locked pages. The copy `value` was on the caller's
    /// stack is the caller's to avoid where it matters.
    pub fn new(value: T) -> Locked<T> {
        let pages = Pages::new(std::mem::size_of::<T>(), std::mem::align_of::<T>());
        // SAFETY: the pages are valid for writes of a `T` and aligned for it.
        unsafe { (pages.ptr.as_ptr() as *mut T).write(value) };
        Locked {
            pages,
            _owns: std::marker::PhantomData,
        }
    }
}

impl<T> std::ops::Deref for Locked<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the pages hold an initialised `T` for as long as `self` lives.
        unsafe { &*(self.pages.ptr.as_ptr() as *const T) }
    }
}

impl<T> Drop for Locked<T> {
    fn drop(&mut self) {
        // SAFETY: the `T` is initialised and dropped once, here; the pages are
        // wiped and freed after, by their own drop.
        unsafe { std::ptr::drop_in_place(self.pages.ptr.as_ptr() as *mut T) };
    }
}

/// The most bytes of a passphrase or key file read: key files are small (cryptsetup's own limit for a passphrase typed
/// is 512 characters; a key file of 4 KiB of random bytes is the common case).
pub const MAX_SECRET: usize = 64 * 1024;

/// Secret bytes (a passphrase, a key) in locked pages, wiped on drop.
pub struct Secret {
    pages: Pages,
    len: usize,
}

impl Secret {
    /// `len` zero bytes, to be filled in place.
    pub fn zeroed(len: usize) -> Secret {
        Secret {
            pages: Pages::new(len, 1),
            len,
        }
    }

    /// A copy of `bytes` (the caller wipes its own).
    pub fn from_slice(bytes: &[u8]) -> Secret {
        let mut s = Secret::zeroed(bytes.len());
        s.bytes_mut().copy_from_slice(bytes);
        s
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the pages hold at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.pages.ptr.as_ptr(), self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.pages.ptr.as_ptr(), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shortens the secret to `len` bytes, wiping the rest.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.bytes_mut()[len..].zeroize();
            self.len = len;
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_page_aligned_and_holds_its_bytes() {
        let s = Secret::from_slice(b"correct horse");
        assert_eq!(s.as_bytes(), b"correct horse");
        assert_eq!(s.pages.ptr.as_ptr() as usize % PAGE, 0);
        assert_eq!(format!("{s:?}"), "Secret(13 bytes)");
        let mut t = Secret::from_slice(b"abcdef");
        t.truncate(2);
        assert_eq!(t.as_bytes(), b"ab");
        // What was cut is wiped.
        // SAFETY: the pages are at least a page long.
        let all = unsafe { std::slice::from_raw_parts(t.pages.ptr.as_ptr(), 6) };
        assert_eq!(all, b"ab\0\0\0\0");
    }

    #[test]
    fn a_locked_value_is_dropped_once() {
        use std::sync::atomic::AtomicUsize;
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Counted(#[allow(dead_code)] [u8; 32]);
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        drop(Locked::new(Counted([7; 32])));
        assert_eq!(DROPS.load(Ordering::SeqCst), 1);
    }
}
