//! The write-back page cache between FUSE and the blob.
//!
//! Memory is cut into 64 KiB blocks; each block knows, per 512-byte sector, which
//! bytes are valid (match or supersede the blob) and which are dirty (not yet in the
//! blob). That granularity is what lets a 4 KiB write cost no read at all, and lets a
//! flush send exactly the dirty sectors, coalesced across blocks into runs of up to
//! 4 MiB, several in parallel, each marked clean as soon as it lands.
//!
//! Sequential reads are served by read-ahead: the stream's next runs (16 MiB read
//! straight into new blocks where the backend can, else 4 MiB through pooled
//! buffers) are queued for prefetch workers, which keep several ranged reads in
//! flight. A reader
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
//! - fetched data is cached only if no flush or discard that touched its range
//!   landed while it travelled (it could be older than what the cache wrote and
//!   evicted meanwhile); when the record of recent changes no longer reaches back
//!   to the fetch's start, any change counts.
//!
//! Where a block can be, and what its bits say there (checked after every step
//! of the byte-model test by `State::check_invariants`):
//!
//! | where | `valid` | `dirty` | may also be |
//! |---|---|---|---|
//! | `clean` (the LRU) | sectors that match the blob | none | being fetched (the fetch fills only sectors not valid) |
//! | `dirty` (never evicted) | written or fetched sectors | written and not yet on the blob: always within `valid` | being fetched, in a flush in flight (its `gen` tells whether it was written again meanwhile) |
//! | `fetching` (a claim) | not cached yet, or partly | | in `clean` or `dirty` |
//! | `queued` (read-ahead) | | | never in `fetching`: a reader that needs it takes the job over |
//! | `free` | buffers of evicted blocks only, no block number | | at most [`FREE_KEEP`] |
//!
//! A block number is in `clean` or in `dirty`, never both; `dirty_sectors` counts
//! the dirty bits of all of `dirty`.
//!
//! Where each part lives:
//! - `read.rs`: the read path, and why a read fetched, waited or planned again;
//! - `readahead.rs`: stream tracking, queued read-ahead and the prefetch workers;
//! - `write.rs`: writes, the old bytes of partly covered sectors, back-pressure;
//! - `flush.rs`: fsync, complete runs sent ahead of it, the flush lock and its
//!   workers, gap bridging, and the background flusher;
//! - `discard.rs`: discards (whole sectors become holes);
//! - `evict.rs`: eviction of clean blocks and recycling of block memory.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use lru::LruCache;
use serde::Serialize;

use super::blockmem::BlockMem;
use super::bufpool::BufPool;
use super::sparse::SparseMap;
use super::{Backend, DeviceError, LeaseLoss, MAX_GET, MAX_RUN, SECTOR};

mod discard;
mod evict;
mod flush;
mod read;
mod readahead;
mod write;

