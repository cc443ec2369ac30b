//! One lying answer must not destroy a drive: a rewriting proxy on loopback
//! (`tests/liar`) between blobdrive and Azurite plays each answer the service
//! could give that is not the truth (a page list that is no page list, one
//! off the 512-byte grid, a sequence number nobody asked for, a ranged read of
//! another range or cut short, a lease acquired under another id, a page list
//! that never ends), and what is really on the blob is read beside it with
//! the Python SDK, straight from Azurite: the drive's sha256, its lease, the
//! file on its filesystem after a plain remount. Runs as root.

mod common;
mod faultproxy;
mod liar;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::azurite::{blob_client, Azurite};
use common::bd::{shared_cs, Harness, Via};
use common::mount::{require_root, Mp};
use common::util::{pattern, rt, sh_ok};
use liar::{Liar, Lie, Rule};

const MIB: u64 = 1 << 20;

const BD: Harness = Harness::new("lies-run");

/// The retry budget of commands whose every answer of a kind is a lie: each
/// such command fails once it is spent.
const BUDGET: &str = "4";

/// A liar in front of the shared emulator, telling no lie yet.
fn liar() -> Liar {
    Liar::start(Azurite::shared().port, |spec, offset, len| {
        rt().block_on(blob_client(&shared_cs(), spec).read(offset, len))
            .unwrap()
            .to_vec()
    })
}

/// The account through `liar`, with a short retry budget.
fn through(liar: &Liar) -> Via {
    BD.via(
        &liar.connection_string(),
        &[("BLOBDRIVE_RETRY_BUDGET_SECS", BUDGET)],
    )
}

/// What the SDK, straight from Azurite, sees of the drive `spec`: the sha256
/// of its disk and its lease state.
fn truth(spec: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("disk");
    let seen = common::sdk::read_blob(&shared_cs(), spec, &out);
    let sum = sh_ok(&format!("sha256sum '{}' | cut -d' ' -f1", out.display()));
    (
        sum.trim().to_string(),
        seen["lease_state"].as_str().unwrap().to_string(),
    )
}

/// sha256 of a local file.
fn sha256(path: &Path) -> String {
    sh_ok(&format!("sha256sum '{}' | cut -d' ' -f1", path.display()))
        .trim()
        .to_string()
}

/// A new 64 MiB drive holding an ext4 filesystem with one file `f` of 1 MiB
/// of random bytes: its spec and the file's sha256.
fn ext4_drive_with_a_file(tag: &str) -> (String, String) {
    let spec = BD.new_drive(tag, "64MiB");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mkfs", "ext4"]);
    let f = mp.path().join("f");
    sh_ok(&format!(
        "head -c {MIB} /dev/urandom > '{}' && sync '{}'",
        f.display(),
        f.display()
    ));
    let sum = sha256(&f);
    BD.unmount(&mp);
    (spec, sum)
}

/// The sha256 of the file `f` on the drive's filesystem, mounted plainly
/// (straight to Azurite, no lie told).
fn file_after_a_plain_remount(spec: &str) -> String {
    let mp = BD.mp();
    BD.mount(spec, &mp, &[]);
    let sum = sha256(&mp.path().join("f"));
    BD.unmount(&mp);
    sum
}

/// Fails unless the drive is as `before` said, unleased, and its file reads
/// as `file` after a plain remount.
fn drive_unchanged(spec: &str, before: &(String, String), file: &str) {
    let now = truth(spec);
    assert_eq!(now.0, before.0, "the drive's bytes changed");
    assert_eq!(now.1, "available", "the drive was left leased");
    assert_eq!(file_after_a_plain_remount(spec), file);
}

