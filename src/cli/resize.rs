//! `blobdrive resize`: grow a drive, unmounted or mounted here.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};
use blobdrive::azure::BlobClient;
use blobdrive::mount::{daemon, record, superblock};
use blobdrive::resize::{self, Resized};
use blobdrive::size::human;
use blobdrive::vhd::FOOTER_SIZE;

use super::create::disk_size_arg;
use super::Context;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
The page blob grows to SIZE plus its 512-byte footer; the grown part reads as zeros.
The VHD footer is written at the new end for the new size (same disk id) and the
old footer's page cleared. Snapshots keep their own size.

Not mounted: it runs under a 60-second lease, so nothing else writes the drive
meanwhile. A drive mounted on another machine holds its lease and is refused. The
filesystem on it keeps its size until the next writable mount grows it to fill
the disk (ext4 before it is mounted, xfs after). On an encrypted drive (LUKS2) the
data segment fills the disk and so grows with it, the header left as it is; its
filesystem, unreadable without the passphrase, grows at the next writable mount.

Mounted writable here (named by its mountpoint, or by the blob): the mount's daemon
does it under its own lease while I/O goes on, then the disk file and the loop
device take the new size, and a mounted filesystem grows in place (the kernel grows
it, as resize2fs and xfs_growfs ask it to). With --mode block, grow what is on the
device yourself. Growing a mounted ext4 needs CAP_SYS_RESOURCE; without it (some
containers) the resize is refused before anything changes, naming the way round. A
read-only mount of the drive (here or elsewhere) keeps the size it was mounted with
until it is mounted again.

If it is interrupted (a crash, the network), the drive says so: `info` and `mount`
refuse it with \"resize incomplete\", naming the resize that completes it, and running
the same resize again picks up where it stopped.")]
pub struct Args {
    /// The drive (container/name.vhd; not a snapshot), or where it is mounted on
    /// this machine (an absolute path, or one starting with ./ or ../).
    #[arg(value_name = "BLOB|MOUNTPOINT")]
    pub drive: String,
    /// The new disk size: whole MiB, larger than the drive's (shrinking would cut off
    /// data and is refused).
    #[arg(long, value_name = "SIZE")]
    pub size: String,
    /// Print one JSON object instead of text: blob, from_bytes, size_bytes,
    /// blob_bytes, grown, mountpoint (null when not mounted here) and note (what
    /// became of the filesystem, or null).
    #[arg(long)]
    pub json: bool,
}

/// What `resize --json` prints.
#[derive(Debug, serde::Serialize)]
struct Outcome {
    blob: String,
    /// The disk size before (null when a mount's daemon could not say).
    from_bytes: Option<u64>,
    size_bytes: u64,
    blob_bytes: u64,
    grown: bool,
    mountpoint: Option<std::path::PathBuf>,
    note: Option<String>,
}

/// How long a mounted drive's daemon may take: it may first wait for a flush
/// under way, and a large filesystem takes a while to grow.
const ONLINE_TIMEOUT: Duration = Duration::from_secs(900);

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let size = disk_size_arg(&args.size)?;
    if is_path(&args.drive) {
        let (mp, rec) =
            record::at_mountpoint(Path::new(&args.drive)).map_err(anyhow::Error::msg)?;
        let Some(m) = rec else {
            bail!(
                "nothing is mounted by blobdrive at {} (name the drive as container/name.vhd to grow it unmounted)",
                mp.display()
            );
        };
        return online(&m, size, args.json);
    }
    let (r, blob) = ctx.blob(&args.drive)?;
    if r.snapshot.is_some() {
        bail!("{r} is a snapshot: snapshots keep their size; resize the drive itself");
    }
    let endpoint = blob.service().account().endpoint_for_messages();
    if let Some(m) = record::writable_mount(&endpoint, &r.base().to_string()) {
        return online(&m, size, args.json);
    }
    let (from, to, note) = match ctx.block_on(resize::grow(&blob, size))?? {
        Resized::Grown { from, to } => (from, to, ctx.block_on(filesystem_left_small(&blob, to))?),
        Resized::Unchanged(s) => (s, s, None),
    };
    if args.json {
        return print_outcome(Outcome {
            blob: r.to_string(),
            from_bytes: Some(from),
            size_bytes: to,
            blob_bytes: to + FOOTER_SIZE,
            grown: to != from,
            mountpoint: None,
            note,
        });
    }
    if from == to {
        println!("{r} is already {} ({to} bytes): nothing to do", human(to));
        return Ok(());
    }
    println!(
        "grew {r} from {} to {} ({to} bytes of disk, blob {} bytes)",
        human(from),
        human(to),
        to + FOOTER_SIZE
    );
    if let Some(next) = note {
        println!("{next}");
    }
    Ok(())
}

