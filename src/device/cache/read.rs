//! The read path: [`Cache::read`] plans each round under the lock
//! ([`Cache::plan_fetch`], [`FetchPlan`]): sectors the cache holds are copied out
//! at once ([`Cache::copy_out`]), blocks another fetch is bringing in are waited for,
//! queued read-ahead the request needs is taken over, and the rest is fetched here
//! and cached ([`Cache::insert_clean`]). Blocks a fetch is bringing in are marked in
//! `State::fetching` by a [`Claim`], released even if the fetch fails. This is where
//! to look for why a read fetched, waited, or planned again, and for the desperate
//! round ([`DESPERATE`]) that bounds how often it can be sent back.
//!
//! Relies on the rules in `mod.rs` ("Rules that keep data safe"): fetched data is
//! cached only if no flush or discard of its range landed while it travelled (the
//! `mutations` epoch and `State::changed_since`); fetched bytes never overwrite
//! valid sectors, and dirty blocks are never
//! evicted, so written data always wins over what is fetched; flushes and discards
//! are serialised under the flush lock, which the desperate round holds
//! (`order_lock`, in `flush.rs`) so that nothing lands while it fetches.

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;

use crate::device::blockmem::BlockMem;
use crate::device::sectors::mask;
use crate::device::{Backend, DeviceError, MAX_GET, SECTOR};

use super::flush::data_mask;
use super::{Block, Cache, State, BLOCK, DESPERATE, SECTORS};

/// What one round of a read fetches itself and what it waits for.
#[derive(Default)]
struct FetchPlan {
    /// Byte ranges to fetch, block-aligned.
    runs: Vec<Range<u64>>,
    /// Blocks this round marked as coming (released when its fetch ends).
    claimed: Vec<u64>,
    /// Blocks another fetch is bringing in.
    waits: Vec<u64>,
}

/// What [`Cache::fetch_runs`] brought: runs read into pooled buffers (by
/// offset), runs read straight into block memory, and the failure that stopped
/// it, if one did.
struct Fetched {
    fetched: Vec<(u64, Vec<u8>)>,
    in_blocks: Vec<(u64, Vec<BlockMem>)>,
    failed: Option<DeviceError>,
}

/// Blocks marked in `fetching` by one fetch. Released explicitly under the lock
/// when the fetch ends; if the fetch fails or panics first, dropping the claim
/// releases it, so no reader waits forever for a fetch that will never end.
pub(super) struct Claim<'a, B: Backend> {
    cache: &'a Cache<B>,
    blocks: Vec<u64>,
}

impl<'a, B: Backend> Claim<'a, B> {
    pub(super) fn new(cache: &'a Cache<B>, blocks: Vec<u64>) -> Self {
        Claim { cache, blocks }
    }

    pub(super) fn release(mut self, st: &mut State) {
        self.release_in(st);
    }

    fn release_in(&mut self, st: &mut State) {
        if self.blocks.is_empty() {
            return;
        }
        for b in self.blocks.drain(..) {
            st.fetching.remove(&b);
        }
        self.cache.fetched.notify_all();
    }
}

impl<B: Backend> Drop for Claim<'_, B> {
    fn drop(&mut self) {
        if !self.blocks.is_empty() {
            let mut st = self.cache.lock();
            self.release_in(&mut st);
        }
    }
}

