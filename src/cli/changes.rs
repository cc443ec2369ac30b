//! `blobdrive snapshot changes`: the extents that changed between two
//! snapshots of a drive (or since one), or that one holds, for scripts that
//! back drives up without Kubernetes (see `blobdrive::changes`).

use anyhow::{bail, Result};
use blobdrive::azure::{BlobClient, PageRange};
use blobdrive::blobref::BlobRef;
use blobdrive::changes::{self, Extents};
use blobdrive::size::human;

use super::Context;

/// Extents printed at a time.
const BATCH: usize = 1000;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each extent is printed as OFFSET LENGTH, in bytes of the disk (the VHD footer after it
is never listed), in order and disjoint; a summary goes to standard error. With --json:
{\"extents\": [[OFFSET, LENGTH], ...], \"disk_size\", \"from\", \"to\", \"method\",
\"count\", \"bytes\"}.

The changes are the storage service's snapshot diff: pages written or cleared since
--from (a cleared page reads as zeros). Where the service gives no diff (the Azurite
emulator; a drive overwritten by `restore` since --from) every extent allocated in
either snapshot is listed instead (\"method\": \"compare\"): more than changed, never
less. Copying the listed extents of --to onto a copy of --from makes a copy of --to.

Examples:
  blobdrive snapshot changes disks/data.vhd --from 2026-11-22T11:05:54.5810000Z --json
  blobdrive snapshot changes disks/data.vhd@2026-11-22T11:05:54.5810000Z")]
pub struct Args {
    /// The drive (container/name.vhd), or one snapshot of it (BLOB@SNAPSHOT) to
    /// list the changes up to, or the allocated extents of.
    pub blob: String,
    /// The older snapshot the changes are counted from (its time, or
    /// BLOB@SNAPSHOT as `snapshot create` prints it); without it, the
    /// allocated extents are listed.
    #[arg(long, value_name = "SNAPSHOT")]
    pub from: Option<String>,
    /// The newer snapshot the changes are counted up to [default: the drive as
    /// it is now].
    #[arg(long, value_name = "SNAPSHOT")]
    pub to: Option<String>,
    /// Print one JSON object (see below).
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Context, a: Args) -> Result<()> {
    let (r, client) = ctx.blob(&a.blob)?;
    let to = match (&a.to, &r.snapshot) {
        (Some(_), Some(_)) => {
            bail!("name the newer snapshot once: BLOB@SNAPSHOT or --to, not both")
        }
        (Some(t), None) => Some(r.snapshot_of(t)?),
        (None, s) => s.clone(),
    };
    let from = a.from.as_deref().map(|f| r.snapshot_of(f)).transpose()?;
    let target = client.at_snapshot(to.as_deref());
    let base = from.as_deref().map(|f| client.at_snapshot(Some(f)));
    ctx.block_on(async {
        let extents = match &base {
            Some(b) => changes::delta(b, &target, 0).await?,
            None => changes::allocated(&target, 0).await?,
        };
        let shown = Shown {
            r: &r,
            from: from.as_deref(),
            to: to.as_deref(),
        };
        if a.json {
            print_json(extents, &shown).await
        } else {
            print_lines(extents, &shown, &target).await
        }
    })?
}

/// What the listing is of, as the user named it.
struct Shown<'a> {
    r: &'a BlobRef,
    from: Option<&'a str>,
    to: Option<&'a str>,
}

async fn print_lines(mut extents: Extents, shown: &Shown<'_>, target: &BlobClient) -> Result<()> {
    let (mut count, mut bytes) = (0u64, 0u64);
    while let Some(batch) = extents.next_batch(BATCH).await? {
        let mut text = String::new();
        for e in &batch {
            text.push_str(&format!("{} {}\n", e.start, e.len()));
        }
        print!("{text}");
        count += batch.len() as u64;
        bytes += batch.iter().map(PageRange::len).sum::<u64>();
    }
    let what = match shown.from {
        Some(f) => format!(
            "changed in {} since {}@{f}",
            target.target(),
            shown.r.base()
        ),
        None => format!("allocated in {}", target.target()),
    };
    eprintln!(
        "{count} extents, {} {what}, of a {} disk (from {})",
        human(bytes),
        human(extents.disk_size()),
        extents.method().describe()
    );
    Ok(())
}

async fn print_json(mut extents: Extents, shown: &Shown<'_>) -> Result<()> {
    let head = serde_json::json!({
        "drive": shown.r.base().to_string(),
        "from": shown.from,
        "to": shown.to,
        "disk_size": extents.disk_size(),
        "method": extents.method(),
    })
    .to_string();
    // The object is written as it goes: its fields, then the extents as they
    // come, then the totals.
    print!("{},\"extents\":[", head.trim_end_matches('}'));
    let (mut count, mut bytes) = (0u64, 0u64);
    while let Some(batch) = extents.next_batch(BATCH).await? {
        let mut text = String::new();
        for e in &batch {
            if count > 0 {
                text.push(',');
            }
            text.push_str(&format!("[{},{}]", e.start, e.len()));
            count += 1;
            bytes += e.len();
        }
        print!("{text}");
    }
    println!("],\"count\":{count},\"bytes\":{bytes}}}");
    Ok(())
}
