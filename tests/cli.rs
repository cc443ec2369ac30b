//! The `blobdrive` command as users run it, against Azurite: the lifecycle commands
//! and every bad input, each leaving the blob unchanged.

mod common;
mod raw;

use common::util::{json, rt, stdout_of_success};
use std::process::{Command, Output};

use blobdrive::azure::{Account, BlobClient, BlobService};
use blobdrive::vhd::{DiskType, Footer};
use bytes::Bytes;
use common::azurite::{unique_container, Azurite};
use serde_json::Value;

const MIB: u64 = 1024 * 1024;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_blobdrive"));
    c.env(
        "AZURE_STORAGE_CONNECTION_STRING",
        Azurite::shared().connection_string(),
    )
    .env_remove("BLOBDRIVE_LOG")
    .env("BLOBDRIVE_RETRY_BUDGET_SECS", "5");
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run blobdrive")
}

/// Runs a command that must succeed; returns stdout.
fn ok(args: &[&str]) -> String {
    stdout_of_success(&args, run(args))
}

/// Runs a command that must fail with one clear line on stderr containing `needle`.
fn fails(args: &[&str], needle: &str) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "{args:?} should fail, printed {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(err.starts_with("blobdrive: error: "), "{err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in: {err}"
    );
    err
}

fn service() -> BlobService {
    BlobService::new(
        Account::from_connection_string(&Azurite::shared().connection_string()).unwrap(),
    )
}

fn container(tag: &str) -> String {
    let name = unique_container(tag);
    rt().block_on(service().container(&name).create()).unwrap();
    name
}

/// ETag and full content: what "unchanged" means.
fn fingerprint(blob: &BlobClient) -> (Option<String>, Vec<u8>) {
    rt().block_on(async {
        let p = blob.properties().await.unwrap();
        let data = blob.read(0, p.content_length).await.unwrap();
        (p.etag, data.to_vec())
    })
}

