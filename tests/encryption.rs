//! Encrypted drives end to end, against Azurite, as root: what blobdrive
//! serves and what cryptsetup (Debian's cryptsetup-bin) and an independent
//! AES-XTS (Python's `cryptography`) read of the same blob, both ways; wrong,
//! missing and misplaced passphrases; keyslots; a damaged first header copy;
//! snapshots and incremental downloads; online growth; and that neither the
//! blob, nor the disk cache, nor any log holds the plaintext or the key.

mod common;
mod faultproxy;
mod liar;
mod recorder;

use std::path::Path;

use common::bd::Harness;
use common::luks::{
    cryptsetup_accepts, cryptsetup_format, cryptsetup_ok, decrypt_image, dump_volume_key, holds,
    key_file, new_encrypted_drive, python_xts, secret_file, PASSPHRASE,
};
use common::mount::require_root;
use common::util::{json, sh_ok};

const BD: Harness = Harness::new("encryption-run").env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "10")]);
const MIB: u64 = 1 << 20;
/// A pattern written through the mounts, which the blob must never hold.
const PATTERN: &[u8] = b"blobdrive-plaintext-pattern:";

/// `spec` mounted with `extra` options at a new mountpoint.
fn mount(spec: &str, extra: &[&str]) -> common::mount::Mp {
    let mp = BD.mp();
    BD.mount(spec, &mp, extra);
    mp
}

fn pattern(len: usize) -> Vec<u8> {
    PATTERN.iter().copied().cycle().take(len).collect()
}

fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
    sh_ok(&format!("sync '{}'", path.display()));
}

/// A new encrypted drive of `size` in a container named after `tag`: the
/// directory of its key file (kept while the test runs), the key file's
/// path, and the drive's spec.
fn encrypted_drive(tag: &str, size: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let spec = new_encrypted_drive(&BD, tag, size, &key);
    (dir, key.to_string_lossy().into_owned(), spec)
}

/// The drive's disk as the service holds it, read by Microsoft's Python SDK.
fn blob_bytes(spec: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("disk");
    common::sdk::read_blob(&BD.cs(), spec, &out);
    std::fs::read(&out).unwrap()
}

/// blobdrive's drive, read by cryptsetup and decrypted by Python with the key
/// cryptsetup dumps: exactly the bytes blobdrive serves.
#[test]
fn cryptsetup_opens_what_blobdrive_writes_and_its_key_decrypts_the_blob() {
    require_root();
    let (dir, kf, spec) = encrypted_drive("enc-out", "64MiB");
    let mp = mount(&spec, &["--mode", "raw", "--key-file", &kf]);
    // Whole pages, a lone 512-byte page of a 4096-byte sector, and a range
    // written then discarded.
    sh_ok(&format!(
        "set -e; d='{}'; printf '%s' '{}' > /tmp/.enc-pat-$$; \
         for i in $(seq 1 4000); do cat /tmp/.enc-pat-$$; done > /tmp/.enc-big-$$; \
         dd if=/tmp/.enc-big-$$ of=$d bs=4096 seek=100 conv=notrunc,fsync status=none; \
         dd if=/tmp/.enc-big-$$ of=$d bs=512 count=1 seek=9001 conv=notrunc,fsync status=none; \
         dd if=/tmp/.enc-big-$$ of=$d bs=1M seek=20 count=1 conv=notrunc,fsync status=none; \
         fallocate -p -o 20M -l 512K $d; rm -f /tmp/.enc-pat-$$ /tmp/.enc-big-$$",
        mp.disk(),
        String::from_utf8_lossy(PATTERN)
    ));
    let served = std::fs::read(mp.disk()).unwrap();
    assert_eq!(
        served.len() as u64,
        48 * MIB,
        "the disk less the 16 MiB header"
    );
    assert!(holds(&served, PATTERN));
    BD.unmount(&mp);
    // The service holds no plaintext.
    let on_blob = blob_bytes(&spec);
    assert!(!holds(&on_blob, PATTERN), "plaintext on the blob");
    let img = dir.path().join("drive.img");
    BD.ok(&["download", &spec, &img.to_string_lossy(), "--format", "raw"]);
    let dump = cryptsetup_ok(&["luksDump", &img.to_string_lossy()], b"");
    assert!(
        dump.contains("cipher: aes-xts-plain64") && dump.contains("PBKDF:      argon2id"),
        "{dump}"
    );
    assert!(cryptsetup_accepts(&img, PASSPHRASE));
    assert!(!cryptsetup_accepts(&img, b"not the passphrase"));
    assert!(
        decrypt_image(&img, 64 * MIB) == served,
        "cryptsetup's key decrypts the blob to what blobdrive served"
    );
}

