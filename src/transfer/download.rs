//! Downloading a drive or snapshot into a sparse local file, in full or as an
//! in-place update of an older snapshot's copy.
//!
//! A full download writes to `FILE.part` and renames it only when every byte is in
//! place, so a half-done download is never mistaken for an image. An incremental
//! one must learn what changed: the service's `prevsnapshot` diff where it is proven
//! to work, else a comparison of both snapshots' page lists that re-fetches all data
//! (slower, never wrong).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tracing::info;

use super::progress::Progress;
use super::{file_err, Report, TransferError, CHUNK, PARALLEL};
use crate::azure::{ranges, BlobClient, PageRange, SegmentPlan};
use crate::drive::Drive;
use crate::vhd::FOOTER_SIZE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Disk bytes followed by the VHD footer (what Azure and qemu-img read).
    Vhd,
    /// Disk bytes only.
    Raw,
}

impl Format {
    /// Length of a local image of a `disk`-byte drive in this format.
    fn file_len(self, disk: u64) -> u64 {
        match self {
            Format::Vhd => disk + FOOTER_SIZE,
            Format::Raw => disk,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Vhd => "vhd",
            Format::Raw => "raw",
        }
    }
}

/// Last steps of every download: the footer (VHD format) and an fsync.
async fn finish(
    blob: &BlobClient,
    file: &File,
    path: &Path,
    size: u64,
    format: Format,
) -> Result<(), TransferError> {
    if format == Format::Vhd {
        let footer = blob.read(size, FOOTER_SIZE).await?;
        file.write_all_at(&footer, size).map_err(file_err(path))?;
    }
    file.sync_all().map_err(file_err(path))
}

/// The report of a download that started at `started` with counters `before`.
fn report(
    blob: &BlobClient,
    before: crate::azure::StatsSnapshot,
    size: u64,
    started: Instant,
    method: Option<String>,
) -> Report {
    let after = blob.service().stats();
    Report {
        image_bytes: size,
        bytes_transferred: after.bytes_downloaded - before.bytes_downloaded,
        requests: after.get_requests - before.get_requests,
        skipped_bytes: 0,
        seconds: started.elapsed().as_secs_f64(),
        method,
        already_complete: false,
    }
}

/// What an incremental update must do to an old copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Ranges to fetch from the newer image.
    pub fetch: Vec<PageRange>,
    /// Ranges to turn into holes (zeros) locally.
    pub zero: Vec<PageRange>,
    /// "diff" (the service's prevsnapshot diff) or "full-compare".
    pub method: &'static str,
}

/// Works out how to turn a copy of `old` (a snapshot of `new`'s blob) into `new`
/// (a later snapshot, or the base blob), for the first `size` bytes.
///
/// The service diff is used only after it passed a check it cannot pass by
/// accident: the diff of the old snapshot against itself must be empty while that
/// snapshot holds data. A service that ignores `prevsnapshot` (Azurite) answers
/// with the full page list instead and fails the check.
pub async fn plan_incremental(
    new: &BlobClient,
    old: &BlobClient,
    size: u64,
) -> Result<Plan, TransferError> {
    let old_id = old
        .snapshot()
        .ok_or_else(|| TransferError::Refused("--since needs a snapshot".into()))?
        .to_string();
    let old_ranges = old
        .page_ranges_segmented(size, SegmentPlan::default())
        .await?;
    let whole = Some(PageRange::new(0, size));
    let diff_works = if old_ranges.is_empty() {
        false
    } else {
        match old.page_ranges_diff(&old_id, whole).await {
            Ok(self_diff) => self_diff.changed.is_empty() && self_diff.cleared.is_empty(),
            Err(_) => false,
        }
    };
    if diff_works {
        if let Ok(diff) = new.page_ranges_diff(&old_id, whole).await {
            return Ok(Plan {
                fetch: diff.changed,
                zero: diff.cleared,
                method: "diff",
            });
        }
    }
    info!("the service's snapshot diff is unavailable or unproven; comparing page lists");
    let new_ranges = new
        .page_ranges_segmented(size, SegmentPlan::default())
        .await?;
    Ok(Plan {
        zero: subtract(&old_ranges, &new_ranges),
        fetch: new_ranges,
        method: "full-compare",
    })
}

/// Parts of `a` not covered by `b` (both merged and sorted).
pub fn subtract(a: &[PageRange], b: &[PageRange]) -> Vec<PageRange> {
    let mut out = Vec::new();
    for r in a {
        let mut start = r.start;
        for c in b.iter().filter(|c| c.end > r.start && c.start < r.end) {
            if c.start > start {
                out.push(PageRange::new(start, c.start));
            }
            start = start.max(c.end);
        }
        if start < r.end {
            out.push(PageRange::new(start, r.end));
        }
    }
    ranges::merge(out)
}

fn default_part(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    path.with_file_name(name)
}