/// Cache block size.
pub const BLOCK: u64 = 64 * 1024;
const SECTORS: u64 = BLOCK / SECTOR;
/// How long a complete run must go unwritten before it is sent ahead of fsync:
/// long enough to leave a region being rewritten right now alone, short enough
/// that a stream's uploads start as it writes (at 100 ms, the fsync of 1 GiB
/// through ext4 took about 3% longer).
const SETTLE: Duration = Duration::from_millis(20);
/// How long a writer waiting for room waits on complete runs that do not land
/// before it flushes everything itself (and so learns of a failure to write).
const ROOM_PATIENCE: Duration = Duration::from_secs(1);
/// How often the background flusher looks for settled runs while anything is
/// dirty (writes do not wake it then: one wake a write cost more than polling).
const FLUSHER_POLL: Duration = Duration::from_millis(10);
/// How long the flusher sleeps while nothing is dirty: the first write to a
/// clean cache wakes it. Polling at [`FLUSHER_POLL`] then too cost an idle
/// mount 100 wake-ups a second (0.25% of a core in release builds); the limit
/// only bounds what an unforeseen missed wake-up could delay.
const FLUSHER_IDLE: Duration = Duration::from_secs(1);
/// How much dirty data one flush batch copies at most, bounding the memory a flush
/// needs beside the cache itself.
const FLUSH_BATCH: u64 = 32 * 1024 * 1024;
/// Flush units (each at most 4 MiB) in flight at once.
const FLUSH_PARALLEL: usize = 8;
/// Idle 4 MiB buffers kept for flushes and read-ahead: the pages of a kept buffer
/// stay mapped, while a fresh one costs page faults and zeroing for every use.
const POOL_KEEP: usize = 12;
/// Ranged reads of [`MAX_GET`] in the largest read-ahead window, and so the most
/// in flight at once (the daemon runs as many prefetch workers). A run is taken by
/// the reader only once all of it has landed, and the window moves on only then,
/// so the service idles between a batch of runs landing and the next batch
/// starting unless the window holds more than the service needs in flight. At
/// 10 ms round trips a cold read through ext4 ran 666-781 MiB/s with four runs,
/// 710-890 with eight, 842-1005 with twelve and 868-1086 with sixteen (paired runs
/// on one emulator each), where the ceiling's eight GETs in flight carry
/// 1002-1181 (and sixteen in flight from the ceiling client 799-1031).
pub const READAHEAD_RUNS: usize = 16;
/// The largest read-ahead window, [`READAHEAD_RUNS`] runs of [`MAX_GET`]; at most a
/// quarter of the cache. The blocks being fetched count against its capacity.
const READAHEAD_MAX: u64 = READAHEAD_RUNS as u64 * MAX_GET;
/// Read-ahead runs in flight at most where each goes through a pooled 4 MiB
/// buffer (a backend that cannot read into scattered memory).
const POOLED_RUNS: u64 = 8;
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
            readahead_max: (capacity / 4).clamp(BLOCK, READAHEAD_MAX),
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
    /// Requests of the drive's users answered with EIO (see
    /// [`Cache::answered_error`]).
    pub io_errors: AtomicU64,
    /// Of those, the writes, fsyncs and discards (see
    /// [`Cache::answered_write_error`]): what they carried is not on the blob.
    pub failed_writes: AtomicU64,
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
    /// Requests of the drive's users answered with EIO.
    pub io_errors: u64,
    /// Writes, fsyncs and discards of the drive's users answered with EIO.
    pub failed_writes: u64,
    pub dirty_bytes: u64,
    /// How much dirty data the cache holds before writes wait for room.
    pub dirty_limit: u64,
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
    /// landed, a discard cleared pages), through [`State::changed`]. Data fetched
    /// before a bump that touched its range may be older than what the cache has
    /// since written and evicted, so it is not cached.
    mutations: u64,
    /// The latest changes, oldest first: the `mutations` count each one made, and
    /// the byte range it touched (at most [`CHANGES_KEPT`]).
    changes: VecDeque<(u64, u64, u64)>,
    /// Blocks a started fetch (a reader's own or a prefetch) is bringing in:
    /// readers that need one wait for it instead of fetching it again.
    fetching: BTreeSet<u64>,
    /// Read-ahead not started yet, as block ranges `start -> end`. Never overlaps
    /// `fetching`: a reader needing a queued block takes the whole job over.
    queued: BTreeMap<u64, u64>,
    /// The block up to which the current stream's read-ahead was queued.
    ra_next: u64,
    /// Buffers of evicted blocks, reused for new ones (at most [`FREE_KEEP`]):
    /// eviction to make room is followed at once by a new block, so a few kept
    /// buffers spare the kernel's page faults; beyond them, freed block memory goes
    /// back to the kernel (see `blockmem`), so memory shrinks after a burst.
    free: Vec<BlockMem>,
    /// Block memory taken by fetches in flight ([`Cache::fetch_blocks`]), in
    /// blocks: counted against the capacity, so a read-ahead window of eight
    /// 16 MiB runs makes room in the cache rather than adding 128 MiB beside it.
    fetching_mem: usize,
    /// Prefetch workers inside [`Cache::prefetch_queued`] now.
    prefetching: usize,
}

/// Changes remembered for [`State::changed_since`]. A fetch that travelled across
/// more than this many (a long outage) counts as outdated, as every fetch did
/// across any change before the ranges were kept: a flush landing anywhere on the
/// drive threw away all the read-ahead in flight, and a cold sequential read
/// through ext4 (whose journal commits land while it reads) fetched about a third
/// of its data twice.
const CHANGES_KEPT: usize = 1024;

/// Most freed block buffers kept for reuse: two read-ahead runs (8 MiB). A full
/// cache evicts as much as it takes in, and a read-ahead run takes in 64 blocks at
/// once: with one batch (32) kept, half of every run's blocks were freed and then
/// faulted in anew for the next run, a tenth of the daemon's CPU in a cold read
/// through a full cache.
const FREE_KEEP: usize = 2 * (MAX_RUN / BLOCK) as usize;

