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
//! (tests/common/namespace.rs: the copies of other tests' drives let go of) in
//! which /usr, /etc and /var are overlays whose writes go to a
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
use common::namespace::in_mount_namespace;
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
mkdir -p -m 0700 /run/blobdrive && mount -t tmpfs -o mode=0700 tmpfs /run/blobdrive
export BLOBDRIVE_RUN_DIR='{run}'
export DEBIAN_FRONTEND=noninteractive
trap 'dpkg --purge blobdrive >/dev/null 2>&1 || true' EXIT
"#,
        ov = scratch.join("overlay").display(),
        run = BD.run_dir().display(),
    );
    in_mount_namespace("bash")
        .arg("-c")
        .arg(format!("{prologue}{script}"))
        .env_remove("AZURE_STORAGE_CONNECTION_STRING")
        .stdin(Stdio::null())
        .output()
        .expect("run bash in a mount namespace of its own")
}

/// Where the session puts the account, as an administrator does: the
/// credentials file the fstab lines name, in the directory the package made.
const CREDS: &str = "/etc/blobdrive/acct.env";

/// Two drives, the credentials file for them (`s/acct.env`, which the session
/// puts at [`CREDS`]) and an fstab with a line for each: the first, at `mnt`,
/// made ext4 by its line; the second, at `s/blank`, a blank disk whose line
/// asks for no filesystem, so its mount fails and leaves its log. The drives'
/// names and the fstab's path.
fn drives_in_fstab(s: &Path, mnt: &Path) -> (String, String, PathBuf) {
    let spec = BD.new_drive("package", "64MiB");
    let blank = BD.new_drive("packageblank", "64MiB");
    std::fs::create_dir(mnt).unwrap();
    std::fs::create_dir(s.join("blank")).unwrap();
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
            "{spec}  {}  blobdrive  _netdev,nofail,credentials={CREDS},mkfs=ext4,cache-size=64MiB  0 0\n\
             {blank}  {}  blobdrive  _netdev,nofail,credentials={CREDS},cache-size=64MiB  0 0\n",
            mnt.display(),
            s.join("blank").display(),
        ),
    )
    .unwrap();
    (spec, blank, fstab)
}

