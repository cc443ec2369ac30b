//! The Debian package as an operator meets it: `scripts/package.sh` builds it
//! from this test build's binary and lintian finds no error in it; `dpkg -i`
//! installs it; the manual pages, the bash completion, the helpers, the unit and
//! the system user (made by the package: the test takes it out of the overlaid
//! /etc first) are where they belong; an fstab line mounts a drive through
//! the installed `mount.blobdrive` and a plain `umount` takes it down through
//! `umount.blobdrive`; `dpkg -r` and `dpkg --purge` leave nothing of it.
//!
//! Installing into this machine for real would race the other test binaries
//! (scripts/test.sh runs them side by side: a `umount.blobdrive` appearing in
//! /sbin changes what their plain `umount` does) and clash with a blobdrive put
//! in place by scripts/install.sh. So dpkg runs in a private mount namespace
//! (`unshare -m`) in which /usr, /etc and /var are overlays whose writes go to a
//! tmpfs: dpkg, its database, the maintainer scripts (adduser) and man-db all
//! work on what looks like the real system, nobody else sees it, and it vanishes
//! with the namespace however the test ends. The purge at the end is still
//! checked, and a guard unmounts the drive through its daemon's control socket
//! if the test fails with it mounted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::bd::Harness;
use common::mount::{cleanup_unmount, require_root};
use common::util::{bash_completion_command, json, output_text as text};

const BD: Harness = Harness::new("package-run");

/// Unmounts the drive at its mountpoint through the daemon's control socket
/// (which reaches a daemon in another mount namespace) if it is still mounted
/// when the test ends.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let id = blobdrive::mount::record::id_for(&self.0);
        if BD.run_dir().join(format!("mounts/{id}.json")).exists() {
            let _ = BD.cmd(&cleanup_unmount(self.0.to_str().unwrap())).output();
        }
    }
}

/// Builds the package from the binary under test into `out` with lintian's
/// check; returns the package's path and lintian's tags (`E:`/`W:` lines).
fn build_package(out: &Path) -> (PathBuf, Vec<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = Command::new(root.join("scripts/package.sh"))
        .args(["--binary", env!("CARGO_BIN_EXE_blobdrive"), "--lintian"])
        .arg("--out")
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/package.sh");
    let t = text(&built);
    assert!(
        built.status.success(),
        "package.sh (or lintian) failed: {t}"
    );
    let tags: Vec<String> = String::from_utf8_lossy(&built.stderr)
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .map(String::from)
        .collect();
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_string();
    (PathBuf::from(deb), tags)
}

/// In a private mount namespace: /usr, /etc and /var overlaid onto a tmpfs under
/// `scratch`, libmount's /run/mount private too, then `script` with bash. A
/// purge on the way out, whatever happened.
fn in_overlaid_system(scratch: &Path, script: &str) -> Output {
    let prologue = format!(
        r#"set -euo pipefail
ov='{ov}'
mkdir -p "$ov"
mount -t tmpfs -o mode=0700 blobdrive-package-test "$ov"
for d in usr etc var; do
    mkdir -p "$ov/$d.upper" "$ov/$d.work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$ov/$d.upper,workdir=$ov/$d.work" "/$d"
done
mount -t tmpfs -o mode=0755 tmpfs /run/mount 2>/dev/null || {{ mkdir -p /run/mount && mount -t tmpfs -o mode=0755 tmpfs /run/mount; }}
# The system's run directory, which the package's purge cleans, private too:
# other tests' drives are mounted in the real one meanwhile.
mkdir -p /run/blobdrive && mount -t tmpfs -o mode=0700 tmpfs /run/blobdrive
export BLOBDRIVE_RUN_DIR='{run}'
export DEBIAN_FRONTEND=noninteractive
trap 'dpkg --purge blobdrive >/dev/null 2>&1 || true' EXIT
"#,
        ov = scratch.join("overlay").display(),
        run = BD.run_dir().display(),
    );
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "bash", "-c"])
        .arg(format!("{prologue}{script}"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .stdin(Stdio::null())
        .output()
        .expect("run unshare")
}

/// A drive, the credentials file for it and an fstab line mounting it at `mnt`
/// in `s`: the drive's name and the fstab's path.
fn drive_in_fstab(s: &Path, mnt: &Path) -> (String, PathBuf) {
    let spec = BD.new_drive("package", "64MiB");
    std::fs::create_dir(mnt).unwrap();
    let creds = s.join("acct.env");
    std::fs::write(
        &creds,
        format!("AZURE_STORAGE_CONNECTION_STRING={}\n", BD.cs()),
    )
    .unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let fstab = s.join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{spec}  {}  blobdrive  _netdev,nofail,credentials={},mkfs=ext4,cache-size=64MiB  0 0\n",
            mnt.display(),
            creds.display()
        ),
    )
    .unwrap();
    (spec, fstab)
}

