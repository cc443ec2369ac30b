use super::*;
use crate::luks::MemDisk;

/// Cheap keyslots: these tests are about the layout, not the cost.
const FAST: KdfChoice = KdfChoice::Pbkdf2 { iterations: 1000 };
const DISK: usize = 20 << 20;

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn a_formatted_volume_opens_with_its_passphrase_only() {
    run(async {
        let disk = MemDisk::new(DISK);
        let made = format(&disk, b"right", 4096, FAST).await.unwrap();
        let u = unlock(&disk, b"right").await.unwrap();
        assert_eq!(u.key.as_bytes(), made.key.as_bytes());
        assert_eq!(u.segment.offset, 16 << 20);
        assert_eq!(u.segment.sector_size, 4096);
        assert_eq!(u.keyslot, 0);
        assert!(u.header.other_bad.is_none(), "{:?}", u.header.other_bad);
        assert!(matches!(
            unlock(&disk, b"wrong").await,
            Err(LuksError::WrongPassphrase)
        ));
        // Nothing is written past the keyslot area.
        let bytes = disk.bytes.lock().unwrap();
        assert!(bytes[32768 + 258048..].iter().all(|&b| b == 0));
        assert_eq!(&bytes[..6], b"LUKS\xba\xbe");
        assert_eq!(&bytes[16384..16390], b"SKUL\xba\xbe");
    });
}

#[test]
fn argon2id_keyslots_open_too() {
    run(async {
        let disk = MemDisk::new(DISK);
        let kdf = KdfChoice::Argon2id { memory_kib: 1024 };
        format(&disk, b"pw", 512, kdf).await.unwrap();
        let u = unlock(&disk, b"pw").await.unwrap();
        let k = &u.header.metadata.keyslots().unwrap()[0];
        assert!(matches!(
            k.kdf,
            Kdf::Argon2 {
                id: true,
                memory_kib: 1024,
                time: 4,
                lanes: 4,
                ..
            }
        ));
    });
}

#[test]
fn passphrases_are_added_removed_and_changed() {
    run(async {
        let disk = MemDisk::new(DISK);
        let made = format(&disk, b"daily", 4096, FAST).await.unwrap();
        assert!(matches!(
            add_key(&disk, b"wrong", b"x", FAST).await,
            Err(LuksError::WrongPassphrase)
        ));
        assert_eq!(
            add_key(&disk, b"daily", b"recovery", FAST).await.unwrap(),
            1
        );
        let u = unlock(&disk, b"recovery").await.unwrap();
        assert_eq!((u.keyslot, u.key.as_bytes()), (1, made.key.as_bytes()));
        let slot1 = u.header.metadata.keyslots().unwrap()[1].clone();
        assert_eq!(slot1.area_offset, 32768 + 258048);
        // Both copies carry the new version.
        assert_eq!(u.header.binary.seqid, 2);
        assert_eq!(remove_key(&disk, b"daily").await.unwrap(), 0);
        assert!(unlock(&disk, b"daily").await.is_err());
        {
            let bytes = disk.bytes.lock().unwrap();
            assert!(
                bytes[32768..32768 + 258048].iter().all(|&b| b == 0),
                "the removed keyslot's area is wiped"
            );
        }
        let e = remove_key(&disk, b"recovery").await.unwrap_err();
        assert!(matches!(e, LuksError::Refused(_)), "{e}");
        assert_eq!(
            change_key(&disk, b"recovery", b"new", FAST).await.unwrap(),
            1
        );
        assert!(unlock(&disk, b"recovery").await.is_err());
        let u = unlock(&disk, b"new").await.unwrap();
        assert_eq!((u.keyslot, u.key.as_bytes()), (1, made.key.as_bytes()));
        // The new area took the free place; the old one is wiped.
        assert_eq!(u.header.metadata.keyslots().unwrap()[0].area_offset, 32768);
        let bytes = disk.bytes.lock().unwrap();
        assert!(bytes[slot1.area_offset as usize..][..258048]
            .iter()
            .all(|&b| b == 0));
    });
}

