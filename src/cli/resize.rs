//! `blobdrive resize`: grow a drive that is not mounted.

use std::path::Path;

use anyhow::{bail, Result};
use blobdrive::mount::record;
use blobdrive::resize::{self, Resized};
use blobdrive::size::human;
use blobdrive::vhd::FOOTER_SIZE;

use super::create::disk_size_arg;
use super::Context;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
The page blob grows to SIZE plus its 512-byte footer; the grown part reads as zeros.
The VHD footer is written at the new end for the new size (same disk id) and the
old footer's page cleared, under a 60-second lease so nothing else writes the drive
meanwhile. The filesystem on the drive keeps its size until grown itself (mount the
drive with --mode block and run resize2fs or xfs_growfs on the device).

If it is interrupted (a crash, the network), the drive says so: `info` and `mount`
refuse it with \"resize incomplete\", naming the resize that completes it, and running
the same resize again picks up where it stopped. A mounted drive (here or elsewhere:
it holds its lease) is refused: unmount it first. Snapshots keep their own size.")]
pub struct Args {
    /// The drive (container/name.vhd); not a snapshot.
    pub blob: String,
    /// The new disk size: whole MiB, larger than the drive's (shrinking would cut off
    /// data and is refused).
    #[arg(long, value_name = "SIZE")]
    pub size: String,
}

pub fn run(ctx: &Context, args: Args) -> Result<()> {
    let size = disk_size_arg(&args.size)?;
    if Path::new(&args.blob).is_absolute() {
        bail!(
            "{} is a path: name the drive (container/name.vhd); a mounted drive is grown after `blobdrive unmount`",
            args.blob
        );
    }
    let (r, blob) = ctx.blob(&args.blob)?;
    if r.snapshot.is_some() {
        bail!("{r} is a snapshot: snapshots keep their size; resize the drive itself");
    }
    // Mounted here: say where, rather than "another client holds the lease".
    if let Some(m) = record::load_all()
        .into_iter()
        .find(|m| m.blob == r.base().to_string() && !m.read_only && record::alive(m))
    {
        bail!(
            "{r} is mounted at {} on this machine: unmount it first (`blobdrive unmount {}`)",
            m.mountpoint.display(),
            m.mountpoint.display()
        );
    }
    match ctx.block_on(resize::grow(&blob, size))?? {
        Resized::Grown { from, to } => println!(
            "grew {r} from {} to {} ({to} bytes of disk, blob {} bytes)",
            human(from),
            human(to),
            to + FOOTER_SIZE
        ),
        Resized::Unchanged(s) => println!("{r} is already {} ({s} bytes): nothing to do", human(s)),
    }
    Ok(())
}
