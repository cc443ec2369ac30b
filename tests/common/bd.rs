//! Running the blobdrive binary: [`Harness`], what a test binary's commands share
//! (the account, the run directory, environment besides), and [`Bd`], one command
//! built from it, which a call can change before running it.
//!
//! A test file names its harness once, e.g.
//! `const BD: Harness = Harness::new("e2e-run").env(&[("BLOBDRIVE_RETRY_BUDGET_SECS", "10")]);`,
//! and runs `BD.ok(&["info", &spec])`, `BD.cmd(&["mount", ..]).cs(&proxy).fails()`,
//! `BD.new_drive("tag", "64MiB")`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use super::azurite::{unique_container, Azurite};
use super::mount::Mp;
use super::util::stdout_of_success;

/// The connection string of the emulator every test binary shares.
pub fn shared_cs() -> String {
    Azurite::shared().connection_string()
}

/// The connection string of this test binary's own emulator (tests that stop or
/// slow it down).
pub fn isolated_cs() -> String {
    Azurite::isolated().connection_string()
}

/// What every blobdrive command of a test binary is given unless a call says
/// otherwise.
#[derive(Clone, Copy)]
pub struct Harness {
    /// The account's connection string (`AZURE_STORAGE_CONNECTION_STRING`).
    pub account: fn() -> String,
    /// The run directory (`BLOBDRIVE_RUN_DIR`), by its name below the target's
    /// temporary directory; `None` leaves the variable as the test runs with.
    pub run: Option<&'static str>,
    /// Environment besides.
    pub env: &'static [(&'static str, &'static str)],
    /// Environment variables taken away.
    pub env_remove: &'static [&'static str],
}

impl Harness {
    /// The shared emulator's account, mounts recorded in the run directory
    /// `run` of this test binary's own.
    pub const fn new(run: &'static str) -> Harness {
        Harness {
            account: shared_cs,
            run: Some(run),
            env: &[],
            env_remove: &[],
        }
    }

    /// The shared emulator's account and no run directory given.
    pub const fn without_run_dir() -> Harness {
        Harness {
            account: shared_cs,
            run: None,
            env: &[],
            env_remove: &[],
        }
    }

    /// The account `account` returns instead.
    pub const fn account(self, account: fn() -> String) -> Harness {
        Harness { account, ..self }
    }

    /// The environment `env` besides.
    pub const fn env(self, env: &'static [(&'static str, &'static str)]) -> Harness {
        Harness { env, ..self }
    }

