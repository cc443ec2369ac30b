//! `blobdrive mount`: start a daemon serving a drive, return once it is usable.
//!
//! The daemon is this same program re-executed (`blobdrive __daemon`, hidden), with
//! its request as JSON in the environment and the connection string in
//! `AZURE_STORAGE_CONNECTION_STRING`, so no secret ever shows in `ps`. It reports
//! readiness on its stdout pipe; its log goes to a file beside its mount record.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};
use blobdrive::azure::auth::entra::workload_identity::FederatedReader;
use blobdrive::blobref::BlobRef;
use blobdrive::mount::notify::NOTIFY_SOCKET_ENV;
use blobdrive::mount::{credentials, daemon, record, system, Mode, MountRequest, Ready};
use blobdrive::size::{human, parse_size};

use super::auth::{AuthChoice, AUTH_ENV};
use super::Context;
use super::{mounted, passphrase};
use blobdrive::luks::secret::Secret;
use ready::say_ready;

mod ready;

/// The variable a connection string is read from.
const CONNECTION_STRING_ENV: &str = "AZURE_STORAGE_CONNECTION_STRING";

/// Env var carrying the daemon's request.
pub const REQUEST_ENV: &str = "BLOBDRIVE_MOUNT_REQUEST";

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Durability: fsync, and close of the raw disk file, return once the data is on the blob.
If the storage service stops answering, reads, writes and fsync wait for it, up to
BLOBDRIVE_IO_TIMEOUT_SECS (default 300) from the start of the outage, then fail with
EIO (later I/O fails after one try of at most BLOBDRIVE_REQUEST_TIMEOUT_SECS until it
answers); unwritten data is kept and sent again later, never dropped.
`blobdrive stats MOUNTPOINT` shows the stall.
`blobdrive unmount` waits without limit until every byte is on the blob.")]
pub struct Args {
    /// The drive (container/name.vhd), or BLOB@SNAPSHOT for a read-only mount of a
    /// snapshot.
    pub blob: String,
    /// An empty directory: where the filesystem (fs) or the FUSE files `disk` and
    /// `stats` (block, raw) appear.
    pub mountpoint: PathBuf,
    /// fs: mount the disk's filesystem; block: only a loop device (printed);
    /// raw: only the FUSE file MOUNTPOINT/disk.
    #[arg(long, value_enum, default_value_t = Mode::Fs)]
    pub mode: Mode,
    /// Create this filesystem if the disk holds none (never formats over one).
    #[arg(long, value_name = "ext4|xfs", value_parser = ["ext4", "xfs"])]
    pub mkfs: Option<String>,
    /// Mount read-only: no lease is taken, so any number of hosts can do it, also
    /// while a writer holds the drive.
    #[arg(long)]
    pub read_only: bool,
    /// Memory for the page cache [default: 1/8 of RAM, at most 1 GiB].
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<String>,
    /// Stay in the foreground (for systemd); logs go to stderr. Stop with SIGTERM
    /// or `blobdrive unmount`. With NOTIFY_SOCKET set (systemd Type=notify) it
    /// says READY=1 once the mountpoint serves, STATUS= lines, and STOPPING=1.
    #[arg(long)]
    pub foreground: bool,
    /// Take the account from FILE instead of the environment: KEY=VALUE lines
    /// (AZURE_STORAGE_CONNECTION_STRING=..., or Entra ID variables such as
    /// AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET), the format of
    /// systemd's EnvironmentFile=. It must be root's and unreadable by group and
    /// others. Its variables replace every AZURE_* variable of the environment.
    #[arg(long, value_name = "FILE")]
    pub credentials: Option<PathBuf>,
    /// Honour setuid and setgid bits on the filesystem (mode fs). Off by default:
    /// whoever can write the blob (a SAS holder, another host) could plant a
    /// setuid-root program that any local user runs to become root here. Only for
    /// a drive whose every writer you trust with root on this host.
    #[arg(long)]
    pub suid: bool,
    /// Allow device nodes on the filesystem (mode fs). Off by default, for the
    /// same reason as --suid: a device node planted in the blob opens this host's
    /// disks and memory to any local user.
    #[arg(long)]
    pub dev: bool,
    /// Serve this mount's figures for Prometheus at http://HOST:PORT/metrics
    /// (requests by operation and outcome, latencies, retries, throttling, cache,
    /// dirty bytes, stalls, lease, token renewals). Off unless given; nothing
    /// else is served on that port, and anyone who can reach it can read the
    /// figures (no secrets are in them): 127.0.0.1:PORT keeps them on this host.
    /// HOST is an IPv4 address, an IPv6 one in brackets ([::1]:9101) or a name
    /// (localhost:9101, looked up at mount). An address in use fails the mount.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Keep a second cache, under the memory cache, in a directory of DIR on a
    /// local disk: reads look in memory, then there, then the blob, and it
    /// survives unmount, so a remount starts warm. It holds only data that is on
    /// the blob (fsync still means "on the blob"); if the blob changed since the
    /// last clean unmount, or that mount never ended cleanly, it starts empty.
    /// DIR must exist, be root's and writable by no one else; each drive gets
    /// its own directory in it, locked while mounted.
    #[arg(long, value_name = "DIR")]
    pub disk_cache: Option<PathBuf>,
    /// The disk cache's limit; least recently used data goes first [default:
    /// the drive's size, at most half the space free on DIR's filesystem].
    #[arg(long, value_name = "SIZE", requires = "disk_cache")]
    pub disk_cache_size: Option<String>,
    /// Once the mount is ready, fill the disk cache with the drive's data in
    /// the background, as `blobdrive warm` does (without delaying the mount;
    /// `blobdrive stats` shows how far it is); --warm=SIZE fetches at most SIZE
    /// a second.
    #[arg(
        long,
        value_name = "MAX_RATE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "",
        requires = "disk_cache"
    )]
    pub warm: Option<String>,
    /// The unprivileged user the network-facing part of the daemon runs as
    /// (HTTP, TLS, XML, tokens, the cache, FUSE), with no capability, a seccomp
    /// filter and Landlock; a small root part does the mounts. The user must
    /// exist. [default: a uid of the mount's own, which no account, process or
    /// other mount has, from the range /etc/subuid and /etc/subgid reserve for
    /// the user blobdrive (the package and scripts/install.sh reserve it)]
    #[arg(long, value_name = "USER", env = "BLOBDRIVE_RUN_AS")]
    pub run_as: Option<String>,
    /// Print one JSON object once the drive is ready instead of text: blob,
    /// mountpoint, mode, read_only, fstype, formatted, device, fuse_dir, disk,
    /// pid, warnings and notes.
    #[arg(long)]
    pub json: bool,
    /// An encrypted drive's passphrase: every byte of FILE (`-`: standard
    /// input) [default: BLOBDRIVE_PASSPHRASE, the systemd credential key, or
    /// asked on a terminal].
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Refuse discards (fstrim, hole punching) instead of clearing the pages:
    /// cleared pages show the service which ranges an encrypted drive does not
    /// use, as dm-crypt's allow-discards does.
    #[arg(long)]
    pub no_discard: bool,
    /// Flags for the filesystem mount (nosuid, noatime, ...): set by the mount(8)
    /// helper from an fstab line.
    #[arg(skip)]
    pub fs_flags: Vec<String>,
    /// The drive already mounted at MOUNTPOINT by blobdrive is success, not an
    /// error: set by the mount(8) helper, which `mount -a` runs again for a
    /// line it cannot tell is mounted (the kernel shows the loop device or
    /// `blobdrive:SPEC` as the source, not the line's SPEC).
    #[arg(skip)]
    pub mounted_is_done: bool,
}

