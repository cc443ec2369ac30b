//! The `blobdrive` command as users run it, against Azurite: the lifecycle commands
//! and every bad input, each leaving the blob unchanged.

mod common;
mod raw;
mod stub;

use common::bd::{the_error_line, Bd, Harness};
use common::facts::strings;
use common::util::{json, rt};
use std::process::Command;

use blobdrive::azure::Account;
use blobdrive::vhd::{DiskType, Footer};
use bytes::Bytes;
use common::azurite::{fingerprint, unique_container, Azurite};
use serde_json::Value;

const MIB: u64 = 1024 * 1024;

/// The shared emulator's account, no run directory, no logs asked for, and a
/// retry budget of 5 s so that a failure is one in bounded time.
const BD: Harness = Harness::without_run_dir()
    .env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "5")])
    .env_remove(&["BLOBDRIVE_LOG"]);

#[test]
fn create_info_lease_delete_lifecycle() {
    let c = BD.new_container("life");
    let spec = format!("{c}/data.vhd");
    let out = BD.ok(&["create", &spec, "--size", "64MiB"]);
    assert!(out.contains("64 MiB"), "{out}");
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(info["size_bytes"], 64 * MIB);
    assert_eq!(info["blob_bytes"], 64 * MIB + 512);
    assert_eq!(info["allocated_bytes"], 512, "only the footer is written");
    assert_eq!(info["disk_type"], "fixed");
    assert_eq!(info["lease_state"], "available");
    assert_eq!(info["lease_duration"], Value::Null);
    assert_eq!(info["snapshots"], 0);
    assert!(info["etag"].is_string());
    let text = BD.ok(&["info", &spec]);
    assert!(text.contains("64 MiB") && text.contains("fixed"), "{text}");

    // The footer is a real fixed VHD footer of the right size.
    let blob = BD.service().blob(&c, "data.vhd");
    let tail = rt().block_on(blob.read(64 * MIB, 512)).unwrap();
    let f = Footer::parse_fixed_for_blob(&tail, 64 * MIB + 512).unwrap();
    assert_eq!(f.current_size, 64 * MIB);

    // Lease status / break.
    let st = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(
        st,
        serde_json::json!({"blob": spec, "state": "available", "duration": null})
    );
    rt().block_on(blob.acquire_lease("55555555-5555-4555-8555-555555555555", None))
        .unwrap();
    let st = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(
        st,
        serde_json::json!({"blob": spec, "state": "leased", "duration": "infinite"})
    );
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(info["lease_state"], "leased");
    assert_eq!(info["lease_duration"], "infinite");
    // A leased drive cannot be deleted.
    BD.cmd(&["delete", &spec, "--yes"]).fails_saying("in use");
    // A held lease is broken only with --yes, after saying what its holder loses.
    let err = BD.cmd(&["lease", "break", &spec]).fails_saying("--yes");
    assert!(
        err.contains("not yet put on the blob is lost") && err.contains("Nothing was broken"),
        "{err}"
    );
    let st = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(st["state"], "leased");
    let out = BD.ok(&["lease", "break", &spec, "--yes"]);
    assert!(out.contains("lease broken"), "{out}");
    let st = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(st["state"], "broken");
    let out = BD.ok(&["lease", "break", &spec]);
    assert!(out.contains("nothing changed"), "{out}");

    // Snapshots are counted, and block a plain delete.
    let snap = rt().block_on(blob.create_snapshot()).unwrap();
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(info["snapshots"], 1);
    let info = json(&BD.ok(&["info", &format!("{spec}@{snap}"), "--json"]));
    assert_eq!(info["snapshot"], snap.as_str());
    assert_eq!(info["size_bytes"], 64 * MIB);

    BD.cmd(&["delete", &spec]).fails_saying("--yes");
    BD.cmd(&["delete", &spec, "--yes"])
        .fails_saying("--snapshots");
    let out = BD.ok(&["delete", &spec, "--snapshots", "--yes"]);
    assert!(out.contains("deleted"), "{out}");
    BD.cmd(&["info", &spec]).fails_saying("does not exist");
}

