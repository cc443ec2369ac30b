//! `blobdrive snapshot create|list|delete|prune|changes`.

use std::time::Duration;

use anyhow::{bail, Result};
use blobdrive::azure::xml::is_snapshot_id;
use blobdrive::azure::DeleteSnapshots;
use blobdrive::mount::{daemon, record, Mode};
use blobdrive::size::human;
use blobdrive::{drive, snapshot};

use super::Context;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Take a snapshot. If the drive is mounted writable on this machine, the
    /// snapshot is consistent: the filesystem is frozen and the cache flushed first.
    Create {
        /// The drive (container/name.vhd).
        blob: String,
        /// Print {"blob": "..", "snapshot": "..", "taken": ".."} (taken: how:
        /// consistent, flushed, or not mounted on this machine).
        #[arg(long)]
        json: bool,
    },
    /// List a drive's snapshots, oldest first.
    List {
        /// The drive (container/name.vhd) whose snapshots to list.
        blob: String,
        /// Print a JSON array of {blob, snapshot, time, allocated_bytes}.
        #[arg(long)]
        json: bool,
    },
    /// Delete one snapshot (BLOB@SNAPSHOT).
    Delete {
        /// The snapshot to delete: container/name.vhd@SNAPSHOT, as `snapshot list`
        /// prints it (the drive itself is never deleted here).
        blob: String,
        /// Print {"deleted": "BLOB@SNAPSHOT"}.
        #[arg(long)]
        json: bool,
    },
    /// Delete all but the newest N snapshots.
    Prune {
        /// The drive (container/name.vhd) whose snapshots to prune.
        blob: String,
        /// How many of the newest snapshots to keep.
        #[arg(long, value_name = "N")]
        keep: usize,
        /// Only print what would be deleted.
        #[arg(long)]
        dry_run: bool,
        /// Print one JSON object instead of text: blob, dry_run, deleted (the
        /// snapshots deleted; with --dry-run would_delete instead), kept, and
        /// skipped (those mounted here, each with its mountpoint).
        #[arg(long)]
        json: bool,
    },
    /// List the extents that changed between two snapshots (or since one), or
    /// that a drive or snapshot holds.
    Changes(super::changes::Args),
}

pub fn run(ctx: &Context, cmd: Command) -> Result<()> {
    match cmd {
        Command::Create { blob, json } => create(ctx, &blob, json),
        Command::List { blob, json } => list(ctx, &blob, json),
        Command::Delete { blob, json } => delete(ctx, &blob, json),
        Command::Prune {
            blob,
            keep,
            dry_run,
            json,
        } => prune(ctx, &blob, keep, dry_run, json),
        Command::Changes(a) => super::changes::run(ctx, a),
    }
}

/// `snapshot create`: through the drive's daemon when it is mounted writable
/// here (so the snapshot is consistent), otherwise straight on the blob.
fn create(ctx: &Context, blob: &str, json: bool) -> Result<()> {
    let (r, client) = ctx.blob(blob)?;
    if r.snapshot.is_some() {
        bail!("cannot snapshot a snapshot ({r})");
    }
    let base = r.to_string();
    let endpoint = client.service().account().endpoint_for_messages();
    let local = record::writable_mount(&endpoint, &base).filter(record::alive);
    let (id, how) = match local {
        Some(m) => {
            let answer = daemon::control(&m.socket, "snapshot", Some(Duration::from_secs(600)))?;
            // The worker's word: an id is a timestamp, and nothing else is printed.
            let answer = match answer.strip_prefix("ok ") {
                Some(id) if !is_snapshot_id(id) => {
                    bail!(
                        "the daemon of {} answered a snapshot id that is not a timestamp: '{id}'",
                        m.mountpoint.display()
                    )
                }
                _ => answer,
            };
            match answer.strip_prefix("ok ") {
                Some(id) if m.mode == Mode::Fs => (
                    id.to_string(),
                    format!(
                        "consistent: {} was frozen and flushed",
                        m.mountpoint.display()
                    ),
                ),
                // Nothing above a raw file or a loop device can be frozen.
                Some(id) => (
                    id.to_string(),
                    format!(
                        "the cache of the {} mount at {} was flushed first; it was not frozen, so writes a program had not synced are not in it",
                        m.mode,
                        m.mountpoint.display()
                    ),
                ),
                None => bail!("{}", answer.strip_prefix("error ").unwrap_or(&answer)),
            }
        }
        None => {
            let id = ctx.block_on(async {
                let p = drive::properties(&client).await?;
                drive::check_page_blob(&client, &p)?;
                anyhow::Ok(client.create_snapshot().await?)
            })??;
            (id, "not mounted on this machine".to_string())
        }
    };
    if json {
        let v = serde_json::json!({ "blob": base, "snapshot": id, "taken": how });
        println!("{v}");
    } else {
        println!("{id}");
        eprintln!("snapshot of {r} taken ({how}); name it as {r}@{id}");
    }
    Ok(())
}

