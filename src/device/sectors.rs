//! Sector masks of one 64 KiB cache block (bit `i` is the 512-byte sector `i`), and
//! the gap bridging that lets a flush send scattered dirty sectors as few runs.
//!
//! Every separate run of dirty sectors costs one Put Page call, whatever its size,
//! and a call costs far more than the bytes it carries: here the 4 KiB Put Page rate
//! is a few hundred calls per second while a 4 MiB call carries a megabyte in a few
//! milliseconds. Random 4 KiB writes over a file leave dirty pages with clean pages
//! between them, and the cache usually holds those clean pages too (the file was
//! written or read through it). Re-sending such a clean gap joins two runs into one:
//! the blob already holds those very bytes, so writing them again changes nothing
//! but the number of calls. Only gaps the cache holds in full and that are data on
//! the blob (not holes, which must stay unallocated) are bridged.

/// Sectors per block.
pub const SECTORS: u32 = 128;

/// Sectors `[a, b)` as a mask.
pub fn mask(a: u64, b: u64) -> u128 {
    if b <= a {
        0
    } else if b - a >= 128 {
        u128::MAX << a
    } else {
        ((1u128 << (b - a)) - 1) << a
    }
}

/// The sectors to send for a block with `dirty` sectors: the dirty ones, plus every
/// gap between two of them that lies wholly within `bridgeable` (clean sectors
/// whose bytes the cache holds and the blob has).
pub fn bridge_inner(dirty: u128, bridgeable: u128) -> u128 {
    if dirty == 0 {
        return 0;
    }
    let hi = 127 - dirty.leading_zeros();
    let mut send = dirty;
    let mut s = dirty.trailing_zeros();
    while s < hi {
        if dirty & (1u128 << s) != 0 {
            s += 1;
            continue;
        }
        let mut e = s;
        while dirty & (1u128 << e) == 0 {
            e += 1;
        }
        let gap = mask(s.into(), e.into());
        if gap & bridgeable == gap {
            send |= gap;
        }
        s = e;
    }
    send
}

/// The unsent sectors before the first one of `send` (all of them if it is empty).
pub fn leading_gap(send: u128) -> u128 {
    mask(0, send.trailing_zeros().into())
}

/// The unsent sectors after the last one of `send` (all of them if it is empty).
pub fn trailing_gap(send: u128) -> u128 {
    if send == 0 {
        return u128::MAX;
    }
    mask(u64::from(128 - send.leading_zeros()), SECTORS.into())
}

/// The runs of set sectors in `m`, as `[start, end)` sector ranges, in order.
pub fn runs(m: u128) -> impl Iterator<Item = (u64, u64)> {
    let mut s = 0u32;
    std::iter::from_fn(move || {
        while s < SECTORS && m & (1u128 << s) == 0 {
            s += 1;
        }
        if s >= SECTORS {
            return None;
        }
        let start = s;
        while s < SECTORS && m & (1u128 << s) != 0 {
            s += 1;
        }
        Some((start.into(), s.into()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(mask(0, 128), u128::MAX);
        assert_eq!(mask(0, 1), 1);
        assert_eq!(mask(127, 128), 1u128 << 127);
        assert_eq!(mask(2, 4), 0b1100);
        assert_eq!(mask(4, 4), 0);
    }

    #[test]
    fn inner_gaps_are_bridged_only_when_wholly_bridgeable() {
        let dirty = mask(0, 8) | mask(16, 24) | mask(40, 48);
        // Everything clean is held: one run from the first to the last dirty sector.
        assert_eq!(bridge_inner(dirty, !dirty), mask(0, 48));
        // The second gap has one sector the cache does not hold: it stays a gap.
        let held = !dirty & !(1u128 << 30);
        assert_eq!(bridge_inner(dirty, held), mask(0, 24) | mask(40, 48));
        // Nothing outside the dirty span is ever added.
        assert_eq!(bridge_inner(mask(10, 12), u128::MAX), mask(10, 12));
        assert_eq!(bridge_inner(0, u128::MAX), 0);
        assert_eq!(bridge_inner(u128::MAX, 0), u128::MAX);
    }

    #[test]
    fn edge_gaps() {
        assert_eq!(leading_gap(mask(5, 9)), mask(0, 5));
        assert_eq!(leading_gap(1), 0);
        assert_eq!(trailing_gap(mask(5, 9)), mask(9, 128));
        assert_eq!(trailing_gap(1u128 << 127), 0);
        assert_eq!(trailing_gap(0), u128::MAX);
        assert_eq!(leading_gap(0), u128::MAX);
    }

    #[test]
    fn runs_of_a_mask() {
        let m = mask(0, 2) | mask(5, 6) | mask(120, 128);
        assert_eq!(
            runs(m).collect::<Vec<_>>(),
            vec![(0, 2), (5, 6), (120, 128)]
        );
        assert_eq!(runs(0).count(), 0);
        assert_eq!(runs(u128::MAX).collect::<Vec<_>>(), vec![(0, 128)]);
    }
}