/// How a mount tells its outcome: `blobdrive mount` says what it mounted (as
/// one JSON object with --json); the mount(8) helper is quiet, as mount(8) is,
/// unless asked with -v. Warnings are always said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    Mounted,
    Json,
    Quiet,
}

/// Physical memory (MemTotal), if /proc/meminfo says.
/// 1/8 of RAM, between 64 MiB and 1 GiB.
fn default_cache_size() -> u64 {
    (blobdrive::mount::mem_total().unwrap_or(1 << 30) / 8).clamp(64 << 20, 1 << 30)
}

/// A cache must fit: at least 32 MiB, and at most 3/4 of physical memory (the
/// daemon needs up to 150 MiB more, and the rest of the machine some too; a cache
/// that cannot be held would end in swapping or the OOM killer).
fn check_cache_size(cache_size: u64, mem_total: Option<u64>) -> Result<()> {
    if cache_size < blobdrive::mount::MIN_CACHE_SIZE {
        bail!(
            "--cache-size {} is too small: at least {}",
            human(cache_size),
            human(blobdrive::mount::MIN_CACHE_SIZE)
        );
    }
    if let Some(total) = mem_total {
        let limit = total / 4 * 3;
        if cache_size > limit {
            bail!(
                "--cache-size {} is more than this machine can hold: it has {} of memory, and the cache may take at most 3/4 of it ({})",
                human(cache_size),
                human(total),
                human(limit)
            );
        }
    }
    Ok(())
}

