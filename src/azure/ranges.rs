//! Byte ranges of a page blob, half-open, and their merging.
//!
//! The service reports inclusive ends and may split one written run into pieces (at
//! segment edges of a segmented query, or simply unmerged, as Azurite does), so every
//! list that leaves the client is merged into sorted, disjoint, non-adjacent ranges.

/// Page size: every page-blob offset and length is a multiple of it.
pub const PAGE: u64 = 512;

/// A half-open byte range `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageRange {
    pub start: u64,
    pub end: u64,
}

impl PageRange {
    pub fn new(start: u64, end: u64) -> PageRange {
        debug_assert!(start <= end);
        PageRange { start, end }
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// The part of `self` inside `other`, if any.
    pub fn intersect(&self, other: &PageRange) -> Option<PageRange> {
        let s = self.start.max(other.start);
        let e = self.end.min(other.end);
        (s < e).then(|| PageRange::new(s, e))
    }
}

/// Sorts and merges overlapping or touching ranges; drops empty ones.
pub fn merge(mut ranges: Vec<PageRange>) -> Vec<PageRange> {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_unstable();
    let mut out: Vec<PageRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Total bytes covered by merged ranges.
pub fn total(ranges: &[PageRange]) -> u64 {
    ranges.iter().map(PageRange::len).sum()
}

/// Ranges gathered from a listing's answers as they arrive, so that what is held
/// is the merged map, never the answers: each page is clipped to the span asked
/// and merged before it is kept, and the whole stays within `max` ranges.
///
/// A hostile endpoint answering every segment of a drive with 150,000 copies of
/// one range made the old gather-then-merge hold every copy (3 GB for an 8 GiB
/// drive); merged as they come, the copies are one range.
#[derive(Debug)]
pub struct Gathered {
    merged: Vec<PageRange>,
    max: usize,
}

impl Gathered {
    pub fn new(max: usize) -> Gathered {
        Gathered {
            merged: Vec::new(),
            max,
        }
    }

    /// Adds one page of ranges, clipped to `within` (the service may answer with
    /// whole pages beyond the asked range). Ranges must come in ascending order
    /// page by page, as the service sends them and as segments are asked; the
    /// callers check that (see [`Advance`]).
    pub fn add(&mut self, page: Vec<PageRange>, within: Option<PageRange>) -> Result<(), String> {
        let mut page = merge(page);
        if let Some(w) = within {
            page = page.iter().filter_map(|r| r.intersect(&w)).collect();
        }
        for r in page {
            match self.merged.last_mut() {
                Some(last) if r.start < last.start => {
                    return Err(format!(
                        "ranges came out of order ({} after {})",
                        r.start, last.start
                    ))
                }
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => {
                    if self.merged.len() == self.max {
                        return Err(format!(
                            "the blob's written ranges number more than {}, more than this client maps",
                            self.max
                        ));
                    }
                    self.merged.push(r);
                }
            }
        }
        Ok(())
    }

    /// Appends another gathering that starts at or after this one's end.
    pub fn append(&mut self, other: Gathered) -> Result<(), String> {
        self.add(other.merged, None)
    }

    pub fn len(&self) -> usize {
        self.merged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.merged.is_empty()
    }

    /// The merged ranges: sorted, disjoint, non-adjacent.
    pub fn into_vec(self) -> Vec<PageRange> {
        self.merged
    }
}

/// Checks that the pages of one listing move forward: every page after the first
/// holds ranges, all at or past the end of what the pages before it reached. An
/// endpoint that answers the same ranges with a new `NextMarker` for ever is
/// stopped at its second page, not at the thousandth.
#[derive(Debug, Default)]
pub struct Advance {
    pages: usize,
    reached: u64,
}

impl Advance {
    /// Counts one page holding `ranges` (data and cleared alike).
    pub fn page<'a>(
        &mut self,
        ranges: impl IntoIterator<Item = &'a PageRange>,
    ) -> Result<(), String> {
        self.pages += 1;
        let mut lowest = None::<u64>;
        let mut highest = self.reached;
        for r in ranges {
            lowest = Some(lowest.map_or(r.start, |l| l.min(r.start)));
            highest = highest.max(r.end);
        }
        if self.pages > 1 {
            match lowest {
                None => return Err(format!("page {} of the list holds no range", self.pages)),
                Some(l) if l < self.reached => {
                    return Err(format!(
                        "page {} of the list goes back to offset {l}, before {} where the pages before it ended",
                        self.pages, self.reached
                    ))
                }
                Some(_) => {}
            }
        }
        self.reached = highest;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_copies_of_one_range_are_held_once() {
        let mut g = Gathered::new(10);
        for seg in 0..100u64 {
            let copies = vec![r(0, 512); 1000];
            g.add(copies, Some(r(seg * 1024, seg * 1024 + 1024)))
                .unwrap();
        }
        assert_eq!(g.into_vec(), vec![r(0, 512)]);
    }

    #[test]
    fn gathered_ranges_are_clipped_and_merged_across_pages() {
        let mut g = Gathered::new(10);
        g.add(vec![r(512, 2048), r(0, 512)], Some(r(0, 1024)))
            .unwrap();
        g.add(vec![r(0, 4096)], Some(r(1024, 2048))).unwrap();
        g.add(vec![r(3072, 3584)], Some(r(2048, 4096))).unwrap();
        assert_eq!(g.into_vec(), vec![r(0, 2048), r(3072, 3584)]);
    }

    #[test]
    fn gathered_ranges_past_the_bound_or_out_of_order_are_refused() {
        let mut g = Gathered::new(2);
        g.add(vec![r(0, 512), r(1024, 1536)], None).unwrap();
        let e = g.add(vec![r(2048, 2560)], None).unwrap_err();
        assert!(e.contains("more than 2"), "{e}");
        let mut g = Gathered::new(10);
        g.add(vec![r(4096, 4608)], None).unwrap();
        assert!(g.add(vec![r(0, 512)], None).is_err());
    }

    #[test]
    fn a_list_whose_pages_do_not_advance_fails_at_its_second_page() {
        let mut a = Advance::default();
        a.page(&[r(0, 512)]).unwrap();
        assert!(a.page(&[r(0, 512)]).is_err());
        let mut a = Advance::default();
        a.page(&[]).unwrap();
        assert!(a.page(&[]).is_err());
        let mut a = Advance::default();
        a.page(&[r(0, 512), r(1024, 1536)]).unwrap();
        a.page(&[r(1536, 2048)]).unwrap();
        a.page(&[r(4096, 4608)]).unwrap();
        assert!(a.page(&[r(4000, 4608)]).is_err());
    }

    fn r(s: u64, e: u64) -> PageRange {
        PageRange::new(s, e)
    }

    #[test]
    fn merges_adjacent_overlapping_and_unsorted() {
        let m = merge(vec![
            r(1024, 2048),
            r(0, 512),
            r(512, 1024),
            r(4096, 4608),
            r(4000, 4100),
            r(9000, 9000),
        ]);
        assert_eq!(m, vec![r(0, 2048), r(4000, 4608)]);
        assert_eq!(total(&m), 2048 + 608);
    }

    #[test]
    fn intersect() {
        assert_eq!(r(0, 10).intersect(&r(5, 20)), Some(r(5, 10)));
        assert_eq!(r(0, 10).intersect(&r(10, 20)), None);
    }
}
