//! The test harness itself: the shared Azurite answers correctly signed requests
//! made without the project's client, and container names are valid; a
//! sandbox's mount namespace holds on to no other test's drive.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::azurite::{create_container, put_container, unique_container, Azurite};
use common::mount::require_root;
use common::namespace::in_mount_namespace;
use common::util::{output_text as text, sh_ok};

#[test]
fn shared_azurite_creates_a_container_once() {
    let az = Azurite::shared();
    assert!(az.port > 0);
    if std::env::var(common::azurite::PORT_ENV).is_ok_and(|v| !v.trim().is_empty()) {
        assert!(
            az.own_pid.is_none(),
            "given a port, the harness starts nothing"
        );
    } else {
        assert!(
            az.own_pid.is_some(),
            "without a port, the harness starts Azurite"
        );
    }

    let name = unique_container("harness_smoke::create");
    let (status, body) = put_container(az, &name);
    assert_eq!(status, 201, "first create: {body}");
    let (status, body) = put_container(az, &name);
    assert_eq!(status, 409, "second create: {body}");
    assert!(body.contains("ContainerAlreadyExists"), "{body}");
}

#[test]
fn create_container_helper_and_shared_instance() {
    // A second test in the same binary gets the same emulator.
    let a = Azurite::shared();
    let b = Azurite::shared();
    assert!(std::ptr::eq(a, b));
    create_container(a, &unique_container("helper"));

    assert_eq!(
        a.blob_endpoint(),
        format!("http://127.0.0.1:{}/devstoreaccount1", a.port)
    );
    let cs = a.connection_string();
    assert!(cs.starts_with("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"));
    assert!(cs.contains(&format!("AccountKey={};", common::azurite::DEV_KEY)));
    assert!(cs.ends_with(&format!("BlobEndpoint={};", a.blob_endpoint())));
}

#[test]
fn wrong_signature_is_refused() {
    // Guards against a harness that "works" only because the emulator ignores auth.
    let az = Azurite::shared();
    let name = unique_container("badsig");
    let request = format!(
        "PUT /devstoreaccount1/{name}?restype=container HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         x-ms-date: {}\r\nx-ms-version: 2021-12-02\r\n\
         Authorization: SharedKey devstoreaccount1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", az.port)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
}

#[test]
fn container_names_are_valid_and_unique() {
    let tags = [
        "cont",
        "",
        "___",
        "Snapshot_List::Prune",
        "a--b",
        "-lead-and-trail-",
        "ÜnïcødéTag",
        &"x".repeat(200),
    ];
    for tag in tags {
        let a = unique_container(tag);
        let b = unique_container(tag);
        assert_ne!(a, b);
        assert!((3..=63).contains(&a.len()), "{a:?} from {tag:?}");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a:?}"
        );
        assert!(!a.contains("--") && !a.ends_with('-'), "{a:?}");
        assert!(a.starts_with("t-"), "{a:?}");
    }
    assert!(unique_container("Snapshot_List").starts_with("t-snapshot-list-"));
}

/// A filesystem on a loop device over a plain file (no FUSE), as another
/// test's drive, mounted at `mnt` and bound at `bound` (a path with a
/// space), a tmpfs mounted over it at `mnt`; taken down when dropped, if the
/// test did not.
struct LoopMount {
    dev: String,
    mnt: std::path::PathBuf,
    bound: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopMount {
    fn new() -> LoopMount {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        sh_ok(&format!("mkfs.ext4 -q -F '{}'", image.display()));
        let dev = sh_ok(&format!("losetup --find --show '{}'", image.display()))
            .trim()
            .to_string();
        let (mnt, bound) = (dir.path().join("mnt"), dir.path().join("a bind"));
        std::fs::create_dir(&mnt).unwrap();
        std::fs::create_dir(&bound).unwrap();
        let m = LoopMount {
            dev,
            mnt,
            bound,
            _dir: dir,
        };
        let (mnt, bound) = (m.mnt.display(), m.bound.display());
        sh_ok(&format!(
            "mount '{}' '{mnt}' && mount --bind '{mnt}' '{bound}' && mount -t tmpfs over '{mnt}'",
            m.dev
        ));
        m
    }

    /// Unmounts all three (what is over the filesystem first).
    fn unmount(&self) -> std::process::Output {
        let (mnt, bound) = (self.mnt.display(), self.bound.display());
        common::util::sh(&format!(
            "umount '{mnt}' && umount '{mnt}' && umount '{bound}'"
        ))
    }

    /// Whether the loop device still has a file attached.
    fn attached(&self) -> bool {
        let name = self.dev.trim_start_matches("/dev/");
        Path::new(&format!("/sys/block/{name}/loop/backing_file")).exists()
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-R").arg(&self.mnt).output();
        let _ = Command::new("umount").arg(&self.bound).output();
        if self.attached() {
            let _ = Command::new("losetup").args(["-d", &self.dev]).output();
        }
    }
}

/// A drive of another test (here a filesystem on a loop device over a plain
/// file, bound elsewhere too and mounted over), unmounted and its loop device
/// detached while a sandbox's mount namespace lives: the device lets go
/// within a second, no copy in that namespace holding the filesystem.
#[test]
fn a_sandbox_s_mount_namespace_holds_no_copy_of_another_drive() {
    require_root();
    let drive = LoopMount::new();
    let mut sandbox = in_mount_namespace("bash")
        .args(["-c", "echo ready; exec sleep 60"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start bash in a mount namespace of its own");
    let mut said = String::new();
    std::io::BufReader::new(sandbox.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said, "ready\n");
    let copies = std::fs::read_to_string(format!("/proc/{}/mountinfo", sandbox.id())).unwrap();
    let unmounted = drive.unmount();
    assert!(unmounted.status.success(), "{}", text(&unmounted));
    sh_ok(&format!("losetup -d '{}'", drive.dev));
    let until = Instant::now() + Duration::from_secs(1);
    while drive.attached() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let attached = drive.attached();
    let _ = sandbox.kill();
    let _ = sandbox.wait();
    assert!(
        !attached,
        "{} is still attached a second after its detach, while a sandbox's namespace lived; its mounts:\n{copies}",
        drive.dev
    );
}
