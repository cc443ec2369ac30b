//! Get Page Ranges over a span, one page of the service's answer at a time:
//! [`PageWalk`]. A drive's map ([`BlobClient::page_ranges_segmented`]) gathers
//! every range before it answers; a walk hands each page on as it arrives, so
//! what a caller streaming extents holds is one page, whatever the blob.
//!
//! The span is asked in segments as the map asks it (sized by how many ranges
//! the last one held, halved after a query the service could not finish), each
//! segment's `NextMarker` pages followed within the bounds every listing keeps.
//! A diff walk (`prevsnapshot`) hands on written and cleared ranges together:
//! both are what changed.

use tracing::warn;

use super::blob::{BlobClient, PAGE};
use super::pages::{SegmentPlan, PAGE_LIST_MAX_PAGES, PAGE_LIST_MAX_RANGES};
use super::PageGuard;
use crate::azure::error::{AzureError, Op};
use crate::azure::ranges::{self, Advance, PageRange};

/// A walk over the ranges of `[start, end)` of one blob (or snapshot).
pub struct PageWalk {
    blob: BlobClient,
    prev: Option<String>,
    plan: SegmentPlan,
    /// Where the next segment starts.
    pos: u64,
    end: u64,
    /// The size of the next segment.
    seg: u64,
    /// The segment whose pages are being followed.
    current: Option<Segment>,
}

/// One segment's query: its span, the marker of its next page, and the checks
/// that its pages move on.
struct Segment {
    span: PageRange,
    marker: Option<String>,
    pages: usize,
    /// How many ranges the service sent for it: what sizes the next segment.
    sent: usize,
    guard: PageGuard,
    advance: Advance,
}

fn align(v: u64) -> u64 {
    (v / PAGE).max(1) * PAGE
}

impl PageWalk {
    /// A walk over `span` of `blob`, or over what changed in it since
    /// `prev_snapshot` (a snapshot of the same blob, older than `blob`).
    pub fn new(
        blob: &BlobClient,
        span: PageRange,
        prev_snapshot: Option<&str>,
        plan: SegmentPlan,
    ) -> PageWalk {
        PageWalk {
            blob: blob.clone(),
            prev: prev_snapshot.map(str::to_string),
            seg: align(plan.initial.clamp(plan.min, plan.max)),
            plan,
            pos: span.start - span.start % PAGE,
            end: span.end,
            current: None,
        }
    }

    /// The next page: its ranges (written and cleared alike) clipped to the
    /// segment asked, sorted and merged; possibly none. `None` once the span is
    /// done.
    pub async fn next_page(&mut self) -> Result<Option<Vec<PageRange>>, AzureError> {
        loop {
            let Some(seg) = self.current.as_mut() else {
                if self.pos >= self.end {
                    return Ok(None);
                }
                let span = PageRange::new(self.pos, (self.pos + self.seg).min(self.end));
                self.current = Some(Segment {
                    span,
                    marker: None,
                    pages: 0,
                    sent: 0,
                    guard: PageGuard::new(
                        Op::GetPageRanges,
                        self.blob.target(),
                        PAGE_LIST_MAX_PAGES,
                        PAGE_LIST_MAX_RANGES,
                    ),
                    advance: Advance::default(),
                });
                continue;
            };
            let first = seg.pages == 0;
            // Where a smaller segment is still possible, fail fast and split
            // instead of repeating a query the service could not finish.
            let splittable = first && self.seg > self.plan.min;
            let answer = self
                .blob
                .page_list_page(
                    Some(seg.span),
                    self.prev.as_deref(),
                    seg.marker.as_deref(),
                    splittable.then_some(2),
                )
                .await;
            let page = match answer {
                Ok(page) => page,
                Err(e) if splittable && BlobClient::unfinished(&e) => {
                    warn!(target = %self.blob.target(), segment = self.seg, "page ranges query failed, splitting: {e}");
                    self.seg = align((self.seg / 2).max(self.plan.min));
                    self.current = None;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let count = page.ranges.len() + page.cleared.len();
            seg.pages += 1;
            seg.sent += count;
            seg.guard.page(count, page.next_marker.as_deref())?;
            seg.advance
                .page(page.ranges.iter().chain(&page.cleared))
                .map_err(|d| self.blob.broken_list(d))?;
            let span = seg.span;
            let mut all = page.ranges;
            all.extend(page.cleared);
            let clipped = ranges::merge(all)
                .iter()
                .filter_map(|r| r.intersect(&span))
                .collect();
            match page.next_marker {
                Some(m) => seg.marker = Some(m),
                None => {
                    let sent = seg.sent;
                    self.current = None;
                    self.pos = span.end;
                    if sent < self.plan.grow_below {
                        self.seg = align(self.seg.saturating_mul(2).min(self.plan.max));
                    } else if sent > self.plan.shrink_above {
                        self.seg = align((self.seg / 2).max(self.plan.min));
                    }
                }
            }
            return Ok(Some(clipped));
        }
    }
}
