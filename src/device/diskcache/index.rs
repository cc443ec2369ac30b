//! Which parts of the drive the disk cache holds, where in its data file, and how
//! recently each was used; and the record of changes that keeps a fetch which
//! raced a write from storing what the write replaced.
//!
//! Space is handed out in chunks of [`CHUNK`] bytes of the drive (one slot of the
//! data file each), so the index stays small: one entry per MiB cached, about
//! 150 bytes of memory, 150 MiB for a 1 TiB cache. Within a chunk each
//! [`PIECE`] (the memory cache's block) is valid on its own and carries its own
//! crc32c, so a read of one block never needs its neighbours.

use std::collections::{BTreeMap, VecDeque};

use lru::LruCache;

/// Bytes of the drive per slot of the data file.
pub const CHUNK: u64 = 1 << 20;
/// Bytes of the drive valid (and checksummed) on their own.
pub const PIECE: u64 = 64 << 10;
/// Pieces per chunk.
pub const PIECES: usize = (CHUNK / PIECE) as usize;

/// One cached chunk: its slot, which pieces hold data, and each piece's crc32c.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub slot: u32,
    pub valid: u16,
    pub crc: [u32; PIECES],
}

/// The chunks cached, least recently used first out.
pub struct Index {
    chunks: LruCache<u64, Chunk>,
    free: Vec<u32>,
    /// Per slot: I/O on it under way (pinned slots are never handed to another
    /// chunk, so a read or store in flight never sees another chunk's bytes).
    pins: Vec<u16>,
    pub evictions: u64,
    /// Counts every change of the drive's contents (a write or discard beginning
    /// or ending).
    epoch: u64,
    /// Changes since the oldest fetch still under way began: (epoch, start, end).
    changes: VecDeque<(u64, u64, u64)>,
    /// Epochs at which the fetches under way began, with how many began then.
    fetches: BTreeMap<u64, usize>,
}

impl Index {
    /// An empty index of `slots` slots.
    pub fn new(slots: u32) -> Index {
        Index {
            chunks: LruCache::unbounded(),
            free: (0..slots).rev().collect(),
            pins: vec![0; slots as usize],
            evictions: 0,
            epoch: 0,
            changes: VecDeque::new(),
            fetches: BTreeMap::new(),
        }
    }

    /// An index of `slots` slots holding `entries` (least recently used first),
    /// as a clean unmount left them. Entries naming a slot outside `slots`, a slot
    /// named twice or a chunk named twice are left out.
    pub fn with_entries(slots: u32, entries: Vec<(u64, Chunk)>) -> Index {
        let mut ix = Index::new(slots);
        let mut used = vec![false; slots as usize];
        for (chunk, c) in entries {
            let Some(u) = used.get_mut(c.slot as usize) else {
                continue;
            };
            if *u || ix.chunks.contains(&chunk) {
                continue;
            }
            *u = true;
            ix.chunks.put(chunk, c);
        }
        ix.free = (0..slots).rev().filter(|s| !used[*s as usize]).collect();
        ix
    }

    /// Every entry, least recently used first (the order [`Self::with_entries`]
    /// takes back).
    pub fn entries(&self) -> Vec<(u64, Chunk)> {
        self.chunks
            .iter()
            .rev()
            .filter(|(_, c)| c.valid != 0)
            .map(|(k, c)| (*k, c.clone()))
            .collect()
    }

    /// Chunks cached.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes of valid pieces.
    pub fn bytes(&self) -> u64 {
        self.chunks
            .iter()
            .map(|(_, c)| u64::from(c.valid.count_ones()) * PIECE)
            .sum()
    }

    /// The slot and crc of piece `piece` (of the drive) if it is cached, marking
    /// its chunk used and pinning the slot (undo with [`Self::unpin`]).
    pub fn lookup(&mut self, piece: u64) -> Option<(u32, u32)> {
        let (chunk, i) = split(piece);
        let c = self.chunks.get(&chunk)?;
        if c.valid & (1 << i) == 0 {
            return None;
        }
        let found = (c.slot, c.crc[i]);
        self.pins[found.0 as usize] += 1;
        Some(found)
    }

