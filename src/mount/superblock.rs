//! The size a filesystem believes it has, read from its superblock in the disk's
//! first bytes: a drive grown while unmounted holds a filesystem smaller than its
//! disk, which nothing else would notice (`df` just shows the old size).
//!
//! Only what is needed for that: ext2/3/4 (superblock at 1024, little-endian)
//! and xfs (superblock at 0, big-endian).

/// How many of the disk's first bytes [`detect`] needs.
pub const HEAD_BYTES: usize = 64 * 1024;

/// A filesystem found at the start of a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// `ext4`, `ext2/ext3` (no extents: blobdrive does not mount those) or `xfs`.
    pub fstype: &'static str,
    /// Its size: blocks times block size.
    pub bytes: u64,
}

const EXT_SB: usize = 1024;
const EXT_MAGIC: u16 = 0xEF53;
const EXT_INCOMPAT_EXTENTS: u32 = 0x40;
const EXT_INCOMPAT_64BIT: u32 = 0x80;

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The filesystem whose superblock `head` (the disk's first bytes) holds, if it
/// is one of those known here and its figures are sane.
pub fn detect(head: &[u8]) -> Option<Found> {
    ext(head).or_else(|| xfs(head))
}

fn ext(head: &[u8]) -> Option<Found> {
    let sb = head.get(EXT_SB..EXT_SB + 1024)?;
    if u16::from_le_bytes([sb[0x38], sb[0x39]]) != EXT_MAGIC {
        return None;
    }
    let log = le32(sb, 0x18)?;
    if log > 6 {
        return None; // blocks of 1 KiB to 64 KiB only
    }
    let block = 1024u64 << log;
    let incompat = le32(sb, 0x60)?;
    let hi = if incompat & EXT_INCOMPAT_64BIT != 0 {
        le32(sb, 0x150)?
    } else {
        0
    };
    let blocks = (u64::from(hi) << 32) | u64::from(le32(sb, 0x04)?);
    Some(Found {
        fstype: if incompat & EXT_INCOMPAT_EXTENTS != 0 {
            "ext4"
        } else {
            "ext2/ext3"
        },
        bytes: blocks.checked_mul(block)?,
    })
}

fn xfs(head: &[u8]) -> Option<Found> {
    if head.get(0..4)? != b"XFSB" {
        return None;
    }
    let block = u64::from(be32(head, 4)?);
    if !(512..=65536).contains(&block) || !block.is_power_of_two() {
        return None;
    }
    Some(Found {
        fstype: "xfs",
        bytes: be64(head, 8)?.checked_mul(block)?,
    })
}

/// How much smaller than its disk a filesystem must be before it is grown to
/// fill it: ext4 grows by any whole block; xfs adds allocation groups, and one
/// smaller than 16 MiB is never added, so a smaller gap would be "grown" on
/// every mount with nothing to show for it.
pub fn worth_growing(fstype: &str, fs_bytes: u64, disk: u64) -> bool {
    let gap = disk.saturating_sub(fs_bytes);
    match fstype {
        "ext4" => gap >= 1 << 20,
        "xfs" => gap >= 16 << 20,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext_head(blocks: u64, log: u32, incompat: u32) -> Vec<u8> {
        let mut h = vec![0u8; HEAD_BYTES];
        let sb = &mut h[EXT_SB..];
        sb[0x04..0x08].copy_from_slice(&(blocks as u32).to_le_bytes());
        sb[0x18..0x1c].copy_from_slice(&log.to_le_bytes());
        sb[0x38..0x3a].copy_from_slice(&EXT_MAGIC.to_le_bytes());
        sb[0x60..0x64].copy_from_slice(&incompat.to_le_bytes());
        sb[0x150..0x154].copy_from_slice(&((blocks >> 32) as u32).to_le_bytes());
        h
    }

    #[test]
    fn ext_sizes_are_blocks_times_block_size() {
        let h = ext_head(16384, 2, EXT_INCOMPAT_EXTENTS);
        assert_eq!(
            detect(&h),
            Some(Found {
                fstype: "ext4",
                bytes: 64 << 20
            })
        );
        // The high word counts only with the 64bit feature.
        let big = ext_head((1 << 32) + 1, 2, EXT_INCOMPAT_EXTENTS | EXT_INCOMPAT_64BIT);
        assert_eq!(detect(&big).unwrap().bytes, ((1u64 << 32) + 1) * 4096);
        let no64 = ext_head((1 << 32) + 1, 2, EXT_INCOMPAT_EXTENTS);
        assert_eq!(detect(&no64).unwrap().bytes, 4096);
        assert_eq!(detect(&ext_head(100, 0, 0)).unwrap().fstype, "ext2/ext3");
        assert_eq!(detect(&ext_head(100, 40, 0)), None);
    }

    #[test]
    fn xfs_sizes_are_data_blocks_times_block_size() {
        let mut h = vec![0u8; HEAD_BYTES];
        h[0..4].copy_from_slice(b"XFSB");
        h[4..8].copy_from_slice(&4096u32.to_be_bytes());
        h[8..16].copy_from_slice(&(81920u64).to_be_bytes());
        assert_eq!(
            detect(&h),
            Some(Found {
                fstype: "xfs",
                bytes: 320 << 20
            })
        );
        h[4..8].copy_from_slice(&3000u32.to_be_bytes());
        assert_eq!(detect(&h), None);
        assert_eq!(detect(&[0u8; 100]), None);
        assert_eq!(detect(&vec![0u8; HEAD_BYTES]), None);
    }

    #[test]
    fn only_a_gap_the_filesystem_can_fill_is_worth_growing() {
        assert!(worth_growing("ext4", 64 << 20, 128 << 20));
        assert!(!worth_growing("ext4", 64 << 20, (64 << 20) + 4096));
        assert!(!worth_growing("xfs", 320 << 20, 328 << 20));
        assert!(worth_growing("xfs", 320 << 20, 384 << 20));
        assert!(!worth_growing("ext2/ext3", 1, 1 << 30));
    }
}
