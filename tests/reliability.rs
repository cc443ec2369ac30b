//! Reliability under faults, crashes, lease loss, races and bad input; and secrets
//! kept out of every output. Runs as root against Azurite, partly through a
//! fault-injecting proxy.

mod common;
mod faultproxy;

use common::util::{json, rt, sh, sh_ok, wait_for, wait_for_exit};
use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use common::azurite::{fingerprint, unique_container, Azurite, DEV_KEY};
use common::bd::{isolated_cs, Harness};
use common::mount::{require_root, Mp};
use common::namespace::in_mount_namespace;
use faultproxy::{Config, Fault, Proxy};

/// This binary's own emulator (tests here stop and slow it) and run directory.
const BD: Harness = Harness::new("reliability-run").account(isolated_cs);

fn write_files(root: &str, n: usize) -> String {
    sh_ok(&format!(
        "set -e; cd '{root}'; mkdir -p w
         for i in $(seq 1 {n}); do head -c $(( (i * 104729) % 4194304 + 1 )) /dev/urandom > w/f$i; done
         head -c 48M /dev/urandom > w/big
         sync
         find w -type f | sort | xargs sha256sum"
    ))
}

#[test]
fn five_percent_faults_lose_and_corrupt_nothing() {
    require_root();
    let spec = BD.new_drive("faults", "512MiB");
    let proxy = Proxy::start(Config {
        upstream_port: Azurite::isolated().port,
        rate: 0.05,
        seed: 20261122,
        stall: Duration::from_secs(3),
        max_latency: Duration::from_millis(3),
        hold: None,
        kinds: faultproxy::ALL,
    });
    let cs = proxy.connection_string();
    let env = [("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2")];
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mkfs", "ext4"])
        .cs(&cs)
        .envs(&env)
        .ok();
    let sums = write_files(mp.s(), 40);
    let stats = json(&BD.cmd(&["stats", mp.s(), "--json"]).cs(&cs).ok());
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
    BD.cmd(&["mount", &spec, mp.s()]).cs(&cs).envs(&env).ok();
    let again = sh_ok(&format!(
        "cd '{}' && find w -type f | sort | xargs sha256sum",
        mp.s()
    ));
    assert_eq!(sums, again, "data changed under faults");
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
    let injected = proxy.injected();
    let kinds: HashSet<String> = injected.iter().map(|f| format!("{f:?}")).collect();
    assert!(
        injected.len() >= 5,
        "too few faults to mean anything: {injected:?}"
    );
    let total = proxy.requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (injected.len() as u64) * 100 < total * 12,
        "{} faults in {total} requests is far above the 5% asked for",
        injected.len()
    );
    assert!(kinds.len() >= 3, "fault kinds: {kinds:?}");
    assert!(
        stats["retries"].as_u64().unwrap() > 0,
        "stats show no retries: {stats}"
    );
    // The filesystem is consistent too.
    let dev = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    sh_ok(&format!("e2fsck -fn {dev}"));
    BD.ok(&["unmount", mp.s()]);
    assert!(kinds.contains(&format!("{:?}", Fault::ResetAfter)) || injected.len() < 12);
}

#[test]
fn a_lost_backend_fails_io_in_bounded_time_and_recovers() {
    require_root();
    let spec = BD.new_drive("gone", "64MiB");
    let proxy = Proxy::start(Config {
        upstream_port: Azurite::isolated().port,
        rate: 0.0,
        seed: 1,
        stall: Duration::from_secs(1),
        max_latency: Duration::from_millis(0),
        hold: None,
        kinds: faultproxy::ALL,
    });
    let cs = proxy.connection_string();
    // I/O waits through an outage up to the I/O timeout (short here), then fails.
    let env = [
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "2"),
        ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "1"),
        ("BLOBDRIVE_IO_TIMEOUT_SECS", "20"),
    ];
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .envs(&env)
        .ok();
    let disk = format!("{}/disk", mp.s());
    sh_ok(&format!(
        "printf 'safe-1' | dd of='{disk}' conv=notrunc,fsync status=none"
    ));
    proxy.dead.store(true, std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    let out = sh(&format!(
        "printf 'risky!' | dd of='{disk}' bs=512 seek=8 conv=notrunc,fsync status=none"
    ));
    let took = started.elapsed();
    assert!(
        !out.status.success(),
        "fsync must fail while the backend is gone"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("Input/output error"));
    assert!(took < Duration::from_secs(120), "took {took:?}");
    // The outage is older than the I/O timeout now: each further fsync fails
    // after one try (a few seconds), not after a whole timeout of its own.
    let mut waits = Vec::new();
    for i in 0..3u64 {
        let out = sh(&format!(
            "python3 -c \"import os, time\n\
             fd = os.open('{disk}', os.O_WRONLY)\n\
             os.pwrite(fd, b'later{i}', {})\n\
             t = time.monotonic()\n\
             try:\n    os.fsync(fd); print('synced')\n\
             except OSError as e:\n    print(e.strerror)\n\
             print(time.monotonic() - t)\"",
            (16 + 8 * i) * 512
        ));
        waits.push(String::from_utf8_lossy(&out.stdout).to_string());
    }
    eprintln!("fsyncs past the I/O timeout (error, seconds): {waits:?}");
    let slow = waits.iter().any(|w| {
        !w.starts_with("Input/output error")
            || w.lines()
                .nth(1)
                .and_then(|s| s.parse::<f64>().ok())
                .is_none_or(|t| t >= 14.0)
    });
    if slow {
        proxy.dead.store(false, std::sync::atomic::Ordering::SeqCst);
        panic!("an fsync past the I/O timeout did not fail after one try: {waits:?}");
    }
    // The daemon is still up and says what happened.
    let st = json(&BD.cmd(&["stats", mp.s(), "--json"]).cs(&cs).ok());
    assert!(
        st["dirty_bytes"].as_u64().unwrap() > 0,
        "unwritten data is kept: {st}"
    );
    assert!(st["failed_requests"].as_u64().unwrap() > 0);
    // Back again: the kept data is written by the next fsync.
    proxy.dead.store(false, std::sync::atomic::Ordering::SeqCst);
    sh_ok(&format!(
        "python3 -c \"import os; fd = os.open('{disk}', os.O_WRONLY); os.fsync(fd)\""
    ));
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
    let b = BD.blob(&spec);
    assert_eq!(&rt().block_on(b.read(0, 6)).unwrap()[..], b"safe-1");
    assert_eq!(&rt().block_on(b.read(4096, 6)).unwrap()[..], b"risky!");
    for i in 0..3u64 {
        assert_eq!(
            rt().block_on(b.read((16 + 8 * i) * 512, 6)).unwrap(),
            format!("later{i}").as_bytes(),
            "a write whose fsync failed was not kept"
        );
    }
}

