//! The backend's ceiling, measured with blobdrive's own client and no FUSE: what the
//! storage endpoint can carry, so every mount figure has its reference in the same
//! run. Prints one JSON object.
//!
//! usage: backend_ceiling CONNECTION_STRING CONTAINER MIB SECONDS_FOR_SMALL_WRITES [BLOB]
//!
//! Large writes are 4 MiB Put Page calls (the most one may carry), 8 in flight;
//! large reads are ranged GETs of the daemon's read-ahead runs (`MAX_GET`,
//! 16 MiB), as many in flight as its read-ahead window holds (8): the ceiling is
//! what the same requests the daemon sends can get. (With 4 in flight the reads
//! ran the same within the noise: 1249-1451 against 1199-1413 MiB/s on fresh
//! emulators.)
//!
//! With 0 seconds only the large writes and reads run: the sequential ceiling
//! measured beside a job, on the emulator as the job finds it. With BLOB (in the
//! same container) the ranged reads also read the first MIB of that blob's written
//! ranges the same way (`blob_get_mib_s`): the emulator's cost per read grows with
//! a blob's history, so a drive's own blob is the fair reference for reading it
//! back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blobdrive::azure::{Account, BlobService};
use bytes::Bytes;
use tokio::sync::Semaphore;

const CHUNK: u64 = 4 * 1024 * 1024;
const PARALLEL: usize = 8;
/// Large reads: the daemon's read-ahead runs, and as many as its window holds.
const GET_CHUNK: u64 = blobdrive::device::MAX_GET;
const GET_PARALLEL: usize = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !(5..=6).contains(&args.len()) {
        eprintln!("usage: backend_ceiling CONNECTION_STRING CONTAINER MIB SECONDS [BLOB]");
        std::process::exit(2);
    }
    let svc =
        BlobService::new(Account::from_connection_string(&args[1]).expect("connection string"));
    let container = svc.container(&args[2]);
    container.create().await.expect("container");
    let mib: u64 = args[3].parse().expect("MIB");
    let secs: f64 = args[4].parse().expect("SECONDS");
    let bytes = mib * 1024 * 1024;
    let blob = svc.blob(
        &args[2],
        &format!("ceiling-{}.bin", uuid::Uuid::new_v4().simple()),
    );
    blob.create_page_blob(bytes).await.expect("create");
    let data = Bytes::from(
        (0..CHUNK as usize)
            .map(|i| (i * 31 % 251) as u8)
            .collect::<Vec<u8>>(),
    );

    // Large parallel writes.
    let sem = Arc::new(Semaphore::new(PARALLEL));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for off in (0..bytes).step_by(CHUNK as usize) {
        let (b, d, p) = (
            blob.clone(),
            data.clone(),
            sem.clone().acquire_owned().await.unwrap(),
        );
        tasks.spawn(async move {
            b.put_pages(off, d, None).await.expect("put");
            drop(p);
        });
    }
    while tasks.join_next().await.is_some() {}
    let write_s = started.elapsed().as_secs_f64();

    // Large parallel ranged reads.
    let get_sem = Arc::new(Semaphore::new(GET_PARALLEL));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for off in (0..bytes).step_by(GET_CHUNK as usize) {
        let len = GET_CHUNK.min(bytes - off);
        let (b, p) = (blob.clone(), get_sem.clone().acquire_owned().await.unwrap());
        tasks.spawn(async move {
            b.read(off, len).await.expect("read");
            drop(p);
        });
    }
    while tasks.join_next().await.is_some() {}
    let read_s = started.elapsed().as_secs_f64();

    let existing = match args.get(5) {
        Some(name) => Some(read_written(&svc.blob(&args[2], name), bytes, &get_sem).await),
        None => None,
    };
    let small = if secs > 0.0 {
        Some(small_and_random(&blob, bytes, secs).await)
    } else {
        None
    };
    let _ = blob
        .delete(blobdrive::azure::DeleteSnapshots::None, None)
        .await;
    let mib_f = mib as f64;
    let mut out = serde_json::json!({
        "crc64_cpu_s_per_gib": crc64_cpu_s_per_gib(&data),
        "put_mib_s": mib_f / write_s,
        "put_requests_s": bytes.div_ceil(CHUNK) as f64 / write_s,
        "get_mib_s": mib_f / read_s,
        "get_requests_s": bytes.div_ceil(GET_CHUNK) as f64 / read_s,
        "get_bytes_per_request": GET_CHUNK.min(bytes),
        "bytes": bytes,
    });
    if let (Some(small), Some(out)) = (small, out.as_object_mut()) {
        out.extend(small.as_object().cloned().unwrap_or_default());
    }
    if let (Some(mib_s), Some(out)) = (existing, out.as_object_mut()) {
        out.insert("blob_get_mib_s".into(), mib_s.into());
    }
    println!("{out}");
}