/// An image cryptsetup formatted (an ext4 filesystem with a file in its data
/// segment, encrypted by Python with the key cryptsetup dumps), uploaded with
/// `blobdrive upload`, mounts with its passphrase and reads right.
#[test]
fn an_image_cryptsetup_formats_mounts_with_its_passphrase() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("theirs.img");
    cryptsetup_format(&img, 64 * MIB, PASSPHRASE, &[]);
    let content = dir.path().join("content");
    std::fs::create_dir(&content).unwrap();
    std::fs::write(content.join("hello.txt"), pattern(300_000)).unwrap();
    let fs = dir.path().join("fs.img");
    sh_ok(&format!(
        "set -e; truncate -s 48M '{0}'; mkfs.ext4 -q -b 4096 -d '{1}' '{0}'",
        fs.display(),
        content.display()
    ));
    let key = dump_volume_key(&img, PASSPHRASE);
    let ct = python_xts(&key, 4096, 0, &std::fs::read(&fs).unwrap(), false);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&ct, 16 * MIB).unwrap();
    }
    let spec = format!("{}/theirs.vhd", BD.new_container("enc-in"));
    BD.ok(&["upload", &img.to_string_lossy(), &spec]);
    let kf = key_file(dir.path());
    let mp = mount(&spec, &["--key-file", &kf.to_string_lossy()]);
    assert_eq!(
        std::fs::read(mp.path().join("hello.txt")).unwrap(),
        pattern(300_000)
    );
    BD.unmount(&mp);
}

/// A wrong passphrase, none, and one for a plain drive: one line each, and the
/// blob as it was (no lease taken, ETag unchanged).
#[test]
fn wrong_missing_and_misplaced_passphrases_change_nothing() {
    require_root();
    let (dir, kf, spec) = encrypted_drive("enc-wrong", "32MiB");
    let before = json(&BD.ok(&["info", &spec, "--json"]));
    let wrong = secret_file(dir.path(), "wrong.key", b"wrong");
    let mp = BD.mp();
    BD.cmd(&[
        "mount",
        &spec,
        mp.s(),
        "--key-file",
        &wrong.to_string_lossy(),
    ])
    .fails_with_error(&[
        "no keyslot",
        "opens with this passphrase",
        "nothing was changed",
    ]);
    BD.cmd(&["mount", &spec, mp.s()])
        .env_remove("BLOBDRIVE_PASSPHRASE")
        .fails_with_error(&["is encrypted (LUKS2)", "--key-file"]);
    let after = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(after["etag"], before["etag"]);
    assert_eq!(after["lease_state"], "available", "{after}");
    // create --json says what it made.
    let container = spec.split('/').next().unwrap();
    let made = json(&BD.ok(&[
        "create",
        &format!("{container}/small.vhd"),
        "--size",
        "17MiB",
        "--encrypt",
        "--key-file",
        &kf,
        "--sector-size",
        "512",
        "--json",
    ]));
    let want = serde_json::json!({"type": "luks2", "cipher": "aes-xts-plain64", "sector_size": 512, "data_offset": 16 * MIB});
    assert_eq!(made["encryption"], want, "{made}");
    BD.cmd(&[
        "create",
        &format!("{container}/tiny.vhd"),
        "--size",
        "16MiB",
        "--encrypt",
        "--key-file",
        &kf,
    ])
    .fails_with_error(&["needs at least 17 MiB"]);
    BD.cmd(&[
        "create",
        &format!("{container}/plain.vhd"),
        "--size",
        "32MiB",
        "--pbkdf",
        "pbkdf2",
    ])
    .fails_with_error(&["add --encrypt"]);
    let plain = BD.new_drive("enc-plain", "32MiB");
    BD.cmd(&["mount", &plain, mp.s(), "--key-file", &kf])
        .fails_with_error(&["is not encrypted", "mount it without one"]);
    // A key file others can read is refused before anything is asked.
    sh_ok(&format!("chmod 644 '{kf}'"));
    BD.cmd(&["mount", &spec, mp.s(), "--key-file", &kf])
        .fails_with_error(&["readable or writable by group or others", "chmod 600"]);
}

