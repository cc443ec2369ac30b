//! Encrypted drives in tests: cryptsetup (Debian's cryptsetup-bin, which reads
//! and writes LUKS2 headers on plain files without device-mapper), the volume
//! key it dumps, an independent AES-XTS (Python's `cryptography`, OpenSSL's),
//! and a plain file as a LUKS2 header's disk for blobdrive's own library.
//!
//! Tests that mount encrypted drives make them with [`new_encrypted_drive`],
//! mount them with `--key-file` [`key_file`] (which holds [`PASSPHRASE`]), and
//! read what the blob holds as plaintext with [`open_drive`] and [`plaintext`].

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use blobdrive::luks::{HeaderDisk, LuksError};

/// The passphrase the tests' encrypted drives are made with.
pub const PASSPHRASE: &[u8] = b"correct horse battery staple";

/// A plain file as the disk of a LUKS2 header.
pub struct FileDisk(pub std::fs::File);

impl FileDisk {
    pub fn open(path: &Path) -> FileDisk {
        FileDisk(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        )
    }
}

impl HeaderDisk for FileDisk {
    async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, LuksError> {
        let mut buf = vec![0u8; len];
        self.0
            .read_exact_at(&mut buf, offset)
            .map_err(|e| LuksError::Io(e.to_string()))?;
        Ok(buf)
    }
    async fn write(&self, offset: u64, data: Vec<u8>) -> Result<(), LuksError> {
        self.0
            .write_all_at(&data, offset)
            .map_err(|e| LuksError::Io(e.to_string()))
    }
    async fn clear(&self, offset: u64, len: u64) -> Result<(), LuksError> {
        self.0
            .write_all_at(&vec![0u8; len as usize], offset)
            .map_err(|e| LuksError::Io(e.to_string()))
    }
}

/// Runs a future of blobdrive's library to its end.
pub fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// `cryptsetup ARGS --key-file -` with `key` on its standard input. cryptsetup
/// is required: a skipped interoperability test proves nothing.
pub fn cryptsetup(args: &[&str], key: &[u8]) -> Output {
    let mut child = Command::new("cryptsetup")
        .args(args)
        .args(["--key-file", "-", "--batch-mode"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cryptsetup could not be run ({e}); this test needs it: install cryptsetup-bin (scripts/install-deps.sh does)")
        });
    child.stdin.take().unwrap().write_all(key).unwrap();
    child.wait_with_output().unwrap()
}