#[test]
fn sigkill_mid_workload_recovers_every_fsynced_file() {
    sigkill_mid_workload(false);
}

/// The same on an encrypted drive (LUKS2 under the memory cache).
#[test]
fn sigkill_mid_workload_on_an_encrypted_drive_recovers_every_fsynced_file() {
    sigkill_mid_workload(true);
}

/// SIGKILL of the daemon while files are written and fsynced one after
/// another: the journal recovers, every file recorded after its fsync reads
/// back, and the filesystem checks clean.
fn sigkill_mid_workload(encrypted: bool) {
    require_root();
    let keys = tempfile::tempdir().unwrap();
    let key = common::luks::key_file(keys.path());
    let key_args = ["--key-file", key.to_str().unwrap()];
    let with_key: &[&str] = if encrypted { &key_args } else { &[] };
    let spec = if encrypted {
        common::luks::new_encrypted_drive(&BD, "crashcrypt", "256MiB", &key)
    } else {
        BD.new_drive("crash", "256MiB")
    };
    let mp = Mp::new(&BD.run_dir(), &BD.cs());
    BD.ok(&[&["mount", &spec, mp.s(), "--mkfs", "ext4"], with_key].concat());
    let journal = tempfile::NamedTempFile::new().unwrap();
    let jp = journal.path().to_str().unwrap().to_string();
    // Each file is recorded (with its checksum) only after fsync returned.
    let mut writer = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "cd '{}' && i=0; while true; do head -c $(( (i * 7919) % 300000 + 1 )) /dev/urandom > f$i || exit 0; \
             python3 -c \"import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)\" f$i || exit 0; \
             sha256sum f$i >> '{jp}'; i=$((i + 1)); done",
            mp.s()
        ))
        .spawn()
        .unwrap();
    // Kill once the workload has fsynced a few files, however slow the
    // machine is (a fixed wait left two files under load), and at least
    // 2.5 s in, so the kill lands amid a steady stream of writes.
    std::thread::sleep(Duration::from_millis(2500));
    wait_for("four files fsynced", Duration::from_secs(120), || {
        std::fs::read_to_string(&jp).is_ok_and(|j| j.lines().count() > 3)
    });
    let pid = mp.pid();
    sh_ok(&format!("kill -KILL {pid}"));
    let _ = writer.wait();
    std::thread::sleep(Duration::from_millis(200));
    // A new mount here names the mount that died holding the lease and the
    // way out, unmount there; unmount cleans up.
    let other = Mp::new(&BD.run_dir(), &BD.cs());
    BD.cmd(&[&["mount", &spec, other.s()], with_key].concat())
        .fails_with_error(&[
            "that mount ended without an unmount (its daemon is gone)",
            &format!("blobdrive unmount {}", mp.s()),
        ]);
    // It fails (the lease is still held) after cleaning up, naming the way out.
    let out = BD.cmd(&["unmount", mp.s()]).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("lease break"), "{err}");
    assert!(!std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(mp.s()));
    BD.ok(&["lease", "break", &spec, "--yes"]);
    // Journal recovery on mount; every fsync'd file intact.
    BD.ok(&[&["mount", &spec, mp.s()], with_key].concat());
    let recorded = std::fs::read_to_string(&jp).unwrap();
    assert!(
        recorded.lines().count() > 3,
        "the workload did too little: {recorded}"
    );
    sh_ok(&format!("cd '{}' && sha256sum -c --quiet '{jp}'", mp.s()));
    BD.ok(&["unmount", mp.s()]);
    let dev = BD
        .ok(&[&["mount", &spec, mp.s(), "--mode", "block"], with_key].concat())
        .trim()
        .to_string();
    sh_ok(&format!("e2fsck -fn {dev}"));
    BD.ok(&["unmount", mp.s()]);
}

#[test]
fn racing_mounts_have_exactly_one_winner() {
    require_root();
    let spec = BD.new_drive("race", "64MiB");
    let mps: Vec<Mp> = (0..6).map(|_| Mp::new(&BD.run_dir(), &BD.cs())).collect();
    let handles: Vec<_> = mps
        .iter()
        .map(|m| {
            let (cs, spec, mp) = (BD.cs(), spec.clone(), m.s().to_string());
            std::thread::spawn(move || {
                BD.cmd(&["mount", &spec, &mp, "--mode", "raw"])
                    .cs(&cs)
                    .output()
            })
        })
        .collect();
    let results: Vec<Output> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners = results.iter().filter(|o| o.status.success()).count();
    assert_eq!(
        winners,
        1,
        "{:?}",
        results
            .iter()
            .map(|o| String::from_utf8_lossy(&o.stderr).to_string())
            .collect::<Vec<_>>()
    );
    for (m, o) in mps.iter().zip(&results) {
        if !o.status.success() {
            // Refused by the service (the lease), or here already when the
            // winner's record was there first.
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("in use") || err.contains("already mounted writable on this machine"),
                "{err}"
            );
            assert!(!std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(m.s()));
        }
    }
    // Many mounts racing for one mountpoint: one wins, the rest leave it alone.
    let spec2 = BD.new_drive("race2", "64MiB");
    let spot = Mp::new(&BD.run_dir(), &BD.cs());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let spec = if i % 2 == 0 {
                spec.clone()
            } else {
                spec2.clone()
            };
            let (cs, mp) = (BD.cs(), spot.s().to_string());
            std::thread::spawn(move || {
                BD.cmd(&["mount", &spec, &mp, "--mode", "raw", "--read-only"])
                    .cs(&cs)
                    .output()
            })
        })
        .collect();
    let results: Vec<Output> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|o| o.status.success()).count(), 1);
    assert!(
        Path::new(&format!("{}/disk", spot.s())).exists(),
        "the winner still serves"
    );
    for m in mps.iter().chain(std::iter::once(&spot)) {
        let _ = BD.cmd(&["unmount", m.s()]).output();
    }
    let lease = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(lease["state"], "available");
}

/// An account SAS for the emulator account (Shared Key HMAC of the SAS fields).
fn account_sas(permissions: &str, expiry: &str) -> String {
    let version = "2021-12-02";
    let sts =
        format!("devstoreaccount1\n{permissions}\nb\nsco\n\n{expiry}\n\nhttp,https\n{version}\n\n");
    let key = base64::engine::general_purpose::STANDARD
        .decode(DEV_KEY)
        .unwrap();
    let auth = blobdrive::azure::auth::shared_key::authorization("x", &key, &sts);
    let sig = auth.rsplit(':').next().unwrap();
    let sig: String = url::form_urlencoded::byte_serialize(sig.as_bytes()).collect();
    format!("sv={version}&ss=b&srt=sco&sp={permissions}&se={expiry}&spr=http,https&sig={sig}")
}