fn print_outcome(o: Outcome) -> Result<()> {
    super::print_json(&serde_json::to_value(o)?)
}

/// What to do next when the drive holds a filesystem that is now smaller than
/// the disk: growing the blob leaves the filesystem on it as it was, and `df`
/// after the next mount would show the old size without a word. An encrypted
/// drive's filesystem cannot be read here: what is true of it is said.
async fn filesystem_left_small(blob: &BlobClient, disk: u64) -> Option<String> {
    match blobdrive::encrypted::facts(blob, disk).await {
        Ok(Some(facts)) => return Some(encrypted_note(&facts, disk)),
        Ok(None) => {}
        Err(e) => tracing::warn!("cannot tell whether the drive is encrypted: {e}"),
    }
    let head = blob
        .read(0, superblock::HEAD_BYTES as u64)
        .await
        .map_err(|e| tracing::warn!("cannot read the filesystem's superblock: {e}"))
        .ok()?;
    let fs = superblock::detect(&head)?;
    superblock::worth_growing(fs.fstype, fs.bytes, disk).then(|| {
        format!(
            "the {} filesystem on it is still {}: the next writable `blobdrive mount` of it (--mode fs) grows it to fill the disk (in --mode block, grow it on the device yourself: {})",
            fs.fstype,
            human(fs.bytes),
            if fs.fstype == "xfs" { "xfs_growfs once it is mounted" } else { "e2fsck -f, then resize2fs" }
        )
    })
}

/// What became of an encrypted drive (of `disk` bytes now) grown unmounted:
/// its data segment fills the disk (its size is "dynamic"), and the
/// filesystem in it, which cannot be read without the passphrase, is grown
/// by the next writable mount as on a plain drive.
fn encrypted_note(facts: &blobdrive::encrypted::Facts, disk: u64) -> String {
    let plain = facts
        .header
        .as_ref()
        .map(|h| {
            format!(
                " (the plaintext disk is now {})",
                human(disk.saturating_sub(h.data_offset))
            )
        })
        .unwrap_or_default();
    format!(
        "it is encrypted ({}): its data segment grew with the disk{plain}; a filesystem in it keeps its old size (it cannot be read without the passphrase) until the next writable `blobdrive mount` of it (--mode fs) grows it to fill the disk, as on a plain drive (in --mode block, grow it on the device yourself)",
        facts.kind
    )
}

/// Whether the argument names a directory rather than a blob (`container/name`
/// is a relative path too, so only explicit ones count).
fn is_path(arg: &str) -> bool {
    Path::new(arg).is_absolute() || arg.starts_with("./") || arg.starts_with("../")
}

/// Has the daemon of mount `m` grow it.
fn online(m: &record::MountRecord, size: u64, json: bool) -> Result<()> {
    let mp = m.mountpoint.display();
    if let Some(snap) = &m.snapshot {
        bail!(
            "{}@{snap} (mounted at {mp}) is a snapshot: snapshots keep their size; resize the drive itself ({})",
            m.blob,
            m.blob
        );
    }
    if m.read_only {
        bail!("{} is mounted read-only at {mp}: resize it where it is mounted writable, or while it is not mounted", m.blob);
    }
    if !record::alive(m) {
        bail!(
            "the daemon of {mp} (pid {}) is dead; run `blobdrive unmount {mp}` first",
            m.pid
        );
    }
    let from = served_size(m);
    // A large filesystem takes a while to grow: the daemon says what it is at
    // every few seconds.
    let answer = daemon::control_with_progress(
        &m.socket,
        &format!("resize {size}"),
        Some(ONLINE_TIMEOUT),
        &mut |p| eprintln!("{p}"),
    )?;
    let Some(what) = answer.strip_prefix("ok ") else {
        bail!("{}", answer.strip_prefix("error ").unwrap_or(&answer));
    };
    if json {
        return print_outcome(Outcome {
            blob: m.blob.clone(),
            from_bytes: from,
            size_bytes: size,
            blob_bytes: size + FOOTER_SIZE,
            grown: from != Some(size),
            mountpoint: Some(m.mountpoint.clone()),
            note: Some(what.to_string()),
        });
    }
    println!("{what}");
    Ok(())
}

/// The drive's disk size the daemon of mount `m` serves now, from its
/// `stats` (an encrypted drive serves its data segment: the disk less the
/// header before it).
fn served_size(m: &record::MountRecord) -> Option<u64> {
    let answer = daemon::control(&m.socket, "stats", Some(Duration::from_secs(10))).ok()?;
    let stats = serde_json::from_str::<serde_json::Value>(&answer).ok()?;
    let offset = stats["encrypted_data_offset"].as_u64().unwrap_or(0);
    Some(stats["disk_size"].as_u64()? + offset)
}
