//! What the disk cache keeps: fetched and written bytes stored in whole pieces,
//! and the changes (writes and discards) that make it forget.

use std::sync::atomic::Ordering::Relaxed;

use super::index::{Index, CHUNK, PIECE};
use super::DiskCache;

impl DiskCache {
    /// Stores whole pieces (`start` and `data.len()` multiples of [`PIECE`]),
    /// leaving out any a change touched after `since` (a registered fetch's
    /// epoch): checked before the bytes go to the data file and again before
    /// they count as held.
    /// [`Self::store`] of the whole pieces within `data` (the bytes from
    /// `start`): the tier keeps pieces whole, and the ragged ends of a write or
    /// a fetch are left out.
    pub(super) fn store_whole_pieces(&self, start: u64, data: &[u8], since: u64) {
        let end = start + data.len() as u64;
        let ps = start.div_ceil(PIECE) * PIECE;
        let pe = end / PIECE * PIECE;
        if ps < pe {
            self.store(
                ps,
                &data[(ps - start) as usize..(pe - start) as usize],
                since,
            );
        }
    }

    pub(super) fn store(&self, start: u64, data: &[u8], since: u64) {
        use std::os::unix::fs::FileExt;
        if !self.is_on() {
            return;
        }
        let end = start + data.len() as u64;
        let unchanged = |ix: &Index, i: usize, chunk: u64| {
            let s = chunk * CHUNK + i as u64 * PIECE;
            !ix.changed_since(since, s, s + PIECE)
        };
        let mut pos = start;
        while pos < end {
            let chunk = pos / CHUNK;
            let ce = ((chunk + 1) * CHUNK).min(end);
            let first = ((pos % CHUNK) / PIECE) as usize;
            let last = first + ((ce - pos) / PIECE) as usize;
            let reserved = {
                let mut ix = self.lock();
                let wanted: Vec<usize> = (first..last)
                    .filter(|&i| unchanged(&ix, i, chunk))
                    .collect();
                if wanted.is_empty() {
                    None
                } else {
                    let slot = ix.reserve(chunk);
                    if let Some(_s) = slot {
                        ix.clear(chunk, wanted.iter().fold(0u16, |m, i| m | 1 << i));
                    }
                    slot.map(|s| (s, wanted))
                }
            };
            if let Some((slot, wanted)) = reserved {
                // Pieces i..j of the chunk, as bytes of `data`.
                let pieces = |i: usize, j: usize| {
                    let s = (chunk * CHUNK + i as u64 * PIECE - start) as usize;
                    &data[s..s + (j - i) * PIECE as usize]
                };
                let mut written = Ok(());
                let mut crcs = Vec::with_capacity(wanted.len());
                let mut k = 0;
                while k < wanted.len() && written.is_ok() {
                    // One write per run of adjacent pieces.
                    let mut n = 1;
                    while k + n < wanted.len() && wanted[k + n] == wanted[k] + n {
                        n += 1;
                    }
                    let (i, j) = (wanted[k], wanted[k] + n);
                    let at = u64::from(slot) * CHUNK + i as u64 * PIECE;
                    written = self.files.data.write_all_at(pieces(i, j), at);
                    if written.is_ok() {
                        crcs.extend((i..j).map(|p| (p, crc32c::crc32c(pieces(p, p + 1)))));
                    }
                    k += n;
                }
                {
                    let mut ix = self.lock();
                    if written.is_ok() {
                        for (i, crc) in crcs {
                            if unchanged(&ix, i, chunk) {
                                ix.set_valid(chunk, slot, i, crc);
                            }
                        }
                    }
                    ix.unpin(slot);
                }
                match written {
                    Ok(()) => {
                        self.stored_bytes
                            .fetch_add(wanted.len() as u64 * PIECE, Relaxed);
                    }
                    Err(e) => {
                        let why = match e.raw_os_error() {
                            Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
                                format!("its filesystem is full ({e})")
                            }
                            _ => format!("writing {}/data: {e}", self.shown.display()),
                        };
                        self.off(why);
                        return;
                    }
                }
            }
            pos = ce;
        }
        self.check_removed();
    }

    /// A write or discard of `start..end` is about to be sent: the tier forgets
    /// what it held there.
    pub fn change_begins(&self, start: u64, end: u64) {
        if self.is_on() {
            self.lock().changed(start, end);
        }
    }

    /// A write or discard of `start..end` was answered. `written`: the bytes a
    /// successful write put there (whole pieces of it are stored); `None` for a
    /// discard or a failed write, whose pieces are forgotten again.
    pub fn change_ends(&self, start: u64, end: u64, written: Option<&[u8]>) {
        if !self.is_on() {
            return;
        }
        let since = {
            let mut ix = self.lock();
            ix.changed(start, end);
            ix.fetch_begins()
        };
        if let Some(data) = written {
            self.store_whole_pieces(start, data, since);
        }
        self.lock().fetch_done(since);
    }
}