    /// The environment variables `names` taken away.
    pub const fn env_remove(self, names: &'static [&'static str]) -> Harness {
        Harness {
            env_remove: names,
            ..self
        }
    }

    /// The account's connection string.
    pub fn cs(&self) -> String {
        (self.account)()
    }

    /// The run directory, made private (0700) as blobdrive wants it.
    pub fn run_dir(&self) -> PathBuf {
        super::mount::run_dir(self.run.expect("this harness has no run directory"))
    }

    /// blobdrive with `args`, to be changed or run.
    pub fn cmd(&self, args: &[&str]) -> Bd {
        let mut bd = Bd::new(args).cs(&self.cs());
        if self.run.is_some() {
            bd = bd.run_dir(&self.run_dir());
        }
        for name in self.env_remove {
            bd = bd.env_remove(name);
        }
        bd.envs(self.env)
    }

    /// blobdrive with `args`, which must succeed: its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        self.cmd(args).ok()
    }

    /// A new drive of `size` in a new container named after `tag`: its spec.
    pub fn new_drive(&self, tag: &str, size: &str) -> String {
        let spec = format!("{}/disk.vhd", unique_container(tag));
        self.ok(&["create", &spec, "--size", size, "--create-container"]);
        spec
    }

    /// A client of the account.
    pub fn service(&self) -> blobdrive::azure::BlobService {
        super::azurite::service(&self.cs())
    }

    /// A new container named after `tag`: its name.
    pub fn new_container(&self, tag: &str) -> String {
        let name = unique_container(tag);
        super::util::rt()
            .block_on(self.service().container(&name).create())
            .unwrap();
        name
    }

    /// A mountpoint, unmounted through this harness's account and run directory
    /// when dropped.
    pub fn mp(&self) -> Mp {
        Mp::new(&self.run_dir(), &self.cs())
    }

    /// [`Harness::mp`] for a mount that reaches the account through `cs` (a
    /// proxy's).
    pub fn mp_through(&self, cs: &str) -> Mp {
        Mp::new(&self.run_dir(), cs)
    }

    /// This harness reaching the account through `cs` (a proxy's) with the
    /// environment `env` besides.
    pub fn via(&self, cs: &str, env: &[(&str, &str)]) -> Via {
        Via {
            harness: *self,
            cs: cs.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Mounts `spec` at `mp` with the options `extra`, which must succeed: its
    /// standard output (a block mount's loop device).
    pub fn mount(&self, spec: &str, mp: &Mp, extra: &[&str]) -> String {
        self.mount_cmd(spec, mp, extra).ok()
    }

    /// `blobdrive mount SPEC MP EXTRA...`, to be changed or run (one that
    /// must fail, say).
    pub fn mount_cmd(&self, spec: &str, mp: &Mp, extra: &[&str]) -> Bd {
        self.cmd(&[&["mount", spec, mp.s()], extra].concat())
    }

    /// Unmounts `mp`, which must succeed: its standard output.
    pub fn unmount(&self, mp: &Mp) -> String {
        self.ok(&["unmount", mp.s()])
    }

    /// Fails unless nothing of a mount of `spec` at `mp` remains: no record in
    /// the run directory, no FUSE or filesystem mount, no loop device over the
    /// mountpoint or the run directory, no lease on the blob.
    pub fn assert_nothing_left(&self, mp: &Path, spec: &str) {
        let s = mp.to_str().unwrap();
        let list = super::util::json(&self.ok(&["list", "--json"]));
        assert!(
            !list
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountpoint"] == s),
            "record left: {list}"
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(s), "mount left at {s}");
        let loops = super::util::sh_ok("losetup -a");
        let id = blobdrive::mount::record::id_for(mp);
        assert!(
            !loops.contains(s) && !loops.contains(&format!("{id}.fuse")),
            "loop device left: {loops}"
        );
        let st = super::util::json(&self.ok(&["lease", "status", spec, "--json"]));
        assert_ne!(st["state"], "leased", "lease left on {spec}");
    }

    /// A client of the blob `spec` (container/name) in the account.
    pub fn blob(&self, spec: &str) -> blobdrive::azure::BlobClient {
        super::azurite::blob_client(&self.cs(), spec)
    }
}

/// A [`Harness`] reaching the account another way ([`Harness::via`]).
pub struct Via {
    harness: Harness,
    cs: String,
    env: Vec<(String, String)>,
}

impl Via {
    /// blobdrive with `args`, to be changed or run.
    pub fn cmd(&self, args: &[&str]) -> Bd {
        let mut bd = self.harness.cmd(args).cs(&self.cs);
        for (k, v) in &self.env {
            bd = bd.env(k, v);
        }
        bd
    }

    /// blobdrive with `args`, which must succeed: its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        self.cmd(args).ok()
    }

    /// A mountpoint, unmounted this way when dropped.
    pub fn mp(&self) -> Mp {
        self.harness.mp_through(&self.cs)
    }

    /// A new mountpoint with `spec` mounted at it with the options `extra`.
    pub fn mount(&self, spec: &str, extra: &[&str]) -> Mp {
        let mp = self.mp();
        self.ok(&[&["mount", spec, mp.s()], extra].concat());
        mp
    }

    /// Unmounts `mp`, which must succeed: its standard output.
    pub fn unmount(&self, mp: &Mp) -> String {
        self.ok(&["unmount", mp.s()])
    }
}

/// One blobdrive command: its arguments kept for the messages of failed
/// assertions.
pub struct Bd {
    cmd: Command,
    args: Vec<String>,
}

