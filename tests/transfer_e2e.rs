//! Snapshots, upload, download, incremental download and restore against Azurite,
//! through the `blobdrive` command as users run it.

mod common;

use common::util::{json, rt, sh_ok};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use bytes::Bytes;
use common::bd::Harness;
use serde_json::Value;

const MIB: u64 = 1024 * 1024;

const BD: Harness = Harness::new("transfer-run").env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "10")]);

/// A sparse image of `size` with 1 MiB of random data at each of `at` (MiB offsets).
fn sparse_image(path: &Path, size: &str, at: &[u64]) {
    let mut s = format!(
        "set -e; rm -f '{0}'; truncate -s {size} '{0}'",
        path.display()
    );
    for o in at {
        s.push_str(&format!(
            "; dd if=/dev/urandom of='{}' bs=1M seek={o} count=1 conv=notrunc status=none",
            path.display()
        ));
    }
    sh_ok(&s);
}

fn allocated_on_disk(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn sparse_images_round_trip_sending_only_data() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    sparse_image(&img, "1G", &[0, 5, 200, 513, 1023]);
    let spec = format!("{}/round.vhd", BD.new_container("round"));
    let up = json(&BD.ok(&["upload", img.to_str().unwrap(), &spec, "--json"]));
    assert_eq!(up["image_bytes"], 1024 * MIB);
    let sent = up["bytes_transferred"].as_u64().unwrap();
    assert!((5 * MIB..=5 * MIB + 4096).contains(&sent), "sent {sent}");
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(info["size_bytes"], 1024 * MIB);
    assert!(info["allocated_bytes"].as_u64().unwrap() <= 5 * MIB + 4096);
    // Raw download: byte-identical, holes stay holes, only data fetched.
    let back = dir.path().join("back.img");
    let down = json(&BD.ok(&["download", &spec, back.to_str().unwrap(), "--json"]));
    assert!(down["bytes_transferred"].as_u64().unwrap() <= 5 * MIB + 4096);
    sh_ok(&format!("cmp '{}' '{}'", img.display(), back.display()));
    assert!(
        allocated_on_disk(&back) < 16 * MIB,
        "download is not sparse"
    );
    // No half-done file is left when the target exists.
    BD.cmd(&["download", &spec, back.to_str().unwrap()])
        .fails_with("already exists");
    // VHD download keeps the footer and qemu-img reads it.
    let vhd = dir.path().join("back.vhd");
    BD.ok(&["download", &spec, vhd.to_str().unwrap()]);
    let qi: Value = serde_json::from_str(&sh_ok(&format!(
        "qemu-img info -f vpc --output=json '{}'",
        vhd.display()
    )))
    .unwrap();
    assert_eq!(qi["virtual-size"], 1024 * MIB);
    sh_ok(&format!(
        "qemu-img compare -f vpc -F raw '{}' '{}'",
        vhd.display(),
        img.display()
    ));
    // Existing blobs are never replaced without --overwrite.
    let etag = json(&BD.ok(&["info", &spec, "--json"]))["etag"].clone();
    BD.cmd(&["upload", img.to_str().unwrap(), &spec])
        .fails_with("--overwrite");
    assert_eq!(json(&BD.ok(&["info", &spec, "--json"]))["etag"], etag);
    sparse_image(&img, "3M", &[1]);
    BD.ok(&["upload", img.to_str().unwrap(), &spec, "--overwrite"]);
    assert_eq!(
        json(&BD.ok(&["info", &spec, "--json"]))["size_bytes"],
        3 * MIB
    );
}

