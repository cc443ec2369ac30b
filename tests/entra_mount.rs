//! Entra ID under a mounted drive (root, FUSE, loop devices): the daemon renews its
//! token in the background for as long as it runs, and a renewal that keeps failing
//! is an outage that writes and fsync wait out, with `stats` saying why.
//!
//! The long one (tokens living 64 s, writes and fsyncs across four lifetimes) takes
//! about 4.5 minutes, so it is `#[ignore]`d in plain `cargo test` and
//! `scripts/test.sh` runs it alongside the rest of the suite.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::azurite::unique_container;
use common::entra::*;
use common::mount::require_root;
use common::util::{files_on_its_filesystem, json, stdout_of_success};

/// A drive mounted (ext4) with managed identity tokens from `tokens`; unmounted
/// when dropped.
struct Mounted {
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
    /// The drive, for messages.
    drive: String,
    /// Where the mount serves its metrics (`--metrics`).
    metrics_port: u16,
}

impl Mounted {
    fn new(tokens: &TokenServer, tag: &str) -> Mounted {
        require_root();
        let az = TlsAzurite::shared();
        let mut env = trusting(tokens.env_imds());
        env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.endpoint_only()));
        let drive = format!("{}/a.vhd", unique_container(tag));
        let args = ["create", &drive, "--size", "64MiB", "--create-container"];
        stdout_of_success(&args, blobdrive(&env, &args));
        let dir = tempfile::Builder::new()
            .prefix("blobdrive-entra-mnt.")
            .tempdir()
            .unwrap();
        let mp = dir.path().to_str().unwrap().to_string();
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics = format!("127.0.0.1:{metrics_port}");
        let args = [
            "mount",
            &drive,
            &mp,
            "--mkfs",
            "ext4",
            "--metrics",
            &metrics,
        ];
        stdout_of_success(&args, blobdrive(&env, &args));
        Mounted {
            env,
            dir,
            drive,
            metrics_port,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = blobdrive(&self.env, args);
        assert!(
            out.status.success(),
            "{args:?} on {}: {}",
            self.drive,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn stats(&self) -> serde_json::Value {
        json(&self.cli(&["stats", self.path().to_str().unwrap(), "--json"]))
    }

    /// One figure from the mount's `/metrics` (a sample without labels of its own).
    fn metric(&self, name: &str) -> (f64, String) {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        let v = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in:\n{text}"));
        (v, text)
    }

    fn unmount(&self) {
        self.cli(&["unmount", self.path().to_str().unwrap()]);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = blobdrive(&self.env, &["unmount", self.dir.path().to_str().unwrap()]);
    }
}

/// Writes `len` bytes of a pattern numbered `n` to `path` and fsyncs it.
fn write_synced(path: &Path, n: usize, len: usize) -> std::io::Result<()> {
    let data: Vec<u8> = (0..len).map(|i| ((i * 31 + n * 7) % 253) as u8).collect();
    let mut f = std::fs::File::create(path)?;
    f.write_all(&data)?;
    f.sync_all()
}

/// No file under the run directory holds a token (JWTs start with `eyJ`);
/// a mount there (the drive's FUSE directory) is not entered.
fn assert_no_token_in_run_dir() {
    for p in files_on_its_filesystem(&run_dir()) {
        let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap_or_default()).into_owned();
        assert!(!text.contains("eyJ"), "a token in {}", p.display());
        assert!(
            !text.contains(IDENTITY_HEADER) && !text.contains(SECRET),
            "a secret in {}",
            p.display()
        );
    }
}