impl State {
    /// Checks the table of where a block can be (see the module's doc); the
    /// byte-model test calls it after every step.
    #[cfg(test)]
    fn check_invariants(&self) -> Result<(), String> {
        let mut dirty_bits = 0u64;
        for (&b, blk) in &self.dirty {
            if self.clean.contains(&b) {
                return Err(format!("block {b} is both clean and dirty"));
            }
            if blk.dirty & !blk.valid != 0 {
                return Err(format!("block {b} has dirty sectors that are not valid"));
            }
            dirty_bits += u64::from(blk.dirty.count_ones());
        }
        if dirty_bits != self.dirty_sectors {
            return Err(format!(
                "dirty_sectors is {} but the dirty blocks hold {dirty_bits}",
                self.dirty_sectors
            ));
        }
        if let Some((b, _)) = self.clean.iter().find(|(_, blk)| blk.dirty != 0) {
            return Err(format!("clean block {b} has dirty sectors"));
        }
        let mut last_end = 0;
        for (&s, &e) in &self.queued {
            if s >= e || s < last_end {
                return Err(format!("queued read-ahead {s}..{e} is empty or overlaps"));
            }
            if self.fetching.range(s..e).next().is_some() {
                return Err(format!("queued read-ahead {s}..{e} is also being fetched"));
            }
            last_end = e;
        }
        if self.free.len() > FREE_KEEP {
            return Err(format!("{} free buffers kept", self.free.len()));
        }
        Ok(())
    }

    /// Records that the backend's bytes in `[start, end)` changed (a flush unit
    /// landed, pages were cleared).
    fn changed(&mut self, start: u64, end: u64) {
        self.mutations += 1;
        self.changes.push_back((self.mutations, start, end));
        if self.changes.len() > CHANGES_KEPT {
            self.changes.pop_front();
        }
    }

    /// Whether the backend's bytes in `[start, end)` may have changed since the
    /// moment `mutations` was `epoch`: a change after it touched the range, or
    /// changes after it were forgotten.
    fn changed_since(&self, epoch: u64, start: u64, end: u64) -> bool {
        if self.mutations == epoch {
            return false;
        }
        match self.changes.front() {
            Some(&(first, _, _)) if first <= epoch + 1 => self
                .changes
                .iter()
                .any(|&(n, s, e)| n > epoch && s < end && start < e),
            _ => true,
        }
    }

    /// Memory held by dirty blocks, what the dirty limit bounds: a block with one
    /// dirty sector holds all of its 64 KiB until it is written.
    fn dirty_memory(&self) -> u64 {
        self.dirty.len() as u64 * BLOCK
    }

    fn block(&self, b: u64) -> Option<&Block> {
        self.dirty.get(&b).or_else(|| self.clean.peek(&b))
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

/// The cache over a backend of `size` bytes.
pub struct Cache<B: Backend> {
    backend: B,
    /// The disk's size: grows (never shrinks) when a mounted drive is resized.
    size: AtomicU64,
    read_only: bool,
    cfg: CacheConfig,
    state: Mutex<State>,
    changed: Condvar,
    /// Signalled when claimed blocks are released (their fetch ended).
    fetched: Condvar,
    /// Starts or wakes a prefetch worker when read-ahead is queued; set once by
    /// [`Cache::start_prefetchers`]. Without it read-ahead is queued and never
    /// fetched (readers fetch what they need).
    prefetch_waker: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Signalled when the last running prefetch worker leaves (see [`Cache::close`]).
    prefetch_idle: Condvar,
    flush_lock: Mutex<()>,
    /// Threads waiting for `flush_lock` in [`Cache::order_lock`].
    order_waiters: AtomicUsize,
    /// Buffers that flushes copy dirty data into and read-ahead fetches into.
    pool: Arc<BufPool>,
    /// The longest read-ahead run, in blocks: [`MAX_GET`] where the backend
    /// reads straight into block memory, [`MAX_RUN`] where it goes through a
    /// pooled buffer; never longer than the window.
    ra_run: u64,
    /// The largest read-ahead window: the configured one, and at most
    /// [`POOLED_RUNS`] runs where they go through pooled buffers.
    ra_window: u64,
    fenced: Arc<LeaseLoss>,
    closing: AtomicBool,
    pub counters: CacheCounters,
}

impl<B: Backend> Cache<B> {
    /// `sparse` is what the blob holds now; `fenced` is the backend's lease
    /// (writes fail at once once it is lost).
    pub fn new(
        backend: B,
        size: u64,
        sparse: SparseMap,
        cfg: CacheConfig,
        read_only: bool,
        fenced: Arc<LeaseLoss>,
    ) -> Cache<B> {
        let (run, ra_window) = if backend.reads_scattered() {
            (MAX_GET, cfg.readahead_max)
        } else {
            (MAX_RUN, cfg.readahead_max.min(POOLED_RUNS * MAX_RUN))
        };
        let ra_run = (run.min(ra_window) / BLOCK).max(1);
        Cache {
            backend,
            size: AtomicU64::new(size),
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
                changes: VecDeque::new(),
                fetching: BTreeSet::new(),
                queued: BTreeMap::new(),
                ra_next: 0,
                free: Vec::new(),
                fetching_mem: 0,
                prefetching: 0,
            }),
            cfg,
            changed: Condvar::new(),
            fetched: Condvar::new(),
            prefetch_waker: OnceLock::new(),
            prefetch_idle: Condvar::new(),
            flush_lock: Mutex::new(()),
            order_waiters: AtomicUsize::new(0),
            pool: BufPool::new(MAX_RUN as usize, POOL_KEEP),
            ra_run,
            ra_window,
            fenced,
            closing: AtomicBool::new(false),
            counters: CacheCounters::default(),
        }
    }

