//! A drive's extents as a stream: those allocated in a snapshot (or in the drive
//! itself), or those that changed between two snapshots of it. What the CSI
//! SnapshotMetadata service and `blobdrive snapshot changes` answer with.
//!
//! Extents are in bytes of the disk (the VHD footer after it is never one),
//! sorted, disjoint and merged where they touch, across the whole stream. They
//! come from Get Page Ranges walked a page at a time ([`PageWalk`]), so what is
//! held is a page of the service's answer and one batch, whatever the drive's
//! size or fragmentation. A stream starts at any offset, which is how an
//! interrupted one resumes: the offset goes into the range asked of the
//! service, never into a service marker.
//!
//! What changed is the service's own diff (`prevsnapshot`: the pages written or
//! cleared since the older snapshot) where it is shown to work: the older
//! snapshot's diff against itself holds nothing at its footer, a page every
//! drive has written, and the newer one's diff against it is answered.
//! Otherwise (Azurite ignores `prevsnapshot` and answers with the whole list; a
//! blob overwritten by a copy since the older snapshot is refused a diff) it is
//! every extent allocated in either snapshot: more than changed, never less.

use std::collections::VecDeque;

use serde::Serialize;
use thiserror::Error;
use tracing::info;

use crate::azure::{AzureError, BlobClient, PageRange, PageWalk, SegmentPlan};
use crate::drive::{Drive, DriveError};
use crate::vhd::FOOTER_SIZE;

/// How a stream's extents were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// The allocated extents of one snapshot or drive.
    Allocated,
    /// The service's diff of the newer against the older.
    Diff,
    /// Every extent allocated in either: no diff to be had.
    Compare,
}

impl Method {
    /// How it is said to a user.
    pub fn describe(self) -> &'static str {
        match self {
            Method::Allocated => "the service's page list",
            Method::Diff => "the service's snapshot diff",
            Method::Compare => {
                "both snapshots' allocated extents (the service gave no diff: every extent allocated in either is listed)"
            }
        }
    }
}

/// Why no stream of extents could be started.
#[derive(Debug, Error)]
pub enum ChangesError {
    #[error(transparent)]
    Drive(#[from] DriveError),
    #[error(transparent)]
    Azure(#[from] AzureError),
    #[error("offset {from} is past the end of {target}, whose disk is {size} bytes")]
    PastTheEnd {
        target: String,
        from: u64,
        size: u64,
    },
    #[error("{0} is not a snapshot: changes are counted from a snapshot of the drive")]
    NotASnapshot(String),
    #[error("{base} and {target} are not of the same drive")]
    OtherDrive { base: String, target: String },
    #[error("{base} is not older than {target}: changes are counted from the older snapshot to the newer")]
    NotOlder { base: String, target: String },
}

impl ChangesError {
    /// Whether a snapshot (or drive) named does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            ChangesError::Drive(DriveError::BlobMissing(_) | DriveError::ContainerMissing(_)) => {
                true
            }
            ChangesError::Drive(DriveError::Azure(e)) | ChangesError::Azure(e) => e.is_not_found(),
            _ => false,
        }
    }
}

/// One walk and the part of its last page not yet taken.
struct Source {
    walk: PageWalk,
    buf: VecDeque<PageRange>,
    done: bool,
}

impl Source {
    fn new(walk: PageWalk) -> Source {
        Source {
            walk,
            buf: VecDeque::new(),
            done: false,
        }
    }

    /// Its lowest range not taken yet, fetching the next page when the last
    /// is used up.
    async fn front(&mut self) -> Result<Option<PageRange>, AzureError> {
        while self.buf.is_empty() && !self.done {
            match self.walk.next_page().await? {
                Some(page) => self.buf.extend(page),
                None => self.done = true,
            }
        }
        Ok(self.buf.front().copied())
    }
}

/// A stream of extents: [`allocated`] or [`delta`] starts one.
pub struct Extents {
    sources: Vec<Source>,
    /// Nothing before it is told (the starting offset).
    from: u64,
    /// The disk's size: nothing at or past it is told.
    disk_size: u64,
    /// The extent being grown: the next range may still touch it.
    pending: Option<PageRange>,
    /// Extents complete, not yet handed out.
    ready: VecDeque<PageRange>,
    exhausted: bool,
    method: Method,
    /// The most ranges held at once (pages, the batch, the pending one).
    peak: usize,
}

impl Extents {
    fn new(sources: Vec<PageWalk>, from: u64, disk_size: u64, method: Method) -> Extents {
        Extents {
            sources: sources.into_iter().map(Source::new).collect(),
            from,
            disk_size,
            pending: None,
            ready: VecDeque::new(),
            exhausted: false,
            method,
            peak: 0,
        }
    }

    /// The size of the disk the extents are of (the newer snapshot's, for a
    /// delta).
    pub fn disk_size(&self) -> u64 {
        self.disk_size
    }

    pub fn method(&self) -> Method {
        self.method
    }

    /// The most ranges this stream has held at once: a page of the service's
    /// answer per walk, and the batch being filled.
    pub fn peak_held(&self) -> usize {
        self.peak
    }

    /// The next at most `max` extents (at least one is asked for), `None` at
    /// the end.
    pub async fn next_batch(&mut self, max: usize) -> Result<Option<Vec<PageRange>>, AzureError> {
        let max = max.max(1);
        while self.ready.len() < max && !self.exhausted {
            self.pull().await?;
        }
        if self.ready.is_empty() {
            return Ok(None);
        }
        let n = max.min(self.ready.len());
        Ok(Some(self.ready.drain(..n).collect()))
    }

