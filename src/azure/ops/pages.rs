//! Reading and writing pages, and asking which pages are written: the page
//! operations of [`BlobClient`] (read, write, clear, Get Page Ranges in its forms).

use bytes::Bytes;
use reqwest::Method;
use tracing::warn;

use std::sync::Arc;

use super::blob::{BlobClient, PAGE};
use super::fence::WriteFence;
use crate::azure::crc64;
use crate::azure::error::{AzureError, Op};
use crate::azure::pipeline::{Expect, Found, Request};
use crate::azure::ranges::{Advance, Gathered, PageRange};
use crate::azure::scatter::Scatter;
use crate::azure::stats::ClientStats;
use crate::azure::xml;

/// Largest body of one Put Page call.
pub const MAX_PUT_PAGE: u64 = 4 * 1024 * 1024;
/// Largest ranged read the service gives the CRC64 of (it refuses to for a
/// longer one).
pub const MAX_CRC64_READ: u64 = 4 * 1024 * 1024;

/// One Get Page Ranges query's answer, merged as it arrived.
struct PageList {
    written: Gathered,
    cleared: Gathered,
    /// How many ranges the service sent: what sizes the next segment.
    sent: usize,
}

/// Result of a `prevsnapshot` diff query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageDiff {
    pub changed: Vec<PageRange>,
    pub cleared: Vec<PageRange>,
}

/// How a blob's written ranges are fetched: in segments whose size adapts to how
/// fragmented the blob is, because one Get Page Ranges call over a heavily fragmented
/// region can time out on the service while a sparse region is cheap to scan whole.
#[derive(Debug, Clone, Copy)]
pub struct SegmentPlan {
    /// First segment size (150 MB is safe for the worst fragmentation).
    pub initial: u64,
    /// Never smaller than this, even after timeouts.
    pub min: u64,
    /// Never larger than this.
    pub max: u64,
    /// Double the next segment when a segment returned fewer ranges than this.
    pub grow_below: usize,
    /// Halve the next segment when a segment returned more ranges than this.
    pub shrink_above: usize,
}

/// The most `NextMarker` pages one Get Page Ranges query follows. The service
/// pages a long answer; a drive's map comes from segmented queries, each short.
pub const PAGE_LIST_MAX_PAGES: usize = 1000;
/// The most ranges one Get Page Ranges query counts, and the most merged ranges
/// a drive's map holds (32 MiB of them): a bound on what a hostile endpoint's
/// answers can make this client hold. A real drive reaches it only with two
/// million separate written runs (each at least a page, with a hole between).
pub const PAGE_LIST_MAX_RANGES: usize = 2 << 20;

impl Default for SegmentPlan {
    fn default() -> Self {
        SegmentPlan {
            initial: 128 * 1024 * 1024,
            min: 4 * 1024 * 1024,
            max: 256 * 1024 * 1024 * 1024,
            grow_below: 1000,
            shrink_above: 10_000,
        }
    }
}

