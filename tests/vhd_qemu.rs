//! Interoperability of the footer with qemu-img, the tool operators use to make and
//! inspect VHDs: its fixed VHDs parse, and blobdrive's footers read at the exact size.

use std::process::Command;

use blobdrive::vhd::{DiskType, Footer, MIB};

fn qemu_img(args: &[&str]) -> String {
    let out = Command::new("qemu-img").args(args).output().expect(
        "qemu-img is required for this test (Debian package qemu-utils; .ci/run installs it)",
    );
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn last_512(path: &std::path::Path) -> (Vec<u8>, u64) {
    let data = std::fs::read(path).unwrap();
    let len = data.len() as u64;
    (data[data.len() - 512..].to_vec(), len)
}

#[test]
fn qemu_made_fixed_vhds_parse() {
    let dir = tempfile::tempdir().unwrap();
    for size in ["64M", "1000M"] {
        let path = dir.path().join(format!("{size}.vhd"));
        let p = path.to_str().unwrap();
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "vpc",
            "-o",
            "subformat=fixed,force_size=on",
            p,
            size,
        ]);
        let (tail, len) = last_512(&path);
        let f = Footer::parse_fixed_for_blob(&tail, len).unwrap();
        let mib: u64 = size.trim_end_matches('M').parse().unwrap();
        assert_eq!(f.current_size, mib * MIB);
        assert_eq!(f.disk_type, DiskType::Fixed);
    }
    // qemu's dynamic VHDs are refused by name.
    let path = dir.path().join("dyn.vhd");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "vpc",
        "-o",
        "subformat=dynamic",
        path.to_str().unwrap(),
        "64M",
    ]);
    let data = std::fs::read(&path).unwrap();
    let err = Footer::parse_fixed_for_blob(&data[..512], 64 * MIB + 512).unwrap_err();
    assert!(err.to_string().starts_with("dynamic VHD"), "{err}");
}

#[test]
fn qemu_reads_blobdrive_footers_at_the_exact_size() {
    let dir = tempfile::tempdir().unwrap();
    for size in [64 * MIB, 1000 * MIB, 3 * 1024 * MIB, 5 * MIB] {
        let path = dir.path().join(format!("{size}.vhd"));
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(size).unwrap(); // sparse: only the footer is data
        drop(file);
        let mut data = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut data, &Footer::new_fixed(size).unwrap().to_bytes()).unwrap();
        drop(data);
        let info = qemu_img(&["info", "-f", "vpc", "--output=json", path.to_str().unwrap()]);
        let v: serde_json::Value = serde_json::from_str(&info).unwrap();
        assert_eq!(v["virtual-size"].as_u64(), Some(size), "{info}");
        assert_eq!(v["format"], "vpc");
    }
}