/// Keyslots added and removed with `blobdrive key`, used by cryptsetup; a
/// damaged first header copy is read from the second (with a warning) and
/// written whole again by the next key change.
#[test]
fn keyslots_and_a_damaged_first_header() {
    require_root();
    let (dir, kf, spec) = encrypted_drive("enc-keys", "32MiB");
    let recovery = secret_file(dir.path(), "recovery.key", b"recovery passphrase");
    let rf = recovery.to_string_lossy().into_owned();
    let out = BD.ok(&[
        "key",
        "add",
        &spec,
        "--key-file",
        &kf,
        "--new-key-file",
        &rf,
        "--pbkdf-memory",
        "16MiB",
    ]);
    assert!(out.contains("keyslot 1"), "{out}");
    let mp = mount(&spec, &["--mode", "raw", "--key-file", &rf]);
    BD.unmount(&mp);
    BD.ok(&["key", "remove", &spec, "--key-file", &kf]);
    let mp = BD.mp();
    BD.cmd(&["mount", &spec, mp.s(), "--key-file", &kf])
        .fails_with_error(&["no keyslot"]);
    BD.cmd(&["key", "remove", &spec, "--key-file", &rf])
        .fails_with_error(&["only keyslot"]);
    let img = dir.path().join("keys.img");
    BD.ok(&["download", &spec, &img.to_string_lossy(), "--format", "raw"]);
    assert!(cryptsetup_accepts(&img, b"recovery passphrase"));
    assert!(!cryptsetup_accepts(&img, PASSPHRASE));
    // Damage the first copy's JSON on the blob.
    let blob = BD.blob(&spec);
    common::util::rt().block_on(async {
        blob.put_pages(4096, bytes::Bytes::from(vec![b'x'; 512]), None)
            .await
            .unwrap();
    });
    let mp = BD.mp();
    let err = BD
        .cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--key-file", &rf])
        .output();
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(err.status.success(), "{stderr}");
    assert!(stderr.contains("second copy was used"), "{stderr}");
    BD.unmount(&mp);
    BD.ok(&[
        "key",
        "change",
        &spec,
        "--key-file",
        &rf,
        "--new-key-file",
        &kf,
        "--pbkdf",
        "pbkdf2",
    ]);
    let img = dir.path().join("healed.img");
    BD.ok(&["download", &spec, &img.to_string_lossy(), "--format", "raw"]);
    let head = std::fs::read(&img).unwrap();
    assert_eq!(&head[..6], b"LUKS\xba\xbe");
    assert!(
        !holds(&head[4096..16384], &[b'x'; 512]),
        "the first copy is written whole again"
    );
    assert!(cryptsetup_accepts(&img, PASSPHRASE));
    assert!(!cryptsetup_accepts(&img, b"recovery passphrase"));
}

/// Snapshots of a mounted encrypted drive, mounted themselves, and an
/// incremental download between two, decrypted with cryptsetup's key.
#[test]
fn snapshots_and_incremental_downloads_decrypt_with_cryptsetups_key() {
    require_root();
    let (dir, kf, spec) = encrypted_drive("enc-snap", "64MiB");
    let mp = mount(&spec, &["--mkfs", "ext4", "--key-file", &kf]);
    write_file(&mp.path().join("a"), &pattern(1 << 20));
    let a = json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    write_file(&mp.path().join("b"), &pattern(2 << 20));
    let b = json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    BD.unmount(&mp);
    let copy = dir.path().join("copy.vhd");
    BD.ok(&["download", &format!("{spec}@{a}"), &copy.to_string_lossy()]);
    BD.ok(&[
        "download",
        &format!("{spec}@{b}"),
        &copy.to_string_lossy(),
        "--since",
        &format!("{spec}@{a}"),
    ]);
    let snap = mount(
        &format!("{spec}@{b}"),
        &["--mode", "raw", "--key-file", &kf],
    );
    let served = std::fs::read(snap.disk()).unwrap();
    BD.unmount(&snap);
    assert!(decrypt_image(&copy, 64 * MIB) == served);
    // The snapshot mounted as a filesystem holds both files.
    let snap = mount(&format!("{spec}@{b}"), &["--key-file", &kf]);
    assert_eq!(
        std::fs::read(snap.path().join("b")).unwrap(),
        pattern(2 << 20)
    );
    BD.unmount(&snap);
}

