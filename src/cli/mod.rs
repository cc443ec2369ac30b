//! The command line: clap definitions and dispatch. Each command lives in its own
//! file and is a thin layer over the library.

mod auth;
mod changes;
mod completions;
mod context;
mod create;
mod csi;
mod delete;
pub mod helper;
mod info;
mod key;
mod lease;
mod list;
mod manpages;
mod mount;
mod mounted;
mod passphrase;
mod resize;
mod settings;
mod snapshot;
mod stats;
mod transfer;
pub mod umount_helper;
mod unmount;
mod warm;

use clap::{Parser, Subcommand};

pub use context::Context;

const AFTER_HELP: &str = "\
BLOB names a drive: container/name.vhd, or a full https://account.blob.core.windows.net/container/name.vhd[?SAS] URL.
BLOB@SNAPSHOT names a snapshot of it (e.g. disks/a.vhd@2026-11-22T11:05:54.5810000Z).
SIZE is a whole number of bytes, or with a binary unit: KiB, MiB, GiB, TiB (K, M, G, T
mean the same). Decimal spellings (KB, MB, GB, TB) are refused as ambiguous.

The account comes from --connection-string or AZURE_STORAGE_CONNECTION_STRING (else
AZURE_STORAGE_ACCOUNT names it, signed in with Entra ID), or from a credentials file
(mount --credentials FILE, fstab credentials=FILE). There is no default: with none of
them, commands that need an account fail at once. The local emulator is used only when
named (UseDevelopmentStorage=true, or its endpoint in a connection string). Prefer the
environment variable for real keys: a command-line argument is visible to every user
in `ps`.

Signing in: a blob given with no key or SAS (a URL, a connection string with only
BlobEndpoint, or AZURE_STORAGE_ACCOUNT) signs in with Microsoft Entra ID, trying in
this order and using the first that is set up:
  service-principal  AZURE_TENANT_ID + AZURE_CLIENT_ID + AZURE_CLIENT_SECRET, or
                     AZURE_CLIENT_CERTIFICATE_PATH (PEM with certificate and key)
  workload-identity  AZURE_FEDERATED_TOKEN_FILE + AZURE_TENANT_ID + AZURE_CLIENT_ID
  managed-identity   IMDS (AZURE_POD_IDENTITY_AUTHORITY_HOST replaces its host), or
                     IDENTITY_ENDPOINT + IDENTITY_HEADER; user-assigned by
                     --identity-client-id or AZURE_CLIENT_ID
  azure-cli          `az account get-access-token` (after `az login`)
AZURE_AUTHORITY_HOST picks a sovereign cloud. --auth NAME uses one of these only;
--auth key|sas uses the key or SAS; --auth anonymous sends unsigned requests (public
containers). The identity needs the role \"Storage Blob Data Contributor\" (or
\"Storage Blob Data Reader\" for read-only use). Mounts renew their tokens themselves.

TLS trusts the system's certificate store; SSL_CERT_FILE or SSL_CERT_DIR replace it.
A private CA: add it with update-ca-certificates, or point SSL_CERT_FILE at it.

qemu-img probes a fixed VHD as raw (its footer is at the end, not the start): pass
`-f vpc` when giving it one, e.g. `qemu-img info -f vpc disk.vhd` on a downloaded drive.

Examples:
  blobdrive create disks/data.vhd --size 64GiB --create-container
  blobdrive info disks/data.vhd --json
  blobdrive lease break disks/data.vhd --yes   # only when its host is gone
  sudo blobdrive mount disks/data.vhd /mnt/data --mkfs ext4
  sudo blobdrive unmount /mnt/data

At boot (with the Debian package, or after `sudo scripts/install.sh`): an fstab line
of type blobdrive, e.g.
  disks/data.vhd  /data  blobdrive  _netdev,nofail,credentials=/etc/blobdrive/acct.env  0 0