/// `cryptsetup ARGS` that must succeed; its standard output.
pub fn cryptsetup_ok(args: &[&str], key: &[u8]) -> String {
    let out = cryptsetup(args, key);
    assert!(
        out.status.success(),
        "cryptsetup {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The volume key cryptsetup dumps for `image` opened with `key`.
pub fn dump_volume_key(image: &Path, key: &[u8]) -> Vec<u8> {
    let out = cryptsetup_ok(
        &["luksDump", "--dump-volume-key", &image.to_string_lossy()],
        key,
    );
    let at = out.find("MK dump:").expect("a volume key in the dump") + "MK dump:".len();
    out[at..]
        .split_whitespace()
        .take_while(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        .map(|w| u8::from_str_radix(w, 16).unwrap())
        .collect()
}

/// Whether cryptsetup accepts `key` for `image`.
pub fn cryptsetup_accepts(image: &Path, key: &[u8]) -> bool {
    cryptsetup(
        &["open", "--test-passphrase", &image.to_string_lossy()],
        key,
    )
    .status
    .success()
}

/// A LUKS2 image made by cryptsetup: `size` bytes, `extra` options (cheap
/// keyslots unless `extra` says otherwise).
pub fn cryptsetup_format(image: &Path, size: u64, key: &[u8], extra: &[&str]) {
    let f = std::fs::File::create(image).unwrap();
    f.set_len(size).unwrap();
    let mut args = vec!["luksFormat", "--type", "luks2"];
    if !extra.iter().any(|a| a.starts_with("--pbkdf")) {
        args.extend([
            "--pbkdf",
            "argon2id",
            "--pbkdf-memory",
            "65536",
            "--pbkdf-force-iterations",
            "4",
        ]);
    }
    args.extend(extra);
    let path = image.to_string_lossy().into_owned();
    args.push(&path);
    cryptsetup_ok(&args, key);
}

/// aes-xts-plain64 by Python's `cryptography` (OpenSSL): `data` is whole
/// sectors of `sector` bytes, the first at byte `at` of the segment; `decrypt`
/// or encrypt. LUKS2 counts tweaks in 512-byte units at every sector size.
pub fn python_xts(key: &[u8], sector: usize, at: u64, data: &[u8], decrypt: bool) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::write(&input, data).unwrap();
    let output = dir.path().join("out");
    let script = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
key = bytes.fromhex(sys.argv[1]); sector = int(sys.argv[2]); at = int(sys.argv[3])
decrypt = sys.argv[4] == "1"
data = open(sys.argv[5], "rb").read()
out = bytearray()
for i in range(0, len(data), sector):
    tweak = ((at + i) // 512).to_bytes(16, "little")
    c = Cipher(algorithms.AES(key), modes.XTS(tweak))
    op = c.decryptor() if decrypt else c.encryptor()
    out += op.update(data[i:i + sector]) + op.finalize()
open(sys.argv[6], "wb").write(bytes(out))
"#;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let status = Command::new("python3")
        .args(["-c", script, &hex, &sector.to_string(), &at.to_string()])
        .arg(if decrypt { "1" } else { "0" })
        .arg(&input)
        .arg(&output)
        .status()
        .expect("python3 runs");
    assert!(
        status.success(),
        "python3's AES-XTS failed (python3-cryptography installed?)"
    );
    std::fs::read(&output).unwrap()
}

/// A file holding [`PASSPHRASE`], root's alone, in `dir`.
pub fn key_file(dir: &Path) -> PathBuf {
    secret_file(dir, "drive.key", PASSPHRASE)
}

/// A file `name` in `dir` holding `passphrase`, root's alone from the moment
/// it exists (blobdrive refuses a key file others may read).
pub fn secret_file(dir: &Path, name: &str, passphrase: &[u8]) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    f.write_all(passphrase).unwrap();
    path
}

/// A new encrypted drive of `size` in a new container named after `tag`, its
/// passphrase [`PASSPHRASE`] from the key file `key`: its spec.
pub fn new_encrypted_drive(bd: &super::bd::Harness, tag: &str, size: &str, key: &Path) -> String {
    let spec = format!("{}/disk.vhd", super::azurite::unique_container(tag));
    bd.ok(&[
        "create",
        &spec,
        "--size",
        size,
        "--create-container",
        "--encrypt",
        "--key-file",
        &key.to_string_lossy(),
    ]);
    spec
}

/// The data segment's sector size, as cryptsetup's `luksDump` of `image` says.
pub fn sector_size(image: &Path) -> usize {
    segment_field(image, "sector") as usize
}

/// Where the data segment starts, in bytes, as cryptsetup's `luksDump` of
/// `image` says.
pub fn data_offset(image: &Path) -> u64 {
    segment_field(image, "offset")
}

/// The number `name: N [bytes]` of the first data segment in cryptsetup's
/// `luksDump` of `image`.
fn segment_field(image: &Path, name: &str) -> u64 {
    let dump = cryptsetup_ok(&["luksDump", &image.to_string_lossy()], b"");
    let segments = dump
        .find("Data segments:")
        .expect("data segments in the dump");
    let field = format!("{name}: ");
    let at = dump[segments..]
        .find(&field)
        .unwrap_or_else(|| panic!("no {name} in the data segment: {dump}"));
    dump[segments + at + field.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The plaintext of the data segment of `image` (a downloaded drive, raw or
/// VHD, whose disk is `disk_size` bytes), decrypted by Python's
/// `cryptography` with the volume key cryptsetup dumps for [`PASSPHRASE`]:
/// what any Linux host reads of it. Sectors all zeros (never written) are
/// left as zeros, as blobdrive serves them.
pub fn decrypt_image(image: &Path, disk_size: u64) -> Vec<u8> {
    let key = dump_volume_key(image, PASSPHRASE);
    let sector = sector_size(image);
    let offset: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plain");
    let script = r#"
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
key = bytes.fromhex(sys.argv[1]); sector = int(sys.argv[2])
start = int(sys.argv[3]); end = int(sys.argv[4])
src = open(sys.argv[5], "rb"); src.seek(start)
seg = src.read(end - start)
out = bytearray(len(seg))
zero = bytes(512)
for i in range(0, len(seg) - len(seg) % sector, sector):
    s = seg[i:i + sector]
    if s.count(0) == len(s):
        continue
    c = Cipher(algorithms.AES(key), modes.XTS((i // 512).to_bytes(16, "little"))).decryptor()
    p = c.update(s) + c.finalize()
    for j in range(0, sector, 512):
        if s[j:j + 512] != zero:
            out[i + j:i + j + 512] = p[j:j + 512]
open(sys.argv[6], "wb").write(bytes(out))
"#;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let status = Command::new("python3")
        .args(["-c", script, &hex, &sector.to_string()])
        .args([offset.to_string(), disk_size.to_string()])
        .arg(image)
        .arg(&out)
        .status()
        .expect("python3 runs");
    assert!(status.success(), "decrypting {} failed", image.display());
    std::fs::read(&out).unwrap()
}

/// Whether `needle` occurs anywhere in `hay`.
pub fn holds(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// An encrypted drive on `blob` (whose disk is `disk_size` bytes), opened
/// with [`PASSPHRASE`] by blobdrive's own library: for a test that checks
/// what the blob holds against a model (the torture test, a crash replayer),
/// not for interoperability (that is [`decrypt_image`]'s).
pub fn open_drive(
    blob: &blobdrive::azure::BlobClient,
    disk_size: u64,
) -> blobdrive::encrypted::Opened {
    super::util::rt()
        .block_on(blobdrive::encrypted::open(blob, PASSPHRASE, disk_size))
        .expect("the drive opens with the tests' passphrase")
}

/// `len` bytes of the plaintext disk of the drive `opened`, from the blob:
/// its data segment read and decrypted (pages the blob never held, zeros).
pub fn plaintext(
    blob: &blobdrive::azure::BlobClient,
    opened: &blobdrive::encrypted::Opened,
    len: u64,
) -> Vec<u8> {
    let mut bytes = super::util::rt()
        .block_on(blob.read(opened.data_offset, len))
        .unwrap()
        .to_vec();
    opened.cipher.decrypt_data(0, &mut bytes);
    bytes
}
