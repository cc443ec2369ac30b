//! Whether `blobdrive mount` asks for a drive this machine has mounted
//! already: at the same place (a second `mount -a`), or writable elsewhere.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use blobdrive::blobref::BlobRef;
use blobdrive::mount::{record, system};

use super::Context;

/// Where this machine already has the drive `r` mounted at `mountpoint` (the
/// same drive, account and snapshot, its daemon running): a second `mount -a`
/// asks for it again. A writable mount of it elsewhere here that holds its
/// lease is refused naming that place: the service would only say that another
/// mount holds it, "on this or another host". (One whose lease was broken, a
/// fenced mount that has not let go yet, holds nothing: the new mount goes
/// ahead, as on another machine.)
pub fn mounted_here(
    ctx: &Context,
    r: &BlobRef,
    mountpoint: &Path,
    read_only: bool,
) -> Result<Option<PathBuf>> {
    let endpoint = ctx.unsigned_account_for(r)?.endpoint_for_messages();
    let base = r.base().to_string();
    let wanted = mountpoint.canonicalize().ok();
    if let Some(mp) = &wanted {
        let same = |m: &record::MountRecord| {
            (m.endpoint.is_empty() || m.endpoint == endpoint)
                && m.blob == base
                && m.snapshot == r.snapshot
                && record::alive(m)
        };
        if let Ok((_, Some(m))) = record::at_mountpoint(mp) {
            if same(&m) && system::is_mountpoint(mp) {
                return Ok(Some(m.mountpoint));
            }
        }
    }
    if read_only {
        return Ok(None);
    }
    let elsewhere = || record::writable_mount_elsewhere(&endpoint, &base, wanted.as_deref());
    if elsewhere().is_none() || !lease_held(ctx, r) {
        return Ok(None);
    }
    // Looked at again once the service said the drive is leased, each daemon
    // once: mounts racing for the drive record themselves before they ask for
    // its lease, and a loser's record goes with its daemon meanwhile. (The
    // winner recorded itself before it asked, so it is among these.)
    match elsewhere() {
        Some((m, true)) => bail!(
            "{base} is already mounted writable on this machine, at {}, which holds its lease: unmount it there first (blobdrive unmount {}), or mount it here --read-only",
            m.mountpoint.display(),
            m.mountpoint.display()
        ),
        Some((m, false)) => bail!(
            "{base} was mounted at {} on this machine, and that mount ended without an unmount (its daemon is gone) holding the lease: run `blobdrive unmount {}` first",
            m.mountpoint.display(),
            m.mountpoint.display()
        ),
        None => Ok(None),
    }
}

/// Whether the service says drive `r` is leased. Anything else, a failure to
/// ask included, is left to the mount itself to find out and say.
fn lease_held(ctx: &Context, r: &BlobRef) -> bool {
    let Ok((_, client)) = ctx.blob(&r.base().to_string()) else {
        return false;
    };
    matches!(
        ctx.block_on(client.properties()),
        Ok(Ok(p)) if p.lease_state.as_deref() == Some("leased")
    )
}
