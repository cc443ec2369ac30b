//! Filling the disk cache ahead of the reads (`blobdrive warm`): which parts of
//! the drive to fetch, in what pieces, and the fetch itself.
//!
//! Only allocated pages are worth fetching (Get Page Ranges lists them; a hole
//! reads as zeros without a request), in offset order (nothing tells which are
//! hot), and no more chunks than the cache has slots: past that, each chunk
//! fetched would push out one fetched before it. A fill goes by the same rules
//! as a read's fetch: it registers as a fetch before it looks, so a write or
//! discard that lands while its bytes travel keeps them out
//! ([`super::index::Index::changed`]), and it stores only whole pieces.

use super::index::{CHUNK, PIECE};
use super::DiskCache;
use crate::azure::PageRange;
use crate::device::{DeviceError, MAX_RUN};

/// The most bytes one fill covers: one ranged read at most, aligned so that
/// fills never share a piece.
pub const UNIT: u64 = MAX_RUN;

/// One fill: whole pieces `start..end`, next to each other, holding
/// `allocated` bytes of allocated pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub start: u64,
    pub end: u64,
    pub allocated: u64,
}

/// What a warm-up does with a drive.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// In offset order.
    pub units: Vec<Unit>,
    /// Bytes of allocated pages on the drive.
    pub allocated: u64,
    /// Bytes of them left out: past the cache's slots, or in a last piece the
    /// drive's end cuts short (the cache holds whole pieces only).
    pub skipped: u64,
}

/// The fills that bring `ranges` (allocated pages, as Get Page Ranges lists
/// them) of a drive of `size` bytes into a cache of `slots` chunks: pieces
/// that hold any allocated byte, cut at [`UNIT`] boundaries and between
/// allocated runs (a hole between them is never fetched), up to the chunk
/// that would not fit.
pub fn plan(ranges: &[PageRange], size: u64, slots: u64) -> Plan {
    let mut sorted: Vec<(u64, u64)> = ranges
        .iter()
        .map(|r| (r.start, r.end.min(size)))
        .filter(|(s, e)| s < e)
        .collect();
    sorted.sort_unstable();
    let whole = size / PIECE * PIECE;
    let mut plan = Plan::default();
    let mut planned = 0;
    let (mut chunks, mut last_chunk) = (0u64, None::<u64>);
    let mut reach = 0; // bytes before it are counted already (overlaps)
    let mut full = false;
    for (s, e) in sorted {
        let s = s.max(reach);
        if s >= e {
            continue;
        }
        reach = e;
        plan.allocated += e - s;
        // One step per chunk the range crosses: each is a slot to count.
        let mut at = s;
        while at < e.min(whole) && !full {
            let chunk = at / CHUNK;
            let to = e.min(whole).min((chunk + 1) * CHUNK);
            if last_chunk != Some(chunk) {
                if chunks == slots {
                    full = true;
                    break;
                }
                chunks += 1;
                last_chunk = Some(chunk);
            }
            add_pieces(&mut plan.units, at, to);
            planned += to - at;
            at = to;
        }
    }
    plan.skipped = plan.allocated - planned;
    plan
}

/// Adds the pieces holding allocated bytes `s..e` (inside one chunk) to the
/// last unit when they continue it within its [`UNIT`], else as a new unit.
fn add_pieces(units: &mut Vec<Unit>, s: u64, e: u64) {
    let (ps, pe) = (s / PIECE * PIECE, e.div_ceil(PIECE) * PIECE);
    if let Some(u) = units.last_mut() {
        if ps <= u.end && ps / UNIT == u.start / UNIT {
            u.end = u.end.max(pe);
            u.allocated += e - s;
            return;
        }
    }
    units.push(Unit {
        start: ps,
        end: pe,
        allocated: e - s,
    });
}

/// What one fill did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    /// Bytes asked of the layer below.
    pub fetched: u64,
    /// Bytes the cache held already.
    pub held: u64,
}

impl DiskCache {
    /// Slots in all: the chunks the cache can hold at once.
    pub fn slots(&self) -> u64 {
        u64::from(self.lock().slots())
    }

    /// Bytes of `start..end` (whole pieces) the cache does not hold.
    pub fn missing_bytes(&self, start: u64, end: u64) -> u64 {
        let ix = self.lock();
        (start / PIECE..end / PIECE)
            .filter(|p| !ix.holds(*p))
            .count() as u64
            * PIECE
    }

