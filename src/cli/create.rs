//! `blobdrive create`: a new empty fixed-VHD page blob.

use anyhow::{bail, Result};
use blobdrive::drive::{self, DriveError};
use blobdrive::size::{human, parse_size};
use blobdrive::vhd::{FOOTER_SIZE, MAX_DISK_BYTES, MIB};

use super::Context;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The new drive (container/name.vhd). Never replaces an existing blob.
    pub blob: String,
    /// Disk size: a whole number of MiB (Azure requires it), at most 8 TiB - 1 MiB.
    #[arg(long, value_name = "SIZE")]
    pub size: String,
    /// Create the container first if it does not exist.
    #[arg(long)]
    pub create_container: bool,
    /// Print one JSON object instead of text: blob, size_bytes, blob_bytes and
    /// container_created.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let size = disk_size_arg(&args.size)?;
    let (r, blob) = ctx.blob(&args.blob)?;
    if r.snapshot.is_some() {
        bail!("cannot create a snapshot ({r}); name the base blob");
    }
    let container_created = ctx.block_on(async {
        let made = args.create_container && blob.container().create().await?;
        if made && !args.json {
            eprintln!("created container '{}'", blob.container_name());
        }
        match drive::create(&blob, size).await {
            Err(DriveError::Azure(e)) if e.code() == Some("ContainerNotFound") => {
                bail!("{e}; add --create-container to create it")
            }
            done => done.map(|()| made).map_err(Into::into),
        }
    })??;
    if args.json {
        return super::print_json(&serde_json::json!({
            "blob": r.to_string(),
            "size_bytes": size,
            "blob_bytes": size + FOOTER_SIZE,
            "container_created": container_created,
        }));
    }
    println!(
        "created {r}: {} fixed VHD ({} bytes of disk, blob {} bytes)",
        human(size),
        size,
        size + FOOTER_SIZE
    );
    Ok(())
}

/// A disk size as `create` and `resize` take it: whole MiB, more than 0, at most
/// the page-blob maximum less the footer.
pub(super) fn disk_size_arg(text: &str) -> Result<u64> {
    let size = parse_size(text)?;
    if size == 0 {
        bail!("size must be more than 0");
    }
    if size % MIB != 0 {
        bail!(
            "size {size} bytes is not a whole number of MiB (Azure requires whole MiB); try {} MiB",
            size.div_ceil(MIB)
        );
    }
    if size > MAX_DISK_BYTES {
        bail!(
            "size {} is over the page-blob maximum: a disk can be at most {} (8 TiB minus 1 MiB, leaving room for the VHD footer)",
            human(size),
            human(MAX_DISK_BYTES)
        );
    }
    Ok(size)
}