    /// Whether piece `piece` is held, without counting it as used.
    pub fn holds(&self, piece: u64) -> bool {
        let (chunk, i) = split(piece);
        self.chunks
            .peek(&chunk)
            .is_some_and(|c| c.valid & (1 << i) != 0)
    }

    /// Counts `chunk` as just used, if it is cached.
    pub fn touch(&mut self, chunk: u64) {
        self.chunks.promote(&chunk);
    }

    /// Slots in all.
    pub fn slots(&self) -> u32 {
        self.pins.len() as u32
    }

    pub fn unpin(&mut self, slot: u32) {
        let p = &mut self.pins[slot as usize];
        *p = p.saturating_sub(1);
    }

    /// The slot for `chunk`, pinned: its own, or a free one, or the one of the
    /// least recently used chunk no I/O is under way on (evicted). `None` when
    /// every slot is pinned.
    pub fn reserve(&mut self, chunk: u64) -> Option<u32> {
        let slot = if let Some(c) = self.chunks.get(&chunk) {
            c.slot
        } else {
            let slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    let victim = self
                        .chunks
                        .iter()
                        .rev()
                        .find(|(_, c)| self.pins[c.slot as usize] == 0)
                        .map(|(k, _)| *k)?;
                    let gone = self.chunks.pop(&victim).expect("found");
                    if gone.valid != 0 {
                        self.evictions += 1;
                    }
                    gone.slot
                }
            };
            self.chunks.put(
                chunk,
                Chunk {
                    slot,
                    valid: 0,
                    crc: [0; PIECES],
                },
            );
            slot
        };
        self.pins[slot as usize] += 1;
        Some(slot)
    }

    /// Marks the pieces `mask` of `chunk` as about to be overwritten in its slot.
    pub fn clear(&mut self, chunk: u64, mask: u16) {
        if let Some(c) = self.chunks.peek_mut(&chunk) {
            c.valid &= !mask;
        }
    }

    /// Marks piece `i` of `chunk` valid with `crc`, if `chunk` still has `slot`.
    pub fn set_valid(&mut self, chunk: u64, slot: u32, i: usize, crc: u32) {
        if let Some(c) = self.chunks.peek_mut(&chunk) {
            if c.slot == slot {
                c.valid |= 1 << i;
                c.crc[i] = crc;
            }
        }
    }

    /// Forgets piece `piece` (its bytes failed their checksum).
    pub fn drop_piece(&mut self, piece: u64) {
        let (chunk, i) = split(piece);
        self.clear(chunk, 1 << i);
    }

    /// Records a change of the drive's bytes in `start..end` (a write or discard
    /// beginning or ending): every piece it touches is forgotten, and no fetch
    /// that began before it may store those pieces. Returns its epoch.
    pub fn changed(&mut self, start: u64, end: u64) -> u64 {
        self.epoch += 1;
        if !self.fetches.is_empty() {
            self.changes.push_back((self.epoch, start, end));
        }
        if start < end {
            let first = start / PIECE;
            let last = (end - 1) / PIECE;
            for chunk in first / PIECES as u64..=last / PIECES as u64 {
                let lo = (first.max(chunk * PIECES as u64) - chunk * PIECES as u64) as u32;
                let hi = (last.min(chunk * PIECES as u64 + PIECES as u64 - 1)
                    - chunk * PIECES as u64) as u32;
                let mask = (((1u32 << (hi + 1)) - 1) & !((1u32 << lo) - 1)) as u16;
                self.clear(chunk, mask);
            }
        }
        self.epoch
    }

    /// Registers a fetch beginning now; returns its epoch, to hand to
    /// [`Self::changed_since`] and [`Self::fetch_done`].
    pub fn fetch_begins(&mut self) -> u64 {
        *self.fetches.entry(self.epoch).or_default() += 1;
        self.epoch
    }

    /// A fetch that began at `epoch` is over; changes no fetch under way can
    /// need are forgotten.
    pub fn fetch_done(&mut self, epoch: u64) {
        if let Some(n) = self.fetches.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                self.fetches.remove(&epoch);
            }
        }
        match self.fetches.keys().next() {
            None => self.changes.clear(),
            Some(&oldest) => {
                while self.changes.front().is_some_and(|c| c.0 <= oldest) {
                    self.changes.pop_front();
                }
            }
        }
    }

    /// Whether the bytes in `start..end` changed after `epoch`. Only for an epoch
    /// of a fetch still registered, or the current epoch.
    pub fn changed_since(&self, epoch: u64, start: u64, end: u64) -> bool {
        self.changes
            .iter()
            .any(|&(e, s, x)| e > epoch && s < end && start < x)
    }

    /// Forgets everything (the tier is turned off).
    pub fn clear_all(&mut self) {
        let slots = self.pins.len() as u32;
        let pins = std::mem::take(&mut self.pins);
        *self = Index {
            pins,
            evictions: self.evictions,
            epoch: self.epoch,
            changes: std::mem::take(&mut self.changes),
            fetches: std::mem::take(&mut self.fetches),
            ..Index::new(slots)
        };
    }
}

