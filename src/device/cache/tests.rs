//! Tests of the cache over an in-memory backend, down to a model test of random
//! reads, writes, discards and flushes with the background threads running.

use super::super::blockmem::{self, BlockMem};
use super::super::mem::MemBackend;
use super::*;
use bytes::Bytes;

const MIB: u64 = 1024 * 1024;

fn cache(size: u64, capacity: u64) -> Cache<MemBackend> {
    cache_with(size, CacheConfig::with_capacity(capacity))
}

/// An empty in-memory drive of `size` behind a cache tuned by `cfg`.
fn cache_with(size: u64, cfg: CacheConfig) -> Cache<MemBackend> {
    cache_over(MemBackend::new(size), cfg)
}

/// [`cache_with`] over a backend that reads into scattered memory, as the blob's
/// does without a disk cache: read-ahead fetches long runs into block memory.
fn scattered_cache_with(size: u64, cfg: CacheConfig) -> Cache<MemBackend> {
    let backend = MemBackend::new(size);
    backend.scattered.store(true, Relaxed);
    cache_over(backend, cfg)
}

fn cache_over(backend: MemBackend, cfg: CacheConfig) -> Cache<MemBackend> {
    let size = backend.contents().len() as u64;
    Cache::new(
        backend,
        size,
        SparseMap::default(),
        cfg,
        false,
        Arc::new(LeaseLoss::default()),
    )
}

/// Fills the first `size` bytes of the backend (whole 4 MiB runs) with a pattern
/// that differs per sector, known to the cache as written; returns the bytes.
fn stored(c: &Cache<MemBackend>, size: u64) -> Vec<u8> {
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
    data
}

/// Reads `data.len()` bytes from the start in 1 MiB steps, as a sequential reader
/// does, and checks them against `data`.
fn read_back_by_mib(c: &Cache<MemBackend>, data: &[u8]) {
    let mut b = vec![0u8; MIB as usize];
    for off in (0..data.len() as u64).step_by(MIB as usize) {
        c.read(off, &mut b).unwrap();
        assert!(
            b == data[off as usize..(off + MIB) as usize],
            "bytes at {off}"
        );
    }
}

/// Reads `data` back as [`read_back_by_mib`] does, with the flusher and eight
/// prefetch workers running, and stops them.
fn read_back_with_read_ahead(c: &Arc<Cache<MemBackend>>, data: &[u8]) {
    let workers = background(c, 8);
    read_back_by_mib(c, data);
    c.close();
    for w in workers {
        w.join().unwrap();
    }
}

/// Stores `size` bytes, reads them back with read-ahead over a backend that
/// takes 2 ms per read, and checks that every byte came from the backend once;
/// returns the bytes and the backend reads it took.
fn read_once_with_read_ahead(c: &Arc<Cache<MemBackend>>, size: u64) -> (Vec<u8>, u64) {
    let data = stored(c, size);
    c.backend.read_delay_us.store(2000, Relaxed);
    read_back_with_read_ahead(c, &data);
    assert_eq!(c.backend.bytes_read.load(Relaxed), size, "each byte once");
    (data, c.backend.reads.load(Relaxed))
}