#[test]
fn create_info_lease_delete_lifecycle() {
    let c = container("life");
    let spec = format!("{c}/data.vhd");
    let out = ok(&["create", &spec, "--size", "64MiB"]);
    assert!(out.contains("64 MiB"), "{out}");
    let info = json(&ok(&["info", &spec, "--json"]));
    assert_eq!(info["size_bytes"], 64 * MIB);
    assert_eq!(info["blob_bytes"], 64 * MIB + 512);
    assert_eq!(info["allocated_bytes"], 512, "only the footer is written");
    assert_eq!(info["disk_type"], "fixed");
    assert_eq!(info["lease_state"], "available");
    assert_eq!(info["lease_duration"], Value::Null);
    assert_eq!(info["snapshots"], 0);
    assert!(info["etag"].is_string());
    let text = ok(&["info", &spec]);
    assert!(text.contains("64 MiB") && text.contains("fixed"), "{text}");

    // The footer is a real fixed VHD footer of the right size.
    let blob = service().blob(&c, "data.vhd");
    let tail = rt().block_on(blob.read(64 * MIB, 512)).unwrap();
    let f = Footer::parse_fixed_for_blob(&tail, 64 * MIB + 512).unwrap();
    assert_eq!(f.current_size, 64 * MIB);

    // Lease status / break.
    let st = json(&ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(
        st,
        serde_json::json!({"state": "available", "duration": null})
    );
    rt().block_on(blob.acquire_lease("55555555-5555-4555-8555-555555555555", None))
        .unwrap();
    let st = json(&ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(
        st,
        serde_json::json!({"state": "leased", "duration": "infinite"})
    );
    let info = json(&ok(&["info", &spec, "--json"]));
    assert_eq!(info["lease_state"], "leased");
    assert_eq!(info["lease_duration"], "infinite");
    // A leased drive cannot be deleted.
    fails(&["delete", &spec, "--yes"], "in use");
    let out = ok(&["lease", "break", &spec]);
    assert!(out.contains("lease broken"), "{out}");
    let st = json(&ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(st["state"], "broken");
    let out = ok(&["lease", "break", &spec]);
    assert!(out.contains("nothing changed"), "{out}");

    // Snapshots are counted, and block a plain delete.
    let snap = rt().block_on(blob.create_snapshot()).unwrap();
    let info = json(&ok(&["info", &spec, "--json"]));
    assert_eq!(info["snapshots"], 1);
    let info = json(&ok(&["info", &format!("{spec}@{snap}"), "--json"]));
    assert_eq!(info["snapshot"], snap.as_str());
    assert_eq!(info["size_bytes"], 64 * MIB);

    fails(&["delete", &spec], "--yes");
    fails(&["delete", &spec, "--yes"], "--snapshots");
    let out = ok(&["delete", &spec, "--snapshots", "--yes"]);
    assert!(out.contains("deleted"), "{out}");
    fails(&["info", &spec], "does not exist");
}

#[test]
fn create_refuses_bad_sizes_and_existing_blobs() {
    let c = container("sizes");
    let spec = format!("{c}/x.vhd");
    fails(
        &["create", &spec, "--size", "1000000"],
        "whole number of MiB",
    );
    fails(&["create", &spec, "--size", "9TiB"], "maximum");
    fails(&["create", &spec, "--size", "0"], "more than 0");
    fails(&["create", &spec, "--size", "lots"], "invalid size");
    let none = rt()
        .block_on(service().container(&c).list_blobs("", false))
        .unwrap();
    assert!(none.is_empty(), "nothing created: {none:?}");
    // The largest allowed size works (sparse: nothing but the footer is written).
    ok(&[
        "create",
        &format!("{c}/max.vhd"),
        "--size",
        &format!("{}", 8 * 1024 * 1024 * MIB - MIB),
    ]);
    ok(&["create", &spec, "--size", "1M"]);
    let blob = service().blob(&c, "x.vhd");
    let before = fingerprint(&blob);
    fails(&["create", &spec, "--size", "2M"], "already exists");
    assert_eq!(fingerprint(&blob), before);
}

#[test]
fn create_container_only_when_asked() {
    let c = unique_container("newcont");
    let spec = format!("{c}/d.vhd");
    fails(&["create", &spec, "--size", "1M"], "--create-container");
    ok(&["create", &spec, "--size", "1M", "--create-container"]);
    let info = json(&ok(&["info", &spec, "--json"]));
    assert_eq!(info["size_bytes"], MIB);
}

#[test]
fn bad_inputs_leave_the_blob_unchanged() {
    let c = container("bad");
    let svc = service();
    // Missing container, missing blob.
    fails(
        &["info", &format!("{}/d.vhd", unique_container("gone"))],
        "container",
    );
    fails(&["info", &format!("{c}/missing.vhd")], "does not exist");
    fails(
        &["lease", "status", &format!("{c}/missing.vhd")],
        "does not exist",
    );
    fails(&["info", "no-slash"], "not a blob");
    fails(
        &["info", &format!("{c}/d.vhd@yesterday")],
        "invalid snapshot",
    );

    // Wrong key.
    ok(&["create", &format!("{c}/good.vhd"), "--size", "1M"]);
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
        let out = bin()
            .env("AZURE_STORAGE_CONNECTION_STRING", &wrong)
            .args(&args)
            .output()
            .unwrap();
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
    fails(
        &["info", &format!("{c}/block.vhd")],
        "block blob, not a page blob",
    );
    fails(
        &["delete", &format!("{c}/block.vhd"), "--yes"],
        "block blob",
    );
    fails(&["lease", "break", &format!("{c}/block.vhd")], "block blob");
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
        fails(&["info", &format!("{c}/{name}")], needle);
        assert_eq!(fingerprint(&blob), before, "{name} unchanged");
    }

    // A blob too small to hold a VHD.
    let tiny = svc.blob(&c, "tiny.vhd");
    rt().block_on(tiny.create_page_blob(1024)).unwrap();
    fails(&["info", &format!("{c}/tiny.vhd")], "too small");

    // Lease held by someone else: delete and a second break-free op are refused.
    let held = svc.blob(&c, "good.vhd");
    rt().block_on(held.acquire_lease("66666666-6666-4666-8666-666666666666", None))
        .unwrap();
    let before = fingerprint(&held);
    fails(&["delete", &format!("{c}/good.vhd"), "--yes"], "in use");
    assert_eq!(fingerprint(&held), before);
}

#[test]
fn connection_string_errors_are_one_line_and_secret_free() {
    let out = bin()
        .env(
            "AZURE_STORAGE_CONNECTION_STRING",
            "AccountName=a;AccountKey=not-base64!!secret",
        )
        .args(["info", "disks/a.vhd"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("AccountKey is not valid base64"), "{err}");
    assert!(!err.contains("secret"), "{err}");
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
    let out = bin()
        .env("AZURE_STORAGE_CONNECTION_STRING", cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "3")
        .args(["info", "disks/a.vhd"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no answer from the storage service"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

#[test]
fn help_teaches_and_lists_only_built_commands() {
    let out = ok(&["--help"]);
    for cmd in ["create", "info", "lease", "delete"] {
        assert!(out.contains(cmd), "{out}");
    }
    assert!(out.contains("AZURE_STORAGE_CONNECTION_STRING"), "{out}");
    assert!(out.contains("container/name.vhd"), "{out}");
    let out = ok(&["lease", "break", "--help"]);
    assert!(out.contains("dead host"), "{out}");
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
    let out = bin()
        .env("AZURE_STORAGE_CONNECTION_STRING", &cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "1")
        .args(["info", "disks/a.vhd"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("blobdrive: error: "), "{err}");
    assert!(!err.contains("giving up"), "{err}");
    // Logs asked for with -vv go to a pipe here: no colour codes.
    let out = bin()
        .env("AZURE_STORAGE_CONNECTION_STRING", &cs)
        .env("BLOBDRIVE_RETRY_BUDGET_SECS", "1")
        .args(["-vv", "info", "disks/a.vhd"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("giving up"), "{err}");
    assert!(!err.contains('\x1b'), "{err:?}");
}

#[test]
fn unmount_discard_dirty_needs_yes() {
    let out = run(&["unmount", "/nonexistent-mp", "--discard-dirty"]);
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
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
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
