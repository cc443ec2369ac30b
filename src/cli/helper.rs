//! `mount.blobdrive`: the same binary called by that name (a symlink or copy in
//! /sbin) is the helper mount(8) runs for filesystem type `blobdrive`, so that an
//! fstab line mounts a drive with `mount /data`, `mount -a` or at boot:
//!
//! ```text
//! disks/data.vhd  /data  blobdrive  _netdev,nofail,credentials=/etc/blobdrive/acct.env  0 0
//! ```
//!
//! It turns `SPEC DIR -o OPTIONS` into the request `blobdrive mount` makes and
//! goes the same way from there. Exit statuses are mount(8)'s: 1 for a bad
//! command line or credentials file (nothing was done), 32 for a mount that
//! failed (and was undone).

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use blobdrive::blobref::BlobRef;
use blobdrive::mount::helper::{
    check_repeats, parse_args, Invocation, EXIT_MOUNT_FAILED, EXIT_USAGE,
};
use blobdrive::mount::{credentials, fstab};
use blobdrive::privsep::{WallError, WorkerUser, DEFAULT_USER};

use super::mount::{self, Say};

/// The name mount(8) runs the helper by.
pub const HELPER_NAME: &str = "mount.blobdrive";

const USAGE: &str = "\
usage: mount.blobdrive SPEC DIR [-sfnv] [-o OPTIONS]

The mount(8) helper for filesystem type blobdrive: run by `mount DIR` for an fstab line
  SPEC  DIR  blobdrive  OPTIONS  0 0
or by `mount -t blobdrive -o OPTIONS SPEC DIR`. SPEC is the drive: container/name.vhd,
an https://... URL, or BLOB@SNAPSHOT (read-only).

OPTIONS (comma-separated):
  ro | rw                 read-only (no lease taken) or writable (default)
  mode=fs|block|raw       as `blobdrive mount --mode` (default fs)
  mkfs=ext4|xfs           create this filesystem on a blank disk (never over one)
  cache-size=SIZE         memory for the page cache (e.g. 256MiB)
  metrics=HOST:PORT       serve Prometheus metrics at http://HOST:PORT/metrics
  disk-cache=DIR          keep a cache that survives remounts in DIR (root's, on a
                          local disk); disk-cache-size=SIZE bounds it
  warm[=SIZE]             once mounted, fill the disk cache with the drive's data
                          in the background (at most SIZE a second; needs
                          disk-cache=DIR)
  run-as=USER             run the daemon's network-facing part as USER, walled off
                          from the host (default: BLOBDRIVE_RUN_AS, else a uid of
                          the mount's own from blobdrive's range in /etc/subuid)
  credentials=FILE        KEY=VALUE lines for the daemon's environment, e.g.
                          AZURE_STORAGE_CONNECTION_STRING=... or the Entra ID variables;
                          root's, mode 600 or stricter (secrets stay out of argv and
                          /proc/mounts)
  nosuid,nodev,noexec,noatime,relatime,...   passed to the filesystem mount (mode fs);
                          suid and dev only by hand: mount(8) never passes its defaults
  _netdev,nofail,auto,noauto,defaults,x-*    for mount(8) and systemd; ignored here
Anything else is refused, naming the option (-s: ignored instead), and so is an option
given twice (ro,ro too; comment= and x-* may repeat) or contradicted (rw,ro: read from
the line in /etc/fstab, as mount(8) passes only the last). A line mounted at DIR already is left as it is (exit 0).
  -f  check everything, mount nothing    -v  say what was mounted
  -n  accepted (no mtab is kept)          -s  sloppy: ignore unknown options

`umount DIR` then writes every cached byte to the blob, releases the lease and stops
the daemon, returning when that is done (through /sbin/umount.blobdrive, see
`umount.blobdrive --help`); `blobdrive unmount DIR` does the same.";

/// Whether this process was started by the name `name` (argv[0]'s last part):
/// `mount.blobdrive` or `umount.blobdrive`, links to this binary.
pub fn invoked_as(name: &str) -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| Path::new(&a).file_name().map(|n| n == name))
        .unwrap_or(false)
}