impl<B: Backend> Cache<B> {
    /// Reads `buf.len()` bytes at `offset`, writing every byte of `buf` (holes as
    /// zeros), so callers may hand in a reused buffer.
    ///
    /// Each round plans under the lock: cached sectors are copied at once, blocks
    /// another fetch is already bringing in are waited for (never fetched twice),
    /// queued read-ahead for the request is taken over, and the rest is fetched
    /// here. Fetched data may only fill sectors that the cache did not hold when the
    /// round was planned: if a flush or discard of the fetched range lands
    /// meanwhile, a block written
    /// before this read may have been flushed and evicted, and the fetched bytes for
    /// it can be older, so the round is planned again. From round [`DESPERATE`] on,
    /// the read holds the flush lock (nothing can land) and fetches everything it
    /// needs itself (nothing to wait for), so it always completes.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let len = buf.len() as u64;
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        self.counters.bytes_read.fetch_add(len, Relaxed);
        let mut missed = false;
        let sectors = ((end.div_ceil(SECTOR)) - offset / SECTOR) as usize;
        for round in 0u32.. {
            let desperate = round >= DESPERATE;
            let _no_flush = desperate.then(|| self.order_lock());
            let mut filled = vec![false; sectors];
            let (plan, epoch, claim) = {
                let mut st = self.lock();
                if round == 0 {
                    self.track_stream(&mut st, offset, end);
                    self.plan_readahead(&mut st, end);
                }
                let plan = self.plan_fetch(&mut st, offset, end, desperate);
                if plan.runs.is_empty() && plan.waits.is_empty() {
                    let any_data = st.sparse.any_data(offset, end);
                    self.copy_out(&mut st, offset, buf, &[], &mut filled, false);
                    let c = if missed {
                        &self.counters.misses
                    } else if any_data {
                        &self.counters.hits
                    } else {
                        &self.counters.hole_reads
                    };
                    c.fetch_add(1, Relaxed);
                    return Ok(());
                }
                self.copy_out(&mut st, offset, buf, &[], &mut filled, true);
                let claim = Claim::new(self, plan.claimed.clone());
                (plan, st.mutations, claim)
            };
            missed = true;
            let Fetched {
                fetched,
                in_blocks,
                failed,
            } = self.fetch_runs(&plan.runs);
            let give_back = |fetched: Vec<(u64, Vec<u8>)>| {
                for (_, data) in fetched {
                    self.pool.give(data);
                }
            };
            let blocks_fetched: usize = in_blocks.iter().map(|(_, m)| m.len()).sum();
            if let Some(e) = failed {
                give_back(fetched);
                let mut st = self.lock();
                st.fetch_landed(blocks_fetched);
                st.free_mem(in_blocks.into_iter().flat_map(|(_, m)| m));
                return Err(e);
            }
            let mut st = self.lock();
            claim.release(&mut st);
            st.fetch_landed(blocks_fetched);
            if plan
                .runs
                .iter()
                .any(|run| st.changed_since(epoch, run.start, run.end))
            {
                give_back(fetched);
                st.free_mem(in_blocks.into_iter().flat_map(|(_, m)| m));
                continue;
            }
            // Cached before the copy (which then finds them) and evicted only
            // after it.
            for (s, mems) in in_blocks {
                self.insert_blocks(&mut st, s, mems);
            }
            if plan.waits.is_empty() {
                self.copy_out(&mut st, offset, buf, &fetched, &mut filled, false);
            }
            for (s, data) in &fetched {
                self.insert_clean(&mut st, *s, data);
            }
            self.evict(&mut st);
            give_back(fetched);
            if plan.waits.is_empty() {
                self.counters.misses.fetch_add(1, Relaxed);
                return Ok(());
            }
            // Blocks another fetch is bringing in: wait for it, then plan again
            // (they are cached by then, unless evicted or outdated meanwhile).
            while plan.waits.iter().any(|b| st.fetching.contains(b)) {
                st = self.fetched.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
        unreachable!("the loop returns")
    }

    /// Fetches `runs`, one after another, stopping at the first failure. Runs are
    /// read straight into block memory where the backend can (a local copy that
    /// holds them whole, or a backend that reads into scattered memory), as
    /// read-ahead does. Others go into pooled buffers (`take_filled`): a fresh
    /// one costs page faults and zeroing per fetch, a large share of the
    /// daemon's CPU in a cold sequential read.
    fn fetch_runs(&self, runs: &[Range<u64>]) -> Fetched {
        let mut out = Fetched {
            fetched: Vec::with_capacity(runs.len()),
            in_blocks: Vec::new(),
            failed: None,
        };
        for run in runs {
            match self.fetch_blocks(run.start, run.end) {
                Some(Ok(mems)) => {
                    out.in_blocks.push((run.start, mems));
                    continue;
                }
                Some(Err(error)) => {
                    out.failed = Some(error);
                    break;
                }
                None => {}
            }
            let mut data = self.pool.take_filled((run.end - run.start) as usize);
            let result = self.backend.read(run.start, &mut data);
            out.fetched.push((run.start, data));
            if let Err(error) = result {
                out.failed = Some(error);
                break;
            }
        }
        out
    }

    /// What a read of `[offset, end)` must fetch or wait for: blocks of the request
    /// that miss data sectors. Holes are never fetched. Blocks it fetches are claimed
    /// (other readers wait for them), and queued read-ahead covering them is taken
    /// over whole. A `desperate` read claims and waits for nothing.
    fn plan_fetch(&self, st: &mut State, offset: u64, end: u64, desperate: bool) -> FetchPlan {
        let mut plan = FetchPlan::default();
        let mut mine: Vec<u64> = Vec::new();
        let mut b = offset / BLOCK;
        while b * BLOCK < end {
            if self.block_misses(st, b, offset, end) && !mine.contains(&b) {
                if desperate {
                    mine.push(b);
                } else if st.fetching.contains(&b) {
                    plan.waits.push(b);
                } else if let Some((qs, qe)) = st.take_queued(b) {
                    mine.extend(qs..qe);
                } else {
                    mine.push(b);
                }
            }
            b += 1;
        }
        mine.sort_unstable();
        mine.dedup();
        for &b in &mine {
            let block = b * BLOCK..(b * BLOCK + BLOCK).min(self.size());
            match plan.runs.last_mut() {
                Some(last) if last.end == block.start && last.end - last.start < MAX_GET => {
                    last.end = block.end
                }
                _ => plan.runs.push(block),
            }
            if !desperate && st.fetching.insert(b) {
                plan.claimed.push(b);
            }
        }
        plan
    }

    /// True when a read of `[offset, offset+len)` would be answered from memory
    /// alone (cached sectors and holes), with nothing to fetch or wait for. A hint
    /// for the FUSE layer, which answers such reads on the spot and hands the others
    /// to its fetch workers: by the time the read runs, eviction may have changed it.
    pub fn is_cached(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len).min(self.size());
        let st = self.lock();
        let mut b = offset / BLOCK;
        while b * BLOCK < end {
            if self.block_misses(&st, b, offset, end) {
                return false;
            }
            b += 1;
        }
        true
    }

