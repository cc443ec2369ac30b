//! The write-back page cache between FUSE and the blob.
//!
//! Memory is cut into 64 KiB blocks; each block knows, per 512-byte sector, which
//! bytes are valid (match or supersede the blob) and which are dirty (not yet in the
//! blob). That granularity is what lets a 4 KiB write cost no read at all, and lets a
//! flush send exactly the dirty sectors, coalesced across blocks into runs of up to
//! 4 MiB, several in parallel, each marked clean as soon as it lands.
//!
//! Sequential reads are served by read-ahead: the stream's next 4 MiB runs are
//! queued for prefetch workers, which keep several ranged reads in flight. A reader
//! never fetches a block that another fetch is already bringing in; it waits for
//! it (or takes over queued read-ahead it needs now), so every byte of a stream
//! crosses the network once.
//!
//! Rules that keep data safe:
//! - dirty blocks live apart from the LRU of clean ones and are never evicted;
//! - a flush copies a snapshot of the dirty sectors, and clears a block's dirty bits
//!   only if the block was not written again while the copy was in flight;
//! - writers wait (not fail) while dirty data is at its limit;
//! - discards and flushes are serialised, so an older run can never land on top of
//!   a range cleared after it, and a block is never in two runs in flight;
//! - fetched data is cached only if no flush or discard landed while it travelled
//!   (it could be older than what the cache wrote and evicted meanwhile).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lru::LruCache;
use serde::Serialize;
use tracing::{debug, warn};

use super::blockmem::{self, BlockMem};
use super::bufpool::BufPool;
use super::sectors::{self, mask};
use super::sparse::SparseMap;
use super::{Backend, DeviceError, MAX_RUN, SECTOR};

/// Cache block size.
pub const BLOCK: u64 = 64 * 1024;
const SECTORS: u64 = BLOCK / SECTOR;
/// How long a complete run must go unwritten before it is sent ahead of fsync.
const SETTLE: Duration = Duration::from_millis(100);
/// How much dirty data one flush batch copies at most, bounding the memory a flush
/// needs beside the cache itself.
const FLUSH_BATCH: u64 = 32 * 1024 * 1024;
/// Flush units (each at most 4 MiB) in flight at once.
const FLUSH_PARALLEL: usize = 8;
/// Idle 4 MiB buffers kept for flushes and read-ahead: the pages of a kept buffer
/// stay mapped, while a fresh one costs page faults and zeroing for every use.
const POOL_KEEP: usize = 12;
/// The largest read-ahead window: eight 4 MiB ranged reads in flight.
const READAHEAD_MAX: u64 = 8 * MAX_RUN;
/// The round from which a read stops waiting for other fetches and fetches all it
/// needs itself, under the flush lock: a bound on how often it can be sent back.
const DESPERATE: u32 = 3;

/// Tuning of a cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Most bytes of blocks held, clean and dirty together.
    pub capacity: u64,
    /// Most dirty bytes; writers wait above it.
    pub dirty_limit: u64,
    /// Largest read-ahead window on sequential reads.
    pub readahead_max: u64,
    /// Dirty data older than this is written by the background flusher.
    pub flush_after: Duration,
}

impl CacheConfig {
    /// A config for `capacity` bytes with the other limits derived from it.
    pub fn with_capacity(capacity: u64) -> CacheConfig {
        let capacity = capacity.max(8 * MAX_RUN);
        CacheConfig {
            capacity,
            dirty_limit: capacity / 2,
            readahead_max: (capacity / 8).clamp(BLOCK, READAHEAD_MAX),
            flush_after: Duration::from_secs(3),
        }
    }
}

struct Block {
    data: BlockMem,
    valid: u128,
    dirty: u128,
    /// Write generation: bumped on every write into the block.
    gen: u64,
    /// When it was last written: hot blocks are left for fsync to coalesce.
    touched: Option<Instant>,
}

/// Counters for `stats`.
#[derive(Debug, Default)]
pub struct CacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hole_reads: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub flushes: AtomicU64,
    pub write_waits: AtomicU64,
}

/// A copy of the cache's state for `stats`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CacheSnapshot {
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub hole_reads: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flushes: u64,
    pub write_waits: u64,
    pub dirty_bytes: u64,
    pub cached_bytes: u64,
    pub cache_size: u64,
    pub allocated_bytes: u64,
}

struct State {
    clean: LruCache<u64, Block>,
    dirty: BTreeMap<u64, Block>,
    dirty_sectors: u64,
    sparse: SparseMap,
    seq_next: u64,
    readahead: u64,
    last_write: Option<Instant>,
    next_gen: u64,
    /// Bumped whenever the backend's content changes under the cache (a flush
    /// landed, a discard cleared pages). Data fetched before a bump may be older than
    /// what the cache has since written and evicted, so it is not cached.
    mutations: u64,
    /// Blocks a started fetch (a reader's own or a prefetch) is bringing in:
    /// readers that need one wait for it instead of fetching it again.
    fetching: BTreeSet<u64>,
    /// Read-ahead not started yet, as block ranges `start -> end`. Never overlaps
    /// `fetching`: a reader needing a queued block takes the whole job over.
    queued: BTreeMap<u64, u64>,
    /// The block up to which the current stream's read-ahead was queued.
    ra_next: u64,
    /// Buffers of evicted blocks, reused for new ones: block memory is allocated up
    /// to the capacity once and then recycled, instead of churning the allocator
    /// (whose per-thread arenas would otherwise hold far more than the cache).
    free: Vec<BlockMem>,
}

impl State {
    fn block(&self, b: u64) -> Option<&Block> {
        self.dirty.get(&b).or_else(|| self.clean.peek(&b))
    }

    /// Block memory: a recycled buffer, or one of a new batch (see [`blockmem`]).
    /// Freed buffers are kept, never dropped, so the memory in use is at most the
    /// peak number of blocks ever held (bounded by the capacity) plus one batch.
    fn take_mem(&mut self) -> BlockMem {
        if self.free.is_empty() {
            self.free
                .extend(BlockMem::batch(blockmem::BATCH, BLOCK as usize));
        }
        self.free.pop().expect("just refilled")
    }

    /// A new empty block. Sector contents of a new block are never read before
    /// they are marked valid.
    fn new_block(&mut self) -> Block {
        Block {
            data: self.take_mem(),
            valid: 0,
            dirty: 0,
            gen: 0,
            touched: None,
        }
    }

