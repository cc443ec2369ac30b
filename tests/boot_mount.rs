//! Mounting at boot, as root against Azurite: the mount(8) helper run by util-linux's
//! own `mount -T FSTAB`, a plain `umount` that puts everything on the blob and frees
//! the lease, refusals that leave nothing behind, secrets kept out of sight, and the
//! systemd readiness protocol of `mount --foreground`.
//!
//! mount(8) looks for helpers only in /sbin (and /sbin/fs.d, /sbin/fs). So that no
//! test ever installs anything there, the fstab tests run in a private mount
//! namespace (tests/common/namespace.rs: the copies of other tests' drives let go
//! of) in which an overlay puts `mount.blobdrive` (a symlink to
//! the binary under test) in front of the real /sbin: the system's /sbin is never
//! written, parallel tests cannot see each other's helper, and everything vanishes
//! with the namespace, also when a test dies. /run/mount (libmount's utab) gets a
//! private tmpfs there too. The daemon mounts inside that namespace, so the checks
//! that look at mounts run inside it as well; the blob and the lease are checked
//! from outside with the project's own CLI and by reading the filesystem image with
//! debugfs (e2fsprogs), not with blobdrive's mount.

mod common;
mod faultproxy;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::azurite::{Azurite, DEV_KEY};
use common::bd::Harness;
use common::mount::require_root;
use common::namespace::in_mount_namespace;
use common::util::{json, output_text as text, sh_ok, wait_for_exit, wait_for_some};
use faultproxy::{Config, Proxy};

/// A private run directory for this test binary.
const BD: Harness = Harness::new("boot-run");

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_blobdrive")
}

