//! `blobdrive resize` against Azurite: a drive grown offline keeps its data, reads
//! zeros after it and carries a footer qemu-img reads for the new size; a resize
//! stopped after any of its steps (what a crash leaves) is reported by `info`,
//! refused by `mount`, and completed by running it again; shrinking, a drive
//! leased elsewhere and a snapshot are refused with one line and nothing changed.
//! (Mounted drives: `resize_online.rs`.)

mod common;
mod faultproxy;

use std::process::Command;

use blobdrive::resize::{self, STEPS};
use bytes::Bytes;
use common::azurite::{unique_container, Azurite};
use common::bd::Harness;
use common::mount::{require_root, Mp};
use common::util::{json, rt};
use faultproxy::{Config, Proxy};

const MIB: u64 = 1 << 20;

const BD: Harness = Harness::new("resize-run");

/// A 4 MiB drive with a pattern in its first and last MiB.
fn drive_with_data(tag: &str) -> (String, Vec<u8>) {
    let spec = BD.new_drive(tag, "4MiB");
    let data: Vec<u8> = (0..MIB).map(|i| (i * 13 % 251) as u8 + 1).collect();
    let blob = BD.blob(&spec);
    rt().block_on(async {
        blob.put_pages(0, Bytes::from(data.clone()), None)
            .await
            .unwrap();
        blob.put_pages(3 * MIB, Bytes::from(data.clone()), None)
            .await
            .unwrap();
    });
    (spec, data)
}