/// Runs the helper with its arguments (argv[0] left out).
pub fn run(args: Vec<OsString>) -> ExitCode {
    let usage_error = |msg: &str| {
        eprintln!("{HELPER_NAME}: {msg}");
        ExitCode::from(EXIT_USAGE)
    };
    let mut text = Vec::with_capacity(args.len());
    for a in args {
        match a.into_string() {
            Ok(s) => text.push(s),
            Err(_) => return usage_error("arguments must be UTF-8 text"),
        }
    }
    if text.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if text.iter().any(|a| a == "-V" || a == "--version") {
        println!("{HELPER_NAME} (blobdrive {})", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let inv = match parse_args(text) {
        Ok(i) => i,
        Err(e) => return usage_error(&e.0),
    };
    if let Err(e) = check(&inv) {
        return usage_error(&e);
    }
    if inv.fake {
        return ExitCode::SUCCESS;
    }
    let o = inv.options;
    let args = mount::Args {
        blob: inv.spec,
        mountpoint: inv.dir,
        mode: o.mode,
        mkfs: o.mkfs,
        read_only: o.read_only,
        cache_size: o.cache_size,
        foreground: false,
        credentials: o.credentials,
        // `suid` and `dev` arrive among the flags (when the helper is run by
        // hand: mount(8) never passes them, its defaults).
        suid: false,
        dev: false,
        fs_flags: o.fs_flags,
        metrics: o.metrics,
        disk_cache: o.disk_cache,
        disk_cache_size: o.disk_cache_size,
        warm: o.warm,
        run_as: o.run_as.or_else(run_as_env),
        json: false,
        key_file: o.key_file,
        no_discard: o.no_discard,
        // `mount -a` again: the line is mounted already, and that is success.
        mounted_is_done: true,
    };
    let connection_string = std::env::var("AZURE_STORAGE_CONNECTION_STRING").ok();
    let say = if inv.verbose {
        Say::Mounted
    } else {
        Say::Quiet
    };
    // As for `blobdrive mount`, BLOBDRIVE_AUTH may force one way of signing in.
    let auth = std::env::var(super::auth::AUTH_ENV)
        .ok()
        .and_then(|v| <super::auth::AuthChoice as clap::ValueEnum>::from_str(&v, true).ok())
        .unwrap_or_default();
    match mount::run(args, connection_string.as_deref(), auth, say) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{HELPER_NAME}: {}", super::error_text(&e));
            ExitCode::from(EXIT_MOUNT_FAILED)
        }
    }
}

/// The environment's `BLOBDRIVE_RUN_AS`, which an fstab line without `run-as=`
/// goes by, as `blobdrive mount` does.
fn run_as_env() -> Option<String> {
    std::env::var("BLOBDRIVE_RUN_AS")
        .ok()
        .filter(|u| !u.is_empty())
}

/// What can be refused before anything is done, with the exit status of a bad
/// invocation: the drive's name, the fstab line as written (mount(8) passes on
/// only the last of `rw,ro`), the credentials file and the worker's user.
fn check(inv: &Invocation) -> Result<(), String> {
    BlobRef::parse(&inv.spec).map_err(|e| e.to_string())?;
    for line in fstab::lines_for(&inv.spec, &inv.dir) {
        check_repeats(&line.options).map_err(|e| format!("{} ({})", e.0, line.place))?;
    }
    if let Some(path) = &inv.options.credentials {
        credentials::load(path).map_err(|e| e.to_string())?;
    }
    check_worker_user(inv.options.run_as.as_deref())
}

/// The user the mount's network-facing part will run as must exist and not be
/// root; the message names where the user came from as the administrator wrote
/// it: the line's `run-as=`, else `BLOBDRIVE_RUN_AS`, else the default.
fn check_worker_user(run_as: Option<&str>) -> Result<(), String> {
    let env = run_as_env();
    let (user, said) = match (run_as, &env) {
        (Some(u), _) => (u.to_string(), format!("option run-as={u}")),
        (None, Some(u)) => (u.clone(), format!("BLOBDRIVE_RUN_AS={u}")),
        (None, None) => (
            DEFAULT_USER.to_string(),
            format!("the default run-as user {DEFAULT_USER}"),
        ),
    };
    match WorkerUser::lookup(&user) {
        Ok(_) => Ok(()),
        Err(WallError::NoSuchUser(_)) => Err(format!(
            "{said}: there is no user {user} on this machine to run the network-facing part of the mount as; create it with `useradd --system --no-create-home --shell /usr/sbin/nologin {user}` (the Debian package and scripts/install.sh make blobdrive), or name another with the fstab option run-as=USER"
        )),
        Err(WallError::RootUser(_)) => Err(format!(
            "{said}: that is root (uid 0), and the network-facing part of a mount runs as an unprivileged user; name one with the fstab option run-as=USER"
        )),
        Err(e) => Err(format!("{said}: {e}")),
    }
}