/// The page lists that are not one whole, well-formed page list.
fn broken_page_lists() -> Vec<(&'static str, Lie)> {
    vec![
        ("an empty body", Lie::Body(Vec::new())),
        ("junk", Lie::Body(b"garbage".to_vec())),
        ("an error element", Lie::Body(b"<Error/>".to_vec())),
        (
            "an unclosed PageList",
            Lie::Body(b"<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList><PageRange><Start>0</Start><End>511</End></PageRange>".to_vec()),
        ),
        ("the real list gzip-encoded", Lie::Gzipped),
    ]
}

#[test]
fn a_page_list_that_is_not_one_whole_page_list_is_an_error_never_nothing_allocated() {
    require_root();
    let (spec, file) = ext4_drive_with_a_file("lies-list");
    let before = truth(&spec);
    let liar = liar();
    let via = through(&liar);
    let image = tempfile::tempdir().unwrap();
    for (what, lie) in broken_page_lists() {
        liar.clear();
        liar.add(Rule::page_lists(usize::MAX, lie));
        let err = via.cmd(&["info", &spec]).fails_in_one_line();
        assert!(err.contains("page ranges"), "{what}: {err}");
        let out = image.path().join("d.vhd");
        via.cmd(&["download", &spec, out.to_str().unwrap()])
            .fails_with_error(&["page ranges"]);
        let mp = via.mp();
        via.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"])
            .fails_with_error(&["page ranges"]);
        assert!(!liar.told().is_empty(), "{what}: no lie was told");
    }
    // Told once, the lie costs a retry: the truth comes next.
    liar.clear();
    liar.add(Rule::page_lists(1, Lie::Body(b"garbage".to_vec())));
    let info = common::util::json(&via.ok(&["info", &spec, "--json"]));
    assert!(
        info["allocated_bytes"].as_u64().unwrap() > MIB,
        "after one lie: {info}"
    );
    drive_unchanged(&spec, &before, &file);
}

/// `mount.blobdrive SPEC DIR -o credentials=FILE,mkfs=ext4` as mount(8) runs
/// it for an fstab line, the credentials file naming the account `cs`.
fn fstab_mkfs(spec: &str, dir: &Path, cs: &str) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let helper = d.path().join("mount.blobdrive");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_blobdrive"), &helper).unwrap();
    let creds = d.path().join("acct.env");
    std::fs::write(&creds, format!("AZURE_STORAGE_CONNECTION_STRING={cs}\n")).unwrap();
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
    common::user::ensure_user();
    std::process::Command::new(&helper)
        .arg(spec)
        .arg(dir)
        .args(["-o", &format!("credentials={},mkfs=ext4", creds.display())])
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env("BLOBDRIVE_RUN_DIR", BD.run_dir())
        .output()
        .unwrap()
}

/// A well-formed page list saying nothing is written.
const NOTHING_WRITTEN: &[u8] = b"<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList></PageList>";

#[test]
fn mkfs_formats_only_a_drive_whose_first_and_last_mib_hold_nothing() {
    require_root();
    let (spec, file) = ext4_drive_with_a_file("lies-mkfs");
    let before = truth(&spec);
    let liar = liar();
    let via = through(&liar);
    // One listing, well-formed, says nothing is written: on it alone the
    // drive's filesystem was formatted over.
    liar.add(Rule::page_lists(
        usize::MAX,
        Lie::Body(NOTHING_WRITTEN.to_vec()),
    ));
    let mp = via.mp();
    let err = via
        .cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"])
        .fails_with_error(&["ext4", "nothing was formatted"]);
    assert!(err.contains("first MiB"), "{err}");
    // The same from an fstab line (`mkfs=ext4`), as mount(8) runs the helper.
    let out = fstab_mkfs(&spec, mp.path(), &liar.connection_string());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "the helper formatted: {err}");
    assert!(err.contains("nothing was formatted"), "{err}");
    drop(mp);
    drive_unchanged(&spec, &before, &file);
    // Bytes in the last MiB alone, which no filesystem probe knows (the lie
    // told), and in the middle alone (the page list telling the truth): no
    // filesystem, but not empty either.
    for (at, lied, said) in [
        (63 * MIB, true, "last MiB"),
        (32 * MIB, false, "data was written to it"),
    ] {
        let spec = BD.new_drive("lies-mkfs-data", "64MiB");
        rt().block_on(
            BD.blob(&spec)
                .put_pages(at, Bytes::from(pattern(at / MIB, 4096)), None),
        )
        .unwrap();
        let before = truth(&spec);
        let cs = if lied {
            liar.connection_string()
        } else {
            shared_cs()
        };
        let mp = via.mp();
        via.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"])
            .cs(&cs)
            .fails_with_error(&[said, "nothing was formatted"]);
        drop(mp);
        assert_eq!(truth(&spec), before, "at {at}");
    }
    // A drive that does hold nothing is formatted, the same lie told.
    let blank = BD.new_drive("lies-mkfs-blank", "64MiB");
    let mp = via.mp();
    via.ok(&["mount", &blank, mp.s(), "--mkfs", "ext4"]);
    via.unmount(&mp);
    assert!(liar.told().len() >= 3, "{:?}", liar.told());
}

