//! The write path: [`Cache::write`] copies data into dirty blocks, first bringing in
//! the old bytes of sectors a write covers only partly (at most two, fetched unless
//! cached or a hole; whole-sector writes never read), and [`Cache::wait_for_room`]
//! holds writers back while dirty data is at its limit.
//!
//! Relies on the rules in `mod.rs` ("Rules that keep data safe"): every write bumps
//! its block's generation, so a flush copying the block meanwhile leaves it dirty;
//! written blocks live in the dirty map, which is never evicted; writers wait (not
//! fail) while dirty data is at its limit; and the old bytes of partial sectors are
//! fetched and used under the flush lock (`order_lock`, in `flush.rs`), so no flush
//! or discard lands in between.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::MutexGuard;
use std::time::Instant;

use crate::device::sectors::mask;
use crate::device::{Backend, DeviceError, SECTOR};

use super::{Cache, State, BLOCK, ROOM_PATIENCE, SETTLE};

/// What [`Cache::edges_for_write`] gives a write: the flush lock if it had to
/// be taken, the old bytes of partly covered sectors that were fetched, and
/// the state lock to apply the write under.
type EdgesForWrite<'a> = (
    Option<MutexGuard<'a, ()>>,
    Vec<(u64, Vec<u8>)>,
    MutexGuard<'a, State>,
);

/// The start of each sector that a write of `offset..end` covers only in part:
/// its first and its last, or one sector for a write within one.
fn partly_covered_sectors(offset: u64, end: u64) -> Vec<u64> {
    let mut v = Vec::new();
    if !offset.is_multiple_of(SECTOR) {
        v.push(offset / SECTOR * SECTOR);
    }
    if !end.is_multiple_of(SECTOR) {
        let s = end / SECTOR * SECTOR;
        if v.last() != Some(&s) {
            v.push(s);
        }
    }
    v
}