#[test]
fn raw_images_round_up_and_vhds_from_qemu_upload() {
    let dir = tempfile::tempdir().unwrap();
    let c = BD.new_container("shapes");
    let odd = dir.path().join("odd.img");
    sh_ok(&format!(
        "head -c 1500000 /dev/urandom > '{}'",
        odd.display()
    ));
    BD.ok(&["upload", odd.to_str().unwrap(), &format!("{c}/odd.vhd")]);
    assert_eq!(
        json(&BD.ok(&["info", &format!("{c}/odd.vhd"), "--json"]))["size_bytes"],
        2 * MIB
    );
    let back = dir.path().join("odd.back");
    BD.ok(&[
        "download",
        &format!("{c}/odd.vhd"),
        back.to_str().unwrap(),
        "--format",
        "raw",
    ]);
    sh_ok(&format!(
        "cmp -n 1500000 '{}' '{}'",
        odd.display(),
        back.display()
    ));
    // A fixed VHD made by qemu-img.
    let raw = dir.path().join("q.raw");
    sparse_image(&raw, "64M", &[3, 40]);
    let vhd = dir.path().join("q.vhd");
    sh_ok(&format!(
        "qemu-img convert -f raw -O vpc -o subformat=fixed,force_size=on '{}' '{}'",
        raw.display(),
        vhd.display()
    ));
    BD.ok(&["upload", vhd.to_str().unwrap(), &format!("{c}/q.vhd")]);
    let info = json(&BD.ok(&["info", &format!("{c}/q.vhd"), "--json"]));
    assert_eq!(info["size_bytes"], 64 * MIB);
    let back = dir.path().join("q.back");
    BD.ok(&[
        "download",
        &format!("{c}/q.vhd"),
        back.to_str().unwrap(),
        "--format",
        "raw",
    ]);
    sh_ok(&format!("cmp '{}' '{}'", raw.display(), back.display()));
    // ...and mounts: the served disk is byte for byte the image qemu-img converted.
    let mnt = tempfile::Builder::new()
        .prefix("blobdrive-qemu-mnt.")
        .tempdir()
        .unwrap();
    let m = mnt.path().to_str().unwrap();
    BD.ok(&[
        "mount",
        &format!("{c}/q.vhd"),
        m,
        "--mode",
        "raw",
        "--read-only",
    ]);
    let same = Command::new("cmp")
        .arg(&raw)
        .arg(format!("{m}/disk"))
        .status()
        .unwrap()
        .success();
    BD.ok(&["unmount", m]);
    assert!(same, "the mounted qemu-made VHD differs from its source");
    // Dynamic VHDs are refused by name; nothing is created.
    let dynamic = dir.path().join("d.vhd");
    sh_ok(&format!(
        "qemu-img create -q -f vpc -o subformat=dynamic '{}' 64M",
        dynamic.display()
    ));
    BD.cmd(&["upload", dynamic.to_str().unwrap(), &format!("{c}/d.vhd")])
        .fails_with("qemu-img convert");
    BD.cmd(&["info", &format!("{c}/d.vhd")])
        .fails_with("does not exist");
}