    /// Takes the lowest range of all sources into the pending extent, or ends
    /// the stream when none is left.
    async fn pull(&mut self) -> Result<(), AzureError> {
        let mut lowest: Option<(usize, u64)> = None;
        for (i, s) in self.sources.iter_mut().enumerate() {
            if let Some(r) = s.front().await? {
                if lowest.is_none_or(|(_, start)| r.start < start) {
                    lowest = Some((i, r.start));
                }
            }
        }
        let held = self.sources.iter().map(|s| s.buf.len()).sum::<usize>() + self.ready.len() + 1;
        self.peak = self.peak.max(held);
        let Some((i, _)) = lowest else {
            self.exhausted = true;
            self.ready.extend(self.pending.take());
            return Ok(());
        };
        let taken = self.sources[i].buf.pop_front().expect("a front was seen");
        let Some(r) = taken.intersect(&PageRange::new(self.from, self.disk_size)) else {
            return Ok(());
        };
        match self.pending.as_mut() {
            Some(p) if r.start <= p.end => p.end = p.end.max(r.end),
            _ => self.ready.extend(self.pending.replace(r)),
        }
        Ok(())
    }
}

/// The allocated extents of `blob` (a drive or a snapshot of one) from `from`.
pub async fn allocated(blob: &BlobClient, from: u64) -> Result<Extents, ChangesError> {
    let size = Drive::open(blob).await?.disk_size();
    check_from(blob, from, size)?;
    let walk = PageWalk::new(
        blob,
        PageRange::new(from, size),
        None,
        SegmentPlan::default(),
    );
    Ok(Extents::new(vec![walk], from, size, Method::Allocated))
}

/// The extents of `target` (a later snapshot of the drive, or the drive
/// itself) that changed since `base` (a snapshot of it), from `from`. A
/// snapshot or drive that does not exist is said (not found) before the pair
/// is judged: a base on a drive that does not exist is missing, not another
/// drive's.
pub async fn delta(
    base: &BlobClient,
    target: &BlobClient,
    from: u64,
) -> Result<Extents, ChangesError> {
    if base.snapshot().is_none() {
        return Err(ChangesError::NotASnapshot(base.target()));
    }
    let base_size = Drive::open(base).await?.disk_size();
    let size = Drive::open(target).await?.disk_size();
    let base_id = check_pair(base, target)?;
    check_from(target, from, size)?;
    let span = PageRange::new(from, size);
    let plan = SegmentPlan::default();
    if diff_works(base, &base_id, base_size).await && diff_answered(target, &base_id, size).await? {
        let walk = PageWalk::new(target, span, Some(&base_id), plan);
        return Ok(Extents::new(vec![walk], from, size, Method::Diff));
    }
    info!(
        "no snapshot diff of {} against {}: comparing their allocated extents",
        target.target(),
        base.target()
    );
    // Past the newer one's end nothing is told; past the older one's, it holds
    // nothing.
    let end = base_size.min(size);
    let base_span = PageRange::new(from.min(end), end);
    let walks = vec![
        PageWalk::new(base, base_span, None, plan),
        PageWalk::new(target, span, None, plan),
    ];
    Ok(Extents::new(walks, from, size, Method::Compare))
}

fn check_from(blob: &BlobClient, from: u64, size: u64) -> Result<(), ChangesError> {
    if from > size {
        return Err(ChangesError::PastTheEnd {
            target: blob.target(),
            from,
            size,
        });
    }
    Ok(())
}

/// The snapshot id of `base`, once it is known to be a snapshot of `target`'s
/// drive older than `target`.
fn check_pair(base: &BlobClient, target: &BlobClient) -> Result<String, ChangesError> {
    let Some(base_id) = base.snapshot() else {
        return Err(ChangesError::NotASnapshot(base.target()));
    };
    if base.container_name() != target.container_name() || base.name() != target.name() {
        return Err(ChangesError::OtherDrive {
            base: base.target(),
            target: target.target(),
        });
    }
    // Snapshot ids are fixed-width UTC times: as text, older sorts first.
    if target.snapshot().is_some_and(|t| t <= base_id) {
        return Err(ChangesError::NotOlder {
            base: base.target(),
            target: target.target(),
        });
    }
    Ok(base_id.to_string())
}

/// Whether the service diffs: `base`'s diff against itself holds nothing at
/// its footer, which every drive has written. A service that ignores
/// `prevsnapshot` answers with the page.
async fn diff_works(base: &BlobClient, base_id: &str, base_size: u64) -> bool {
    let footer = PageRange::new(base_size, base_size + FOOTER_SIZE);
    match base.page_ranges_diff(base_id, Some(footer)).await {
        Ok(d) => d.changed.is_empty() && d.cleared.is_empty(),
        Err(e) => {
            info!("the snapshot diff of {} failed: {e}", base.target());
            false
        }
    }
}

/// Whether the service answers `target`'s diff against `base_id` (asked of
/// its footer page): it refuses one (409) when the blob was overwritten by a
/// copy since that snapshot.
async fn diff_answered(target: &BlobClient, base_id: &str, size: u64) -> Result<bool, AzureError> {
    let footer = PageRange::new(size, size + FOOTER_SIZE);
    match target.page_ranges_diff(base_id, Some(footer)).await {
        Ok(_) => Ok(true),
        Err(e) if e.status() == Some(409) => {
            info!("the service gives no diff of {}: {e}", target.target());
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