/// Growing a mounted encrypted drive grows its data segment and the
/// filesystem on it (xfs: a mounted ext4 grows only with CAP_SYS_RESOURCE,
/// which the machine this was written on lacks); the header is left as it is.
#[test]
fn online_growth_grows_the_data_segment() {
    require_root();
    let (_dir, kf, spec) = encrypted_drive("enc-grow", "336MiB");
    let mp = mount(&spec, &["--mkfs", "xfs", "--key-file", &kf]);
    write_file(&mp.path().join("before"), &pattern(1 << 20));
    assert_eq!(mp.stats()["disk_size"], 320 * MIB);
    let head = || {
        common::util::rt()
            .block_on(BD.blob(&spec).read(0, 32768))
            .unwrap()
    };
    let header = head();
    let df = || {
        let out = sh_ok(&format!("df -B1M --output=size '{}' | tail -1", mp.s()));
        out.trim().parse::<u64>().unwrap()
    };
    let fs_before = df();
    let out = BD.ok(&["resize", &spec, "--size", "400MiB"]);
    assert!(
        out.contains("grew") && out.contains("xfs filesystem"),
        "{out}"
    );
    assert_eq!(mp.stats()["disk_size"], 384 * MIB);
    assert_eq!(
        head(),
        header,
        "the header is as it was: its segment is dynamic"
    );
    assert!(
        df() >= fs_before + 60,
        "the filesystem grew from {fs_before} MiB to {} MiB",
        df()
    );
    // More than the old filesystem had room for.
    write_file(&mp.path().join("after"), &pattern(250 << 20));
    BD.unmount(&mp);
    let mp = mount(&spec, &["--key-file", &kf]);
    assert!(std::fs::read(mp.path().join("after")).unwrap() == pattern(250 << 20));
    BD.unmount(&mp);
}

/// With a disk cache, no plaintext byte reaches the local disk either; and the
/// mount's log (at trace level) holds neither the passphrase nor the volume
/// key.
#[test]
fn no_plaintext_in_the_disk_cache_and_no_key_in_the_log() {
    require_root();
    let (dir, kf, spec) = encrypted_drive("enc-cache", "64MiB");
    let cache = tempfile::tempdir().unwrap();
    common::util::private_dir(cache.path());
    let args = [
        "--key-file",
        &kf,
        "--disk-cache",
        cache.path().to_str().unwrap(),
    ];
    let mp = BD.mp();
    BD.cmd(&[&["mount", &spec, mp.s(), "--mkfs", "ext4"], &args[..]].concat())
        .env("BLOBDRIVE_LOG", "trace")
        .ok();
    write_file(&mp.path().join("secret"), &pattern(4 << 20));
    let id = blobdrive::mount::record::id_for(mp.path());
    let log_path = BD.run_dir().join("mounts").join(format!("{id}.log"));
    // The root part copies the worker's log as it comes.
    common::util::wait_for(
        "the worker's log",
        std::time::Duration::from_secs(10),
        || std::fs::read(&log_path).is_ok_and(|l| holds(&l, b"data from")),
    );
    let log = std::fs::read(&log_path).unwrap();
    BD.unmount(&mp);
    // Mounted again, warmed up and read through the disk cache.
    let mp = mount(&spec, &[&args[..], &["--warm"]].concat());
    common::util::wait_for("the warm-up", std::time::Duration::from_secs(60), || {
        mp.stats()["warm_up"]["running"] == false
    });
    let warm = &mp.stats()["warm_up"];
    assert!(
        warm["error"].is_null() && warm["allocated"].as_u64() > Some(4 << 20),
        "{warm}"
    );
    assert_eq!(
        std::fs::read(mp.path().join("secret")).unwrap(),
        pattern(4 << 20)
    );
    BD.unmount(&mp);
    let mut cached = 0;
    for f in common::util::files_on_its_filesystem(cache.path()) {
        let bytes = std::fs::read(&f).unwrap_or_default();
        cached += bytes.len();
        assert!(!holds(&bytes, PATTERN), "plaintext in {}", f.display());
    }
    assert!(
        cached > 4 << 20,
        "the disk cache holds the data ({cached} bytes)"
    );
    assert!(!holds(&blob_bytes(&spec), PATTERN));
    let img = dir.path().join("cache.img");
    BD.ok(&["download", &spec, &img.to_string_lossy(), "--format", "raw"]);
    let volume_key = dump_volume_key(&img, PASSPHRASE);
    let hex: String = volume_key.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!holds(&log, PASSPHRASE), "the passphrase is in the log");
    assert!(
        !holds(&log, b"could not lock key material"),
        "the worker may not lock its keys"
    );
    assert!(
        !holds(&log, &volume_key[..16]) && !holds(&log, &hex.as_bytes()[..32]),
        "the key is in the log"
    );
    assert!(
        String::from_utf8_lossy(&log).contains("encrypted (LUKS2"),
        "the log is the mount's: {}",
        String::from_utf8_lossy(&log)
    );
}