    /// Brings whole pieces `start..end` into the cache: those it does not hold
    /// are fetched with `fetch` (a run of them at a time) and stored, unless a
    /// change of their bytes began or ended meanwhile; those it holds count as
    /// used. Fails when the cache is off or a fetch failed.
    pub fn fill<F>(&self, start: u64, end: u64, mut fetch: F) -> Result<Filled, DeviceError>
    where
        F: FnMut(u64, &mut [u8]) -> Result<(), DeviceError>,
    {
        debug_assert!(start.is_multiple_of(PIECE) && end.is_multiple_of(PIECE));
        self.check_on()?;
        let first = start / PIECE;
        let (epoch, held) = {
            let mut ix = self.lock();
            let epoch = ix.fetch_begins();
            let held: Vec<bool> = (first..end / PIECE).map(|p| ix.holds(p)).collect();
            for chunk in start / CHUNK..end.div_ceil(CHUNK) {
                ix.touch(chunk);
            }
            (epoch, held)
        };
        let mut filled = Filled {
            held: held.iter().filter(|h| **h).count() as u64 * PIECE,
            ..Filled::default()
        };
        let mut result = Ok(());
        let mut i = 0;
        while i < held.len() && result.is_ok() {
            if held[i] {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < held.len() && !held[j] {
                j += 1;
            }
            let at = (first + i as u64) * PIECE;
            let mut buf = vec![0u8; (j - i) * PIECE as usize];
            result = fetch(at, &mut buf);
            if result.is_ok() {
                filled.fetched += buf.len() as u64;
                self.store(at, &buf, epoch);
            }
            i = j;
        }
        self.lock().fetch_done(epoch);
        result?;
        self.check_on()?;
        Ok(filled)
    }

    /// An error saying why the cache is off, if it is.
    fn check_on(&self) -> Result<(), DeviceError> {
        if self.is_on() {
            return Ok(());
        }
        let why = self
            .off_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "off".into());
        Err(DeviceError::Io(format!("the disk cache is off: {why}")))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::super::tests::{parent, state};
    use super::*;

    const MIB: u64 = 1 << 20;

    fn r(s: u64, e: u64) -> PageRange {
        PageRange::new(s, e)
    }

    fn unit(start: u64, end: u64, allocated: u64) -> Unit {
        Unit {
            start,
            end,
            allocated,
        }
    }

    #[test]
    fn a_plan_covers_the_allocated_pieces_only_in_units_and_up_to_the_slots() {
        // Two runs in one 4 MiB window (the hole between them is left out), a
        // run across a window's end, and a page alone.
        let ranges = [
            r(0, 100 * 1024),
            r(MIB, MIB + 4096),
            r(3 * MIB, 5 * MIB),
            r(9 * MIB + 512, 9 * MIB + 1024),
        ];
        let p = plan(&ranges, 64 * MIB, 100);
        assert_eq!(
            p.units,
            vec![
                unit(0, 2 * PIECE, 100 * 1024),
                unit(MIB, MIB + PIECE, 4096),
                unit(3 * MIB, 4 * MIB, MIB),
                unit(4 * MIB, 5 * MIB, MIB),
                unit(9 * MIB, 9 * MIB + PIECE, 512),
            ]
        );
        assert_eq!(p.allocated, 100 * 1024 + 4096 + 2 * MIB + 512);
        assert_eq!(p.skipped, 0);
        // Four slots: chunks 0, 1, 3 and 4; the rest is skipped.
        let p = plan(&ranges, 64 * MIB, 4);
        assert_eq!(p.units.len(), 4);
        assert_eq!(p.units[3], unit(4 * MIB, 5 * MIB, MIB));
        assert_eq!(p.skipped, 512);
        let p = plan(&ranges, 64 * MIB, 3);
        assert_eq!(p.units.last(), Some(&unit(3 * MIB, 4 * MIB, MIB)));
        assert_eq!(p.skipped, MIB + 512);
        // Overlapping ranges count once; a last piece the drive's end cuts
        // short is skipped; nothing past the end is planned.
        let size = 8 * MIB + 4096;
        let p = plan(
            &[r(0, MIB), r(MIB / 2, MIB), r(8 * MIB, 9 * MIB)],
            size,
            100,
        );
        assert_eq!(p.units, vec![unit(0, MIB, MIB)]);
        assert_eq!((p.allocated, p.skipped), (MIB + 4096, 4096));
        assert_eq!(plan(&[], size, 100), Plan::default());
    }

    #[test]
    fn a_fill_fetches_only_what_is_missing_and_a_second_one_nothing() {
        let dir = parent("fill");
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        let asked = Cell::new(Vec::new());
        let fetch = |o: u64, b: &mut [u8]| {
            let mut v = asked.take();
            v.push((o, b.len() as u64));
            asked.set(v);
            b.iter_mut()
                .enumerate()
                .for_each(|(k, x)| *x = ((o + k as u64) % 251) as u8);
            Ok(())
        };
        // A read brings in pieces 2 and 3 first.
        let mut buf = vec![0u8; 2 * PIECE as usize];
        t.read(2 * PIECE, &mut buf, fetch).unwrap();
        asked.take();
        let f = t.fill(0, CHUNK, fetch).unwrap();
        assert_eq!(
            asked.take(),
            vec![(0, 2 * PIECE), (4 * PIECE, CHUNK - 4 * PIECE)]
        );
        assert_eq!(
            f,
            Filled {
                fetched: CHUNK - 2 * PIECE,
                held: 2 * PIECE
            }
        );
        let f = t.fill(0, CHUNK, fetch).unwrap();
        assert!(asked.take().is_empty());
        assert_eq!(
            f,
            Filled {
                fetched: 0,
                held: CHUNK
            }
        );
        assert_eq!(t.missing_bytes(0, 2 * CHUNK), CHUNK);
        // What was filled is served as it was fetched.
        let mut back = vec![0u8; CHUNK as usize];
        t.read(0, &mut back, |_, _| panic!("served from the disk cache"))
            .unwrap();
        assert!(back.iter().enumerate().all(|(k, x)| *x == (k % 251) as u8));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_change_during_a_fill_keeps_its_bytes_out_and_a_failed_fetch_says_so() {
        let dir = parent("fill-race");
        let t = DiskCache::open(&dir, "d", 16 * CHUNK, &state("a"), true).unwrap();
        // A write of piece 1 begins and ends while the fill's bytes travel.
        t.fill(0, 4 * PIECE, |_, b| {
            t.change_begins(PIECE, 2 * PIECE);
            t.change_ends(PIECE, 2 * PIECE, None);
            b.fill(1);
            Ok(())
        })
        .unwrap();
        assert_eq!(t.missing_bytes(0, 4 * PIECE), PIECE);
        let e = t
            .fill(0, 4 * PIECE, |_, _| {
                Err(DeviceError::Io("no answer".into()))
            })
            .unwrap_err();
        assert_eq!(e, DeviceError::Io("no answer".into()));
        assert_eq!(t.missing_bytes(0, 4 * PIECE), PIECE);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