/// A disk cache must hold a few chunks (its unit of space) to be of use.
fn check_disk_cache_size(size: u64) -> Result<u64> {
    use blobdrive::device::diskcache::MIN_SIZE;
    if size < MIN_SIZE {
        bail!(
            "--disk-cache-size {} is too small: at least {}",
            human(size),
            human(MIN_SIZE)
        );
    }
    Ok(size)
}

/// A warm-up's rate must let it move.
fn check_warm_rate(rate: u64) -> Result<u64> {
    if rate == 0 {
        bail!("--warm=0: a warm-up's rate must be more than 0 (leave it out for no limit)");
    }
    Ok(rate)
}

/// `blobdrive mount`. It makes its own account context, after its credentials
/// file (if any) said what the account is.
pub fn run(args: Args, connection_string: Option<&str>, auth: AuthChoice, say: Say) -> Result<()> {
    let creds = match &args.credentials {
        Some(path) => Some(credentials::load(path)?),
        None => None,
    };
    let connection_string = match &creds {
        Some(env) => env
            .iter()
            .find(|(k, _)| k == CONNECTION_STRING_ENV)
            .map(|(_, v)| v.clone()),
        None => connection_string.map(str::to_string),
    };
    // The file's variables become this process's too (before any thread starts):
    // signing in here, to check the drive before the daemon starts, must use the
    // same account as the daemon will (Entra ID reads its variables from the
    // environment).
    if let Some(env) = &creds {
        adopt_env(env);
    }
    let ctx = Context::new(connection_string.as_deref(), auth)?;
    mount(
        &ctx,
        args,
        connection_string.as_deref(),
        creds.as_deref(),
        say,
    )
}

/// A credentials file's variables become this process's environment, replacing
/// every `AZURE_*` it had, so that whatever reads the account from the
/// environment reads the file's (a foreground daemon is this process). Called
/// before any thread is started (changing the environment is not thread-safe).
fn adopt_env(env: &[(String, String)]) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AZURE_") {
            std::env::remove_var(k);
        }
    }
    for (k, v) in env {
        std::env::set_var(k, v);
    }
}