/// The passphrase from `BLOBDRIVE_PASSPHRASE` and from a systemd credential
/// named `key` (`$CREDENTIALS_DIRECTORY/key`, as `LoadCredential=key:...`
/// hands it over); and `--no-discard`: a hole punched in the raw disk is
/// refused (EOPNOTSUPP), its bytes stay on the blob and read back.
#[test]
fn passphrases_from_the_environment_or_a_credential_and_discards_kept_local() {
    require_root();
    let (_dir, kf, spec) = encrypted_drive("enc-env", "32MiB");
    let passphrase = String::from_utf8(PASSPHRASE.to_vec()).unwrap();
    let mp = BD.mp();
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .env("BLOBDRIVE_PASSPHRASE", &passphrase)
        .ok();
    BD.unmount(&mp);
    let creds = tempfile::tempdir().unwrap();
    std::fs::copy(&kf, creds.path().join("key")).unwrap();
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--no-discard"])
        .env_remove("BLOBDRIVE_PASSPHRASE")
        .env("CREDENTIALS_DIRECTORY", creds.path())
        .ok();
    let data = pattern(1 << 20);
    {
        use std::os::unix::fs::FileExt;
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mp.disk())
            .unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
        // SAFETY: fallocate on an open descriptor with in-range arguments.
        let rc = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                1 << 20,
            )
        };
        let e = std::io::Error::last_os_error();
        assert_eq!(rc, -1, "a discard was taken under --no-discard");
        assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
        let mut back = vec![0u8; 1 << 20];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == data);
    }
    BD.unmount(&mp);
    let on_blob = common::sdk::page_ranges(&BD.cs(), &spec);
    let data_pages: u64 = on_blob
        .iter()
        .map(|&(s, e)| e.min(17 << 20).saturating_sub(s.max(16 << 20)))
        .sum();
    assert_eq!(data_pages, 1 << 20, "the blob lost the range: {on_blob:?}");
}

/// The logical block size of the loop device of the mount `mp`, as
/// `blockdev --getss` says.
fn logical_block_size(mp: &common::mount::Mp) -> u32 {
    let dev = mp.listed()["device"].as_str().unwrap().to_string();
    sh_ok(&format!("blockdev --getss '{dev}'"))
        .trim()
        .parse()
        .unwrap()
}

/// The loop device of an encrypted drive has the data segment's sector size
/// as its logical block size, as dm-crypt's device has, so a filesystem made
/// through blobdrive suits the device cryptsetup opens elsewhere: an xfs made
/// on a drive of 4096-byte sectors has 4096-byte sectors, and the image
/// decrypted with cryptsetup's key mounts on a device of 4096-byte sectors
/// (a loop device over the decrypted image with `--sector-size 4096`: what
/// `cryptsetup open` would give where device-mapper is, which this machine's
/// kernel lacks). Before, mkfs.xfs took 512-byte sectors, which such a device
/// refuses to mount. A drive of 512-byte sectors keeps 512.
#[test]
fn a_filesystem_made_through_blobdrive_has_the_drives_sector_size() {
    require_root();
    let (dir, kf, spec) = encrypted_drive("enc-sect", "336MiB");
    let mp = mount(&spec, &["--mkfs", "xfs", "--key-file", &kf]);
    assert_eq!(logical_block_size(&mp), 4096);
    write_file(&mp.path().join("note"), &pattern(100_000));
    BD.unmount(&mp);
    let img = dir.path().join("sect.img");
    BD.ok(&["download", &spec, &img.to_string_lossy(), "--format", "raw"]);
    let plain = dir.path().join("plain.img");
    std::fs::write(&plain, decrypt_image(&img, 336 * MIB)).unwrap();
    let sectsize = sh_ok(&format!(
        "xfs_db -r -c 'sb 0' -c 'p sectsize' '{}'",
        plain.display()
    ));
    assert_eq!(sectsize.trim(), "sectsize = 4096");
    let at = dir.path().join("mnt");
    std::fs::create_dir(&at).unwrap();
    let copy = dir.path().join("note");
    sh_ok(&format!(
        "set -e; dev=$(losetup -f --show -r --sector-size 4096 '{}'); \
         trap 'umount \"{1}\" 2>/dev/null; losetup -d $dev' EXIT; \
         mount -t xfs -o ro $dev '{1}'; cp '{1}/note' '{2}'",
        plain.display(),
        at.display(),
        copy.display()
    ));
    assert!(std::fs::read(&copy).unwrap() == pattern(100_000));
    // A drive of 512-byte sectors, in block mode.
    let small = format!("{}/small.vhd", BD.new_container("enc-sect512"));
    BD.ok(&[
        "create",
        &small,
        "--size",
        "32MiB",
        "--encrypt",
        "--sector-size",
        "512",
        "--key-file",
        &kf,
    ]);
    let mp = mount(&small, &["--mode", "block", "--key-file", &kf]);
    assert_eq!(logical_block_size(&mp), 512);
    BD.unmount(&mp);
}