fn sas_cs(sas: &str) -> String {
    format!(
        "BlobEndpoint={};SharedAccessSignature={sas}",
        Azurite::isolated().blob_endpoint()
    )
}

#[test]
fn bad_input_matrix_leaves_blobs_unchanged() {
    require_root();
    let spec = BD.new_drive("matrix", "64MiB");
    let before = fingerprint(&BD.blob(&spec));
    let mp = Mp::new(&BD.run_dir(), &BD.cs());
    // Wrong account key.
    let wrong = BD.cs().replace(DEV_KEY, &"A".repeat(88));
    BD.cmd(&["mount", &spec, mp.s()])
        .cs(&wrong)
        .fails_with_error(&["account key or SAS"]);
    // A SAS that works for reading mounts read-only but not writable; an expired one
    // mounts nothing.
    let ro = sas_cs(&account_sas("rl", "2099-01-01T00:00:00Z"));
    BD.cmd(&["info", &spec]).cs(&ro).ok();
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&ro)
        .fails_with_error(&["account key or SAS"]);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--read-only"])
        .cs(&ro)
        .ok();
    BD.cmd(&["unmount", mp.s()]).cs(&ro).ok();
    let expired = sas_cs(&account_sas("rwdlacup", "2001-01-01T00:00:00Z"));
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw", "--read-only"])
        .cs(&expired)
        .fails_with_error(&["account key or SAS"]);
    // Missing container and blob.
    BD.cmd(&[
        "mount",
        &format!("{}/d.vhd", unique_container("none")),
        mp.s(),
    ])
    .fails_with_error(&["container"]);
    BD.cmd(&["mount", &format!("{spec}.missing"), mp.s()])
        .fails_with_error(&["does not exist"]);
    // Not root.
    let out = sh(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups env AZURE_STORAGE_CONNECTION_STRING='{}' '{}' mount {spec} '{}'",
        BD.cs(),
        env!("CARGO_BIN_EXE_blobdrive"),
        mp.s()
    ));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs root"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // No /dev/fuse (a private mount namespace with an empty /dev).
    let out = in_mount_namespace("bash")
        .arg("-c")
        .arg(format!(
            "mount -t tmpfs none /dev && '{}' mount {spec} '{}'",
            env!("CARGO_BIN_EXE_blobdrive"),
            mp.s()
        ))
        .env("AZURE_STORAGE_CONNECTION_STRING", BD.cs())
        .env("BLOBDRIVE_RUN_DIR", BD.run_dir())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/dev/fuse"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Unreachable endpoint: fails within the default bound (30 s).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!(
        "AccountName=devstoreaccount1;AccountKey={DEV_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
    );
    let started = Instant::now();
    BD.cmd(&["mount", &spec, mp.s()])
        .cs(&dead)
        .fails_with_error(&["no answer from the storage service"]);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        fingerprint(&BD.blob(&spec)),
        before,
        "a refused mount changed the blob"
    );
    let list = json(&BD.ok(&["list", "--json"]));
    assert!(!list
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["mountpoint"] == mp.s()));
}

#[test]
fn secrets_never_reach_logs_outputs_or_the_command_line() {
    require_root();
    let spec = BD.new_drive("secret", "64MiB");
    let sas = account_sas("rwdlacup", "2099-01-01T00:00:00Z");
    let sig = sas.rsplit("sig=").next().unwrap().to_string();
    let cs = sas_cs(&sas);
    let env = [("BLOBDRIVE_LOG", "trace")];
    let mp = Mp::new(&BD.run_dir(), &cs);
    let mut seen = String::new();
    for args in [
        vec!["-vvv", "info", &spec],
        vec!["-vvv", "mount", &spec, mp.s(), "--mkfs", "ext4"],
        vec!["list", "--json"],
        vec!["stats", mp.s(), "--json"],
    ] {
        let out = BD.cmd(&args).cs(&cs).envs(&env).output();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        seen.push_str(&String::from_utf8_lossy(&out.stdout));
        seen.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    sh_ok(&format!("echo data > '{0}/f' && sync -f '{0}'", mp.s()));
    let pid = mp.pid();
    seen.push_str(&std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap());
    seen.push_str(&sh_ok("ps -eo args"));
    BD.cmd(&["unmount", mp.s()]).cs(&cs).ok();
    // The daemon's log, written at the most verbose level.
    for e in std::fs::read_dir(BD.run_dir().join("mounts"))
        .unwrap()
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "log") {
            seen.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    // An error message with a wrong key.
    let wrong_key = "B".repeat(86) + "==";
    let wrong = BD.cs().replace(DEV_KEY, &wrong_key);
    let out = BD
        .cmd(&["-vvv", "info", &spec])
        .cs(&wrong)
        .envs(&env)
        .output();
    seen.push_str(&String::from_utf8_lossy(&out.stderr));
    assert!(
        seen.contains("TRACE") || seen.contains("DEBUG"),
        "verbose logging was not on"
    );
    let decoded_sig = url::form_urlencoded::parse(format!("s={sig}").as_bytes())
        .next()
        .unwrap()
        .1
        .to_string();
    for secret in [
        sig.as_str(),
        decoded_sig.as_str(),
        DEV_KEY,
        wrong_key.as_str(),
    ] {
        assert!(!seen.contains(secret), "secret leaked: {secret}");
    }
}

/// The bytes of `[offset, offset+len)` of the raw `disk`, read past the kernel's
/// page cache (what the daemon serves).
fn read_direct(disk: &str, offset: u64, len: u64) -> Vec<u8> {
    let out = sh(&format!(
        "dd if='{disk}' bs={len} skip={} count=1 iflag=direct,skip_bytes status=none",
        offset
    ));
    assert!(
        out.status.success(),
        "direct read of {disk}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn a_failed_discard_whose_clear_lands_late_never_leaves_cache_and_blob_apart() {
    require_root();
    let spec = BD.new_drive("lateclear", "16MiB");
    // Every Clear Pages is held past the client's request timeout and carried out
    // ten seconds later: each attempt is abandoned, the discard fails with EIO.
    let proxy = Proxy::start(Config::holding(
        Azurite::isolated().port,
        "x-ms-page-write: clear",
        1000,
        Duration::from_secs(10),
    ));
    let cs = proxy.connection_string();
    let env = [
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "2"),
        ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "1"),
        ("BLOBDRIVE_IO_TIMEOUT_SECS", "3"),
    ];
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .envs(&env)
        .ok();
    let disk = format!("{}/disk", mp.s());
    sh_ok(&format!(
        "python3 -c \"import os; fd = os.open('{disk}', os.O_WRONLY); os.pwrite(fd, b'\\x55' * 65536, 0); os.fsync(fd)\""
    ));
    let out = sh(&format!(
        "fallocate --punch-hole --keep-size -o 0 -l 65536 '{disk}'"
    ));
    assert!(
        !out.status.success(),
        "the discard should fail: every Clear Pages went unanswered"
    );
    // The blob still holds the old bytes, and a read caches them.
    assert_eq!(read_direct(&disk, 0, 65536), vec![0x55u8; 65536]);
    // Whatever was held lands now (or is refused by the fence).
    proxy.wait_for_held();
    let late = proxy.late_commits();
    assert!(!late.is_empty(), "no Clear Pages was held");
    let blob = rt()
        .block_on(BD.blob(&spec).read(0, 65536))
        .unwrap()
        .to_vec();
    let served = read_direct(&disk, 0, 65536);
    assert!(
        served == blob,
        "the drive serves bytes the blob no longer holds (first served {:?}, blob {:?}); late clears: {:?}",
        &served[..4],
        &blob[..4],
        late.iter().map(|l| l.status).collect::<Vec<_>>()
    );
    assert!(
        late.iter().all(|l| l.status == Some(412)),
        "a Clear Pages given up on was carried out: {:?}",
        late.iter().map(|l| l.status).collect::<Vec<_>>()
    );
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
}