/// Writes `data` at `offset` of the raw disk of `mp` and fsyncs: whether the
/// fsync succeeded.
fn write_and_fsync(mp: &Mp, offset: u64, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(mp.disk())?;
    for (i, piece) in data.chunks(256 * 1024).enumerate() {
        f.write_all_at(piece, offset + (i * 256 * 1024) as u64)?;
    }
    f.sync_all()
}

fn read_disk(mp: &Mp, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(mp.disk())?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// sha256 of a 64 MiB disk holding `pieces` (offset, bytes) and zeros besides.
fn sha256_of_disk(pieces: &[(u64, &[u8])]) -> String {
    use sha2::{Digest, Sha256};
    let mut disk = vec![0u8; 64 * MIB as usize];
    for (at, data) in pieces {
        disk[*at as usize..*at as usize + data.len()].copy_from_slice(data);
    }
    Sha256::digest(&disk)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_sequence_number_nobody_asked_for_is_read_again_and_writes_land() {
    require_root();
    // Far above what was asked for, and below the number the mount raised.
    for told in ["9223372036854775807", "1"] {
        let spec = BD.new_drive("lies-seq", "64MiB");
        let liar = liar();
        let via = BD.via(&liar.connection_string(), &[]);
        let mp = via.mount(&spec, &["--mode", "raw"]);
        let first = pattern(1, 4 * MIB);
        write_and_fsync(&mp, 0, &first).unwrap();
        // A Put Page lands but its answer is lost; the raise of the sequence
        // number that follows is answered with a number nobody asked for.
        liar.add(Rule::on(&["x-ms-page-write: update"], 1, Lie::AnswerLost));
        liar.add(Rule::on(
            &["x-ms-sequence-number-action: increment"],
            1,
            Lie::Header("x-ms-blob-sequence-number", told.into()),
        ));
        let second = pattern(2, 12 * MIB);
        let started = Instant::now();
        write_and_fsync(&mp, 4 * MIB, &second)
            .unwrap_or_else(|e| panic!("told {told}: the fsync failed: {e}"));
        let took = started.elapsed();
        assert_eq!(liar.told().len(), 2, "{:?}", liar.told());
        assert!(took < Duration::from_secs(30), "told {told}: {took:?}");
        // Writes then land at once.
        let third = pattern(3, MIB);
        let started = Instant::now();
        write_and_fsync(&mp, 16 * MIB, &third).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "told {told}");
        let started = Instant::now();
        via.unmount(&mp);
        assert!(started.elapsed() < Duration::from_secs(30), "told {told}");
        let (sum, lease) = truth(&spec);
        assert_eq!(lease, "available");
        assert_eq!(
            sum,
            sha256_of_disk(&[(0, &first), (4 * MIB, &second), (16 * MIB, &third)]),
            "told {told}"
        );
    }
}

#[test]
fn a_ranged_read_answered_with_another_range_is_read_again_and_never_cached() {
    require_root();
    let spec = BD.new_drive("lies-range", "256MiB");
    let blob = BD.blob(&spec);
    let (a, b, c) = (pattern(1, MIB), pattern(2, MIB), pattern(3, MIB));
    for (at, data) in [(96 * MIB, &a), (128 * MIB, &b), (160 * MIB, &c)] {
        rt().block_on(blob.put_pages(at, Bytes::from(data.clone()), None))
            .unwrap();
    }
    let caches = BD.run_dir().join("caches-lies-range");
    let _ = std::fs::remove_dir_all(&caches);
    common::util::private_dir(&caches);
    let dc = caches.to_str().unwrap();
    let liar = liar();
    let via = BD.via(&liar.connection_string(), &[]);
    let mp = via.mount(&spec, &["--mode", "raw", "--disk-cache", dc]);
    // A reader at 128 MiB is answered with the bytes of 96 MiB, three times.
    liar.add(Rule::reads(
        Some(128 * MIB),
        3,
        Lie::OtherRange(-32 * MIB as i64),
    ));
    assert!(
        read_disk(&mp, 128 * MIB, MIB).unwrap() == b,
        "a reader got another range's bytes"
    );
    assert_eq!(liar.told().len(), 3);
    // The warm-up's first three reads are answered from 64 MiB further back.
    liar.add(Rule::reads(None, 3, Lie::OtherRange(-64 * MIB as i64)));
    let _ = via.cmd(&["warm", mp.s()]).output();
    assert_eq!(liar.told().len(), 6, "{:?}", liar.told());
    via.unmount(&mp);
    // Mounted again straight to the service, with the same disk cache: what
    // it holds is the truth.
    let mp = BD.mp();
    BD.mount(&spec, &mp, &["--mode", "raw", "--disk-cache", dc]);
    for (at, data) in [(96 * MIB, &a), (128 * MIB, &b), (160 * MIB, &c)] {
        assert!(read_disk(&mp, at, MIB).unwrap() == *data, "at {at}");
    }
    BD.unmount(&mp);
}

#[test]
fn page_ranges_off_the_512_byte_grid_are_rounded_outward_and_said() {
    require_root();
    let spec = BD.new_drive("lies-grid", "64MiB");
    let blob = BD.blob(&spec);
    for (at, len, seed) in [
        (MIB, MIB, 1),
        (10 * MIB + 4096, 8192, 2),
        (40 * MIB, 512, 3),
    ] {
        rt().block_on(blob.put_pages(at, Bytes::from(pattern(seed, len)), None))
            .unwrap();
    }
    let liar = liar();
    liar.add(Rule::page_lists(usize::MAX, Lie::RangesInBy(100)));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.raw");
    let run = through(&liar)
        .cmd(&["download", &spec, out.to_str().unwrap(), "--format", "raw"])
        .output();
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{err}");
    assert!(err.contains("512-byte"), "not said: {err}");
    assert_eq!(sha256(&out), truth(&spec).0);
    assert!(!liar.told().is_empty());
}

#[test]
fn a_lease_acquired_under_another_id_is_let_go_and_the_mount_fails() {
    require_root();
    let spec = BD.new_drive("lies-lease", "64MiB");
    let liar = liar();
    let via = through(&liar);
    liar.add(Rule::on(
        &["x-ms-lease-action: acquire"],
        1,
        Lie::Header(
            "x-ms-lease-id",
            "11111111-2222-3333-4444-555555555555".into(),
        ),
    ));
    let mp = via.mp();
    via.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .fails_with_error(&["lease"]);
    assert_eq!(liar.told().len(), 1);
    assert_eq!(truth(&spec).1, "available");
    BD.assert_nothing_left(mp.path(), &spec);
}

#[test]
fn a_ranged_read_cut_short_is_read_again() {
    require_root();
    let spec = BD.new_drive("lies-short", "64MiB");
    let data = pattern(4, MIB);
    rt().block_on(
        BD.blob(&spec)
            .put_pages(8 * MIB, Bytes::from(data.clone()), None),
    )
    .unwrap();
    let liar = liar();
    let via = BD.via(&liar.connection_string(), &[]);
    let mp = via.mount(&spec, &["--mode", "raw"]);
    liar.add(Rule::reads(Some(8 * MIB), 2, Lie::Short(1000)));
    let read = read_disk(&mp, 8 * MIB, MIB);
    assert!(read.unwrap() == data, "another range's bytes");
    assert_eq!(liar.told().len(), 2);
    via.unmount(&mp);
}

#[test]
fn a_page_list_that_never_ends_fails_within_the_retry_budget() {
    require_root();
    let spec = BD.new_drive("lies-trickle", "64MiB");
    rt().block_on(
        BD.blob(&spec)
            .put_pages(0, Bytes::from(pattern(5, MIB)), None),
    )
    .unwrap();
    let liar = liar();
    liar.add(Rule::page_lists(
        usize::MAX,
        Lie::Trickle(Duration::from_millis(10)),
    ));
    let budget = 8;
    let via = BD.via(
        &liar.connection_string(),
        &[("BLOBDRIVE_RETRY_BUDGET_SECS", "8")],
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.vhd");
    let mp = via.mp();
    for args in [
        vec!["info", &spec],
        vec!["download", &spec, out.to_str().unwrap()],
        vec!["mount", &spec, mp.s(), "--mode", "raw"],
    ] {
        let started = Instant::now();
        via.cmd(&args).fails_with_error(&["page ranges"]);
        let took = started.elapsed();
        eprintln!("{args:?} failed after {took:?}");
        // One budget for the listing (8.0-8.1 s each on a quiet machine),
        // and what a command (a mount: its worker, its lease) takes besides
        // on one the suite and others load; before, 68 s, one budget per
        // halving of the segment.
        assert!(
            took < Duration::from_secs(budget + 22),
            "{args:?} took {took:?} with a retry budget of {budget} s"
        );
    }
}

#[test]
fn writes_refused_for_their_sequence_number_for_ever_fail_within_the_io_timeout_and_unmount_says_so(
) {
    require_root();
    let spec = BD.new_drive("lies-refused", "64MiB");
    let liar = liar();
    let via = BD.via(
        &liar.connection_string(),
        &[
            ("BLOBDRIVE_IO_TIMEOUT_SECS", "10"),
            ("BLOBDRIVE_RETRY_BUDGET_SECS", "4"),
        ],
    );
    let mp = via.mount(&spec, &["--mode", "raw"]);
    let first = pattern(1, MIB);
    write_and_fsync(&mp, 0, &first).unwrap();
    // Every write is refused for its sequence number, however often the
    // number is read again: an answer each time, never an outage.
    liar.add(Rule::on(
        &["x-ms-page-write: update"],
        usize::MAX,
        Lie::Refuse(412, "SequenceNumberConditionNotMet"),
    ));
    let started = Instant::now();
    let fsync = write_and_fsync(&mp, MIB, &pattern(2, MIB));
    let took = started.elapsed();
    assert!(fsync.is_err(), "the fsync succeeded");
    assert!(
        took < Duration::from_secs(40),
        "the fsync failed after {took:?}"
    );
    // Something more, not synced, for the unmount to write.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mp.disk())
            .unwrap();
        f.write_all_at(&pattern(3, MIB), 2 * MIB).unwrap();
    }
    let started = Instant::now();
    let err = via.cmd(&["unmount", mp.s()]).fails();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(60),
        "the unmount took {took:?}: {err}"
    );
    assert!(err.contains("SequenceNumberConditionNotMet"), "{err}");
    assert!(err.contains("dropped"), "{err}");
    assert!(!err.contains("has not answered"), "not true: {err}");
    let (sum, lease) = truth(&spec);
    assert_eq!(lease, "available");
    assert_eq!(sum, sha256_of_disk(&[(0, &first)]));
}