    /// A new block holding `content` (one whole block), all of it valid.
    fn new_block_from(&mut self, content: &[u8]) -> Block {
        let mut data = self.take_mem();
        data.copy_from_slice(content);
        Block {
            data,
            valid: u128::MAX,
            dirty: 0,
            gen: 0,
            touched: None,
        }
    }

    fn recycle(&mut self, blk: Block) {
        self.free.push(blk.data);
    }

    /// The block for writing: moved out of the clean LRU if needed. `whole` is the
    /// block's new content when the write covers all of it.
    fn block_for_write(&mut self, b: u64, whole: Option<&[u8]>) -> &mut Block {
        if !self.dirty.contains_key(&b) {
            let blk = match (self.clean.pop(&b), whole) {
                (Some(blk), _) => blk,
                (None, Some(content)) => self.new_block_from(content),
                (None, None) => self.new_block(),
            };
            self.dirty.insert(b, blk);
        }
        self.dirty.get_mut(&b).expect("just inserted")
    }

    fn len(&self) -> usize {
        self.clean.len() + self.dirty.len()
    }

    fn is_queued(&self, b: u64) -> bool {
        self.queued
            .range(..=b)
            .next_back()
            .is_some_and(|(_, &e)| e > b)
    }

    /// Removes and returns the queued read-ahead job holding block `b`.
    fn take_queued(&mut self, b: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.queued.range(..=b).next_back()?;
        if e <= b {
            return None;
        }
        self.queued.remove(&s);
        Some((s, e))
    }
}

/// Dirty data being written by [`Cache::write_blocks`]'s workers.
struct FlushQueue {
    pending: BTreeSet<u64>,
    /// Blocks of units in flight: never taken again until their unit has landed.
    in_flight: BTreeSet<u64>,
    error: Option<DeviceError>,
}

/// Dirty data copied out for one backend write: the runs, and per block the write
/// generation and dirty mask they hold (cleared on success only if unchanged).
struct FlushUnit {
    runs: Vec<(u64, Bytes)>,
    taken: Vec<(u64, u64, u128)>,
}

/// The sectors of block `b` that hold data on the blob (the rest are holes).
fn data_mask(sparse: &SparseMap, b: u64) -> u128 {
    let bs = b * BLOCK;
    sparse.data_in(bs, bs + BLOCK).iter().fold(0u128, |m, r| {
        m | mask((r.start - bs) / SECTOR, (r.end - bs).div_ceil(SECTOR))
    })
}

/// What one round of a read fetches itself and what it waits for.
#[derive(Default)]
struct FetchPlan {
    /// Byte ranges to fetch, block-aligned.
    runs: Vec<(u64, u64)>,
    /// Blocks this round marked as coming (released when its fetch ends).
    claimed: Vec<u64>,
    /// Blocks another fetch is bringing in.
    waits: Vec<u64>,
}

/// Blocks marked in `fetching` by one fetch. Released explicitly under the lock
/// when the fetch ends; if the fetch fails or panics first, dropping the claim
/// releases it, so no reader waits forever for a fetch that will never end.
struct Claim<'a, B: Backend> {
    cache: &'a Cache<B>,
    blocks: Vec<u64>,
}

impl<'a, B: Backend> Claim<'a, B> {
    fn new(cache: &'a Cache<B>, blocks: Vec<u64>) -> Self {
        Claim { cache, blocks }
    }