/// Every command that prints a result prints it as one JSON object with
/// `--json`, the objects saying what the text says, each checked against the
/// service (`info --json`, `snapshot list --json`).
#[test]
fn every_command_that_prints_a_result_has_json() {
    let c = unique_container("json");
    let spec = format!("{c}/data.vhd");
    let made = json(&BD.ok(&[
        "create",
        &spec,
        "--size",
        "64MiB",
        "--create-container",
        "--json",
    ]));
    assert_eq!(
        made,
        serde_json::json!({"blob": spec, "size_bytes": 64 * MIB, "blob_bytes": 64 * MIB + 512, "container_created": true})
    );
    let grown = json(&BD.ok(&["resize", &spec, "--size", "96MiB", "--json"]));
    assert_eq!(grown["blob"], spec.as_str());
    assert_eq!(grown["from_bytes"], 64 * MIB);
    assert_eq!(grown["size_bytes"], 96 * MIB);
    assert_eq!(grown["blob_bytes"], 96 * MIB + 512);
    assert_eq!(grown["grown"], true);
    assert_eq!(grown["mountpoint"], Value::Null);
    assert_eq!(grown["note"], Value::Null, "a blank disk has no filesystem");
    let same = json(&BD.ok(&["resize", &spec, "--size", "96MiB", "--json"]));
    assert_eq!(same["grown"], false);
    assert_eq!(same["from_bytes"], 96 * MIB);
    let snapshot = || {
        json(&BD.ok(&["snapshot", "create", &spec, "--json"]))["snapshot"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = snapshot();
    BD.ok(&["resize", &spec, "--size", "128MiB"]);
    let (second, third) = (snapshot(), snapshot());
    let restored = json(&BD.ok(&["restore", &spec, "--from", &first, "--yes", "--json"]));
    assert_eq!(
        restored,
        serde_json::json!({"blob": spec, "snapshot": first, "was_bytes": 128 * MIB, "size_bytes": 96 * MIB})
    );
    assert_eq!(
        json(&BD.ok(&["info", &spec, "--json"]))["size_bytes"],
        96 * MIB
    );
    let would = json(&BD.ok(&[
        "snapshot",
        "prune",
        &spec,
        "--keep",
        "2",
        "--dry-run",
        "--json",
    ]));
    assert_eq!(
        would,
        serde_json::json!({"blob": spec, "dry_run": true, "would_delete": [first], "kept": [second, third], "skipped": []})
    );
    let gone = json(&BD.ok(&["snapshot", "delete", &format!("{spec}@{third}"), "--json"]));
    assert_eq!(
        gone,
        serde_json::json!({"deleted": format!("{spec}@{third}")})
    );
    let pruned = json(&BD.ok(&["snapshot", "prune", &spec, "--keep", "1", "--json"]));
    assert_eq!(
        pruned,
        serde_json::json!({"blob": spec, "dry_run": false, "deleted": [first], "kept": [second], "skipped": []})
    );
    let left = json(&BD.ok(&["snapshot", "list", &spec, "--json"]));
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["snapshot"], second.as_str());
    let deleted = json(&BD.ok(&["delete", &spec, "--snapshots", "--yes", "--json"]));
    assert_eq!(
        deleted,
        serde_json::json!({"deleted": spec, "snapshots": true})
    );
    BD.cmd(&["info", &spec]).fails_saying("does not exist");
}

/// The check the test below runs on every command is itself checked: the
/// twins' names and snapshot times made alike, a size found in either
/// spelling, and a fact missing from either side found missing.
#[test]
fn the_check_of_text_against_json_finds_a_fact_either_lacks() {
    use common::facts::{alike, assert_same};
    assert_eq!(
        alike(
            "c/jtwin.vhd@2026-11-22T11:05:54.5810000Z on /dev/loop12",
            &[]
        ),
        "c/ttwin.vhd@SNAPSHOT on /dev/loopN"
    );
    let v = serde_json::json!({"blob": "c/d.vhd", "size": 67108864, "pid": 7});
    assert_same("t", "c/d.vhd is 64 MiB", &v, &["pid"], &[]);
    for text in [
        "c/d.vhd at /m is 64 MiB",
        "c/d.vhd",
        "c/d.vhd is 67108864 bytes, 9 of 12345",
    ] {
        let check = std::panic::catch_unwind(|| assert_same("t", text, &v, &["pid"], &[]));
        assert!(check.is_err(), "{text}");
    }
}

/// Every command that prints a result says the same facts as text and as
/// JSON: run on twin drives made alike (or on one, for a command that
/// changes nothing), each fact of the text (names, sizes, numbers) is in the
/// JSON and each value of the JSON in the text (see tests/common/facts.rs).
/// Mount, unmount, list, stats and warm are compared in tests/mount_e2e.rs.
#[test]
fn text_and_json_say_the_same_for_each_command() {
    let text_and_json = |args: &dyn Fn(&str) -> Vec<String>, same, own: &[&str]| {
        common::facts::text_and_json(&BD, args, same, own, &[])
    };
    let c = unique_container("facts");
    let d = |twin: &str| format!("{c}/{twin}.vhd");
    let tmp = tempfile::tempdir().unwrap();
    let local = |name: &str| tmp.path().join(name).display().to_string();
    // Both twins leased, as another host would hold them.
    let lease_twins = || {
        for twin in ["ttwin", "jtwin"] {
            let blob = BD.service().blob(&c, &format!("{twin}.vhd"));
            rt().block_on(blob.acquire_lease("55555555-5555-4555-8555-555555555555", None))
                .unwrap();
        }
    };
    text_and_json(
        &|t| strings(&["create", &d(t), "--size", "64MiB", "--create-container"]),
        false,
        &[],
    );
    text_and_json(&|t| strings(&["info", &d(t)]), true, &[]);
    text_and_json(
        &|t| strings(&["resize", &d(t), "--size", "96MiB"]),
        false,
        &[],
    );
    lease_twins();
    let st = text_and_json(&|t| strings(&["lease", "status", &d(t)]), true, &[]);
    assert_eq!(st["blob"], d("ttwin"));
    let broken = text_and_json(
        &|t| strings(&["lease", "break", &d(t), "--yes"]),
        false,
        &[],
    );
    assert_eq!(
        (&broken["state"], &broken["changed"]),
        (&"broken".into(), &true.into())
    );
    text_and_json(&|t| strings(&["lease", "break", &d(t)]), true, &[]);
    // Three snapshots of each twin, the first taken through each way.
    let mut ids: std::collections::HashMap<String, Vec<String>> = Default::default();
    let snap = text_and_json(&|t| strings(&["snapshot", "create", &d(t)]), false, &[]);
    assert_eq!(snap["blob"], d("jtwin"));
    for twin in ["ttwin", "jtwin"] {
        let list = json(&BD.ok(&["snapshot", "list", &d(twin), "--json"]));
        let mut mine: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["snapshot"].as_str().unwrap().to_string())
            .collect();
        for _ in 0..2 {
            let made = json(&BD.ok(&["snapshot", "create", &d(twin), "--json"]));
            mine.push(made["snapshot"].as_str().unwrap().to_string());
        }
        ids.insert(twin.to_string(), mine);
    }
    let id = |t: &str, i: usize| ids[t][i].clone();
    text_and_json(&|t| strings(&["snapshot", "list", &d(t)]), true, &[]);
    text_and_json(&|t| strings(&["snapshot", "changes", &d(t)]), true, &[]);
    let would = text_and_json(
        &|t| strings(&["snapshot", "prune", &d(t), "--keep", "2", "--dry-run"]),
        true,
        &[],
    );
    assert_eq!(would["would_delete"], serde_json::json!([id("ttwin", 0)]));
    assert!(
        would.get("deleted").is_none(),
        "a dry run deletes nothing: {would}"
    );
    text_and_json(
        &|t| strings(&["snapshot", "delete", &format!("{}@{}", d(t), id(t, 2))]),
        false,
        &[],
    );
    text_and_json(
        &|t| strings(&["snapshot", "prune", &d(t), "--keep", "1"]),
        false,
        &[],
    );
    text_and_json(
        &|t| strings(&["restore", &d(t), "--from", &id(t, 1), "--yes"]),
        false,
        &[],
    );
    // A transfer's seconds are those of its own run.
    text_and_json(
        &|t| strings(&["download", &d(t), &local(&format!("{t}.img"))]),
        false,
        &["seconds"],
    );
    std::fs::write(local("image"), vec![7u8; MIB as usize]).unwrap();
    text_and_json(
        &|t| strings(&["upload", &local("image"), &format!("{c}/up-{t}.vhd")]),
        false,
        &["seconds"],
    );
    text_and_json(
        &|t| strings(&["manpages", &local(&format!("man-{t}"))]),
        false,
        &[],
    );
    // A lease breaking, then broken.
    lease_twins();
    let breaking = text_and_json(
        &|t| strings(&["lease", "break", &d(t), "--period", "2", "--yes"]),
        false,
        &[],
    );
    assert_eq!(breaking["state"], "breaking");
    std::thread::sleep(std::time::Duration::from_secs(3));
    text_and_json(
        &|t| strings(&["delete", &d(t), "--snapshots", "--yes"]),
        false,
        &[],
    );
}

