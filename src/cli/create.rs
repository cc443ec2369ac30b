//! `blobdrive create`: a new empty fixed-VHD page blob.

use anyhow::{bail, Result};
use blobdrive::drive::{self, DriveError};
use blobdrive::encrypted;
use blobdrive::luks::secret::Secret;
use blobdrive::luks::volume::KdfChoice;
use blobdrive::size::{human, parse_size};
use blobdrive::vhd::{FOOTER_SIZE, MAX_DISK_BYTES, MIB};

use super::passphrase;
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
    /// Print one JSON object instead of text: blob, size_bytes, blob_bytes,
    /// container_created, and for an encrypted drive encryption (type,
    /// cipher, sector_size, data_offset).
    #[arg(long)]
    pub json: bool,
    /// Encrypt the drive: a LUKS2 header at the start of its disk, as
    /// cryptsetup lays it out (aes-xts-plain64, a random 512-bit key; the data
    /// starts 16 MiB in), so the storage service holds only ciphertext and any
    /// Linux host opens a downloaded copy with `cryptsetup open`. Mount it with
    /// its passphrase.
    #[arg(long)]
    pub encrypt: bool,
    /// The passphrase: every byte of FILE (`-`: standard input), readable by
    /// its owner alone [default: BLOBDRIVE_PASSPHRASE, else asked twice on a
    /// terminal].
    #[arg(long, value_name = "FILE", requires = "encrypt")]
    pub key_file: Option<std::path::PathBuf>,
    /// The encryption's sector size: 4096 (cryptsetup's choice for most
    /// disks) or 512.
    #[arg(long, value_name = "BYTES", value_parser = ["512", "4096"], default_value = "4096", requires = "encrypt")]
    pub sector_size: String,
    #[command(flatten)]
    pub kdf: super::key::KdfArgs,
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let size = disk_size_arg(&args.size)?;
    let (r, blob) = ctx.blob(&args.blob)?;
    if r.snapshot.is_some() {
        bail!("cannot create a snapshot ({r}); name the base blob");
    }
    if !args.encrypt && (args.kdf.pbkdf != "argon2id" || args.kdf.pbkdf_memory.is_some()) {
        bail!("--pbkdf and --pbkdf-memory are an encrypted drive's: add --encrypt");
    }
    let encryption = args
        .encrypt
        .then(|| encryption_of(&args, size))
        .transpose()?;
    let container_created = ctx.block_on(async {
        // The header first, in memory; it is written before the footer.
        let header = match &encryption {
            Some((passphrase, sector, kdf)) => {
                encrypted::new_header(passphrase.as_bytes(), *sector, *kdf)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot make the LUKS2 header: {e}"))?
            }
            None => Vec::new(),
        };
        let made = args.create_container && blob.container().create().await?;
        if made && !args.json {
            eprintln!("created container '{}'", blob.container_name());
        }
        match drive::create_with(&blob, size, &header, &[]).await {
            Err(DriveError::Azure(e)) if e.code() == Some("ContainerNotFound") => {
                bail!("{e}; add --create-container to create it")
            }
            Err(e) => return Err(e.into()),
            Ok(()) => {}
        }
        Ok(made)
    })??;
    if args.json {
        let mut made = serde_json::json!({
            "blob": r.to_string(),
            "size_bytes": size,
            "blob_bytes": size + FOOTER_SIZE,
            "container_created": container_created,
        });
        if let Some((_, sector, _)) = &encryption {
            made["encryption"] = serde_json::json!({
                "type": "luks2",
                "cipher": "aes-xts-plain64",
                "sector_size": sector,
                "data_offset": blobdrive::luks::DEFAULT_DATA_OFFSET,
            });
        }
        return super::print_json(&made);
    }
    println!(
        "created {r}: {} fixed VHD ({} bytes of disk, blob {} bytes)",
        human(size),
        size,
        size + FOOTER_SIZE
    );
    if let Some((_, sector, _)) = encryption {
        println!(
            "encrypted: LUKS2, aes-xts-plain64, {sector}-byte sectors; its data is the {} after the 16 MiB header",
            human(size - blobdrive::luks::DEFAULT_DATA_OFFSET)
        );
    }
    Ok(())
}

/// The new drive's passphrase (asked before anything is created), sector size
/// and key derivation.
fn encryption_of(args: &Args, size: u64) -> Result<(Secret, u32, KdfChoice)> {
    if size < encrypted::MIN_DISK {
        bail!(
            "an encrypted drive needs at least {}: its LUKS2 header takes the first 16 MiB",
            human(encrypted::MIN_DISK)
        );
    }
    let kdf = args.kdf.choice()?;
    let passphrase = passphrase::Source {
        key_file: args.key_file.as_deref(),
        env: passphrase::PASSPHRASE_ENV,
        credential: false,
        prompt: "New passphrase: ",
        confirm: true,
        ask: true,
    }
    .required("give the passphrase with --key-file FILE or BLOBDRIVE_PASSPHRASE")?;
    Ok((passphrase, args.sector_size.parse()?, kdf))
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
