//! Which byte ranges of the disk hold data.
//!
//! Learnt once at mount from Get Page Ranges and kept up to date by every write and
//! discard, so that a read of a never-written region is answered with zeros and
//! costs no request at all.

use std::collections::BTreeMap;

use crate::azure::PageRange;

/// Disjoint, non-adjacent written ranges, keyed by start.
#[derive(Debug, Default, Clone)]
pub struct SparseMap {
    ranges: BTreeMap<u64, u64>,
}

impl SparseMap {
    pub fn from_ranges(ranges: &[PageRange]) -> SparseMap {
        let mut m = SparseMap::default();
        for r in ranges {
            m.insert(r.start, r.end);
        }
        m
    }

    /// Marks `[start, end)` as holding data.
    pub fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // Absorb a range that starts before and reaches `start`.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.ranges.remove(&s);
            }
        }
        // Absorb every range starting inside or right at the end.
        let inside: Vec<(u64, u64)> = self
            .ranges
            .range(start..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in inside {
            end = end.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(start, end);
    }

    /// Marks `[start, end)` as a hole.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut touched: Vec<(u64, u64)> = Vec::new();
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e > start {
                touched.push((s, e));
            }
        }
        touched.extend(self.ranges.range(start..end).map(|(&s, &e)| (s, e)));
        for (s, e) in touched {
            self.ranges.remove(&s);
            if s < start {
                self.ranges.insert(s, start);
            }
            if e > end {
                self.ranges.insert(end, e);
            }
        }
    }

    /// The parts of `[start, end)` that hold data, in order.
    pub fn data_in(&self, start: u64, end: u64) -> Vec<PageRange> {
        let mut out = Vec::new();
        if let Some((_, &e)) = self.ranges.range(..start).next_back() {
            if e > start {
                out.push(PageRange::new(start, e.min(end)));
            }
        }
        for (&s, &e) in self.ranges.range(start..end) {
            out.push(PageRange::new(s, e.min(end)));
        }
        out
    }

    /// Whether any byte of `[start, end)` holds data.
    pub fn any_data(&self, start: u64, end: u64) -> bool {
        !self.data_in(start, end).is_empty()
    }

    /// Bytes of data in total.
    pub fn total(&self) -> u64 {
        self.ranges.iter().map(|(s, e)| e - s).sum()
    }

    pub fn ranges(&self) -> Vec<PageRange> {
        self.ranges
            .iter()
            .map(|(&s, &e)| PageRange::new(s, e))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: u64, e: u64) -> PageRange {
        PageRange::new(s, e)
    }

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut m = SparseMap::default();
        m.insert(1024, 2048);
        m.insert(0, 512);
        m.insert(512, 1024);
        m.insert(4096, 8192);
        assert_eq!(m.ranges(), vec![r(0, 2048), r(4096, 8192)]);
        m.insert(1000, 5000);
        assert_eq!(m.ranges(), vec![r(0, 8192)]);
        m.remove(512, 1024);
        m.remove(6000, 100_000);
        assert_eq!(m.ranges(), vec![r(0, 512), r(1024, 6000)]);
        assert_eq!(m.total(), 512 + 4976);
        assert_eq!(m.data_in(256, 2000), vec![r(256, 512), r(1024, 2000)]);
        assert!(m.data_in(512, 1024).is_empty());
        assert!(!m.any_data(6000, 7000));
    }

    #[test]
    fn matches_a_byte_model() {
        // Random inserts and removes against a plain bitmap of 512-byte pages.
        let mut m = SparseMap::default();
        let mut model = vec![false; 256];
        let mut x: u64 = 12345;
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let a = (x >> 33) % 256;
            let b = (a + (x >> 20) % 16 + 1).min(256);
            if x & 1 == 0 {
                m.insert(a * 512, b * 512);
                model[a as usize..b as usize]
                    .iter_mut()
                    .for_each(|v| *v = true);
            } else {
                m.remove(a * 512, b * 512);
                model[a as usize..b as usize]
                    .iter_mut()
                    .for_each(|v| *v = false);
            }
            for (i, &v) in model.iter().enumerate() {
                let i = i as u64;
                assert_eq!(m.any_data(i * 512, i * 512 + 512), v);
            }
        }
    }
}