    /// True when block `b` lacks sectors of `[offset, end)` that hold data (holes
    /// are never fetched: they read as zeros).
    fn block_misses(&self, st: &State, b: u64, offset: u64, end: u64) -> bool {
        let bs = b * BLOCK;
        let be = (bs + BLOCK).min(self.size());
        let rs = offset.max(bs);
        let re = end.min(be);
        let want = mask((rs - bs) / SECTOR, (re - bs).div_ceil(SECTOR));
        let valid = st.block(b).map_or(0, |blk| blk.valid);
        want & !valid != 0 && {
            let data = st
                .sparse
                .data_in(rs / SECTOR * SECTOR, re.div_ceil(SECTOR) * SECTOR);
            data.iter().any(|r| {
                let m = mask((r.start - bs) / SECTOR, (r.end - bs).div_ceil(SECTOR));
                m & want & !valid != 0
            })
        }
    }

    /// Copies `[offset, offset+len)` into `buf`. Valid cached sectors always win
    /// (they may be newer than anything fetched). In the `planning` pass only those
    /// are copied, and `filled` remembers them: a block the plan relied on may be
    /// evicted by another thread before the fetch returns, and its bytes must not
    /// turn into zeros then. In the final pass the rest comes from `fetched`, or is
    /// zeros (a hole).
    fn copy_out(
        &self,
        st: &mut State,
        offset: u64,
        buf: &mut [u8],
        fetched: &[(u64, Vec<u8>)],
        filled: &mut [bool],
        planning: bool,
    ) {
        let end = offset + buf.len() as u64;
        let first_sector = offset / SECTOR;
        let mut pos = offset;
        while pos < end {
            let b = pos / BLOCK;
            let bs = b * BLOCK;
            let be = (bs + BLOCK).min(end);
            let blk = st.block(b);
            // The sectors of this block asked for: `filled[asked]`.
            let first = (pos / SECTOR - first_sector) as usize;
            let asked = first..first + ((be - bs).div_ceil(SECTOR) - (pos - bs) / SECTOR) as usize;
            let (out, inner) = (
                (pos - offset) as usize..(be - offset) as usize,
                (pos - bs) as usize..(be - bs) as usize,
            );
            // The common cases in one copy each (a sector at a time, a 1 MiB read
            // was 2048 copies and as many lookups): a block holding every sector
            // asked of it, and, in the final pass, a block the cache does not hold
            // that lies wholly inside one fetched run.
            let want = mask((pos - bs) / SECTOR, (be - bs).div_ceil(SECTOR));
            if let Some(blk) = blk.filter(|blk| blk.valid & want == want) {
                buf[out].copy_from_slice(&blk.data[inner]);
                filled[asked].fill(true);
                pos = be;
                continue;
            }
            if !planning && blk.is_none() && !filled[asked].contains(&true) {
                if let Some((s, d)) = fetched
                    .iter()
                    .find(|(s, d)| *s <= pos && be <= *s + d.len() as u64)
                {
                    buf[out].copy_from_slice(&d[(pos - s) as usize..(be - s) as usize]);
                    pos = be;
                    continue;
                }
            }
            while pos < be {
                let sec = (pos - bs) / SECTOR;
                let sec_end = (bs + (sec + 1) * SECTOR).min(be);
                let n = (sec_end - pos) as usize;
                let i = (pos / SECTOR - first_sector) as usize;
                let out = &mut buf[(pos - offset) as usize..][..n];
                match blk {
                    Some(blk) if blk.valid & (1u128 << sec) != 0 => {
                        out.copy_from_slice(&blk.data[(pos - bs) as usize..][..n]);
                        filled[i] = true;
                    }
                    _ if planning || filled[i] => {}
                    _ => match fetched
                        .iter()
                        .find(|(s, d)| *s <= pos && pos < *s + d.len() as u64)
                    {
                        Some((s, d)) => out.copy_from_slice(&d[(pos - s) as usize..][..n]),
                        None => out.fill(0),
                    },
                }
                pos = sec_end;
            }
        }
        // Touch the blocks so the LRU sees the use.
        let mut b = offset / BLOCK;
        while b * BLOCK < end {
            st.clean.get(&b);
            b += 1;
        }
    }