#[test]
fn create_refuses_bad_sizes_and_existing_blobs() {
    let c = BD.new_container("sizes");
    let spec = format!("{c}/x.vhd");
    BD.cmd(&["create", &spec, "--size", "1000000"])
        .fails_saying("whole number of MiB");
    BD.cmd(&["create", &spec, "--size", "9TiB"])
        .fails_saying("maximum");
    BD.cmd(&["create", &spec, "--size", "0"])
        .fails_saying("more than 0");
    BD.cmd(&["create", &spec, "--size", "lots"])
        .fails_saying("invalid size");
    BD.cmd(&["create", &spec, "--size", "1.7MiB"])
        .fails_saying("whole numbers only");
    BD.cmd(&["create", &spec, "--size", "1.5GiB"])
        .fails_saying("write 1536MiB");
    let err = BD
        .cmd(&["create", &spec, "--size", "1GB"])
        .fails_saying("ambiguous");
    assert!(err.contains("write 1GiB (1 GiB = 1024 MiB)"), "{err}");
    BD.cmd(&["create", &spec, "--size", "64MB"])
        .fails_saying("write 64MiB");
    let none = rt()
        .block_on(BD.service().container(&c).list_blobs("", false))
        .unwrap();
    assert!(none.is_empty(), "nothing created: {none:?}");
    // The largest allowed size works (sparse: nothing but the footer is written).
    BD.ok(&[
        "create",
        &format!("{c}/max.vhd"),
        "--size",
        &format!("{}", 8 * 1024 * 1024 * MIB - MIB),
    ]);
    BD.ok(&["create", &spec, "--size", "1M"]);
    let blob = BD.service().blob(&c, "x.vhd");
    let before = fingerprint(&blob);
    BD.cmd(&["create", &spec, "--size", "2M"])
        .fails_saying("already exists");
    assert_eq!(fingerprint(&blob), before);
}

#[test]
fn create_container_only_when_asked() {
    let c = unique_container("newcont");
    let spec = format!("{c}/d.vhd");
    BD.cmd(&["create", &spec, "--size", "1M"])
        .fails_saying("--create-container");
    BD.ok(&["create", &spec, "--size", "1M", "--create-container"]);
    let info = json(&BD.ok(&["info", &spec, "--json"]));
    assert_eq!(info["size_bytes"], MIB);
}

#[test]
fn bad_inputs_leave_the_blob_unchanged() {
    let c = BD.new_container("bad");
    let svc = BD.service();
    // Missing container, missing blob.
    BD.cmd(&["info", &format!("{}/d.vhd", unique_container("gone"))])
        .fails_saying("container");
    BD.cmd(&["info", &format!("{c}/missing.vhd")])
        .fails_saying("does not exist");
    BD.cmd(&["lease", "status", &format!("{c}/missing.vhd")])
        .fails_saying("does not exist");
    BD.cmd(&["info", "no-slash"]).fails_saying("not a blob");
    BD.cmd(&["info", &format!("{c}/d.vhd@yesterday")])
        .fails_saying("invalid snapshot");

    // Wrong key.
    BD.ok(&["create", &format!("{c}/good.vhd"), "--size", "1M"]);
    let good = svc.blob(&c, "good.vhd");
    let before = fingerprint(&good);
    let wrong = Azurite::shared().connection_string().replace(
        common::azurite::DEV_KEY,
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    );
    for args in [
        vec!["info", "GOOD"],
        vec!["delete", "GOOD", "--yes"],
        vec!["lease", "break", "GOOD"],
    ] {
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("GOOD", &format!("{c}/good.vhd")))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = BD.cmd(&args).cs(&wrong).output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("account key or SAS"), "{err}");
        assert!(
            !err.contains("AAAAAAAA"),
            "the key must never be printed: {err}"
        );
    }
    assert_eq!(fingerprint(&good), before);

    // A block blob.
    let account = Account::from_connection_string(&Azurite::shared().connection_string()).unwrap();
    rt().block_on(raw::put_block_blob(
        &account,
        &c,
        "block.vhd",
        vec![0u8; 2048],
    ));
    let block = svc.blob(&c, "block.vhd");
    let before = fingerprint(&block);
    BD.cmd(&["info", &format!("{c}/block.vhd")])
        .fails_saying("block blob, not a page blob");
    BD.cmd(&["delete", &format!("{c}/block.vhd"), "--yes"])
        .fails_saying("block blob");
    BD.cmd(&["lease", "break", &format!("{c}/block.vhd")])
        .fails_saying("block blob");
    assert_eq!(fingerprint(&block), before);

    // Footers that are not a fixed VHD: dynamic, bad checksum, no cookie, wrong size.
    let mut dynamic = Footer::new_fixed(MIB).unwrap();
    dynamic.disk_type = DiskType::Dynamic;
    let mut damaged = Footer::new_fixed(MIB).unwrap().to_bytes();
    damaged[100] ^= 0x55;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("dynamic.vhd", dynamic.to_bytes().to_vec(), "dynamic"),
        ("checksum.vhd", damaged.to_vec(), "checksum"),
        ("nocookie.vhd", vec![0x41u8; 512], "conectix"),
        (
            "size.vhd",
            Footer::new_fixed(2 * MIB).unwrap().to_bytes().to_vec(),
            "blob holds",
        ),
    ];
    for (name, footer, needle) in cases {
        let blob = svc.blob(&c, name);
        rt().block_on(async {
            blob.create_page_blob(MIB + 512).await.unwrap();
            blob.put_pages(MIB, Bytes::from(footer), None)
                .await
                .unwrap();
        });
        let before = fingerprint(&blob);
        BD.cmd(&["info", &format!("{c}/{name}")])
            .fails_saying(needle);
        assert_eq!(fingerprint(&blob), before, "{name} unchanged");
    }

    // A blob too small to hold a VHD.
    let tiny = svc.blob(&c, "tiny.vhd");
    rt().block_on(tiny.create_page_blob(1024)).unwrap();
    BD.cmd(&["info", &format!("{c}/tiny.vhd")])
        .fails_saying("too small");

    // Lease held by someone else: delete and a second break-free op are refused.
    let held = svc.blob(&c, "good.vhd");
    rt().block_on(held.acquire_lease("66666666-6666-4666-8666-666666666666", None))
        .unwrap();
    let before = fingerprint(&held);
    BD.cmd(&["delete", &format!("{c}/good.vhd"), "--yes"])
        .fails_saying("in use");
    assert_eq!(fingerprint(&held), before);
}