fn etag(spec: &str) -> String {
    json(&BD.ok(&["info", spec, "--json"]))["etag"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The grown drive holds its data, zeros after it (the old footer's page too),
/// and a footer for `size` that qemu-img reads; `info` agrees; the lease is free.
fn check_grown(spec: &str, data: &[u8], size: u64) {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("disk.raw");
    let vhd = dir.path().join("disk.vhd");
    let (raw_s, vhd_s) = (raw.to_str().unwrap(), vhd.to_str().unwrap());
    BD.ok(&["download", spec, raw_s, "--format", "raw"]);
    BD.ok(&["download", spec, vhd_s, "--format", "vhd"]);
    let bytes = std::fs::read(&raw).unwrap();
    assert_eq!(bytes.len() as u64, size);
    assert_eq!(&bytes[..MIB as usize], data);
    assert_eq!(&bytes[3 * MIB as usize..4 * MIB as usize], data);
    assert!(
        bytes[4 * MIB as usize..].iter().all(|b| *b == 0),
        "the grown part (and the old footer's page) must read as zeros"
    );
    let out = Command::new("qemu-img")
        .args(["info", "-f", "vpc", "--output", "json", vhd_s])
        .output()
        .expect("qemu-img (qemu-utils) is needed");
    assert!(out.status.success(), "{out:?}");
    let info = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(info["virtual-size"], size, "{info}");
    let shown = json(&BD.ok(&["info", spec, "--json"]));
    assert_eq!(shown["size_bytes"], size, "{shown}");
    assert_eq!(shown["lease_state"], "available", "{shown}");
}

#[test]
fn an_offline_grow_keeps_the_data_and_reads_zeros_after_it() {
    let (spec, data) = drive_with_data("grow");
    let snap = json(&BD.ok(&["snapshot", "create", &spec, "--json"]));
    let snap = snap["snapshot"].as_str().unwrap().to_string();
    let out = BD.ok(&["resize", &spec, "--size", "12MiB"]);
    assert!(out.contains("from 4 MiB to 12 MiB"), "{out}");
    check_grown(&spec, &data, 12 * MIB);
    // The snapshot keeps its own size.
    let at = format!("{spec}@{snap}");
    let shown = json(&BD.ok(&["info", &at, "--json"]));
    assert_eq!(shown["size_bytes"], 4 * MIB, "{shown}");
    // Again to the same size: nothing to do, nothing written.
    let before = etag(&spec);
    let out = BD.ok(&["resize", &spec, "--size", "12MiB"]);
    assert!(out.contains("already"), "{out}");
    assert_eq!(etag(&spec), before);
}

#[test]
fn a_resize_stopped_after_any_step_is_reported_refused_and_completed_by_running_it_again() {
    require_root();
    for stop_after in 1..STEPS.len() {
        let (spec, data) = drive_with_data(&format!("crash{stop_after}"));
        let blob = BD.blob(&spec);
        rt().block_on(resize::grow_steps(&blob, 8 * MIB, stop_after))
            .unwrap();
        let err = BD.cmd(&["info", &spec]).fails_in_one_line();
        assert!(
            err.contains("resize incomplete")
                && err.contains(&format!("blobdrive resize {spec} --size {}", 8 * MIB)),
            "after {:?}: {err}",
            STEPS[stop_after - 1]
        );
        if stop_after == 2 {
            // The grown blob has no footer at its end yet: mount refuses, saying why.
            let mp = BD.mp();
            let err = BD
                .cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
                .fails_in_one_line();
            assert!(err.contains("resize incomplete"), "{err}");
            // Another size is refused until this one is completed.
            let err = BD
                .cmd(&["resize", &spec, "--size", "16MiB"])
                .fails_in_one_line();
            assert!(err.contains("resize incomplete"), "{err}");
        }
        BD.ok(&["resize", &spec, "--size", "8MiB"]);
        check_grown(&spec, &data, 8 * MIB);
    }
}

#[test]
fn shrinking_a_drive_leased_elsewhere_or_a_snapshot_is_refused_and_nothing_changes() {
    require_root();
    let (spec, _) = drive_with_data("refused");
    let before = etag(&spec);
    let err = BD
        .cmd(&["resize", &spec, "--size", "2MiB"])
        .fails_in_one_line();
    assert!(
        err.contains("shrinking") && err.contains("cut off data"),
        "{err}"
    );
    let err = BD
        .cmd(&["resize", &spec, "--size", "5000KiB"])
        .fails_in_one_line();
    assert!(err.contains("whole number of MiB"), "{err}");
    assert_eq!(etag(&spec), before);
    // Leased by another client (a mount elsewhere).
    let blob = BD.blob(&spec);
    let lease = rt()
        .block_on(blob.acquire_lease("11111111-2222-3333-4444-555555555555", None))
        .unwrap();
    let err = BD
        .cmd(&["resize", &spec, "--size", "8MiB"])
        .fails_in_one_line();
    assert!(err.contains("in use"), "{err}");
    rt().block_on(blob.release_lease(&lease)).unwrap();
    assert_eq!(etag(&spec), before);
    // A snapshot.
    let snap = json(&BD.ok(&["snapshot", "create", &spec, "--json"]));
    let at = format!("{spec}@{}", snap["snapshot"].as_str().unwrap());
    let err = BD
        .cmd(&["resize", &at, "--size", "8MiB"])
        .fails_in_one_line();
    assert!(err.contains("snapshots keep their size"), "{err}");
}

/// The clear of the old footer's page is the one step whose late landing could
/// harm: carried out after the grown drive is written there again, it would zero
/// that data. Held by a proxy long after the client (2 s request timeout) gave up
/// on it, then forwarded anyway, it is refused by the service (412: its lease is
/// gone, and the write fence raised the sequence number it carries), and the
/// data written there since stays.
#[test]
fn a_clear_of_the_old_footer_that_lands_late_is_refused() {
    let (spec, _) = drive_with_data("lateclear");
    let proxy = Proxy::start(Config::holding(
        Azurite::shared().port,
        "x-ms-page-write: clear",
        1,
        std::time::Duration::from_secs(8),
    ));
    let cs = proxy.connection_string();
    let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
    BD.cmd(&["resize", &spec, "--size", "8MiB"])
        .cs(&cs)
        .envs(&env)
        .ok();
    // The drive is in use again: the old footer's page, now disk, gets data.
    let blob = BD.blob(&spec);
    let data = Bytes::from(vec![0x5a; 512]);
    rt().block_on(blob.put_pages(4 * MIB, data.clone(), None))
        .unwrap();
    let late = proxy.wait_for_late_commit(std::time::Duration::from_secs(30));
    assert_eq!(late[0].status, Some(412), "{late:?}");
    let got = rt().block_on(blob.read(4 * MIB, 512)).unwrap();
    assert_eq!(
        got, data,
        "a late clear zeroed data written after the resize"
    );
}

/// A resize's Acquire Lease held past the client's timeout and carried out after
/// the resize ended takes nothing: the next mount finds the drive free, not
/// leased for a minute by a resize that is over.
#[test]
fn an_acquire_that_lands_after_the_resize_ended_takes_nothing() {
    let (spec, data) = drive_with_data("lateacq");
    let proxy = Proxy::start(Config::holding(
        Azurite::shared().port,
        "x-ms-lease-action: acquire",
        1,
        std::time::Duration::from_secs(8),
    ));
    let cs = proxy.connection_string();
    let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
    BD.cmd(&["resize", &spec, "--size", "8MiB"])
        .cs(&cs)
        .envs(&env)
        .ok();
    proxy.held_lands_late_and_is_refused("acquire");
    check_grown(&spec, &data, 8 * MIB);
}

/// A footer write is held in the network past the client's timeout, `create`'s
/// and then a grow's; the retry lands, the drive is grown further (the footer's
/// place becomes disk), mounted and written there, and only then does the held
/// write reach the service. It must be refused, not put a footer over the data.
/// `create` takes no lease, so only the write fence refuses its footer; an
/// offline grow's footer carries the grow's lease, gone by then, and is refused
/// for that too. (A mounted drive's lease lives on: `resize_online.rs`.)
#[test]
fn a_footer_write_that_lands_after_a_grow_is_refused() {
    require_root();
    // (the drive's size when the footer is held, the command that writes it)
    for (held_at, tag) in [(4, "latefoot"), (8, "lategrow")] {
        let spec = format!("{}/disk.vhd", unique_container(tag));
        let proxy = Proxy::start(Config::holding(
            Azurite::shared().port,
            "x-ms-page-write: update",
            1,
            std::time::Duration::from_secs(15),
        ));
        let cs = proxy.connection_string();
        let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
        if held_at == 4 {
            // The container, made by creating a drive in it and deleting the drive.
            BD.ok(&["create", &spec, "--size", "4MiB", "--create-container"]);
            BD.ok(&["delete", &spec, "--yes"]);
            BD.cmd(&["create", &spec, "--size", "4MiB"])
                .cs(&cs)
                .envs(&env)
                .ok();
        } else {
            BD.ok(&["create", &spec, "--size", "4MiB", "--create-container"]);
            BD.cmd(&["resize", &spec, "--size", "8MiB"])
                .cs(&cs)
                .envs(&env)
                .ok();
        }
        BD.ok(&["resize", &spec, "--size", "16MiB"]);
        let mp = BD.mp();
        BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
        let ours = vec![0x6b; 512];
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(mp.disk())
                .unwrap();
            f.write_all_at(&ours, held_at * MIB).unwrap();
            f.sync_all().unwrap();
        }
        BD.ok(&["unmount", mp.s()]);
        proxy.held_lands_late_and_is_refused(&format!("{tag}: footer"));
        let got = rt()
            .block_on(BD.blob(&spec).read(held_at * MIB, 512))
            .unwrap();
        assert_eq!(
            got, ours,
            "{tag}: a late footer write landed on the grown disk's data"
        );
    }
}

/// The size in MiB `df` shows for the filesystem mounted at `mp`.
fn df_mib(mp: &Mp) -> u64 {
    common::util::sh_ok(&format!("df --output=size -B1M '{}' | tail -1", mp.s()))
        .trim()
        .parse()
        .unwrap()
}

/// A drive grown while not mounted keeps its filesystem's size: `resize` says so
/// and what follows; a read-only mount says how to grow it; the next writable
/// mount grows it to fill the disk and says so (once); and restoring a snapshot
/// from before the grow says the drive is back to its old size.
#[test]
fn a_filesystem_grown_offline_is_filled_by_the_next_mount_and_a_restore_names_the_sizes() {
    require_root();
    for (fs, from, to) in [("ext4", 64u64, 128u64), ("xfs", 320, 400)] {
        let size = |mib: u64| format!("{mib}MiB");
        let spec = BD.new_drive(&format!("offline-{fs}"), &size(from));
        let mp = BD.mp();
        BD.ok(&["mount", &spec, mp.s(), "--mkfs", fs]);
        std::fs::write(mp.path().join("kept"), b"kept\n").unwrap();
        BD.ok(&["unmount", mp.s()]);
        let snap = json(&BD.ok(&["snapshot", "create", &spec, "--json"]));
        let snap = snap["snapshot"].as_str().unwrap().to_string();
        let out = BD.ok(&["resize", &spec, "--size", &size(to)]);
        assert!(
            out.contains(&format!("the {fs} filesystem on it is still {from} MiB"))
                && out.contains("the next writable `blobdrive mount`"),
            "{out}"
        );
        // Read-only: nothing is grown, and it says how.
        let said = |args: &[&str]| {
            let out = BD.cmd(args).output();
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(out.status.success(), "{args:?}: {err}");
            err
        };
        let err = said(&["mount", &spec, mp.s(), "--read-only"]);
        assert!(
            err.contains(&format!(
                "the {fs} filesystem is {from} MiB on a {to} MiB disk"
            )) && err.contains("a writable mount grows it"),
            "{err}"
        );
        let small = df_mib(&mp);
        assert!(small <= from, "{fs}: {small}");
        BD.ok(&["unmount", mp.s()]);
        // Writable: grown to fill the disk, the data kept.
        let err = said(&["mount", &spec, mp.s()]);
        assert!(
            err.contains(&format!(
                "the {fs} filesystem was {from} MiB on a {to} MiB disk"
            )) && err.contains("grew it to fill the disk"),
            "{err}"
        );
        // By what the disk grew (df leaves out ext4's metadata, xfs's log).
        let grown = df_mib(&mp);
        assert!(
            grown >= small + (to - from) * 9 / 10,
            "{fs}: {small} -> {grown}"
        );
        assert_eq!(std::fs::read(mp.path().join("kept")).unwrap(), b"kept\n");
        BD.ok(&["unmount", mp.s()]);
        // Once only.
        let err = said(&["mount", &spec, mp.s()]);
        assert!(!err.contains("filesystem was"), "{err}");
        BD.ok(&["unmount", mp.s()]);
        // Back to the snapshot from before the grow: the sizes are said.
        let out = BD.ok(&["restore", &spec, "--from", &snap, "--yes"]);
        assert!(
            out.contains(&format!("is {from} MiB again"))
                && out.contains(&format!("it was {to} MiB")),
            "{out}"
        );
    }
}