    /// Adds blocks read into memory of their own ([`Backend::read_local`]) to the
    /// cache, as [`Self::insert_clean`] adds bytes: a whole block of data the cache
    /// lacks is kept as it is, with no copy; into any other (one the cache holds,
    /// one with holes, the disk's last) only what `insert_clean` would copy is
    /// copied, and the memory is reused.
    pub(super) fn insert_blocks(&self, st: &mut State, start: u64, mems: Vec<BlockMem>) {
        let first = start / BLOCK;
        for (k, mem) in mems.into_iter().enumerate() {
            let b = first + k as u64;
            let bs = b * BLOCK;
            let whole = bs + BLOCK <= self.size()
                && st.block(b).is_none()
                && data_mask(&st.sparse, b) == u128::MAX;
            if whole {
                st.clean.put(b, Block::clean(mem));
            } else {
                let len = (self.size() - bs).min(BLOCK) as usize;
                self.insert_clean(st, bs, &mem[..len]);
                st.give_back_mem([mem]);
            }
        }
    }

    /// Adds fetched data to the cache, never overwriting valid sectors.
    pub(super) fn insert_clean(&self, st: &mut State, start: u64, data: &[u8]) {
        let end = start + data.len() as u64;
        let mut b = start / BLOCK;
        while b * BLOCK < end {
            let bs = b * BLOCK;
            let at = (bs - start) as usize;
            // Holes are zeros whatever the fetched bytes say.
            let data_mask = data_mask(&st.sparse, b);
            let fill = |blk: &mut Block| {
                for sec in 0..SECTORS {
                    if blk.valid & (1u128 << sec) == 0 {
                        let o = (sec * SECTOR) as usize;
                        let out = &mut blk.data[o..o + SECTOR as usize];
                        if data_mask & (1u128 << sec) != 0 {
                            out.copy_from_slice(&data[at + o..at + o + SECTOR as usize]);
                        } else {
                            out.fill(0);
                        }
                    }
                }
                blk.valid = u128::MAX;
            };
            if let Some(blk) = st.dirty.get_mut(&b) {
                fill(blk);
            } else if let Some(blk) = st.clean.get_mut(&b) {
                fill(blk);
            } else if data_mask == u128::MAX {
                let blk = st.new_block_from(&data[at..at + BLOCK as usize]);
                st.clean.put(b, blk);
            } else {
                let mut blk = st.new_block();
                fill(&mut blk);
                st.clean.put(b, blk);
            }
            b += 1;
        }
    }
}
