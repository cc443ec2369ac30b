//! Running the blobdrive binary against a connection string and mounting drives
//! that are unmounted when the test ends, whatever happens.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::util::stdout_of_success;

/// Mount tests need root (FUSE, loop devices, mount) and /dev/fuse.
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
}

/// A run directory of the test binary's own, so its mounts are its alone.
pub fn run_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    super::util::private_dir(&d);
    d
}

/// blobdrive with `args`, reaching the account through `cs`.
pub fn bd(run: &Path, cs: &str, args: &[&str]) -> Output {
    bd_env(run, cs, &[], args)
}

/// blobdrive with `args` and the extra environment `env` (timeouts, say).
pub fn bd_env(run: &Path, cs: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .args(args)
        .env("AZURE_STORAGE_CONNECTION_STRING", cs)
        .env("BLOBDRIVE_RUN_DIR", run)
        .envs(env.iter().copied())
        .output()
        .expect("run blobdrive")
}

/// blobdrive with `args`, which must succeed: its standard output.
pub fn ok(run: &Path, cs: &str, args: &[&str]) -> String {
    stdout_of_success(&args, bd(run, cs, args))
}

/// [`ok`] with the extra environment `env`.
pub fn ok_env(run: &Path, cs: &str, env: &[(&str, &str)], args: &[&str]) -> String {
    stdout_of_success(&args, bd_env(run, cs, env, args))
}

/// blobdrive with `args`, which must fail with one line on standard error: that
/// line.
pub fn fails(run: &Path, cs: &str, args: &[&str]) -> String {
    let out = bd(run, cs, args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} succeeded: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line, not: {err}");
    err
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
        let list = super::util::json(&ok(&self.run, &self.cs, &["list", "--json"]));
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
        super::util::json(&ok(&self.run, &self.cs, &["stats", self.s(), "--json"]))
    }
}

/// A memory figure of process `pid` from /proc/PID/status (`VmHWM`, `VmRSS`), in KiB.
pub fn proc_status_kib(pid: u64, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

impl Drop for Mp {
    fn drop(&mut self) {
        let _ = bd(&self.run, &self.cs, &cleanup_unmount(self.s()));
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
    ok(elsewhere.path(), cs, &["lease", "break", spec, "--yes"])
}