/// The CPU time Azure's CRC64 takes over a GiB, in 4 MiB pieces from memory
/// as Put Page bodies are: what checking every write and small read end to end
/// costs (this thread's CPU time, so other load does not count).
fn crc64_cpu_s_per_gib(piece: &[u8]) -> f64 {
    let cpu = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec for the call to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
    };
    let rounds = (1u64 << 30) / piece.len() as u64;
    let started = cpu();
    let mut all = 0u64;
    for _ in 0..rounds {
        all ^= std::hint::black_box(blobdrive::azure::crc64::of(std::hint::black_box(piece)));
    }
    std::hint::black_box(all);
    cpu() - started
}

/// Reads up to `bytes` of `blob`'s written ranges in pieces of at most
/// `GET_CHUNK`, as many in flight as `sem` allows: MiB/s.
async fn read_written(
    blob: &blobdrive::azure::BlobClient,
    bytes: u64,
    sem: &Arc<Semaphore>,
) -> f64 {
    let ranges = blob.page_ranges(None).await.expect("page ranges");
    let mut pieces = Vec::new();
    let mut total = 0;
    'ranges: for r in ranges {
        let mut at = r.start;
        while at < r.end {
            let len = GET_CHUNK.min(r.end - at).min(bytes - total);
            pieces.push((at, len));
            at += len;
            total += len;
            if total == bytes {
                break 'ranges;
            }
        }
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (off, len) in pieces {
        let (b, p) = (blob.clone(), sem.clone().acquire_owned().await.unwrap());
        tasks.spawn(async move {
            b.read(off, len).await.expect("read");
            drop(p);
        });
    }
    while tasks.join_next().await.is_some() {}
    total as f64 / 1048576.0 / started.elapsed().as_secs_f64()
}

/// Small Put Page calls and random ranged reads, each for `secs` seconds.
async fn small_and_random(
    blob: &blobdrive::azure::BlobClient,
    bytes: u64,
    secs: f64,
) -> serde_json::Value {
    // Small (4 KiB) Put Page calls, as many as PARALLEL workers manage in `secs`.
    let small = Bytes::from(vec![7u8; 4096]);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..PARALLEL as u64 {
        let (b, d) = (blob.clone(), small.clone());
        tasks.spawn(async move {
            let mut n = 0u64;
            let mut off = w * 4096;
            while Instant::now() < deadline {
                b.put_pages(off % bytes, d.clone(), None)
                    .await
                    .expect("small put");
                off += PARALLEL as u64 * 4096 * 7;
                n += 1;
            }
            n
        });
    }
    let mut small_calls = 0;
    while let Some(n) = tasks.join_next().await {
        small_calls += n.unwrap();
    }
    let small_s = started.elapsed().as_secs_f64();

    // Random ranged reads of 4 KiB (what an ideal client sends for a 4 KiB miss)
    // and 64 KiB (what the cache fetches for one), at 1 and 32 in flight.
    let rr1 = random_reads(blob, bytes, 4096, 1, secs).await;
    let rr32 = random_reads(blob, bytes, 4096, 32, secs).await;
    let rb32 = random_reads(blob, bytes, 65536, 32, secs).await;
    serde_json::json!({
        "small_put_requests_s": small_calls as f64 / small_s,
        "rand_read_4k_qd1_s": rr1,
        "rand_read_4k_qd32_s": rr32,
        "rand_read_64k_qd32_s": rb32,
    })
}

/// Ranged reads of `len` bytes at random aligned offsets, `inflight` at a time for
/// `secs` seconds: reads per second.
async fn random_reads(
    blob: &blobdrive::azure::BlobClient,
    bytes: u64,
    len: u64,
    inflight: usize,
    secs: f64,
) -> f64 {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..inflight as u64 {
        let b = blob.clone();
        tasks.spawn(async move {
            let mut n = 0u64;
            let mut x = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            while Instant::now() < deadline {
                // xorshift: a cheap, seedable spread of offsets.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = x % (bytes / len) * len;
                b.read(off, len).await.expect("read");
                n += 1;
            }
            n
        });
    }
    let mut n = 0;
    while let Some(k) = tasks.join_next().await {
        n += k.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}
