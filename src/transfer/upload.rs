//! Uploading a raw image or a fixed VHD as a new drive.
//!
//! The blob is created first, data goes up in parallel runs that skip zero pages and
//! file holes, and the VHD footer is written last: a blob without a valid footer is
//! visibly not a finished drive, which is also what `--resume` relies on. The source
//! is fingerprinted into the blob's metadata so a resume from a changed file is
//! refused instead of producing a chimera.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::progress::Progress;
use super::{file_err, Report, TransferError, CHUNK, PARALLEL};
use crate::azure::{BlobClient, DeleteSnapshots, PageRange, SegmentPlan, WriteFence, PAGE};
use crate::vhd::{DiskType, Footer, FOOTER_SIZE, MAX_DISK_BYTES, MIB};

/// Metadata name holding the source fingerprint while an upload is unfinished.
const FINGERPRINT_META: &str = "blobdriveupload";
/// Metadata name holding the source fingerprint once the upload finished, so that a
/// `--resume` repeated after the end can tell "already complete" from "another blob".
const FINISHED_META: &str = "blobdriveuploaded";
/// Zero gaps shorter than this inside data are sent rather than split around:
/// a few KiB of zeros cost less than another request.
const MIN_GAP: u64 = 64 * 1024;

/// What the source file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Bytes of disk data in the file (from offset 0).
    pub data_len: u64,
    /// The drive's disk size: `data_len` rounded up to a whole MiB.
    pub disk_size: u64,
    /// The footer to write: the file's own when it fits, else a new one.
    pub footer: [u8; 512],
    pub kind: &'static str,
}

/// Recognises a fixed VHD (footer at the end), refuses dynamic and differencing
/// ones by name, and treats anything else as a raw image.
pub fn inspect(path: &Path) -> Result<Source, TransferError> {
    let f = File::open(path).map_err(file_err(path))?;
    let len = f.metadata().map_err(file_err(path))?.len();
    if len == 0 {
        return Err(TransferError::Refused(format!(
            "{} is empty",
            path.display()
        )));
    }
    let mut head = [0u8; 512];
    let mut tail = [0u8; 512];
    if len >= 512 {
        f.read_exact_at(&mut head, 0).map_err(file_err(path))?;
        f.read_exact_at(&mut tail, len - 512)
            .map_err(file_err(path))?;
    }
    for (bytes, at_start) in [(&tail, false), (&head, true)] {
        if &bytes[..8] != b"conectix" {
            continue;
        }
        let footer = Footer::parse(bytes)
            .map_err(|e| TransferError::Refused(format!("{}: {e}", path.display())))?;
        if footer.disk_type != DiskType::Fixed {
            return Err(TransferError::Refused(format!(
                "{} is a {} VHD: blobdrive uploads fixed VHDs and raw images; convert it with `qemu-img convert -f vpc -O vpc -o subformat=fixed,force_size=on {} fixed.vhd`",
                path.display(),
                footer.disk_type,
                path.display()
            )));
        }
        if at_start {
            // A fixed VHD has its footer only at the end; a copy at the start alone
            // is not one we understand.
            continue;
        }
        if footer.current_size + FOOTER_SIZE != len {
            return Err(TransferError::Refused(format!(
                "{}: VHD footer says {} bytes of disk but the file holds {} (expected size + 512)",
                path.display(),
                footer.current_size,
                len
            )));
        }
        let disk_size = footer.current_size.div_ceil(MIB) * MIB;
        check_size(path, disk_size)?;
        let footer_bytes = if disk_size == footer.current_size {
            *bytes
        } else {
            Footer::new_fixed(disk_size)
                .map_err(|e| TransferError::Refused(e.to_string()))?
                .to_bytes()
        };
        return Ok(Source {
            data_len: footer.current_size,
            disk_size,
            footer: footer_bytes,
            kind: "fixed VHD",
        });
    }
    let disk_size = len.div_ceil(MIB) * MIB;
    check_size(path, disk_size)?;
    Ok(Source {
        data_len: len,
        disk_size,
        footer: Footer::new_fixed(disk_size)
            .map_err(|e| TransferError::Refused(e.to_string()))?
            .to_bytes(),
        kind: "raw image",
    })
}

fn check_size(path: &Path, disk: u64) -> Result<(), TransferError> {
    if disk > MAX_DISK_BYTES {
        return Err(TransferError::Refused(format!(
            "{} is larger than the largest page blob drive (8 TiB - 1 MiB)",
            path.display()
        )));
    }
    Ok(())
}