#[test]
fn an_interrupted_upload_resumes_without_resending() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("big.img");
    sh_ok(&format!("head -c 512M /dev/urandom > '{}'", img.display()));
    let spec = format!("{}/resume.vhd", BD.new_container("resume"));
    let mut child = BD
        .cmd(&["upload", img.to_str().unwrap(), &spec])
        .command()
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Kill it at its first progress line: part of the data is up, no footer yet.
    let first = lines.next().expect("a progress line").unwrap();
    assert!(first.starts_with("upload:"), "{first}");
    child.kill().unwrap();
    child.wait().unwrap();
    BD.cmd(&["info", &spec]).fails_with("not a VHD");
    let done = rt()
        .block_on(BD.blob(&spec).page_ranges(None))
        .unwrap()
        .iter()
        .map(|r| r.len())
        .sum::<u64>();
    assert!(
        done > 0 && done < 512 * MIB,
        "killed too late to test a resume: {done}"
    );
    // Progress counts acknowledged bytes: what it reported is on the blob (the
    // image is all data, so every byte counted is a byte written).
    let pct: u64 = first
        .split_once(": ")
        .and_then(|(_, r)| r.split_once('%'))
        .map(|(p, _)| p.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no percentage in {first}"));
    assert!(
        done >= 512 * MIB * pct / 100,
        "progress said {pct}% but only {done} bytes were on the blob: {first}"
    );
    // Without --resume the unfinished blob is not replaced.
    BD.cmd(&["upload", img.to_str().unwrap(), &spec])
        .fails_with("--resume");
    let r = json(&BD.ok(&["upload", img.to_str().unwrap(), &spec, "--resume", "--json"]));
    let sent = r["bytes_transferred"].as_u64().unwrap();
    assert!(sent < 512 * MIB, "resume re-sent everything");
    assert!(r["skipped_bytes"].as_u64().unwrap() > 0);
    let back = dir.path().join("back.img");
    BD.ok(&["download", &spec, back.to_str().unwrap(), "--format", "raw"]);
    sh_ok(&format!("cmp '{}' '{}'", img.display(), back.display()));
    // Resuming a finished upload from the same file says so and sends nothing.
    let out = BD.ok(&["upload", img.to_str().unwrap(), &spec, "--resume"]);
    assert!(out.contains("already complete"), "{out}");
    let r = json(&BD.ok(&["upload", img.to_str().unwrap(), &spec, "--resume", "--json"]));
    assert_eq!(r["already_complete"], true);
    assert_eq!(r["bytes_transferred"], 0);
    // ...but not once the drive was written to since...
    let mut head = vec![0u8; 4096];
    std::io::Read::read_exact(&mut std::fs::File::open(&img).unwrap(), &mut head).unwrap();
    rt().block_on(
        BD.blob(&spec)
            .put_pages(0, Bytes::from(vec![0xabu8; 4096]), None),
    )
    .unwrap();
    BD.cmd(&["upload", img.to_str().unwrap(), &spec, "--resume"])
        .fails_with("changed since");
    rt().block_on(BD.blob(&spec).put_pages(0, Bytes::from(head), None))
        .unwrap();
    BD.ok(&["upload", img.to_str().unwrap(), &spec, "--resume"]);
    // ...or lost some of the file's data.
    rt().block_on(BD.blob(&spec).clear_pages(64 * MIB, MIB, None))
        .unwrap();
    BD.cmd(&["upload", img.to_str().unwrap(), &spec, "--resume"])
        .fails_with("changed since");
    // A drive blobdrive did not upload is not "resumed", and a changed source is refused.
    let made = format!("{}/made.vhd", BD.new_container("made"));
    BD.ok(&["create", &made, "--size", "512MiB"]);
    BD.cmd(&["upload", img.to_str().unwrap(), &made, "--resume"])
        .fails_with("not an unfinished upload");
    let spec2 = format!("{}/changed.vhd", BD.new_container("changed"));
    let mut child = BD
        .cmd(&["upload", img.to_str().unwrap(), &spec2])
        .command()
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let _ = lines.next();
    child.kill().unwrap();
    child.wait().unwrap();
    sh_ok(&format!(
        "printf 'changed' | dd of='{}' conv=notrunc status=none",
        img.display()
    ));
    BD.cmd(&["upload", img.to_str().unwrap(), &spec2, "--resume"])
        .fails_with("changed since");
}

#[test]
fn incremental_download_equals_a_full_one() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("base.img");
    sparse_image(&img, "256M", &[0, 10, 100, 200]);
    let spec = format!("{}/inc.vhd", BD.new_container("inc"));
    BD.ok(&["upload", img.to_str().unwrap(), &spec]);
    let a = json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let copy = dir.path().join("copy.vhd");
    BD.ok(&["download", &format!("{spec}@{a}"), copy.to_str().unwrap()]);
    // Change the drive: new data, overwritten data, and a cleared range.
    let blob = BD.blob(&spec);
    rt().block_on(async {
        blob.put_pages(50 * MIB, Bytes::from(vec![7u8; MIB as usize]), None)
            .await
            .unwrap();
        blob.put_pages(10 * MIB, Bytes::from(vec![9u8; 4096]), None)
            .await
            .unwrap();
        blob.clear_pages(100 * MIB, MIB, None).await.unwrap();
    });
    let b = json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let full = dir.path().join("full.vhd");
    BD.ok(&["download", &format!("{spec}@{b}"), full.to_str().unwrap()]);
    // --since takes the snapshot as `snapshot create` prints it, too.
    let r = json(&BD.ok(&[
        "download",
        &format!("{spec}@{b}"),
        copy.to_str().unwrap(),
        "--since",
        &format!("{spec}@{a}"),
        "--json",
    ]));
    // Azurite ignores prevsnapshot; the check must notice and compare instead.
    assert_eq!(r["method"], "full-compare");
    sh_ok(&format!("cmp '{}' '{}'", copy.display(), full.display()));
    // The cleared range became a hole again.
    assert!(allocated_on_disk(&copy) < 8 * MIB);
    // Wrong sizes and formats are refused.
    BD.cmd(&[
        "download",
        &format!("{spec}@{b}"),
        copy.to_str().unwrap(),
        "--since",
        &a,
        "--format",
        "raw",
    ])
    .fails_with("right file");
}