(mount.blobdrive(8) and `mount.blobdrive --help` list its options), or the unit
blobdrive@.service (see the manual's boot.md). A plain `umount` of such a filesystem
writes everything and releases the lease.

The manual, a page per topic: /usr/share/doc/blobdrive/README.md and docs/*.md with
the package, README.md and docs/ in the source.";

/// Azure page blobs (fixed VHDs) as Linux drives.
#[derive(Debug, Parser)]
#[command(name = "blobdrive", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// Azure Storage connection string (no default; UseDevelopmentStorage=true names
    /// the local emulator).
    #[arg(
        long,
        global = true,
        env = "AZURE_STORAGE_CONNECTION_STRING",
        hide_env_values = true,
        value_name = "CS"
    )]
    pub connection_string: Option<String>,

    /// Which credential to use: key, sas, anonymous, entra (the first Entra ID
    /// source set up), or one Entra ID source [default: auto: the key or SAS
    /// given, else Entra ID]. `blobdrive --help` explains the chain.
    #[arg(long, global = true, value_enum, env = auth::AUTH_ENV, value_name = "HOW")]
    pub auth: Option<auth::AuthChoice>,

    /// Client id of a user-assigned managed identity [default: AZURE_CLIENT_ID, else
    /// the system-assigned identity].
    #[arg(
        long,
        global = true,
        env = blobdrive::azure::auth::entra::chain::IDENTITY_CLIENT_ID_ENV,
        value_name = "ID"
    )]
    pub identity_client_id: Option<String>,

    /// More log output on stderr (-v info, -vv debug, -vvv trace); BLOBDRIVE_LOG
    /// takes a full filter instead.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// How much to log (`-v`s): a CSI driver is a service whose log is what
    /// its operator reads (what it stages, its cache budget), so it says what
    /// it does (info) without being asked; every other command only warns.
    pub fn log_level(&self) -> u8 {
        match self.command {
            Command::Csi(_) => self.verbose.max(1),
            _ => self.verbose,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new empty drive: a page blob holding a fixed VHD of SIZE.
    Create(create::Args),
    /// Show a drive's size, allocation, lease, snapshots and encryption.
    Info(info::Args),
    /// Grow a drive to SIZE, unmounted or mounted here (never shrinks).
    Resize(resize::Args),
    /// Inspect or break a drive's lease (the lock held by a writable mount).
    #[command(subcommand)]
    Lease(lease::Command),
    /// Add, remove or change an encrypted drive's passphrases (its LUKS2 keyslots).
    #[command(subcommand)]
    Key(key::Command),
    /// Delete a drive (or one snapshot of it). Needs --yes.
    Delete(delete::Args),
    /// Mount a drive as a filesystem, a block device or a raw file (needs root).
    Mount(mount::Args),
    /// Unmount a drive: write everything, release the lease, undo the mount.
    Unmount(unmount::Args),
    /// List the drives mounted on this machine.
    List(list::Args),
    /// Show a mounted drive's request and cache counters.
    Stats(stats::Args),
    /// Fill a mounted drive's disk cache with its data (a mount with --disk-cache).
    Warm(warm::Args),
    /// Take, list, delete and prune snapshots (point-in-time images), and list
    /// what changed between them.
    #[command(subcommand)]
    Snapshot(snapshot::Command),
    /// Upload a raw image or fixed VHD as a new drive (only data is sent).
    Upload(transfer::UploadArgs),
    /// Download a drive or snapshot into a sparse local file, or update an older copy.
    Download(transfer::DownloadArgs),
    /// Put a snapshot's content back onto its drive (not while mounted).
    Restore(transfer::RestoreArgs),
    /// Print the completion script for bash, zsh or fish.
    Completions(completions::Args),
    /// Write the manual pages (blobdrive(8), one per command, and the helpers') into DIR.
    Manpages(manpages::Args),
    /// Serve the Kubernetes CSI driver (controller, node, or both) on a unix socket.
    Csi(csi::Args),
    /// Internal: the mount daemon, started by `mount`.
    #[command(name = "__daemon", hide = true)]
    Daemon,
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        if let Some(id) = &self.identity_client_id {
            // The chain and the mount daemon read it from the environment.
            std::env::set_var(
                blobdrive::azure::auth::entra::chain::IDENTITY_CLIENT_ID_ENV,
                id,
            );
        }
        let auth = self.auth.unwrap_or_default();
        if let Command::Mount(a) = self.command {
            // Its account may come from a credentials file instead.
            let say = if a.json {
                mount::Say::Json
            } else {
                mount::Say::Mounted
            };
            return mount::run(a, self.connection_string.as_deref(), auth, say);
        }
        // Neither needs an account.
        let command = match self.command {
            Command::Completions(a) => return completions::run(a),
            Command::Manpages(a) => return manpages::run(a),
            other => other,
        };
        let ctx = Context::new(self.connection_string.as_deref(), auth)?;
        match command {
            Command::Create(a) => create::run(&ctx, a),
            Command::Info(a) => info::run(&ctx, a),
            Command::Resize(a) => resize::run(&ctx, a),
            Command::Lease(c) => lease::run(&ctx, c),
            Command::Key(c) => key::run(&ctx, c),
            Command::Delete(a) => delete::run(&ctx, a),
            Command::Mount(_) => unreachable!("handled above"),
            Command::Unmount(a) => unmount::run(a),
            Command::List(a) => list::run(a),
            Command::Stats(a) => stats::run(a),
            Command::Warm(a) => warm::run(a),
            Command::Snapshot(c) => snapshot::run(&ctx, c),
            Command::Upload(a) => transfer::upload(&ctx, a),
            Command::Download(a) => transfer::download(&ctx, a),
            Command::Restore(a) => transfer::restore(&ctx, a),
            Command::Csi(a) => csi::run(&ctx, a),
            Command::Daemon => mount::run_daemon(&ctx),
            Command::Completions(_) | Command::Manpages(_) => unreachable!("handled above"),
        }
    }
}

/// A command's `--json` result: one pretty-printed object on standard output,
/// as `info --json` prints it.
fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// `e` and its causes joined with ": ", as anyhow's `{:#}` prints them, but
/// without a cause the text before it already ends with: an error that shows
/// its source in its own message, as `MountError::System` does, would
/// otherwise say it twice.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if text.is_empty() {
            text = said;
        } else if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
    }
    text
}

#[cfg(test)]
mod error_text_tests {
    use super::error_text;
    use anyhow::Context as _;
    use blobdrive::mount::MountError;

    #[test]
    fn a_cause_the_message_already_shows_is_said_once() {
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = Err::<(), _>(MountError::with_source("cannot create /r/x", denied()))
            .context("mount failed")
            .unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "mount failed: cannot create /r/x: permission denied: permission denied"
        );
        assert_eq!(
            error_text(&e),
            "mount failed: cannot create /r/x: permission denied"
        );
        // Causes not shown by the message before them are all said.
        let e = anyhow::Error::new(denied()).context("cannot open /r/y");
        assert_eq!(error_text(&e), "cannot open /r/y: permission denied");
    }
}