#[test]
fn connection_string_errors_are_one_line_and_secret_free() {
    let out = BD
        .cmd(&["info", "disks/a.vhd"])
        .cs("AccountName=a;AccountKey=not-base64!!secret")
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("AccountKey is not valid base64"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

#[test]
fn unknown_connection_string_names_are_named_with_the_known_ones() {
    let err = BD
        .cmd(&["info", "disks/a.vhd"])
        .cs("AccountNme=devstoreaccount1;AccountKey=c2VjcmV0LWtleQ==")
        .fails_with_error(&[
            "unknown name 'AccountNme'",
            "did you mean AccountName?",
            "known names: AccountName, AccountKey",
            "BlobEndpoint",
            "SharedAccessSignature",
        ]);
    assert!(!err.contains("c2VjcmV0"), "no secret: {err}");
    // A key pasted without its name: base64 ends in '=', but it is never echoed.
    let err = BD
        .cmd(&["info", "disks/a.vhd"])
        .cs(&format!(
            "AccountName=devstoreaccount1;{}",
            common::azurite::DEV_KEY
        ))
        .fails_with_error(&["not shown", "known names: AccountName"]);
    assert!(
        !err.contains(&common::azurite::DEV_KEY[..8]),
        "no secret: {err}"
    );
}

#[test]
fn an_emulator_endpoint_without_the_account_says_what_was_expected() {
    // The Azurite endpoint with its /devstoreaccount1 left off: requests would reach
    // the emulator and come back as a bare 400 InvalidResourceName.
    let endpoint = Azurite::shared().blob_endpoint();
    let bare = endpoint.trim_end_matches("/devstoreaccount1");
    assert_ne!(bare, endpoint);
    let err = BD
        .cmd(&["info", "disks/a.vhd"])
        .cs(&format!(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={};BlobEndpoint={bare}/",
            common::azurite::DEV_KEY
        ))
        .fails_with_error(&[
            &format!("BlobEndpoint {bare} names no account"),
            &format!("as in {bare}/devstoreaccount1"),
        ],
    );
    assert!(!err.contains(common::azurite::DEV_KEY), "{err}");
}

#[test]
fn mount_refuses_a_cache_larger_than_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().to_str().unwrap();
    let err = BD
        .cmd(&["mount", "disks/a.vhd", mountpoint, "--cache-size", "100TiB"])
        .fails_with_error(&["--cache-size 100 TiB", "of memory", "at most 3/4 of it"]);
    // The figure is this machine's MemTotal.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap();
    let shown = blobdrive::size::human(kib * 1024);
    assert!(err.contains(&format!("it has {shown} of memory")), "{err}");
}

#[test]
fn unreachable_endpoint_fails_in_bounded_time() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cs = format!(
        "AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1",
        common::azurite::DEV_KEY
    );
    let started = std::time::Instant::now();
    let out = BD
        .cmd(&["info", "disks/a.vhd"])
        .cs(&cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "3")
        .output();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let endpoint = format!("http://127.0.0.1:{port}/devstoreaccount1");
    assert!(
        err.contains(&format!(
            "no answer from the storage service at {endpoint} "
        )),
        "{err}"
    );
    // A configured account gets no advice about configuring one, and no secret.
    assert!(!err.contains("scripts/azurite.sh"), "{err}");
    assert!(!err.contains(common::azurite::DEV_KEY), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

#[test]
fn with_no_account_configured_nothing_is_contacted_not_even_the_default_emulator_port() {
    // A local user listens where the emulator would (127.0.0.1:10000), ready to
    // serve root an image of its choosing. When the port is taken, the part that
    // listens is skipped; the refusal is checked all the same.
    let trap = std::net::TcpListener::bind("127.0.0.1:10000").ok();
    if let Some(t) = &trap {
        t.set_nonblocking(true).unwrap();
    }
    let mp = tempfile::tempdir().unwrap();
    let mps = mp.path().to_str().unwrap().to_string();
    for args in [
        vec!["info", "disks/a.vhd"],
        vec!["create", "disks/a.vhd", "--size", "16MiB"],
        vec!["mount", "disks/a.vhd", mps.as_str()],
        vec!["snapshot", "list", "disks/a.vhd"],
    ] {
        let started = std::time::Instant::now();
        let err = BD
            .cmd(&args)
            .env_remove("AZURE_STORAGE_CONNECTION_STRING")
            .env_remove("AZURE_STORAGE_ACCOUNT")
            .fails_with_error(&[
                "no storage account is configured",
                "AZURE_STORAGE_CONNECTION_STRING",
                "AZURE_STORAGE_ACCOUNT",
                "credentials",
                "UseDevelopmentStorage=true",
            ]);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "{args:?} did not fail at once: {:?}",
            started.elapsed()
        );
        if let Some(t) = &trap {
            assert!(
                t.accept().is_err(),
                "{args:?} connected to 127.0.0.1:10000 with nothing configured"
            );
        }
    }
    assert!(
        std::fs::read_dir(mp.path()).unwrap().next().is_none(),
        "something was mounted"
    );
}

#[test]
fn help_teaches_and_lists_only_built_commands() {
    let out = BD.ok(&["--help"]);
    for cmd in ["create", "info", "lease", "delete"] {
        assert!(out.contains(cmd), "{out}");
    }
    assert!(out.contains("AZURE_STORAGE_CONNECTION_STRING"), "{out}");
    assert!(out.contains("container/name.vhd"), "{out}");
    assert!(
        out.contains("Decimal spellings (KB, MB, GB, TB) are refused"),
        "{out}"
    );
    assert!(out.contains("qemu-img info -f vpc"), "{out}");
    let out = BD.ok(&["lease", "break", "--help"]);
    assert!(out.contains("dead host"), "{out}");
    // The text after the options is wrapped by hand, evenly: no prose line runs
    // past 88 columns (indented lines, such as an fstab example, may).
    for cmd in [
        vec![],
        vec!["create"],
        vec!["resize"],
        vec!["mount"],
        vec!["unmount"],
        vec!["delete"],
        vec!["upload"],
        vec!["download"],
        vec!["restore"],
        vec!["lease", "break"],
        vec!["snapshot", "prune"],
        vec!["snapshot", "changes"],
    ] {
        let mut args = cmd.clone();
        args.push("--help");
        let out = BD.ok(&args);
        let after = out.rsplit_once("Print help").map_or("", |(_, a)| a);
        for line in after.lines().filter(|l| !l.starts_with(' ')) {
            assert!(line.chars().count() <= 88, "{cmd:?} --help: {line}");
        }
    }
    // Every snapshot subcommand says what its BLOB is.
    for (sub, words) in [
        ("list", "whose snapshots to list"),
        ("delete", "container/name.vhd@SNAPSHOT"),
        ("prune", "whose snapshots to prune"),
        ("changes", "the allocated extents of"),
    ] {
        let out = BD.ok(&["snapshot", sub, "--help"]);
        let arg = out
            .lines()
            .skip_while(|l| !l.starts_with("Arguments:"))
            .nth(1)
            .unwrap_or_default()
            .to_string();
        assert!(
            arg.contains("<BLOB>") && arg.len() > "  <BLOB>".len() + 4,
            "{sub}: {out}"
        );
        assert!(out.contains(words), "{sub}: {out}");
    }
    // upload and download have --json, as the README lists.
    for sub in ["upload", "download"] {
        assert!(BD.ok(&[sub, "--help"]).contains("--json"), "{sub}");
    }
}

/// The names `--help` lists in its section `section` (`Commands:`), but help.
fn listed_in_help(help: &str, section: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != section)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

/// The options `--help` lists (at their place in the option list, not those
/// named in a description): each as `--long`, with `-s` if it has a short one.
fn options_in_help(help: &str) -> Vec<(String, Option<String>)> {
    help.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("  ")?;
            let (short, rest) = match rest.strip_prefix("    ") {
                Some(after) => (None, after),
                None => {
                    let (short, after) = rest.split_at_checked(4)?;
                    let s = short.strip_suffix(", ").filter(|s| s.starts_with('-'))?;
                    (Some(s.to_string()), after)
                }
            };
            let name = rest.strip_prefix("--")?;
            let end = name
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(name.len());
            Some((format!("--{}", &name[..end]), short))
        })
        .collect()
}

