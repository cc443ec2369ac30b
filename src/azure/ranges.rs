//! Byte ranges of a page blob, half-open, and their merging.
//!
//! The service reports inclusive ends and may split one written run into pieces (at
//! segment edges of a segmented query, or simply unmerged, as Azurite does), so every
//! list that leaves the client is merged into sorted, disjoint, non-adjacent ranges.

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

#[cfg(test)]
mod tests {
    use super::*;

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
