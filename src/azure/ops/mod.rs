//! The REST operations, one file per thing they act on: [`container`] (a container),
//! [`blob`] (the blob as a whole, and the [`BlobClient`] type), [`pages`] (its
//! pages; [`walk`], its ranges a page at a time), [`lease`] (its lease),
//! [`snapshot`] (its snapshots) and [`fence`] (the sequence number that fences
//! abandoned writes). Each file adds
//! its own `impl` block; all of them send through [`super::pipeline`].

pub mod blob;
pub mod container;
pub mod fence;
pub mod lease;
pub mod pages;
pub mod snapshot;
pub mod walk;

pub use blob::{BlobClient, BlobProperties, DeleteSnapshots, PAGE};
pub use container::ContainerClient;
pub use fence::WriteFence;
pub use pages::{PageDiff, SegmentPlan, MAX_PUT_PAGE};
pub use walk::PageWalk;

/// Bounds one paged listing (Get Page Ranges, List Blobs): how many pages may be
/// followed and how many entries gathered, and no `NextMarker` may come twice.
/// The service's markers always move on; an endpoint whose do not (hostile, or
/// broken) would otherwise be followed for ever, gathering without end.
pub(crate) struct PageGuard {
    op: crate::azure::Op,
    target: String,
    max_pages: usize,
    max_entries: usize,
    pages: usize,
    entries: usize,
    /// Hashes of the markers seen (not the markers: an endpoint chooses their size).
    seen: std::collections::HashSet<u64>,
}

impl PageGuard {
    pub(crate) fn new(
        op: crate::azure::Op,
        target: String,
        max_pages: usize,
        max_entries: usize,
    ) -> PageGuard {
        PageGuard {
            op,
            target,
            max_pages,
            max_entries,
            pages: 0,
            entries: 0,
            seen: std::collections::HashSet::new(),
        }
    }

    /// Counts a page of `entries` whose answer named `next` to follow; fails when
    /// a bound is passed or the marker came before.
    pub(crate) fn page(
        &mut self,
        entries: usize,
        next: Option<&str>,
    ) -> Result<(), crate::azure::AzureError> {
        use std::hash::{Hash, Hasher};
        self.pages += 1;
        self.entries += entries;
        let fail = |detail: String| crate::azure::AzureError::Protocol {
            op: self.op,
            target: self.target.clone(),
            detail,
        };
        if self.entries > self.max_entries {
            return Err(fail(format!(
                "the listing passed {} entries, more than this client gathers in one",
                self.max_entries
            )));
        }
        let Some(next) = next else {
            return Ok(());
        };
        if self.pages >= self.max_pages {
            return Err(fail(format!(
                "the listing went on past {} pages (NextMarker after NextMarker)",
                self.max_pages
            )));
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        next.hash(&mut h);
        if !self.seen.insert(h.finish()) {
            return Err(fail(
                "the listing's NextMarker repeats an earlier one: it would never end".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod guard_tests {
    use super::PageGuard;
    use crate::azure::Op;

    #[test]
    fn a_listing_ends_on_a_repeated_marker_or_past_its_bounds() {
        let mut g = PageGuard::new(Op::ListBlobs, "c".into(), 3, 100);
        g.page(10, Some("a")).unwrap();
        assert!(g
            .page(10, Some("a"))
            .unwrap_err()
            .to_string()
            .contains("repeats"));
        let mut g = PageGuard::new(Op::ListBlobs, "c".into(), 3, 100);
        g.page(1, Some("a")).unwrap();
        g.page(1, Some("b")).unwrap();
        assert!(g
            .page(1, Some("c"))
            .unwrap_err()
            .to_string()
            .contains("3 pages"));
        let mut g = PageGuard::new(Op::GetPageRanges, "c".into(), 10, 100);
        g.page(60, Some("a")).unwrap();
        assert!(g
            .page(60, None)
            .unwrap_err()
            .to_string()
            .contains("100 entries"));
        let mut g = PageGuard::new(Op::GetPageRanges, "c".into(), 10, 100);
        g.page(60, None).unwrap();
    }
}
