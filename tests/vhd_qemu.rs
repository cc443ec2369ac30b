//! Interoperability of the footer with qemu-img, the tool operators use to make and
//! inspect VHDs: its fixed VHDs parse, blobdrive's footers read at the exact size, and
//! the spec's CHS arithmetic agrees with qemu's.
//!
//! qemu-img is required, not optional: a skipped interop test proves nothing, so a
//! missing qemu-img fails with a message saying what to install.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;

use blobdrive::vhd::{DiskType, Footer, Geometry, MIB};

fn qemu_img(args: &[&str]) -> String {
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "qemu-img could not be run ({e}); this test needs it: install qemu-utils (Debian/Ubuntu) or qemu-img"
            )
        });
    assert!(
        out.status.success(),
        "qemu-img {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("qemu-img prints UTF-8")
}

fn create(path: &Path, subformat: &str, size: &str) {
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "vpc",
        "-o",
        subformat,
        path.to_str().unwrap(),
        size,
    ]);
}

/// qemu's idea of the disk size, the way an operator would ask for it.
fn virtual_size(path: &Path) -> u64 {
    let info = qemu_img(&["info", "-f", "vpc", "--output=json", path.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(v["format"], "vpc", "{info}");
    v["virtual-size"]
        .as_u64()
        .unwrap_or_else(|| panic!("no virtual-size in {info}"))
}

/// A sparse file of `size` bytes followed by `footer`, as a blob would hold it.
fn write_image(path: &Path, size: u64, footer: &[u8; 512]) {
    let mut file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap(); // sparse: only the footer is data
    file.seek(SeekFrom::Start(size)).unwrap();
    file.write_all(footer).unwrap();
}

fn last_512(path: &Path) -> (Vec<u8>, u64) {
    let mut f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len - 512)).unwrap();
    let mut tail = vec![0u8; 512];
    f.read_exact(&mut tail).unwrap();
    (tail, len)
}

#[test]
fn qemu_made_fixed_vhds_parse() {
    let dir = tempfile::tempdir().unwrap();
    for mib in [64u64, 1000] {
        let path = dir.path().join(format!("{mib}.vhd"));
        create(&path, "subformat=fixed,force_size=on", &format!("{mib}M"));
        let (tail, len) = last_512(&path);
        assert_eq!(len, mib * MIB + 512);
        let f = Footer::parse_fixed_for_blob(&tail, len).unwrap();
        assert_eq!(f.current_size, mib * MIB);
        assert_eq!(f.disk_type, DiskType::Fixed);
        // force_size is what makes qemu write the maximum geometry, like blobdrive.
        assert_eq!(f.geometry, Geometry::MAX);
        assert_eq!(virtual_size(&path), mib * MIB);
    }
}

#[test]
fn qemu_made_dynamic_vhds_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dyn.vhd");
    create(&path, "subformat=dynamic", "64M");
    // A dynamic VHD's footer is at the end too (with a copy at the start).
    let (tail, len) = last_512(&path);
    let err = Footer::parse_fixed_for_blob(&tail, len).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dynamic VHD: blobdrive needs a fixed VHD; convert it with `qemu-img convert -O vpc -o subformat=fixed,force_size=on`"
    );
    assert_eq!(Footer::parse(&tail).unwrap().disk_type, DiskType::Dynamic);
}

/// Whether qemu reads 512 bytes of `pattern` at `offset` of the disk in `path`.
fn qemu_reads(path: &Path, offset: u64, pattern: u8) -> bool {
    let out = Command::new("qemu-io")
        .args(["-f", "vpc", "-r", "-c"])
        .arg(format!("read -P {pattern:#04x} {offset} 512"))
        .arg(path)
        .output()
        .unwrap_or_else(|e| {
            panic!("qemu-io could not be run ({e}); this test needs it: install qemu-utils")
        });
    out.status.success()
}

#[test]
fn qemu_reads_blobdrive_footers_at_the_exact_size() {
    let dir = tempfile::tempdir().unwrap();
    for size in [MIB, 5 * MIB, 64 * MIB, 1000 * MIB, 3 * 1024 * MIB] {
        let path = dir.path().join(format!("{size}.vhd"));
        write_image(&path, size, &Footer::new_fixed(size).unwrap().to_bytes());
        assert_eq!(virtual_size(&path), size, "{size} bytes");

        // The disk starts at byte 0 of the blob and ends just before the footer.
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all(&[0xa1; 512]).unwrap();
        file.seek(SeekFrom::Start(size - 512)).unwrap();
        file.write_all(&[0xb2; 512]).unwrap();
        drop(file);
        assert!(qemu_reads(&path, 0, 0xa1), "{size} bytes: first sector");
        assert!(
            qemu_reads(&path, size - 512, 0xb2),
            "{size} bytes: last sector"
        );
        assert!(!qemu_reads(&path, size, 0), "{size} bytes: past the end");
    }
}

/// Why `Footer::new_fixed` writes the maximum geometry: qemu sizes a disk by its CHS
/// for some creators ("qemu", "vpc ", and before qemu 10.0 every creator it did not
/// know, such as "bdrv"), and the spec's CHS rounds down. The maximum geometry makes
/// every qemu use `current size` instead.
#[test]
fn maximum_geometry_overrides_qemus_chs_sizing() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1000 * MIB;
    let spec = Geometry::from_size(size);
    let spec_bytes =
        u64::from(spec.cylinders) * u64::from(spec.heads) * u64::from(spec.sectors_per_track) * 512;
    assert!(spec_bytes < size);

    let mut footer = Footer::new_fixed(size).unwrap();
    footer.creator_app = *b"qemu"; // a creator every qemu sizes by CHS
    let path = dir.path().join("max.vhd");
    write_image(&path, size, &footer.to_bytes());
    assert_eq!(virtual_size(&path), size);

    footer.geometry = spec;
    let path = dir.path().join("spec.vhd");
    write_image(&path, size, &footer.to_bytes());
    assert_eq!(virtual_size(&path), spec_bytes, "the disk loses its tail");
}

/// `Geometry::from_size` against qemu's own implementation of the spec appendix:
/// asked for a size CHS expresses exactly, qemu writes the geometry of that size.
#[test]
fn geometry_agrees_with_qemu() {
    let dir = tempfile::tempdir().unwrap();
    let gib = 1024 * MIB;
    for size in [
        MIB,
        64 * MIB,
        100 * MIB,
        127 * MIB,
        200 * MIB,
        500 * MIB,
        gib,
        10 * gib,
        40 * gib,
        127 * gib,
        65535 * 16 * 255 * 512,
    ] {
        let g = Geometry::from_size(size);
        let exact =
            u64::from(g.cylinders) * u64::from(g.heads) * u64::from(g.sectors_per_track) * 512;
        let path = dir.path().join(format!("{size}.vhd"));
        // Dynamic, so the file stays small; without force_size qemu computes CHS.
        create(&path, "subformat=dynamic", &exact.to_string());
        let (tail, _) = last_512(&path);
        let f = Footer::parse(&tail).unwrap();
        assert_eq!(f.current_size, exact, "{size} bytes");
        assert_eq!(f.geometry, Geometry::from_size(exact), "{size} bytes");
    }
}
