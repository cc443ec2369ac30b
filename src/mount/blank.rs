//! Whether `--mkfs` may format a drive: one listing of its pages is not enough.
//!
//! A page list that says nothing is written may be a lie (an answer garbled on
//! the way, a hostile endpoint): believed alone, it had a mount read zeros
//! where a filesystem was and format over it. So a drive is formatted only
//! when its page list says it is empty *and* its first and last MiB, read
//! straight from the service (not through the cache, which believes the
//! list), are all zeros. Which bytes are there, if any, is said in the
//! refusal: the known signatures of filesystems, volume managers, encrypted
//! volumes and partition tables are looked for here, in the worker, which
//! holds no privilege, in bytes it read itself; no tool runs as root on them.

use crate::mount::superblock;

/// How much of each end of the disk is read.
pub const PROBED: u64 = 1 << 20;

/// A signature looked for: its name, where it lies from the start of the
/// bytes read (the first MiB, or the last), and the bytes.
struct Signature {
    name: &'static str,
    at: usize,
    bytes: &'static [u8],
}

/// Signatures in the disk's first MiB, after ext and xfs (`superblock`).
const AT_THE_START: &[Signature] = &[
    Signature {
        name: "a LUKS encrypted volume",
        at: 0,
        bytes: crate::luks::binary::MAGIC_FIRST,
    },
    Signature {
        name: "a GPT partition table",
        at: 512,
        bytes: b"EFI PART",
    },
    Signature {
        name: "an LVM physical volume",
        at: 512,
        bytes: b"LABELONE",
    },
    Signature {
        name: "a btrfs filesystem",
        at: 0x10040,
        bytes: b"_BHRfS_M",
    },
    Signature {
        name: "an NTFS filesystem",
        at: 3,
        bytes: b"NTFS    ",
    },
    Signature {
        name: "a FAT filesystem",
        at: 0x52,
        bytes: b"FAT32   ",
    },
    Signature {
        name: "a FAT filesystem",
        at: 0x36,
        bytes: b"FAT1",
    },
    Signature {
        name: "Linux swap",
        at: 4096 - 10,
        bytes: b"SWAPSPACE2",
    },
    Signature {
        name: "a bcache device",
        at: 4096 + 24,
        bytes: b"\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81",
    },
    Signature {
        name: "an MBR partition table",
        at: 510,
        bytes: b"\x55\xaa",
    },
];

/// What the drive's first (`head`) and last (`tail`) MiB hold, if anything
/// but zeros: the first signature known here, else where the first byte
/// that is not zero lies (`tail_at`: the disk offset `tail` starts at).
pub fn what_it_holds(head: &[u8], tail: &[u8], tail_at: u64) -> Option<String> {
    if let Some(found) = superblock::detect(head) {
        return Some(format!(
            "its first MiB holds {} {} filesystem",
            crate::words::article(found.fstype),
            found.fstype
        ));
    }
    if let Some(s) = AT_THE_START
        .iter()
        .find(|s| head.get(s.at..s.at + s.bytes.len()) == Some(s.bytes))
    {
        return Some(format!("its first MiB holds {}", s.name));
    }
    if let Some(i) = head.iter().position(|b| *b != 0) {
        return Some(format!("its first MiB holds data no probe here recognises (the first byte that is not zero at offset {i})"));
    }
    // A GPT's backup header is in the disk's last sector; Linux software RAID
    // (md, metadata 0.90 and 1.0) keeps its superblock near the end too.
    if tail.len() >= 512 && tail[tail.len() - 512..].starts_with(b"EFI PART") {
        return Some("its last MiB holds a GPT partition table's backup header".into());
    }
    let i = tail.iter().position(|b| *b != 0)?;
    Some(format!("its last MiB holds data no probe here recognises (the first byte that is not zero at offset {})", tail_at + i as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_zeros_hold_nothing() {
        let zeros = vec![0u8; PROBED as usize];
        assert_eq!(what_it_holds(&zeros, &zeros, 63 << 20), None);
    }

    #[test]
    fn known_signatures_are_named_and_other_bytes_are_placed() {
        let mut head = vec![0u8; PROBED as usize];
        let zeros = vec![0u8; PROBED as usize];
        head[1080..1082].copy_from_slice(&0xEF53u16.to_le_bytes());
        head[1024 + 0x60] = 0x40;
        let said = what_it_holds(&head, &zeros, 0).unwrap();
        assert!(said.contains("an ext4 filesystem"), "{said}");
        let mut head = vec![0u8; PROBED as usize];
        head[..6].copy_from_slice(b"LUKS\xba\xbe");
        assert!(what_it_holds(&head, &zeros, 0).unwrap().contains("LUKS"));
        let mut head = vec![0u8; PROBED as usize];
        head[0x10040..0x10048].copy_from_slice(b"_BHRfS_M");
        assert!(what_it_holds(&head, &zeros, 0).unwrap().contains("btrfs"));
        let mut head = vec![0u8; PROBED as usize];
        head[700] = 1;
        let said = what_it_holds(&head, &zeros, 0).unwrap();
        assert!(
            said.contains("first MiB") && said.contains("offset 700"),
            "{said}"
        );
        let mut tail = vec![0u8; PROBED as usize];
        tail[4096] = 9;
        let said = what_it_holds(&zeros, &tail, 63 << 20).unwrap();
        assert!(
            said.contains("last MiB") && said.contains(&format!("offset {}", (63 << 20) + 4096)),
            "{said}"
        );
        let mut tail = vec![0u8; PROBED as usize];
        let n = tail.len();
        tail[n - 512..n - 504].copy_from_slice(b"EFI PART");
        assert!(what_it_holds(&zeros, &tail, 0)
            .unwrap()
            .contains("backup header"));
    }
}