fn list(ctx: &Context, blob: &str, json: bool) -> Result<()> {
    let (r, client) = ctx.blob(blob)?;
    let client = client.at_snapshot(None);
    let list = ctx.block_on(async {
        let p = drive::properties(&client).await?;
        drive::check_page_blob(&client, &p)?;
        anyhow::Ok(snapshot::list(&client, true).await?)
    })??;
    if json {
        let v: Vec<_> = list
            .iter()
            .map(|s| {
                serde_json::json!({
                    "blob": r.base().to_string(),
                    "snapshot": s.snapshot,
                    "time": s.time,
                    "allocated_bytes": s.allocated_bytes,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if list.is_empty() {
        println!("{} has no snapshots", r.base());
    } else {
        for s in &list {
            println!(
                "{}@{}  {}",
                r.base(),
                s.snapshot,
                s.allocated_bytes.map(human).unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn delete(ctx: &Context, blob: &str, json: bool) -> Result<()> {
    let (r, client) = ctx.blob(blob)?;
    let Some(id) = r.snapshot.clone() else {
        bail!("name the snapshot to delete as BLOB@SNAPSHOT (see `blobdrive snapshot list {r}`)");
    };
    let endpoint = client.service().account().endpoint_for_messages();
    if let Some(m) = mounted_here(&endpoint, &r.base().to_string(), &id) {
        bail!(
            "{r} is mounted at {}; unmount it before deleting it",
            m.mountpoint.display()
        );
    }
    ctx.block_on(async {
        drive::properties(&client).await?;
        client.delete(DeleteSnapshots::None, None).await?;
        anyhow::Ok(())
    })??;
    if json {
        return super::print_json(&serde_json::json!({ "deleted": r.to_string() }));
    }
    println!("deleted snapshot {r}");
    Ok(())
}

/// `snapshot prune`: deletes all but the newest `keep`, never one mounted here.
fn prune(ctx: &Context, blob: &str, keep: usize, dry_run: bool, json: bool) -> Result<()> {
    let (r, client) = ctx.blob(blob)?;
    if r.snapshot.is_some() {
        bail!("prune takes the drive, not a snapshot ({r})");
    }
    let list = ctx.block_on(snapshot::list(&client, false))??;
    let ids: Vec<String> = list.into_iter().map(|s| s.snapshot).collect();
    let doomed = snapshot::to_prune(&ids, keep);
    let say = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    let endpoint = client.service().account().endpoint_for_messages();
    let mut deleted = Vec::new();
    let mut skipped = Vec::new();
    for id in &doomed {
        // A snapshot mounted here is never deleted from under its mount.
        if let Some(m) = mounted_here(&endpoint, &r.to_string(), id) {
            say(format!(
                "skipping {r}@{id}: mounted at {} (unmount it to prune it)",
                m.mountpoint.display()
            ));
            skipped.push(serde_json::json!({ "snapshot": id, "mountpoint": m.mountpoint }));
            continue;
        }
        if dry_run {
            say(format!("would delete {r}@{id}"));
        } else {
            ctx.block_on(
                client
                    .at_snapshot(Some(id))
                    .delete(DeleteSnapshots::None, None),
            )??;
            say(format!("deleted {r}@{id}"));
        }
        deleted.push(id.clone());
    }
    if json {
        let kept: Vec<&String> = ids.iter().filter(|i| !doomed.contains(i)).collect();
        // A dry run deletes nothing: what it would delete is said so.
        let done = if dry_run { "would_delete" } else { "deleted" };
        return super::print_json(&serde_json::json!({
            "blob": r.to_string(),
            "dry_run": dry_run,
            done: deleted,
            "kept": kept,
            "skipped": skipped,
        }));
    }
    if doomed.is_empty() {
        println!("{r} has {} snapshot(s); nothing to prune", ids.len());
        return Ok(());
    }
    println!(
        "{} {} snapshot(s), kept the newest {}{}",
        if dry_run { "would delete" } else { "deleted" },
        deleted.len(),
        ids.len() - doomed.len(),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(" and {} mounted one(s)", skipped.len())
        }
    );
    Ok(())
}

/// The live mount on this machine of snapshot `id` of `base` in the account at
/// `endpoint`, if any (records from before endpoints were recorded match any).
fn mounted_here(endpoint: &str, base: &str, id: &str) -> Option<record::MountRecord> {
    record::load_all().into_iter().find(|m| {
        (m.endpoint.is_empty() || m.endpoint == endpoint)
            && m.blob == base
            && m.snapshot.as_deref() == Some(id)
            && record::alive(m)
    })
}
