//! The blob a state holds, rebuilt from the recorded requests, and the disk a
//! mount of it would present.
//!
//! Kept in pieces of 64 KiB, a piece never written (or cleared whole) being
//! none: a filesystem's discards clear most of the disk again and again, and
//! states are rebuilt by the hundred in an unoptimized build.

use blobdrive::vhd::{Footer, FOOTER_SIZE};

use super::model::Placed;
use crate::recorder::{Op, Record};

const PIECE: usize = 64 << 10;

/// Bytes in pieces, zeros where a piece is none.
#[derive(Clone, Default)]
pub struct Pieces {
    len: usize,
    pieces: Vec<Option<Box<[u8]>>>,
}

impl Pieces {
    /// The size of a piece: [`Pieces::written`] gives them at multiples of it.
    pub const PIECE: usize = PIECE;

    /// `bytes` in pieces.
    pub fn from_bytes(bytes: &[u8]) -> Pieces {
        let mut p = Pieces::default();
        p.set_len(bytes.len());
        for (i, piece) in bytes.chunks(PIECE).enumerate() {
            if piece != &[0u8; PIECE][..piece.len()] {
                p.write(i * PIECE, piece);
            }
        }
        p
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Cuts or grows (with zeros) to `len` bytes.
    fn set_len(&mut self, len: usize) {
        if len < self.len {
            let cut = len % PIECE;
            if let Some(Some(p)) = self.pieces.get_mut(len / PIECE).filter(|_| cut > 0) {
                p[cut..].fill(0);
            }
        }
        self.pieces.resize(len.div_ceil(PIECE), None);
        self.len = len;
    }

    /// Writes `data` at `at` (inside the length).
    fn write(&mut self, at: usize, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let (i, off) = ((at + done) / PIECE, (at + done) % PIECE);
            let n = (PIECE - off).min(data.len() - done);
            let p = self.pieces[i].get_or_insert_with(|| vec![0u8; PIECE].into_boxed_slice());
            p[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Zeros `start..end` (inside the length).
    fn clear(&mut self, start: usize, end: usize) {
        let mut at = start;
        while at < end {
            let (i, off) = (at / PIECE, at % PIECE);
            let n = (PIECE - off).min(end - at);
            if n == PIECE {
                self.pieces[i] = None;
            } else if let Some(p) = &mut self.pieces[i] {
                p[off..off + n].copy_from_slice(&[0u8; PIECE][..n]);
            }
            at += n;
        }
    }

    /// A copy of `start..end` (cut at the length).
    pub fn read(&self, start: usize, end: usize) -> Vec<u8> {
        let end = end.min(self.len);
        let mut out = vec![0u8; end.saturating_sub(start)];
        let mut at = start;
        while at < end {
            let (i, off) = (at / PIECE, at % PIECE);
            let n = (PIECE - off).min(end - at);
            if let Some(p) = &self.pieces[i] {
                out[at - start..at - start + n].copy_from_slice(&p[off..off + n]);
            }
            at += n;
        }
        out
    }

    /// All the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.read(0, self.len)
    }

    /// The pieces that are not all zeros, with their offsets.
    pub fn written(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let zeros = &[0u8; PIECE];
        self.pieces.iter().enumerate().filter_map(move |(i, p)| {
            let p = p.as_deref()?;
            let n = PIECE.min(self.len - i * PIECE);
            (p[..n] != zeros[..n]).then_some(((i * PIECE) as u64, &p[..n]))
        })
    }
}

/// A page blob as the requests left it.
pub struct Blob {
    pub bytes: Pieces,
    /// blobdrive's resize mark (FROM:TO) in its metadata.
    pub resize: Option<(u64, u64)>,
}

impl Blob {
    /// The blob left by carrying out `ops` (in that order), from nothing.
    pub fn build(records: &[Record], ops: &[Placed]) -> Blob {
        let mut b = Blob {
            bytes: Pieces::default(),
            resize: None,
        };
        for p in ops {
            b.apply(&records[p.idx]);
        }
        b
    }

    /// Carries out one request as the service does. A write beyond the end is
    /// refused by the service: a state that places one there leaves it out.
    fn apply(&mut self, r: &Record) {
        let len = self.bytes.len() as u64;
        match r.op {
            Op::Create { len } => {
                self.bytes = Pieces::default();
                self.bytes.set_len(len as usize);
                self.resize = None;
            }
            Op::Put { start, end } if end <= len && r.body.len() as u64 == end - start => {
                self.bytes.write(start as usize, &r.body);
            }
            Op::Clear { start, end } if end <= len => {
                self.bytes.clear(start as usize, end as usize)
            }
            Op::Length { len } => self.bytes.set_len(len as usize),
            Op::Metadata { resize } => self.resize = resize,
            Op::Delete => self.bytes = Pieces::default(),
            _ => {}
        }
    }

    /// The disk a mount would present: the bytes before the footer, which must
    /// be a fixed VHD's for the blob's length. With a resize under way (its mark
    /// set), the disk after `blobdrive resize` completes it, which is what the
    /// mount asks for: the new size, the grown part and the old footer's page
    /// reading as zeros until written.
    pub fn into_disk(mut self) -> Result<Pieces, String> {
        if let Some((from, to)) = self.resize {
            self.bytes.set_len(to as usize);
            let old_end = (from + FOOTER_SIZE).min(to) as usize;
            if (from as usize) < old_end {
                self.bytes.clear(from as usize, old_end);
            }
            return Ok(self.bytes);
        }
        let len = self.bytes.len();
        if len < FOOTER_SIZE as usize {
            return Err(format!("the blob is {len} bytes long: no drive"));
        }
        let footer = Footer::parse_fixed_for_blob(&self.bytes.read(len - 512, len), len as u64)
            .map_err(|e| format!("the drive would not mount: its footer: {e}"))?;
        self.bytes.set_len(footer.current_size as usize);
        Ok(self.bytes)
    }

    /// What tells this blob apart from another whose requests differ only in
    /// those writing in `ranges`: its length, resize mark and the bytes there.
    /// `None` (never the same) when the ranges are too large to keep.
    pub fn key(&self, ranges: &[(u64, u64)]) -> Option<Key> {
        let total: u64 = ranges.iter().map(|(a, b)| b - a).sum();
        if total > 32 << 20 {
            return None;
        }
        let mut bytes = Vec::with_capacity(total as usize);
        for &(a, b) in ranges {
            bytes.extend(self.bytes.read(a as usize, b as usize));
        }
        Some((self.bytes.len(), self.resize, bytes))
    }
}

/// See [`Blob::key`].
pub type Key = (usize, Option<(u64, u64)>, Vec<u8>);