impl Bd {
    /// blobdrive with `args` and the test's own environment; [`Harness::cmd`]
    /// gives it an account and a run directory. A `mount` run as root first
    /// makes sure the worker's user exists ([`super::user::ensure_user`]): the
    /// daemon it starts may split.
    pub fn new(args: &[&str]) -> Bd {
        if args.first() == Some(&"mount") {
            super::user::ensure_user();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobdrive"));
        cmd.args(args);
        Bd {
            cmd,
            args: args.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// The account `cs` instead of the harness's.
    pub fn cs(mut self, cs: &str) -> Bd {
        self.cmd.env("AZURE_STORAGE_CONNECTION_STRING", cs);
        self
    }

    /// The run directory `dir` instead of the harness's.
    pub fn run_dir(mut self, dir: &Path) -> Bd {
        self.cmd.env("BLOBDRIVE_RUN_DIR", dir);
        self
    }

    /// The environment variable `key` set to `value`.
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Bd {
        self.cmd.env(key, value.into());
        self
    }

    /// The environment variables `vars` set.
    pub fn envs(mut self, vars: &[(&str, &str)]) -> Bd {
        self.cmd.envs(vars.iter().copied());
        self
    }

    /// The environment variable `key` taken away.
    pub fn env_remove(mut self, key: &str) -> Bd {
        self.cmd.env_remove(key);
        self
    }

    /// Run as a user with nothing (uid and gid 65534, no groups) through
    /// `setpriv`, its environment and arguments as given: an operator who is not
    /// root.
    pub fn by_nobody(self) -> Bd {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(self.cmd.get_program())
            .args(self.cmd.get_args());
        for (k, v) in self.cmd.get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        Bd {
            cmd,
            args: self.args,
        }
    }

    /// The command itself, for what the builder does not offer (its standard
    /// streams, say).
    pub fn command(self) -> Command {
        self.cmd
    }

    /// Starts it.
    pub fn spawn(mut self) -> Child {
        self.cmd.spawn().expect("start blobdrive")
    }

    /// Starts it, its standard output and error captured.
    pub fn spawn_piped(mut self) -> Child {
        self.cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        self.spawn()
    }

    /// Runs it: its status and output.
    pub fn output(mut self) -> Output {
        self.cmd.output().expect("run blobdrive")
    }

    /// Runs it, which must succeed: its standard output.
    pub fn ok(self) -> String {
        let args = self.args.clone();
        stdout_of_success(&args, self.output())
    }

    /// Runs it, which must fail (a non-zero exit): its standard error.
    pub fn fails(self) -> String {
        let args = self.args.clone();
        let out = self.output();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            !out.status.success(),
            "{args:?} should fail, printed {}{err}",
            String::from_utf8_lossy(&out.stdout)
        );
        err
    }

    /// [`Bd::fails`], saying `needle` on standard error.
    pub fn fails_with(self, needle: &str) -> String {
        let args = self.args.clone();
        let err = self.fails();
        assert!(
            err.contains(needle),
            "{args:?}: expected '{needle}' in: {err}"
        );
        err
    }

    /// [`Bd::fails`] with one line on standard error and nothing else: that line.
    pub fn fails_in_one_line(self) -> String {
        let args = self.args.clone();
        let err = self.fails();
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, not: {err}");
        err
    }

    /// [`Bd::fails_in_one_line`], that line being [`the_error_line`] saying
    /// `needle`.
    pub fn fails_saying(self, needle: &str) -> String {
        let err = self.fails_in_one_line();
        the_error_line(&err, &[needle]);
        err
    }

    /// [`Bd::fails`] with [`the_error_line`] saying each of `needles` (log lines
    /// besides it allowed): that line.
    pub fn fails_with_error(self, needles: &[&str]) -> String {
        the_error_line(&self.fails(), needles)
    }
}

/// A command made otherwise (blobdrive run under `unshare`, say), for the
/// assertions of [`Bd`].
impl From<Command> for Bd {
    fn from(cmd: Command) -> Bd {
        let args = cmd
            .get_args()
            .map(|a| a.to_string_lossy().to_string())
            .collect();
        Bd { cmd, args }
    }
}

/// The one `blobdrive: error: ` line of `err` (a command's standard error, which
/// may hold log lines besides), which must say each of `needles` and hold no
/// terminal escape.
pub fn the_error_line(err: &str, needles: &[&str]) -> String {
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("blobdrive: error: "))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "expected '{n}' in: {err}");
    }
    assert!(!lines[0].contains('\x1b'), "no ANSI codes: {err}");
    lines[0].to_string()
}