fn lease_state(spec: &str) -> String {
    json(&BD.ok(&["lease", "status", spec, "--json"]))["state"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A scratch directory holding the mountpoint `mnt`, the helper directory `helper`
/// (with `mount.blobdrive`), a credentials file `acct.env` (root's, 0600) and
/// whatever a test puts there. Whatever is still mounted by blobdrive at `mnt` is
/// unmounted when it is dropped.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("blobdrive-boot.")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        std::fs::create_dir(dir.path().join("helper")).unwrap();
        for helper in ["mount.blobdrive", "umount.blobdrive"] {
            std::os::unix::fs::symlink(bin(), dir.path().join("helper").join(helper)).unwrap();
        }
        let s = Scratch { dir };
        s.write_credentials(
            &format!(
                "# the test account\nAZURE_STORAGE_CONNECTION_STRING={}\n",
                Azurite::shared().connection_string()
            ),
            0o600,
        );
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn mnt(&self) -> PathBuf {
        self.path("mnt")
    }

    fn creds(&self) -> PathBuf {
        self.path("acct.env")
    }

    fn helper(&self) -> PathBuf {
        self.path("helper/mount.blobdrive")
    }

    fn write_credentials(&self, text: &str, mode: u32) {
        std::fs::write(self.creds(), text).unwrap();
        std::fs::set_permissions(self.creds(), std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Runs `script` with bash in a private mount namespace where `mount.blobdrive`
    /// and `umount.blobdrive` are in /sbin, with the run directory exported and, for the test's own
    /// `blobdrive` calls, `$BD` and `$CS`. The helper's own environment has no
    /// account: mount(8) passes only what the fstab line says.
    fn in_namespace(&self, script: &str) -> Output {
        let prologue = format!(
            r#"set -euo pipefail
mount -t tmpfs -o mode=0755 tmpfs /run/mount 2>/dev/null || {{ mkdir -p /run/mount && mount -t tmpfs -o mode=0755 tmpfs /run/mount; }}
sbin="$(realpath /sbin)"
mount -t overlay overlay -o "lowerdir={helper}:$sbin" "$sbin"
export BLOBDRIVE_RUN_DIR='{run}'
BD='{bin}'
"#,
            helper = self.path("helper").display(),
            run = BD.run_dir().display(),
            bin = bin(),
        );
        in_mount_namespace("bash")
            .arg("-c")
            .arg(format!("{prologue}{script}"))
            .env_remove("AZURE_STORAGE_CONNECTION_STRING")
            .env("CS", Azurite::shared().connection_string())
            .stdin(Stdio::null())
            .output()
            .expect("run bash in a mount namespace of its own")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if daemon_pid(&self.mnt()).is_some() {
            let _ = BD.cmd(&["unmount", self.mnt().to_str().unwrap()]).output();
        }
    }
}

/// The daemon's pid from its mount record, if it has one.
fn daemon_pid(mp: &Path) -> Option<u32> {
    let id = blobdrive::mount::record::id_for(mp);
    let text = std::fs::read_to_string(BD.run_dir().join(format!("mounts/{id}.json"))).ok()?;
    json(&text)["pid"].as_u64().map(|p| p as u32)
}

/// Nothing of a mount at `mp` may remain ([`Harness::assert_nothing_left`]), its
/// record file gone, the lease available and the mountpoint empty.
fn assert_all_gone(mp: &Path, spec: &str) {
    BD.assert_nothing_left(mp, spec);
    assert_eq!(
        daemon_pid(mp),
        None,
        "a mount record is left for {}",
        mp.display()
    );
    assert_eq!(lease_state(spec), "available");
    assert_eq!(
        std::fs::read_dir(mp).unwrap().count(),
        0,
        "files left in {}",
        mp.display()
    );
}

/// Downloads the drive as a raw image and returns `sha256sum` of the named files
/// in its ext4 filesystem, read with debugfs.
fn files_on_the_blob(spec: &str, scratch: &Scratch, files: &[&str]) -> String {
    let image = scratch.path("image.raw");
    let _ = std::fs::remove_file(&image);
    BD.ok(&["download", spec, image.to_str().unwrap(), "--format", "raw"]);
    files_in_image(&image, scratch, files)
}

/// `sha256sum` of the named files in the ext4 filesystem of a raw image.
fn files_in_image(image: &Path, scratch: &Scratch, files: &[&str]) -> String {
    let mut out = String::new();
    for f in files {
        let dumped = scratch.path(&format!("dumped-{f}"));
        sh_ok(&format!(
            "debugfs -R 'dump /{f} {}' '{}' 2>/dev/null",
            dumped.display(),
            image.display()
        ));
        out.push_str(&sh_ok(&format!(
            "cd '{}' && sha256sum dumped-{f}",
            scratch.dir.path().display()
        )));
    }
    out
}

/// The fstab way at shutdown: systemd runs `umount DIR` for the mount unit and
/// takes the network down right after. `umount` (through `umount.blobdrive`, which
/// the daemon names in libmount's table) returns only once everything is on the
/// blob, the lease is released and the daemon is gone; the test cuts the
/// daemon's network the moment `umount` returns, and the lease is free all the
/// same. (Before the helper, `umount` returned first and the lease was released
/// about a second later: cut off here, it stayed held.)
#[test]
fn fstab_mount_then_plain_umount_puts_everything_on_the_blob_and_frees_the_lease() {
    require_root();
    let spec = BD.new_drive("fstab", "64MiB");
    let s = Scratch::new();
    // The daemon reaches the service only through this proxy: the network the
    // test takes down.
    let proxy = Proxy::start(Config::clean(Azurite::shared().port));
    s.write_credentials(
        &format!(
            "AZURE_STORAGE_CONNECTION_STRING={}\n",
            proxy.connection_string()
        ),
        0o600,
    );
    let mnt = s.mnt();
    let fstab = s.path("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# a test fstab\n{spec}  {}  blobdrive  _netdev,nofail,credentials={},mkfs=ext4,cache-size=64MiB,nosuid,x-systemd.device-timeout=10  0 0\n",
            mnt.display(),
            s.creds().display()
        ),
    )
    .unwrap();
    let returned = s.path("umount-returned");
    let cut = {
        let (returned, dead) = (returned.clone(), proxy.dead.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !returned.exists() && start.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(1));
            }
            dead.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let key_part = &DEV_KEY[..20];
    // Inside the namespace: mount from the fstab, look at what the system shows,
    // write (no sync), plain umount, and look at what is left the moment it returned.
    let out = s.in_namespace(&format!(
        r#"
spec='{spec}'
mount -T '{fstab}' '{mnt}'
pid=
id=
for r in "$BLOBDRIVE_RUN_DIR"/mounts/*.json; do grep -q '"{mnt}"' "$r" && pid="$(sed -n 's/.*"pid": \([0-9]*\).*/\1/p' "$r")" && id="$(basename "$r" .json)"; done
echo "pid=$pid"
echo "fs=$(findmnt -n -o FSTYPE,OPTIONS '{mnt}')"
echo "fuse=$(findmnt -n -o SOURCE -t fuse,fuse.blobdrive | tr '\n' ' ')"
echo "utab=$(sed 's/SRC=[^ ]* //' /run/mount/utab)"
if grep -q '{key_part}' /proc/self/mountinfo; then echo SECRET-IN-MOUNTS; fi
cmdline="$(tr '\0' ' ' < /proc/$pid/cmdline)"
if grep -q '{key_part}' <<<"$cmdline"; then echo SECRET-IN-CMDLINE; fi
if grep -q '{key_part}' "$BLOBDRIVE_RUN_DIR"/mounts/*.log 2>/dev/null; then echo SECRET-IN-LOG; fi
environ="$(tr '\0' '\n' < /proc/$pid/environ)"
if ! grep -q '^AZURE_STORAGE_CONNECTION_STRING=.*{key_part}' <<<"$environ"; then echo NO-ACCOUNT-IN-ENV; fi
echo hello > '{mnt}/small'
head -c 9M /dev/urandom > '{mnt}/big'
(cd '{mnt}' && sha256sum small big) > '{sums}'
echo "loops_before=$(losetup -a | grep -cF "/mounts/$id.fuse/" || true)"
umount '{mnt}'
touch '{returned}'
# What umount left: the daemon must be gone, and with it its record and entry.
# (A zombie is not running: this sandbox's init may be slow to reap it.)
st="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' /proc/$pid/status 2>/dev/null || true)"
[ -n "$st" ] && [ "$st" != Z ] && echo DAEMON-RUNNING-AFTER-UMOUNT
[ -e "$BLOBDRIVE_RUN_DIR/mounts/$id.json" ] && echo RECORD-LEFT
grep -q helper=blobdrive /run/mount/utab && echo UTAB-ENTRY-LEFT
AZURE_STORAGE_CONNECTION_STRING="$CS" "$BD" download '{spec}' '{image}' --format raw >/dev/null 2>&1 || echo DOWNLOAD-FAILED
# Only this mount's loop device: the other tests here share the run directory.
[ -n "$id" ] && losetup -a | grep -F "/mounts/$id.fuse/" || true
"#,
        fstab = fstab.display(),
        mnt = mnt.display(),
        sums = s.path("sums").display(),
        image = s.path("at-umount.raw").display(),
        returned = returned.display(),
    ));
    cut.join().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(returned.exists(), "umount did not return: {t}");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    for bad in [
        "SECRET-IN-MOUNTS",
        "SECRET-IN-CMDLINE",
        "SECRET-IN-LOG",
        "NO-ACCOUNT-IN-ENV",
        "DAEMON-RUNNING-AFTER-UMOUNT",
        "RECORD-LEFT",
        "UTAB-ENTRY-LEFT",
        "DOWNLOAD-FAILED",
        "/dev/loop",
    ] {
        assert!(!stdout.contains(bad), "{bad}: {t}");
    }
    // The filesystem got the fstab's flag and nothing secret; the FUSE mount is
    // named after the drive; libmount's table named the helper for the mount.
    assert!(
        stdout.contains("fs=ext4 ") && stdout.contains("nosuid"),
        "{t}"
    );
    assert!(stdout.contains(&format!("blobdrive:{spec}")), "{t}");
    assert!(
        stdout.contains(&format!(
            "TARGET={} ROOT=/ OPTS=helper=blobdrive",
            mnt.display()
        )),
        "{t}"
    );
    // The check for a loop device left behind looks at the right one.
    assert!(stdout.contains("loops_before=1\n"), "{t}");
    // Everything was on the blob when umount returned (read by another reader:
    // download + debugfs), the lease was free although the daemon's network went
    // down at once, and nothing is left on this machine.
    let want = std::fs::read_to_string(s.path("sums")).unwrap();
    let at_umount = files_in_image(&s.path("at-umount.raw"), &s, &["small", "big"]);
    assert_eq!(
        at_umount.replace("dumped-", ""),
        want,
        "on the blob when umount returned"
    );
    assert_eq!(lease_state(&spec), "available");
    assert_all_gone(&mnt, &spec);
}

/// `umount` of a drive in use is refused by `umount.blobdrive` with one line and
/// exit 32, and the drive stays mounted with its lease; `umount -l` detaches it,
/// and the daemon writes back and goes once the last user lets go. What is not
/// a drive blobdrive mounted (an empty directory, /proc, another filesystem,
/// lazily too) is refused in one line and left as it is; one with a stale entry
/// naming the helper too, the entry taken out, so that the next umount
/// unmounts it as umount would.
#[test]
fn umount_of_a_busy_drive_is_refused_and_a_lazy_one_finishes_when_let_go() {
    require_root();
    let spec = BD.new_drive("busyumount", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let other = s.path("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::create_dir(s.path("empty")).unwrap();
    let dc = s.path("disk-caches");
    common::util::private_dir(&dc);
    let out = s.in_namespace(&format!(
        r#"
mount -t blobdrive -o 'credentials={creds},mkfs=ext4' '{spec}' '{mnt}'
pid=
for r in "$BLOBDRIVE_RUN_DIR"/mounts/*.json; do grep -q '"{mnt}"' "$r" && pid="$(sed -n 's/.*"pid": \([0-9]*\).*/\1/p' "$r")"; done
echo kept > '{mnt}/kept'
(cd '{mnt}' && exec sleep 60) &
holder=$!
sleep 0.3
umount '{mnt}' 2>'{err}' && echo BUSY-UMOUNT-SUCCEEDED || echo "busy_rc=$?"
mountpoint -q '{mnt}' || echo NOT-MOUNTED-AFTER-REFUSAL
grep -q 'TARGET={mnt} .*helper=blobdrive' /run/mount/utab || echo ENTRY-GONE-AFTER-REFUSAL
lease="$(AZURE_STORAGE_CONNECTION_STRING="$CS" "$BD" lease status '{spec}' --json)"
grep -q '"leased"' <<<"$lease" || echo LEASE-NOT-HELD-AFTER-REFUSAL
umount -l '{mnt}'
mountpoint -q '{mnt}' && echo STILL-MOUNTED-AFTER-LAZY
kill "$holder"; wait "$holder" 2>/dev/null || true
for i in $(seq 1 300); do
    st="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' /proc/$pid/status 2>/dev/null || true)"
    [ -n "$st" ] && [ "$st" != Z ] || break
    sleep 0.1
done
[ -n "$st" ] && [ "$st" != Z ] && echo DAEMON-STILL-RUNNING
grep -q 'helper=blobdrive' /run/mount/utab && echo UTAB-ENTRY-LEFT
# What is not a drive blobdrive mounted is refused, one line, and left as it is:
# an empty directory, /proc, another filesystem (lazily too).
umount.blobdrive '{empty}' 2>'{notours}' || echo "empty_rc=$?"
[ -d '{empty}' ] || echo EMPTY-DIR-GONE
umount.blobdrive /proc 2>>'{notours}' || echo "proc_rc=$?"
mountpoint -q /proc || echo PROC-UNMOUNTED
mount -t tmpfs tmpfs '{other}'
umount.blobdrive -l '{other}' 2>>'{notours}' || echo "lazy_rc=$?"
mountpoint -q '{other}' || echo LAZY-UNMOUNTED-ANOTHER
# Another filesystem with an entry naming the helper left behind: refused too,
# the stale entry taken out, and a second umount unmounts it as umount would.
mid="$(awk '$5 == "{other}" {{ print $1 }}' /proc/self/mountinfo | tail -1)"
echo "ID=$mid SRC=tmpfs TARGET={other} ROOT=/ OPTS=helper=blobdrive" >> /run/mount/utab
umount '{other}' 2>'{stale}' || echo "stale_rc=$?"
mountpoint -q '{other}' || echo STALE-UNMOUNTED-AT-ONCE
grep -q 'TARGET={other}' /run/mount/utab && echo STALE-ENTRY-LEFT
umount '{other}' || echo "again_rc=$?"
mountpoint -q '{other}' && echo OTHER-STILL-MOUNTED
# Mode raw: the directory is the FUSE mount, and umount goes through the helper too;
# with a disk cache from the options, which that umount keeps for the next mount.
mount -t blobdrive -o 'credentials={creds},mode=raw,disk-cache={dc},disk-cache-size=8MiB' '{spec}' '{mnt}'
rpid=
for r in "$BLOBDRIVE_RUN_DIR"/mounts/*.json; do grep -q '"{mnt}"' "$r" && rpid="$(sed -n 's/.*"pid": \([0-9]*\).*/\1/p' "$r")"; done
grep -q 'TARGET={mnt} .*helper=blobdrive' /run/mount/utab || echo RAW-NOT-IN-UTAB
# Captured first, not piped: `grep -q` stops reading at its match, the writer then
# fails on the closed pipe, and with pipefail the pipeline fails although it matched.
stats="$("$BD" stats '{mnt}' --json)"
grep -q '"size_limit": 8388608' <<<"$stats" || echo RAW-NO-DISK-CACHE
umount '{mnt}'
ls '{dc}'/*/index >/dev/null 2>&1 || echo DISK-CACHE-NOT-KEPT
st="$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' /proc/$rpid/status 2>/dev/null || true)"
[ -n "$st" ] && [ "$st" != Z ] && echo RAW-DAEMON-RUNNING-AFTER-UMOUNT
lease="$(AZURE_STORAGE_CONNECTION_STRING="$CS" "$BD" lease status '{spec}' --json)"
grep -q '"available"' <<<"$lease" || echo RAW-LEASE-HELD-AFTER-UMOUNT
true
"#,
        creds = s.creds().display(),
        mnt = mnt.display(),
        other = other.display(),
        dc = dc.display(),
        err = s.path("busy.err").display(),
        empty = s.path("empty").display(),
        notours = s.path("notours.err").display(),
        stale = s.path("stale.err").display(),
    ));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    for bad in [
        "BUSY-UMOUNT-SUCCEEDED",
        "NOT-MOUNTED-AFTER-REFUSAL",
        "ENTRY-GONE-AFTER-REFUSAL",
        "LEASE-NOT-HELD-AFTER-REFUSAL",
        "STILL-MOUNTED-AFTER-LAZY",
        "DAEMON-STILL-RUNNING",
        "UTAB-ENTRY-LEFT",
        "EMPTY-DIR-GONE",
        "PROC-UNMOUNTED",
        "LAZY-UNMOUNTED-ANOTHER",
        "STALE-UNMOUNTED-AT-ONCE",
        "again_rc=",
        "OTHER-STILL-MOUNTED",
        "STALE-ENTRY-LEFT",
        "RAW-NOT-IN-UTAB",
        "RAW-DAEMON-RUNNING-AFTER-UMOUNT",
        "RAW-LEASE-HELD-AFTER-UMOUNT",
        "RAW-NO-DISK-CACHE",
        "DISK-CACHE-NOT-KEPT",
    ] {
        assert!(!stdout.contains(bad), "{bad}: {t}");
    }
    assert!(stdout.contains("busy_rc=32"), "{t}");
    let err = std::fs::read_to_string(s.path("busy.err")).unwrap();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("umount.blobdrive: ") && err.contains("busy"),
        "{err}"
    );
    // The process inside it is named, as for a raw mount's open disk file.
    assert!(err.contains("(sleep)"), "{err}");
    for rc in ["empty_rc=32", "proc_rc=32", "lazy_rc=32", "stale_rc=32"] {
        assert!(stdout.contains(rc), "{rc}: {t}");
    }
    let refused = std::fs::read_to_string(s.path("notours.err")).unwrap();
    let lines: Vec<&str> = refused.lines().collect();
    assert_eq!(lines.len(), 3, "a line each: {refused}");
    for l in lines {
        assert!(
            l.starts_with("umount.blobdrive: ")
                && l.contains("is not a drive mounted by blobdrive"),
            "{refused}"
        );
    }
    let stale = std::fs::read_to_string(s.path("stale.err")).unwrap();
    assert!(
        stale.contains("stale entry in /run/mount/utab") && stale.lines().count() == 1,
        "{stale}"
    );
    let kept = files_on_the_blob(&spec, &s, &["kept"]);
    let want = sh_ok("printf 'kept\n' | sha256sum");
    assert_eq!(kept.split(' ').next(), want.split(' ').next(), "{kept}");
    assert_all_gone(&mnt, &spec);
}

#[test]
fn bad_options_and_open_credentials_are_refused_leaving_nothing_behind() {
    require_root();
    let spec = BD.new_drive("badopts", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let helper = |opts: &str| -> Output {
        Command::new(s.helper())
            .args([&spec, mnt.to_str().unwrap(), "-o", opts])
            .env_remove("AZURE_STORAGE_CONNECTION_STRING")
            .env("BLOBDRIVE_RUN_DIR", BD.run_dir())
            .output()
            .unwrap()
    };
    let creds = format!("credentials={}", s.creds().display());
    let refused = |opts: &str, needle: &str| {
        let out = helper(opts);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{opts}: {}", text(&out));
        assert_eq!(err.lines().count(), 1, "{opts}: one line, not: {err}");
        assert!(
            err.starts_with("mount.blobdrive: ") && err.contains(needle),
            "{opts}: expected '{needle}' in: {err}"
        );
        assert_all_gone(&mnt, &spec);
        err
    };
    refused(&format!("rw,{creds},bogus"), "'bogus'");
    refused(&format!("rw,{creds},compress=zstd"), "'compress=zstd'");
    refused(&format!("{creds},mode=disk"), "mode=disk");
    refused(&format!("{creds},cache-size=1GB"), "cache-size=1GB");
    refused(&format!("ro,{creds},mkfs=ext4"), "writable");
    refused(&format!("{creds},user"), "option user");
    // An option given twice, or contradicted: which one would count is not
    // what the line's reader sees.
    refused(
        &format!("{creds},rw,ro"),
        "options rw and ro contradict each other",
    );
    refused(
        &format!("{creds},metrics=127.0.0.1:9101,metrics=127.0.0.1:9102"),
        "option metrics is given twice",
    );
    refused(
        &format!("{creds},mode=fs,mode=raw"),
        "option mode is given twice",
    );
    refused(
        &format!("{creds},cache-size=64MiB,cache-size=128MiB"),
        "option cache-size is given twice",
    );
    // The worker's user: a bad fstab option (1), named as the line says it.
    refused(
        &format!("{creds},run-as=nosuchuser"),
        "option run-as=nosuchuser: there is no user nosuchuser",
    );
    refused(
        &format!("{creds},run-as=root"),
        "option run-as=root: that is root",
    );
    // The credentials file: readable by others, writable by the group, not root's.
    for mode in [0o644, 0o620, 0o604] {
        std::fs::set_permissions(s.creds(), std::fs::Permissions::from_mode(mode)).unwrap();
        let err = refused(&creds, "group or others");
        assert!(!err.contains(&DEV_KEY[..12]), "{err}");
    }
    std::fs::set_permissions(s.creds(), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(s.creds(), Some(65534), None).unwrap();
    refused(&creds, "not root");
    std::os::unix::fs::chown(s.creds(), Some(0), None).unwrap();
    // A line that is not KEY=VALUE names its line, never its text.
    s.write_credentials(&format!("{DEV_KEY}\n"), 0o600);
    let err = refused(&creds, "line 1: ");
    assert!(!err.contains(&DEV_KEY[..12]), "{err}");
    // -f checks and mounts nothing.
    s.write_credentials(
        &format!(
            "AZURE_STORAGE_CONNECTION_STRING={}\n",
            Azurite::shared().connection_string()
        ),
        0o600,
    );
    let out = Command::new(s.helper())
        .args([&spec, mnt.to_str().unwrap(), "-f", "-o", &creds])
        .env("BLOBDRIVE_RUN_DIR", BD.run_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_all_gone(&mnt, &spec);
    // A mount that fails (no filesystem on the blank disk) is mount(8)'s 32 and is
    // undone. Through util-linux's mount, which passes the helper's status and
    // message on.
    let out = s.in_namespace(&format!(
        "mount -t blobdrive -o '{creds}' '{spec}' '{}'",
        mnt.display()
    ));
    assert_eq!(out.status.code(), Some(32), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no filesystem"), "{err}");
    let out = s.in_namespace(&format!(
        "mount -t blobdrive -o '{creds},bogus' '{spec}' '{}'",
        mnt.display()
    ));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'bogus'"),
        "{}",
        text(&out)
    );
    assert_all_gone(&mnt, &spec);
}

/// An fstab line that contradicts itself is refused through mount(8) too, which
/// passes the helper only the last of `rw,ro`: the helper reads the line as
/// written (from the fstab libmount reads, `LIBMOUNT_FSTAB` here) and names it.
/// A repeated option, which mount(8) passes as it is, the same, and a flag
/// given twice, which it passes once; and so a run-as= naming no user, as a
/// bad option (1), not a failed mount (32).
#[test]
fn an_fstab_line_that_contradicts_itself_is_refused_through_mount() {
    require_root();
    let spec = BD.new_drive("fstabtwice", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let line = |opts: &str| {
        format!(
            "{spec}  {}  blobdrive  _netdev,credentials={},{opts}  0 0\n",
            mnt.display(),
            s.creds().display()
        )
    };
    for (n, (opts, needle)) in [
        ("rw,noatime,ro", "options rw and ro contradict each other"),
        (
            "metrics=127.0.0.1:9101,metrics=127.0.0.1:9102",
            "option metrics is given twice",
        ),
        ("mode=raw,run-as=nosuchuser", "option run-as=nosuchuser"),
        // A flag twice, which mount(8) passes once: read from the line too.
        ("noatime,noatime", "option noatime is given twice"),
        ("ro,mode=raw,ro", "option ro is given twice"),
    ]
    .into_iter()
    .enumerate()
    {
        let fstab = s.path(&format!("fstab{n}"));
        std::fs::write(&fstab, format!("# a test fstab\n{}", line(opts))).unwrap();
        let out = s.in_namespace(&format!(
            "LIBMOUNT_FSTAB='{}' mount '{}'",
            fstab.display(),
            mnt.display()
        ));
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{opts}: {t}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{opts}: one line: {t}");
        assert!(err.contains(needle), "{opts}: expected '{needle}': {t}");
        if opts.contains("rw,") {
            assert!(err.contains(&format!("{} line 2", fstab.display())), "{t}");
        }
        assert_all_gone(&mnt, &spec);
    }
}

/// `mount -a` as a boot runs it, and again, as an administrator does after
/// adding a line: a blobdrive line already mounted is not mounted twice and is
/// no failure (mount(8) cannot tell it is mounted: the kernel shows the loop
/// device as the source, not the line's SPEC); `mkfs=` says nothing once the
/// disk has the filesystem it made; and the same drive asked for at a second
/// path names where this machine has it.
#[test]
fn mount_a_again_mounts_nothing_twice_and_says_nothing() {
    require_root();
    let spec = BD.new_drive("mountagain", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let other = s.path("other");
    std::fs::create_dir(&other).unwrap();
    let line = |dir: &Path| {
        format!(
            "{spec}  {}  blobdrive  _netdev,nofail,credentials={},mkfs=ext4  0 0\n",
            dir.display(),
            s.creds().display()
        )
    };
    let fstab = s.path("fstab");
    std::fs::write(&fstab, line(&mnt)).unwrap();
    let second = s.path("fstab.second");
    std::fs::write(&second, line(&other)).unwrap();
    let out = s.in_namespace(&format!(
        r#"
mount -a -T '{fstab}'
echo hello > '{mnt}/hello'
umount '{mnt}'
# The next boot: the filesystem mkfs= made is there.
mount -a -T '{fstab}' 2>'{boot}'
mount -a -T '{fstab}' 2>'{again}' || echo "again_rc=$?"
findmnt -n -o FSTYPE '{mnt}' | sed 's/^/fs=/'
cat '{mnt}/hello'
mount -T '{second}' '{other}' 2>'{elsewhere}' || echo "elsewhere_rc=$?"
mountpoint -q '{other}' && echo MOUNTED-TWICE
umount '{mnt}'
"#,
        fstab = fstab.display(),
        second = second.display(),
        mnt = mnt.display(),
        other = other.display(),
        boot = s.path("boot.err").display(),
        again = s.path("again.err").display(),
        elsewhere = s.path("elsewhere.err").display(),
    ));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let said = |f: &str| std::fs::read_to_string(s.path(f)).unwrap();
    assert_eq!(
        said("boot.err"),
        "",
        "the mount at the next boot said something"
    );
    assert!(
        !stdout.contains("again_rc="),
        "mount -a again: {t}{}",
        said("again.err")
    );
    assert_eq!(said("again.err"), "", "mount -a again said something");
    assert!(stdout.contains("fs=ext4\nhello\n"), "{t}");
    assert!(!stdout.contains("MOUNTED-TWICE"), "{t}");
    assert!(stdout.contains("elsewhere_rc=32"), "{t}");
    let err = said("elsewhere.err");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "{spec} is already mounted writable on this machine, at {}",
            mnt.display()
        )),
        "{err}"
    );
    assert_all_gone(&mnt, &spec);
    assert_all_gone(&other, &spec);
}

/// What the service manager heard, each message with whether the mountpoint had
/// its filesystem at the moment it arrived. Every message must come from `main`,
/// the process the service manager started: a unit's `NotifyAccess=main` takes
/// no other's (the worker of a mount is a child of it). The sender is the
/// kernel's word (`SCM_CREDENTIALS`, `SO_PASSCRED` set on `sock`).
fn next_message(
    sock: &UnixDatagram,
    mnt: &Path,
    limit: Duration,
    main: u32,
) -> Option<(String, bool)> {
    use std::os::fd::AsRawFd;
    sock.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    let mut control = [0u8; 64];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len();
    // SAFETY: a valid socket and a msghdr whose buffers are ours.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return None;
    }
    let mut sender = None;
    // SAFETY: the kernel filled `control` with `msg_controllen` bytes of cmsgs.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                sender = Some(cred.pid as u32);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let text = String::from_utf8_lossy(&buf[..n as usize]).to_string();
    assert_eq!(
        sender,
        Some(main),
        "{text:?} came from pid {sender:?}, not the unit's main process {main}"
    );
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap()) && l.contains(" - ext4 "));
    Some((text, mounted))
}

/// Has `sock` receive each sender's credentials with its messages.
fn pass_credentials(sock: &UnixDatagram) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to an int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_PASSCRED: {}", std::io::Error::last_os_error());
}

#[test]
fn foreground_mount_tells_systemd_ready_status_stopping_and_sigterm_keeps_everything() {
    require_root();
    let spec = BD.new_drive("notify", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let sock_path = s.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    pass_credentials(&sock);
    let mut child = Command::new(bin())
        .args([
            "mount",
            &spec,
            mnt.to_str().unwrap(),
            "--mkfs",
            "ext4",
            "--foreground",
        ])
        .arg("--credentials")
        .arg(s.creds())
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .env("BLOBDRIVE_RUN_DIR", BD.run_dir())
        .env("NOTIFY_SOCKET", &sock_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stop = |child: &mut std::process::Child| {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let _ = child.wait();
    };
    let Some((first, mounted)) = next_message(&sock, &mnt, Duration::from_secs(60), pid) else {
        stop(&mut child);
        panic!("no READY=1 within 60 s");
    };
    assert!(
        first.lines().any(|l| l == "READY=1"),
        "first message: {first:?}"
    );
    assert!(
        mounted,
        "READY=1 came before {} had its filesystem",
        mnt.display()
    );
    // And it serves: a file can be written there at once.
    std::fs::write(mnt.join("probe"), b"x").unwrap();
    assert!(
        first.contains(&format!("STATUS=serving {spec}")),
        "{first:?}"
    );
    // The secret went to the daemon (this very process) by its environment only.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(&DEV_KEY[..20]));
    // Unsynced data, then a STATUS line saying there is some (or that it is out).
    sh_ok(&format!(
        "head -c 5M /dev/urandom > '{0}/data' && sha256sum '{0}/data' > '{1}'",
        mnt.display(),
        s.path("sum").display()
    ));
    let deadline = Instant::now() + Duration::from_secs(12);
    let mut status = None;
    while Instant::now() < deadline {
        match next_message(&sock, &mnt, Duration::from_secs(1), pid) {
            Some((m, _)) if m.starts_with("STATUS=") => {
                status = Some(m);
                break;
            }
            Some((m, _)) => panic!("unexpected message while serving: {m:?}"),
            None => {}
        }
    }
    let status = status.unwrap_or_else(|| {
        stop(&mut child);
        panic!("no STATUS= within 12 s")
    });
    assert!(
        status.contains("not yet on the blob") && status.contains("lease held"),
        "{status:?}"
    );
    // SIGTERM: STOPPING=1 first, then a clean exit with everything kept.
    sh_ok(&format!("kill -TERM {pid}"));
    let Some((stopping, _)) = next_message(&sock, &mnt, Duration::from_secs(10), pid) else {
        stop(&mut child);
        panic!("no STOPPING=1 after SIGTERM");
    };
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = wait_for_some(
        "the foreground daemon to exit after SIGTERM",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || child.try_wait().unwrap(),
    );
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "exit {status:?}: {err}");
    assert!(!err.contains(&DEV_KEY[..20]), "the key in the log: {err}");
    assert_eq!(lease_state(&spec), "available");
    let want = std::fs::read_to_string(s.path("sum")).unwrap();
    let want_hash = want.split_whitespace().next().unwrap();
    let got = files_on_the_blob(&spec, &s, &["data"]);
    assert!(got.starts_with(want_hash), "blob has {got}, wrote {want}");
    assert_all_gone(&mnt, &spec);
}

#[test]
fn block_and_raw_mounts_outlive_their_users_closing_the_disk() {
    require_root();
    let spec = BD.new_drive("reopen", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let mp = mnt.to_str().unwrap();
    for mode in ["block", "raw"] {
        let shown = BD.ok(&["mount", &spec, mp, "--mode", mode]);
        let target = shown.trim().to_string();
        let pid = daemon_pid(&mnt).expect("mounted");
        // Open, write, close, several times over: the user is done with it for
        // now, not for good.
        for i in 0..3 {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .unwrap();
            f.write_all(&[i as u8; 4096]).unwrap();
            drop(f);
            std::thread::sleep(Duration::from_millis(1500));
        }
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "{mode}: the daemon stopped when {target} was closed"
        );
        let first = std::fs::read(&target)
            .map(|b| b[0])
            .unwrap_or_else(|e| panic!("{mode}: {target}: {e}"));
        assert_eq!(first, 2);
        BD.ok(&["unmount", mp]);
        assert_all_gone(&mnt, &spec);
    }
}

#[test]
fn the_unit_template_runs_the_foreground_daemon_with_credentials_outside_argv() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/blobdrive@.service"
    ))
    .unwrap();
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert!(
        exec.contains(
            "mount ${BLOB} %f --foreground --credentials ${CREDENTIALS_DIRECTORY}/account"
        ),
        "{exec}"
    );
    for line in [
        "Type=notify",
        "KillMode=mixed",
        "After=network-online.target",
        "Wants=network-online.target",
        "LoadCredential=account:/etc/blobdrive/%i.credentials",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} missing");
    }
}

/// systemd sends SIGTERM once; a drive that is busy then comes down as soon as it
/// is let go, instead of waiting for a SIGKILL that would lose what is cached.
#[test]
fn sigterm_while_busy_takes_the_drive_down_once_it_is_let_go() {
    require_root();
    let spec = BD.new_drive("termbusy", "64MiB");
    let s = Scratch::new();
    let mnt = s.mnt();
    let mp = mnt.to_str().unwrap();
    BD.ok(&["mount", &spec, mp, "--mkfs", "ext4"]);
    let pid = daemon_pid(&mnt).expect("mounted");
    sh_ok(&format!(
        "head -c 3M /dev/urandom > '{mp}/f' && sha256sum '{mp}/f' | cut -d' ' -f1 > '{}'",
        s.path("sum").display()
    ));
    let mut holder = Command::new("sleep")
        .arg("60")
        .current_dir(&mnt)
        .spawn()
        .unwrap();
    sh_ok(&format!("kill -TERM {pid}"));
    std::thread::sleep(Duration::from_secs(3));
    let alive = Path::new(&format!("/proc/{pid}")).exists();
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(mp);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        alive && mounted,
        "a busy drive must stay up after SIGTERM (alive {alive}, mounted {mounted})"
    );
    wait_for_exit(
        pid.into(),
        "the daemon to end once the drive was let go",
        Duration::from_secs(30),
    );
    assert_all_gone(&mnt, &spec);
    let want = std::fs::read_to_string(s.path("sum")).unwrap();
    let got = files_on_the_blob(&spec, &s, &["f"]);
    assert!(got.starts_with(want.trim()), "blob has {got}, wrote {want}");
}
