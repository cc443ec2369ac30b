//! `blobdrive resize` of a drive mounted on this machine, against Azurite: ext4 and
//! xfs grow in place while a program writes (no I/O error, every file intact,
//! the filesystem clean), the raw file and the loop device take the new size, a
//! read-only mount of the live blob keeps serving the size it was mounted with,
//! and a shrink or a read-only mount is refused with one line. A length change
//! given up on and carried out after a later, larger resize is refused by the
//! service instead of cutting the drive back.

mod common;
mod faultproxy;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::azurite::Azurite;
use common::bd::Harness;
use common::mount::require_root;
use common::util::{has_cap_sys_resource, json, rt, sh_ok};
use faultproxy::{Config, Proxy};

const MIB: u64 = 1 << 20;

const BD: Harness = Harness::new("resize-online-run");

fn info_size(spec: &str) -> u64 {
    json(&BD.ok(&["info", spec, "--json"]))["size_bytes"]
        .as_u64()
        .unwrap()
}

/// 256 KiB of a pattern that differs from file to file.
fn pattern(i: u64) -> Vec<u8> {
    (0..256 * 1024u64)
        .map(|j| ((i * 7919 + j * 31) % 251) as u8)
        .collect()
}

/// How many of its files the writer keeps (256 KiB each).
const LIVE_FILES: u64 = 32;

/// A program writing files into `dir` until told to stop: each one written
/// whole, fsynced, then the next. Any I/O error ends it and is returned.
struct Writer {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<u64, String>>>,
}

/// A test that fails while the writer runs must stop it before the mount's own
/// cleanup, which a busy filesystem would refuse (leaving it mounted).
impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Writer {
    fn start(dir: &Path) -> Writer {
        let dir = dir.to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                let path = dir.join(format!("w{n}.bin"));
                let mut f = std::fs::File::create(&path).map_err(|e| format!("create {n}: {e}"))?;
                f.write_all(&pattern(n))
                    .map_err(|e| format!("write {n}: {e}"))?;
                f.sync_all().map_err(|e| format!("fsync {n}: {e}"))?;
                n += 1;
                // Files come and go too (the filesystem's allocator is busy), and
                // at most LIVE_FILES stay: however fast the machine writes, the
                // drive does not fill before it grows (a fast run once wrote 283
                // files, 53 MiB kept, into the 64 MiB ext4 drive, which this
                // machine grows only after unmounting).
                if n > LIVE_FILES {
                    let old = n - 1 - LIVE_FILES;
                    std::fs::remove_file(dir.join(format!("w{old}.bin")))
                        .map_err(|e| format!("remove {old}: {e}"))?;
                }
            }
            Ok(n)
        });
        Writer {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops it; the number of files written, each of which must be intact.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let n = self.handle.take().unwrap().join().unwrap();
        n.unwrap_or_else(|e| panic!("the writer saw an I/O error: {e}"))
    }
}

fn check_written(dir: &Path, n: u64) {
    assert!(n >= 4, "the writer wrote only {n} files");
    for i in 0..n {
        let path = dir.join(format!("w{i}.bin"));
        // The writer keeps the last LIVE_FILES it wrote.
        if i + LIVE_FILES < n {
            assert!(!path.exists(), "w{i}.bin came back");
            continue;
        }
        assert!(
            std::fs::read(&path).unwrap() == pattern(i),
            "w{i}.bin changed"
        );
    }
}

