//! `blobdrive create`: a new empty fixed-VHD page blob.

use anyhow::{bail, Result};
use blobdrive::azure::AzureError;
use blobdrive::size::{human, parse_size};
use blobdrive::vhd::{Footer, FOOTER_SIZE, MAX_DISK_BYTES, MIB};

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
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let size = disk_size_arg(&args.size)?;
    let (r, blob) = ctx.blob(&args.blob)?;
    if r.snapshot.is_some() {
        bail!("cannot create a snapshot ({r}); name the base blob");
    }
    let footer = Footer::new_fixed(size)?;
    ctx.block_on(async {
        if args.create_container && blob.container().create().await? {
            eprintln!("created container '{}'", blob.container_name());
        }
        match blob.create_page_blob(size + FOOTER_SIZE).await {
            Ok(()) => {}
            Err(e) if e.code() == Some("ContainerNotFound") => {
                bail!("{e}; add --create-container to create it")
            }
            Err(e) => return Err(e.into()),
        }
        // The blob exists now but is no drive until its footer is written: if that
        // fails, remove it again rather than leave a footerless blob behind.
        // Fenced like a mount's writes (see `WriteFence`): a copy given up on that
        // lands after the drive was grown would put a footer where the disk
        // has data by then.
        let data = bytes::Bytes::copy_from_slice(&footer.to_bytes());
        let fence = blobdrive::azure::WriteFence::new(blob.clone(), None);
        if let Err(e) = blob.put_pages_fenced(size, data, None, &fence).await {
            let cleanup = blob
                .delete(blobdrive::azure::DeleteSnapshots::None, None)
                .await;
            return Err(footer_failed(e, cleanup.err()));
        }
        // The create token has done its job; a finished drive carries no metadata.
        if let Err(e) = blob.set_metadata(&[], None).await {
            tracing::warn!(
                "could not remove the create token from {}: {e}",
                blob.target()
            );
        }
        Ok(())
    })??;
    println!(
        "created {r}: {} fixed VHD ({} bytes of disk, blob {} bytes)",
        human(size),
        size,
        size + FOOTER_SIZE
    );
    Ok(())
}

fn footer_failed(e: AzureError, cleanup: Option<AzureError>) -> anyhow::Error {
    match cleanup {
        None => anyhow::anyhow!("{e} (the half-created blob was deleted again)"),
        Some(c) => anyhow::anyhow!("{e}; deleting the half-created blob also failed: {c}"),
    }
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