#[test]
fn a_damaged_first_copy_falls_back_to_the_second() {
    run(async {
        for damage in [6000usize, 0, 100] {
            let disk = MemDisk::new(DISK);
            format(&disk, b"pw", 4096, FAST).await.unwrap();
            disk.bytes.lock().unwrap()[damage] ^= 0xff;
            let u = unlock(&disk, b"pw").await.unwrap();
            assert_eq!(u.header.used, Copy::Second, "damage at {damage}");
            assert!(u
                .header
                .other_bad
                .as_deref()
                .unwrap()
                .contains("first copy"));
            // The next write repairs it.
            add_key(&disk, b"pw", b"two", FAST).await.unwrap();
            let u = unlock(&disk, b"two").await.unwrap();
            assert_eq!(u.header.used, Copy::First);
            assert!(u.header.other_bad.is_none());
        }
        // Both copies gone: not a LUKS disk.
        let disk = MemDisk::new(DISK);
        format(&disk, b"pw", 4096, FAST).await.unwrap();
        disk.bytes.lock().unwrap()[..32768].fill(0);
        assert!(matches!(
            unlock(&disk, b"pw").await,
            Err(LuksError::NotLuks)
        ));
    });
}

#[test]
fn a_thirty_third_keyslot_is_refused() {
    run(async {
        let disk = MemDisk::new(DISK);
        format(&disk, b"pw", 512, FAST).await.unwrap();
        // Keyslots 1 to 31, as another tool could have added them (copies of
        // keyslot 0 in areas of their own: 16 MiB less 32 KiB holds 64).
        let mut h = header::read(&disk).await.unwrap();
        let mut m = h.metadata.clone();
        let k0 = m.keyslots().unwrap()[0].clone();
        for id in 1..32 {
            let k = Keyslot {
                id,
                area_offset: k0.area_offset + u64::from(id) * k0.area_size,
                ..k0.clone()
            };
            m.put_keyslot(&k, 0).unwrap();
        }
        header::write(&disk, &mut h, m).await.unwrap();
        let e = add_key(&disk, b"pw", b"another", FAST).await.unwrap_err();
        assert!(e.to_string().contains("all 32 keyslots are in use"), "{e}");
        // With one free, the new keyslot takes its id and the first free area.
        let mut h = header::read(&disk).await.unwrap();
        let mut m = h.metadata.clone();
        m.remove_keyslot(5).unwrap();
        header::write(&disk, &mut h, m).await.unwrap();
        assert_eq!(add_key(&disk, b"pw", b"another", FAST).await.unwrap(), 5);
        let u = unlock(&disk, b"another").await.unwrap();
        assert_eq!(u.keyslot, 5);
        let k = u.header.metadata.keyslots().unwrap()[5].clone();
        assert_eq!(k.area_offset, k0.area_offset + 5 * k0.area_size);
    });
}

/// Opening again keeps the key while the header is as it was (the passphrase
/// is not even derived again: a wrong one is not noticed), and opens anew once
/// a keyslot changed: the passphrase changed meanwhile opens nothing.
#[test]
fn reopening_keeps_the_key_only_while_the_header_is_unchanged() {
    run(async {
        let disk = MemDisk::new(DISK);
        let made = format(&disk, b"daily", 512, FAST).await.unwrap();
        let (first, kept) = reopen(&disk, b"daily", None).await.unwrap();
        assert!(!kept);
        let (again, kept) = reopen(&disk, b"not derived", Some(first)).await.unwrap();
        assert!(kept);
        assert_eq!(again.key.as_bytes(), made.key.as_bytes());
        change_key(&disk, b"daily", b"new", FAST).await.unwrap();
        assert!(matches!(
            reopen(&disk, b"daily", Some(again)).await,
            Err(LuksError::WrongPassphrase)
        ));
        let u = unlock(&disk, b"new").await.unwrap();
        let (u, kept) = reopen(&disk, b"new", Some(u)).await.unwrap();
        assert!(kept);
        add_key(&disk, b"new", b"recovery", FAST).await.unwrap();
        let (u, kept) = reopen(&disk, b"new", Some(u)).await.unwrap();
        assert!(!kept, "a keyslot added: the header changed");
        assert_eq!(u.key.as_bytes(), made.key.as_bytes());
    });
}