    fn release(mut self, st: &mut State) {
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

/// The cache over a backend of `size` bytes.
pub struct Cache<B: Backend> {
    backend: B,
    size: u64,
    read_only: bool,
    cfg: CacheConfig,
    state: Mutex<State>,
    changed: Condvar,
    /// Signalled when claimed blocks are released (their fetch ended).
    fetched: Condvar,
    /// Signalled when read-ahead is queued for the prefetch workers.
    jobs: Condvar,
    flush_lock: Mutex<()>,
    /// Threads waiting for `flush_lock` in [`Cache::order_lock`].
    order_waiters: AtomicUsize,
    /// Buffers that flushes copy dirty data into and read-ahead fetches into.
    pool: Arc<BufPool>,
    fenced: Arc<AtomicBool>,
    closing: AtomicBool,
    pub counters: CacheCounters,
}

impl<B: Backend> Cache<B> {
    /// `sparse` is what the blob holds now; `fenced` is the backend's lease flag
    /// (writes fail at once when it is set).
    pub fn new(
        backend: B,
        size: u64,
        sparse: SparseMap,
        cfg: CacheConfig,
        read_only: bool,
        fenced: Arc<AtomicBool>,
    ) -> Cache<B> {
        Cache {
            backend,
            size,
            read_only,
            state: Mutex::new(State {
                clean: LruCache::unbounded(),
                dirty: BTreeMap::new(),
                dirty_sectors: 0,
                sparse,
                seq_next: u64::MAX,
                readahead: 0,
                last_write: None,
                next_gen: 1,
                mutations: 0,
                fetching: BTreeSet::new(),
                queued: BTreeMap::new(),
                ra_next: 0,
                free: Vec::new(),
            }),
            cfg,
            changed: Condvar::new(),
            fetched: Condvar::new(),
            jobs: Condvar::new(),
            flush_lock: Mutex::new(()),
            order_waiters: AtomicUsize::new(0),
            pool: BufPool::new(MAX_RUN as usize, POOL_KEEP),
            fenced,
            closing: AtomicBool::new(false),
            counters: CacheCounters::default(),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cap_blocks(&self) -> usize {
        (self.cfg.capacity / BLOCK).max(1) as usize
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(DeviceError::OutOfRange { offset, len });
        }
        Ok(())
    }

    fn evict(&self, st: &mut State) {
        let cap = self.cap_blocks();
        while st.len() > cap {
            match st.clean.pop_lru() {
                Some((_, blk)) => st.recycle(blk),
                None => break,
            }
        }
    }

    pub fn snapshot(&self) -> CacheSnapshot {
        let st = self.lock();
        let c = &self.counters;
        CacheSnapshot {
            cache_hits: c.hits.load(Relaxed),
            cache_misses: c.misses.load(Relaxed),
            hole_reads: c.hole_reads.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            flushes: c.flushes.load(Relaxed),
            write_waits: c.write_waits.load(Relaxed),
            dirty_bytes: st.dirty_sectors * SECTOR,
            cached_bytes: st.len() as u64 * BLOCK,
            cache_size: self.cfg.capacity,
            allocated_bytes: st.sparse.total(),
        }
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.lock().dirty_sectors * SECTOR
    }

    /// Reads `buf.len()` bytes at `offset`, writing every byte of `buf` (holes as
    /// zeros), so callers may hand in a reused buffer.
    ///
    /// Each round plans under the lock: cached sectors are copied at once, blocks
    /// another fetch is already bringing in are waited for (never fetched twice),
    /// queued read-ahead for the request is taken over, and the rest is fetched
    /// here. Fetched data may only fill sectors that the cache did not hold when the
    /// round was planned: if a flush or discard lands meanwhile, a block written
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
            let mut fetched = Vec::with_capacity(plan.runs.len());
            for &(s, e) in &plan.runs {
                let mut data = vec![0u8; (e - s) as usize];
                self.backend.read(s, &mut data)?;
                fetched.push((s, data));
            }
            let mut st = self.lock();
            claim.release(&mut st);
            if st.mutations != epoch {
                continue;
            }
            if plan.waits.is_empty() {
                self.copy_out(&mut st, offset, buf, &fetched, &mut filled, false);
            }
            for (s, data) in &fetched {
                self.insert_clean(&mut st, *s, data);
            }
            self.evict(&mut st);
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

    /// What a read of `[offset, end)` must fetch or wait for: blocks of the request
    /// that miss data sectors. Holes are never fetched. Blocks it fetches are claimed
    /// (other readers wait for them), and queued read-ahead covering them is taken
    /// over whole. A `desperate` read claims and waits for nothing.
    fn plan_fetch(&self, st: &mut State, offset: u64, end: u64, desperate: bool) -> FetchPlan {
        let mut plan = FetchPlan::default();
        let mut mine: Vec<u64> = Vec::new();
        let mut b = offset / BLOCK;
        while b * BLOCK < end {
            let bs = b * BLOCK;
            let be = (bs + BLOCK).min(self.size);
            // Sectors of the request in this block that hold data but are not valid.
            let rs = offset.max(bs);
            let re = end.min(be);
            let want = mask((rs - bs) / SECTOR, (re - bs).div_ceil(SECTOR));
            let valid = st.block(b).map_or(0, |blk| blk.valid);
            let need = want & !valid != 0 && {
                let data = st
                    .sparse
                    .data_in(rs / SECTOR * SECTOR, re.div_ceil(SECTOR) * SECTOR);
                data.iter().any(|r| {
                    let m = mask((r.start - bs) / SECTOR, (r.end - bs).div_ceil(SECTOR));
                    m & want & !valid != 0
                })
            };
            if need && !mine.contains(&b) {
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
            let (bs, be) = (b * BLOCK, (b * BLOCK + BLOCK).min(self.size));
            match plan.runs.last_mut() {
                Some(last) if last.1 == bs && last.1 - last.0 < MAX_RUN * 4 => last.1 = be,
                _ => plan.runs.push((bs, be)),
            }
            if !desperate && st.fetching.insert(b) {
                plan.claimed.push(b);
            }
        }
        plan
    }

    /// Queues read-ahead of a sequential stream, up to its window past `end`, for
    /// the prefetch workers: blocks not cached, not already coming, holding data, in
    /// runs of 4 MiB, nearest first. A shorter run is queued only where something
    /// ends it (cached data, a hole, the disk's end); one cut short by the window is
    /// left for the next read to complete, so the stream's fetches stay large.
    fn plan_readahead(&self, st: &mut State, end: u64) {
        if st.readahead == 0 {
            return;
        }
        const RUN: u64 = MAX_RUN / BLOCK;
        let last = self.size.div_ceil(BLOCK);
        let window_end = (end + st.readahead).div_ceil(BLOCK).min(last);
        let mut b = end.div_ceil(BLOCK).max(st.ra_next);
        let mut run: Option<(u64, u64)> = None;
        let mut queued = false;
        while b < window_end {
            let bs = b * BLOCK;
            let free = st.block(b).is_none()
                && !st.fetching.contains(&b)
                && !st.is_queued(b)
                && st.sparse.any_data(bs, (bs + BLOCK).min(self.size));
            match run {
                Some((s, e)) if free && e == b && e - s < RUN => run = Some((s, b + 1)),
                _ => {
                    if let Some((s, e)) = run.take() {
                        st.queued.insert(s, e);
                        queued = true;
                    }
                    run = free.then_some((b, b + 1));
                }
            }
            b += 1;
        }
        st.ra_next = window_end;
        if let Some((s, e)) = run {
            if e - s == RUN || e == last {
                st.queued.insert(s, e);
                queued = true;
            } else {
                st.ra_next = s;
            }
        }
        if queued {
            self.jobs.notify_all();
        }
    }

    /// Follows a sequential stream, tolerating the reordering of parallel kernel
    /// requests, and grows the read-ahead window while it lasts.
    fn track_stream(&self, st: &mut State, offset: u64, end: u64) {
        const SLACK: u64 = 2 * 1024 * 1024;
        if st.seq_next != u64::MAX && offset.abs_diff(st.seq_next) <= SLACK {
            // Starts at 128 KiB, never past the configured most (which may be less).
            st.readahead = (st.readahead * 2)
                .max(128 * 1024)
                .min(self.cfg.readahead_max);
            st.seq_next = st.seq_next.max(end);
        } else {
            st.readahead = 0;
            st.seq_next = end;
            // A new stream: read-ahead not started yet is for an old one.
            st.queued.clear();
            st.ra_next = 0;
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

    /// Adds fetched data to the cache, never overwriting valid sectors.
    fn insert_clean(&self, st: &mut State, start: u64, data: &[u8]) {
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
        let edges: Vec<u64> = {
            let mut v = Vec::new();
            if offset % SECTOR != 0 {
                v.push(offset / SECTOR * SECTOR);
            }
            if end % SECTOR != 0 {
                let s = end / SECTOR * SECTOR;
                if v.last() != Some(&s) {
                    v.push(s);
                }
            }
            v
        };
        // Old bytes of partly covered sectors, fetched unless cached or a hole. No
        // flush or discard may land between that fetch and its use (the fetched bytes
        // could then predate data written and evicted since): holding the flush lock
        // keeps them out. Whole-sector writes never get here. Other reads and writes
        // may still evict a block while the state lock is dropped for a fetch, taking
        // a cached edge with it (its old bytes then became zeros, seen once in six
        // runs of the model test), so the edges are checked again under the lock the
        // write is applied under, and any that went missing is fetched too.
        let _no_flush = (!edges.is_empty()).then(|| self.order_lock());
        let mut edge_data: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut epoch = None;
        let mut st = loop {
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
                break st;
            }
            epoch = Some(st.mutations);
            drop(st);
            for s in wanted {
                let mut d = vec![0u8; SECTOR as usize];
                self.backend.read(s, &mut d)?;
                edge_data.push((s, d));
            }
        };
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
        st.dirty_sectors += newly_dirty;
        st.sparse
            .insert(offset / SECTOR * SECTOR, end.div_ceil(SECTOR) * SECTOR);
        st.last_write = Some(Instant::now());
        self.evict(&mut st);
        drop(st);
        self.counters.bytes_written.fetch_add(len, Relaxed);
        Ok(())
    }

    /// Back-pressure: while dirty data is at its limit the writer itself flushes
    /// (in turn with the background flusher), so it is slowed, never failed, unless
    /// the blob cannot be written at all.
    fn wait_for_room(&self, len: u64) -> Result<(), DeviceError> {
        let mut counted = false;
        loop {
            let over = {
                let st = self.lock();
                st.dirty_sectors > 0
                    && st.dirty_sectors * SECTOR + len > self.cfg.dirty_limit.max(len)
            };
            if !over {
                return Ok(());
            }
            if !counted {
                self.counters.write_waits.fetch_add(1, Relaxed);
                counted = true;
            }
            self.changed.notify_all();
            self.flush()?;
        }
    }

    /// Writes every sector that is dirty now; returns when all of it is in the
    /// backend (fsync, unmount). Data written meanwhile may stay dirty.
    pub fn flush(&self) -> Result<(), DeviceError> {
        let _order = self.order_lock();
        let pending: BTreeSet<u64> = self.lock().dirty.keys().copied().collect();
        if pending.is_empty() {
            return Ok(());
        }
        if self.is_fenced() {
            return Err(DeviceError::LeaseLost(format!(
                "{} dirty bytes cannot be written",
                self.dirty_bytes()
            )));
        }
        self.counters.flushes.fetch_add(1, Relaxed);
        self.write_blocks(pending, false)
    }

    /// Writes complete 4 MiB runs of fully dirty blocks at once, without waiting for
    /// fsync: a sequential writer's data then travels while it is still writing,
    /// and the runs are as large as they can ever be, so no coalescing is lost. Runs
    /// that settle while it works are taken too, so a steady writer keeps the
    /// uploads busy; it yields as soon as a flush or discard waits for its turn.
    /// Returns whether anything was written. Skips if another flush is running.
    pub fn flush_full_runs(&self) -> Result<bool, DeviceError> {
        let Ok(_order) = self.flush_lock.try_lock() else {
            return Ok(false);
        };
        if self.is_fenced() {
            return Ok(false);
        }
        let pending = self.settled_runs(&self.lock(), &BTreeSet::new());
        if pending.is_empty() {
            return Ok(false);
        }
        self.write_blocks(pending, true)?;
        Ok(true)
    }

    /// The flush lock, for those who must wait for it (not the background flusher,
    /// which only tries): counted, so a long background flush gives way to them.
    fn order_lock(&self) -> MutexGuard<'_, ()> {
        self.order_waiters.fetch_add(1, Relaxed);
        let guard = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.order_waiters.fetch_sub(1, Relaxed);
        guard
    }

    /// Blocks of complete 4 MiB runs that are fully dirty, not written within
    /// [`SETTLE`] (a block rewritten within the last moment is part of a hot region
    /// that fsync will coalesce better) and not in flight; at most [`FLUSH_BATCH`].
    fn settled_runs(&self, st: &State, in_flight: &BTreeSet<u64>) -> BTreeSet<u64> {
        let per_run = MAX_RUN / BLOCK;
        let mut set = BTreeSet::new();
        let mut streak: Vec<u64> = Vec::new();
        let settled = |b: u64, blk: &Block| {
            blk.dirty == u128::MAX
                && blk.touched.is_none_or(|t| t.elapsed() >= SETTLE)
                && !in_flight.contains(&b)
        };
        for (&b, blk) in st.dirty.iter() {
            let ok = settled(b, blk);
            if !ok || streak.last().is_some_and(|&l| l + 1 != b) {
                streak.clear();
            }
            if ok {
                streak.push(b);
                if streak.len() as u64 == per_run {
                    set.extend(streak.drain(..));
                    if set.len() as u64 * BLOCK >= FLUSH_BATCH {
                        break;
                    }
                }
            }
        }
        set
    }

    /// Writes the dirty sectors of `pending` blocks, in units of at most 4 MiB with
    /// up to [`FLUSH_PARALLEL`] in flight, each unit marked clean as soon as it
    /// lands. With `refill`, settled runs are added as the pending ones run out.
    /// The caller holds `flush_lock`, so no other flush or discard interleaves, and
    /// a block is never in two units in flight at once.
    fn write_blocks(&self, pending: BTreeSet<u64>, refill: bool) -> Result<(), DeviceError> {
        let units = (pending.len() as u64 * BLOCK).div_ceil(MAX_RUN) as usize;
        let workers = if refill {
            FLUSH_PARALLEL
        } else {
            units.clamp(1, FLUSH_PARALLEL)
        };
        let queue = Mutex::new(FlushQueue {
            pending,
            in_flight: BTreeSet::new(),
            error: None,
        });
        if workers == 1 {
            self.flush_worker(&queue, refill);
        } else {
            std::thread::scope(|s| {
                for _ in 1..workers {
                    s.spawn(|| self.flush_worker(&queue, refill));
                }
                self.flush_worker(&queue, refill);
            });
        }
        let queue = queue.into_inner().unwrap_or_else(|p| p.into_inner());
        queue.error.map_or(Ok(()), Err)
    }

    /// One of [`Cache::write_blocks`]'s workers: takes units until none are left or
    /// a unit failed.
    fn flush_worker(&self, queue: &Mutex<FlushQueue>, refill: bool) {
        let lock_queue = || queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let unit = {
                let st = self.lock();
                let mut q = lock_queue();
                if q.error.is_some() {
                    return;
                }
                if q.pending.is_empty()
                    && refill
                    && self.order_waiters.load(Relaxed) == 0
                    && !self.is_fenced()
                {
                    q.pending = self.settled_runs(&st, &q.in_flight);
                }
                let unit = self.take_unit(&st, &mut q.pending);
                q.in_flight.extend(unit.taken.iter().map(|&(b, _, _)| b));
                unit
            };
            if unit.taken.is_empty() {
                return;
            }
            let bytes: u64 = unit.runs.iter().map(|(_, d)| d.len() as u64).sum();
            debug!(runs = unit.runs.len(), bytes, "flushing");
            let result = self.backend.write_runs(unit.runs);
            {
                let mut st = self.lock();
                if result.is_ok() {
                    st.mutations += 1;
                    for &(b, gen, m) in &unit.taken {
                        let now_clean = match st.dirty.get_mut(&b) {
                            Some(blk) if blk.gen == gen => {
                                let cleared = (blk.dirty & m).count_ones() as u64;
                                blk.dirty &= !m;
                                st.dirty_sectors -= cleared;
                                st.dirty.get(&b).is_some_and(|blk| blk.dirty == 0)
                            }
                            _ => false,
                        };
                        if now_clean {
                            let blk = st.dirty.remove(&b).expect("present");
                            st.clean.put(b, blk);
                        }
                    }
                }
                self.evict(&mut st);
            }
            {
                let mut q = lock_queue();
                for (b, _, _) in &unit.taken {
                    q.in_flight.remove(b);
                }
                if let Err(e) = result {
                    // A lost lease outranks any other failure.
                    if q.error.is_none() || matches!(e, DeviceError::LeaseLost(_)) {
                        q.error = Some(e);
                    }
                }
            }
            self.changed.notify_all();
        }
    }

    /// Copies the next unit of dirty data (in disk order, whole blocks, at most
    /// 4 MiB) out of `pending` blocks into one pooled buffer, as runs of adjacent
    /// sectors. Clean gaps between dirty sectors are sent along where the cache
    /// holds them and the blob has them (see [`sectors`]): gaps inside a block, and
    /// gaps across the edge of two adjacent blocks of the unit. Only blocks of the
    /// unit itself are read, so no other unit in flight can hold the same sectors.
    fn take_unit(&self, st: &State, pending: &mut BTreeSet<u64>) -> FlushUnit {
        // Per taken block: (block, generation, dirty mask, sectors to send).
        let mut taken: Vec<(u64, u64, u128, u128)> = Vec::new();
        let mut sectors_total = 0u64;
        let mut prev_bridgeable = 0u128;
        while let Some(&b) = pending.first() {
            let Some(blk) = st.dirty.get(&b) else {
                pending.remove(&b);
                continue;
            };
            let bridgeable = blk.valid & !blk.dirty & data_mask(&st.sparse, b);
            let mut send = sectors::bridge_inner(blk.dirty, bridgeable);
            // Bridge the edge with the previous block when both sides are held.
            let mut prev_extra = 0u128;
            if let Some(&(pb, _, _, psend)) = taken.last() {
                let tail = sectors::trailing_gap(psend);
                let lead = sectors::leading_gap(send);
                if pb + 1 == b
                    && psend != 0
                    && send != 0
                    && tail & prev_bridgeable == tail
                    && lead & bridgeable == lead
                {
                    prev_extra = tail;
                    send |= lead;
                }
            }
            let cost = u64::from(send.count_ones() + prev_extra.count_ones());
            if !taken.is_empty() && (sectors_total + cost) * SECTOR > MAX_RUN {
                break;
            }
            pending.remove(&b);
            sectors_total += cost;
            if let Some(last) = taken.last_mut() {
                last.3 |= prev_extra;
            }
            taken.push((b, blk.gen, blk.dirty, send));
            prev_bridgeable = bridgeable;
        }
        let mut buf = self.pool.take();
        // (offset, start in buf, length) of each run.
        let mut spans: Vec<(u64, usize, usize)> = Vec::new();
        for &(b, _, _, send) in &taken {
            let blk = st.dirty.get(&b).expect("taken under the same lock");
            for (sa, se) in sectors::runs(send) {
                let off = b * BLOCK + sa * SECTOR;
                let data = &blk.data[(sa * SECTOR) as usize..(se * SECTOR) as usize];
                match spans.last_mut() {
                    Some(last) if last.0 + last.2 as u64 == off => last.2 += data.len(),
                    _ => spans.push((off, buf.len(), data.len())),
                }
                buf.extend_from_slice(data);
            }
        }
        let data = self.pool.freeze(buf);
        let runs = spans
            .into_iter()
            .map(|(off, start, len)| (off, data.slice(start..start + len)))
            .collect();
        FlushUnit {
            runs,
            taken: taken.into_iter().map(|(b, g, d, _)| (b, g, d)).collect(),
        }
    }

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
        {
            let mut st = self.lock();
            st.mutations += 1;
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
        }
        self.changed.notify_all();
        let result = self.backend.discard(s, e - s);
        // A fetch planned between the first bump and the clear may have read the
        // old bytes: this second bump keeps them out of the cache.
        self.lock().mutations += 1;
        result
    }

    /// Runs the background flusher until [`Cache::close`]: writes dirty data when it
    /// passes half its limit, or when no write came for `flush_after`.
    pub fn run_flusher(&self) {
        loop {
            let due = {
                let st = self.lock();
                let st = self
                    .changed
                    .wait_timeout(st, Duration::from_millis(50))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                if self.closing.load(Relaxed) {
                    return;
                }
                let dirty = st.dirty_sectors * SECTOR;
                dirty > 0
                    && (dirty >= self.cfg.dirty_limit / 2
                        || st
                            .last_write
                            .is_none_or(|t| t.elapsed() >= self.cfg.flush_after))
            };
            let result = if due && !self.is_fenced() {
                self.flush()
            } else {
                // Drain complete runs while there are any.
                loop {
                    match self.flush_full_runs() {
                        Ok(true) => continue,
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            };
            if let Err(e) = result {
                warn!("background flush failed (will retry): {e}");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }

    /// Runs one prefetch worker until [`Cache::close`]: takes queued read-ahead,
    /// nearest first, and caches it, unless a flush or discard landed while it was
    /// fetched (the bytes may then be older than what the cache wrote since).
    /// Several run at once, so a sequential reader finds its next blocks cached or
    /// on their way, with as many ranged reads in flight as there are workers.
    pub fn run_prefetcher(&self) {
        loop {
            let (start, end, epoch, claim) = {
                let mut st = self.lock();
                loop {
                    if self.closing.load(Relaxed) {
                        return;
                    }
                    if let Some((s, e)) = st.queued.pop_first() {
                        st.fetching.extend(s..e);
                        break (
                            s * BLOCK,
                            (e * BLOCK).min(self.size),
                            st.mutations,
                            (s..e).collect(),
                        );
                    }
                    st = self.jobs.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let claim = Claim::new(self, claim);
            let mut data = self.pool.take();
            data.resize((end - start) as usize, 0);
            let result = self.backend.read(start, &mut data);
            let mut st = self.lock();
            claim.release(&mut st);
            match result {
                Ok(()) if st.mutations == epoch => {
                    self.insert_clean(&mut st, start, &data);
                    self.evict(&mut st);
                }
                Ok(()) => {}
                // The reader that needs these blocks fetches them and reports it.
                Err(e) => debug!("read-ahead at {start} failed: {e}"),
            }
            drop(st);
            self.pool.give(data);
        }
    }

    /// Stops the background flusher and the prefetch workers.
    pub fn close(&self) {
        self.closing.store(true, Relaxed);
        let _st = self.lock();
        self.changed.notify_all();
        self.jobs.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::super::mem::MemBackend;
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn cache(size: u64, capacity: u64) -> Cache<MemBackend> {
        cache_with(size, CacheConfig::with_capacity(capacity))
    }

    /// An empty in-memory drive of `size` behind a cache tuned by `cfg`.
    fn cache_with(size: u64, cfg: CacheConfig) -> Cache<MemBackend> {
        Cache::new(
            MemBackend::new(size),
            size,
            SparseMap::default(),
            cfg,
            false,
            Arc::new(AtomicBool::new(false)),
        )
    }

    /// Starts the flusher and `prefetchers` prefetch workers, as the daemon does.
    fn background(
        c: &Arc<Cache<MemBackend>>,
        prefetchers: usize,
    ) -> Vec<std::thread::JoinHandle<()>> {
        let f = c.clone();
        let mut v = vec![std::thread::spawn(move || f.run_flusher())];
        for _ in 0..prefetchers {
            let p = c.clone();
            v.push(std::thread::spawn(move || p.run_prefetcher()));
        }
        v
    }

    #[test]
    fn whole_page_writes_never_read_and_flush_coalesces() {
        let c = cache(64 * MIB, 256 * MIB);
        let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
        for i in 0..16u64 {
            c.write(i * MIB, &data).unwrap();
        }
        assert_eq!(c.backend.reads.load(Relaxed), 0);
        assert_eq!(c.dirty_bytes(), 16 * MIB);
        c.flush().unwrap();
        assert_eq!(c.backend.writes.load(Relaxed), 4, "16 MiB in 4 MiB runs");
        assert_eq!(c.dirty_bytes(), 0);
        let mut back = vec![0u8; MIB as usize];
        c.read(5 * MIB, &mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(
            &c.backend.contents()[3 * MIB as usize..4 * MIB as usize],
            &data[..]
        );
    }

    #[test]
    fn partial_sector_writes_read_the_old_bytes_once() {
        let c = cache(4 * MIB, 64 * MIB);
        c.write(0, &[7u8; 4096]).unwrap();
        c.flush().unwrap();
        // Drop the cache's copy by making a fresh cache over the same backend data.
        let c2 = Cache::new(
            MemBackend::new(4 * MIB),
            4 * MIB,
            SparseMap::from_ranges(&[crate::azure::PageRange::new(0, 4096)]),
            CacheConfig::with_capacity(64 * MIB),
            false,
            Arc::new(AtomicBool::new(false)),
        );
        c2.backend
            .write_runs(vec![(0, Bytes::from(vec![7u8; 4096]))])
            .unwrap();
        c2.write(100, &[1u8; 10]).unwrap();
        assert_eq!(c2.backend.reads.load(Relaxed), 1, "one edge sector fetched");
        let mut b = vec![0u8; 512];
        c2.read(0, &mut b).unwrap();
        assert!(b[..100].iter().all(|&x| x == 7));
        assert!(b[100..110].iter().all(|&x| x == 1));
        assert!(b[110..].iter().all(|&x| x == 7));
        // A partial write into a hole reads nothing.
        c2.write(MIB + 3, &[9u8; 5]).unwrap();
        assert_eq!(c2.backend.reads.load(Relaxed), 1);
    }

    #[test]
    fn holes_cost_nothing() {
        let c = cache(64 * MIB, 64 * MIB);
        let mut b = vec![1u8; MIB as usize];
        c.read(10 * MIB, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(c.backend.reads.load(Relaxed), 0);
        assert_eq!(c.snapshot().hole_reads, 1);
    }

    #[test]
    fn discard_clears_and_reads_zero() {
        let c = cache(8 * MIB, 64 * MIB);
        c.write(0, &vec![5u8; 2 * MIB as usize]).unwrap();
        c.flush().unwrap();
        c.write(MIB, &[6u8; 4096]).unwrap(); // dirty data inside the range is dropped
        c.discard(1000, MIB).unwrap();
        c.flush().unwrap();
        let mut b = vec![0u8; 2 * MIB as usize];
        c.read(0, &mut b).unwrap();
        assert!(b[..1000].iter().all(|&x| x == 5));
        assert!(b[1000..(MIB + 1000) as usize].iter().all(|&x| x == 0));
        assert!(b[(MIB + 1000) as usize..(MIB + 4096) as usize]
            .iter()
            .all(|&x| x == 6));
        assert!(b[(MIB + 4096) as usize..].iter().all(|&x| x == 5));
        assert_eq!(c.backend.contents()[..2 * MIB as usize], b[..]);
        assert_eq!(c.backend.discards.load(Relaxed), 1);
        assert_eq!(c.snapshot().allocated_bytes, 2 * MIB - (MIB - 512));
    }

    #[test]
    fn matches_a_byte_model_under_random_io_and_tiny_cache() {
        // Random reads, writes (aligned and not), discards and flushes against a plain
        // byte vector, with a cache much smaller than the disk so eviction happens.
        let size = 16 * MIB;
        let cfg = CacheConfig {
            capacity: 4 * MIB,
            dirty_limit: 2 * MIB,
            readahead_max: 512 * 1024,
            flush_after: Duration::from_secs(3),
        };
        let c = Arc::new(cache_with(size, cfg));
        // The background flusher and prefetch workers run all along, as in the
        // daemon; backend calls take a moment, so read-ahead and flush units are
        // caught in flight.
        c.backend.read_delay_us.store(50, Relaxed);
        c.backend.write_delay_us.store(200, Relaxed);
        let workers = background(&c, 3);
        let mut model = vec![0u8; size as usize];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..3000 {
            let op = next() % 10;
            let off = next() % size;
            let len = (next() % (256 * 1024)).min(size - off).max(1);
            match op {
                0..=3 => {
                    let v = (round % 250 + 1) as u8;
                    let data = vec![v; len as usize];
                    c.write(off, &data).unwrap();
                    model[off as usize..(off + len) as usize].fill(v);
                }
                4 => {
                    c.discard(off, len).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                5 => c.flush().unwrap(),
                _ => {
                    // Poisoned: a read must write every byte (FUSE reuses buffers).
                    let mut b = vec![0xEEu8; len as usize];
                    c.read(off, &mut b).unwrap();
                    let want = &model[off as usize..(off + len) as usize];
                    if b != want {
                        let at = b.iter().zip(want).position(|(x, y)| x != y).unwrap();
                        let last = b.iter().zip(want).rposition(|(x, y)| x != y).unwrap();
                        panic!(
                            "round {round}: read {len} at {off}: bytes {at}..={last} differ, first is {} not {}",
                            b[at], want[at]
                        );
                    }
                }
            }
            assert!(c.snapshot().cached_bytes <= 4 * MIB + 512 * 1024, "bounded");
        }
        c.flush().unwrap();
        assert!(c.backend.contents() == model, "final contents differ");
        assert!(
            c.backend.reads.load(Relaxed) > 0,
            "the model test reads the backend"
        );
        c.close();
        for w in workers {
            w.join().unwrap();
        }
    }

    #[test]
    fn a_partial_sector_whose_block_is_evicted_meanwhile_keeps_its_old_bytes() {
        // A write that starts and ends inside sectors needs their old bytes: one
        // edge here must be fetched (slowly), the other is cached when the write
        // looks. While the fetch is out, other writes evict the cached one. The
        // write must fetch that edge too, not take its old bytes for zeros.
        let cfg = CacheConfig {
            capacity: 4 * BLOCK,
            dirty_limit: 64 * BLOCK,
            readahead_max: BLOCK,
            flush_after: Duration::from_secs(3600),
        };
        let c = Arc::new(cache_with(64 * BLOCK, cfg));
        c.write(0, &vec![0xAA; 3 * BLOCK as usize]).unwrap();
        c.flush().unwrap();
        // Only block 2 stays cached: fill the cache with others, then read it.
        c.write(10 * BLOCK, &vec![1; 4 * BLOCK as usize]).unwrap();
        c.flush().unwrap();
        c.read(2 * BLOCK, &mut [0u8; 512]).unwrap();
        c.backend.read_delay_us.store(300_000, Relaxed);
        let w = c.clone();
        let writer = std::thread::spawn(move || w.write(100, &vec![0x11; 2 * BLOCK as usize]));
        std::thread::sleep(Duration::from_millis(100));
        // Whole-block writes take no flush lock and evict every clean block.
        c.write(20 * BLOCK, &vec![2; 4 * BLOCK as usize]).unwrap();
        writer.join().unwrap().unwrap();
        c.backend.read_delay_us.store(0, Relaxed);
        let mut b = vec![0u8; 512];
        c.read(2 * BLOCK, &mut b).unwrap();
        assert!(b[..100].iter().all(|&x| x == 0x11));
        assert!(
            b[100..].iter().all(|&x| x == 0xAA),
            "old bytes of the edge sector lost"
        );
        c.flush().unwrap();
        assert_eq!(&c.backend.contents()[2 * BLOCK as usize..][..512], &b[..]);
    }

    #[test]
    fn failed_flush_keeps_data_dirty_and_retries_same_bytes() {
        let c = cache(4 * MIB, 64 * MIB);
        c.write(0, &[3u8; 8192]).unwrap();
        c.backend.fail_writes.store(true, Relaxed);
        assert!(c.flush().is_err());
        assert_eq!(c.dirty_bytes(), 8192);
        c.backend.fail_writes.store(false, Relaxed);
        c.flush().unwrap();
        assert_eq!(c.dirty_bytes(), 0);
        assert_eq!(&c.backend.contents()[..8192], &[3u8; 8192][..]);
    }

    #[test]
    fn fenced_cache_refuses_writes_but_reads() {
        let fence = Arc::new(AtomicBool::new(false));
        let c = Cache::new(
            MemBackend::new(4 * MIB),
            4 * MIB,
            SparseMap::default(),
            CacheConfig::with_capacity(64 * MIB),
            false,
            fence.clone(),
        );
        c.write(0, &[1u8; 512]).unwrap();
        fence.store(true, Relaxed);
        assert!(matches!(
            c.write(0, &[1u8; 512]),
            Err(DeviceError::LeaseLost(_))
        ));
        assert!(matches!(c.flush(), Err(DeviceError::LeaseLost(_))));
        let mut b = [0u8; 512];
        c.read(0, &mut b).unwrap();
        assert_eq!(b, [1u8; 512]);
    }

    #[test]
    fn writers_wait_for_the_flusher_instead_of_failing() {
        let c = Arc::new(cache(64 * MIB, 32 * MIB)); // dirty limit 16 MiB
        let f = c.clone();
        let flusher = std::thread::spawn(move || f.run_flusher());
        let data = vec![1u8; MIB as usize];
        for i in 0..64u64 {
            c.write(i * MIB, &data).unwrap();
            assert!(c.dirty_bytes() <= 16 * MIB);
        }
        c.flush().unwrap();
        c.close();
        flusher.join().unwrap();
        assert!(c.snapshot().write_waits > 0);
        assert!(c.backend.contents().iter().all(|&x| x == 1));
    }

    #[test]
    fn block_memory_is_reused_and_stays_within_the_capacity() {
        let c = cache(64 * MIB, 4 * MIB);
        let data = vec![9u8; MIB as usize];
        let mut back = vec![0u8; MIB as usize];
        for round in 0..3 {
            for i in 0..64 {
                c.write(i * MIB, &data).unwrap();
                c.flush().unwrap();
                c.read(((i * 7 + round) % 64) * MIB, &mut back).unwrap();
            }
        }
        let st = c.lock();
        let held = st.len() + st.free.len();
        assert!(
            held <= c.cap_blocks() + blockmem::BATCH,
            "{held} blocks of memory for a capacity of {}",
            c.cap_blocks()
        );
    }

    /// Every other 4 KiB page of `[0, len)` rewritten with `fill`.
    fn scatter(c: &Cache<MemBackend>, len: u64, fill: u8) {
        for p in (0..len / 4096).step_by(2) {
            c.write(p * 4096, &[fill; 4096]).unwrap();
        }
    }

    #[test]
    fn scattered_writes_over_cached_data_bridge_their_gaps() {
        let c = cache(16 * MIB, 256 * MIB);
        let base: Vec<u8> = (0..8 * MIB as usize).map(|i| (i % 253) as u8).collect();
        c.write(0, &base).unwrap();
        c.flush().unwrap();
        assert_eq!(c.backend.writes.load(Relaxed), 2);
        scatter(&c, 8 * MIB, 0xAB);
        c.flush().unwrap();
        // 1024 dirty pages with clean pages between: two 4 MiB calls, not 1024.
        assert_eq!(c.backend.writes.load(Relaxed), 4);
        let mut want = base.clone();
        for p in (0..8 * MIB as usize / 4096).step_by(2) {
            want[p * 4096..(p + 1) * 4096].fill(0xAB);
        }
        assert_eq!(&c.backend.contents()[..8 * MIB as usize], &want[..]);
        assert_eq!(c.dirty_bytes(), 0);
    }

    #[test]
    fn gaps_the_cache_does_not_hold_or_that_are_holes_stay_gaps() {
        // The blob has data the cache never saw: the gaps cannot be re-sent.
        let c = cache(4 * MIB, 64 * MIB);
        c.backend
            .write_runs(vec![(0, Bytes::from(vec![5u8; MIB as usize]))])
            .unwrap();
        c.lock().sparse.insert(0, MIB);
        let before = c.backend.writes.load(Relaxed);
        scatter(&c, MIB, 1);
        c.flush().unwrap();
        assert_eq!(c.backend.writes.load(Relaxed) - before, 128);
        let got = c.backend.contents();
        assert!(got[4096..8192].iter().all(|&x| x == 5));
        assert!(got[..4096].iter().all(|&x| x == 1));
        // Holes the cache holds as zeros (it fetched their block for the page of
        // data in it) are not written either.
        c.backend
            .write_runs(vec![(2 * MIB, Bytes::from(vec![3u8; 4096]))])
            .unwrap();
        c.lock().sparse.insert(2 * MIB, 2 * MIB + 4096);
        let mut back = vec![0u8; BLOCK as usize];
        c.read(2 * MIB, &mut back).unwrap();
        let before = c.backend.writes.load(Relaxed);
        for p in [2, 4, 6] {
            c.write(2 * MIB + p * 4096, &[2u8; 4096]).unwrap();
        }
        c.flush().unwrap();
        assert_eq!(c.backend.writes.load(Relaxed) - before, 3);
        assert!(!c
            .lock()
            .sparse
            .any_data(2 * MIB + 3 * 4096, 2 * MIB + 4 * 4096));
    }

    #[test]
    fn complete_runs_travel_before_fsync_and_whole() {
        let c = Arc::new(cache(64 * MIB, 256 * MIB));
        let f = c.clone();
        let flusher = std::thread::spawn(move || f.run_flusher());
        let data = vec![2u8; MIB as usize];
        for i in 0..16u64 {
            c.write(i * MIB, &data).unwrap();
        }
        c.write(16 * MIB, &data[..4096]).unwrap();
        // Without any fsync, the four complete 4 MiB runs are written by the flusher;
        // the 4 KiB tail stays cached (it may still grow).
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.dirty_bytes() > 4096 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(c.backend.writes.load(Relaxed), 4);
        assert_eq!(c.dirty_bytes(), 4096);
        c.flush().unwrap();
        assert_eq!(c.backend.writes.load(Relaxed), 5);
        c.close();
        flusher.join().unwrap();
    }

    #[test]
    fn concurrent_readers_under_eviction_see_only_real_data() {
        // Regression: a block the read plan relied on was evicted by another
        // reader's insert before the fetch returned, and its bytes came back as zeros.
        let size = 8 * MIB;
        let cfg = CacheConfig {
            capacity: MIB,
            dirty_limit: MIB / 2,
            readahead_max: 256 * 1024,
            flush_after: Duration::from_secs(3),
        };
        let c = Arc::new(cache_with(size, cfg));
        let pattern = |pos: u64| (pos / SECTOR % 251) as u8 + 1;
        let data: Vec<u8> = (0..size).map(pattern).collect();
        for off in (0..size).step_by(MIB as usize) {
            c.write(off, &data[off as usize..(off + MIB) as usize])
                .unwrap();
            c.flush().unwrap();
        }
        c.backend.read_delay_us.store(100, Relaxed);
        let workers = background(&c, 4);
        let readers: Vec<_> = (0..4u64)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut x = 0x2545F4914F6CDD1Du64 ^ (t + 1);
                    let mut off = 0;
                    for i in 0..400 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Runs of sequential reads (which start read-ahead) between
                        // random jumps.
                        off = if i % 8 == 0 {
                            x % (size - 1)
                        } else {
                            off % (size - 1)
                        };
                        let len = (x >> 32) % (200 * 1024) + 1;
                        let len = len.min(size - off);
                        let mut b = vec![0xEEu8; len as usize];
                        c.read(off, &mut b).unwrap();
                        if let Some(i) = (0..len).find(|&i| b[i as usize] != pattern(off + i)) {
                            panic!("read {len} at {off}: byte {i} is {}", b[i as usize]);
                        }
                        off += len;
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        c.close();
        for w in workers {
            w.join().unwrap();
        }
    }

    #[test]
    fn sequential_reads_fetch_each_block_once_with_read_ahead_in_flight() {
        let size = 64 * MIB;
        let c = Arc::new(cache(size, 256 * MIB));
        let data: Vec<u8> = (0..size).map(|p| (p / SECTOR % 249) as u8 + 1).collect();
        c.backend
            .write_runs(
                (0..size)
                    .step_by(MAX_RUN as usize)
                    .map(|o| {
                        (
                            o,
                            Bytes::copy_from_slice(&data[o as usize..(o + MAX_RUN) as usize]),
                        )
                    })
                    .collect(),
            )
            .unwrap();
        c.lock().sparse.insert(0, size);
        c.backend.read_delay_us.store(2000, Relaxed);
        let workers = background(&c, 8);
        let mut b = vec![0u8; MIB as usize];
        for off in (0..size).step_by(MIB as usize) {
            c.read(off, &mut b).unwrap();
            assert!(
                b == data[off as usize..(off + MIB) as usize],
                "bytes at {off}"
            );
        }
        c.close();
        for w in workers {
            w.join().unwrap();
        }
        // Readers waited for read-ahead already on its way instead of fetching it
        // again: every byte came from the backend exactly once.
        assert_eq!(c.backend.bytes_read.load(Relaxed), size);
        let reads = c.backend.reads.load(Relaxed);
        assert!(
            reads < 64,
            "{reads} backend reads: read-ahead runs are large"
        );
        let s = c.snapshot();
        assert!(
            s.cache_hits > 0,
            "some reads found read-ahead already cached"
        );
    }
}
