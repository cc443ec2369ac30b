//! NodeStageVolume and NodeUnstageVolume: a volume staged on this node is an
//! ordinary blobdrive mount at the staging path, made by running `blobdrive
//! mount` (so each volume's daemon outlives the CSI process: a node plugin
//! restarted, or killed, takes no volume with it), and taken down by `blobdrive
//! unmount` only when the mount's own record says it is that volume's.

use std::path::Path;
use std::time::Duration;

use tonic::Status;

use super::NodeService;
use crate::csi::memcg::{self, Joining};
use crate::csi::paths::{self, Found};
use crate::csi::proto::volume_capability::AccessType;
use crate::csi::proto::{NodeStageVolumeRequest, NodeUnstageVolumeRequest};
use crate::csi::volume::{self, VolumeId};
use crate::luks::secret::Secret;
use crate::mount::record::{self, MountRecord};
use crate::mount::Mode;

/// How long a mount, an unmount or a resize run by the node may take: a
/// mount writes a filesystem onto a new drive, an unmount writes back what
/// is cached. Past it the call fails and the CO calls again.
const COMMAND_LIMIT: Duration = Duration::from_secs(300);

/// The live mount at `path` (a resolved path), if any.
pub fn staged_at(path: &Path) -> Option<MountRecord> {
    record::load_all()
        .into_iter()
        .find(|r| r.mountpoint == path && record::alive(r))
}

/// Runs this program with `args` (an unmount, a resize), bounded in time; its
/// one-line error becomes the status's message (INTERNAL).
pub async fn blobdrive(args: &[&str]) -> Result<String, Status> {
    blobdrive_in(args, None, None).await
}

/// [`blobdrive`], started inside the cgroups of `joining` when given: a
/// mount's daemon then lives there, not in this plugin's cgroup (see
/// [`cgroup`](crate::csi::cgroup) and [`memcg`]).
/// `input` (an encrypted volume's passphrase, for `--key-file -`) goes to its
/// standard input, never its arguments or environment.
async fn blobdrive_in(
    args: &[&str],
    joining: Option<Joining>,
    input: Option<&Secret>,
) -> Result<String, Status> {
    let exe = std::env::current_exe()
        .map_err(|e| Status::internal(format!("cannot find this program: {e}")))?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(args)
        .stdin(match input {
            Some(_) => std::process::Stdio::piped(),
            None => std::process::Stdio::null(),
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(joining) = joining {
        // SAFETY: the closure only calls write(2) on descriptors opened
        // before the fork, which is async-signal-safe.
        unsafe {
            command.pre_exec(move || memcg::join_all_in_child(&joining));
        }
    }
    let mut child = command
        .spawn()
        .map_err(|e| Status::internal(format!("cannot run blobdrive: {e}")))?;
    if let (Some(p), Some(mut stdin)) = (input, child.stdin.take()) {
        use tokio::io::AsyncWriteExt;
        stdin
            .write_all(p.as_bytes())
            .await
            .map_err(|e| Status::internal(format!("cannot hand blobdrive the passphrase: {e}")))?;
    }
    let out = tokio::time::timeout(COMMAND_LIMIT, child.wait_with_output())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "blobdrive {} did not finish in {} s",
                args.first().copied().unwrap_or_default(),
                COMMAND_LIMIT.as_secs()
            ))
        })?
        .map_err(|e| Status::internal(format!("cannot run blobdrive: {e}")))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().last().unwrap_or("no message").to_string();
    Err(Status::internal(line))
}

/// Mounts the drive at the staging path: its filesystem (made if the drive is
/// blank), or for a block volume its loop device (FUSE at the path).
pub async fn stage(node: &NodeService, req: NodeStageVolumeRequest) -> Result<(), Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let asked = super::path_arg(&req.staging_target_path, "staging target path")?;
    let cap = volume::one_capability(req.volume_capability)?;
    let id = VolumeId::known(&req.volume_id)?;
    let warm = volume::warm_up(req.volume_context.get(volume::WARM_UP))?;
    let passphrase = volume::encrypted(req.volume_context.get(volume::ENCRYPTION))?
        .then(|| volume::passphrase_in(&req.secrets, "node-stage"))
        .transpose()?;
    let staging = paths::resolve_arg(&asked, "staging target path")?;
    let read_only = req
        .publish_context
        .get(volume::READONLY_CONTEXT)
        .is_some_and(|v| v == "true")
        || volume::read_only(&cap);
    let block = matches!(cap.access_type, Some(AccessType::Block(_)));
    if let Some(r) = staged_at(&staging) {
        return already_staged(&r, &id, &staging, read_only, block);
    }
    let props = node.volume_properties(&id).await?;
    if read_only && props.lease_state.as_deref() == Some("leased") {
        return Err(Status::failed_precondition(format!(
            "volume {} is held by a writer (its lease is held): a read-only mount beside it would not see what it writes; take the writer down first",
            id.spec()
        )));
    }
    let cache_size = volume::cache_size(req.volume_context.get(volume::CACHE_SIZE))?
        .unwrap_or(node.budget().default_cache);
    // Before anything is made or leased: a volume that does not fit leaves
    // nothing behind, and the kubelet asks again later (once another volume
    // has left the node).
    let reservation = node.budget().reserve(&id.spec(), &staging, cache_size)?;
    match paths::found(&staging) {
        Ok(Found::Nothing) => {
            paths::make(&staging, true)
                .map_err(|e| Status::internal(format!("cannot make {}: {e}", staging.display())))?;
        }
        Ok(Found::Dir(_)) => {}
        Ok(_) => return Err(not_a_directory(&staging)),
        Err(e) => {
            return Err(Status::internal(format!(
                "cannot look at {}: {e}",
                staging.display()
            )))
        }
    }
    let spec = id.spec();
    let at = staging.to_string_lossy().to_string();
    let mut args = vec!["mount", spec.as_str(), at.as_str()];
    let fs_type = match &cap.access_type {
        Some(AccessType::Mount(m)) if !m.fs_type.is_empty() => m.fs_type.clone(),
        _ => "ext4".to_string(),
    };
    match &cap.access_type {
        Some(AccessType::Block(_)) => args.extend(["--mode", "block"]),
        _ if read_only => {}
        _ => args.extend(["--mkfs", fs_type.as_str()]),
    }
    if read_only {
        args.push("--read-only");
    }
    let cache_args = node.disk_cache_args(&spec, warm);
    args.extend(cache_args.iter().map(String::as_str));
    let cache = cache_size.to_string();
    args.extend(["--cache-size", cache.as_str()]);
    if passphrase.is_some() {
        args.extend(["--key-file", "-"]);
    }
    mount_in_its_cgroup(node, &args, &staging, cache_size, passphrase.as_ref()).await?;
    // `blobdrive mount` mounts where it checked, through a descriptor; had the
    // path become a symlink since it was looked at here, that is elsewhere.
    if staged_at(&staging).is_none_or(|r| r.blob != spec) {
        return Err(Status::internal(format!(
            "blobdrive mount of {spec} did not mount at {at} (was the path replaced meanwhile?)"
        )));
    }
    reservation.keep();
    tracing::info!(
        "staged volume {spec} at {at} for node {}, its cache {}; {}",
        node.node_id(),
        crate::size::human(cache_size),
        node.budget().summary()
    );
    Ok(())
}

