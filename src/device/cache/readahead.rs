//! Read-ahead: [`Cache::track_stream`] follows a sequential stream and grows its
//! window, [`Cache::plan_readahead`] queues the stream's next runs of up to 4 MiB,
//! and the prefetch workers ([`Cache::prefetch_queued`]) fetch them, several ranged
//! reads in flight. A reader that needs a queued block takes the whole job over
//! (`plan_fetch`, in `read.rs`), so no block is fetched twice.
//!
//! Relies on the rules in `mod.rs` ("Rules that keep data safe"): prefetched data
//! is cached only if no flush or discard of its range landed while it travelled,
//! and never over valid sectors (`insert_clean`, in `read.rs`). Queued jobs never
//! overlap blocks being fetched (`State::queued`), and a worker's [`Claim`] is
//! released even if its fetch fails, so no reader waits forever.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tracing::debug;

use crate::device::blockmem::BlockMem;
use crate::device::{Backend, DeviceError};
use crate::pool::Pool;

use super::read::Claim;
use super::{Cache, State, BLOCK};

impl<B: Backend> Cache<B> {
    /// Queues read-ahead of a sequential stream, up to its window past `end`, for
    /// the prefetch workers: blocks not cached, not already coming, holding data, in
    /// runs of [`Cache::ra_run`], nearest first. A shorter run is queued only where
    /// something ends it (cached data, a hole, the disk's end); one cut short by
    /// the window is left for the next read to complete, so the stream's fetches
    /// stay large, unless the window is still growing and shorter than a run: the
    /// stream's first reads then have read-ahead at once (at 10 ms round trips,
    /// waiting for a 16 MiB window cost the first eight 1 MiB reads a round trip
    /// each).
    pub(super) fn plan_readahead(&self, st: &mut State, end: u64) {
        if st.readahead == 0 {
            return;
        }
        let run_max = self.ra_run;
        let last = self.size().div_ceil(BLOCK);
        let window_end = (end + st.readahead).div_ceil(BLOCK).min(last);
        let mut b = end.div_ceil(BLOCK).max(st.ra_next);
        let mut run: Option<(u64, u64)> = None;
        let mut queued = 0;
        while b < window_end {
            let bs = b * BLOCK;
            let free = st.block(b).is_none()
                && !st.fetching.contains(&b)
                && !st.is_queued(b)
                && st.sparse.any_data(bs, (bs + BLOCK).min(self.size()));
            match run {
                Some((s, e)) if free && e == b && e - s < run_max => run = Some((s, b + 1)),
                _ => {
                    if let Some((s, e)) = run.take() {
                        st.queued.insert(s, e);
                        queued += 1;
                    }
                    run = free.then_some((b, b + 1));
                }
            }
            b += 1;
        }
        st.ra_next = window_end;
        if let Some((s, e)) = run {
            if e - s == run_max || e == last || st.readahead < run_max * BLOCK {
                st.queued.insert(s, e);
                queued += 1;
            } else {
                st.ra_next = s;
            }
        }
        // One worker per job: waking them all (eight, for the one job a read
        // usually queues) cost the daemon context switches on its two cores.
        for _ in 0..queued {
            self.wake_prefetcher();
        }
    }

    /// Follows a sequential stream, tolerating the reordering of parallel kernel
    /// requests, and grows the read-ahead window while it lasts.
    ///
    /// A read counts as the stream's if it lies within the window (plus a slack)
    /// of the stream's front, behind it or ahead. Reads through ext4 on the loop
    /// device arrive several MiB out of order (the filesystem's 4 MiB read-ahead,
    /// split into requests that the loop device and FUSE send in parallel): with
    /// only a 2 MiB slack tolerated, a 1 GiB file read started a new stream, and
    /// threw its queued read-ahead away, 258 times. The slack is two of those
    /// read-aheads, as the window grows only with reads that move the front on.
    ///
    /// A file is often several extents apart on the disk (the benchmark's 1 GiB
    /// file on a nearly full ext4 was three, with 144 MiB of another file between
    /// the first two), so a sequential reader jumps. A jump forward by more than a
    /// run drops the read-ahead queued for what it skipped, which nobody reads
    /// (it would otherwise be fetched first, being nearest). A new stream that
    /// begins where a stream had grown its whole window starts with a run of
    /// read-ahead rather than growing from 128 KiB, one round trip per doubling:
    /// it is most likely the same reader on its next extent, and if it is not,
    /// one run is fetched in vain.
    pub(super) fn track_stream(&self, st: &mut State, offset: u64, end: u64) {
        const SLACK: u64 = 8 * 1024 * 1024;
        let reach = SLACK + st.readahead;
        if st.seq_next != u64::MAX && offset.abs_diff(st.seq_next) <= reach {
            // Only a read that moves the front on grows the window (from 128 KiB,
            // never past the configured most, which may be less): a few blocks
            // read over and over, as ext4 reads its superblock and group
            // descriptors while it mounts, are no stream, and growing on them
            // fetched up to a whole window at every mount (202 MiB before the
            // WAN benchmark's write job).
            if end > st.seq_next {
                st.readahead = (st.readahead * 2).max(128 * 1024).min(self.ra_window);
            }
            if offset > st.seq_next + self.ra_run * BLOCK {
                let first = offset / BLOCK;
                st.queued.retain(|_, e| *e > first);
            }
            st.seq_next = st.seq_next.max(end);
        } else {
            st.readahead = if st.readahead >= self.ra_window {
                self.ra_run * BLOCK
            } else {
                0
            };
            st.seq_next = end;
            // A new stream: read-ahead not started yet is for an old one.
            st.queued.clear();
            st.ra_next = 0;
        }
    }