/// The synopsis of docs/mounting.md ("The commands") says what is true: a line
/// for every command `--help` lists (each command of `lease` and `snapshot`
/// too), naming each of its options; the global ones on the first line.
#[test]
fn the_manual_s_synopsis_names_every_command_and_option() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/mounting.md")).unwrap();
    let block: Vec<&str> = page
        .split("## The commands")
        .nth(1)
        .and_then(|s| s.split("```text\n").nth(1))
        .and_then(|s| s.split("```").next())
        .unwrap()
        .lines()
        .collect();
    // A command's lines: its own and those indented below it.
    let mut synopsis: Vec<String> = Vec::new();
    for l in &block {
        if l.starts_with("blobdrive ") {
            synopsis.push(l.to_string());
        } else if l.starts_with(' ') {
            if let Some(last) = synopsis.last_mut() {
                last.push_str(l);
            }
        }
    }
    let top = BD.ok(&["--help"]);
    let global = options_in_help(&top);
    let names = |line: &str, (long, short): &(String, Option<String>)| {
        let word = |w: &str| {
            line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|x| x == w)
        };
        word(long) || short.as_deref().is_some_and(word)
    };
    for g in global
        .iter()
        .filter(|(g, _)| g != "--help" && g != "--version")
    {
        assert!(names(&synopsis[0], g), "the first line lacks {}", g.0);
    }
    let mut commands = Vec::new();
    for c in listed_in_help(&top, "Commands:") {
        let subs = listed_in_help(&BD.ok(&[&c, "--help"]), "Commands:");
        if subs.is_empty() {
            commands.push(vec![c]);
        } else {
            commands.extend(subs.into_iter().map(|s| vec![c.clone(), s]));
        }
    }
    assert!(commands.len() > 20, "{commands:?}");
    for cmd in commands {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let name = format!("blobdrive {} ", args.join(" "));
        let line = synopsis
            .iter()
            .find(|l| l.starts_with(&name))
            .unwrap_or_else(|| panic!("the synopsis has no line for `{}`", name.trim()));
        let help = BD.ok(&[args.as_slice(), &["--help"]].concat());
        for o in options_in_help(&help) {
            if global.contains(&o) || o.0 == "--help" {
                continue;
            }
            assert!(names(line, &o), "`{}` lacks {}: {line}", name.trim(), o.0);
        }
    }
}

#[test]
fn upload_of_a_missing_file_names_its_cause_once() {
    let c = BD.new_container("nofile");
    let err = BD
        .cmd(&["upload", "/nothere.img", &format!("{c}/a.vhd")])
        .fails_saying("/nothere.img: No such file or directory");
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
}

/// A SAS signed with the emulator's key: `service` for one blob (`sr=b`, the shape
/// of a managed disk's export URL), else an account SAS for objects only
/// (`srt=o`). Both with read permission only: neither can list the container.
fn read_only_blob_sas(container: &str, blob: &str, service: bool) -> String {
    use base64::Engine as _;
    let version = "2021-12-02";
    let expiry = "2099-01-01T00:00:00Z";
    let sts = if service {
        format!(
            "r\n\n{expiry}\n/blob/devstoreaccount1/{container}/{blob}\n\n\nhttp,https\n{version}\nb\n\n\n\n\n\n\n"
        )
    } else {
        format!("devstoreaccount1\nr\nb\no\n\n{expiry}\n\nhttp,https\n{version}\n\n")
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(common::azurite::DEV_KEY)
        .unwrap();
    let auth = blobdrive::azure::auth::shared_key::authorization("x", &key, &sts);
    let sig = auth.rsplit(':').next().unwrap();
    let sig: String = url::form_urlencoded::byte_serialize(sig.as_bytes()).collect();
    if service {
        format!("sv={version}&sr=b&sp=r&se={expiry}&spr=http,https&sig={sig}")
    } else {
        format!("sv={version}&ss=b&srt=o&sp=r&se={expiry}&spr=http,https&sig={sig}")
    }
}

#[test]
fn info_works_with_a_read_sas_for_one_blob() {
    let c = BD.new_container("sasinfo");
    let spec = format!("{c}/disk.vhd");
    BD.ok(&["create", &spec, "--size", "8MiB"]);
    for service in [true, false] {
        let url = format!(
            "{}/{spec}?{}",
            Azurite::shared().blob_endpoint().trim_end_matches('/'),
            read_only_blob_sas(&c, "disk.vhd", service)
        );
        // The SAS really cannot list: what `info` used to fail on.
        BD.cmd(&["snapshot", "list", &url])
            .fails_saying("access denied");
        let info = json(&BD.ok(&["info", &url, "--json"]));
        assert_eq!(info["size_bytes"], 8 * MIB, "service SAS: {service}");
        assert_eq!(info["allocated_bytes"], 512);
        assert_eq!(info["snapshots"], Value::Null);
        let text = BD.ok(&["info", &url]);
        assert!(text.contains("snapshots:    unknown"), "{text}");
    }
    // With a key that can list, the count is there.
    assert_eq!(json(&BD.ok(&["info", &spec, "--json"]))["snapshots"], 0);
}

#[test]
fn a_failure_is_one_plain_line_without_a_log_line_before_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cs = format!(
        "AccountName=devstoreaccount1;AccountKey={};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1",
        common::azurite::DEV_KEY
    );
    let out = BD
        .cmd(&["info", "disks/a.vhd"])
        .cs(&cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "1")
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("blobdrive: error: "), "{err}");
    assert!(!err.contains("giving up"), "{err}");
    // Logs asked for with -vv go to a pipe here: no colour codes.
    let out = BD
        .cmd(&["-vv", "info", "disks/a.vhd"])
        .cs(&cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "1")
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("giving up"), "{err}");
    assert!(!err.contains('\x1b'), "{err:?}");
}