#[test]
#[ignore = "4.5 minutes: scripts/test.sh runs it in parallel with the rest of the suite"]
fn a_mount_with_one_minute_tokens_keeps_writing_across_four_lifetimes() {
    let tokens = TokenServer::start();
    // Just over the shortest a token may live (60 s when it comes).
    tokens.set("lifetime", "64");
    let m = Mounted::new(&tokens, "long-tokens");
    let mounted_at = Instant::now();
    let issued_before = tokens.issued("imds");
    let list = json(&m.cli(&["list", "--json"]));
    let ours = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mountpoint"] == m.path().to_str().unwrap())
        .cloned()
        .expect("the mount is listed");
    assert_eq!(ours["auth"], "Entra ID (managed-identity)", "{ours}");
    let table = m.cli(&["list"]);
    assert!(table.contains("Entra ID (managed-identity)"), "{table}");

    // Four lifetimes and a bit: every write and fsync must succeed.
    let mut n = 0;
    while mounted_at.elapsed() < Duration::from_secs(4 * 60 + 10) {
        let f = m.path().join(format!("f{n}.bin"));
        write_synced(&f, n, 256 << 10)
            .unwrap_or_else(|e| panic!("write {n} after {:?}: {e}", mounted_at.elapsed()));
        n += 1;
        std::thread::sleep(Duration::from_secs(2));
    }
    let s = m.stats();
    assert_eq!(s["stalled_secs"], 0.0, "{s}");
    let renewals = tokens.issued("imds") - issued_before;
    // Renewed at half of each 64 s lifetime: about seven in 250 s, at least four.
    assert!(renewals >= 4, "{renewals} renewals: {:?}", tokens.log());
    // Each ahead of time, in the background: never a token left to expire (a
    // renewal forced by a refused request would come 60 s or more apart).
    let times: Vec<f64> = tokens
        .log()
        .iter()
        .filter(|e| e["kind"] == "imds" && e["status"] == 200)
        .map(|e| e["t"].as_f64().unwrap())
        .collect();
    let gaps: Vec<f64> = times[issued_before - 1..]
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect();
    assert!(gaps.iter().all(|g| *g < 45.0), "renewal gaps {gaps:?}");
    // The metrics count them too, none failed, and no token is in them.
    let (counted, text) = m.metric("blobdrive_token_renewals_total");
    assert!(counted >= renewals as f64, "{counted} < {renewals}");
    assert_eq!(m.metric("blobdrive_token_renewal_failures_total").0, 0.0);
    // (Tokens are JWTs: base64 of a JSON header, which starts "eyJ".)
    assert!(!text.contains("eyJ"), "a token in the metrics:\n{text}");
    assert_no_token_in_run_dir();
    m.unmount();
    eprintln!("{n} files written and synced, {renewals} token renewals");
}

/// The most token requests in any 15 s of `times` (seconds).
fn most_in_15s(times: &[f64]) -> usize {
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t < times[i] + 15.0)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn a_renewal_that_keeps_failing_is_an_outage_writes_wait_out() {
    let tokens = TokenServer::start();
    // The shortest a token may live: renewed at half of it.
    tokens.set("lifetime", "64");
    let m = Mounted::new(&tokens, "renewal-outage");
    let signed_in = Instant::now();
    write_synced(&m.path().join("before.bin"), 0, 64 << 10).unwrap();

    // The identity endpoint goes wrong: every token it gives expires at once.
    // Renewals fail (such a token is refused), with backoff: the endpoint is
    // not asked in a loop (it was, hundreds of times in 15 s, each token due
    // for renewal at once). Within one lifetime the token is past use (it is
    // not sent in its last 5 s).
    let from = tokens.log().len();
    tokens.set("lifetime", "0");
    std::thread::sleep(Duration::from_secs(61).saturating_sub(signed_in.elapsed()));
    let path = m.path().join("during.bin");
    let writer = std::thread::spawn(move || {
        let started = Instant::now();
        write_synced(&path, 1, 64 << 10).map(|_| started.elapsed())
    });
    // The write waits; stats say why once it has waited long enough to count.
    let deadline = Instant::now() + Duration::from_secs(40);
    let stats = loop {
        let s = m.stats();
        if s["stalled_secs"].as_f64().unwrap_or(0.0) > 0.0 && s["last_error"].is_string() {
            break s;
        }
        assert!(Instant::now() < deadline, "no stall shown: {s}");
        std::thread::sleep(Duration::from_secs(1));
    };
    let times: Vec<f64> = tokens.log()[from..]
        .iter()
        .map(|e| e["t"].as_f64().unwrap())
        .collect();
    let most = most_in_15s(&times);
    eprintln!(
        "{} token requests in {:.0} s of tokens expiring at once, at most {most} in 15 s",
        times.len(),
        times.last().unwrap_or(&0.0) - times.first().unwrap_or(&0.0)
    );
    assert!(
        !times.is_empty() && most <= 10,
        "{most} token requests in 15 s ({} in all)",
        times.len()
    );
    let why = stats["last_error"].as_str().unwrap();
    assert!(
        why.contains("the Entra ID token (managed-identity) expired and renewing it keeps failing")
            && why.contains(&format!("(IMDS at {})", tokens.imds()))
            && why.contains("a token must be valid for at least 60 s"),
        "{stats}"
    );
    assert!(!writer.is_finished(), "the fsync waits for a token");
    // Reads of what is written go on meanwhile. On a thread of its own, and the
    // tokens come back after at most 15 s whatever it does: if the read waited
    // for them too, this thread must not wait for it (a fresh-clone run under
    // memory pressure once sat here until the write failed with EIO at the I/O
    // timeout, 300 s later, with every global `sync` on the machine behind it).
    let before_path = m.path().join("before.bin");
    let reader = std::thread::spawn(move || std::fs::read(before_path).map(|b| b.len()));
    let read_deadline = Instant::now() + Duration::from_secs(15);
    while !reader.is_finished() && Instant::now() < read_deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let read_in_time = reader.is_finished();

    // Back: the renewal succeeds (its backoff is at most 30 s) and the fsync returns.
    tokens.set("lifetime", "3600");
    assert!(
        read_in_time,
        "a read of written data waited for the token during the outage"
    );
    assert_eq!(reader.join().unwrap().unwrap(), 64 << 10);
    let took = writer
        .join()
        .unwrap()
        .expect("the write and fsync succeed once tokens come back");
    assert!(took < Duration::from_secs(120), "{took:?}");
    let s = m.stats();
    assert!(s["last_error"].is_null(), "{s}");
    m.unmount();
}

