//! `blobdrive upload`, `download` and `restore`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use blobdrive::mount::record;
use blobdrive::size::human;
use blobdrive::transfer::download::{self, Format};
use blobdrive::transfer::upload::{self, UploadOptions};
use blobdrive::transfer::Report;

use super::Context;

#[derive(Debug, clap::Args)]
pub struct UploadArgs {
    /// A raw disk image or a fixed VHD (a raw image is rounded up to a whole MiB).
    pub file: PathBuf,
    /// The new drive (container/name.vhd).
    pub blob: String,
    /// Continue an interrupted upload of the same file, sending only what is missing.
    #[arg(long, conflicts_with = "overwrite")]
    pub resume: bool,
    /// Replace an existing blob (not one with snapshots, not one in use).
    #[arg(long)]
    pub overwrite: bool,
    /// Print the report as one JSON object (with the blob and the file).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct DownloadArgs {
    /// The drive or snapshot (BLOB@SNAPSHOT) to download.
    pub blob: String,
    /// The local file to write (a sparse file; holes stay holes).
    pub file: PathBuf,
    /// vhd keeps the footer (default for names ending in .vhd), raw drops it.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// FILE is a copy of this older snapshot of the same drive (its time, or
    /// BLOB@SNAPSHOT as `snapshot create` prints it): update it in place,
    /// transferring only what changed.
    #[arg(long, value_name = "SNAPSHOT")]
    pub since: Option<String>,
    /// Print the report as one JSON object (with the blob and the file).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The drive to restore (container/name.vhd); it must not be mounted.
    pub blob: String,
    /// The snapshot whose content the drive gets back: its time, or BLOB@SNAPSHOT
    /// as `snapshot create` prints it.
    #[arg(long, value_name = "SNAPSHOT")]
    pub from: String,
    /// Confirm: the drive's current content is replaced.
    #[arg(long)]
    pub yes: bool,
    /// Print one JSON object instead of text: blob, snapshot, was_bytes (the
    /// disk size before) and size_bytes (after: the snapshot's).
    #[arg(long)]
    pub json: bool,
}

/// The result of a transfer between the drive `blob` and the local `file`:
/// the JSON object is the report with both named, as the text names them.
fn summary(verb: &str, (blob, file): (&str, &Path), r: &Report, json: bool) -> Result<()> {
    if json {
        let mut v = serde_json::to_value(r)?;
        v["blob"] = blob.into();
        v["file"] = file.display().to_string().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let what = match verb {
        "uploaded" => format!("{} to {blob}", file.display()),
        _ => format!("{blob} to {}", file.display()),
    };
    let rate = r.bytes_transferred as f64 / r.seconds.max(0.001);
    println!(
        "{verb} {what}: {} transferred for a {} image in {} requests, {:.1} s ({}/s){}{}",
        human(r.bytes_transferred),
        human(r.image_bytes),
        r.requests,
        r.seconds,
        human(rate as u64),
        if r.skipped_bytes > 0 {
            format!(", {} already there", human(r.skipped_bytes))
        } else {
            String::new()
        },
        r.method
            .as_ref()
            .map(|m| format!(", changes found by {m}"))
            .unwrap_or_default()
    );
    Ok(())
}

pub fn upload(ctx: &Context, a: UploadArgs) -> Result<()> {
    let (r, blob) = ctx.blob(&a.blob)?;
    if r.snapshot.is_some() {
        bail!("cannot upload to a snapshot ({r})");
    }
    let opts = UploadOptions {
        resume: a.resume,
        overwrite: a.overwrite,
        quiet: a.json,
    };
    let report = ctx.block_on(upload::upload(&a.file, &blob, &opts))??;
    if report.already_complete && !a.json {
        println!(
            "{r} is already complete: it was uploaded from {}, which has not changed since; nothing sent",
            a.file.display()
        );
        return Ok(());
    }
    summary("uploaded", (&r.to_string(), &a.file), &report, a.json)
}

pub fn download(ctx: &Context, a: DownloadArgs) -> Result<()> {
    let (r, blob) = ctx.blob(&a.blob)?;
    if r.snapshot.is_none() {
        let endpoint = blob.service().account().endpoint_for_messages();
        let base = r.to_string();
        if let Some(m) = record::load_all().into_iter().find(|m| {
            (m.endpoint.is_empty() || m.endpoint == endpoint)
                && m.blob == base
                && m.snapshot.is_none()
                && !m.read_only
                && record::alive(m)
        }) {
            eprintln!(
                "warning: {r} is mounted writable at {}: this copy may be inconsistent (writes go on during the download and cached ones are not on the blob yet); for a consistent copy run `blobdrive snapshot create {r}` and download the BLOB@SNAPSHOT it names",
                m.mountpoint.display()
            );
        }
    }
    let format = a.format.unwrap_or(
        if a.file
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("vhd"))
        {
            Format::Vhd
        } else {
            Format::Raw
        },
    );
    let report = match &a.since {
        None => ctx.block_on(download::download(&blob, &a.file, format, a.json))??,
        Some(since) => {
            let since = r.snapshot_of(since)?;
            let old = blob.at_snapshot(Some(&since));
            ctx.block_on(download::download_since(
                &blob, &old, &a.file, format, a.json,
            ))??
        }
    };
    summary("downloaded", (&r.to_string(), &a.file), &report, a.json)
}

pub fn restore(ctx: &Context, a: RestoreArgs) -> Result<()> {
    let (r, blob) = ctx.blob(&a.blob)?;
    if r.snapshot.is_some() {
        bail!("name the drive as BLOB and the snapshot with --from");
    }
    let from = r.snapshot_of(&a.from)?;
    if !a.yes {
        bail!("refusing to restore {r} without --yes: its current content would be replaced by {r}@{from}");
    }
    let sizes = ctx.block_on(blobdrive::snapshot::restore(&blob, &from))??;
    if a.json {
        return super::print_json(&serde_json::json!({
            "blob": r.to_string(),
            "snapshot": from,
            "was_bytes": sizes.was,
            "size_bytes": sizes.now,
        }));
    }
    let (was, now) = (human(sizes.was), human(sizes.now));
    if sizes.now == sizes.was {
        println!("restored {r} from {r}@{from} ({now}, the size it had)");
        return Ok(());
    }
    println!("restored {r} from {r}@{from}");
    if sizes.now < sizes.was {
        println!("{r} is {now} again, as it was when the snapshot was taken (it was {was}: it grew since)");
    } else if sizes.now > sizes.was {
        println!("{r} is {now} again, as it was when the snapshot was taken (it was {was})");
    }
    Ok(())
}
