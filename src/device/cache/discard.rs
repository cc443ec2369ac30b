//! Discards: [`Cache::discard`] turns the whole sectors of a range into holes on the
//! blob (Clear Pages) and drops them from the cache, dirty or clean; partial sectors
//! at its edges are written as zeros.
//!
//! Relies on the rules in `mod.rs` ("Rules that keep data safe"): discards and
//! flushes are serialised (it holds the flush lock, `order_lock` in `flush.rs`), so
//! an older run can never land on top of the cleared range; and it records the
//! range as changed before and after the clear (`State::changed`), so data of it
//! fetched meanwhile is not cached.
//! A discard that fails gives the range's written parts back to the sparse map, so
//! reads ask the blob again and see what it holds, as a remount would: never
//! zeros the blob does not have.

use crate::device::sectors::mask;
use crate::device::{Backend, DeviceError, SECTOR};

use super::{Cache, BLOCK};

impl<B: Backend> Cache<B> {
    /// Discards `[offset, offset+len)`: whole sectors become holes (Clear Pages),
    /// partial sectors at the edges are written as zeros.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if self.read_only {
            return Err(DeviceError::ReadOnly);
        }
        self.check_range(offset, len)?;
        if self.is_fenced() {
            return Err(DeviceError::LeaseLost("fenced".into()));
        }
        let end = offset + len;
        let s = offset.div_ceil(SECTOR) * SECTOR;
        let e = end / SECTOR * SECTOR;
        if s >= e {
            return self.write(offset, &vec![0u8; len as usize]);
        }
        if offset < s {
            self.write(offset, &vec![0u8; (s - offset) as usize])?;
        }
        if e < end {
            self.write(e, &vec![0u8; (end - e) as usize])?;
        }
        let _order = self.order_lock();
        let written = {
            let mut st = self.lock();
            st.changed(s, e);
            let written = st.sparse.data_in(s, e);
            let mut b = s / BLOCK;
            while b * BLOCK < e {
                let bs = b * BLOCK;
                let m = mask((s.max(bs) - bs) / SECTOR, (e.min(bs + BLOCK) - bs) / SECTOR);
                let mut cleared = 0;
                let mut drop_dirty = false;
                if let Some(blk) = st.dirty.get_mut(&b) {
                    cleared = (blk.dirty & m).count_ones() as u64;
                    blk.dirty &= !m;
                    blk.valid &= !m;
                    drop_dirty = blk.dirty == 0;
                }
                st.dirty_sectors -= cleared;
                if drop_dirty {
                    let blk = st.dirty.remove(&b).expect("present");
                    if blk.valid != 0 {
                        st.clean.put(b, blk);
                    } else {
                        st.recycle(blk);
                    }
                }
                let empty = st.clean.get_mut(&b).map(|blk| {
                    blk.valid &= !m;
                    blk.valid == 0
                });
                if empty == Some(true) {
                    if let Some(blk) = st.clean.pop(&b) {
                        st.recycle(blk);
                    }
                }
                b += 1;
            }
            st.sparse.remove(s, e);
            written
        };
        self.changed.notify_all();
        let result = self.backend.discard(s, e - s);
        // A fetch planned between the first bump and the clear may have read the
        // old bytes: this second bump keeps them out of the cache.
        let mut st = self.lock();
        st.changed(s, e);
        if result.is_err() {
            // The blob may still hold any of the old bytes.
            for r in written {
                st.sparse.insert(r.start, r.end);
            }
        }
        result
    }
}