fn mount(
    ctx: &Context,
    args: Args,
    connection_string: Option<&str>,
    creds: Option<&[(String, String)]>,
    say: Say,
) -> Result<()> {
    let r = BlobRef::parse(&args.blob)?;
    if let Some(user) = &args.run_as {
        blobdrive::privsep::check_user_name(user)
            .map_err(|e| anyhow::anyhow!("--run-as (or BLOBDRIVE_RUN_AS, fstab run-as=): {e}"))?;
    }
    let read_only = args.read_only || r.snapshot.is_some();
    if args.mkfs.is_some() && read_only {
        bail!("--mkfs needs a writable mount (not --read-only, not a snapshot)");
    }
    if args.mkfs.is_some() && args.mode != Mode::Fs {
        bail!("--mkfs only makes sense with --mode fs");
    }
    let cache_size = match &args.cache_size {
        Some(s) => parse_size(s)?,
        None => default_cache_size(),
    };
    check_cache_size(cache_size, blobdrive::mount::mem_total())?;
    let disk_cache_size = match &args.disk_cache_size {
        Some(s) => Some(check_disk_cache_size(parse_size(s)?)?),
        None => None,
    };
    let warm_max_rate = match args.warm.as_deref() {
        None | Some("") => None,
        Some(s) => Some(check_warm_rate(parse_size(s)?)?),
    };
    let disk_cache = match &args.disk_cache {
        Some(dir) => {
            let dir = std::path::absolute(dir)
                .with_context(|| format!("--disk-cache {}", dir.display()))?;
            blobdrive::device::diskcache::files::check_dir(&dir).map_err(anyhow::Error::msg)?;
            Some(dir)
        }
        None => None,
    };
    if let Some(there) = mounted::mounted_here(ctx, &r, &args.mountpoint, read_only)? {
        if !args.mounted_is_done {
            bail!("{r} is already mounted at {}", there.display());
        }
        if say == Say::Mounted {
            println!("{r} is already mounted at {}", there.display());
        }
        return Ok(());
    }
    preflight(&args.mountpoint)?;
    let passphrase = passphrase::for_mount(ctx, &r, args.key_file.as_deref())?;
    let mountpoint = args.mountpoint.canonicalize()?;
    let mountpoint_id = system::dir_id(&mountpoint)?;
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let req = MountRequest {
        blob: args.blob.clone(),
        mountpoint: mountpoint.clone(),
        mountpoint_id: Some(mountpoint_id),
        mode: args.mode,
        mkfs: args.mkfs.clone(),
        read_only,
        cache_size,
        uid,
        gid,
        fs_flags: {
            let mut f = args.fs_flags.clone();
            f.extend(args.suid.then(|| "suid".to_string()));
            f.extend(args.dev.then(|| "dev".to_string()));
            f
        },
        metrics: args.metrics.clone(),
        disk_cache,
        disk_cache_size,
        io: ctx.io.clone(),
        run_as: args.run_as.clone(),
        warm: args.warm.is_some(),
        warm_max_rate,
        passphrase_follows: passphrase.is_some(),
        no_discard: args.no_discard,
    };
    if args.foreground {
        // A failure is reported by the returned error; only readiness is printed here.
        let blob = r.to_string();
        let sign_in = |a, read: &FederatedReader| {
            ctx.sign_in(a, Some(read))
                .map_err(|e| super::error_text(&e))
        };
        daemon::run(
            req,
            ctx.unsigned_account_for(&r)?,
            &sign_in,
            passphrase,
            &mut |outcome| {
                if let Ok(ready) = outcome {
                    // The daemon's own log (stderr here) already said the warnings.
                    let quiet = Ready {
                        warnings: Vec::new(),
                        ..ready.clone()
                    };
                    if say != Say::Quiet {
                        say_ready(&quiet, &blob, say);
                    }
                }
            },
        )?;
        return Ok(());
    }
    spawn_daemon(
        &req,
        connection_string,
        creds,
        ctx.auth,
        &r.to_string(),
        passphrase,
        say,
    )
}

/// Refusals that need no network: root, /dev/fuse, an empty directory that is not
/// already a mount.
fn preflight(mountpoint: &Path) -> Result<()> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("mount needs root (it uses FUSE, loop devices and mount(8)); run it with sudo");
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: load the fuse module (modprobe fuse) or install fuse3");
    }
    let meta = std::fs::metadata(mountpoint)
        .with_context(|| format!("mountpoint {} does not exist", mountpoint.display()))?;
    if !meta.is_dir() {
        bail!("mountpoint {} is not a directory", mountpoint.display());
    }
    let canonical = mountpoint.canonicalize()?;
    if system::is_mountpoint(&canonical) {
        bail!("{} is already a mount point", canonical.display());
    }
    if std::fs::read_dir(&canonical)?.next().is_some() {
        bail!(
            "mountpoint {} is not empty; blobdrive mounts only on empty directories",
            canonical.display()
        );
    }
    Ok(())
}