/// The operator's session, in bash: install, look around, mount from the fstab,
/// try to remove while mounted, umount, remove, purge. It prints what it finds;
/// the test judges it. `files` receives `dpkg -L`'s list.
fn session(deb: &Path, files: &Path, fstab: &Path, mnt: &Path) -> String {
    let complete = bash_completion_command(
        Path::new("/usr/share/bash-completion/completions/blobdrive"),
        &["blobdrive", "m"],
    );
    format!(
        r#"
# A machine without the user, so that it is the package that makes it (the
# tests' own setup made it on this one).
for f in /etc/passwd /etc/shadow /etc/group /etc/gshadow; do
    if [ -e "$f" ]; then sed -i '/^blobdrive:/d' "$f"; fi
done
getent passwd blobdrive >/dev/null && echo USER-BEFORE
dpkg -i '{deb}' >/dev/null
echo "status=$(dpkg-query -W -f='${{Status}}' blobdrive)"
echo "man=$(man -w blobdrive) $(man -w mount.blobdrive) $(man -w umount.blobdrive) $(man -w blobdrive-mount)"
echo "complete=$({complete} | tr '\n' ' ')"
echo "helpers=$(readlink /sbin/mount.blobdrive) $(readlink /sbin/umount.blobdrive)"
grep -q '^ExecStart=/usr/bin/blobdrive mount ' /usr/lib/systemd/system/blobdrive@.service && echo UNIT-OK
getent passwd blobdrive >/dev/null && echo USER-MADE
echo "user-shell=$(getent passwd blobdrive | cut -d: -f7)"
echo "etc=$(stat -c '%a %U' /etc/blobdrive)"
[ -s /usr/share/zsh/vendor-completions/_blobdrive ] && [ -s /usr/share/fish/vendor_completions.d/blobdrive.fish ] && echo ZSH-FISH-OK
dpkg -L blobdrive > '{files}'
mount -T '{fstab}' '{mnt}'
pid="$(/usr/bin/blobdrive list --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')"
echo "exe=$(readlink /proc/$pid/exe)"
echo "fs=$(findmnt -n -o FSTYPE '{mnt}')"
grep -q 'helper=blobdrive' /run/mount/utab && echo UTAB-NAMES-HELPER
echo hello > '{mnt}/hello'
dpkg -r blobdrive >/dev/null 2>&1 && echo REMOVED-WHILE-MOUNTED
umount '{mnt}'
[ -d "/proc/$pid" ] && [ "$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' /proc/$pid/status)" != Z ] && echo DAEMON-LEFT
findmnt '{mnt}' >/dev/null && echo STILL-MOUNTED
dpkg -r blobdrive >/dev/null
echo "after-remove=$(dpkg-query -W -f='${{Status}}' blobdrive)"
for f in /usr/bin/blobdrive /sbin/mount.blobdrive /sbin/umount.blobdrive /usr/lib/systemd/system/blobdrive@.service; do
    [ -e "$f" ] || [ -L "$f" ] && echo "LEFT-AFTER-REMOVE $f"
done
# What a mount of a blobdrive installed another way keeps in the run directory
# (its record), and an old mount's log: the purge takes the log only.
mkdir -p /run/blobdrive/mounts
echo '{{}}' > /run/blobdrive/mounts/live.json
echo old > /run/blobdrive/mounts/old.log
dpkg --purge blobdrive >/dev/null
[ -e /run/blobdrive/mounts/live.json ] || echo "PURGE-TOOK-A-LIVE-RECORD"
[ -e /run/blobdrive/mounts/old.log ] && echo "LEFT-AFTER-PURGE /run/blobdrive/mounts/old.log"
echo "after-purge=$(dpkg-query -W -f='${{Status}}' blobdrive 2>/dev/null || echo gone)"
while read -r f; do
    [ -d "$f" ] && continue
    [ -e "$f" ] || [ -L "$f" ] && echo "LEFT-AFTER-PURGE $f"
done < '{files}'
[ -e /etc/blobdrive ] && echo "LEFT-AFTER-PURGE /etc/blobdrive"
getent passwd blobdrive >/dev/null && echo USER-KEPT
true
"#,
        deb = deb.display(),
        files = files.display(),
        fstab = fstab.display(),
        mnt = mnt.display(),
    )
}

