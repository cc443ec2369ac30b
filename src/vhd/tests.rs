use super::*;

const GIB: u64 = 1024 * MIB;

/// The first 96 bytes of the footer `qemu-img create -f vpc -o
/// subformat=fixed,force_size=on x.vhd 64M` (qemu 10.0) wrote; the rest is zero.
const QEMU_64M_HEAD: [u8; 96] = [
    0x63, 0x6f, 0x6e, 0x65, 0x63, 0x74, 0x69, 0x78, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x00, 0x00,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x32, 0x95, 0xa7, 0x46, 0x71, 0x65, 0x6d, 0x32,
    0x00, 0x05, 0x00, 0x03, 0x57, 0x69, 0x32, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0xff, 0xff, 0x10, 0xff, 0x00, 0x00, 0x00, 0x02,
    0xff, 0xff, 0xe5, 0x3a, 0xc6, 0xcf, 0xd8, 0x65, 0x92, 0x9e, 0x4f, 0x82, 0x97, 0xe5, 0x69, 0x0c,
    0x60, 0x29, 0x63, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];

fn qemu_64m() -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..96].copy_from_slice(&QEMU_64M_HEAD);
    b
}

#[test]
fn round_trip() {
    let f = Footer::new_fixed(64 * MIB).unwrap();
    let b = f.to_bytes();
    let g = Footer::parse_fixed_for_blob(&b, 64 * MIB + 512).unwrap();
    assert_eq!(f, g);
    assert_eq!(g.features, 2);
    assert_eq!(g.format_version, 0x0001_0000);
    assert_eq!(g.data_offset, u64::MAX);
    assert_eq!(&g.creator_app, b"bdrv");
    assert_eq!(g.creator_version, 0x0001_0000);
    assert_eq!(&g.creator_os, b"Wi2k");
    assert_eq!((g.original_size, g.current_size), (64 * MIB, 64 * MIB));
    assert_eq!(g.geometry, Geometry::MAX);
    assert_eq!(g.disk_type, DiskType::Fixed);
    assert_eq!(g.saved_state, 0);
    assert_eq!(uuid::Uuid::from_bytes(g.unique_id).get_version_num(), 4);
    assert_ne!(g.unique_id, Footer::new_fixed(64 * MIB).unwrap().unique_id);
    // Stamped now: after 2024-01-01 (757382400 s after the VHD epoch).
    assert!(g.timestamp > 757_382_400, "{}", g.timestamp);
    assert!(b[85..].iter().all(|&x| x == 0));
}