/// Starts the daemon and waits for its readiness. Its environment carries the
/// account: the credentials file's variables when there is one (and no other
/// `AZURE_*`), else the connection string given. `NOTIFY_SOCKET` is not passed
/// on: a service manager waiting on it hears from a `--foreground` daemon only.
fn spawn_daemon(
    req: &MountRequest,
    connection_string: Option<&str>,
    creds: Option<&[(String, String)]>,
    auth: AuthChoice,
    blob: &str,
    passphrase: Option<Secret>,
    say: Say,
) -> Result<()> {
    record::ensure_dir().map_err(|e| {
        if e.kind() == std::io::ErrorKind::Other {
            anyhow::anyhow!("{e}")
        } else {
            anyhow::anyhow!(
                "cannot create the run directory {}: {e}",
                record::run_dir().display()
            )
        }
    })?;
    let id = record::id_for(&req.mountpoint);
    let (_, _, log_path, _) = record::paths(&id);
    let mut log = record::create_private(&log_path, true)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let header = format!("mounting {blob} at {}", req.mountpoint.display());
    std::io::Write::write_all(&mut log, record::log_header(&header).as_bytes())
        .with_context(|| format!("cannot write {}", log_path.display()))?;
    let exe = std::env::current_exe().context("cannot find the blobdrive executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("__daemon")
        .env(REQUEST_ENV, serde_json::to_string(req)?)
        .stdin(if passphrase.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        // The daemon signs in itself (and renews for as long as it runs), from
        // the same environment; `--auth` reaches it here, never in its argv.
        .env(AUTH_ENV, auth.name());
    cmd.env_remove(NOTIFY_SOCKET_ENV);
    match creds {
        Some(env) => {
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("AZURE_") {
                    cmd.env_remove(k);
                }
            }
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
        }
        None => {
            match connection_string {
                Some(cs) => cmd.env(CONNECTION_STRING_ENV, cs),
                None => cmd.env_remove(CONNECTION_STRING_ENV),
            };
        }
    }
    let mut child = cmd.spawn().context("cannot start the mount daemon")?;
    passphrase::hand_over(&mut child, passphrase)?;
    let stdout = child.stdout.take().expect("piped");
    let mut answer = String::new();
    BufReader::new(stdout).read_line(&mut answer)?;
    if let Some(json) = answer.strip_prefix("READY ") {
        let ready: Ready = serde_json::from_str(json.trim())?;
        say_ready(&ready, blob, say);
        return Ok(());
    }
    if let Some(msg) = answer.strip_prefix("ERROR ") {
        let _ = child.wait();
        bail!("{}", msg.trim());
    }
    let status = child.wait()?;
    bail!(
        "the mount daemon exited ({status}) before the drive was ready; see {}",
        log_path.display()
    )
}

/// The hidden `__daemon` entry: detach from the terminal's session, run the mount,
/// report readiness on stdout, then point stdout at /dev/null.
pub fn run_daemon(ctx: &Context) -> Result<()> {
    let req: MountRequest = serde_json::from_str(
        &std::env::var(REQUEST_ENV).context("__daemon is started by `blobdrive mount`")?,
    )?;
    // SAFETY: setsid has no memory-safety preconditions.
    unsafe { libc::setsid() };
    let mut report = |r: Result<&Ready, String>| {
        use std::io::Write;
        let line = match r {
            Ok(ready) => format!("READY {}", serde_json::to_string(ready).unwrap_or_default()),
            Err(e) => format!("ERROR {}", e.replace('\n', " ")),
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
        drop(out);
        detach_stdout();
    };
    // The worker signs in behind its walls, its first step; a failure here or
    // there is reported like any other failed mount.
    let account = match BlobRef::parse(&req.blob)
        .map_err(anyhow::Error::from)
        .and_then(|r| ctx.unsigned_account_for(&r))
    {
        Ok(a) => a,
        Err(e) => {
            report(Err(super::error_text(&e)));
            return Err(e);
        }
    };
    let sign_in = |a, read: &FederatedReader| {
        ctx.sign_in(a, Some(read))
            .map_err(|e| super::error_text(&e))
    };
    let passphrase = match passphrase::handed_over(req.passphrase_follows) {
        Ok(p) => p,
        Err(e) => {
            report(Err(super::error_text(&e)));
            return Err(e);
        }
    };
    let root_part = std::process::id();
    let done = daemon::run(req, account, &sign_in, passphrase, &mut report);
    if std::process::id() != root_part {
        // The worker, forked from the root part: its failure went to the root
        // part, which reports it and says it in the mount's log. Said here
        // too, the log held each error twice.
        std::process::exit(i32::from(done.is_err()));
    }
    done.map_err(Into::into)
}

fn detach_stdout() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: both descriptors are valid; dup2 atomically replaces stdout.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_size_must_fit_in_memory() {
        let total = 23u64 << 30;
        assert!(check_cache_size(64 << 20, Some(total)).is_ok());
        assert!(check_cache_size(17 << 30, Some(total)).is_ok());
        let m = check_cache_size(100 << 40, Some(total))
            .unwrap_err()
            .to_string();
        assert!(
            m.contains("--cache-size 100 TiB") && m.contains("23 GiB") && m.contains("17.25 GiB"),
            "{m}"
        );
        let m = check_cache_size(16 << 20, Some(total))
            .unwrap_err()
            .to_string();
        assert!(m.contains("too small"), "{m}");
        // Unknown memory: only the lower bound applies.
        assert!(check_cache_size(100 << 40, None).is_ok());
    }
}