#[test]
fn unmount_discard_dirty_needs_yes() {
    let out = BD
        .cmd(&["unmount", "/nonexistent-mp", "--discard-dirty"])
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("add --yes"), "{err}");
}

#[test]
fn list_and_stats_say_when_the_run_directory_is_not_readable() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the binary as nobody");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("bd-run-")
        .tempdir_in("/tmp")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mounts = dir.path().join("mounts");
    std::fs::create_dir(&mounts).unwrap();
    std::fs::write(mounts.join("0123456789abcdef.json"), "{}").unwrap();
    std::fs::set_permissions(&mounts, std::fs::Permissions::from_mode(0o700)).unwrap();
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["stats", "/mnt"],
        &["unmount", "/mnt"],
    ] {
        let out = Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_blobdrive"))
            .args(args)
            .env("BLOBDRIVE_RUN_DIR", dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("cannot read the run directory") && err.contains("root"),
            "{args:?}: {err}"
        );
    }
}

/// `blobdrive ARGS` in a network namespace of its own (nothing can leave it) with
/// `cs` as the connection string (none when empty).
fn in_empty_netns(cs: &str, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.arg("-n").arg(env!("CARGO_BIN_EXE_blobdrive")).args(args);
    c.env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env_remove("BLOBDRIVE_LOG");
    if !cs.is_empty() {
        c.env("AZURE_STORAGE_CONNECTION_STRING", cs);
    }
    c
}

#[test]
fn keys_and_sas_go_only_over_https_or_to_this_machine() {
    // Run as root in an empty network namespace: were anything sent, it would be
    // retried for seconds; the refusal comes before connecting, at once.
    let key = common::azurite::DEV_KEY;
    let keyed = format!(
        "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={key};BlobEndpoint=http://192.0.2.1/acct"
    );
    let sas_url = "http://192.0.2.1/acct/disks/a.vhd?sv=2021-12-02&sp=r&sig=SECRETSIG";
    for (cs, args) in [
        (keyed.as_str(), vec!["info", "disks/a.vhd"]),
        ("", vec!["info", sas_url]),
        (
            keyed.as_str(),
            vec!["create", "disks/b.vhd", "--size", "16MiB"],
        ),
    ] {
        let started = std::time::Instant::now();
        let err = Bd::from(in_empty_netns(cs, &args))
            .fails_with_error(&["http://192.0.2.1", "only over https"]);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "{args:?}: not refused before connecting ({:?})",
            started.elapsed()
        );
        assert!(!err.contains("SECRETSIG") && !err.contains(key), "{err}");
    }
    // Plain http to loopback stays allowed (the emulator these tests use).
    BD.ok(&["info", "--help"]);
}

#[test]
fn a_redirect_is_an_error_naming_where_it_pointed_and_is_never_followed() {
    let elsewhere = stub::Stub::start(|_, _| stub::Reply::status(200));
    let to = format!(
        "http://127.0.0.1:{}/devstoreaccount1/disks/a.vhd?sv=2021-12-02&sig=ELSEWHERESIG",
        elsewhere.port
    );
    let endpoint = stub::Stub::start(move |_, _| stub::Reply::status(307).with("Location", &to));
    let cs = format!(
        "AccountName=devstoreaccount1;SharedAccessSignature=sv=2021-12-02&sp=r&sig=MYSIG;BlobEndpoint={}",
        endpoint.endpoint()
    );
    let err = BD.cmd(&["info", "disks/a.vhd"]).cs(&cs).fails_with_error(&[
        "307",
        &format!("http://127.0.0.1:{}", elsewhere.port),
        "not followed",
    ]);
    assert!(
        !err.contains("ELSEWHERESIG") && !err.contains("MYSIG"),
        "{err}"
    );
    assert!(
        elsewhere.requests().is_empty(),
        "the redirect was followed: {:?}",
        elsewhere.requests()
    );
    let sent = endpoint.requests();
    assert_eq!(sent.len(), 1, "a redirect is final, not retried: {sent:?}");
    assert!(sent.iter().all(|r| r.header("referer").is_none()));
}

/// A fixed drive of 1 MiB as a hostile endpoint serves it (properties and footer
/// as the service would), with `listing` answering Get Page Ranges and List Blobs.
fn hostile_drive(
    listing: impl Fn(&stub::Recorded, usize) -> stub::Reply + Send + Sync + 'static,
) -> stub::Stub {
    hostile_drive_of(MIB, listing)
}

/// [`hostile_drive`] of `size` bytes.
fn hostile_drive_of(
    size: u64,
    listing: impl Fn(&stub::Recorded, usize) -> stub::Reply + Send + Sync + 'static,
) -> stub::Stub {
    let footer = blobdrive::vhd::Footer::new_fixed(size).unwrap().to_bytes();
    stub::Stub::start(move |req, i| {
        if req.method == "HEAD" {
            return stub::Reply::status(200)
                .with("x-ms-blob-type", "PageBlob")
                .with("Content-Length-Override", &(size + 512).to_string());
        }
        if req.query("comp").is_none() && req.header("x-ms-range").is_some() {
            return stub::Reply::part(req, size + 512, footer.to_vec());
        }
        listing(req, i)
    })
}

/// A List Blobs request's answer as the service gives it for a drive without
/// snapshots (`None` for any other request): a listing must be one whole
/// EnumerationResults, and a page list is none.
fn listing_of_nothing(req: &stub::Recorded) -> Option<stub::Reply> {
    (req.query("comp").as_deref() == Some("list")).then(|| {
        stub::Reply::xml(
            200,
            "<?xml version=\"1.0\"?><EnumerationResults><Blobs></Blobs><NextMarker/></EnumerationResults>",
        )
    })
}

/// Runs `blobdrive ARGS` against `endpoint` (an account key, a short retry budget),
/// killed if it runs for two minutes or passes [`KILLED_PAST_KIB`] resident;
/// returns whether it succeeded, its stderr, and its peak resident memory in KiB.
fn run_against(endpoint: &str, args: &[&str]) -> (bool, String, i64) {
    run_against_with(endpoint, args, &[])
}