#[test]
fn a_mount_that_cannot_sign_in_fails_in_one_line_and_leaves_nothing() {
    require_root();
    let az = TlsAzurite::shared();
    let env = trusting(kv(&[
        ("AZURE_STORAGE_CONNECTION_STRING", &az.endpoint_only()),
        (
            "AZURE_POD_IDENTITY_AUTHORITY_HOST",
            &format!("http://127.0.0.1:{}", closed_port()),
        ),
    ]));
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().to_str().unwrap();
    let args = ["mount", "disks/a.vhd", mp, "--mkfs", "ext4"];
    let (out, took) = blobdrive_timed(&env, &args);
    let m = error_line(&args, out);
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(
        m.contains("no Entra ID credential found (tried service-principal"),
        "{m}"
    );
    let list = json(&stdout_of_success(
        &["list"],
        blobdrive(&env, &["list", "--json"]),
    ));
    assert!(
        !list.to_string().contains(mp),
        "nothing recorded for the failed mount: {list}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// A projected service account token as kubelet lays it out in `dir`: the
/// token in a directory of its own per version, `..data` a symlink to the
/// current one, swapped by a rename, and `token` a symlink through `..data`.
/// Version `n`'s file is root's alone (0600).
fn project_token(dir: &Path, n: u32, token: &str) {
    use std::os::unix::fs::PermissionsExt;
    let version = format!("..2026_01_01_00_00_0{n}.000000000");
    std::fs::create_dir(dir.join(&version)).unwrap();
    let file = dir.join(&version).join("token");
    std::fs::write(&file, token).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&version, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if !dir.join("token").exists() {
        std::os::unix::fs::symlink("..data/token", dir.join("token")).unwrap();
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: u64) -> Vec<u64> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s[s.rfind(')').unwrap() + 2..].split(' ').nth(1) == Some(&pid.to_string())
            })
        })
        .collect()
}

