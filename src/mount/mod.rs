//! Mounting a drive: the daemon that serves it, the records that let `unmount`,
//! `list` and `stats` find it, and the system tools (loop devices, mkfs, mount) it
//! drives.

pub mod blank;
pub mod credentials;
pub mod daemon;
pub mod fstab;
pub mod helper;
pub mod metrics;
pub mod notify;
pub mod process_metrics;
pub mod record;
pub mod rootpart;
pub mod superblock;
pub mod system;
pub mod uids;
pub mod utab;
pub mod warmup;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The smallest memory cache a mount takes (`--cache-size`): what read-ahead
/// and write-back need room for at once.
pub const MIN_CACHE_SIZE: u64 = 32 << 20;

/// This machine's memory (`MemTotal` of /proc/meminfo), in bytes.
pub fn mem_total() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
}

/// What a mount exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The filesystem on the disk, mounted at MOUNTPOINT (through a loop device).
    Fs,
    /// A loop device (`/dev/loopN`) over the disk; MOUNTPOINT holds the FUSE files.
    Block,
    /// MOUNTPOINT holds `disk` (the disk's bytes) and `stats`.
    Raw,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Fs => "fs",
            Mode::Block => "block",
            Mode::Raw => "raw",
        })
    }
}

/// Everything the daemon needs, passed from `blobdrive mount` to the daemon process
/// as JSON in the environment (never on the command line). The account's secret
/// travels separately, in `AZURE_STORAGE_CONNECTION_STRING`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountRequest {
    pub blob: String,
    pub mountpoint: PathBuf,
    /// The mountpoint directory's (device, inode) when `blobdrive mount` checked
    /// it: the daemon mounts there only if the path still leads to it.
    #[serde(default)]
    pub mountpoint_id: Option<(u64, u64)>,
    pub mode: Mode,
    pub mkfs: Option<String>,
    pub read_only: bool,
    pub cache_size: u64,
    pub uid: u32,
    pub gid: u32,
    /// Extra flags for the filesystem mount (mode fs), e.g. `nosuid`, `noatime`:
    /// from an fstab line's options.
    #[serde(default)]
    pub fs_flags: Vec<String>,
    /// Where to serve the mount's metrics (`--metrics HOST:PORT`).
    #[serde(default)]
    pub metrics: Option<String>,
    /// The directory holding disk caches (`--disk-cache DIR`), if any.
    #[serde(default)]
    pub disk_cache: Option<PathBuf>,
    /// The disk cache's limit (`--disk-cache-size`); by default the drive's
    /// size, at most half the space free in the directory's filesystem.
    #[serde(default)]
    pub disk_cache_size: Option<u64>,
    /// How long and how often I/O tries the service, as the command line read
    /// them from its environment.
    #[serde(default)]
    pub io: IoSettings,
    /// The user the network-facing part of the daemon runs as (`--run-as`,
    /// fstab's `run-as=`), split from a small root part (see
    /// `mount::rootpart`). `None`: `privsep::DEFAULT_USER`.
    #[serde(default)]
    pub run_as: Option<String>,
    /// Fill the disk cache with the drive's allocated pages once the mount is
    /// ready (`--warm`, fstab's `warm`), in the background.
    #[serde(default)]
    pub warm: bool,
    /// At most this many bytes a second (`--warm=SIZE`, fstab's `warm=SIZE`).
    #[serde(default)]
    pub warm_max_rate: Option<u64>,
    /// An encrypted drive's passphrase follows on the daemon's standard input
    /// (`--key-file`, ...; never in the request, which is in the environment).
    #[serde(default)]
    pub passphrase_follows: bool,
    /// Discards are refused rather than sent to the blob (`--no-discard`,
    /// fstab's `no-discard`).
    #[serde(default)]
    pub no_discard: bool,
}

/// How long and how often a mount's I/O tries the storage service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoSettings {
    /// Each request's retries (`BLOBDRIVE_RETRY_BUDGET_SECS`,
    /// `BLOBDRIVE_REQUEST_TIMEOUT_SECS`, `BLOBDRIVE_MAX_ATTEMPTS`).
    pub retry: crate::azure::RetryPolicy,
    /// How long one I/O waits through an outage (`BLOBDRIVE_IO_TIMEOUT_SECS`).
    pub io_timeout: std::time::Duration,
    /// How long the root part leaves a filesystem frozen for a snapshot before
    /// it thaws it itself, if the worker has not asked it to
    /// (`BLOBDRIVE_FREEZE_LIMIT_SECS`): every writer waits while it is frozen.
    #[serde(default = "default_freeze_limit")]
    pub freeze_limit: std::time::Duration,
}

/// See [`IoSettings::freeze_limit`]: as long as `blobdrive snapshot create`
/// waits for the daemon.
pub const DEFAULT_FREEZE_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

fn default_freeze_limit() -> std::time::Duration {
    DEFAULT_FREEZE_LIMIT
}

impl Default for IoSettings {
    fn default() -> Self {
        IoSettings {
            retry: crate::azure::RetryPolicy::default(),
            io_timeout: crate::device::remote::DEFAULT_IO_TIMEOUT,
            freeze_limit: DEFAULT_FREEZE_LIMIT,
        }
    }
}