/// Grows a mounted `fstype` filesystem from `from` to `to` MiB while a program
/// writes into it, then fills more than the old size allowed; after unmounting,
/// the filesystem checks clean and every file reads back.
///
/// The kernel grows a mounted ext4 only for a process with CAP_SYS_RESOURCE. A
/// machine without it (a container that drops it, like the one this was written
/// on) must refuse before changing anything, with a message naming the way that
/// works without it, and that way (unmount, resize, mount again: the mount grows
/// the filesystem by itself, nothing done by hand) is then taken and checked the
/// same.
fn grow_in_place_while_writing(fstype: &str, from: u64, to: u64) {
    require_root();
    let spec = BD.new_drive(&format!("online-{fstype}"), &format!("{from}MiB"));
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mkfs", fstype]);
    let fs_before = statvfs_size(mp.path());
    let in_place = fstype != "ext4" || has_cap_sys_resource();
    let size = format!("{to}MiB");
    let writer = Writer::start(mp.path());
    std::thread::sleep(Duration::from_secs(2));
    if in_place {
        let out = BD.ok(&["resize", mp.s(), "--size", &size]);
        assert!(
            out.contains(&format!("grew {spec} from {from} MiB to {to} MiB"))
                && out.contains(&format!("the {fstype} filesystem at {}", mp.s())),
            "{out}"
        );
    } else {
        let err = BD
            .cmd(&["resize", mp.s(), "--size", &size])
            .fails_in_one_line();
        assert!(
            err.contains("CAP_SYS_RESOURCE")
                && err.contains("nothing was changed")
                && err.contains(&format!("blobdrive resize {spec} --size {size}"))
                && err.contains("then mount it again, which grows the filesystem")
                && !err.contains("e2fsck"),
            "{err}"
        );
        assert_eq!(mp.stats()["disk_size"], from * MIB);
        eprintln!("no CAP_SYS_RESOURCE here: ext4 is not grown in place; taking the way the refusal names");
    }
    std::thread::sleep(Duration::from_secs(2));
    let n = writer.finish();
    if !in_place {
        assert_eq!(
            info_size(&spec),
            from * MIB,
            "the refusal changed the drive"
        );
        BD.ok(&["unmount", mp.s()]);
        BD.ok(&["resize", &spec, "--size", &size]);
        let out = BD.cmd(&["mount", &spec, mp.s()]).output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("grew it to fill the disk"), "{err}");
    }
    let fs_after = statvfs_size(mp.path());
    assert!(
        fs_after > fs_before + (to - from) * MIB * 8 / 10,
        "the filesystem did not grow: {fs_before} -> {fs_after}"
    );
    // Room the old size did not have: more than the whole old disk in one file.
    let big = mp.path().join("big.bin");
    sh_ok(&format!(
        "dd if=/dev/urandom of='{}' bs=1M count={} conv=fsync status=none",
        big.display(),
        from + 16
    ));
    let big_sum = sh_ok(&format!("sha256sum < '{}'", big.display()));
    assert_eq!(mp.stats()["disk_size"], to * MIB);
    assert_eq!(mp.listed()["disk_size"], to * MIB);
    assert_eq!(info_size(&spec), to * MIB);
    if in_place {
        // The same again, through the mount, as JSON: nothing more to grow.
        let again = json(&BD.ok(&["resize", mp.s(), "--size", &size, "--json"]));
        assert_eq!(again["blob"], spec.as_str());
        assert_eq!(again["mountpoint"], mp.s());
        assert_eq!(again["from_bytes"], to * MIB);
        assert_eq!(again["size_bytes"], to * MIB);
        assert_eq!(again["grown"], false);
        assert!(
            again["note"].as_str().unwrap().contains("already"),
            "{again}"
        );
    }
    check_written(mp.path(), n);
    BD.ok(&["unmount", mp.s()]);
    // Clean on the blob, then every file again from a fresh mount.
    let dev = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    match fstype {
        "ext4" => sh_ok(&format!("e2fsck -fn {dev}")),
        _ => sh_ok(&format!("xfs_repair -n {dev}")),
    };
    BD.ok(&["unmount", mp.s()]);
    BD.ok(&["mount", &spec, mp.s(), "--read-only"]);
    check_written(mp.path(), n);
    assert_eq!(sh_ok(&format!("sha256sum < '{}'", big.display())), big_sum);
    BD.ok(&["unmount", mp.s()]);
}

fn statvfs_size(path: &Path) -> u64 {
    sh_ok(&format!("stat -f -c '%b %S' '{}'", path.display()))
        .split_whitespace()
        .map(|v| v.parse::<u64>().unwrap())
        .product()
}

#[test]
fn a_mounted_ext4_drive_grows_in_place_while_a_program_writes() {
    grow_in_place_while_writing("ext4", 64, 192);
}

#[test]
fn a_mounted_xfs_drive_grows_in_place_while_a_program_writes() {
    grow_in_place_while_writing("xfs", 320, 640);
}

