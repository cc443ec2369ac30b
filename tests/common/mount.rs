//! Running the blobdrive binary against a connection string and mounting drives
//! that are unmounted when the test ends, whatever happens.

use super::bd::Bd;
use std::path::{Path, PathBuf};

/// Mount tests need root (FUSE, loop devices, mount) and /dev/fuse, and the
/// user a split daemon's worker runs as ([`super::user::ensure_user`]).
pub fn require_root() {
    // SAFETY: geteuid cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "mount tests must run as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "mount tests need /dev/fuse"
    );
    super::user::ensure_user();
}

/// A run directory of the test binary's own, so its mounts are its alone.
pub fn run_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    super::util::private_dir(&d);
    d
}

/// The `unmount` a test's cleanup runs. After a failed assertion the service may
/// be left unreachable (a paused proxy): a plain unmount would then wait for it
/// without limit and hang the test run, so the cached data, which the failing test
/// no longer needs, is dropped instead.
pub fn cleanup_unmount(mountpoint: &str) -> Vec<&str> {
    if std::thread::panicking() {
        vec!["unmount", mountpoint, "--discard-dirty", "--yes"]
    } else {
        vec!["unmount", mountpoint]
    }
}

/// A mountpoint that is unmounted (through `cs`) when dropped.
pub struct Mp {
    pub dir: tempfile::TempDir,
    pub run: PathBuf,
    pub cs: String,
}

impl Mp {
    pub fn new(run: &Path, cs: &str) -> Mp {
        Mp {
            dir: tempfile::Builder::new()
                .prefix("blobdrive-test-mnt.")
                .tempdir()
                .unwrap(),
            run: run.to_path_buf(),
            cs: cs.to_string(),
        }
    }

    /// blobdrive with `args` through this mount's account and run directory.
    fn bd(&self, args: &[&str]) -> Bd {
        Bd::new(args).cs(&self.cs).run_dir(&self.run)
    }

    pub fn s(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn disk(&self) -> String {
        format!("{}/disk", self.s())
    }

    /// This mount's entry in `list --json`.
    pub fn listed(&self) -> serde_json::Value {
        let list = super::util::json(&self.bd(&["list", "--json"]).ok());
        list.as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountpoint"] == self.s())
            .expect("listed")
            .clone()
    }

    /// The pid of this mount's daemon.
    pub fn pid(&self) -> u64 {
        self.listed()["pid"].as_u64().unwrap()
    }

    /// `stats --json` of this mount.
    pub fn stats(&self) -> serde_json::Value {
        super::util::json(&self.bd(&["stats", self.s(), "--json"]).ok())
    }
}

/// A memory figure of process `pid` from /proc/PID/status (`VmHWM`, `VmRSS`), in KiB.
pub fn proc_status_kib(pid: u64, field: &str) -> u64 {
    proc_status_kib_if_alive(pid, field)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// [`proc_status_kib`], `None` once the process is gone (a watchdog's reading).
pub fn proc_status_kib_if_alive(pid: u64, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

impl Drop for Mp {
    fn drop(&mut self) {
        let _ = self.bd(&cleanup_unmount(self.s())).output();
    }
}

/// `lease break --yes` of `spec` as another machine runs it: with a run directory
/// of its own, empty, so that this machine's mounts are not seen (a break here
/// refuses a drive mounted here). For tests of what a mount does when its lease
/// is broken from elsewhere. Returns its standard output.
pub fn break_lease_from_elsewhere(cs: &str, spec: &str) -> String {
    let elsewhere = tempfile::Builder::new()
        .prefix("blobdrive-test-elsewhere.")
        .tempdir()
        .unwrap();
    // Root's alone, as a run directory must be to be read at all.
    super::util::private_dir(elsewhere.path());
    Bd::new(&["lease", "break", spec, "--yes"])
        .cs(cs)
        .run_dir(elsewhere.path())
        .ok()
}