#[test]
fn unmount_after_a_daemon_stopped_by_itself_with_losses_says_what_was_lost() {
    // A daemon that stops by itself (SIGTERM, a plain umount) removes its record
    // whatever the outcome; `unmount` must not take "record gone" for a clean stop.
    require_root();
    let spec = BD.new_drive("selfstop", "16MiB");
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .ok();
    let pid = mp.pid() as i32;
    // Written while the service does not answer (the close waits to flush it);
    // meanwhile another host breaks the lease: it can never reach the blob.
    proxy
        .paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let disk = format!("{}/disk", mp.s());
    let mut writer = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os; fd = os.open('{disk}', os.O_WRONLY); os.pwrite(fd, b'unkept!!' * 1024, 0); os.close(fd)"
        ))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    rt().block_on(BD.blob(&spec).break_lease(Some(0))).unwrap();
    proxy
        .paused
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let closed = writer.wait().unwrap();
    assert!(!closed.success(), "the close flushed without the lease");
    // SAFETY: kill(2) on the daemon's pid, read from its own mount record.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    wait_for_exit(pid as u64, "the daemon to stop", Duration::from_secs(60));
    let out = BD.cmd(&["unmount", mp.s()]).cs(&cs).output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "unmount exited 0 after a stop that dropped data: {}{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("could not keep everything") && err.contains("dropped"),
        "{err}"
    );
    // Said once: a second unmount finds nothing mounted.
    let again = BD.cmd(&["unmount", mp.s()]).cs(&cs).output();
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing is mounted"));
}

/// Aborts the FUSE connection of the mount at `path`, as an operator can through
/// `/sys/fs/fuse/connections/N/abort` (N: the minor number of its device),
/// mounting `fusectl` there for the moment when it is not.
fn abort_fuse_connection(path: &str) {
    use std::os::unix::fs::MetadataExt;
    let conns = Path::new("/sys/fs/fuse/connections");
    let dev = std::fs::metadata(path).unwrap().dev();
    let n = libc::minor(dev);
    let mounted_here = !conns.join(n.to_string()).exists();
    if mounted_here {
        sh_ok("mount -t fusectl fusectl /sys/fs/fuse/connections");
    }
    std::fs::write(conns.join(n.to_string()).join("abort"), "1").unwrap();
    if mounted_here {
        sh_ok("umount /sys/fs/fuse/connections");
    }
}

#[test]
fn a_fuse_connection_aborted_under_a_busy_drive_still_writes_back_and_frees_the_lease() {
    require_root();
    let spec = BD.new_drive("fuseabort", "16MiB");
    let cs = BD.cs();
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.ok(&["mount", &spec, mp.s(), "--mode", "raw"]);
    let pid = mp.pid() as i32;
    // A process writes (no fsync: the data is only in the daemon's cache) and
    // keeps `disk` open, so a normal unmount would be refused as busy.
    let disk = format!("{}/disk", mp.s());
    let mut holder = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os, sys, time\n\
             fd = os.open('{disk}', os.O_RDWR)\n\
             os.pwrite(fd, b'cached!!' * 1024, 0)\n\
             print('written', flush=True)\n\
             time.sleep(600)"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "written\n");
    abort_fuse_connection(mp.s());
    wait_for_exit(
        pid as u64,
        "the daemon to stop after its FUSE connection was aborted",
        Duration::from_secs(60),
    );
    let _ = holder.kill();
    let _ = holder.wait();
    let blob = BD.blob(&spec);
    let got = rt().block_on(blob.read(0, 8192)).unwrap().to_vec();
    assert!(
        got == b"cached!!".repeat(1024),
        "what the daemon had cached was not written back (the blob begins {:?})",
        &got[..16]
    );
    // The lease was released, and nothing of the mount is left.
    let id = rt()
        .block_on(blob.acquire_lease("00000000-0000-0000-0000-0000000000ab", Some(15)))
        .expect("the lease is still held");
    rt().block_on(blob.release_lease(&id)).unwrap();
    let list = BD.cmd(&["list", "--json"]).cs(&cs).ok();
    assert!(!list.contains(mp.s()), "the mount is still listed: {list}");
    assert!(!Path::new(&format!("{}/disk", mp.s())).exists());
}