/// The whole life of the package on a machine, from build to purge.
#[test]
fn the_package_installs_mounts_from_fstab_unmounts_and_purges_to_nothing() {
    require_root();
    let start = Instant::now();
    let scratch = tempfile::Builder::new()
        .prefix("blobdrive-package.")
        .tempdir()
        .unwrap();
    let s = scratch.path();
    let (deb, tags) = build_package(&s.join("out"));
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with(&format!("blobdrive_{}-", env!("CARGO_PKG_VERSION")))
            && name.ends_with(".deb"),
        "{name}"
    );
    assert!(!tags.iter().any(|t| t.starts_with("E: ")), "{tags:?}");
    eprintln!("lintian: {} warnings: {tags:#?}", tags.len());
    let built = start.elapsed();

    let mnt = s.join("mnt");
    let (spec, fstab) = drive_in_fstab(s, &mnt);
    let _unmount = Unmount(mnt.clone());
    let out = in_overlaid_system(s, &session(&deb, &s.join("files"), &fstab, &mnt));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let o = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(o.contains("status=install ok installed"), "{t}");
    for page in [
        "blobdrive.8.gz",
        "mount.blobdrive.8.gz",
        "umount.blobdrive.8.gz",
        "blobdrive-mount.8.gz",
    ] {
        assert!(
            o.contains(&format!("/usr/share/man/man8/{page}")),
            "{page}: {t}"
        );
    }
    let completed = o
        .lines()
        .find_map(|l| l.strip_prefix("complete="))
        .unwrap_or("");
    assert!(completed.split(' ').any(|w| w == "mount"), "{t}");
    assert!(
        o.contains("helpers=/usr/bin/blobdrive /usr/bin/blobdrive"),
        "{t}"
    );
    for want in [
        "UNIT-OK",
        "USER-MADE",
        "etc=700 root",
        "ZSH-FISH-OK",
        "UTAB-NAMES-HELPER",
        "fs=ext4",
    ] {
        assert!(o.contains(want), "{want}: {t}");
    }
    // The daemon is the installed program, started by the installed helper.
    assert!(o.contains("exe=/usr/bin/blobdrive\n"), "{t}");
    // The user a mount daemon's network-facing part runs as, made by the
    // package on a machine without it, with no shell.
    assert!(o.contains("user-shell=/usr/sbin/nologin\n"), "{t}");
    for bad in [
        "USER-BEFORE",
        "REMOVED-WHILE-MOUNTED",
        "DAEMON-LEFT",
        "STILL-MOUNTED",
        "LEFT-AFTER-",
        "PURGE-TOOK-A-LIVE-RECORD",
    ] {
        assert!(!o.contains(bad), "{bad}: {t}");
    }
    assert!(o.contains("after-remove=deinstall ok config-files"), "{t}");
    assert!(
        o.contains("after-purge=gone") || o.contains("after-purge=unknown ok not-installed"),
        "{t}"
    );
    // Debian keeps system users on purge (files with its uid may remain).
    assert!(o.contains("USER-KEPT"), "{t}");
    // The plain umount put everything on the blob and freed the lease.
    let lease = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(lease["state"], "available", "{t}");
    eprintln!(
        "package built and checked in {:.0?}, installed, used and purged in {:.0?}",
        built,
        start.elapsed() - built
    );
}