/// [`run_against`] with `env` added to the command's environment.
// The child is reaped by wait4(2), which also gives its peak memory.
#[allow(clippy::zombie_processes)]
fn run_against_with(endpoint: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, i64) {
    use std::io::Read;
    let cs = format!(
        "AccountName=devstoreaccount1;AccountKey={};BlobEndpoint={endpoint}",
        common::azurite::DEV_KEY
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .args(args)
        .env("AZURE_STORAGE_CONNECTION_STRING", cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "5")
        .env_remove("BLOBDRIVE_LOG")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let too_big = common::mount::proc_status_kib_if_alive(pid as u64, "VmRSS")
                    .is_some_and(|kib| kib > KILLED_PAST_KIB as u64);
                if too_big || start.elapsed() > std::time::Duration::from_secs(120) {
                    // SAFETY: kill(2) on our own child, not yet reaped.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return !too_big;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            false
        })
    };
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter for wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both out-pointers are valid.
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let killed = watchdog.join().unwrap();
    let err = reader.join().unwrap();
    assert!(
        !killed,
        "{args:?} was still running after two minutes: {err}"
    );
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, err, usage.ru_maxrss)
}

/// Past this a command run against a hostile endpoint is killed (its peak then
/// reads as at least this): a command gathering without bound would otherwise
/// take the machine's memory before it failed.
const KILLED_PAST_KIB: i64 = 1 << 20;

/// A hostile answer ends the command with one error line holding `needle`
/// within 60 seconds, and the command stays under 200 MiB resident.
fn refuses_within_bounds(stub: &stub::Stub, args: &[&str], needle: &str) {
    let started = std::time::Instant::now();
    let (ok, err, peak_kib) = run_against(&stub.endpoint(), args);
    let took = started.elapsed();
    eprintln!(
        "{args:?} against a hostile endpoint: {} MiB peak resident, {took:?}",
        peak_kib / 1024
    );
    assert!(
        peak_kib < 200 * 1024,
        "{args:?} peaked at {} MiB resident{}",
        peak_kib / 1024,
        if peak_kib >= KILLED_PAST_KIB {
            " (killed there)"
        } else {
            ""
        }
    );
    assert!(!ok, "{args:?} succeeded against a hostile endpoint");
    the_error_line(&err, &[needle]);
    assert!(
        took < std::time::Duration::from_secs(60),
        "{args:?} failed only after {took:?}"
    );
}

#[test]
fn a_hostile_endpoint_cannot_make_commands_hold_memory_or_run_for_ever() {
    // An error body nested 200,000 deep (1.4 MB).
    let depth = 200_000;
    let deep = format!("{}{}", "<Error>".repeat(depth), "</Error>".repeat(depth));
    let s = hostile_drive(move |_, _| stub::Reply::error(400, "Deep", &deep));
    refuses_within_bounds(&s, &["info", "disks/a.vhd"], "400");
    refuses_within_bounds(&s, &["snapshot", "list", "disks/a.vhd"], "400");
    // A Get Page Ranges answer of 4 GiB, and a listing of 4 GiB.
    let unit = b"<PageRange><Start>0</Start><End>511</End></PageRange>".repeat(1000);
    let s = hostile_drive(move |_, _| stub::Reply::Stream {
        status: 200,
        headers: vec![],
        len: 4 << 30,
        unit: unit.clone(),
    });
    refuses_within_bounds(
        &s,
        &["info", "disks/a.vhd"],
        "longer than such an answer can be",
    );
    refuses_within_bounds(
        &s,
        &["snapshot", "list", "disks/a.vhd"],
        "longer than such an answer can be",
    );
    // NextMarker for ever: always the same one, or always a new one.
    for fresh in [false, true] {
        let s = hostile_drive(move |req, i| {
            let marker = if fresh { format!("m{i}") } else { "m".into() };
            if req.query("comp").as_deref() == Some("pagelist") {
                stub::Reply::xml(
                    200,
                    &format!("<?xml version=\"1.0\"?><PageList><PageRange><Start>0</Start><End>511</End></PageRange><NextMarker>{marker}</NextMarker></PageList>"),
                )
            } else {
                stub::Reply::xml(
                    200,
                    &format!("<?xml version=\"1.0\"?><EnumerationResults><Blobs></Blobs><NextMarker>{marker}</NextMarker></EnumerationResults>"),
                )
            }
        });
        let needle = if fresh {
            "page 2 of the list goes back"
        } else {
            "repeats an earlier one"
        };
        refuses_within_bounds(&s, &["info", "disks/a.vhd"], needle);
        // A broken answer is final: the listing is not made again (it was, once
        // per segment size, six times over).
        let asked = page_list_requests(&s);
        assert!(asked <= 2, "{asked} Get Page Ranges requests");
        let needle = if fresh {
            "pages"
        } else {
            "repeats an earlier one"
        };
        refuses_within_bounds(&s, &["snapshot", "list", "disks/a.vhd"], needle);
    }
    // NextMarker for ever, each page further on: stopped at 1000 pages, once.
    let s = hostile_drive(move |_, i| {
        let at = (i as u64 + 1) * 1024;
        stub::Reply::xml(
            200,
            &format!("<?xml version=\"1.0\"?><PageList><PageRange><Start>{at}</Start><End>{}</End></PageRange><NextMarker>m{i}</NextMarker></PageList>", at + 511),
        )
    });
    refuses_within_bounds(&s, &["info", "disks/a.vhd"], "past 1000 pages");
    assert_eq!(page_list_requests(&s), 1000);
}

/// A drive whose every List Blobs page is `items` (one or more `<Blob>`) and
/// a NextMarker never seen before; Get Page Ranges finds nothing written.
fn drive_listing_for_ever(items: String) -> stub::Stub {
    let items = std::sync::Arc::new(items);
    hostile_drive(move |req, i| {
        if req.query("comp").as_deref() == Some("pagelist") {
            return stub::Reply::xml(200, "<?xml version=\"1.0\"?><PageList></PageList>");
        }
        stub::Reply::listing_page(&items, &format!("m{i}"))
    })
}

#[test]
fn a_listing_keeps_a_bounded_number_of_bytes_whatever_its_pages_hold() {
    // Every page one snapshot with a 15 MiB metadata value (Azure allows 8 KiB
    // in all), and a new NextMarker: kept whole, page after page, `snapshot
    // list` reached 15 GiB in 40 s. Refused at the first page now.
    let s = drive_listing_for_ever(stub::listed_snapshot("a.vhd", &"v".repeat(15 << 20)));
    for args in [
        &["snapshot", "list", "disks/a.vhd"][..],
        &["info", "disks/a.vhd"],
    ] {
        refuses_within_bounds(&s, args, "metadata of more than 8 KiB");
    }
    // Every page 1,700 entries within Azure's limits (a name of 1,000
    // characters, 7 KiB of metadata): 15 MiB a page, kept until the listing
    // holds 64 MiB (before, until 200,000 entries: 1.6 GiB).
    let one = stub::listed_snapshot(&"a".repeat(1000), &"v".repeat(7 << 10));
    let s = drive_listing_for_ever(one.repeat(1700));
    for args in [
        &["snapshot", "list", "disks/a.vhd"][..],
        &["info", "disks/a.vhd"],
    ] {
        refuses_within_bounds(&s, args, "the listing passed 64 MiB");
    }
}