/// Starts the flusher, and up to `prefetchers` prefetch workers, as the
/// daemon does (a pool that starts them as read-ahead is queued).
fn background(c: &Arc<Cache<MemBackend>>, prefetchers: usize) -> Vec<std::thread::JoinHandle<()>> {
    let f = c.clone();
    let v = vec![std::thread::spawn(move || f.run_flusher())];
    if prefetchers > 0 {
        c.start_prefetchers(prefetchers).unwrap();
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
        Arc::new(LeaseLoss::default()),
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
fn a_grown_cache_serves_the_new_part_as_holes_and_keeps_the_old() {
    let c = cache(8 * MIB, 64 * MIB);
    let old = stored(&c, 8 * MIB);
    let mut b = vec![0u8; 4096];
    assert!(
        c.read(8 * MIB, &mut b).is_err() && c.write(8 * MIB, &b).is_err(),
        "past the end before growing"
    );
    c.backend.grow(16 * MIB);
    c.grow(16 * MIB);
    c.grow(12 * MIB);
    assert_eq!(c.size(), 16 * MIB, "never shrinks");
    let reads = c.backend.reads.load(Relaxed);
    b.fill(0xff);
    c.read(12 * MIB, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "the grown part reads zeros");
    assert_eq!(c.backend.reads.load(Relaxed), reads, "as a hole, unasked");
    c.write(16 * MIB - 4096, &[7u8; 4096]).unwrap();
    c.flush().unwrap();
    let on_disk = c.backend.contents();
    assert!(on_disk[(16 * MIB - 4096) as usize..]
        .iter()
        .all(|&x| x == 7));
    read_back_by_mib(&c, &old);
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
    matches_a_byte_model(false);
}

#[test]
fn matches_a_byte_model_reading_into_scattered_block_memory() {
    matches_a_byte_model(true);
}

/// Random reads, writes (aligned and not), discards and flushes against a plain
/// byte vector, with a cache much smaller than the disk so eviction happens;
/// fetches `scattered` straight into block memory or through pooled buffers.
fn matches_a_byte_model(scattered: bool) {
    let size = 16 * MIB;
    let cfg = CacheConfig {
        capacity: 4 * MIB,
        dirty_limit: 2 * MIB,
        readahead_max: 512 * 1024,
        flush_after: Duration::from_secs(3),
    };
    let c = Arc::new(if scattered {
        scattered_cache_with(size, cfg)
    } else {
        cache_with(size, cfg)
    });
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
        if let Err(broken) = c.check_invariants() {
            panic!("round {round}: {broken}");
        }
    }
    c.flush().unwrap();
    c.check_invariants().unwrap();
    assert!(c.backend.contents() == model, "final contents differ");
    assert!(
        c.backend.reads.load(Relaxed) > 0,
        "the model test reads the backend"
    );
    assert_eq!(
        c.backend.scattered_reads.load(Relaxed) > 0,
        scattered,
        "fetched into block memory only where the backend can"
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
fn a_failed_discard_reads_what_the_blob_still_holds() {
    let c = cache(4 * MIB, 64 * MIB);
    c.write(0, &[5u8; 65536]).unwrap();
    c.flush().unwrap();
    c.backend.fail_writes.store(true, Relaxed);
    assert!(c.discard(0, 65536).is_err());
    c.backend.fail_writes.store(false, Relaxed);
    let mut back = vec![0u8; 65536];
    c.read(0, &mut back).unwrap();
    assert!(
        back.iter().all(|&x| x == 5),
        "the cache serves zeros the blob does not hold"
    );
}

#[test]
fn fenced_cache_refuses_writes_but_reads() {
    let fence = Arc::new(LeaseLoss::default());
    let c = Cache::new(
        MemBackend::new(4 * MIB),
        4 * MIB,
        SparseMap::default(),
        CacheConfig::with_capacity(64 * MIB),
        false,
        fence.clone(),
    );
    c.write(0, &[1u8; 512]).unwrap();
    assert!(fence.lose());
    assert!(!fence.lose(), "lost once");
    assert!(fence.lost_at().is_some());
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
fn a_sequential_writer_past_the_dirty_limit_is_sent_as_whole_runs() {
    // 96 MiB written 768 KiB at a time (as runs do not end where writes do)
    // through a cache whose dirty limit is 16 MiB, with uploads that take a
    // moment: the writer waits for complete runs to land instead of flushing
    // everything it finds (which sent the run it was writing in pieces, and let
    // the uploads drain between whole flushes).
    let size = 96 * MIB;
    let step = 768 * 1024;
    let c = Arc::new(cache(size, 32 * MIB));
    c.backend.write_delay_us.store(2000, Relaxed);
    let workers = background(&c, 0);
    let data: Vec<u8> = (0..size).map(|p| (p / SECTOR % 241) as u8 + 1).collect();
    for off in (0..size).step_by(step as usize) {
        c.write(off, &data[off as usize..(off + step) as usize])
            .unwrap();
        assert!(c.dirty_bytes() <= 16 * MIB + step, "dirty past the limit");
    }
    c.flush().unwrap();
    c.close();
    for w in workers {
        w.join().unwrap();
    }
    assert!(c.snapshot().write_waits > 0, "the writer never waited");
    assert_eq!(
        c.backend.writes.load(Relaxed),
        size / MAX_RUN,
        "every run went out whole"
    );
    assert!(c.backend.contents() == data);
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
        held <= c.cap_blocks() + FREE_KEEP,
        "{held} blocks of memory for a capacity of {}",
        c.cap_blocks()
    );
}

#[test]
fn scattered_sector_writes_hold_no_more_memory_than_the_capacity() {
    // One 512-byte write in every 64 KiB block: each dirty sector holds a whole
    // block, so the dirty limit must count blocks, not sectors.
    let c = cache(1024 * MIB, 32 * MIB);
    let sector = [7u8; 512];
    for b in 0..(1024 * MIB / BLOCK) {
        c.write(b * BLOCK + 512, &sector).unwrap();
        let st = c.lock();
        assert!(
            st.dirty_memory() <= c.cfg.dirty_limit,
            "{} bytes of dirty blocks over a limit of {}",
            st.dirty_memory(),
            c.cfg.dirty_limit
        );
        assert!(st.len() + st.free.len() <= c.cap_blocks() + blockmem::BATCH);
    }
    c.flush().unwrap();
    let mut back = [0u8; 1024];
    c.read(5 * BLOCK, &mut back).unwrap();
    assert!(back[..512].iter().all(|&x| x == 0) && back[512..] == sector);
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
    concurrent_readers_under_eviction(false);
}

#[test]
fn concurrent_readers_fetching_into_block_memory_see_only_real_data() {
    concurrent_readers_under_eviction(true);
}

/// Regression: a block the read plan relied on was evicted by another reader's
/// insert before the fetch returned, and its bytes came back as zeros.
fn concurrent_readers_under_eviction(scattered: bool) {
    let size = 8 * MIB;
    let cfg = CacheConfig {
        capacity: MIB,
        dirty_limit: MIB / 2,
        readahead_max: 256 * 1024,
        flush_after: Duration::from_secs(3),
    };
    let c = Arc::new(if scattered {
        scattered_cache_with(size, cfg)
    } else {
        cache_with(size, cfg)
    });
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
    // Readers waited for read-ahead already on its way instead of fetching it
    // again: every byte came from the backend exactly once.
    let (_, reads) = read_once_with_read_ahead(&c, size);
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

#[test]
fn read_ahead_into_scattered_block_memory_fetches_long_runs_once() {
    // A backend that reads into scattered memory: read-ahead fetches runs of
    // MAX_GET (16 MiB) straight into block memory, sixteen in flight, and every
    // byte still comes from the backend exactly once.
    let size = 256 * MIB;
    let c = Arc::new(scattered_cache_with(
        size,
        CacheConfig::with_capacity(1024 * MIB),
    ));
    assert_eq!((c.ra_run * BLOCK, c.ra_window), (MAX_GET, 16 * MAX_GET));
    let (data, reads) = read_once_with_read_ahead(&c, size);
    assert!(
        reads <= size / MAX_GET + 12,
        "{reads} backend reads for {size} bytes: runs are long"
    );
    assert_eq!(
        c.backend.scattered_reads.load(Relaxed),
        reads,
        "every fetch went straight into block memory"
    );
    // Cached as read: reading it all again asks the backend for nothing.
    read_back_by_mib(&c, &data);
    assert_eq!(c.backend.reads.load(Relaxed), reads);
    assert_eq!(c.lock().fetching_mem, 0, "every fetch landed");
}

#[test]
fn blocks_fetched_in_flight_count_against_the_capacity() {
    // A file four times the cache read with read-ahead of two 16 MiB runs: the
    // cache makes room for the blocks being fetched, so what it holds and what is
    // in flight together stay within the capacity (the window is a quarter of it).
    let size = 512 * MIB;
    let cap = 128 * MIB;
    let c = Arc::new(scattered_cache_with(size, CacheConfig::with_capacity(cap)));
    assert_eq!(c.ra_window, cap / 4);
    let data = stored(&c, size);
    c.backend.read_delay_us.store(500, Relaxed);
    let workers = background(&c, 8);
    let mut b = vec![0u8; MIB as usize];
    for off in (0..size).step_by(MIB as usize) {
        c.read(off, &mut b).unwrap();
        assert!(
            b == data[off as usize..(off + MIB) as usize],
            "bytes at {off}"
        );
        let st = c.lock();
        let held = (st.len() + st.fetching_mem) as u64 * BLOCK;
        assert!(held <= cap, "{held} bytes held or in flight at {off}");
    }
    c.close();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(c.lock().fetching_mem, 0, "every fetch landed");
    assert_eq!(c.backend.bytes_read.load(Relaxed), size, "each byte once");
}

#[test]
fn read_ahead_through_pooled_buffers_keeps_4_mib_runs_eight_in_flight() {
    let c = cache(64 * MIB, 1024 * MIB);
    assert_eq!((c.ra_run * BLOCK, c.ra_window), (MAX_RUN, 8 * MAX_RUN));
    // A window smaller than a run bounds the run.
    let c = cache_with(
        64 * MIB,
        CacheConfig {
            readahead_max: 2 * MIB,
            ..CacheConfig::with_capacity(32 * MIB)
        },
    );
    assert_eq!(c.ra_run * BLOCK, c.ra_window);
    assert_eq!(c.ra_window, 2 * MIB);
}

#[test]
fn a_stream_read_out_of_order_by_a_few_mib_keeps_its_read_ahead() {
    let c = cache(1024 * MIB, 256 * MIB);
    let mut st = c.lock();
    // 1 MiB requests of a 4 MiB read-ahead, in flight together and arriving in
    // any order, as ext4 on the loop device sends them.
    let order = [
        0u64, 1, 3, 2, 5, 7, 4, 6, 10, 8, 11, 9, 14, 12, 15, 13, 17, 16,
    ];
    for &i in &order {
        c.track_stream(&mut st, i * MIB, (i + 1) * MIB);
    }
    assert_eq!(st.readahead, c.ra_window, "the window grew to its most");
    assert_eq!(st.seq_next, 18 * MIB);
    // A read far away starts a new stream (with a run of read-ahead, as the
    // stream before it had grown its whole window).
    c.track_stream(&mut st, 900 * MIB, 901 * MIB);
    assert_eq!(st.readahead, c.ra_run * BLOCK);
    assert_eq!(st.seq_next, 901 * MIB);
}

/// A stream read sequentially in 1 MiB requests up to `mib`, its window grown.
fn grown_stream(c: &Cache<MemBackend>, st: &mut State, mib: u64) {
    for i in 0..mib {
        c.track_stream(st, i * MIB, (i + 1) * MIB);
    }
    assert_eq!(st.readahead, c.ra_window, "the window grew to its most");
}

#[test]
fn the_same_blocks_read_again_and_again_grow_no_read_ahead() {
    // What a filesystem does while it mounts: its first blocks, and a few at the
    // disk's end, read over and over.
    let c = scattered_cache_with(2048 * MIB, CacheConfig::with_capacity(1024 * MIB));
    let mut st = c.lock();
    for _ in 0..20 {
        c.track_stream(&mut st, 2000 * MIB, 2000 * MIB + 4096);
    }
    assert_eq!(st.readahead, 0, "no read moved the stream on");
    // A new stream there (the last had not grown), read the same way.
    for _ in 0..20 {
        c.track_stream(&mut st, 0, 4096);
        c.track_stream(&mut st, 8192, 12288);
    }
    assert_eq!(st.readahead, 128 * 1024, "one read moved it on, once");
    // Reads that move on grow it as before.
    for i in 1..=3 {
        c.track_stream(&mut st, i * 4096 * 4, (i + 1) * 4096 * 4);
    }
    assert_eq!(st.readahead, 1024 * 1024);
}

#[test]
fn a_stream_that_jumps_forward_drops_the_read_ahead_it_skipped() {
    // A file's next extent further on the disk: the read-ahead queued for what
    // lies between is dropped, what lies past the new read is kept.
    let c = scattered_cache_with(2048 * MIB, CacheConfig::with_capacity(1024 * MIB));
    let blocks = |from: u64, to: u64| (from * MIB / BLOCK, to * MIB / BLOCK);
    let mut st = c.lock();
    grown_stream(&c, &mut st, 14);
    for (s, e) in [blocks(14, 30), blocks(100, 116), blocks(200, 216)] {
        st.queued.insert(s, e);
    }
    // Out of order by less than a run: nothing is dropped.
    c.track_stream(&mut st, 22 * MIB, 23 * MIB);
    assert_eq!(st.queued.len(), 3);
    // 127 MiB past the stream's front, within its reach: the same stream.
    c.track_stream(&mut st, 150 * MIB, 151 * MIB);
    assert_eq!(st.readahead, c.ra_window, "still the same stream");
    assert_eq!(st.seq_next, 151 * MIB);
    let (s, e) = blocks(200, 216);
    assert_eq!(
        st.queued.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
        [(s, e)]
    );
}

#[test]
fn a_new_stream_where_a_grown_one_ended_starts_with_a_run_of_read_ahead() {
    let c = scattered_cache_with(2048 * MIB, CacheConfig::with_capacity(1024 * MIB));
    let mut st = c.lock();
    st.sparse.insert(0, 2048 * MIB);
    grown_stream(&c, &mut st, 14);
    st.queued.insert(30 * MIB / BLOCK, 46 * MIB / BLOCK);
    // Far past the window: a new stream, which reads a run ahead at once.
    c.track_stream(&mut st, 1500 * MIB, 1501 * MIB);
    assert_eq!(st.readahead, MAX_GET);
    assert!(
        st.queued.is_empty(),
        "the old stream's read-ahead is dropped"
    );
    c.plan_readahead(&mut st, 1501 * MIB);
    let first = 1501 * MIB / BLOCK;
    assert_eq!(
        st.queued.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
        [(first, first + MAX_GET / BLOCK)],
        "one run, right after the read"
    );
    // A read far from that stream, which had not grown: no read-ahead at first.
    c.track_stream(&mut st, 700 * MIB, 701 * MIB);
    assert_eq!(st.readahead, 0);
    assert!(st.queued.is_empty());
}

#[test]
fn a_fetch_is_outdated_only_by_a_change_of_its_range() {
    let c = cache(64 * MIB, 64 * MIB);
    let mut st = c.lock();
    let epoch = st.mutations;
    assert!(!st.changed_since(epoch, 0, MIB), "nothing changed");
    st.changed(8 * MIB, 12 * MIB);
    assert!(!st.changed_since(epoch, 0, MIB), "a change elsewhere");
    assert!(
        st.changed_since(epoch, 11 * MIB, 13 * MIB),
        "a change of the range"
    );
    assert!(
        !st.changed_since(st.mutations, 11 * MIB, 13 * MIB),
        "before the fetch"
    );
    // Changes no longer remembered count as touching everything.
    for _ in 0..CHANGES_KEPT {
        st.changed(32 * MIB, 33 * MIB);
    }
    assert!(st.changed_since(epoch, 0, MIB), "the record lost its start");
}

#[test]
fn read_ahead_in_flight_survives_flushes_landing_elsewhere() {
    // A sequential reader while another part of the drive is written and flushed
    // all along (as ext4's journal commits while a file is read): read-ahead in
    // flight is kept, so every byte comes from the backend once.
    let size = 64 * MIB;
    let c = Arc::new(cache(4 * size, 256 * MIB));
    let data = stored(&c, size);
    c.backend.read_delay_us.store(2000, Relaxed);
    let workers = background(&c, 8);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, done) = (c.clone(), done.clone());
        std::thread::spawn(move || {
            let block = vec![9u8; BLOCK as usize];
            let mut i = 0u64;
            while !done.load(Relaxed) {
                c.write(3 * size + (i % 512) * BLOCK, &block).unwrap();
                c.flush().unwrap();
                i += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            i
        })
    };
    read_back_by_mib(&c, &data);
    done.store(true, Relaxed);
    let flushes = writer.join().unwrap();
    c.close();
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        flushes > 10,
        "only {flushes} flushes landed during the read"
    );
    assert_eq!(
        c.backend.bytes_read.load(Relaxed),
        size,
        "bytes fetched again after {flushes} unrelated flushes"
    );
}

#[test]
fn read_ahead_from_a_local_copy_lands_in_block_memory_once() {
    // A backend with a local copy of everything (a disk cache holding the drive):
    // read-ahead reads it straight into block memory, and every byte still comes
    // from the backend once, by one way or the other.
    let size = 64 * MIB;
    let c = Arc::new(cache(size, 256 * MIB));
    let data = stored(&c, size);
    c.backend.local.store(true, Relaxed);
    c.backend.read_delay_us.store(2000, Relaxed);
    read_back_with_read_ahead(&c, &data);
    let (local, fetched) = (
        c.backend.local_bytes.load(Relaxed),
        c.backend.bytes_read.load(Relaxed),
    );
    assert_eq!(
        local + fetched,
        size,
        "{local} read locally, {fetched} fetched"
    );
    assert!(local >= size / 2, "only {local} bytes read locally");
    // Cached as read: reading it all again asks the backend for nothing.
    read_back_by_mib(&c, &data);
    assert_eq!(c.backend.local_bytes.load(Relaxed), local);
    assert_eq!(c.backend.bytes_read.load(Relaxed), fetched);
}

#[test]
fn blocks_read_locally_fill_only_what_the_cache_lacks_and_keep_holes() {
    // Blocks read from a local copy into memory of their own: a whole block of
    // data the cache lacks is kept as read; a block the cache holds in part (a
    // written sector) gets only the sectors it lacks; a block that is half hole
    // reads as zeros there, whatever the copy held.
    let size = 4 * MIB;
    let c = cache(size, 64 * MIB);
    c.lock().sparse.insert(0, size);
    c.write(BLOCK + 3 * SECTOR, &[0xCD; SECTOR as usize])
        .unwrap();
    c.lock().sparse.remove(2 * BLOCK, 2 * BLOCK + BLOCK / 2);
    {
        let mut st = c.lock();
        let mems: Vec<BlockMem> = (0..4)
            .map(|_| {
                let mut m = st.take_mem();
                m.fill(0x11);
                m
            })
            .collect();
        c.insert_blocks(&mut st, 0, mems);
    }
    let mut want = vec![0x11u8; 4 * BLOCK as usize];
    want[(BLOCK + 3 * SECTOR) as usize..(BLOCK + 4 * SECTOR) as usize].fill(0xCD);
    want[2 * BLOCK as usize..(2 * BLOCK + BLOCK / 2) as usize].fill(0);
    let mut got = vec![0u8; want.len()];
    c.read(0, &mut got).unwrap();
    assert!(got == want, "bytes differ");
    assert_eq!(c.backend.reads.load(Relaxed), 0, "all of it was cached");
}

#[test]
fn a_read_that_fetches_itself_reads_a_local_copy_into_blocks_too() {
    // No read-ahead workers: every read fetches what it needs itself, and with a
    // local copy that is straight into block memory, with the written sector,
    // the hole and the rest as the other path gives them.
    let size = 8 * MIB;
    let c = cache(size, 64 * MIB);
    let mut want = stored(&c, size);
    let one = 2 * MIB + 5 * SECTOR;
    c.write(one, &[0xEE; SECTOR as usize]).unwrap();
    want[one as usize..(one + SECTOR) as usize].fill(0xEE);
    let hole = 3 * MIB + BLOCK;
    c.lock().sparse.remove(hole, hole + 2 * SECTOR);
    want[hole as usize..(hole + 2 * SECTOR) as usize].fill(0);
    c.backend.local.store(true, Relaxed);
    read_back_by_mib(&c, &want);
    assert_eq!(
        c.backend.bytes_read.load(Relaxed),
        0,
        "nothing fetched the usual way"
    );
    assert_eq!(c.backend.local_bytes.load(Relaxed), size);
    read_back_by_mib(&c, &want);
    assert_eq!(
        c.backend.local_bytes.load(Relaxed),
        size,
        "all of it cached"
    );
}

#[test]
fn a_write_of_partial_sectors_waits_for_a_flush_only_to_fetch_their_old_bytes() {
    let c = cache(4 * MIB, 64 * MIB);
    // Sectors at 0 and 1 MiB hold data on the blob, not in the cache.
    c.backend
        .write_runs(vec![(MIB, Bytes::from(vec![9u8; 4096]))])
        .unwrap();
    c.with_writeback_paused(|| c.lock().sparse.insert(MIB, MIB + 4096));
    let in_time = |offset: u64, len: usize| {
        // A flush under way holds the flush lock.
        let flush = c.order_lock();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                c.write(offset, &vec![1u8; len]).unwrap();
                tx.send(()).unwrap();
            });
            let done = rx.recv_timeout(Duration::from_secs(2)).is_ok();
            drop(flush);
            done
        })
    };
    // A hole's partial sectors need nothing fetched: the write goes in at once
    // (it waited for the flush, past an outage's I/O timeout a whole try).
    assert!(in_time(2 * MIB + 100, 1000), "a write to a hole waited");
    // Then they are cached: a write over them needs nothing either.
    assert!(
        in_time(2 * MIB + 300, 100),
        "a write to cached sectors waited"
    );
    // Old bytes on the blob are fetched under the flush lock.
    assert!(
        !in_time(MIB + 100, 1000),
        "a fetch did not wait for the flush"
    );
    let mut back = vec![0u8; 1200];
    c.read(MIB, &mut back).unwrap();
    assert!(back[..100].iter().all(|&b| b == 9) && back[100..1100].iter().all(|&b| b == 1));
    assert!(back[1100..].iter().all(|&b| b == 9));
}
