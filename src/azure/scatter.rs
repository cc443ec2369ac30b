//! Where a streamed response body goes: buffers filled one after another, as if
//! they were one.
//!
//! A ranged read of 16 MiB lands straight in the cache's 64 KiB blocks, which are
//! not next to each other in memory: without this, the body would go into one
//! large buffer first and be copied into the blocks after (a fresh 16 MiB buffer
//! per read, or a pool of them beside the cache).

/// Consecutive buffers (`parts`) that a body fills in order, each to its end
/// before the next.
pub struct Scatter<'a, 'b> {
    parts: &'a mut [&'b mut [u8]],
    /// The part being filled, and how far.
    part: usize,
    at: usize,
    filled: usize,
    capacity: usize,
}

impl<'a, 'b> Scatter<'a, 'b> {
    pub fn new(parts: &'a mut [&'b mut [u8]]) -> Self {
        let capacity = parts.iter().map(|p| p.len()).sum();
        Scatter {
            parts,
            part: 0,
            at: 0,
            filled: 0,
            capacity,
        }
    }

    /// Bytes all the parts hold together.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes written since the last [`Self::restart`].
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// Starts over from the first byte (a retried request's body replaces the
    /// failed attempt's).
    pub fn restart(&mut self) {
        self.part = 0;
        self.at = 0;
        self.filled = 0;
    }

    /// The CRC64 (Azure's, see [`super::crc64`]) of the bytes filled.
    pub fn crc64(&self) -> u64 {
        let mut left = self.filled;
        super::crc64::of_parts(self.parts.iter().map(|p| {
            let n = p.len().min(left);
            left -= n;
            &p[..n]
        }))
    }

    /// Appends `chunk` after what is filled. `false`, with nothing written, if it
    /// does not fit (an answer longer than asked for).
    pub fn put(&mut self, mut chunk: &[u8]) -> bool {
        if chunk.len() > self.capacity - self.filled {
            return false;
        }
        self.filled += chunk.len();
        while !chunk.is_empty() {
            let part = &mut self.parts[self.part];
            let n = chunk.len().min(part.len() - self.at);
            part[self.at..self.at + n].copy_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            self.at += n;
            if self.at == part.len() {
                self.part += 1;
                self.at = 0;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fill_the_parts_in_order_across_their_edges() {
        let (mut a, mut b, mut c) = ([0u8; 3], [0u8; 0], [0u8; 5]);
        let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
        let mut s = Scatter::new(&mut parts);
        assert_eq!(s.capacity(), 8);
        assert!(s.put(&[1, 2]));
        assert!(s.put(&[3, 4, 5]));
        assert!(s.put(&[]));
        assert!(s.put(&[6, 7, 8]));
        assert_eq!(s.filled(), 8);
        assert!(!s.put(&[9]), "past the end");
        assert_eq!((a, c), ([1, 2, 3], [4, 5, 6, 7, 8]));
    }

    #[test]
    fn the_crc64_covers_what_is_filled_across_the_parts() {
        let (mut a, mut b) = ([0u8; 3], [0u8; 5]);
        let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b];
        let mut s = Scatter::new(&mut parts);
        assert!(s.put(b"Hello"));
        assert_eq!(s.crc64(), crate::azure::crc64::of(b"Hello"));
        assert!(s.put(b" Az"));
        assert_eq!(s.crc64(), crate::azure::crc64::of(b"Hello Az"));
    }

    #[test]
    fn a_chunk_too_long_writes_nothing_and_restart_starts_over() {
        let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
        let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b];
        let mut s = Scatter::new(&mut parts);
        assert!(s.put(&[1, 2, 3]));
        assert!(!s.put(&[4, 5]));
        assert_eq!(s.filled(), 3);
        s.restart();
        assert_eq!(s.filled(), 0);
        assert!(s.put(&[7, 7, 7, 7]));
        assert_eq!((a, b), ([7, 7], [7, 7]));
    }
}