/// Workload identity in a split daemon (issue 42), as on an AKS node: the
/// federated token file is kubelet's, in a directory only root may enter,
/// rotated by swapping a symlink. The worker, running as an unprivileged user
/// behind Landlock, can open neither it nor the directory, so the root part
/// reads it for the sign-in and for every renewal; and the worker trusts the
/// test CA that SSL_CERT_FILE names, for the token server and the storage
/// endpoint alike.
#[test]
fn a_split_mount_renews_with_the_rotated_token_file_the_root_part_reads() {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    require_root();
    let tokens = TokenServer::start();
    // Renewed at half its lifetime (the shortest a token may have): every 32 s.
    tokens.set("lifetime", "64");
    let projected = tempfile::Builder::new()
        .prefix("blobdrive-projected.")
        .tempdir()
        .unwrap();
    let dir = projected.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let first = federated_token(1, 3600);
    project_token(dir, 1, &first);
    tokens.set("federated_expected", &first);
    let token_file = dir.join("token");
    let az = TlsAzurite::shared();
    let mut env = trusting(kv(&[
        ("AZURE_TENANT_ID", TENANT),
        ("AZURE_CLIENT_ID", CLIENT_ID),
        ("AZURE_FEDERATED_TOKEN_FILE", token_file.to_str().unwrap()),
        ("AZURE_AUTHORITY_HOST", &tokens.authority()),
    ]));
    env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.endpoint_only()));
    let drive = format!("{}/a.vhd", unique_container("split-wi"));
    let args = ["create", &drive, "--size", "16MiB", "--create-container"];
    stdout_of_success(&args, blobdrive(&env, &args));
    let mnt = tempfile::Builder::new()
        .prefix("blobdrive-entra-mnt.")
        .tempdir()
        .unwrap();
    let mp = mnt.path().to_str().unwrap().to_string();
    let args = [
        "mount",
        &drive,
        &mp,
        "--mode",
        "raw",
        "--run-as",
        common::user::USER,
    ];
    // No file there yet: the root part says so, in the mount's one line, and
    // nothing is left.
    let mut missing = env.clone();
    missing.retain(|(k, _)| k != "AZURE_FEDERATED_TOKEN_FILE");
    let nowhere = dir.join("not-yet");
    missing.push((
        "AZURE_FEDERATED_TOKEN_FILE".into(),
        nowhere.to_str().unwrap().into(),
    ));
    let m = error_line(&args, blobdrive(&missing, &args));
    assert!(
        m.contains("through workload-identity failed: cannot read the federated token file")
            && m.contains("the root part cannot read it: No such file"),
        "{m}"
    );
    let list = json(&stdout_of_success(
        &["list"],
        blobdrive(&env, &["list", "--json"]),
    ));
    assert!(!list.to_string().contains(&mp), "{list}");
    assert!(std::fs::read_dir(&mp).unwrap().next().is_none());
    stdout_of_success(&args, blobdrive(&env, &args));
    let m = Mounted {
        env,
        dir: mnt,
        drive,
        metrics_port: 0,
    };
    // Split: the record's pid is the root part, its child the worker, which
    // is not root; the record names the source.
    let list = json(&m.cli(&["list", "--json"]));
    let ours = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mountpoint"] == mp.as_str())
        .cloned()
        .expect("the mount is listed");
    assert_eq!(ours["auth"], "Entra ID (workload-identity)", "{ours}");
    let daemon = ours["pid"].as_u64().unwrap();
    let workers = children_of(daemon);
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", workers[0])).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(!uid.split_whitespace().skip(1).any(|u| u == "0"), "{uid}");
    let write = |n: usize| {
        let data: Vec<u8> = (0..64 << 10)
            .map(|i| ((i * 31 + n * 7) % 253) as u8)
            .collect();
        let disk = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("{mp}/disk"))
            .unwrap();
        disk.write_all_at(&data, (n as u64) << 20).unwrap();
        disk.sync_all().unwrap();
    };
    write(1);

    // kubelet rotates the token; the token server takes only the new one now.
    let issued = tokens.issued("federated");
    let second = federated_token(2, 3600);
    project_token(dir, 2, &second);
    tokens.set("federated_expected", &second);
    let deadline = Instant::now() + Duration::from_secs(60);
    while tokens.issued("federated") == issued {
        assert!(
            Instant::now() < deadline,
            "no renewal after the rotation: {:?}",
            tokens.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Every token request was granted: the renewal sent the rotated token,
    // never the old one again.
    assert!(
        tokens.log().iter().all(|e| e["status"] == 200),
        "{:?}",
        tokens.log()
    );
    write(2);
    let s = m.stats();
    assert!(s["last_error"].is_null(), "{s}");
    m.unmount();
    let list = json(&m.cli(&["list", "--json"]));
    assert!(!list.to_string().contains(&mp), "{list}");
}

#[test]
fn a_service_principal_signs_the_worker_in_with_a_certificate_only_root_can_read() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let tokens = TokenServer::start();
    // The certificate as operators keep it: root's, 0600, in a directory of
    // root's the worker cannot enter (and which Landlock does not allow).
    let keep = tempfile::Builder::new()
        .prefix("blobdrive-sp-cert.")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(keep.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let pem = keep.path().join("client.pem");
    std::fs::copy(&Pki::shared().client_pem, &pem).unwrap();
    std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o600)).unwrap();
    let az = TlsAzurite::shared();
    let mut env = trusting(tokens.env_service_principal_certificate());
    env.retain(|(k, _)| k != "AZURE_CLIENT_CERTIFICATE_PATH");
    env.push((
        "AZURE_CLIENT_CERTIFICATE_PATH".into(),
        pem.to_str().unwrap().into(),
    ));
    env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.endpoint_only()));
    let drive = format!("{}/a.vhd", unique_container("split-cert"));
    let args = ["create", &drive, "--size", "16MiB", "--create-container"];
    stdout_of_success(&args, blobdrive(&env, &args));
    let mnt = tempfile::Builder::new()
        .prefix("blobdrive-entra-mnt.")
        .tempdir()
        .unwrap();
    let mp = mnt.path().to_str().unwrap().to_string();
    let args = ["mount", &drive, &mp, "--mode", "raw"];
    stdout_of_success(&args, blobdrive(&env, &args));
    let m = Mounted {
        env,
        dir: mnt,
        drive,
        metrics_port: 0,
    };
    let list = json(&m.cli(&["list", "--json"]));
    let ours = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mountpoint"] == mp.as_str())
        .cloned()
        .expect("the mount is listed");
    assert_eq!(ours["auth"], "Entra ID (service-principal)", "{ours}");
    assert_eq!(children_of(ours["pid"].as_u64().unwrap()).len(), 1);
    {
        use std::os::unix::fs::FileExt;
        let disk = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("{mp}/disk"))
            .unwrap();
        disk.write_all_at(&[7u8; 4096], 1 << 20).unwrap();
        disk.sync_all().unwrap();
    }
    let s = m.stats();
    assert!(s["last_error"].is_null(), "{s}");
    m.unmount();
}
