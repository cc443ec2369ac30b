//! `blobdrive delete`: remove a drive, or one snapshot of it.

use anyhow::{bail, Result};
use blobdrive::azure::DeleteSnapshots;
use blobdrive::blobref::BlobRef;
use blobdrive::drive;
use blobdrive::mount::record;

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
    let endpoint = blob.service().account().endpoint_for_messages();
    refuse_if_mounted_here(&endpoint, &r, args.snapshots)?;
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

/// Refuses to delete what a mount of this very machine serves (the drive, or
/// with `snapshots` one of its snapshots; `r`'s snapshot if it names one): the
/// service would refuse a leased drive and suggest breaking its lease "if that
/// host is dead", when the host is this one and the way is to unmount. A user
/// who cannot read this machine's mounts is left to the service's answer.
fn refuse_if_mounted_here(endpoint: &str, r: &BlobRef, snapshots: bool) -> Result<()> {
    let base = r.base().to_string();
    let serves = |m: &record::MountRecord| match &r.snapshot {
        Some(id) => m.snapshot.as_ref() == Some(id),
        None => m.snapshot.is_none() || snapshots,
    };
    let Some(m) = record::load_all()
        .into_iter()
        .find(|m| (m.endpoint.is_empty() || m.endpoint == endpoint) && m.blob == base && serves(m))
    else {
        return Ok(());
    };
    let what = match &m.snapshot {
        Some(s) => format!("{base}@{s}"),
        None => base,
    };
    let mp = m.mountpoint.display();
    if record::alive(&m) {
        bail!(
            "{what} is mounted on this machine, at {mp}: unmount it first (`blobdrive unmount {mp}`); nothing was deleted"
        );
    }
    bail!(
        "{what} was mounted on this machine at {mp} and its daemon (pid {}) is dead: run `blobdrive unmount {mp}` first, which cleans up after it; nothing was deleted",
        m.pid
    )
}