/// (chunk, piece within the chunk) of piece number `piece`.
fn split(piece: u64) -> (u64, usize) {
    (piece / PIECES as u64, (piece % PIECES as u64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_unpinned_chunk_is_evicted() {
        let mut ix = Index::new(2);
        let a = ix.reserve(0).unwrap();
        ix.set_valid(0, a, 0, 7);
        ix.unpin(a);
        let b = ix.reserve(5).unwrap();
        ix.set_valid(5, b, 1, 9);
        ix.unpin(b);
        // Chunk 0 used again: chunk 5 is the least recent now.
        assert_eq!(ix.lookup(0), Some((a, 7)));
        ix.unpin(a);
        let c = ix.reserve(9).unwrap();
        assert_eq!(c, b);
        assert_eq!(ix.evictions, 1);
        assert_eq!(ix.lookup(5 * PIECES as u64 + 1), None);
        // Both slots pinned: nothing can be reserved.
        let _ = ix.lookup(0).unwrap();
        assert_eq!(ix.reserve(11), None);
    }

    #[test]
    fn a_change_forgets_every_piece_it_touches_and_stops_older_fetches() {
        let mut ix = Index::new(4);
        let s = ix.reserve(1).unwrap();
        for i in 0..PIECES {
            ix.set_valid(1, s, i, i as u32);
        }
        ix.unpin(s);
        let fetch = ix.fetch_begins();
        // One byte into piece 3 and the first byte of piece 5.
        ix.changed(CHUNK + 3 * PIECE + 100, CHUNK + 5 * PIECE + 1);
        let valid: Vec<bool> = (0..PIECES as u64)
            .map(|i| {
                let hit = ix.lookup(PIECES as u64 + i);
                if hit.is_some() {
                    ix.unpin(s);
                }
                hit.is_some()
            })
            .collect();
        let expect: Vec<bool> = (0..PIECES).map(|i| !(3..=5).contains(&i)).collect();
        assert_eq!(valid, expect);
        assert!(ix.changed_since(fetch, CHUNK + 4 * PIECE, CHUNK + 5 * PIECE));
        assert!(!ix.changed_since(fetch, CHUNK + 6 * PIECE, CHUNK + 7 * PIECE));
        let later = ix.fetch_begins();
        assert!(!ix.changed_since(later, CHUNK, 2 * CHUNK));
        ix.fetch_done(fetch);
        ix.fetch_done(later);
        assert!(ix.changes.is_empty());
    }

    #[test]
    fn entries_come_back_in_the_same_order_and_bad_ones_are_left_out() {
        let mut ix = Index::new(3);
        for chunk in [4, 2, 8] {
            let s = ix.reserve(chunk).unwrap();
            ix.set_valid(chunk, s, 0, chunk as u32);
            ix.unpin(s);
        }
        let entries = ix.entries();
        assert_eq!(
            entries.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![4, 2, 8]
        );
        let back = Index::with_entries(3, entries.clone());
        assert_eq!(back.entries(), entries);
        // Fewer slots now: the entry in slot 2 goes.
        let fewer = Index::with_entries(2, entries.clone());
        assert_eq!(fewer.len(), 2);
        let mut twice = entries.clone();
        twice.push(entries[0].clone());
        assert_eq!(Index::with_entries(3, twice).len(), 3);
    }
}
