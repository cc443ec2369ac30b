//! Bringing a drive up in the worker, in order: the drive check and the lease,
//! the written ranges, the cache with its read-ahead and flush threads and the
//! lease keeper, FUSE (on the mount the root part made), then the loop device and
//! the filesystem, which the root part attaches and mounts on request.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fuser::{BackgroundSession, Config, SessionACL};
use tracing::{error, info, warn};

use super::encryption::{open_encryption, plain_ranges};
use super::handles::{AttachedLoop, FsMount};
use super::stats::{lease_state, stats_value, StatsValues};
use super::warm::Warmer;
use super::Mounted;
use std::path::Path;

use crate::azure::{BlobProperties, PageRange, SegmentPlan};
use crate::device::cache::{Cache, CacheConfig, READAHEAD_RUNS};
use crate::device::diskcache::files::{self, BlobState};
use crate::device::diskcache::DiskCache;
use crate::device::remote::RemoteBackend;
use crate::device::sparse::SparseMap;
use crate::device::stack::Stack;
use crate::drive::Drive;
use crate::fuse::{DiskFs, StatsFn};
use crate::mount::system::filesystem;
use crate::mount::{blank, superblock};
use crate::mount::{Mode, MountError};

/// How often the lease is renewed: a cheap probe that notices a broken or stolen
/// lease even while nothing is written.
const LEASE_CHECK: Duration = Duration::from_secs(10);
/// Read-ahead threads: as many ranged reads in flight as the widest read-ahead
/// window holds (sixteen runs of 16 MiB, or eight of 4 MiB with a disk cache).
const PREFETCH_WORKERS: usize = READAHEAD_RUNS;

/// How often the drive is read again and its lease asked for when the blob keeps
/// changing between the two (another party writing it just before it let go).
const LEASE_ROUNDS: usize = 3;