    /// Reads `[start, end)` (whole blocks) straight into new block memory: from
    /// the backend's local copy if it holds all of it ([`Backend::read_local`]),
    /// or else from the backend itself if it reads into scattered memory
    /// ([`Backend::reads_scattered`]). `None` when neither can (the caller reads
    /// through a pooled buffer); on an error the memory is given back.
    pub(super) fn fetch_blocks(
        &self,
        start: u64,
        end: u64,
    ) -> Option<Result<Vec<BlockMem>, DeviceError>> {
        let (local, scattered) = (self.backend.has_local(), self.backend.reads_scattered());
        if !local && !scattered {
            return None;
        }
        let n = (end - start).div_ceil(BLOCK) as usize;
        let mut mems: Vec<BlockMem> = {
            let mut st = self.lock();
            st.fetching_mem += n;
            self.evict(&mut st);
            (0..n).map(|_| st.take_mem()).collect()
        };
        let read = {
            let mut parts: Vec<&mut [u8]> = mems
                .iter_mut()
                .enumerate()
                .map(|(k, m)| {
                    let len = (end - start - k as u64 * BLOCK).min(BLOCK) as usize;
                    &mut m[..len]
                })
                .collect();
            if local && self.backend.read_local(start, &mut parts) {
                Some(Ok(()))
            } else if scattered {
                Some(self.backend.read_scattered(start, &mut parts))
            } else {
                None
            }
        };
        if let Some(Ok(())) = read {
            // Counted until the caller caches or frees them (`fetch_landed`).
            return Some(Ok(mems));
        }
        let mut st = self.lock();
        st.fetch_landed(n);
        st.give_back_mem(mems);
        match read {
            Some(Err(e)) => Some(Err(e)),
            _ => None,
        }
    }

    /// Runs up to `workers` prefetch workers from now on: a pool of threads that
    /// start as read-ahead is queued (one wake per queued run) and end after
    /// [`IDLE_EXIT`](crate::pool::IDLE_EXIT) without one, so an idle mount
    /// holds none. The pool holds the cache weakly (the cache holds the pool),
    /// so dropping the cache ends both.
    pub fn start_prefetchers(self: &Arc<Self>, workers: usize) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        let work = move |()| {
            if let Some(c) = weak.upgrade() {
                c.prefetch_queued();
            }
        };
        let pool = Pool::start("readahead", workers, work, |()| {})?;
        let _ = self.prefetch_waker.set(Box::new(move || pool.send(())));
        Ok(())
    }

    /// Fetches queued read-ahead, nearest first, until none is left or the
    /// cache closes, and caches each run unless a flush or discard landed while
    /// it was fetched (the bytes may then be older than what the cache wrote
    /// since). Run by the prefetch workers, started as read-ahead is queued
    /// ([`Cache::start_prefetchers`]); several run at once, so a
    /// sequential reader finds its next blocks cached or on their way, with as
    /// many ranged reads in flight as there are workers.
    pub fn prefetch_queued(&self) {
        {
            let mut st = self.lock();
            if self.closing.load(Relaxed) {
                return;
            }
            st.prefetching += 1;
        }
        while let Some(run) = self.take_queued() {
            self.prefetch(run);
        }
        let mut st = self.lock();
        st.prefetching -= 1;
        if st.prefetching == 0 {
            self.prefetch_idle.notify_all();
        }
    }

    /// The nearest queued run, claimed: its blocks' range, the mutation count
    /// it is fetched against, and the claim.
    fn take_queued(&self) -> Option<(u64, u64, u64, Vec<u64>)> {
        let mut st = self.lock();
        if self.closing.load(Relaxed) {
            return None;
        }
        let (s, e) = st.queued.pop_first()?;
        st.fetching.extend(s..e);
        Some((
            s * BLOCK,
            (e * BLOCK).min(self.size()),
            st.mutations,
            (s..e).collect(),
        ))
    }

    /// Fetches one claimed run and caches it.
    fn prefetch(&self, (start, end, epoch, claim): (u64, u64, u64, Vec<u64>)) {
        let claim = Claim::new(self, claim);
        match self.fetch_blocks(start, end) {
            Some(Ok(mems)) => {
                let mut st = self.lock();
                claim.release(&mut st);
                st.fetch_landed(mems.len());
                if st.changed_since(epoch, start, end) {
                    st.free_mem(mems);
                } else {
                    self.insert_blocks(&mut st, start, mems);
                    self.evict(&mut st);
                }
                return;
            }
            // The reader that needs these blocks fetches them and reports it.
            Some(Err(e)) => {
                debug!("read-ahead at {start} failed: {e}");
                return;
            }
            None => {}
        }
        let mut data = self.pool.take_filled((end - start) as usize);
        let result = self.backend.read(start, &mut data);
        let mut st = self.lock();
        claim.release(&mut st);
        match result {
            Ok(()) if !st.changed_since(epoch, start, end) => {
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