/// The filesystem types blobdrive mounts. A drive is bytes from the network that
/// whoever can write the blob controls; these are the filesystems whose kernel
/// drivers are built and fuzzed for disks, and the ones `--mkfs` creates.
pub const MOUNTABLE_FS: &[&str] = &["ext4", "xfs"];

/// The flags a filesystem is mounted with: `flags` as given, plus `nosuid` and
/// `nodev` unless `suid` or `dev` opts in (the last of each pair wins, as in
/// mount(8)). Whoever can write the blob could otherwise plant a setuid-root
/// program or a device node that any local user can use to become root.
pub fn hardened_fs_flags(flags: &[String]) -> Vec<String> {
    let last = |on: &str, off: &str| {
        flags
            .iter()
            .rev()
            .find(|f| *f == on || *f == off)
            .is_some_and(|f| f == on)
    };
    let (suid, dev) = (last("suid", "nosuid"), last("dev", "nodev"));
    let mut out: Vec<String> = flags
        .iter()
        .filter(|f| !matches!(f.as_str(), "suid" | "nosuid" | "dev" | "nodev"))
        .cloned()
        .collect();
    out.push(if suid { "suid" } else { "nosuid" }.to_string());
    out.push(if dev { "dev" } else { "nodev" }.to_string());
    out
}

/// What a ready mount reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ready {
    pub mountpoint: PathBuf,
    pub mode: Mode,
    pub device: Option<String>,
    pub fstype: Option<String>,
    pub fuse_dir: PathBuf,
    pub read_only: bool,
    pub pid: u32,
    pub formatted: bool,
    /// What the user should hear about the mount (e.g. a `--mkfs` that was
    /// ignored); `blobdrive mount` prints them.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// What was done on the way that the user should know of (a filesystem
    /// grown to fill its disk); printed as they are.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// Why a mount or unmount failed.
#[derive(Debug, Error)]
pub enum MountError {
    #[error(transparent)]
    Drive(#[from] crate::drive::DriveError),
    #[error(transparent)]
    Azure(#[from] crate::azure::AzureError),
    /// Something the system was asked to do failed (a file, a process, a
    /// thread, a mount): what, and the error the system gave, kept as the
    /// source.
    ///
    /// Shown as "what: source", as every message here always was (logs and
    /// the control socket print errors with `{}`, not the whole chain); the
    /// command line prints chains without a cause the message already ends
    /// with, so anyhow's `{:#}` does not say it twice.
    #[error("{what}{}", cause_text(.source.as_deref()))]
    System {
        what: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// The filesystem is in use; everything stays mounted.
    #[error("{0} is busy (files open or a process inside it); close them and try again. The drive stays mounted and safe.")]
    Busy(String),
    #[error("{0}")]
    Data(String),
}

impl MountError {
    /// A failure of the system described by `what` alone.
    pub fn system(what: impl Into<String>) -> MountError {
        MountError::System {
            what: what.into(),
            source: None,
        }
    }

    /// A failure of the system while doing `what`, for the reason `source`.
    pub fn with_source(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> MountError {
        MountError::System {
            what: what.into(),
            source: Some(source.into()),
        }
    }
}

/// ": " and the cause's message, if there is a cause.
fn cause_text(source: Option<&(dyn std::error::Error + Send + Sync + 'static)>) -> String {
    source.map(|e| format!(": {e}")).unwrap_or_default()
}

#[cfg(test)]
mod error_tests {
    use super::MountError;
    use std::error::Error as _;

    #[test]
    fn a_system_failure_says_what_and_why_and_keeps_the_why_as_its_source() {
        let e =
            MountError::with_source("cannot create /r/x", std::io::Error::from_raw_os_error(13));
        assert_eq!(
            e.to_string(),
            "cannot create /r/x: Permission denied (os error 13)"
        );
        let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(io.and_then(std::io::Error::raw_os_error), Some(13));
        let e = MountError::system("the drive is not set up");
        assert_eq!(e.to_string(), "the drive is not set up");
        assert!(e.source().is_none());
    }
}

#[cfg(test)]
mod flag_tests {
    use super::hardened_fs_flags;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn filesystems_are_nosuid_and_nodev_unless_asked() {
        assert_eq!(hardened_fs_flags(&[]), v(&["nosuid", "nodev"]));
        assert_eq!(
            hardened_fs_flags(&v(&["noatime"])),
            v(&["noatime", "nosuid", "nodev"])
        );
        assert_eq!(hardened_fs_flags(&v(&["suid"])), v(&["suid", "nodev"]));
        assert_eq!(hardened_fs_flags(&v(&["dev", "suid"])), v(&["suid", "dev"]));
        // The last word wins, as in mount(8).
        assert_eq!(
            hardened_fs_flags(&v(&["suid", "nosuid", "nodev", "dev"])),
            v(&["nosuid", "dev"])
        );
    }
}

/// The name of a drive's own directory in a `--disk-cache` directory: the
/// same for every mount of the same blob (or snapshot) at the same endpoint.
pub(crate) fn disk_cache_name(
    account: &crate::azure::Account,
    container: &str,
    blob: &str,
    snapshot: Option<&str>,
) -> String {
    let endpoint = &account.blob_endpoint;
    crate::device::diskcache::files::dir_name(
        &format!(
            "{}{}",
            endpoint.origin().ascii_serialization(),
            endpoint.path()
        ),
        &account.name,
        container,
        blob,
        snapshot,
    )
}