    pub fn size(&self) -> u64 {
        // Acquire/release: whoever sees the new size also sees the backend grown.
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Serves a disk of `size` bytes from now on, once the backend holds one (a
    /// drive grown while mounted). The grown part holds no data yet, so it reads
    /// as holes until written. Never shrinks.
    pub fn grow(&self, size: u64) {
        self.size
            .fetch_max(size, std::sync::atomic::Ordering::AcqRel);
    }

    /// Runs `f` while no flush or discard sends anything to the backend: what the
    /// backend holds does not change meanwhile (writes into the cache go on).
    pub fn with_writeback_paused<T>(&self, f: impl FnOnce() -> T) -> T {
        let _order = self.order_lock();
        f()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.is_lost()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cap_blocks(&self) -> usize {
        (self.cfg.capacity / BLOCK).max(1) as usize
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        if offset.checked_add(len).is_none_or(|e| e > self.size()) {
            return Err(DeviceError::OutOfRange { offset, len });
        }
        Ok(())
    }

    /// [`State::check_invariants`] under the lock, for tests.
    #[cfg(test)]
    fn check_invariants(&self) -> Result<(), String> {
        self.lock().check_invariants()
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
            io_errors: c.io_errors.load(Relaxed),
            failed_writes: c.failed_writes.load(Relaxed),
            dirty_bytes: st.dirty_sectors * SECTOR,
            dirty_limit: self.cfg.dirty_limit,
            cached_bytes: st.len() as u64 * BLOCK,
            cache_size: self.cfg.capacity,
            allocated_bytes: st.sparse.total(),
        }
    }

    /// The errno to answer a user's request that failed with `e`, counting the
    /// EIOs: the FUSE layer answers every failed read, write, fsync and discard
    /// through here, so that `stats` and the metrics say how often an
    /// application was told its I/O failed (its own mistakes, such as a write to
    /// a read-only drive, are not counted).
    pub fn answered_error(&self, e: &DeviceError) -> i32 {
        let errno = e.errno();
        if errno == libc::EIO {
            self.counters.io_errors.fetch_add(1, Relaxed);
        }
        errno
    }

    /// [`Self::answered_error`] for a request that changes the drive (a write, an
    /// fsync, a discard), whose EIOs are counted apart too: the unmount after a
    /// lost lease says how many failed.
    pub fn answered_write_error(&self, e: &DeviceError) -> i32 {
        let errno = self.answered_error(e);
        if errno == libc::EIO {
            self.counters.failed_writes.fetch_add(1, Relaxed);
        }
        errno
    }

    /// Whether any byte of the disk was ever written (on the blob or here):
    /// a disk that holds none reads as zeros throughout.
    pub fn holds_data(&self) -> bool {
        self.lock().sparse.any_data(0, self.size())
    }

    pub fn dirty_bytes(&self) -> u64 {
        self.lock().dirty_sectors * SECTOR
    }

    fn wake_prefetcher(&self) {
        if let Some(wake) = self.prefetch_waker.get() {
            wake();
        }
    }

    /// Stops the background flusher and the prefetch workers, and waits until
    /// no prefetch is running: what is cached is final after it (the disk
    /// cache is kept from it).
    pub fn close(&self) {
        self.closing.store(true, Relaxed);
        let mut st = self.lock();
        self.changed.notify_all();
        while st.prefetching > 0 {
            st = self
                .prefetch_idle
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[cfg(test)]
mod tests;