/// A fingerprint of the source: size, modification time and content samples.
fn fingerprint(path: &Path, f: &File) -> Result<String, TransferError> {
    let meta = f.metadata().map_err(file_err(path))?;
    let mut h = Sha256::new();
    h.update(meta.len().to_le_bytes());
    h.update(meta.mtime().to_le_bytes());
    h.update(meta.mtime_nsec().to_le_bytes());
    let sample = (meta.len()).min(MIB) as usize;
    let mut buf = vec![0u8; sample];
    f.read_exact_at(&mut buf, 0).map_err(file_err(path))?;
    h.update(&buf);
    f.read_exact_at(&mut buf, meta.len() - sample as u64)
        .map_err(file_err(path))?;
    h.update(&buf);
    Ok(h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Data extents of a file per SEEK_DATA/SEEK_HOLE (the whole range where the
/// filesystem cannot tell).
fn data_extents(f: &File, len: u64) -> Vec<(u64, u64)> {
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < len {
        // SAFETY: lseek on a valid descriptor has no memory effects.
        let start = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if start < 0 {
            let e = std::io::Error::last_os_error().raw_os_error();
            if e == Some(libc::ENXIO) {
                break; // no more data
            }
            return vec![(0, len)];
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
        let end = if end < 0 { len as i64 } else { end };
        out.push((start as u64, (end as u64).min(len)));
        pos = end;
    }
    out
}

/// Splits a buffer at `offset` into runs of non-zero pages (small zero gaps kept).
fn nonzero_runs(offset: u64, buf: &[u8]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (i, page) in buf.chunks(PAGE as usize).enumerate() {
        if page.iter().all(|&b| b == 0) {
            continue;
        }
        let s = offset + i as u64 * PAGE;
        let e = s + PAGE;
        match runs.last_mut() {
            Some(last) if s - last.1 < MIN_GAP && e - last.0 <= CHUNK => last.1 = e,
            _ => runs.push((s, e)),
        }
    }
    runs
}

pub struct UploadOptions {
    pub resume: bool,
    pub overwrite: bool,
    pub quiet: bool,
}

/// Uploads `path` to `blob`.
pub async fn upload(
    path: &Path,
    blob: &BlobClient,
    opts: &UploadOptions,
) -> Result<Report, TransferError> {
    let started = Instant::now();
    let src = inspect(path)?;
    let f = Arc::new(File::open(path).map_err(file_err(path))?);
    let fp = fingerprint(path, &f)?;
    let stats_before = blob.service().stats();
    let present = match prepare_blob(path, blob, opts, &src, &fp).await? {
        Prepared::Send { present } => present,
        Prepared::Finished => return already_complete(path, blob, &src, &f, started).await,
    };
    // Every Put Page carries the page blob's sequence number (see `WriteFence`): an
    // attempt given up on that lands late, after the drive was mounted and
    // written, is refused instead of putting the image's bytes back over newer
    // ones.
    let fence = WriteFence::new(blob.clone(), None);
    let skipped = send_data(path, blob, &f, &src, &present, &fence, opts.quiet).await?;
    // The footer last: only now is the blob a drive.
    blob.put_pages_fenced(
        src.disk_size,
        Bytes::copy_from_slice(&src.footer),
        None,
        &fence,
    )
    .await?;
    blob.set_metadata(&[(FINISHED_META, &fp)], None).await?;
    // Verify what is cheap: length and footer as a drive would read them.
    let drive = crate::drive::Drive::open(blob).await?;
    if drive.disk_size() != src.disk_size {
        return Err(TransferError::Refused(format!(
            "verification failed: {} reads as {} bytes, expected {}",
            blob.target(),
            drive.disk_size(),
            src.disk_size
        )));
    }
    let after = blob.service().stats();
    Ok(Report {
        image_bytes: src.disk_size,
        bytes_transferred: after.bytes_uploaded - stats_before.bytes_uploaded,
        requests: after.put_page_requests - stats_before.put_page_requests,
        skipped_bytes: skipped,
        seconds: started.elapsed().as_secs_f64(),
        method: None,
        already_complete: false,
    })
}

/// What is to be done after the blob was looked at.
enum Prepared {
    /// Send the file's data, skipping what `present` already holds (resume).
    Send { present: Vec<PageRange> },
    /// `--resume` of an upload that already finished from this same file.
    Finished,
}

/// Gets the blob ready for the upload as the options say: created, replaced
/// (`--overwrite`), or checked to be this file's unfinished or finished upload
/// (`--resume`); refused when it is in use or would be replaced unasked.
async fn prepare_blob(
    path: &Path,
    blob: &BlobClient,
    opts: &UploadOptions,
    src: &Source,
    fp: &str,
) -> Result<Prepared, TransferError> {
    let blob_len = src.disk_size + FOOTER_SIZE;
    let p = match blob.properties().await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => {
            create(blob, blob_len, fp).await?;
            return Ok(Prepared::Send { present: vec![] });
        }
        Err(e) => return Err(e.into()),
    };
    if p.lease_state.as_deref() == Some("leased") {
        return Err(TransferError::Refused(format!(
            "{} is in use (leased, mounted?); nothing was changed",
            blob.target()
        )));
    }
    let meta = |name: &str| {
        p.metadata
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let ours = meta(FINGERPRINT_META);
    let finished = meta(FINISHED_META);
    if opts.resume && ours.is_none() && finished.is_some() {
        if finished.as_deref() != Some(fp) || p.content_length != blob_len {
            return Err(TransferError::Refused(format!(
                "cannot resume: the finished upload to {} was of another file, or {} changed since; use --overwrite to replace it",
                blob.target(),
                path.display()
            )));
        }
        Ok(Prepared::Finished)
    } else if opts.resume && ours.is_some() {
        if ours.as_deref() != Some(fp) || p.content_length != blob_len {
            return Err(TransferError::Refused(format!(
                "cannot resume: {} changed since the interrupted upload to {} (or that upload was of another file); start over with --overwrite",
                path.display(),
                blob.target()
            )));
        }
        let present = blob
            .page_ranges_segmented(src.disk_size, SegmentPlan::default())
            .await?;
        Ok(Prepared::Send { present })
    } else if opts.resume {
        Err(TransferError::Refused(format!(
            "cannot resume: {} is not an unfinished upload by blobdrive (a finished drive, or another blob); use --overwrite to replace it",
            blob.target()
        )))
    } else if opts.overwrite {
        blob.delete(DeleteSnapshots::None, None).await.map_err(|e| {
            if e.code() == Some("SnapshotsPresent") {
                TransferError::Refused(format!(
                    "{} has snapshots; --overwrite does not delete them: run `blobdrive delete {} --snapshots --yes` first",
                    blob.target(),
                    blob.target()
                ))
            } else {
                e.into()
            }
        })?;
        create(blob, blob_len, fp).await?;
        Ok(Prepared::Send { present: vec![] })
    } else {
        Err(TransferError::Refused(format!(
            "{} already exists; add --overwrite to replace it (or --resume to continue an interrupted upload)",
            blob.target()
        )))
    }
}

/// Sends the file's data: its data extents, zero pages dropped, runs already
/// `present` (resume) skipped, [`PARALLEL`] Put Page calls at a time. Returns
/// the bytes skipped.
async fn send_data(
    path: &Path,
    blob: &BlobClient,
    f: &Arc<File>,
    src: &Source,
    present: &[PageRange],
    fence: &Arc<WriteFence>,
    quiet: bool,
) -> Result<u64, TransferError> {
    let extents = data_extents(f, src.data_len);
    let planned: u64 = extents.iter().map(|(s, e)| e - s).sum();
    // Progress counts a byte once its fate is settled: data when its Put Page was
    // acknowledged, zeros and data already there when scanned.
    let progress = Arc::new(Progress::new("upload", planned, quiet));
    let sem = Arc::new(Semaphore::new(PARALLEL));
    let mut tasks = tokio::task::JoinSet::new();
    let mut skipped = 0u64;
    for (es, ee) in extents {
        let mut pos = es / PAGE * PAGE;
        while pos < ee {
            let end = (pos + CHUNK).min(ee);
            let mut buf = vec![0u8; (end.div_ceil(PAGE) * PAGE - pos) as usize];
            let n = (end - pos) as usize;
            read_full_at(f, &mut buf[..n], pos).map_err(file_err(path))?;
            let mut settled = end - pos;
            for (rs, re) in nonzero_runs(pos, &buf) {
                if present.iter().any(|p| p.start <= rs && re <= p.end) {
                    skipped += re - rs;
                    continue;
                }
                // The file's bytes in this run (the last page may reach past its end).
                let counted = re.min(end) - rs;
                settled -= counted;
                let data = Bytes::copy_from_slice(&buf[(rs - pos) as usize..(re - pos) as usize]);
                let permit = sem.clone().acquire_owned().await.expect("open semaphore");
                let blob = blob.clone();
                let progress = progress.clone();
                let fence = fence.clone();
                tasks.spawn(async move {
                    let r = blob.put_pages_fenced(rs, data, None, &fence).await;
                    drop(permit);
                    if r.is_ok() {
                        progress.add(counted);
                    }
                    r
                });
                while let Some(done) = tasks.try_join_next() {
                    done.expect("upload task")?;
                }
            }
            progress.add(settled);
            pos = end;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("upload task")?;
    }
    progress.finish();
    Ok(skipped)
}

/// `--resume` of an upload that finished from this same file: nothing is sent once
/// the blob is seen to still hold every data page of the file and its footer.
async fn already_complete(
    path: &Path,
    blob: &BlobClient,
    src: &Source,
    f: &File,
    started: Instant,
) -> Result<Report, TransferError> {
    let changed = || {
        TransferError::Refused(format!(
            "cannot resume: {} was uploaded from {} but changed since (pages missing or another footer); use --overwrite to upload it again",
            blob.target(),
            path.display()
        ))
    };
    let drive = crate::drive::Drive::open(blob).await?;
    // A raw image gets a new footer (new id and time) at every upload: only a
    // VHD's own footer, sent as it was, can be compared byte for byte.
    let own_footer = src.kind == "fixed VHD" && src.data_len == src.disk_size;
    if drive.disk_size() != src.disk_size
        || (own_footer && blob.read(src.disk_size, FOOTER_SIZE).await?[..] != src.footer[..])
    {
        return Err(changed());
    }
    // What the fingerprint samples (the first and last MiB of data) must read the
    // same on the blob: a cheap check against a drive written to since (by a mount,
    // or restored from a snapshot); pages missing are caught below.
    let sample = src.data_len.min(MIB);
    for at in [0, src.data_len - sample] {
        let mut want = vec![0u8; sample as usize];
        read_full_at(f, &mut want, at).map_err(file_err(path))?;
        if blob.read(at, sample).await?[..] != want[..] {
            return Err(changed());
        }
    }
    // Merged: a run of the file may span ranges written by different requests.
    let present = crate::azure::ranges::merge(
        blob.page_ranges_segmented(src.disk_size, SegmentPlan::default())
            .await?,
    );
    for (es, ee) in data_extents(f, src.data_len) {
        let mut pos = es / PAGE * PAGE;
        while pos < ee {
            let end = (pos + CHUNK).min(ee);
            let mut buf = vec![0u8; (end.div_ceil(PAGE) * PAGE - pos) as usize];
            let n = (end - pos) as usize;
            read_full_at(f, &mut buf[..n], pos).map_err(file_err(path))?;
            for (rs, re) in nonzero_runs(pos, &buf) {
                if !present.iter().any(|p| p.start <= rs && re <= p.end) {
                    return Err(changed());
                }
            }
            pos = end;
        }
    }
    Ok(Report {
        image_bytes: src.disk_size,
        bytes_transferred: 0,
        requests: 0,
        skipped_bytes: crate::azure::ranges::total(&present),
        seconds: started.elapsed().as_secs_f64(),
        method: None,
        already_complete: true,
    })
}

async fn create(blob: &BlobClient, len: u64, fp: &str) -> Result<(), TransferError> {
    blob.create_page_blob(len).await?;
    blob.set_metadata(&[(FINGERPRINT_META, fp)], None).await?;
    Ok(())
}

fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break; // past the end: the rest stays zero
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pages_are_skipped_and_small_gaps_kept() {
        let mut buf = vec![0u8; 256 * 1024];
        buf[0] = 1; // page 0
        buf[4096] = 1; // page 8: gap of 3.5 KiB, kept
        buf[200 * 1024] = 1; // far away: new run
        let runs = nonzero_runs(1 << 20, &buf);
        assert_eq!(
            runs,
            vec![
                ((1 << 20), (1 << 20) + 4608),
                ((1 << 20) + 200 * 1024, (1 << 20) + 200 * 1024 + 512)
            ]
        );
        assert!(nonzero_runs(0, &[0u8; 8192]).is_empty());
    }

    #[test]
    fn raw_and_vhd_sources() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("a.img");
        std::fs::write(&raw, vec![1u8; 1000]).unwrap();
        let s = inspect(&raw).unwrap();
        assert_eq!((s.data_len, s.disk_size, s.kind), (1000, MIB, "raw image"));
        let vhd = dir.path().join("b.vhd");
        let mut data = vec![0u8; 2 * MIB as usize];
        data.extend_from_slice(&Footer::new_fixed(2 * MIB).unwrap().to_bytes());
        std::fs::write(&vhd, &data).unwrap();
        let s = inspect(&vhd).unwrap();
        assert_eq!(
            (s.data_len, s.disk_size, s.kind),
            (2 * MIB, 2 * MIB, "fixed VHD")
        );
        let mut f = Footer::new_fixed(2 * MIB).unwrap();
        f.disk_type = DiskType::Dynamic;
        let dynamic = dir.path().join("c.vhd");
        std::fs::write(&dynamic, f.to_bytes()).unwrap();
        let e = inspect(&dynamic).unwrap_err().to_string();
        assert!(
            e.contains("dynamic VHD") && e.contains("qemu-img convert"),
            "{e}"
        );
    }
}