fn write_at(path: &str, offset: u64, data: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn read_at(path: &str, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// Raw mode: the `disk` file takes the new size at once and the grown part can be
/// written; a read-only raw mount of the same live blob keeps its old size and
/// its data. Shrinking and resizing through the read-only mount are refused.
#[test]
fn a_mounted_raw_file_grows_and_a_read_only_mount_of_it_keeps_its_size() {
    require_root();
    let spec = BD.new_drive("online-raw", "8MiB");
    let mp = BD.mp();
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let old_end = pattern(1);
    write_at(&mp.disk(), 8 * MIB - old_end.len() as u64, &old_end);
    let ro = BD.mp();
    BD.ok(&["mount", &spec, ro.s(), "--mode", "raw", "--read-only"]);
    // Named by the blob: the mount here does it.
    let out = BD.ok(&["resize", &spec, "--size", "16MiB"]);
    assert!(out.contains("grew") && out.contains("16 MiB"), "{out}");
    assert_eq!(std::fs::metadata(mp.disk()).unwrap().len(), 16 * MIB);
    let new = pattern(2);
    write_at(&mp.disk(), 12 * MIB, &new);
    assert_eq!(read_at(&mp.disk(), 12 * MIB, new.len()), new);
    // The grown part reads zeros elsewhere, the old footer's page too.
    assert!(read_at(&mp.disk(), 8 * MIB, 4096).iter().all(|&b| b == 0));
    assert_eq!(
        read_at(&mp.disk(), 8 * MIB - old_end.len() as u64, old_end.len()),
        old_end
    );
    // The read-only mount still serves the 8 MiB it was mounted with.
    assert_eq!(std::fs::metadata(ro.disk()).unwrap().len(), 8 * MIB);
    assert_eq!(
        read_at(&ro.disk(), 8 * MIB - old_end.len() as u64, old_end.len()),
        old_end
    );
    let err = BD
        .cmd(&["resize", ro.s(), "--size", "32MiB"])
        .fails_in_one_line();
    assert!(err.contains("read-only"), "{err}");
    // `stats` says the disk's size as served now.
    let text = BD.ok(&["stats", mp.s()]);
    assert!(
        text.contains("disk:           16 MiB (16777216 bytes)"),
        "{text}"
    );
    // A shrink is refused in sizes a reader takes in, and the bytes.
    let err = BD
        .cmd(&["resize", mp.s(), "--size", "12MiB"])
        .fails_in_one_line();
    assert!(
        err.contains("is 16 MiB (16777216 bytes); shrinking it to 12 MiB (12582912 bytes)"),
        "{err}"
    );
    assert_eq!(std::fs::metadata(mp.disk()).unwrap().len(), 16 * MIB);
    // A snapshot's mount is named as the snapshot it is.
    let snap = json(&BD.ok(&["snapshot", "create", &spec, "--json"]));
    let at = format!("{spec}@{}", snap["snapshot"].as_str().unwrap());
    let smp = BD.mp();
    BD.ok(&["mount", &at, smp.s(), "--mode", "raw"]);
    let err = BD
        .cmd(&["resize", smp.s(), "--size", "32MiB"])
        .fails_in_one_line();
    assert!(
        err.contains(&format!("{at} (mounted at {})", smp.s()))
            && err.contains("snapshots keep their size"),
        "{err}"
    );
    BD.ok(&["unmount", smp.s()]);
    BD.ok(&["unmount", ro.s()]);
    BD.ok(&["unmount", mp.s()]);
    // On the blob: the footer for 16 MiB, and the data.
    assert_eq!(info_size(&spec), 16 * MIB);
    assert!(on_blob(&spec, 12 * MIB, new.len()) == new);
}

/// Block mode: the loop device takes the new size; what is on it is the user's.
#[test]
fn a_mounted_block_device_grows() {
    require_root();
    let spec = BD.new_drive("online-block", "8MiB");
    let mp = BD.mp();
    let dev = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    let out = BD.ok(&["resize", mp.s(), "--size", "24MiB"]);
    assert!(
        out.contains(&format!("{dev} is {} bytes", 24 * MIB)) && out.contains("yourself"),
        "{out}"
    );
    assert_eq!(
        sh_ok(&format!("blockdev --getsize64 {dev}")).trim(),
        (24 * MIB).to_string()
    );
    let data = pattern(3);
    write_at(&dev, 20 * MIB, &data);
    assert_eq!(read_at(&dev, 20 * MIB, data.len()), data);
    // The same size again: nothing more to do, and said so.
    let out = BD.ok(&["resize", mp.s(), "--size", "24MiB"]);
    assert!(out.contains("was already 24 MiB"), "{out}");
    BD.ok(&["unmount", mp.s()]);
    assert!(on_blob(&spec, 20 * MIB, data.len()) == data);
}

/// The bytes at `offset` on the blob once the drive is unmounted.
fn on_blob(spec: &str, offset: u64, len: usize) -> Vec<u8> {
    rt().block_on(BD.blob(spec).read(offset, len as u64))
        .unwrap()
        .to_vec()
}

/// A new 8 MiB drive, mounted raw through a proxy that holds the first request
/// whose head contains `needle` for `delay` and then forwards it, with a 2 s
/// request timeout, so the daemon gives up on it long before it lands. The drive
/// is resized to each of `sizes` and `data` written at `offset` through the
/// mount; then the held request must land and be refused (412), and once
/// unmounted the blob must hold `data` (else `lost`): the drive's spec.
fn held_past_resizes_and_a_write(
    tag: &str,
    (needle, delay): (&str, Duration),
    sizes: &[&str],
    (offset, data): (u64, &[u8]),
    lost: &str,
) -> String {
    let spec = BD.new_drive(tag, "8MiB");
    let proxy = Proxy::start(Config::holding(Azurite::shared().port, needle, 1, delay));
    let cs = proxy.connection_string();
    let through = |args: &[&str]| {
        BD.cmd(args)
            .cs(&cs)
            .env("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")
            .ok()
    };
    let mp = BD.mp_through(&cs);
    through(&["mount", &spec, mp.s(), "--mode", "raw"]);
    for size in sizes {
        through(&["resize", mp.s(), "--size", size]);
    }
    write_at(&mp.disk(), offset, data);
    let late = proxy.wait_for_late_commit(Duration::from_secs(40));
    eprintln!("{late:?}");
    assert_eq!(late[0].status, Some(412), "{late:?}");
    through(&["unmount", mp.s()]);
    assert!(on_blob(&spec, offset, data.len()) == data, "{lost}");
    spec
}

/// Setting the blob's length is the one step a mounted drive's lease does not
/// fence: the lease lives on. Held by a proxy until long after the client gave
/// up on it and a second resize grew the drive further, then forwarded, it would
/// cut the drive back to the first size, footer and data with it. It carries the
/// blob's ETag of the moment, so the service refuses it (412) and the drive keeps
/// its size and data.
#[test]
fn a_length_change_that_lands_after_a_later_resize_is_refused() {
    require_root();
    let spec = held_past_resizes_and_a_write(
        "late-grow",
        ("x-ms-blob-content-length", Duration::from_secs(12)),
        &["16MiB", "32MiB"],
        (30 * MIB, &pattern(4)),
        "a late length change cut off data written after the drive grew",
    );
    assert_eq!(info_size(&spec), 32 * MIB);
}

/// The old footer's page becomes disk when the drive grows. Its clear, held by a
/// proxy until long after the daemon gave up on it and the page was written
/// through the mount, would zero that data; the mount's lease lives on, so only
/// the write fence (the clear carries the mount's sequence number, raised before
/// anything is sent again) stops it: the service refuses it (412).
#[test]
fn a_clear_of_the_old_footer_that_lands_late_on_a_mounted_drive_is_refused() {
    require_root();
    held_past_resizes_and_a_write(
        "late-clear-online",
        ("x-ms-page-write: clear", Duration::from_secs(10)),
        &["16MiB"],
        (8 * MIB, &pattern(5)),
        "a late clear zeroed data written after the resize",
    );
}

/// The new footer's page becomes disk when the drive grows again. A footer
/// write held by a proxy until long after the daemon gave up on it, and until
/// the drive grew further and that page was written through the mount, would put
/// a footer over the data; the mount's lease lives on, so only the write fence
/// stops it: the service refuses it (412).
#[test]
fn a_footer_write_that_lands_after_a_further_grow_on_a_mounted_drive_is_refused() {
    require_root();
    held_past_resizes_and_a_write(
        "late-footer-online",
        ("x-ms-page-write: update", Duration::from_secs(12)),
        &["16MiB", "32MiB"],
        (16 * MIB, &pattern(6)),
        "a late footer write landed on data written after the drive grew",
    );
}

/// A resize that takes a while says what it is doing every few seconds: here
/// the service stops answering for six seconds as it starts.
#[test]
fn a_long_resize_of_a_mounted_drive_says_what_it_is_doing() {
    require_root();
    let spec = BD.new_drive("slow-grow", "8MiB");
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    let cs = proxy.connection_string();
    let mp = BD.mp_through(&cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .ok();
    proxy.paused.store(true, Ordering::SeqCst);
    let resize = BD
        .cmd(&["resize", mp.s(), "--size", "16MiB"])
        .cs(&cs)
        .command()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(6));
    proxy.paused.store(false, Ordering::SeqCst);
    let out = resize.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("resizing to 16 MiB: ") && l.ends_with(" s so far")),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("grew"));
    BD.cmd(&["unmount", mp.s()]).cs(&cs).ok();
    assert_eq!(info_size(&spec), 16 * MIB);
}
