//! `blobdrive delete`: remove a drive, or one snapshot of it.

use anyhow::{bail, Result};
use blobdrive::azure::DeleteSnapshots;
use blobdrive::drive;

use super::Context;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The drive (container/name.vhd), or BLOB@SNAPSHOT to delete only that snapshot.
    pub blob: String,
    /// Also delete the drive's snapshots (required when it has any).
    #[arg(long)]
    pub snapshots: bool,
    /// Confirm: the drive's data is destroyed.
    #[arg(long)]
    pub yes: bool,
    /// Print one JSON object instead of text: deleted (the drive or snapshot)
    /// and snapshots (whether the drive's snapshots went with it).
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let (r, blob) = ctx.blob(&args.blob)?;
    if !args.yes {
        bail!("refusing to delete {r} without --yes: its data would be gone for good");
    }
    if r.snapshot.is_some() && args.snapshots {
        bail!("--snapshots deletes a drive's snapshots with the drive; it makes no sense with a snapshot ({r})");
    }
    ctx.block_on(async {
        let props = drive::properties(&blob).await?;
        drive::check_page_blob(&blob, &props)?;
        let mode = if args.snapshots {
            DeleteSnapshots::Include
        } else {
            DeleteSnapshots::None
        };
        // A drive on the condition of its ETag as checked: a copy of this delete
        // that lands after a drive of the same name was created anew must not
        // delete that one. (A snapshot never changes and its name is never used
        // again.)
        let etag = props.etag.as_deref().filter(|_| r.snapshot.is_none());
        match blob.delete_if_match(mode, None, etag).await {
            // Gone since: an earlier attempt of ours that got no answer did it.
            // Still there: it changed while it was being deleted.
            Err(e) if e.is_changed_since_read() => match blob.properties().await {
                Err(gone) if gone.is_not_found() => {}
                _ => bail!(
                    "{r} changed while it was being deleted (another party wrote it): nothing was deleted; run it again"
                ),
            },
            done => done?,
        }
        anyhow::Ok(())
    })??;
    if args.json {
        return super::print_json(&serde_json::json!({
            "deleted": r.to_string(),
            "snapshots": args.snapshots,
        }));
    }
    if args.snapshots {
        println!("deleted {r} and its snapshots");
    } else {
        println!("deleted {r}");
    }
    Ok(())
}
