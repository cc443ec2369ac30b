//! LUKS2 headers as blobdrive writes them, read by cryptsetup, and as
//! cryptsetup writes them, read by blobdrive: on plain files, both ways, for
//! every choice either side offers (Argon2id and PBKDF2 keyslots, 512- and
//! 4096-byte sectors, 256- and 512-bit keys), keyslots added and removed by
//! one and used by the other, and a damaged first header copy.
//!
//! cryptsetup is required (scripts/install-deps.sh installs cryptsetup-bin).

mod common;

use std::path::Path;

use blobdrive::luks::volume::{self, KdfChoice};
use common::luks::{
    cryptsetup_accepts, cryptsetup_format, cryptsetup_ok, dump_volume_key, run, FileDisk,
};

const SIZE: u64 = 20 << 20;

fn blank(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
    p
}

#[test]
fn cryptsetup_reads_what_blobdrive_formats() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("argon2id-4096", 4096, KdfChoice::default(), "argon2id"),
        (
            "pbkdf2-512",
            512,
            KdfChoice::Pbkdf2 { iterations: 10_000 },
            "pbkdf2",
        ),
    ];
    for (name, sector, kdf, kdf_name) in cases {
        let img = blank(dir.path(), name);
        let made = run(volume::format(
            &FileDisk::open(&img),
            b"secret one",
            sector,
            kdf,
        ))
        .unwrap();
        let dump = cryptsetup_ok(&["luksDump", &img.to_string_lossy()], b"");
        for want in [
            "Version:       \t2".to_string(),
            "offset: 16777216 [bytes]".into(),
            format!("sector: {sector} [bytes]"),
            "cipher: aes-xts-plain64".into(),
            format!("PBKDF:      {kdf_name}"),
            "AF stripes: 4000".into(),
            "Area offset:32768 [bytes]".into(),
        ] {
            assert!(dump.contains(&want), "{name}: no {want:?} in\n{dump}");
        }
        assert!(cryptsetup_accepts(&img, b"secret one"), "{name}");
        assert!(!cryptsetup_accepts(&img, b"secret two"), "{name}");
        assert_eq!(
            dump_volume_key(&img, b"secret one"),
            made.key.as_bytes(),
            "{name}"
        );
    }
}

#[test]
fn blobdrive_opens_what_cryptsetup_formats() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], u32); 4] = [
        ("default", &[], 4096),
        ("sector-512", &["--sector-size", "512"], 512),
        (
            "aes-128",
            &["--key-size", "256", "--sector-size", "512"],
            512,
        ),
        (
            "pbkdf2-sha512",
            &[
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--hash",
                "sha512",
            ],
            4096,
        ),
    ];
    for (name, extra, sector) in cases {
        let img = dir.path().join(name);
        cryptsetup_format(&img, SIZE, b"their pass", extra);
        let disk = FileDisk::open(&img);
        let u = run(volume::unlock(&disk, b"their pass")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            u.key.as_bytes(),
            dump_volume_key(&img, b"their pass"),
            "{name}"
        );
        assert_eq!(u.segment.sector_size, sector, "{name}");
        assert!(run(volume::unlock(&disk, b"not theirs")).is_err(), "{name}");
    }
}

#[test]
fn keyslots_added_and_removed_by_one_serve_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("shared");
    cryptsetup_format(&img, SIZE, b"first", &[]);
    let fast = KdfChoice::Argon2id { memory_kib: 8192 };
    // blobdrive adds one: cryptsetup opens with it.
    let disk = FileDisk::open(&img);
    assert_eq!(
        run(volume::add_key(&disk, b"first", b"second", fast)).unwrap(),
        1
    );
    assert!(cryptsetup_accepts(&img, b"second"));
    // cryptsetup adds one (its new passphrase on the second line of the key
    // file is not how it reads them: a file of its own).
    let newkey = dir.path().join("third.key");
    std::fs::write(&newkey, b"third").unwrap();
    cryptsetup_ok(
        &[
            "luksAddKey",
            "--pbkdf-memory",
            "65536",
            "--pbkdf-force-iterations",
            "4",
            &img.to_string_lossy(),
            &newkey.to_string_lossy(),
        ],
        b"second",
    );
    assert_eq!(run(volume::unlock(&disk, b"third")).unwrap().keyslot, 2);
    // blobdrive removes the first: cryptsetup refuses it.
    assert_eq!(run(volume::remove_key(&disk, b"first")).unwrap(), 0);
    assert!(!cryptsetup_accepts(&img, b"first"));
    assert!(cryptsetup_accepts(&img, b"third"));
    // blobdrive changes the second: the old is gone, the new opens, in slot 1.
    run(volume::change_key(&disk, b"second", b"fourth", fast)).unwrap();
    assert!(!cryptsetup_accepts(&img, b"second"));
    assert!(cryptsetup_accepts(&img, b"fourth"));
    let dump = cryptsetup_ok(&["luksDump", &img.to_string_lossy()], b"");
    assert!(
        dump.contains("  1: luks2") && dump.contains("  2: luks2") && !dump.contains("  0: luks2"),
        "{dump}"
    );
}

#[test]
fn a_damaged_first_copy_is_read_from_the_second_by_both() {
    let dir = tempfile::tempdir().unwrap();
    // blobdrive's image, its first copy's JSON damaged: cryptsetup opens it.
    let img = blank(dir.path(), "ours");
    let made = run(volume::format(
        &FileDisk::open(&img),
        b"pw",
        4096,
        KdfChoice::Pbkdf2 { iterations: 1000 },
    ))
    .unwrap();
    damage(&img, 5000);
    assert_eq!(dump_volume_key(&img, b"pw"), made.key.as_bytes());
    // cryptsetup's image, its first copy's binary header damaged: blobdrive
    // opens it from the second.
    let theirs = dir.path().join("theirs");
    cryptsetup_format(&theirs, SIZE, b"pw", &[]);
    let key = dump_volume_key(&theirs, b"pw");
    damage(&theirs, 100);
    let u = run(volume::unlock(&FileDisk::open(&theirs), b"pw")).unwrap();
    assert_eq!(u.key.as_bytes(), key);
    assert_eq!(u.header.used, blobdrive::luks::header::Copy::Second);
}

fn damage(img: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x55], at).unwrap();
}

/// The data segment's cipher, with the volume key cryptsetup dumps, is the
/// cipher of OpenSSL (Python's `cryptography`), at both sector sizes: so a
/// drive's sectors decrypt under cryptsetup as they do under blobdrive.
#[test]
fn the_data_cipher_is_openssls_with_cryptsetups_key() {
    use rand::RngCore;
    let dir = tempfile::tempdir().unwrap();
    for sector in [512u32, 4096] {
        let img = dir.path().join(format!("s{sector}"));
        cryptsetup_format(&img, SIZE, b"pw", &["--sector-size", &sector.to_string()]);
        let u = run(volume::unlock(&FileDisk::open(&img), b"pw")).unwrap();
        let cipher = u.cipher().unwrap();
        let mut plain = vec![0u8; 64 << 10];
        rand::thread_rng().fill_bytes(&mut plain);
        let at = 3 << 20;
        let mut ours = plain.clone();
        cipher.encrypt(at, &mut ours);
        let key = dump_volume_key(&img, b"pw");
        let theirs = common::luks::python_xts(&key, sector as usize, at, &plain, false);
        assert_eq!(ours, theirs, "sector {sector}");
        assert_eq!(
            common::luks::python_xts(&key, sector as usize, at, &ours, true),
            plain
        );
    }
}