/// `info` (text and `--json` alike) says a drive is encrypted, from its header
/// read without a passphrase: the cipher and its key size, the sector size,
/// where the data starts, the keyslots in use and how each derives its key;
/// a plain drive's `encryption` is null; a header both of whose copies are
/// damaged is said to be unreadable, and the drive is still refused as plain.
#[test]
fn info_says_what_the_header_says_without_a_passphrase() {
    use common::facts::{strings, text_and_json};
    let (dir, kf, spec) = encrypted_drive("enc-info", "32MiB");
    let recovery = secret_file(dir.path(), "recovery.key", b"recovery passphrase");
    BD.ok(&[
        "key",
        "add",
        &spec,
        "--key-file",
        &kf,
        "--new-key-file",
        &recovery.to_string_lossy(),
        "--pbkdf",
        "pbkdf2",
    ]);
    let info = text_and_json(&BD, &|_| strings(&["info", &spec]), true, &[], &[]);
    let e = &info["encryption"];
    assert_eq!(e["type"], "luks2", "{info}");
    assert_eq!(e["cipher"], "aes-xts-plain64");
    assert_eq!(e["key_bits"], 512);
    assert_eq!(e["sector_size"], 4096);
    assert_eq!(e["data_offset"], 16 * MIB);
    assert_eq!(
        e["keyslots"],
        serde_json::json!([{"id": 0, "kdf": "argon2id"}, {"id": 1, "kdf": "pbkdf2"}])
    );
    assert_eq!(e["header_copy"], "first");
    assert!(e["other_copy"].is_null() && e["problem"].is_null(), "{e}");
    let text = BD.ok(&["info", &spec]);
    assert!(
        text.contains("encryption:   luks2, aes-xts-plain64")
            && text.contains("0 (argon2id), 1 (pbkdf2)"),
        "{text}"
    );
    let plain = BD.new_drive("enc-info-plain", "32MiB");
    assert!(json(&BD.ok(&["info", &plain, "--json"]))["encryption"].is_null());
    assert!(BD.ok(&["info", &plain]).contains("encryption:   none"));
    // Both copies' JSON areas damaged: no header to read, still not plain.
    let blob = BD.blob(&spec);
    common::util::rt().block_on(async {
        for at in [4096, 16384 + 4096] {
            blob.put_pages(at, bytes::Bytes::from(vec![b'x'; 512]), None)
                .await
                .unwrap();
        }
    });
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    let e = &info["encryption"];
    assert_eq!(e["type"], "luks2", "{info}");
    assert!(e["problem"].as_str().unwrap().contains("checksum"), "{e}");
    assert!(e["sector_size"].is_null(), "{e}");
    let text = BD.ok(&["info", &spec]);
    assert!(text.contains("its header cannot be read"), "{text}");
}

/// A drive cryptsetup formatted with a header larger than its default (64
/// KiB, so the second copy is at 64 KiB), its first copy then damaged: with
/// no passphrase it is refused in one line, as an encrypted drive, not
/// served as a plain one (before, only the default place of the second copy
/// was looked at); `info` says the second copy is in use; with its passphrase
/// it mounts from the second copy.
#[test]
fn a_drive_whose_only_whole_header_is_at_another_place_is_not_taken_for_plain() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("big-header.img");
    cryptsetup_format(
        &img,
        64 * MIB,
        PASSPHRASE,
        &["--luks2-metadata-size", "64k"],
    );
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&[0u8; 4096], 0).unwrap();
    }
    let spec = format!("{}/big-header.vhd", BD.new_container("enc-second"));
    BD.ok(&["upload", &img.to_string_lossy(), &spec]);
    let before = json(&BD.ok(&["info", &spec, "--json"]));
    let e = &before["encryption"];
    assert_eq!(e["header_copy"], "second", "{before}");
    assert!(
        e["other_copy"].as_str().unwrap().contains("first copy"),
        "{e}"
    );
    let mp = BD.mp();
    for mode in ["raw", "fs"] {
        BD.cmd(&["mount", &spec, mp.s(), "--mode", mode])
            .env_remove("BLOBDRIVE_PASSPHRASE")
            .fails_with_error(&["is encrypted (LUKS2)", "--key-file"]);
    }
    let after = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(after["etag"], before["etag"]);
    assert_eq!(after["lease_state"], "available", "{after}");
    let kf = key_file(dir.path());
    let out = BD
        .mount_cmd(
            &spec,
            &mp,
            &["--mode", "raw", "--key-file", &kf.to_string_lossy()],
        )
        .output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("second copy was used"), "{stderr}");
    BD.unmount(&mp);
}