#[test]
fn cached_reads_are_answered_while_sixteen_writers_wait_out_an_outage_in_block_mode() {
    require_root();
    let spec = BD.new_drive("waitingwriters", "256MiB");
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let mp = Mp::new(&BD.run_dir(), &cs);
    // 32 MiB of cache: writes wait for room past 16 MiB of dirty data. In block
    // mode the loop device sends many writes at once (it held every FUSE thread).
    let disk = BD
        .cmd(&[
            "mount",
            &spec,
            mp.s(),
            "--mode",
            "block",
            "--cache-size",
            "32MiB",
        ])
        .cs(&cs)
        .ok()
        .trim()
        .to_string();
    assert!(disk.starts_with("/dev/loop"), "{disk}");
    // A region read once, so the cache holds it.
    sh_ok(&format!(
        "dd if='{disk}' of=/dev/null bs=1M count=1 iflag=direct status=none"
    ));
    proxy
        .paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The service comes back after 12 s; the reads below are made at about 6 s.
    let paused = proxy.paused.clone();
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(12));
        paused.store(false, std::sync::atomic::Ordering::SeqCst);
    });
    // Sixteen writers, 8 MiB each: together far past the dirty limit, so most of
    // them wait for the service, which does not answer.
    let writers = sh(&format!(
        "for i in $(seq 0 15); do \
           dd if=/dev/urandom of='{disk}' bs=1M count=8 seek=$((16 + i * 8)) oflag=direct conv=notrunc status=none >/dev/null 2>&1 & \
         done; sleep 6; \
         /usr/bin/python3 -c \"import mmap, os, time\n\
fd = os.open('{disk}', os.O_RDONLY | os.O_DIRECT)\n\
buf = mmap.mmap(-1, 1 << 20)\n\
took = [(lambda t: (os.preadv(fd, [buf], 0), time.monotonic() - t)[1])(time.monotonic()) for i in range(5)]\n\
print(sorted(took)[2], max(took))\"; \
         echo waiting-writers $(jobs -p | wc -l); wait"
    ));
    resume.join().unwrap();
    let stalled = mp.stats();
    let out = String::from_utf8_lossy(&writers.stdout).to_string();
    eprintln!("{out}{}", String::from_utf8_lossy(&writers.stderr));
    // Everything written lands once the service is back.
    sh_ok(&format!(
        "/usr/bin/python3 -c \"import os; fd = os.open('{disk}', os.O_WRONLY); os.fsync(fd)\""
    ));
    let written = rt().block_on(BD.blob(&spec).read(100 << 20, 4096)).unwrap();
    assert!(
        written.iter().any(|&b| b != 0),
        "the writers' data is not on the blob"
    );
    BD.cmd(&["unmount", mp.s()]).cs(&cs).ok();
    let lines: Vec<&str> = out.lines().collect();
    let waiting: u64 = lines
        .iter()
        .find_map(|l| l.strip_prefix("waiting-writers "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        waiting >= 8 && stalled["write_waits"].as_u64().unwrap_or(0) > 0,
        "the writers did not wait for room, so nothing was shown: {out} {stalled}"
    );
    let (median, worst): (f64, f64) = lines
        .iter()
        .find_map(|l| {
            let mut it = l.split_whitespace().map(|v| v.parse::<f64>());
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or_else(|| panic!("the reads were not answered: {out}"));
    assert!(
        median < 0.1 && worst < 1.0,
        "cached reads took {median:.3} s (worst {worst:.3} s) behind writers waiting for room"
    );
}

#[test]
fn a_mounted_drive_survives_endless_answers_within_its_memory() {
    // A hostile endpoint answers every request with a body that never ends. A
    // read of the drive fails (retried, then the outage rules, then EIO), the
    // daemon stays up and small, and serves again once the endpoint behaves.
    require_root();
    let spec = BD.new_drive("endless", "64MiB");
    // Data the drive knows is written but has not cached: reads go to the service.
    let data = Bytes::from(vec![0x5au8; 1 << 20]);
    rt().block_on(BD.blob(&spec).put_pages(16 << 20, data, None))
        .unwrap();
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let env = [
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "2"),
        ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "2"),
        ("BLOBDRIVE_IO_TIMEOUT_SECS", "6"),
    ];
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .envs(&env)
        .ok();
    let pid = mp.pid();
    let disk = mp.disk();
    proxy
        .endless
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let read = sh(&format!(
        "timeout 120 dd if='{disk}' of=/dev/null bs=1M count=1 skip=16 iflag=direct status=none"
    ));
    proxy
        .endless
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let err = String::from_utf8_lossy(&read.stderr);
    assert_ne!(read.status.code(), Some(124), "the read hung: {err}");
    assert!(
        !read.status.success() && err.contains("Input/output error"),
        "{err}"
    );
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the daemon did not survive"
    );
    let peak = common::mount::proc_status_kib(pid, "VmHWM") / 1024;
    assert!(peak < 200, "the daemon peaked at {peak} MiB resident");
    let got = sh_ok(&format!(
        "dd if='{disk}' bs=1M count=1 skip=16 iflag=direct status=none | od -An -v -tx1 | sort -u"
    ));
    assert_eq!(
        got.trim(),
        "5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a 5a"
    );
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
}

/// One round past the I/O timeout on the raw `disk`: `pieces` writes of 4 KiB a
/// MiB apart from `offset` (more runs than go out at once), then fsync and close,
/// each timed. Returns (fsync's outcome, its seconds, close's outcome, its seconds).
fn write_round(disk: &str, offset: u64, pieces: u64, tag: &str) -> (String, f64, String, f64) {
    let out = sh_ok(&format!(
        "python3 -c \"import os, time\n\
         fd = os.open('{disk}', os.O_WRONLY)\n\
         for k in range({pieces}):\n    os.pwrite(fd, (b'{tag}%03d' % k).ljust(4096, b'.'), {offset} + k * 1048576)\n\
         def timed(f):\n    t = time.monotonic()\n    try:\n        f(); r = 'ok'\n    except OSError as e:\n        r = e.strerror\n    return r, time.monotonic() - t\n\
         s = timed(lambda: os.fsync(fd))\n\
         c = timed(lambda: os.close(fd))\n\
         print(s[0]); print(s[1]); print(c[0]); print(c[1])\""
    ));
    let l: Vec<&str> = out.lines().collect();
    assert_eq!(l.len(), 4, "{out}");
    (
        l[0].to_string(),
        l[1].parse().unwrap(),
        l[2].to_string(),
        l[3].parse().unwrap(),
    )
}

/// An `O_DIRECT` read of 64 KiB of `disk` at `offset`: its outcome and seconds.
fn timed_direct_read(disk: &str, offset: u64) -> (String, f64) {
    let out = sh_ok(&format!(
        "python3 -c \"import mmap, os, time\n\
         fd = os.open('{disk}', os.O_RDONLY | os.O_DIRECT)\n\
         buf = mmap.mmap(-1, 65536)\n\
         t = time.monotonic()\n\
         try:\n    os.preadv(fd, [buf], {offset}); r = 'ok'\n\
         except OSError as e:\n    r = e.strerror\n\
         print(r); print(time.monotonic() - t)\""
    ));
    let l: Vec<&str> = out.lines().collect();
    (l[0].to_string(), l[1].parse().unwrap())
}