/// Reads the drive and takes its infinite lease, on the condition that the blob is
/// still as read (`If-Match` its ETag): the footer and size we go on with are the
/// ones under the lease.
///
/// The condition also disarms copies of our acquire that the service may still
/// carry out after we gave up on them (a request can land long after its
/// timeout). Unconditioned, one landing after a quick `unmount` released the lease
/// would take it again for a mount that no longer exists, and the next mount
/// would be refused "in use". With it, it is refused once the ETag has moved on,
/// which is made sure of at once when an attempt went unanswered (the sequence
/// number is raised; a mount that is refused or never writes would otherwise
/// leave the ETag as it was). Lease operations leave the ETag alone, so our own
/// retries of the acquire still match, and a blob nobody else touched changes
/// not at all.
fn open_and_lease(m: &mut Mounted) -> Result<Drive, MountError> {
    let id = uuid::Uuid::new_v4().to_string();
    let mut round = 0;
    // An encrypted drive's volume, opened in the first round and kept by the
    // next while its header is unchanged.
    let mut volume = None;
    loop {
        round += 1;
        let drive = m.rt.block_on(Drive::open(&m.blob))?;
        volume = open_encryption(m, &drive, volume)?;
        let etag = drive.props.etag.clone();
        // The same id each round: a round whose answer was lost may hold the
        // lease already, and asking again with its id keeps it.
        match m
            .rt
            .block_on(m.blob.acquire_lease_if_match(&id, None, etag.as_deref()))
        {
            Ok(got) => {
                m.lease = Some(got.id.clone());
                if got.earlier_attempt_unanswered {
                    // That attempt may still land, after this mount let go: move
                    // the ETag on now, so that it is refused whenever it comes,
                    // even if this mount never writes. (A write would move it
                    // too, but a mount may write nothing, or be refused.)
                    m.rt.block_on(m.blob.increment_sequence_number(Some(&got.id)))?;
                    info!(
                        "{}: an acquire that got no answer may still land; raised the sequence number so that it is refused",
                        m.target
                    );
                }
                return Ok(drive);
            }
            Err(e) if e.code() == Some("LeaseAlreadyPresent") => {
                return Err(MountError::system(format!(
                    "{} is in use: another mount holds its lease (on this or another host). Mount it --read-only, or if its host is dead run `blobdrive lease break {} --yes`",
                    m.target, m.target
                )))
            }
            Err(e) if e.is_changed_since_read() && round < LEASE_ROUNDS => {
                warn!(
                    "{} changed between reading it and taking its lease; reading it again",
                    m.target
                );
            }
            Err(e) if e.is_changed_since_read() => {
                // An earlier round may have taken it with its answer lost.
                let _ = m.rt.block_on(m.blob.release_lease(&id));
                return Err(MountError::system(format!(
                    "{} kept changing while it was being mounted ({LEASE_ROUNDS} tries): another party is writing it. Mount it --read-only, or try again once it is done",
                    m.target
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// glibc gives each thread that allocates its own arena; with FUSE, I/O and flush
/// threads all touching cache-sized buffers, freed memory would sit in many arenas
/// and the daemon's footprint would grow far past the cache size. Two arenas keep it
/// close to what is really in use.
pub(super) fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only adjusts allocator tuning; called before threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Reads the drive, taking its lease unless the mount is read-only.
fn open_drive(m: &mut Mounted) -> Result<Drive, MountError> {
    if m.req.read_only {
        let drive = m.rt.block_on(Drive::open(&m.blob))?;
        open_encryption(m, &drive, None)?;
        return Ok(drive);
    }
    let drive = open_and_lease(m)?;
    info!("acquired the lease on {}", m.target);
    Ok(drive)
}

/// The drive's written ranges: what reads of holes need not ask for.
fn written_ranges(m: &Mounted, size: u64) -> Result<Vec<PageRange>, MountError> {
    // A live blob mounted read-only may be written by its writer (on this or
    // another host) after the page map was learnt: a hole then would answer zeros
    // for data that exists. So no range of it counts as a hole. A snapshot never
    // changes, and a writable mount is the only writer: their maps hold.
    let live_reader = m.req.read_only && m.blob.snapshot().is_none();
    let ranges = if live_reader {
        info!(
            "{}: read-only mount of a live blob: every read the cache cannot answer asks the blob",
            m.target
        );
        vec![PageRange::new(0, size)]
    } else {
        m.rt.block_on(m.blob.page_ranges_segmented(size, SegmentPlan::default()))?
    };
    info!(
        "{}: {} bytes disk, {} written ranges",
        m.target,
        size,
        ranges.len()
    );
    Ok(ranges)
}

/// The cache over the blob (with the disk tier when asked), its read-ahead and
/// flush threads, and the lease keeper.
fn start_cache(m: &mut Mounted, drive: &Drive) -> Result<Arc<Cache<Stack>>, MountError> {
    let disk_size = drive.disk_size();
    let ranges = written_ranges(m, disk_size)?;
    // An encrypted drive serves its data segment, decrypted by the stack's
    // crypto layer; the passphrase is no longer needed.
    m.passphrase = None;
    let (size, ranges, crypt) = match m.encryption.as_mut() {
        Some(e) => {
            let size = e.served(disk_size);
            (
                size,
                plain_ranges(&ranges, e.data_offset, size),
                e.take_cipher(),
            )
        }
        None => (disk_size, ranges, None),
    };
    let remote = RemoteBackend::new(
        m.blob.clone(),
        m.lease.clone(),
        m.rt.handle().clone(),
        m.req.io.io_timeout,
    );
    let disk = match m.req.disk_cache.clone() {
        Some(dir) => Some(open_disk_cache(m, &dir, drive)?),
        None => None,
    };
    m.fenced = remote.fence();
    // The one place the layers below the memory cache are put together.
    let cache = Arc::new(Cache::new(
        Stack::new(remote, disk, crypt),
        size,
        SparseMap::from_ranges(&ranges),
        CacheConfig::with_capacity(m.req.cache_size),
        m.req.read_only,
        m.fenced.clone(),
    ));
    m.cache = Some(cache.clone());
    cache
        .start_prefetchers(PREFETCH_WORKERS)
        .map_err(|e| MountError::with_source("cannot start read-ahead", e))?;
    if !m.req.read_only {
        let c = cache.clone();
        m.flusher = Some(
            std::thread::Builder::new()
                .name("blobdrive-flush".into())
                .spawn(move || c.run_flusher())
                .map_err(|e| MountError::with_source("cannot start the flusher", e))?,
        );
        if let Some(id) = m.lease.clone() {
            spawn_lease_keeper(m, id);
        }
    }
    Ok(cache)
}

/// The FUSE filesystem over the cache: the files `disk` and `stats`; and with a
/// disk cache, its warm-ups, done by the filesystem's fetch workers.
fn disk_fs(m: &mut Mounted, cache: &Arc<Cache<Stack>>) -> DiskFs<Stack> {
    let svc = m.blob.service().clone();
    let stats_cache = cache.clone();
    let fenced = m.fenced.clone();
    let had_lease = m.lease.is_some();
    // The `stats` file is the filesystem's, which the warm-ups need first.
    let content: Arc<OnceLock<StatsValues>> = Arc::new(OnceLock::new());
    let said = content.clone();
    let stats: StatsFn = Arc::new(move || {
        let v = said.get().map(|values| values()).unwrap_or_default();
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
    });
    let fs = DiskFs::new(cache.clone(), stats, m.req.read_only, m.req.uid, m.req.gid)
        .refuse_discards(m.req.no_discard);
    m.warmer = cache.backend().disk_cache().is_some().then(|| {
        Arc::new(Warmer::new(
            cache.clone(),
            m.blob.clone(),
            m.rt.handle().clone(),
            fs.background_fetches(),
        ))
    });
    let warming = m.warmer.as_ref().map(|w| w.figures.clone());
    let values: StatsValues = Arc::new(move || {
        let lease = lease_state(had_lease, &fenced);
        stats_value(&svc, Some(&stats_cache), lease, warming.as_deref())
    });
    let _ = content.set(values.clone());
    m.stats = Some(values);
    m.open_disk = Some(fs.open_disk_handles());
    fs
}

/// Serves the cache on the FUSE mount the root part made, through its
/// `/dev/fuse` descriptor. The kernel lets root alone into
/// the mount (`user_id=0`, no `allow_other`), so fuser's own check, which would
/// let only the worker's user in, is off. One descriptor for every thread: a
/// clone of it (`clone_fd`) would open `/dev/fuse`, root's alone.
fn serve_fuse_fd(
    m: &mut Mounted,
    cache: &Arc<Cache<Stack>>,
    fuse: OwnedFd,
) -> Result<BackgroundSession, MountError> {
    let fs = disk_fs(m, cache);
    let mut config = Config::default();
    config.n_threads = Some(4);
    config.clone_fd = false;
    fuser::Session::from_fd(fs, fuse, SessionACL::All, config.clone())
        .and_then(|s| s.spawn())
        .map_err(|e| {
            MountError::with_source(format!("cannot serve FUSE at {}", m.fuse_dir.display()), e)
        })
}

/// Brings the drive up, one phase after another, on what the root part set up
/// before the worker existed (the record, the FUSE mount, the control socket);
/// each phase leaves its handle on `m` as soon as its effect is in place, so
/// that a failure at any point leaves `m.teardown()` exactly what to undo.
pub(super) fn setup(m: &mut Mounted, fuse: OwnedFd) -> Result<FsOutcome, MountError> {
    let drive = open_drive(m)?;
    let cache = start_cache(m, &drive)?;
    m.session = Some(serve_fuse_fd(m, &cache, fuse)?);
    let header_warning = m.encryption.as_ref().and_then(|e| e.warning.clone());
    let mut outcome = attach_and_mount(m)?;
    outcome.warnings.extend(header_warning);
    Ok(outcome)
}

/// The loop device (block and fs modes) and the filesystem (fs mode).
fn attach_and_mount(m: &mut Mounted) -> Result<FsOutcome, MountError> {
    if m.req.mode == Mode::Raw {
        return Ok(FsOutcome::default());
    }
    let block_size = m.encryption.as_ref().map_or(512, |e| e.sector_size);
    let dev = m.root.attach_loop(block_size)?;
    info!("the root part attached {dev}");
    m.loop_dev = Some(AttachedLoop {
        dev,
        autoclear: false,
    });
    if m.req.mode == Mode::Fs {
        return mount_filesystem(m);
    }
    Ok(FsOutcome::default())
}

/// What mounting the filesystem did besides mounting it.
#[derive(Default)]
pub(super) struct FsOutcome {
    pub warnings: Vec<String>,
    /// What was done that the user should hear of (a filesystem grown).
    pub notes: Vec<String>,
}

/// Has the root part mount the filesystem on the loop device at the user's
/// directory (making it first when asked and the device is blank, growing it
/// when it is smaller than its disk), the device set to detach itself when
/// that filesystem is unmounted (see `system::filesystem`).
fn mount_filesystem(m: &mut Mounted) -> Result<FsOutcome, MountError> {
    let zeroed = m.cache.as_ref().is_some_and(|c| !c.holds_data());
    let blank = match (&m.req.mkfs, m.req.read_only) {
        (Some(_), false) => zeroed && nothing_at_either_end(m)?,
        _ => zeroed,
    };
    let prepared = m.root.prepare_fs(blank)?;
    let small = small_fs(m, &prepared.fstype);
    let mounted = m.root.mount_fs(small)?;
    m.fs = Some(FsMount {
        fstype: prepared.fstype,
    });
    // From now on a plain `umount` of the filesystem detaches the loop device,
    // which the daemon takes as its cue to write back and stop (see
    // `Mounted::noticed_plain_umount`).
    m.loop_dev.as_mut().expect("attached").autoclear = mounted.autoclear;
    let mut warnings = prepared.warnings;
    warnings.extend(mounted.warnings);
    Ok(FsOutcome {
        warnings,
        notes: mounted.notes,
    })
}

/// For `--mkfs` on a drive whose page list says nothing is written: whether
/// its first and last MiB, read straight from the service (the cache believes
/// the list, and reads zeros), are zeros too; a refusal naming what they hold
/// if not. The root part formats only a drive found blank so (see
/// `system::filesystem::prepare`), and one listing alone no longer decides.
fn nothing_at_either_end(m: &Mounted) -> Result<bool, MountError> {
    let Some(cache) = m.cache.as_ref() else {
        return Ok(false);
    };
    let size = cache.size();
    // An encrypted drive's disk starts past its LUKS header: its first and
    // last MiB are read as they lie on the blob, ciphertext, which is zeros
    // only where nothing was ever written (decrypted, zeros read as noise).
    let at = cache.backend().data_offset();
    let len = blank::PROBED.min(size);
    let tail_at = size - len;
    let read = |from| m.rt.block_on(m.blob.read(at + from, len));
    let (head, tail) = (read(0)?, read(tail_at)?);
    match blank::what_it_holds(&head, &tail, tail_at) {
        None => Ok(true),
        Some(what) => Err(MountError::system(format!(
            "refusing --mkfs on {}: {what}, read from the storage service, though its page list says nothing is written to it; nothing was formatted",
            m.target
        ))),
    }
}

/// The filesystem `fstype` when its superblock, read through the cache before
/// it is mounted, says it is smaller than its disk (the drive was grown while
/// it was not mounted, which leaves the filesystem as it was).
fn small_fs(m: &Mounted, fstype: &str) -> Option<filesystem::Small> {
    let cache = m.cache.as_ref()?;
    let mut head = vec![0u8; superblock::HEAD_BYTES.min(cache.size() as usize)];
    cache.read(0, &mut head).ok()?;
    let found = superblock::detect(&head).filter(|f| f.fstype == fstype)?;
    let disk = cache.size();
    superblock::worth_growing(found.fstype, found.bytes, disk).then_some(filesystem::Small {
        bytes: found.bytes,
        disk,
    })
}

/// Opens the drive's disk cache in `dir` (its directory there opened by the root
/// part). The blob's state it is checked against
/// is read now, once this mount alone can write the blob (the properties read
/// before the lease was taken could be older than another writer's last write).
fn open_disk_cache(
    m: &mut Mounted,
    dir: &Path,
    drive: &Drive,
) -> Result<Arc<DiskCache>, MountError> {
    let props = if m.lease.is_some() {
        m.rt.block_on(m.blob.properties())?
    } else {
        drive.props.clone()
    };
    let state = blob_state(&props).ok_or_else(|| {
        MountError::system(format!(
            "--disk-cache: the storage service sent no ETag for {}, so a cache could never be proven current",
            m.target
        ))
    })?;
    let name = crate::mount::disk_cache_name(
        m.blob.service().account(),
        m.blob.container_name(),
        m.blob.name(),
        m.blob.snapshot(),
    );
    // The root part opened the drive's directory, and gave it to the worker.
    let given = m
        .disk_cache_dir
        .take()
        .ok_or_else(|| MountError::system("the root part opened no disk cache directory"))?;
    let limit = match m.req.disk_cache_size {
        Some(l) => l,
        None => {
            // The cache's own data file counts as free: it is this drive's
            // to reuse. (Without it the default went 34, 17, 26, 21 MiB over
            // four mounts on a small filesystem, starting cold twice.)
            let own = files::data_bytes_in(&given);
            let free = files::free_space_of(&given).map_or(u64::MAX, |f| f.saturating_add(own));
            default_disk_cache_limit(drive.disk_size(), free)
        }
    };
    // A live blob mounted read-only may be changed by its writer after this
    // mount read its state: see `DiskCache::open`.
    let may_start_warm = !m.req.read_only || m.blob.snapshot().is_some();
    let tier = DiskCache::open_in(given, dir.join(&name), limit, &state, may_start_warm)
        .map_err(MountError::system)?;
    m.disk_state = Some(state);
    Ok(Arc::new(tier))
}

/// The disk cache's size when none is asked for: half the free space of its
/// filesystem (counting its own file as free), at most the drive's size, at
/// least the smallest there is.
fn default_disk_cache_limit(disk_size: u64, free: u64) -> u64 {
    disk_size
        .min(free / 2)
        .max(crate::device::diskcache::MIN_SIZE)
}

/// What a disk cache is checked against: `None` without an ETag.
pub(super) fn blob_state(props: &BlobProperties) -> Option<BlobState> {
    Some(BlobState {
        etag: props.etag.clone()?,
        content_length: props.content_length,
        sequence_number: props.sequence_number.unwrap_or(0),
    })
}

/// Renews the lease every [`LEASE_CHECK`]: any lease error means another party
/// broke or took it, and the drive is fenced at once.
fn spawn_lease_keeper(m: &Mounted, id: String) {
    let blob = m.blob.clone();
    let fenced = m.fenced.clone();
    let target = m.target.clone();
    m.rt.spawn(async move {
        loop {
            tokio::time::sleep(LEASE_CHECK).await;
            if fenced.is_lost() {
                return;
            }
            let renewed = blob.renew_lease(&id).await;
            if renewed.is_err() {
                let failures = &blob.service().counters().lease_renewal_failures;
                failures.fetch_add(1, Ordering::Relaxed);
            }
            match renewed {
                Ok(()) => {}
                Err(e) if matches!(e.status(), Some(409 | 412)) => {
                    if fenced.lose() {
                        error!("LEASE LOST on {target}: {e}; every further write fails, reads continue");
                    }
                    return;
                }
                Err(e) => warn!("lease check on {target} failed (will retry): {e}"),
            }
        }
    });
}