/// Growing an encrypted drive that is not mounted says what is true of it
/// (the data segment grew with the disk; the filesystem in it, which cannot
/// be read without the passphrase, grows at the next writable mount), in the
/// text and in `--json`'s note; and the next mount grows the filesystem.
/// Before, nothing was said: the superblock was looked for where the header
/// is.
#[test]
fn growing_an_unmounted_encrypted_drive_says_the_filesystem_grows_at_the_next_mount() {
    require_root();
    let (_dir, kf, spec) = encrypted_drive("enc-offline", "64MiB");
    let mp = mount(&spec, &["--mkfs", "ext4", "--key-file", &kf]);
    write_file(&mp.path().join("kept"), &pattern(1 << 20));
    BD.unmount(&mp);
    let out = BD.ok(&["resize", &spec, "--size", "128MiB"]);
    for said in [
        "encrypted (luks2)",
        "data segment grew with the disk",
        "plaintext disk is now 112 MiB",
        "next writable `blobdrive mount`",
    ] {
        assert!(out.contains(said), "{said:?} not in: {out}");
    }
    let grown = json(&BD.ok(&["resize", &spec, "--size", "160MiB", "--json"]));
    let note = grown["note"].as_str().unwrap_or_default();
    assert!(note.contains("plaintext disk is now 144 MiB"), "{grown}");
    let mp = mount(&spec, &["--key-file", &kf]);
    let size_mib: u64 = sh_ok(&format!("df -B1M --output=size '{}' | tail -1", mp.s()))
        .trim()
        .parse()
        .unwrap();
    assert!(size_mib > 120, "the filesystem is {size_mib} MiB");
    assert!(std::fs::read(mp.path().join("kept")).unwrap() == pattern(1 << 20));
    BD.unmount(&mp);
}

/// `create --encrypt` writes the LUKS2 header, both copies, before the VHD
/// footer that makes the blob a drive (seen in the order the service got the
/// writes): a create stopped in between leaves no drive, never a plain one
/// that looks finished and that a later mount would take as plain.
#[test]
fn create_writes_both_header_copies_before_the_footer() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let spec = format!(
        "{}/disk.vhd",
        common::azurite::unique_container("enc-order")
    );
    let rec = recorder::Recorder::start(recorder::Config {
        upstream_port: common::azurite::Azurite::shared().port,
        blob: spec.clone(),
        drop_rate: 0.0,
        seed: 0,
        plant: None,
    });
    BD.cmd(&[
        "create",
        &spec,
        "--size",
        "32MiB",
        "--create-container",
        "--encrypt",
        "--key-file",
        &key.to_string_lossy(),
        "--pbkdf-memory",
        "16MiB",
    ])
    .cs(&rec.connection_string())
    .ok();
    let puts: Vec<(u64, u64)> = rec
        .records()
        .iter()
        .filter(|r| r.applied())
        .filter_map(|r| match r.op {
            recorder::Op::Put { start, end } => Some((start, end)),
            _ => None,
        })
        .collect();
    let footer = puts
        .iter()
        .position(|&(start, _)| start == 32 * MIB)
        .unwrap_or_else(|| panic!("no footer written: {puts:?}"));
    for (copy, at) in [("first", 0), ("second", 16 << 10)] {
        let header = puts
            .iter()
            .position(|&(start, end)| start <= at && at < end)
            .unwrap_or_else(|| panic!("the {copy} header copy was not written: {puts:?}"));
        assert!(
            header < footer,
            "the {copy} header copy was written after the footer: {puts:?}"
        );
    }
}