/// Issue 46: a silent service (the proxy accepts and reads, never answers: a
/// black-holed route) past the I/O timeout must fail each fsync, close and read
/// after one try, as a refusing one does, not after the retry budget once per
/// queued run and once more behind the background flush; the data stays dirty
/// and the first fsync once the service answers sends it. The retry budget here
/// is well above the request timeout, as by default (25 s against 20 s): a try
/// bounded by the budget, or several tries one after another, overrun the bound.
#[test]
fn a_silent_service_past_the_io_timeout_fails_each_io_after_one_try_and_keeps_the_data() {
    silent_outage(
        &[
            ("BLOBDRIVE_RETRY_BUDGET_SECS", "8"),
            ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "3"),
            ("BLOBDRIVE_IO_TIMEOUT_SECS", "8"),
        ],
        (8.0, 3.0, 8.0),
        3,
    );
}

/// [`a_silent_service_past_the_io_timeout_fails_each_io_after_one_try_and_keeps_the_data`]
/// at the default settings: a 300 s I/O timeout, 20 s request timeout and 25 s
/// budget (about seven minutes, nearly all of it waiting). `#[ignore]`d in plain
/// `cargo test`; `scripts/test.sh` runs it beside the lanes, like the other long
/// test.
#[test]
#[ignore]
fn a_silent_service_past_the_io_timeout_fails_each_io_after_one_try_at_the_default_settings() {
    silent_outage(&[], (300.0, 20.0, 25.0), 1);
}

/// Past the I/O timeout, each fsync after new data fails within one try: one
/// request timeout and a few seconds, also when another flush's try is under
/// way as it comes (a close's, here; the background flusher's), which the write
/// before it (its partial sectors) and then the fsync waited for before the
/// fsync made a try of its own. With the I/O timeout at 20 s and the
/// request timeout and retry budget at their defaults (20 s, 25 s), a raw mount
/// behind a paused proxy took 45.1, 59.9 and 39.9 s for three fsyncs, each
/// after 1 MiB of new data at a new offset. The first fsync once the service
/// answers again sends everything, and the blob then holds every byte written.
/// About two and a half minutes, nearly all of it waiting: `#[ignore]`d in
/// plain `cargo test`, and `scripts/test.sh` runs it beside the lanes with the
/// other long test of this file.
#[test]
#[ignore]
fn past_the_io_timeout_each_fsync_of_new_data_fails_within_one_try() {
    use std::os::unix::fs::FileExt;
    require_root();
    let env = [("BLOBDRIVE_IO_TIMEOUT_SECS", "20")];
    let (io_timeout, request_timeout, budget) = (20.0, 20.0, 25.0);
    let spec = BD.new_drive("one-try", "64MiB");
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .envs(&env)
        .env_remove("BLOBDRIVE_REQUEST_TIMEOUT_SECS")
        .env_remove("BLOBDRIVE_RETRY_BUDGET_SECS")
        .ok();
    let disk = mp.disk();
    let mib = |n: u64| -> Vec<u8> { (0..1u64 << 20).map(|i| (i * 7 + n * 13) as u8).collect() };
    let open = || std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    let app = open();
    // The write and the fsync, timed together: the write (from a buffer that
    // is not page-aligned, so the kernel sends it in pieces that end inside
    // sectors) waited for the flush under way too, then the fsync made its try.
    let fsync_after_new_mib = |n: u64| -> (String, f64) {
        let started = Instant::now();
        app.write_all_at(&mib(n), n << 20).unwrap();
        let r = app
            .sync_all()
            .map_or_else(|e| e.to_string(), |_| "ok".into());
        (r, started.elapsed().as_secs_f64())
    };
    // Another process writes 1 MiB at `n` and closes its file: the close
    // flushes, a try of its own.
    let closing_writer = |n: u64| {
        let (f, data) = (open(), mib(n));
        std::thread::spawn(move || {
            f.write_all_at(&data, n << 20).unwrap();
            drop(f);
        })
    };
    assert_eq!(fsync_after_new_mib(1).0, "ok");
    proxy
        .paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut fsyncs = vec![fsync_after_new_mib(2)];
    for n in [3, 5] {
        let closing = closing_writer(n + 1);
        std::thread::sleep(Duration::from_secs(2));
        fsyncs.push(fsync_after_new_mib(n));
        closing.join().unwrap();
    }
    proxy
        .paused
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let after = fsync_after_new_mib(7);
    eprintln!("fsyncs past the I/O timeout (outcome, s): {fsyncs:?}; once back: {after:?}");
    // The first waits out the I/O timeout, and the operation under way then.
    assert!(
        fsyncs[0].0 != "ok" && fsyncs[0].1 < io_timeout + request_timeout + budget + 5.0,
        "{fsyncs:?}"
    );
    // Each later one: one try, a request timeout and a few seconds.
    for f in &fsyncs[1..] {
        assert!(
            f.0 != "ok" && f.1 < request_timeout + 5.0,
            "an fsync past the I/O timeout took longer than one try: {fsyncs:?}"
        );
    }
    assert_eq!(after.0, "ok", "the first fsync once the service answered");
    drop(app);
    BD.cmd(&["unmount", mp.s()]).cs(&cs).ok();
    let blob = BD.blob(&spec);
    for n in 1..8 {
        let got = rt().block_on(blob.read(n << 20, 1 << 20)).unwrap();
        assert!(
            got[..] == mib(n)[..],
            "MiB {n} is not on the blob as written"
        );
    }
}

