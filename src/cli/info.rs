//! `blobdrive info`: what a drive is and what state it is in.

use anyhow::Result;
use blobdrive::azure::ranges;
use blobdrive::azure::SegmentPlan;
use blobdrive::drive::Drive;
use blobdrive::encrypted::Facts;
use blobdrive::size::human;
use serde::Serialize;

use super::Context;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The drive (container/name.vhd or BLOB@SNAPSHOT).
    pub blob: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The `info --json` contract; later fields may be added, none removed.
#[derive(Debug, Serialize)]
struct Info {
    blob: String,
    snapshot: Option<String>,
    size_bytes: u64,
    blob_bytes: u64,
    allocated_bytes: u64,
    disk_type: String,
    lease_state: String,
    lease_duration: Option<String>,
    /// null when the credential may read the blob but not list its container (a
    /// SAS for one blob, such as a managed disk's export URL).
    snapshots: Option<usize>,
    etag: Option<String>,
    last_modified: Option<String>,
    /// How the blob was reached: "account key", "SAS", "anonymous" or
    /// "Entra ID (SOURCE)"; never a secret.
    auth: String,
    /// null when the drive is not encrypted; else what its LUKS2 header
    /// says, read without a passphrase.
    encryption: Option<Facts>,
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let (r, blob) = ctx.blob(&args.blob)?;
    let info = ctx.block_on(async {
        let drive = Drive::open(&blob).await?;
        let written = blob
            .page_ranges_segmented(drive.props.content_length, SegmentPlan::default())
            .await?;
        let snapshots = match blob.container().list_blobs(blob.name(), true).await {
            Ok(listed) => Some(
                listed
                    .iter()
                    .filter(|b| b.name == blob.name() && b.snapshot.is_some())
                    .count(),
            ),
            // Reading the blob worked, so this is the credential's scope, not a bad key.
            Err(e) if e.status() == Some(403) => None,
            Err(e) => return Err(e.into()),
        };
        let lease_state = drive
            .props
            .lease_state
            .clone()
            .unwrap_or_else(|| "available".to_string());
        let lease_duration = drive
            .props
            .lease_duration
            .clone()
            .filter(|_| lease_state == "leased");
        let encryption = blobdrive::encrypted::facts(&blob, drive.disk_size()).await?;
        anyhow::Ok(Info {
            blob: r.base().to_string(),
            snapshot: r.snapshot.clone(),
            size_bytes: drive.disk_size(),
            blob_bytes: drive.props.content_length,
            allocated_bytes: ranges::total(&written),
            disk_type: drive.footer.disk_type.to_string(),
            lease_state,
            lease_duration,
            snapshots,
            etag: drive.props.etag.clone(),
            last_modified: drive.props.last_modified.clone(),
            auth: blob.service().account().credential.describe(),
            encryption,
        })
    })??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    println!("blob:         {}", info.blob);
    if let Some(s) = &info.snapshot {
        println!("snapshot:     {s}");
    }
    println!(
        "disk size:    {} ({} bytes)",
        human(info.size_bytes),
        info.size_bytes
    );
    println!(
        "blob size:    {} bytes (disk + 512-byte VHD footer)",
        info.blob_bytes
    );
    println!(
        "allocated:    {} ({} bytes written, footer included)",
        human(info.allocated_bytes),
        info.allocated_bytes
    );
    println!("disk type:    {} VHD", info.disk_type);
    match &info.lease_duration {
        Some(d) => println!("lease:        {} ({d})", info.lease_state),
        None => println!("lease:        {}", info.lease_state),
    }
    match info.snapshots {
        Some(n) => println!("snapshots:    {n}"),
        None => println!("snapshots:    unknown (the credential cannot list the container)"),
    }
    if let Some(e) = &info.etag {
        println!("etag:         {e}");
    }
    if let Some(m) = &info.last_modified {
        println!("modified:     {m}");
    }
    println!("auth:         {}", info.auth);
    print_encryption(info.encryption.as_ref());
    Ok(())
}

/// The encryption lines of `info`'s text.
fn print_encryption(facts: Option<&Facts>) {
    let Some(f) = facts else {
        println!("encryption:   none");
        return;
    };
    let Some(h) = &f.header else {
        println!(
            "encryption:   {}, but its header cannot be read: {}",
            f.kind,
            f.problem.as_deref().unwrap_or("")
        );
        return;
    };
    println!(
        "encryption:   {}, {} with a {}-bit key, {}-byte sectors",
        f.kind, h.cipher, h.key_bits, h.sector_size
    );
    println!(
        "data:         from {} bytes in ({}), to the end of the disk",
        h.data_offset,
        human(h.data_offset)
    );
    let slots: Vec<String> = h
        .keyslots
        .iter()
        .map(|k| format!("{} ({})", k.id, k.kdf))
        .collect();
    println!("keyslots:     {}", slots.join(", "));
    match &h.other_copy {
        Some(why) => println!("luks header:  {} copy ({why})", h.header_copy),
        None => println!("luks header:  {} copy, both whole", h.header_copy),
    }
    println!("luks uuid:    {}", h.uuid);
}