/// The operator's session, in bash: install, look around, put the account in
/// /etc/blobdrive, mount from the fstab (one line failing), try to remove while
/// mounted, umount, remove, purge. It prints what it finds; the test judges it.
/// `s` receives `dpkg -L`'s list (`files`) and what dpkg said (`*.err`).
fn session(deb: &Path, s: &Path, fstab: &Path, mnt: &Path) -> String {
    let complete = bash_completion_command(
        Path::new("/usr/share/bash-completion/completions/blobdrive"),
        &["blobdrive", "m"],
    );
    format!(
        r#"
# A machine without the user and its range of ids, so that it is the package
# that makes them (the tests' own setup made them on this one).
for f in /etc/passwd /etc/shadow /etc/group /etc/gshadow /etc/subuid /etc/subgid; do
    if [ -e "$f" ]; then sed -i '/^blobdrive:/d' "$f"; fi
done
getent passwd blobdrive >/dev/null && echo USER-BEFORE
dpkg -i '{deb}' >/dev/null
echo "status=$(dpkg-query -W -f='${{Status}}' blobdrive)"
echo "man=$(man -w blobdrive) $(man -w mount.blobdrive) $(man -w umount.blobdrive) $(man -w blobdrive-mount)"
echo "complete=$({complete} | tr '\n' ' ')"
echo "helpers=$(readlink -f /sbin/mount.blobdrive) $(readlink -f /sbin/umount.blobdrive)"
# Debian's place for them, which dpkg knows them by (on this merged-/usr system
# /sbin is /usr/sbin: no link of the package's own is made there).
dpkg -S /usr/sbin/mount.blobdrive /usr/sbin/umount.blobdrive >/dev/null && echo HELPERS-IN-USR-SBIN
[ -L /usr/sbin/mount.blobdrive ] && [ "$(readlink /usr/sbin/mount.blobdrive)" = ../bin/blobdrive ] && echo HELPER-LINK-RELATIVE
# The unit enabled for a drive, as the manual's boot.md does it.
systemctl enable blobdrive@data.service >/dev/null 2>&1 || echo "ENABLE-FAILED"
[ -L /etc/systemd/system/remote-fs.target.wants/blobdrive@data.service ] && echo UNIT-ENABLED
grep -q '^ExecStart=/usr/bin/blobdrive mount ' /usr/lib/systemd/system/blobdrive@.service && echo UNIT-OK
getent passwd blobdrive >/dev/null && echo USER-MADE
echo "user-shell=$(getent passwd blobdrive | cut -d: -f7)"
echo "subuid=$(grep '^blobdrive:' /etc/subuid | tr '\n' ' ')"
echo "subgid=$(grep '^blobdrive:' /etc/subgid | tr '\n' ' ')"
echo "etc=$(stat -c '%a %U' /etc/blobdrive)"
[ -s /usr/share/zsh/vendor-completions/_blobdrive ] && [ -s /usr/share/fish/vendor_completions.d/blobdrive.fish ] && echo ZSH-FISH-OK
# The manual the pages point to is there: every page of it they name.
[ -s /usr/share/doc/blobdrive/README.md ] && [ -s /usr/share/doc/blobdrive/docs/boot.md ] && echo MANUAL-SHIPPED
for f in $(zcat /usr/share/man/man8/*blobdrive*.8.gz | sed 's/\\f[BIRP]//g; s/\\-/-/g' | grep -o '[A-Za-z][A-Za-z-]*\.md' | sort -u); do
    [ -e "/usr/share/doc/blobdrive/docs/$f" ] || [ -e "/usr/share/doc/blobdrive/$f" ] || echo "PAGE-NAMES-MISSING-DOC $f"
done
dpkg -L blobdrive > '{s}/files'
install -m 600 '{s}/acct.env' '{creds}'
mount -T '{fstab}' '{mnt}'
pid="$(/usr/bin/blobdrive list --json | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')"
echo "exe=$(readlink /proc/$pid/exe)"
echo "worker-uid=$(sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' /proc/$(pgrep -P $pid | head -n1)/status)"
echo "fs=$(findmnt -n -o FSTYPE '{mnt}')"
grep -q 'helper=blobdrive' /run/mount/utab && echo UTAB-NAMES-HELPER
echo hello > '{mnt}/hello'
# A line that fails (a blank disk, no mkfs=): its log is kept, to be read,
# in the system's run directory.
BLOBDRIVE_RUN_DIR=/run/blobdrive mount -T '{fstab}' '{s}/blank' 2>/dev/null && echo BLANK-MOUNTED
failed_log="$(grep -l '^== blobdrive .* (/usr/bin/blobdrive): mounting ' /run/blobdrive/mounts/*.log || true)"
[ -n "$failed_log" ] && echo FAILED-MOUNT-LOG-KEPT
# A CSI node plugin ran here too: `blobdrive list` shows its line after the
# mounts, which the refusal below must not mistake for one.
( export AZURE_STORAGE_CONNECTION_STRING="$(sed -n 's/^AZURE_STORAGE_CONNECTION_STRING=//p' '{creds}')"; exec /usr/bin/blobdrive csi --role node --node-id node-a --container csi-vols --cache-budget 1GiB --endpoint 'unix://{s}/csi.sock' ) >/dev/null 2>'{s}/csi.err' &
csi=$!
for i in $(seq 1 100); do /usr/bin/blobdrive list | grep -q '^CSI node node-a:' && break; sleep 0.1; done
kill "$csi" 2>/dev/null || true; wait "$csi" 2>/dev/null || true
/usr/bin/blobdrive list | grep -q '^CSI node node-a:' && echo CSI-NODE-LISTED || sed 's/^/csi: /' '{s}/csi.err'
dpkg -r blobdrive >/dev/null 2>'{s}/remove.err' && echo REMOVED-WHILE-MOUNTED
umount '{mnt}'
[ -d "/proc/$pid" ] && [ "$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' /proc/$pid/status)" != Z ] && echo DAEMON-LEFT
findmnt '{mnt}' >/dev/null && echo STILL-MOUNTED
dpkg -r blobdrive >/dev/null
echo "after-remove=$(dpkg-query -W -f='${{Status}}' blobdrive)"
for f in /usr/bin/blobdrive /sbin/mount.blobdrive /sbin/umount.blobdrive /usr/lib/systemd/system/blobdrive@.service; do
    [ -e "$f" ] || [ -L "$f" ] && echo "LEFT-AFTER-REMOVE $f"
done
# What a live mount keeps in the run directory (its record, and its log, by
# this package's program), and a failed mount's log written by a blobdrive
# installed another way: the purge takes neither, only the failed mount's log
# this package's program wrote.
d=/run/blobdrive/mounts
mkdir -p $d
echo '{{}}' > $d/live.json
echo '== blobdrive 0.1.0 (/usr/bin/blobdrive): mounting c/live.vhd at /live' > $d/live.log
echo '== blobdrive 0.1.0 (/usr/local/bin/blobdrive): mounting c/x.vhd at /x' > $d/other.log
dpkg --purge blobdrive >/dev/null 2>'{s}/purge.err'
[ -e $d/live.json ] || echo "PURGE-TOOK-A-LIVE-RECORD"
[ -e $d/live.log ] || echo "PURGE-TOOK-A-LIVE-LOG"
[ -e $d/other.log ] || echo "PURGE-TOOK-ANOTHER-INSTALL-S-LOG"
[ -e "$failed_log" ] && echo "LEFT-AFTER-PURGE $failed_log"
# Links too: the unit's enablement, any link to what the package had.
for f in $(find /etc /usr /sbin/ -lname '*blobdrive*' 2>/dev/null); do echo "LEFT-AFTER-PURGE $f"; done
[ -e /etc/systemd/system/remote-fs.target.wants ] && echo "LEFT-AFTER-PURGE remote-fs.target.wants"
echo "after-purge=$(dpkg-query -W -f='${{Status}}' blobdrive 2>/dev/null || echo gone)"
while read -r f; do
    [ -d "$f" ] && continue
    [ -e "$f" ] || [ -L "$f" ] && echo "LEFT-AFTER-PURGE $f"
done < '{s}/files'
# The account the administrator put there stays, and /etc/blobdrive with it.
[ -e '{creds}' ] || echo "PURGE-TOOK-THE-CREDENTIALS"
getent passwd blobdrive >/dev/null && echo USER-KEPT
grep -q '^blobdrive:' /etc/subuid && grep -q '^blobdrive:' /etc/subgid && echo RANGE-KEPT
true
"#,
        deb = deb.display(),
        s = s.display(),
        creds = CREDS,
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
    // No error and no warning: the two that do not apply to a package built
    // here are overridden with the reason (scripts/debian/lintian-overrides).
    assert!(tags.is_empty(), "lintian: {tags:#?}");
    let built = start.elapsed();

    let mnt = s.join("mnt");
    let (spec, blank, fstab) = drives_in_fstab(s, &mnt);
    let _unmount = Unmount(mnt.clone());
    let out = in_overlaid_system(s, &session(&deb, s, &fstab, &mnt));
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
        "HELPERS-IN-USR-SBIN",
        "HELPER-LINK-RELATIVE",
        "UNIT-ENABLED",
        "CSI-NODE-LISTED",
        "UNIT-OK",
        "USER-MADE",
        "etc=700 root",
        "ZSH-FISH-OK",
        "MANUAL-SHIPPED",
        "UTAB-NAMES-HELPER",
        "fs=ext4",
        "FAILED-MOUNT-LOG-KEPT",
    ] {
        assert!(o.contains(want), "{want}: {t}");
    }
    // The daemon is the installed program, started by the installed helper.
    assert!(o.contains("exe=/usr/bin/blobdrive\n"), "{t}");
    // The user a mount daemon's network-facing part runs as, made by the
    // package on a machine without it, with no shell, and its range of ids
    // (the same in both files), which the fstab mount's worker took its uid from.
    assert!(o.contains("user-shell=/usr/sbin/nologin\n"), "{t}");
    let field = |key: &str| {
        o.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let range = field("subuid=");
    assert_eq!(range, field("subgid="), "{t}");
    let f: Vec<&str> = range.split(':').collect();
    assert!(
        f.len() == 3 && f[0] == "blobdrive" && f[2] == "65536",
        "{t}"
    );
    let first: u64 = f[1].parse().unwrap();
    let uid: u64 = field("worker-uid=")
        .parse()
        .unwrap_or_else(|_| panic!("{t}"));
    assert!((first..first + 65536).contains(&uid), "{t}");
    for bad in [
        "ENABLE-FAILED",
        "USER-BEFORE",
        "PAGE-NAMES-MISSING-DOC",
        "BLANK-MOUNTED",
        "REMOVED-WHILE-MOUNTED",
        "DAEMON-LEFT",
        "STILL-MOUNTED",
        "LEFT-AFTER-",
        "PURGE-TOOK-",
    ] {
        assert!(!o.contains(bad), "{bad}: {t}");
    }
    let said = |f: &str| std::fs::read_to_string(s.join(f)).unwrap_or_default();
    // Removal while mounted was refused naming the drive and where it is, one
    // mount a line, and nothing of the CSI node plugin's line.
    let refused = said("remove.err");
    // (dpkg's own lines start with "dpkg:", a word, or one space.)
    let lines: Vec<&str> = refused
        .lines()
        .filter(|l| l.starts_with("blobdrive: ") || l.starts_with("  "))
        .collect();
    assert_eq!(
        lines,
        [
            "blobdrive: cannot remove the package while drives are mounted; unmount them first (umount DIR, or blobdrive unmount DIR):".to_string(),
            format!("  {spec} at {}", mnt.display()),
        ],
        "{refused}"
    );
    // The purge said, in one line, that it kept the account.
    let purge = said("purge.err");
    let kept: Vec<&str> = purge
        .lines()
        .filter(|l| l.contains("/etc/blobdrive"))
        .collect();
    assert_eq!(kept.len(), 1, "{purge}");
    assert!(
        kept[0].contains("purge keeps /etc/blobdrive") && kept[0].contains("account keys"),
        "{purge}"
    );
    assert_eq!(
        json(&BD.ok(&["lease", "status", &blank, "--json"]))["state"],
        "available",
        "{t}"
    );
    assert!(o.contains("after-remove=deinstall ok config-files"), "{t}");
    assert!(
        o.contains("after-purge=gone") || o.contains("after-purge=unknown ok not-installed"),
        "{t}"
    );
    // Debian keeps system users on purge (files with its uid may remain).
    assert!(o.contains("USER-KEPT") && o.contains("RANGE-KEPT"), "{t}");
    // The plain umount put everything on the blob and freed the lease.
    let lease = json(&BD.ok(&["lease", "status", &spec, "--json"]));
    assert_eq!(lease["state"], "available", "{t}");
    eprintln!(
        "package built and checked in {:.0?}, installed, used and purged in {:.0?}",
        built,
        start.elapsed() - built
    );
}
