//! `blobdrive key add|remove|change BLOB`: an encrypted drive's passphrases
//! (its LUKS2 keyslots), so that a recovery passphrase can sit beside the
//! daily one. Each runs under a short lease of its own (a drive mounted
//! writable is refused), needs a passphrase the drive opens with, and changes
//! nothing when that is wrong. Writing the header writes both its copies, so a
//! damaged one is whole again afterwards.

use std::path::PathBuf;

use anyhow::{bail, Result};
use blobdrive::encrypted::{self, KeyError};
use blobdrive::luks::volume::{self, KdfChoice};
use blobdrive::size::parse_size;

use super::passphrase::{self, Source};
use super::Context;

/// How a new keyslot turns its passphrase into a key.
#[derive(Debug, Clone, clap::Args)]
pub struct KdfArgs {
    /// The key derivation: argon2id (memory-hard, cryptsetup's default) or
    /// pbkdf2 (PBKDF2-SHA256, 1,000,000 iterations).
    #[arg(long, value_name = "argon2id|pbkdf2", value_parser = ["argon2id", "pbkdf2"], default_value = "argon2id")]
    pub pbkdf: String,
    /// Argon2id's memory, taken by every mount of the drive while it opens it
    /// (between 8 MiB and 1 GiB) [default: 64 MiB, with 4 passes and 4 lanes:
    /// RFC 9106's choice where memory is scarce, which a node opening many
    /// drives at once can afford; cryptsetup's own default takes up to 1 GiB].
    #[arg(long, value_name = "SIZE")]
    pub pbkdf_memory: Option<String>,
}

impl KdfArgs {
    pub fn choice(&self) -> Result<KdfChoice> {
        match (self.pbkdf.as_str(), &self.pbkdf_memory) {
            ("pbkdf2", Some(_)) => bail!("--pbkdf-memory is Argon2id's: PBKDF2 takes no memory"),
            ("pbkdf2", None) => Ok(KdfChoice::Pbkdf2 {
                iterations: volume::DEFAULT_PBKDF2_ITERATIONS,
            }),
            (_, None) => Ok(KdfChoice::default()),
            (_, Some(m)) => {
                let bytes = parse_size(m)?;
                if !(8 << 20..=1 << 30).contains(&bytes) {
                    bail!("--pbkdf-memory {m}: between 8 MiB and 1 GiB");
                }
                Ok(KdfChoice::Argon2id {
                    memory_kib: (bytes >> 10) as u32,
                })
            }
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Add a passphrase (a keyslot), given one the drive opens with.
    Add(AddArgs),
    /// Remove the passphrase given (its keyslot); never the last one.
    Remove(RemoveArgs),
    /// Replace a passphrase with a new one (the same keyslot).
    Change(AddArgs),
}

#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// The encrypted drive (container/name.vhd).
    pub blob: String,
    /// A passphrase the drive opens with: every byte of FILE (`-`: standard
    /// input) [default: BLOBDRIVE_PASSPHRASE, else asked on a terminal].
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// The new passphrase: every byte of FILE [default:
    /// BLOBDRIVE_NEW_PASSPHRASE, else asked twice on a terminal].
    #[arg(long, value_name = "FILE")]
    pub new_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub kdf: KdfArgs,
}

#[derive(Debug, clap::Args)]
pub struct RemoveArgs {
    /// The encrypted drive (container/name.vhd).
    pub blob: String,
    /// The passphrase to remove: every byte of FILE (`-`: standard input)
    /// [default: BLOBDRIVE_PASSPHRASE, else asked on a terminal].
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
}

pub fn run(ctx: &Context, c: Command) -> Result<()> {
    match c {
        Command::Add(a) => add_or_change(ctx, a, false),
        Command::Change(a) => add_or_change(ctx, a, true),
        Command::Remove(a) => remove(ctx, a),
    }
}

/// The passphrase the drive opens with, from `key_file` or where else it may
/// be given.
fn existing(
    key_file: Option<&std::path::Path>,
    prompt: &str,
) -> Result<blobdrive::luks::secret::Secret> {
    Source {
        key_file,
        env: passphrase::PASSPHRASE_ENV,
        credential: false,
        prompt,
        confirm: false,
        ask: true,
    }
    .required("give the drive's passphrase with --key-file FILE or BLOBDRIVE_PASSPHRASE")
}

fn add_or_change(ctx: &Context, a: AddArgs, change: bool) -> Result<()> {
    let kdf = a.kdf.choice()?;
    let (r, blob) = ctx.blob(&a.blob)?;
    if r.snapshot.is_some() {
        bail!("{r} is a snapshot, which never changes: change the drive's passphrases");
    }
    if a.key_file.as_deref() == Some(std::path::Path::new("-"))
        && a.new_key_file.as_deref() == Some(std::path::Path::new("-"))
    {
        bail!("--key-file and --new-key-file cannot both be standard input");
    }
    let old = existing(a.key_file.as_deref(), &format!("Passphrase for {r}: "))?;
    let new = Source {
        key_file: a.new_key_file.as_deref(),
        env: passphrase::NEW_PASSPHRASE_ENV,
        credential: false,
        prompt: "New passphrase: ",
        confirm: true,
        ask: true,
    }
    .required("give the new passphrase with --new-key-file FILE or BLOBDRIVE_NEW_PASSPHRASE")?;
    let slot = ctx
        .block_on(encrypted::under_lease(&blob, async |disk| {
            if change {
                volume::change_key(disk, old.as_bytes(), new.as_bytes(), kdf).await
            } else {
                volume::add_key(disk, old.as_bytes(), new.as_bytes(), kdf).await
            }
        }))?
        .map_err(|e| said(&r.to_string(), e))?;
    if change {
        println!("changed the passphrase of keyslot {slot} of {r}");
    } else {
        println!("added a passphrase to {r} (keyslot {slot})");
    }
    Ok(())
}

fn remove(ctx: &Context, a: RemoveArgs) -> Result<()> {
    let (r, blob) = ctx.blob(&a.blob)?;
    if r.snapshot.is_some() {
        bail!("{r} is a snapshot, which never changes: change the drive's passphrases");
    }
    let gone = existing(
        a.key_file.as_deref(),
        &format!("Passphrase to remove from {r}: "),
    )?;
    let slot = ctx
        .block_on(encrypted::under_lease(&blob, async |disk| {
            volume::remove_key(disk, gone.as_bytes()).await
        }))?
        .map_err(|e| said(&r.to_string(), e))?;
    println!(
        "removed keyslot {slot} from {r} (snapshots taken before keep it: they still open with it)"
    );
    Ok(())
}

/// A key command's failure, in one line.
fn said(target: &str, e: KeyError) -> anyhow::Error {
    use blobdrive::luks::LuksError;
    match e {
        KeyError::Luks(LuksError::NotLuks) => {
            anyhow::anyhow!("{target} is not encrypted: it has no LUKS2 header")
        }
        KeyError::Luks(LuksError::WrongPassphrase) => {
            anyhow::anyhow!(
                "no keyslot of {target} opens with this passphrase: nothing was changed"
            )
        }
        other => anyhow::anyhow!("{target}: {other}"),
    }
}