#[test]
fn snapshots_list_prune_delete_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v1.img");
    sparse_image(&img, "8M", &[1]);
    let spec = format!("{}/snaps.vhd", BD.new_container("snaps"));
    BD.ok(&["upload", img.to_str().unwrap(), &spec]);
    let blob = BD.blob(&spec);
    let v1 = rt().block_on(blob.read(MIB, 4096)).unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(BD.ok(&["snapshot", "create", &spec]).trim().to_string());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let list = json(&BD.ok(&["snapshot", "list", &spec, "--json"]));
    let listed: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, ids, "oldest first");
    assert_eq!(list[0]["allocated_bytes"], MIB + 512);
    assert!(list[0]["time"].is_string());
    assert_eq!(json(&BD.ok(&["info", &spec, "--json"]))["snapshots"], 4);
    // Prune: dry run changes nothing; then the newest two stay.
    let out = BD.ok(&["snapshot", "prune", &spec, "--keep", "2", "--dry-run"]);
    assert!(
        out.contains(&ids[0]) && out.contains(&ids[1]) && !out.contains(&ids[2]),
        "{out}"
    );
    assert_eq!(
        json(&BD.ok(&["snapshot", "list", &spec, "--json"]))
            .as_array()
            .unwrap()
            .len(),
        4
    );
    BD.ok(&["snapshot", "prune", &spec, "--keep", "2"]);
    let left: Vec<String> = json(&BD.ok(&["snapshot", "list", &spec, "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshot"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, ids[2..].to_vec());
    BD.ok(&["snapshot", "delete", &format!("{spec}@{}", ids[2])]);
    BD.cmd(&["snapshot", "delete", &spec])
        .fails_with("BLOB@SNAPSHOT");
    // Restore: the drive reads as the snapshot again.
    rt().block_on(blob.put_pages(MIB, Bytes::from(vec![0x55u8; 4096]), None))
        .unwrap();
    BD.cmd(&["restore", &spec, "--from", &ids[3]])
        .fails_with("--yes");
    let lease = "77777777-7777-4777-8777-777777777777";
    rt().block_on(blob.acquire_lease(lease, None)).unwrap();
    BD.cmd(&["restore", &spec, "--from", &ids[3], "--yes"])
        .fails_with("in use");
    rt().block_on(blob.release_lease(lease)).unwrap();
    BD.ok(&["restore", &spec, "--from", &ids[3], "--yes"]);
    assert_eq!(rt().block_on(blob.read(MIB, 4096)).unwrap(), v1);
    // Azurite shares a restored snapshot's pages with its drive (later writes to the
    // drive show in the snapshot), so the printed form is tried on a refusal here and
    // on a real restore by `restore_takes_the_snapshot_as_printed`.
    let printed = format!("{spec}@{}", ids[3]);
    let err = BD
        .cmd(&["restore", &spec, "--from", &printed])
        .fails_with("--yes");
    assert!(err.contains(&format!("replaced by {printed}")), "{err}");
    let other = format!("{}/other.vhd", spec.split_once('/').unwrap().0);
    BD.cmd(&["restore", &other, "--from", &printed, "--yes"])
        .fails_with(&format!("is a snapshot of {spec}, not of {other}"));
    BD.cmd(&[
        "restore",
        &spec,
        "--from",
        "2001-01-01T00:00:00.0000000Z",
        "--yes",
    ])
    .fails_with("does not exist");
}

#[test]
fn restore_takes_the_snapshot_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("p.img");
    sparse_image(&img, "4M", &[1]);
    let spec = format!("{}/printed.vhd", BD.new_container("printed"));
    BD.ok(&["upload", img.to_str().unwrap(), &spec]);
    let blob = BD.blob(&spec);
    let v1 = rt().block_on(blob.read(MIB, 4096)).unwrap();
    let out = BD.cmd(&["snapshot", "create", &spec]).output();
    assert!(out.status.success());
    let hint = String::from_utf8_lossy(&out.stderr).to_string();
    // "...; name it as BLOB@SNAPSHOT": what the user copies.
    let printed = hint
        .trim_end()
        .rsplit_once("name it as ")
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| panic!("no name in {hint}"));
    assert_eq!(
        printed,
        format!("{spec}@{}", String::from_utf8_lossy(&out.stdout).trim())
    );
    rt().block_on(blob.put_pages(MIB, Bytes::from(vec![0x56u8; 4096]), None))
        .unwrap();
    let done = BD.ok(&["restore", &spec, "--from", &printed, "--yes"]);
    assert_eq!(
        done.trim(),
        format!("restored {spec} from {printed} (4 MiB, the size it had)")
    );
    assert_eq!(rt().block_on(blob.read(MIB, 4096)).unwrap(), v1);
}