impl<B: Backend> Cache<B> {
    /// Writes `data` at `offset` into the cache; durable only after [`Cache::flush`].
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
        if self.read_only {
            return Err(DeviceError::ReadOnly);
        }
        let len = data.len() as u64;
        self.check_range(offset, len)?;
        if self.is_fenced() {
            return Err(DeviceError::LeaseLost("fenced".into()));
        }
        if len == 0 {
            return Ok(());
        }
        self.wait_for_room(len)?;
        let end = offset + len;
        // Sectors only partly covered need their old bytes: fetch those (at most two
        // sectors) unless cached or a hole. Whole-sector writes never read.
        let edges = partly_covered_sectors(offset, end);
        let (_no_flush, edge_data, mut st) = self.edges_for_write(&edges)?;
        let mut pos = offset;
        let mut newly_dirty = 0u64;
        let now = Instant::now();
        while pos < end {
            let b = pos / BLOCK;
            let bs = b * BLOCK;
            let be = (bs + BLOCK).min(end);
            let gen = st.next_gen;
            st.next_gen += 1;
            let whole = (pos == bs && be == bs + BLOCK)
                .then(|| &data[(pos - offset) as usize..][..BLOCK as usize]);
            let blk = st.block_for_write(b, whole);
            // Fill partial edge sectors that are not valid yet.
            for &s in &edges {
                if s >= bs && s < bs + BLOCK {
                    let sec = (s - bs) / SECTOR;
                    if blk.valid & (1u128 << sec) == 0 {
                        let o = (s - bs) as usize;
                        match edge_data.iter().find(|(es, _)| *es == s) {
                            Some((_, d)) => blk.data[o..o + SECTOR as usize].copy_from_slice(d),
                            None => blk.data[o..o + SECTOR as usize].fill(0),
                        }
                        blk.valid |= 1u128 << sec;
                    }
                }
            }
            let o = (pos - bs) as usize;
            let n = (be - pos) as usize;
            blk.data[o..o + n].copy_from_slice(&data[(pos - offset) as usize..][..n]);
            let m = mask((pos - bs) / SECTOR, (be - bs).div_ceil(SECTOR));
            newly_dirty += (m & !blk.dirty).count_ones() as u64;
            blk.valid |= m;
            blk.dirty |= m;
            blk.gen = gen;
            blk.touched = Some(now);
            pos = be;
        }
        let was_clean = st.dirty_sectors == 0;
        st.dirty_sectors += newly_dirty;
        st.sparse
            .insert(offset / SECTOR * SECTOR, end.div_ceil(SECTOR) * SECTOR);
        st.last_write = Some(Instant::now());
        self.evict(&mut st);
        drop(st);
        if was_clean && newly_dirty > 0 {
            // The flusher waits for this while the cache is clean.
            self.changed.notify_all();
        }
        self.counters.bytes_written.fetch_add(len, Relaxed);
        Ok(())
    }

    /// The old bytes of the partly covered sectors `edges` of a write, fetched
    /// unless cached or a hole, and the state lock to apply the write under.
    ///
    /// No flush or discard may land between such a fetch and its use (the
    /// fetched bytes could then predate data written and evicted since): the
    /// flush lock, returned to be held until the write is applied, keeps them
    /// out. It is taken only when a sector must be fetched: edges that are
    /// cached or holes (a write to a new region) are filled under the state lock
    /// the write is applied under, as a whole-sector write needs no lock, so such
    /// a write never waits behind a flush (past an outage's I/O timeout, a whole
    /// try of one, and then the fsync after it made a try of its own). Other
    /// reads and writes may still evict a block while the state lock is dropped
    /// for a fetch, taking a cached edge with it (its old bytes then became
    /// zeros, seen once in six runs of the model test), so the edges are checked
    /// again under the lock the write is applied under, and any that went
    /// missing is fetched too.
    fn edges_for_write(&self, edges: &[u64]) -> Result<EdgesForWrite<'_>, DeviceError> {
        let mut no_flush = None;
        let mut edge_data: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut epoch = None;
        loop {
            let st = self.lock();
            if epoch != Some(st.mutations) {
                // Defensive: with the flush lock held, nothing should have landed.
                edge_data.clear();
            }
            let wanted: Vec<u64> = edges
                .iter()
                .copied()
                .filter(|&s| {
                    let b = s / BLOCK;
                    let sec = (s % BLOCK) / SECTOR;
                    let valid = st
                        .block(b)
                        .is_some_and(|blk| blk.valid & (1u128 << sec) != 0);
                    !valid
                        && st.sparse.any_data(s, s + SECTOR)
                        && !edge_data.iter().any(|(es, _)| *es == s)
                })
                .collect();
            if wanted.is_empty() {
                return Ok((no_flush, edge_data, st));
            }
            if no_flush.is_none() {
                // Something must be fetched: under the flush lock, everything
                // looked at again.
                drop(st);
                no_flush = Some(self.order_lock());
                continue;
            }
            epoch = Some(st.mutations);
            drop(st);
            for s in wanted {
                let mut d = vec![0u8; SECTOR as usize];
                self.backend.read(s, &mut d)?;
                edge_data.push((s, d));
            }
        }
    }

    /// Whether a write of `len` bytes would go in now, without waiting for dirty
    /// data to be written first (see [`Self::wait_for_room`]). A hint: another
    /// writer may take the room before this one comes.
    pub fn has_room(&self, len: u64) -> bool {
        let st = self.lock();
        st.dirty.is_empty() || st.dirty_memory() + len <= self.cfg.dirty_limit.max(len)
    }

    /// Back-pressure: while dirty data is at its limit the writer waits for room,
    /// so it is slowed, never failed, unless the blob cannot be written at all
    /// (the backend waits out outages up to its I/O timeout). The limit counts the
    /// memory of dirty blocks, not dirty sectors: one 512-byte write holds a whole
    /// 64 KiB block until it is written.
    ///
    /// Complete 4 MiB runs go first, as the background flusher sends them (eight
    /// in flight, refilled as runs settle), and while such runs are settling or on
    /// their way the writer waits for them to land. Only when there are none, or
    /// nothing has landed for [`ROOM_PATIENCE`], does it flush everything itself
    /// (whose errors it then reports). Every waiting writer flushing everything
    /// in turn made a sequential write past the limit a series of whole flushes,
    /// each draining to nothing before the next began: at 10 ms round trips it
    /// uploaded at about half the rate of complete runs sent back to back.
    fn wait_for_room(&self, len: u64) -> Result<(), DeviceError> {
        let mut counted = false;
        let mut progress = (self.dirty_bytes(), Instant::now());
        loop {
            if self.has_room(len) {
                return Ok(());
            }
            if !counted {
                self.counters.write_waits.fetch_add(1, Relaxed);
                counted = true;
            }
            if self.flush_full_runs()? {
                continue;
            }
            let st = self.lock();
            let dirty = st.dirty_sectors * SECTOR;
            if dirty < progress.0 {
                progress = (dirty, Instant::now());
            }
            if self.has_complete_runs(&st) && progress.1.elapsed() < ROOM_PATIENCE {
                let _ = self.changed.wait_timeout(st, SETTLE);
                continue;
            }
            drop(st);
            self.flush()?;
            progress = (self.dirty_bytes(), Instant::now());
        }
    }
}