/// Runs `during` while the liar garbles every Put Page answer for `garbled`
/// (the pages land; each answer says it is gzip-encoded, which nobody asked
/// for, so it cannot be used), then tells the truth again: what `during`
/// returned. Said, not done: [`Lie::Gzipped`] runs gzip, and a process
/// started while this one holds the drive open closes its copy of the file
/// as it starts, which waits for the daemon, which waits for this answer.
fn with_put_page_answers_garbled<T>(
    liar: &Liar,
    garbled: Duration,
    during: impl FnOnce() -> T,
) -> T {
    liar.add(Rule::on(
        &["x-ms-page-write: update"],
        usize::MAX,
        Lie::Header("Content-Encoding", "gzip".into()),
    ));
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(garbled);
            liar.clear();
        });
        during()
    })
}

#[test]
fn answers_garbled_for_longer_than_the_retry_budget_are_waited_out_like_an_outage() {
    require_root();
    let spec = BD.new_drive("lies-garbled", "64MiB");
    let liar = liar();
    // A retry budget of 4 s, the I/O timeout as it comes (300 s): answers
    // garbled for 14 s outlast the one and not the other.
    let via = through(&liar);
    let garbled = Duration::from_secs(14);
    let mp = via.mount(&spec, &["--mode", "raw"]);
    let first = pattern(1, MIB);
    write_and_fsync(&mp, 0, &first).unwrap();
    // An fsync issued while they come garbled waits, as through an outage,
    // and succeeds once they are honest again.
    let second = pattern(2, 4 * MIB);
    let (fsync, took) = with_put_page_answers_garbled(&liar, garbled, || {
        let started = Instant::now();
        (write_and_fsync(&mp, 4 * MIB, &second), started.elapsed())
    });
    fsync.unwrap_or_else(|e| panic!("the fsync failed after {took:?}: {e}"));
    assert!(took >= garbled - Duration::from_secs(1), "{took:?}");
    assert!(!liar.told().is_empty(), "no lie was told");
    via.unmount(&mp);
    let (sum, lease) = truth(&spec);
    assert_eq!(lease, "available");
    assert_eq!(sum, sha256_of_disk(&[(0, &first), (4 * MIB, &second)]));
    // An unmount waits the same way, and says what it waits for: a service
    // whose answers come garbled, not one that has not answered. On a
    // filesystem, whose unmount always leaves the daemon something to write.
    let (spec, f) = ext4_drive_with_a_file("lies-garbled-fs");
    let mp = via.mount(&spec, &[]);
    let g = mp.path().join("g");
    sh_ok(&format!("head -c {MIB} /dev/urandom > '{}'", g.display()));
    let g = sha256(&g);
    let told = liar.told().len();
    let unmount =
        with_put_page_answers_garbled(&liar, garbled, || via.cmd(&["unmount", mp.s()]).output());
    let err = String::from_utf8_lossy(&unmount.stderr).to_string();
    eprintln!("the unmount said: {err}");
    assert!(unmount.status.success(), "{err}");
    assert!(liar.told().len() > told, "no lie was told to the unmount");
    assert!(err.contains("no usable answer for"), "not said: {err}");
    assert!(err.contains("garbled"), "not said: {err}");
    assert!(!err.contains("has not answered"), "not true: {err}");
    assert_eq!(truth(&spec).1, "available");
    let mp = BD.mp();
    BD.mount(&spec, &mp, &[]);
    assert_eq!(sha256(&mp.path().join("f")), f);
    assert_eq!(sha256(&mp.path().join("g")), g);
    BD.unmount(&mp);
}