/// A mount made by a test, unmounted however the test ends.
struct Mounted(tempfile::TempDir);

impl Mounted {
    fn new(args: &[&str]) -> Mounted {
        let dir = tempfile::Builder::new()
            .prefix("blobdrive-transfer-mnt.")
            .tempdir()
            .unwrap();
        let mut all = vec!["mount", args[0], dir.path().to_str().unwrap()];
        all.extend_from_slice(&args[1..]);
        BD.ok(&all);
        Mounted(dir)
    }

    fn path(&self) -> &str {
        self.0.path().to_str().unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let out = BD.cmd(&["unmount", self.path()]).output();
        if !std::thread::panicking() {
            assert!(
                out.status.success(),
                "unmount: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn prune_skips_mounted_snapshots_and_download_warns_about_a_writable_mount() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("m.img");
    sparse_image(&img, "8M", &[1]);
    let spec = format!("{}/mounted.vhd", BD.new_container("mounted"));
    BD.ok(&["upload", img.to_str().unwrap(), &spec]);
    let ids: Vec<String> = (0..3)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            BD.ok(&["snapshot", "create", &spec]).trim().to_string()
        })
        .collect();
    let oldest = format!("{spec}@{}", ids[0]);
    {
        let m = Mounted::new(&[&oldest, "--mode", "raw"]);
        // The dry run lists what it would delete and names the mounted one it skips.
        let out = BD.ok(&["snapshot", "prune", &spec, "--keep", "1", "--dry-run"]);
        assert!(
            out.contains(&format!("would delete {spec}@{}", ids[1])),
            "{out}"
        );
        assert!(
            out.contains(&format!("skipping {oldest}: mounted at {}", m.path())),
            "{out}"
        );
        assert!(!out.contains(&format!("would delete {oldest}")), "{out}");
        // The real prune does the same, and deleting the mounted one is refused.
        let out = BD.ok(&["snapshot", "prune", &spec, "--keep", "1"]);
        assert!(out.contains(&format!("deleted {spec}@{}", ids[1])), "{out}");
        assert!(out.contains(&format!("skipping {oldest}")), "{out}");
        let left: Vec<String> = json(&BD.ok(&["snapshot", "list", &spec, "--json"]))
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["snapshot"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(left, vec![ids[0].clone(), ids[2].clone()]);
        BD.cmd(&["snapshot", "delete", &oldest])
            .fails_with("unmount it");
    }
    // A download of a drive mounted writable warns and points at snapshot create;
    // one of a snapshot, or of a drive not mounted, does not.
    let warning = "snapshot create";
    let copy = dir.path().join("live.img");
    {
        let _m = Mounted::new(&[&spec, "--mode", "raw"]);
        let out = BD
            .cmd(&["download", &spec, copy.to_str().unwrap()])
            .output();
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is mounted writable") && err.contains(warning),
            "{err}"
        );
        let snap = dir.path().join("snap.img");
        let out = BD
            .cmd(&[
                "download",
                &format!("{spec}@{}", ids[2]),
                snap.to_str().unwrap(),
            ])
            .output();
        assert!(out.status.success());
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains(warning),
            "{out:?}"
        );
    }
    std::fs::remove_file(&copy).unwrap();
    let out = BD
        .cmd(&["download", &spec, copy.to_str().unwrap()])
        .output();
    assert!(out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains(warning),
        "{out:?}"
    );
}