/// The silent outage of the two tests above with `env` for the mount, whose
/// (I/O timeout, request timeout, retry budget) are `limits`, and `rounds` of
/// writes, fsync, close and a read past the I/O timeout.
fn silent_outage(env: &[(&str, &str)], limits: (f64, f64, f64), rounds: u64) {
    let (io_timeout, request_timeout, budget) = limits;
    require_root();
    let spec = BD.new_drive("silent", "64MiB");
    // Bytes the drive has not cached, where the reads below go: they need the
    // service (a hole would be answered with zeros at once).
    for i in 0..3u64 {
        let data = Bytes::from(vec![0x5au8; 4 << 20]);
        rt().block_on(BD.blob(&spec).put_pages((50 + 4 * i) << 20, data, None))
            .unwrap();
    }
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let mp = Mp::new(&BD.run_dir(), &cs);
    BD.cmd(&["mount", &spec, mp.s(), "--mode", "raw"])
        .cs(&cs)
        .envs(env)
        .ok();
    let disk = format!("{}/disk", mp.s());
    let (r, ..) = write_round(&disk, 0, 1, "safe");
    assert_eq!(r, "ok");
    proxy
        .paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let resume = |proxy: &Proxy| {
        proxy
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst)
    };
    // The first fsync waits out the I/O timeout, then fails, at most one
    // operation later (a Put Page's request timeout and the raise's budget).
    let first = write_round(&disk, 1 << 20, 12, "first");
    eprintln!("first round (fsync, s, close, s): {first:?}");
    if first.0 == "ok" || first.1 > io_timeout + request_timeout + budget + 5.0 {
        resume(&proxy);
        panic!("the first fsync of the outage did not fail after the I/O timeout ({io_timeout} s) and one operation: {first:?}");
    }
    // Past the I/O timeout now: every further fsync, close and read fails after
    // one try, bounded by one request timeout (and a little for the rest).
    let bound = request_timeout + 2.5;
    let mut rounds_seen = Vec::new();
    let mut reads = Vec::new();
    for i in 0..rounds {
        rounds_seen.push(write_round(
            &disk,
            (13 + 12 * i) << 20,
            12,
            &format!("later{i}"),
        ));
        reads.push(timed_direct_read(&disk, (50 + 4 * i) << 20));
    }
    let waiting = proxy.waiting.load(std::sync::atomic::Ordering::SeqCst);
    let stats = mp.stats();
    // An fsync under way as the service comes back (with every attempt given
    // up on during the outage landing at once, the fence's raises among them)
    // succeeds.
    let straddling = {
        let disk = disk.clone();
        std::thread::spawn(move || write_round(&disk, 62 << 20, 1, "back"))
    };
    std::thread::sleep(Duration::from_millis(1000));
    resume(&proxy);
    let straddling = straddling.join().unwrap();
    let rounds = rounds_seen;
    eprintln!("past the I/O timeout (fsync, s, close, s): {rounds:?}; reads: {reads:?}");
    for r in &rounds {
        assert!(
            r.0 == "Input/output error" && r.2 == "Input/output error",
            "past the I/O timeout an fsync or close did not fail: {rounds:?}"
        );
        assert!(
            r.1 < bound && r.3 < bound,
            "an fsync or close past the I/O timeout took longer than one try ({bound} s): {rounds:?}"
        );
    }
    for r in &reads {
        assert!(
            r.0 == "Input/output error" && r.1 < bound,
            "a read past the I/O timeout did not fail after one try ({bound} s): {reads:?}"
        );
    }
    assert!(
        waiting > 0,
        "the proxy held no request: the service was not silent"
    );
    assert!(
        stats["dirty_bytes"].as_u64().unwrap() > 0,
        "unwritten data is kept: {stats}"
    );
    eprintln!("the fsync under way as the service came back: {straddling:?}");
    assert!(
        straddling.0 == "ok" && straddling.2 == "ok",
        "the fsync under way as the service came back failed: {straddling:?}"
    );
    // Back again: the next fsync sends everything kept.
    let (r, ..) = write_round(&disk, 63 << 20, 1, "next");
    assert_eq!(r, "ok", "an fsync after the outage failed");
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(env).ok();
    let b = BD.blob(&spec);
    let expect = |offset: u64, tag: &str, k: u64| {
        let got = rt().block_on(b.read(offset + k * (1 << 20), 16)).unwrap();
        let want = format!("{tag}{k:03}");
        assert_eq!(
            &got[..want.len()],
            want.as_bytes(),
            "a write whose fsync failed was not kept"
        );
    };
    expect(62 << 20, "back", 0);
    expect(63 << 20, "next", 0);
    for k in 0..12 {
        expect(1 << 20, "first", k);
        for i in 0..rounds.len() as u64 {
            expect((13 + 12 * i) << 20, &format!("later{i}"), k);
        }
    }
}

/// Whether a filesystem with these mount options (`findmnt -o OPTIONS`) takes
/// writes: ext4 that aborted its journal shows `ro`, or `emergency_ro` after `rw`.
fn writable(options: &str) -> bool {
    let options: Vec<&str> = options.trim().split(',').collect();
    options.first() == Some(&"rw") && !options.contains(&"emergency_ro")
}

/// The kernel log's lines, or `None` where it cannot be read.
fn kernel_log() -> Option<Vec<String>> {
    let out = sh("dmesg");
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    })
}