impl BlobClient {
    /// Reads `buf.len()` bytes at `offset` straight into `buf`; a short answer is
    /// an error.
    pub async fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), AzureError> {
        self.read_scattered(offset, &mut [buf]).await
    }

    /// Reads the bytes at `offset` into `parts`, one after another, with one
    /// ranged GET (so as many bytes as they hold together); a short answer is an
    /// error.
    pub async fn read_scattered(
        &self,
        offset: u64,
        parts: &mut [&mut [u8]],
    ) -> Result<(), AzureError> {
        let mut sink = Scatter::new(parts);
        let len = sink.capacity() as u64;
        if len == 0 {
            return Ok(());
        }
        let req = self.range_get(offset, len);
        let resp = self.svc.execute_into(req, Some(&mut sink)).await?;
        // The answer is the whole range: `Expect::Range` saw to it.
        self.count(|s| ClientStats::add(&s.bytes_downloaded, resp.streamed as u64));
        Ok(())
    }

    /// A counted ranged GET of `len > 0` bytes at `offset`: its answer must
    /// be that range, whole (see `pipeline::Expect`), and one of at most 4
    /// MiB asks the service for the CRC64 of its bytes, checked when it comes.
    fn range_get(&self, offset: u64, len: u64) -> Request {
        let mut req = self.request(Op::Read, Method::GET, &[], &[206]);
        req.header(
            "x-ms-range",
            format!("bytes={}-{}", offset, offset + len - 1),
        );
        if len <= MAX_CRC64_READ {
            req.header("x-ms-range-get-content-crc64", "true");
        }
        req.expect = Some(Expect::Range { start: offset, len });
        self.count(|s| ClientStats::add(&s.get_requests, 1));
        req
    }

    /// Reads `len` bytes at `offset`; a short answer is garbled (see
    /// `range_get`), retried and never silently padded.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, AzureError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let resp = self.svc.execute(self.range_get(offset, len)).await?;
        self.count(|s| ClientStats::add(&s.bytes_downloaded, resp.body.len() as u64));
        Ok(resp.body)
    }

    fn check_pages(&self, op: Op, offset: u64, len: u64) -> Result<(), AzureError> {
        if !offset.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || len == 0 {
            return Err(self.invalid(
                op,
                format!("range {offset}+{len} is not a non-empty run of whole 512-byte pages"),
            ));
        }
        if self.snapshot.is_some() {
            return Err(self.invalid(op, "snapshots are read-only"));
        }
        Ok(())
    }

    /// Writes whole pages at `offset`. At most 4 MiB per call: real Azure refuses more
    /// with 413 and Azurite silently accepts, so the client enforces it.
    pub async fn put_pages(
        &self,
        offset: u64,
        data: Bytes,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        self.send_pages(offset, data, lease, None).await
    }

    /// [`Self::put_pages`] fenced by `fence`: no attempt this gives up on can land
    /// after a later write (see [`WriteFence`]).
    pub async fn put_pages_fenced(
        &self,
        offset: u64,
        data: Bytes,
        lease: Option<&str>,
        fence: &Arc<WriteFence>,
    ) -> Result<(), AzureError> {
        self.send_pages(offset, data, lease, Some(fence.clone()))
            .await
    }

    async fn send_pages(
        &self,
        offset: u64,
        data: Bytes,
        lease: Option<&str>,
        fence: Option<Arc<WriteFence>>,
    ) -> Result<(), AzureError> {
        let len = data.len() as u64;
        self.check_pages(Op::PutPage, offset, len)?;
        if len > MAX_PUT_PAGE {
            return Err(self.invalid(
                Op::PutPage,
                format!("{len} bytes in one Put Page call; the service takes at most 4 MiB"),
            ));
        }
        let mut req = self.request(Op::PutPage, Method::PUT, &[("comp", "page")], &[201]);
        req.header("x-ms-page-write", "update");
        req.header(
            "x-ms-range",
            format!("bytes={}-{}", offset, offset + len - 1),
        );
        req.lease(lease);
        // The service checks the bytes it got against it and refuses a body
        // changed on the way, writing nothing.
        req.header("x-ms-content-crc64", crc64::header(crc64::of(&data)));
        req.body = data;
        req.fenced(fence);
        self.count(|s| ClientStats::add(&s.put_page_requests, 1));
        self.svc.execute(req).await?;
        self.count(|s| ClientStats::add(&s.bytes_uploaded, len));
        Ok(())
    }

    /// Clears (deallocates) whole pages: they read as zeros and cost no storage.
    pub async fn clear_pages(
        &self,
        offset: u64,
        len: u64,
        lease: Option<&str>,
    ) -> Result<(), AzureError> {
        self.send_clear(offset, len, lease, None).await
    }

    /// [`Self::clear_pages`] fenced by `fence` (see [`WriteFence`]): an abandoned
    /// clear can never empty a range written after it.
    pub async fn clear_pages_fenced(
        &self,
        offset: u64,
        len: u64,
        lease: Option<&str>,
        fence: &Arc<WriteFence>,
    ) -> Result<(), AzureError> {
        self.send_clear(offset, len, lease, Some(fence.clone()))
            .await
    }

    async fn send_clear(
        &self,
        offset: u64,
        len: u64,
        lease: Option<&str>,
        fence: Option<Arc<WriteFence>>,
    ) -> Result<(), AzureError> {
        self.check_pages(Op::ClearPages, offset, len)?;
        let mut req = self.request(Op::ClearPages, Method::PUT, &[("comp", "page")], &[201]);
        req.header("x-ms-page-write", "clear");
        req.header(
            "x-ms-range",
            format!("bytes={}-{}", offset, offset + len - 1),
        );
        req.lease(lease);
        req.fenced(fence);
        self.count(|s| ClientStats::add(&s.clear_requests, 1));
        self.svc.execute(req).await.map(|_| ())
    }

    /// One Get Page Ranges query (all its `NextMarker` pages, within
    /// [`PAGE_LIST_MAX_PAGES`] and [`PAGE_LIST_MAX_RANGES`]): the written and the
    /// cleared ranges inside `range`, each merged page by page as it arrives.
    async fn page_list(
        &self,
        range: Option<PageRange>,
        prev_snapshot: Option<&str>,
        max_attempts: Option<u32>,
    ) -> Result<PageList, AzureError> {
        let mut written = Gathered::new(PAGE_LIST_MAX_RANGES);
        let mut cleared = Gathered::new(PAGE_LIST_MAX_RANGES);
        let mut sent = 0;
        if range.is_some_and(|r| r.is_empty()) {
            return Ok(PageList {
                written,
                cleared,
                sent,
            });
        }
        let mut marker: Option<String> = None;
        let mut guard = super::PageGuard::new(
            Op::GetPageRanges,
            self.target(),
            PAGE_LIST_MAX_PAGES,
            PAGE_LIST_MAX_RANGES,
        );
        let mut advance = Advance::default();
        loop {
            let page = self
                .page_list_page(range, prev_snapshot, marker.as_deref(), max_attempts)
                .await?;
            sent += page.ranges.len() + page.cleared.len();
            guard.page(
                page.ranges.len() + page.cleared.len(),
                page.next_marker.as_deref(),
            )?;
            advance
                .page(page.ranges.iter().chain(&page.cleared))
                .map_err(|d| self.broken_list(d))?;
            written
                .add(page.ranges, range)
                .map_err(|d| self.broken_list(d))?;
            cleared
                .add(page.cleared, range)
                .map_err(|d| self.broken_list(d))?;
            match page.next_marker {
                Some(m) => marker = Some(m),
                None => {
                    return Ok(PageList {
                        written,
                        cleared,
                        sent,
                    })
                }
            }
        }
    }

    /// One request of a Get Page Ranges query: the page of the answer that
    /// `marker` names (the first without it), ranges as sent, unmerged.
    pub(super) async fn page_list_page(
        &self,
        range: Option<PageRange>,
        prev_snapshot: Option<&str>,
        marker: Option<&str>,
        max_attempts: Option<u32>,
    ) -> Result<xml::PageListPage, AzureError> {
        let mut q: Vec<(&str, &str)> = vec![("comp", "pagelist")];
        if let Some(p) = prev_snapshot {
            q.push(("prevsnapshot", p));
        }
        if let Some(m) = marker {
            q.push(("marker", m));
        }
        let mut req = self.request(Op::GetPageRanges, Method::GET, &q, &[200]);
        req.max_attempts = max_attempts;
        if let Some(r) = range {
            req.header("x-ms-range", format!("bytes={}-{}", r.start, r.end - 1));
        }
        // Anything but one whole page list is garbled, and asked again; the
        // list is parsed once, as it is checked.
        req.expect = Some(Expect::PageList);
        self.count(|s| ClientStats::add(&s.page_range_requests, 1));
        let resp = self.svc.execute(req).await?;
        let Found::PageList(page) = resp.found else {
            unreachable!("an answer expected to be a page list is one, or garbled")
        };
        if page.off_grid > 0 {
            self.said_off_grid(page.off_grid);
        }
        Ok(page)
    }

    /// Says (once a process) that the service listed ranges off the 512-byte
    /// grid, which were rounded outward to whole pages.
    fn said_off_grid(&self, n: usize) {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            warn!(
                target = %self.target(),
                "the service listed {n} written range(s) off the 512-byte grid; each was rounded outward to whole pages (a little more is read, never less)"
            );
        }
    }

    /// A Get Page Ranges listing that cannot be right (its pages do not move
    /// on, or pass what this client gathers): final, never retried (an
    /// endpoint that answers so once will answer so again).
    pub(super) fn broken_list(&self, detail: String) -> AzureError {
        AzureError::Protocol {
            op: Op::GetPageRanges,
            target: self.target(),
            detail,
        }
    }

    /// Written ranges within `range` (whole blob if `None`), merged.
    pub async fn page_ranges(
        &self,
        range: Option<PageRange>,
    ) -> Result<Vec<PageRange>, AzureError> {
        Ok(self.page_list(range, None, None).await?.written.into_vec())
    }

    /// Ranges changed (`changed`) and cleared (`cleared`) since `prev_snapshot`, as the
    /// service reports them. Azurite ignores `prevsnapshot` and answers with the full
    /// list: callers must not trust this blindly (see the snapshot module).
    pub async fn page_ranges_diff(
        &self,
        prev_snapshot: &str,
        range: Option<PageRange>,
    ) -> Result<PageDiff, AzureError> {
        let list = self.page_list(range, Some(prev_snapshot), None).await?;
        Ok(PageDiff {
            changed: list.written.into_vec(),
            cleared: list.cleared.into_vec(),
        })
    }

    /// All written ranges of the first `len` bytes, queried in adaptive segments and
    /// merged across segment edges as each segment's answer arrives, so that what
    /// is held stays within [`PAGE_LIST_MAX_RANGES`] ranges whatever the drive's
    /// size and whatever the answers hold.
    pub async fn page_ranges_segmented(
        &self,
        len: u64,
        plan: SegmentPlan,
    ) -> Result<Vec<PageRange>, AzureError> {
        let align = |v: u64| (v / PAGE).max(1) * PAGE;
        let mut seg = align(plan.initial.clamp(plan.min, plan.max));
        let mut pos = 0u64;
        let mut found = Gathered::new(PAGE_LIST_MAX_RANGES);
        while pos < len {
            let end = (pos + seg).min(len);
            // Where a smaller segment is still possible, fail fast and split instead of
            // repeating a query the service could not finish.
            let attempts = (seg > plan.min).then_some(2);
            match self
                .page_list(Some(PageRange::new(pos, end)), None, attempts)
                .await
            {
                Ok(list) => {
                    // How hard the service worked: what it sent, before merging.
                    let n = list.sent;
                    found
                        .append(list.written)
                        .map_err(|d| self.broken_list(d))?;
                    pos = end;
                    if n < plan.grow_below {
                        seg = align((seg.saturating_mul(2)).min(plan.max));
                    } else if n > plan.shrink_above {
                        seg = align((seg / 2).max(plan.min));
                    }
                }
                // Only a query the service did not finish is worth splitting: no
                // answer, or a server error. An answer that was wrong (unparseable,
                // endless, not advancing) is final.
                Err(e) if seg > plan.min && Self::unfinished(&e) => {
                    warn!(target = %self.target(), segment = seg, "page ranges query failed, splitting: {e}");
                    seg = align((seg / 2).max(plan.min));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(found.into_vec())
    }

    /// Whether a failed query is one the service said it could not finish in
    /// time (500 `OperationTimedOut`, or busy): worth asking again in halves.
    /// Not one that got no answer, nor one whose answer never came whole: a
    /// smaller query would only wait as long again (an answer trickling in a
    /// byte at a time held a listing for one retry budget per halving).
    pub(super) fn unfinished(e: &AzureError) -> bool {
        matches!(e.status(), Some(500 | 503))
    }
}