/// A blob that a create left without its footer (stopped after creating it):
/// `create` again, `info` and `mount` each refuse it in one line that says what
/// it is and what to do, and change nothing.
#[test]
fn a_create_stopped_before_its_footer_is_said_so_everywhere() {
    let container = BD.new_container("enc-unfinished");
    let spec = format!("{container}/disk.vhd");
    let blob = BD.blob(&spec);
    common::util::rt()
        .block_on(blob.create_page_blob(32 * MIB + 512))
        .unwrap();
    let said = "its creation stopped before the VHD footer was written";
    BD.cmd(&["create", &spec, "--size", "32MiB"])
        .fails_with_error(&[said]);
    BD.cmd(&["info", &spec]).fails_with_error(&[said]);
    let mp = BD.mp();
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--read-only"])
        .fails_with_error(&[said]);
    let props = common::util::rt().block_on(blob.properties()).unwrap();
    assert_eq!(props.content_length, 32 * MIB + 512);
    BD.ok(&["delete", &spec, "--yes"]);
    BD.ok(&["create", &spec, "--size", "32MiB"]);
}

/// A key command's Acquire Lease held past the client's timeout and carried
/// out after the command ended takes nothing, as a resize's does
/// (`an_acquire_that_lands_after_the_resize_ended_takes_nothing`): the lease is
/// asked on the condition of the drive as read, which the new keyslot changed,
/// so the drive stays free rather than leased for a minute to nobody.
#[test]
fn an_acquire_that_lands_after_a_key_change_ended_takes_nothing() {
    let (dir, kf, spec) = encrypted_drive("enc-lateacq", "32MiB");
    let new = secret_file(dir.path(), "new.key", b"a new passphrase");
    let nf = new.to_string_lossy().into_owned();
    let proxy = faultproxy::Proxy::start(faultproxy::Config::holding(
        common::azurite::Azurite::shared().port,
        "x-ms-lease-action: acquire",
        1,
        std::time::Duration::from_secs(20),
    ));
    let change = |from: &str, to: &str| {
        [
            "key",
            "change",
            &spec,
            "--key-file",
            from,
            "--new-key-file",
            to,
            "--pbkdf-memory",
            "16MiB",
        ]
        .map(str::to_string)
    };
    let args = change(&kf, &nf);
    BD.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .cs(&proxy.connection_string())
        .envs(&[("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")])
        .ok();
    proxy.held_lands_late_and_is_refused("acquire");
    // The drive is free: the next key command takes its lease at once.
    let args = change(&nf, &kf);
    BD.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
}

/// A mount whose drive changed between reading it and taking its lease (the
/// acquire refused "ConditionNotMet", twice, by a liar on loopback) reads the
/// drive again, and the LUKS2 header with it, but derives the passphrase's key
/// (seconds of Argon2id at the default settings) only once: the header is
/// unchanged, so the volume key opened in the first round is kept.
#[test]
fn a_mount_reading_its_drive_again_before_its_lease_derives_the_key_once() {
    require_root();
    let (_dir, kf, spec) = encrypted_drive("enc-rounds", "32MiB");
    let liar = liar::Liar::start(common::azurite::Azurite::shared().port, |spec, at, len| {
        common::util::rt()
            .block_on(common::azurite::blob_client(&BD.cs(), spec).read(at, len))
            .unwrap()
            .to_vec()
    });
    liar.add(liar::Rule::on(
        &["x-ms-lease-action: acquire"],
        2,
        liar::Lie::Refuse(412, "ConditionNotMet"),
    ));
    let via = BD.via(&liar.connection_string(), &[("BLOBDRIVE_LOG", "info")]);
    let mp = via.mount(&spec, &["--mode", "raw", "--key-file", &kf]);
    assert_eq!(liar.told().len(), 2, "the acquire was refused twice");
    let id = blobdrive::mount::record::id_for(mp.path());
    let log_path = BD.run_dir().join("mounts").join(format!("{id}.log"));
    let count = |log: &str, line: &str| log.matches(line).count();
    common::util::wait_for(
        "the worker's log",
        std::time::Duration::from_secs(10),
        || std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("acquired the lease")),
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(count(&log, "reading it again"), 2, "{log}");
    assert_eq!(
        count(&log, "encrypted (LUKS2, aes-xts-plain64"),
        1,
        "the key was derived in every round: {log}"
    );
    assert_eq!(
        count(&log, "the volume key opened then is kept"),
        2,
        "{log}"
    );
    let served = std::fs::metadata(mp.disk()).unwrap().len();
    assert_eq!(served, 16 * MIB, "the plaintext disk is served");
    via.unmount(&mp);
}