/// The lines about the device `name` (e.g. `loop3`) the kernel logged since it
/// logged `before`: "I/O error, dev loop3, ...", "Aborting journal on device
/// loop3-8.". The device is held all along, so they are no other test's.
/// Empty where the kernel log cannot be read.
fn kernel_lines_since(before: &Option<Vec<String>>, name: &str) -> Vec<String> {
    // By time stamp, not by count: the kernel's ring buffer drops its oldest
    // lines once full, and a long run fills it.
    let stamp =
        |l: &str| -> Option<f64> { l.strip_prefix('[')?.split(']').next()?.trim().parse().ok() };
    match (before, kernel_log()) {
        (Some(before), Some(after)) => {
            let last = before.iter().rev().find_map(|b| stamp(b));
            after
                .into_iter()
                .filter(|l| stamp(l).is_some_and(|t| last.is_none_or(|last| t > last)))
                .filter(|l| {
                    l.split(|c: char| !c.is_ascii_alphanumeric())
                        .any(|w| w == name)
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Makes an ext4 on the drive `spec` whose inode tables and journal are written
/// in full, through a block-mode mount at `mp` (unmounted again): ext4 then has
/// nothing to write by itself once mounted (with `--mkfs` the kernel zeroes the
/// inode tables in the background after mounting, and did so during a test's
/// outage, which past the I/O timeout made ext4 abort its journal).
fn mkfs_ext4_whole(spec: &str, mp: &Mp) {
    let dev = BD
        .ok(&["mount", spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    sh_ok(&format!(
        "mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard {dev}"
    ));
    BD.ok(&["unmount", mp.s()]);
}

/// Issue 46: after a silent outage past the I/O timeout, the first write once
/// the service answers again succeeds, with ext4's journal on top: its commit
/// (a write and a flush of the loop device) failing made ext4 abort its journal
/// and go read-only a second after the service came back.
#[test]
fn after_a_silent_outage_past_the_io_timeout_ext4_writes_and_syncs_at_once() {
    require_root();
    let spec = BD.new_drive("silentfs", "128MiB");
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let env = [
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "8"),
        ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "3"),
        ("BLOBDRIVE_IO_TIMEOUT_SECS", "8"),
    ];
    let mp = Mp::new(&BD.run_dir(), &cs);
    mkfs_ext4_whole(&spec, &mp);
    // Bytes on the blob in ext4's free space, which the drive has not cached: a
    // read of them needs the service.
    for i in 0..2u64 {
        let data = Bytes::from(vec![0x5au8; 4 << 20]);
        rt().block_on(BD.blob(&spec).put_pages((100 + 4 * i) << 20, data, None))
            .unwrap();
    }
    BD.cmd(&["mount", &spec, mp.s()]).cs(&cs).envs(&env).ok();
    let dev = mp.listed()["device"].as_str().unwrap().to_string();
    let name = dev.trim_start_matches("/dev/").to_string();
    sh_ok(&format!(
        "head -c 4M /dev/urandom > '{0}/before' && sync -f '{0}/before'",
        mp.s()
    ));
    // Whatever ext4 does after mounting settles (nothing of its own is dirty).
    sh_ok(&format!("sync -f '{}'", mp.s()));
    std::thread::sleep(Duration::from_secs(6));
    sh_ok(&format!("sync -f '{}'", mp.s()));
    proxy
        .paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // Reads the service must answer (the device past ext4's files, never read)
    // fail until the outage is older than the I/O timeout, and after it.
    let started = Instant::now();
    let mut reads = Vec::new();
    let mut at = 100u64 << 20;
    while (started.elapsed() < Duration::from_secs(14) || reads.len() < 3) && at < 108 << 20 {
        let out = sh(&format!(
            "dd if='{dev}' of=/dev/null bs=64K count=1 skip={at} iflag=direct,skip_bytes status=none"
        ));
        reads.push(out.status.success());
        at += 1 << 20;
    }
    let log_before = kernel_log();
    let resumed = Instant::now();
    proxy
        .paused
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        reads.iter().all(|ok| !ok),
        "a read succeeded while the service did not answer: {reads:?}"
    );
    // At once: write and fsync through ext4, several times over a few seconds
    // (its journal commits), then the filesystem must still be writable.
    let mut results = Vec::new();
    for i in 0..5 {
        let out = sh(&format!(
            "head -c 256K /dev/urandom > '{0}/after{i}' && sync -f '{0}/after{i}' && echo ok",
            mp.s()
        ));
        results.push((
            resumed.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&out.stdout).trim().to_string()
                + &String::from_utf8_lossy(&out.stderr),
        ));
        std::thread::sleep(Duration::from_millis(700));
    }
    let options = sh_ok(&format!("findmnt -n -o OPTIONS '{}'", mp.s()));
    let new_errors = kernel_lines_since(&log_before, &name);
    eprintln!("writes after the outage (s after resume, outcome): {results:?}; mount options {options}; new kernel lines {new_errors:?}");
    assert!(
        results.iter().all(|(_, r)| r == "ok"),
        "a write or fsync after the outage failed: {results:?}; kernel: {new_errors:?}"
    );
    assert!(
        writable(&options),
        "ext4 went read-only after the outage: {options}; kernel: {new_errors:?}"
    );
    assert!(
        new_errors.is_empty(),
        "the kernel logged errors after the outage: {new_errors:?}"
    );
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
    let dev = BD
        .ok(&["mount", &spec, mp.s(), "--mode", "block"])
        .trim()
        .to_string();
    sh_ok(&format!("e2fsck -fn {dev}"));
    BD.ok(&["unmount", mp.s()]);
}

/// Issue 46: ext4's journal commit, issued as a silent outage begins and still
/// under way past the I/O timeout when the service comes back, succeeds. The
/// attempts given up on during the outage (the fence's raises among them) land
/// as the service returns, so the commit's Put Page is often refused for an
/// old sequence number: an answer, after which it is sent again; it was failed
/// instead for having waited past the I/O timeout, and ext4 aborted its journal.
#[test]
fn an_ext4_commit_under_way_as_the_service_returns_past_the_io_timeout_succeeds() {
    require_root();
    let spec = BD.new_drive("straddle", "128MiB");
    let proxy = Proxy::start(Config::clean(Azurite::isolated().port));
    let cs = proxy.connection_string();
    let env = [
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "8"),
        ("BLOBDRIVE_REQUEST_TIMEOUT_SECS", "3"),
        ("BLOBDRIVE_IO_TIMEOUT_SECS", "8"),
    ];
    let mp = Mp::new(&BD.run_dir(), &cs);
    mkfs_ext4_whole(&spec, &mp);
    BD.cmd(&["mount", &spec, mp.s()]).cs(&cs).envs(&env).ok();
    sh_ok(&format!(
        "head -c 1M /dev/urandom > '{0}/before' && sync -f '{0}/before'",
        mp.s()
    ));
    std::thread::sleep(Duration::from_secs(6));
    sh_ok(&format!("sync -f '{}'", mp.s()));
    let dev = mp.listed()["device"].as_str().unwrap().to_string();
    let log_before = kernel_log();
    proxy
        .paused
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    // The service comes back past the I/O timeout (8 s), while the commit's
    // last operation (a request timeout and a retry budget: 11 s) is under way.
    let resume = {
        let paused = proxy.paused.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(9500));
            paused.store(false, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let commit = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "head -c 256K /dev/urandom > '{0}/during' && sync -f '{0}/during' && echo ok",
            mp.s()
        ))
        .output()
        .unwrap();
    resume.join().unwrap();
    let took = started.elapsed();
    let out = String::from_utf8_lossy(&commit.stdout).trim().to_string()
        + &String::from_utf8_lossy(&commit.stderr);
    let after = sh(&format!(
        "head -c 256K /dev/urandom > '{0}/after' && sync -f '{0}/after' && echo ok",
        mp.s()
    ));
    let options = sh_ok(&format!("findmnt -n -o OPTIONS '{}'", mp.s()));
    let kernel = kernel_lines_since(&log_before, dev.trim_start_matches("/dev/"));
    eprintln!(
        "commit under way: {out:?} after {took:?}; then {:?}; mount options {options}; kernel {kernel:?}",
        String::from_utf8_lossy(&after.stdout)
    );
    assert_eq!(
        out, "ok",
        "the commit under way as the service came back failed; kernel: {kernel:?}"
    );
    assert!(kernel.is_empty(), "the kernel logged errors: {kernel:?}");
    assert!(after.status.success(), "a later write failed: {after:?}");
    assert!(writable(&options), "ext4 went read-only: {options}");
    BD.cmd(&["unmount", mp.s()]).cs(&cs).envs(&env).ok();
}