fn page_list_requests(s: &stub::Stub) -> usize {
    s.requests()
        .iter()
        .filter(|r| r.query("comp").as_deref() == Some("pagelist"))
        .count()
}

#[test]
fn a_hostile_page_list_per_segment_cannot_grow_memory_with_the_drive() {
    // Every Get Page Ranges segment is answered with 75,000 copies of one range
    // (4 MB); such dense answers shrink the segments to 4 MiB, so a 384 MiB
    // drive is asked in 39 segments and a 64 MiB one in one. Clipped and merged
    // as they arrive, the copies are one range: what `info` holds does not grow
    // with the number of segments (kept whole, the copies of 39 answers are 47
    // MB more; of an 8 GiB drive's 2,000, gigabytes).
    let unit = b"<PageRange><Start>0</Start><End>511</End></PageRange>";
    let mut body = b"<?xml version=\"1.0\"?><PageList>".to_vec();
    for _ in 0..75_000 {
        body.extend_from_slice(unit);
    }
    body.extend_from_slice(b"</PageList>");
    let body = std::sync::Arc::new(body);
    let peak = |size: u64| {
        let body = body.clone();
        let s = hostile_drive_of(size, move |req, _| {
            listing_of_nothing(req).unwrap_or_else(|| stub::Reply::Respond {
                status: 200,
                headers: vec![("Content-Type".into(), "application/xml".into())],
                body: body.to_vec(),
            })
        });
        let (ok, err, peak_kib) = run_against(&s.endpoint(), &["info", "disks/a.vhd", "--json"]);
        assert!(ok, "{err}");
        (page_list_requests(&s), peak_kib)
    };
    let (one, one_kib) = peak(64 * MIB);
    let (many, many_kib) = peak(384 * MIB);
    assert_eq!(one, 1);
    assert!(many >= 39, "only {many} segments were asked");
    assert!(
        many_kib < one_kib + 24 * 1024 && many_kib < 200 * 1024,
        "info peaked at {} MiB resident over {many} answers, {} MiB over one",
        many_kib / 1024,
        one_kib / 1024
    );
}

#[test]
fn a_service_cannot_write_escape_sequences_to_the_terminal() {
    // An error whose code and message would clear root's screen and set the
    // terminal's title, the message followed by 10,000 characters.
    let message = format!("\x1b[2J\x1b]0;owned\x07\u{9b}1m{}", "z".repeat(10_000));
    let body = format!(
        "<?xml version=\"1.0\"?><Error><Code>Busy</Code><Message>{message}</Message></Error>"
    );
    let s = hostile_drive(move |_, _| stub::Reply::error(400, "Busy", &body));
    let (ok, err, _) = run_against(&s.endpoint(), &["info", "disks/a.vhd"]);
    assert!(!ok);
    let line = the_error_line(&err, &["400"]);
    assert!(!line.chars().any(char::is_control), "{line:?}");
    assert!(line.contains("\\u{1b}]0;owned\\u{7}"), "{line}");
    assert!(line.len() < 2000, "{} characters: {line}", line.len());
}

#[test]
fn a_proxy_from_the_environment_never_carries_plain_http() {
    // A root shell's environment names a proxy: with a loopback endpoint over
    // plain http, following it would send the Shared Key signature in the clear
    // to that host. The proxy here is a stub that records what reaches it.
    let proxy = stub::Stub::start(|_, _| stub::Reply::status(502));
    let endpoint = hostile_drive(|req, _| {
        listing_of_nothing(req).unwrap_or_else(|| {
            stub::Reply::xml(200, "<?xml version=\"1.0\"?><PageList></PageList>")
        })
    });
    let via = format!("http://127.0.0.1:{}", proxy.port);
    let env: Vec<(&str, &str)> = ["http_proxy", "HTTP_PROXY", "all_proxy", "https_proxy"]
        .into_iter()
        .map(|k| (k, via.as_str()))
        .collect();
    let (ok, err, _) = run_against_with(&endpoint.endpoint(), &["info", "disks/a.vhd"], &env);
    assert!(ok, "{err}");
    assert!(
        proxy.requests().is_empty(),
        "the proxy was sent {:?}",
        proxy.requests()
    );
    assert!(!endpoint.requests().is_empty());
    assert!(
        err.contains("http_proxy, HTTP_PROXY, all_proxy not used: plain http goes only to this machine's loopback"),
        "{err}"
    );
}

/// `blobdrive manpages DIR` writes a page for every command and helper, and each
/// renders at 80 columns without a warning from man (groff's warnings included).
#[test]
fn manual_pages_render_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let listed = BD.ok(&["manpages", dir.path().to_str().unwrap()]);
    let pages: Vec<&str> = listed.lines().collect();
    for want in ["blobdrive.8", "blobdrive-mount.8", "mount.blobdrive.8"] {
        assert!(
            pages.iter().any(|p| p.ends_with(&format!("/{want}"))),
            "{want} not written: {listed}"
        );
    }
    for page in pages {
        let out = Command::new("man")
            .args(["--warnings", "-l", page])
            .env("MANWIDTH", "80")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("run man (install man-db: scripts/install-deps.sh)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.trim().is_empty(),
            "{page}: {err}"
        );
        assert!(!out.stdout.is_empty(), "{page} rendered nothing");
    }
}

/// `blobdrive completions bash` completes commands and their options in bash;
/// zsh and fish get theirs too (their shells are not needed to make them).
#[test]
fn completions_complete_commands_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("blobdrive.bash");
    std::fs::write(&script, BD.ok(&["completions", "bash"])).unwrap();
    let words = common::util::bash_completions(&script, &["blobdrive", "m"]);
    assert!(
        words.iter().any(|w| w == "mount") && words.iter().any(|w| w == "manpages"),
        "{words:?}"
    );
    assert!(!words.iter().any(|w| w.contains("daemon")), "{words:?}");
    let words = common::util::bash_completions(&script, &["blobdrive", "mount", "--disk"]);
    assert!(words.iter().any(|w| w == "--disk-cache-size"), "{words:?}");
    assert!(BD
        .ok(&["completions", "zsh"])
        .starts_with("#compdef blobdrive"));
    assert!(BD
        .ok(&["completions", "fish"])
        .contains("complete -c blobdrive"));
    let out = BD.cmd(&["completions", "tcsh"]).output();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}