/// Fetches `fetch` from `blob` into `file` in parallel chunks.
async fn fetch_into(
    blob: &BlobClient,
    file: &Arc<File>,
    path: &Path,
    fetch: &[PageRange],
    quiet: bool,
) -> Result<(), TransferError> {
    let total = ranges::total(fetch);
    let progress = Arc::new(Progress::new("download", total, quiet));
    let sem = Arc::new(Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    for r in fetch {
        let mut pos = r.start;
        while pos < r.end {
            let len = (r.end - pos).min(CHUNK);
            let permit = sem.clone().acquire_owned().await.expect("open semaphore");
            let (blob, file, progress) = (blob.clone(), file.clone(), progress.clone());
            let path = path.to_path_buf();
            tasks.spawn(async move {
                let data = blob.read(pos, len).await?;
                let f = file.clone();
                tokio::task::spawn_blocking(move || f.write_all_at(&data, pos))
                    .await
                    .expect("write task")
                    .map_err(file_err(&path))?;
                progress.add(len);
                drop(permit);
                Ok::<(), TransferError>(())
            });
            while let Some(done) = tasks.try_join_next() {
                done.expect("download task")?;
            }
            pos += len;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("download task")?;
    }
    progress.finish();
    Ok(())
}

/// Downloads `blob` (a drive or snapshot) to a new file at `path`.
pub async fn download(
    blob: &BlobClient,
    path: &Path,
    format: Format,
    quiet: bool,
) -> Result<Report, TransferError> {
    let started = Instant::now();
    if path.exists() {
        return Err(TransferError::Refused(format!(
            "{} already exists; remove it first (or use --since to update an older copy in place)",
            path.display()
        )));
    }
    let drive = Drive::open(blob).await?;
    let size = drive.disk_size();
    let fetch = blob
        .page_ranges_segmented(size, SegmentPlan::default())
        .await?;
    let part = default_part(path);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&part)
        .map_err(file_err(&part))?;
    let file = Arc::new(file);
    let before = blob.service().stats();
    let result = async {
        file.set_len(format.file_len(size))
            .map_err(file_err(&part))?;
        fetch_into(blob, &file, &part, &fetch, quiet).await?;
        finish(blob, &file, &part, size, format).await
    }
    .await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, path).map_err(file_err(path))?;
    Ok(report(blob, before, size, started, None))
}

/// Updates `path`, a local copy of `old`, in place to `new`.
pub async fn download_since(
    new: &BlobClient,
    old: &BlobClient,
    path: &Path,
    format: Format,
    quiet: bool,
) -> Result<Report, TransferError> {
    let started = Instant::now();
    let drive = Drive::open(new).await?;
    let old_drive = Drive::open(old).await?;
    let size = drive.disk_size();
    if old_drive.disk_size() != size {
        return Err(TransferError::Refused(format!(
            "{} and {} differ in size; download in full instead",
            old.target(),
            new.target()
        )));
    }
    let expected = format.file_len(size);
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(file_err(path))?;
    let have = file.metadata().map_err(file_err(path))?.len();
    if have != expected {
        return Err(TransferError::Refused(format!(
            "{} is {have} bytes, but a {} copy of {} is {expected}: is it the right file and --format?",
            path.display(),
            format.name(),
            old.target()
        )));
    }
    let plan = plan_incremental(new, old, size).await?;
    let before = new.service().stats();
    let file = Arc::new(file);
    let result = async {
        for z in &plan.zero {
            punch_hole(&file, z.start, z.len()).map_err(file_err(path))?;
        }
        fetch_into(new, &file, path, &plan.fetch, quiet).await?;
        finish(new, &file, path, size, format).await
    }
    .await;
    if let Err(e) = result {
        return Err(TransferError::Refused(format!(
            "{e}; {} is now partly updated: run the same command again, or download in full",
            path.display()
        )));
    }
    Ok(report(
        new,
        before,
        size,
        started,
        Some(plan.method.to_string()),
    ))
}

/// Makes `[offset, offset+len)` of a file a hole (zeros, no space), keeping its size.
fn punch_hole(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a valid descriptor has no memory effects.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as i64,
            len as i64,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // A filesystem without hole punching still gets the zeros.
    let zeros = vec![0u8; CHUNK as usize];
    let mut pos = offset;
    while pos < offset + len {
        let n = (offset + len - pos).min(CHUNK) as usize;
        f.write_all_at(&zeros[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtract_ranges() {
        let r = PageRange::new;
        assert_eq!(
            subtract(&[r(0, 100), r(200, 300)], &[r(50, 60), r(250, 400)]),
            vec![r(0, 50), r(60, 100), r(200, 250)]
        );
        assert_eq!(subtract(&[r(0, 100)], &[]), vec![r(0, 100)]);
        assert!(subtract(&[r(0, 100)], &[r(0, 100)]).is_empty());
    }
}