/// The SDK's allocated extents of the disk of `spec` (BLOB or BLOB@SNAPSHOT)
/// of `disk` bytes: its page ranges, merged, the footer left out.
fn sdk_extents(spec: &str, disk: u64) -> Vec<(u64, u64)> {
    let ranges = common::sdk::page_ranges(&(BD.account)(), spec);
    common::util::merged_ranges(ranges.into_iter().map(|(s, e)| (s, e.min(disk))).collect())
}

/// `extents` of `snapshot changes --json` as pairs.
fn extents_of(v: &Value) -> Vec<(u64, u64)> {
    v["extents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let (o, l) = (p[0].as_u64().unwrap(), p[1].as_u64().unwrap());
            (o, o + l)
        })
        .collect()
}

/// `snapshot changes`: a snapshot's allocated extents (BLOB@SNAPSHOT, in JSON
/// and as OFFSET LENGTH lines) are the SDK's page ranges of it; the changes
/// from one snapshot to another, or to the drive as it is, are on Azurite
/// (which gives no diff) every extent either holds, as the SDK lists them;
/// wrong snapshots are one line.
#[test]
fn snapshot_changes_lists_the_extents_the_sdk_lists() {
    const DISK: u64 = 32 * MIB;
    let spec = BD.new_drive("changes", "32MiB");
    let blob = BD.blob(&spec);
    let put = |at: u64, len: usize, byte: u8| {
        rt().block_on(blob.put_pages(at, Bytes::from(vec![byte; len]), None))
            .unwrap()
    };
    put(0, 512, 1);
    put(3 * 4096, 4096, 2);
    put(8 * MIB, 4 * MIB as usize, 3);
    let snap = || {
        json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let a = snap();
    put(512, 512, 4);
    put(20 * MIB, 4096, 5);
    rt().block_on(blob.clear_pages(8 * MIB + 4096, 8192, None))
        .unwrap();
    let b = snap();
    let (at_a, at_b) = (format!("{spec}@{a}"), format!("{spec}@{b}"));
    let listed = json(&BD.ok(&["snapshot", "changes", &at_a, "--json"]));
    assert_eq!(listed["method"], "allocated");
    assert_eq!(listed["disk_size"], DISK);
    let want = sdk_extents(&at_a, DISK);
    assert_eq!(extents_of(&listed), want);
    assert_eq!(listed["count"], want.len());
    let lines: Vec<(u64, u64)> = BD
        .ok(&["snapshot", "changes", &at_a])
        .lines()
        .map(|l| {
            let (o, n) = l.split_once(' ').unwrap();
            let o: u64 = o.parse().unwrap();
            (o, o + n.parse::<u64>().unwrap())
        })
        .collect();
    assert_eq!(lines, want);
    let both = |x: &str, y: &str| {
        let mut all = sdk_extents(x, DISK);
        all.extend(sdk_extents(y, DISK));
        common::util::merged_ranges(all)
    };
    let changed = json(&BD.ok(&[
        "snapshot", "changes", &spec, "--from", &a, "--to", &at_b, "--json",
    ]));
    assert_eq!(changed["method"], "compare");
    assert_eq!(changed["from"], a.as_str());
    assert_eq!(changed["to"], b.as_str());
    assert_eq!(extents_of(&changed), both(&at_a, &at_b));
    put(28 * MIB, 512, 6);
    let since = json(&BD.ok(&["snapshot", "changes", &spec, "--from", &at_a, "--json"]));
    assert_eq!(since["to"], Value::Null);
    assert_eq!(extents_of(&since), both(&at_a, &spec));
    BD.cmd(&["snapshot", "changes", &spec, "--from", &b, "--to", &a])
        .fails_saying("is not older than");
    BD.cmd(&["snapshot", "changes", &at_a, "--to", &b])
        .fails_saying("name the newer snapshot once");
    BD.cmd(&[
        "snapshot",
        "changes",
        &spec,
        "--from",
        "2001-01-01T00:00:00.0000000Z",
    ])
    .fails_saying("does not exist");
    let other = format!("{}/other.vhd@{a}", spec.split('/').next().unwrap());
    BD.cmd(&["snapshot", "changes", &spec, "--from", &other])
        .fails_saying("snapshot of");
}