/// Runs the `blobdrive mount` of `args` in the volume's own cgroups (made
/// for it, its memory limited to `cache_size` and the daemon's overhead
/// where the host allows: see [`memcg`]), removed again if the mount fails.
async fn mount_in_its_cgroup(
    node: &NodeService,
    args: &[&str],
    staging: &Path,
    cache_size: u64,
    passphrase: Option<&Secret>,
) -> Result<(), Status> {
    let group = memcg::volume_name(staging);
    let joining = match node.volume_groups() {
        Some(g) => Some(g.for_volume(&group, cache_size).map_err(|e| {
            Status::internal(format!(
                "cannot make the cgroup of the volume at {}: {e}",
                staging.display()
            ))
        })?),
        None => None,
    };
    if let Err(e) = blobdrive_in(args, joining, passphrase).await {
        if let Some(g) = node.volume_groups() {
            g.remove_volume(&group);
        }
        return Err(e);
    }
    Ok(())
}

/// The answer to staging at a path where a volume is staged already: OK for
/// the same volume staged the same way, ALREADY_EXISTS for the same volume
/// asked another way, FAILED_PRECONDITION for another volume.
fn already_staged(
    r: &MountRecord,
    id: &VolumeId,
    staging: &Path,
    read_only: bool,
    block: bool,
) -> Result<(), Status> {
    if r.blob != id.spec() {
        return Err(Status::failed_precondition(format!(
            "{} holds volume {} already",
            staging.display(),
            r.blob
        )));
    }
    if r.read_only != read_only || (r.mode == Mode::Block) != block {
        return Err(Status::already_exists(format!(
            "volume {} is staged at {} already, {} and as a {} volume: unstage it first",
            r.blob,
            staging.display(),
            if r.read_only { "read-only" } else { "writable" },
            if r.mode == Mode::Block {
                "block"
            } else {
                "filesystem"
            }
        )));
    }
    Ok(())
}

fn not_a_directory(path: &Path) -> Status {
    Status::invalid_argument(format!(
        "{} is not a directory (a symlink there is not followed)",
        path.display()
    ))
}

/// Takes the drive down (`blobdrive unmount`): everything cached written, the
/// lease released. A drive fenced meanwhile (its volume unpublished from this
/// node) comes down too, saying what it could not write. Only the mount of
/// that volume, by its record: a path holding another volume, or nothing of
/// this driver's, is left as it is (the volume asked for is not staged there:
/// OK, as the spec says).
pub async fn unstage(node: &NodeService, req: NodeUnstageVolumeRequest) -> Result<(), Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let asked = super::path_arg(&req.staging_target_path, "staging target path")?;
    let Some(staging) = paths::resolve(&asked) else {
        return Ok(());
    };
    let Some(r) = staged_at(&staging) else {
        // Nothing alive there (its daemon died): it holds none of the budget.
        node.budget().release(&staging);
        return Ok(());
    };
    if r.blob != req.volume_id {
        tracing::warn!(
            "NodeUnstageVolume of {} at {}: it holds volume {}, left as it is",
            req.volume_id,
            staging.display(),
            r.blob
        );
        return Ok(());
    }
    let at = staging.to_string_lossy().to_string();
    if let Err(e) = blobdrive(&["unmount", &at]).await {
        // What a fenced drive could not write is lost either way; the
        // mount is gone all the same.
        if staged_at(&staging).is_some() {
            return Err(e);
        }
        tracing::warn!("unstaged {at}: {}", e.message());
    }
    node.budget().release(&staging);
    if let Some(g) = node.volume_groups() {
        g.remove_volume(&memcg::volume_name(&staging));
    }
    tracing::info!(
        "unstaged volume {} from {at}; {}",
        req.volume_id,
        node.budget().summary()
    );
    Ok(())
}