#[test]
fn fields_sit_at_the_spec_offsets() {
    let f = Footer {
        features: 0x0102_0304,
        format_version: 0x0506_0708,
        data_offset: 0x1112_1314_1516_1718,
        timestamp: 0x2122_2324,
        creator_app: *b"abcd",
        creator_version: 0x3132_3334,
        creator_os: *b"efgh",
        original_size: 0x4142_4344_4546_4748,
        current_size: 0x5152_5354_5556_5758,
        geometry: Geometry {
            cylinders: 0x6162,
            heads: 0x63,
            sectors_per_track: 0x64,
        },
        disk_type: DiskType::Other(0x7172_7374),
        unique_id: *b"0123456789ABCDEF",
        saved_state: 0x99,
    };
    let b = f.to_bytes();
    assert_eq!(&b[0..8], b"conectix");
    assert_eq!(b[8..12], [1, 2, 3, 4]);
    assert_eq!(b[12..16], [5, 6, 7, 8]);
    assert_eq!(b[16..24], [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
    assert_eq!(b[24..28], [0x21, 0x22, 0x23, 0x24]);
    assert_eq!(&b[28..32], b"abcd");
    assert_eq!(b[32..36], [0x31, 0x32, 0x33, 0x34]);
    assert_eq!(&b[36..40], b"efgh");
    assert_eq!(b[40..48], [0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48]);
    assert_eq!(b[48..56], [0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58]);
    assert_eq!(b[56..60], [0x61, 0x62, 0x63, 0x64]);
    assert_eq!(b[60..64], [0x71, 0x72, 0x73, 0x74]);
    assert_eq!(&b[68..84], b"0123456789ABCDEF");
    assert_eq!(b[84], 0x99);
    assert_eq!(Footer::parse(&b).unwrap(), f);
}

#[test]
fn checksum_known_values() {
    assert_eq!(Footer::checksum(&[0u8; 512]), 0xFFFF_FFFF);
    // "conectix" sums to 861.
    let mut b = [0u8; 512];
    b[..8].copy_from_slice(b"conectix");
    assert_eq!(Footer::checksum(&b), !861);
    // The checksum field does not count towards the sum.
    b[64..68].copy_from_slice(&[0xff; 4]);
    assert_eq!(Footer::checksum(&b), !861);
    // The sum wraps rather than overflowing: 508 bytes of 0xff sum to 129540.
    assert_eq!(Footer::checksum(&[0xff; 512]), !(508 * 255));
    // The footer qemu wrote: its stored checksum is ffffe53a.
    assert_eq!(Footer::checksum(&qemu_64m()), 0xFFFF_E53A);
}

#[test]
fn parses_a_footer_qemu_wrote() {
    let f = Footer::parse_fixed_for_blob(&qemu_64m(), 64 * MIB + 512).unwrap();
    assert_eq!(&f.creator_app, b"qem2");
    assert_eq!(&f.creator_os, b"Wi2k");
    assert_eq!(f.current_size, 64 * MIB);
    assert_eq!(f.geometry, Geometry::MAX);
    assert_eq!(f.data_offset, u64::MAX);
    // And writes it back byte for byte.
    assert_eq!(f.to_bytes(), qemu_64m());
}

#[test]
fn longer_input_is_read_from_its_end() {
    let mut image = vec![0xaau8; 4096];
    image.extend_from_slice(&Footer::new_fixed(MIB).unwrap().to_bytes());
    assert_eq!(Footer::parse(&image).unwrap().current_size, MIB);
}

#[test]
fn too_short() {
    let e = Footer::parse(&[0u8; 511]).unwrap_err();
    assert_eq!(e, VhdError::TooShort(511));
    assert!(e.to_string().starts_with("not a VHD"), "{e}");
    assert_eq!(Footer::parse(&[]), Err(VhdError::TooShort(0)));
}

#[test]
fn bad_cookie_shows_what_was_found_printably() {
    let e = Footer::parse(&[b'x'; 512]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "not a VHD: the last 512 bytes do not start with the cookie \"conectix\" (found \"xxxxxxxx\")"
    );
    let mut b = [0u8; 512];
    b[..8].copy_from_slice(b"ab\"\\\n\x00\xffZ");
    match Footer::parse(&b).unwrap_err() {
        VhdError::BadCookie { found } => assert_eq!(found, r#"ab\"\\\n\x00\xffZ"#),
        e => panic!("{e:?}"),
    }
}

#[test]
fn damage_is_caught_by_the_checksum() {
    let good = Footer::new_fixed(MIB).unwrap().to_bytes();
    let stored = be32(&good, 64);
    for at in [8, 48, 63, 68, 84, 300, 511] {
        let mut b = good;
        b[at] ^= 0x10;
        match Footer::parse(&b).unwrap_err() {
            VhdError::BadChecksum {
                stored: s,
                computed,
            } => {
                assert_eq!(s, stored);
                assert_ne!(computed, stored);
            }
            e => panic!("byte {at}: {e:?}"),
        }
    }
    let mut b = good;
    b[64..68].copy_from_slice(&0x1234u32.to_be_bytes());
    let e = Footer::parse(&b).unwrap_err();
    assert_eq!(
        e,
        VhdError::BadChecksum {
            stored: 0x1234,
            computed: stored
        }
    );
    assert_eq!(
        e.to_string(),
        format!(
            "VHD footer checksum mismatch (stored 0x00001234, computed {stored:#010x}): the footer is damaged"
        )
    );
}

#[test]
fn other_kinds_of_vhd_are_refused_by_name() {
    for (t, name) in [
        (DiskType::Dynamic, "dynamic"),
        (DiskType::Differencing, "differencing"),
        (DiskType::Other(0), "type 0"),
        (DiskType::Other(5), "type 5"),
    ] {
        let mut f = Footer::new_fixed(MIB).unwrap();
        f.disk_type = t;
        let b = f.to_bytes();
        // Structure alone is fine: `parse` takes any type.
        assert_eq!(Footer::parse(&b).unwrap().disk_type, t);
        let e = Footer::parse_fixed_for_blob(&b, MIB + 512).unwrap_err();
        assert_eq!(e, VhdError::NotFixed(t));
        assert_eq!(
            e.to_string(),
            format!("{name} VHD: blobdrive needs a fixed VHD; convert it with `qemu-img convert -O vpc -o subformat=fixed,force_size=on`")
        );
    }
    // Even when its size is also wrong: the type is the useful complaint.
    let mut f = Footer::new_fixed(MIB).unwrap();
    f.disk_type = DiskType::Dynamic;
    assert_eq!(
        Footer::parse_fixed_for_blob(&f.to_bytes(), 1234),
        Err(VhdError::NotFixed(DiskType::Dynamic))
    );
}

#[test]
fn size_must_match_the_blob() {
    let b = Footer::new_fixed(MIB).unwrap().to_bytes();
    for blob_len in [MIB, MIB + 511, MIB + 513, 2 * MIB + 512, 0] {
        let e = Footer::parse_fixed_for_blob(&b, blob_len).unwrap_err();
        assert_eq!(
            e,
            VhdError::SizeMismatch {
                current_size: MIB,
                blob_len
            }
        );
    }
    assert_eq!(
        Footer::parse_fixed_for_blob(&b, 2 * MIB + 512)
            .unwrap_err()
            .to_string(),
        "VHD footer says the disk is 1048576 bytes but the blob holds 2097664 bytes (expected 1048576 + 512)"
    );
    // A size that would overflow with the footer added is a mismatch, not a panic.
    let mut f = Footer::new_fixed(MIB).unwrap();
    f.current_size = u64::MAX - 100;
    assert!(matches!(
        Footer::parse_fixed_for_blob(&f.to_bytes(), u64::MAX),
        Err(VhdError::SizeMismatch { .. })
    ));
}

#[test]
fn size_must_suit_azure() {
    let mut f = Footer::new_fixed(MIB).unwrap();
    f.current_size = MIB + 512;
    let e = Footer::parse_fixed_for_blob(&f.to_bytes(), MIB + 1024).unwrap_err();
    assert_eq!(e, VhdError::NotWholeMiB(MIB + 512));
    assert_eq!(
        e.to_string(),
        "size 1049088 bytes is not a whole number of MiB (Azure requires it)"
    );
    f.current_size = 0;
    assert_eq!(
        Footer::parse_fixed_for_blob(&f.to_bytes(), 512),
        Err(VhdError::Zero)
    );
    f.current_size = MAX_DISK_BYTES + MIB;
    assert_eq!(
        Footer::parse_fixed_for_blob(&f.to_bytes(), MAX_BLOB_BYTES + 512),
        Err(VhdError::TooLarge(MAX_DISK_BYTES + MIB))
    );

    assert_eq!(Footer::new_fixed(0), Err(VhdError::Zero));
    assert_eq!(Footer::new_fixed(1000), Err(VhdError::NotWholeMiB(1000)));
    assert_eq!(
        Footer::new_fixed(MIB - 512),
        Err(VhdError::NotWholeMiB(MIB - 512))
    );
    assert_eq!(
        Footer::new_fixed(MAX_DISK_BYTES + MIB),
        Err(VhdError::TooLarge(MAX_DISK_BYTES + MIB))
    );
    assert_eq!(
        Footer::new_fixed(u64::MAX),
        Err(VhdError::NotWholeMiB(u64::MAX))
    );
    assert_eq!(MAX_DISK_BYTES, 8_796_091_973_632);
    let max = Footer::new_fixed(MAX_DISK_BYTES).unwrap();
    assert_eq!(
        Footer::parse_fixed_for_blob(&max.to_bytes(), MAX_BLOB_BYTES - MIB + 512)
            .unwrap()
            .current_size,
        MAX_DISK_BYTES
    );
    assert!(Footer::new_fixed(MIB).is_ok());
}

#[test]
fn every_message_is_one_line() {
    let all = [
        VhdError::TooShort(3),
        VhdError::BadCookie {
            found: "\\n".into(),
        },
        VhdError::BadChecksum {
            stored: 1,
            computed: 2,
        },
        VhdError::NotFixed(DiskType::Dynamic),
        VhdError::SizeMismatch {
            current_size: 1,
            blob_len: 2,
        },
        VhdError::NotWholeMiB(1),
        VhdError::TooLarge(1),
        VhdError::Zero,
    ];
    for e in all {
        let s = e.to_string();
        assert!(!s.contains('\n') && !s.is_empty(), "{s:?}");
    }
}

#[test]
fn disk_type_numbers_and_names() {
    for n in 0..8u32 {
        assert_eq!(u32::from(DiskType::from(n)), n);
    }
    assert_eq!(DiskType::from(2), DiskType::Fixed);
    assert_eq!(DiskType::from(3), DiskType::Dynamic);
    assert_eq!(DiskType::from(4), DiskType::Differencing);
    assert_eq!(DiskType::from(6), DiskType::Other(6));
    assert_eq!(DiskType::Fixed.to_string(), "fixed");
    assert_eq!(DiskType::Dynamic.to_string(), "dynamic");
    assert_eq!(DiskType::Differencing.to_string(), "differencing");
    assert_eq!(DiskType::Other(1).to_string(), "type 1");
}

fn chs(cylinders: u16, heads: u8, sectors_per_track: u8) -> Geometry {
    Geometry {
        cylinders,
        heads,
        sectors_per_track,
    }
}

#[test]
fn geometry_follows_the_spec() {
    let cases = [
        // Small disks: 17 sectors per track, at least 4 heads.
        (0, chs(0, 4, 17)),
        (MIB, chs(30, 4, 17)),
        // 131072 sectors / 17 = 7710 = 8 heads * 963 cylinders (+ 6).
        (64 * MIB, chs(963, 8, 17)),
        (100 * MIB, chs(1003, 12, 17)),
        (127 * MIB, chs(1019, 15, 17)),
        // 17 spt would need more than 16 heads: 31 spt.
        (200 * MIB, chs(825, 16, 31)),
        // 31 spt would need more than 1024 cylinders * 16 heads: 63 spt.
        (500 * MIB, chs(1015, 16, 63)),
        (GIB, chs(2080, 16, 63)),
        (10 * GIB, chs(20805, 16, 63)),
        // From 65535 * 16 * 63 sectors (31.5 GiB) on: 255 spt.
        (65535 * 16 * 63 * 512 - 512, chs(65534, 16, 63)),
        (65535 * 16 * 63 * 512, chs(16191, 16, 255)),
        (40 * GIB, chs(20560, 16, 255)),
        (127 * GIB, chs(65278, 16, 255)),
        // 65535 * 16 * 255 sectors (about 127.5 GiB) and beyond clamp.
        (65535 * 16 * 255 * 512, Geometry::MAX),
        (128 * GIB, Geometry::MAX),
        (MAX_DISK_BYTES, Geometry::MAX),
        (u64::MAX, Geometry::MAX),
    ];
    for (bytes, want) in cases {
        assert_eq!(Geometry::from_size(bytes), want, "{bytes} bytes");
    }
    // The spec's CHS never describes more than the disk.
    for mib in [1, 3, 64, 100, 1000, 4000, 50_000, 130_000] {
        let g = Geometry::from_size(mib * MIB);
        let chs_bytes =
            u64::from(g.cylinders) * u64::from(g.heads) * u64::from(g.sectors_per_track) * 512;
        assert!(chs_bytes <= mib * MIB, "{mib} MiB");
    }
}
