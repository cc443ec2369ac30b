//! The Node service: a volume staged on this node is an ordinary blobdrive
//! mount at the staging path, made by running `blobdrive mount` (so each
//! volume's daemon outlives the CSI process: a node plugin restarted, or
//! killed, takes no volume with it), and published by bind-mounting it (or its
//! loop device, for a block volume) at the target path.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::{Request, Response, Status};

use super::cgroup::{join_in_child, VolumeCgroup};
use super::proto::node_server::Node;
use super::proto::node_service_capability::{self, rpc};
use super::proto::volume_capability::AccessType;
use super::proto::*;
use super::volume::{self, VolumeId};
use crate::azure::BlobService;
use crate::mount::record::{self, MountRecord};
use crate::mount::system;

/// How many volumes this node takes (NodeGetInfo): an idle mounted volume
/// holds a few MiB and threads that end when idle; loop devices and the
/// kernel's FUSE connections are the bound that is left.
pub const MAX_VOLUMES_PER_NODE: i64 = 64;

/// How long a mount, an unmount or a resize run by the node may take: a
/// mount writes a filesystem onto a new drive, an unmount writes back what
/// is cached. Past it the call fails and the CO calls again.
const COMMAND_LIMIT: Duration = Duration::from_secs(300);

pub struct NodeService {
    /// The account, to tell a volume that does not exist (NOT_FOUND) from one
    /// not staged here (FAILED_PRECONDITION).
    service: BlobService,
    node_id: String,
    /// Where the volumes' daemons go, apart from this plugin's cgroup.
    volume_cgroup: Option<VolumeCgroup>,
    /// Where staged volumes keep their disk caches, if anywhere.
    disk_cache: Option<PathBuf>,
}

impl NodeService {
    pub fn new(
        service: BlobService,
        node_id: String,
        volume_cgroup: Option<VolumeCgroup>,
        disk_cache: Option<PathBuf>,
    ) -> NodeService {
        NodeService {
            service,
            node_id,
            volume_cgroup,
            disk_cache,
        }
    }

    /// The mount's options for the node's disk cache, and for a warm-up when
    /// the volume asks for one (started as the mount is ready, which NodeStage
    /// does not wait for). A volume that asks for a warm-up on a node without
    /// a disk cache is staged without one, saying so in the log.
    fn disk_cache_args(&self, spec: &str, warm: bool) -> Vec<String> {
        let Some(dir) = &self.disk_cache else {
            if warm {
                tracing::warn!(
                    "volume {spec} asks for warmUp, but this node has no --disk-cache: staged without a warm-up"
                );
            }
            return Vec::new();
        };
        let mut args = vec!["--disk-cache".to_string(), dir.display().to_string()];
        if warm {
            args.push("--warm".to_string());
        }
        args
    }

    /// NOT_FOUND unless the volume's blob exists.
    async fn must_exist(&self, id: &VolumeId) -> Result<(), Status> {
        match self
            .service
            .blob(&id.container, &id.blob)
            .properties()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => {
                Err(Status::not_found(format!("no volume {}", id.spec())))
            }
            Err(e) => Err(super::status_of(e)),
        }
    }
}

/// The live mount at `path`, if any.
fn staged_at(path: &Path) -> Option<MountRecord> {
    record::load_all()
        .into_iter()
        .find(|r| r.mountpoint == path && record::alive(r))
}

/// Runs this program with `args` (a mount, an unmount, a resize), bounded in
/// time; its one-line error becomes the status's message.
async fn blobdrive(args: &[&str]) -> Result<String, Status> {
    blobdrive_in(args, None).await
}

/// [`blobdrive`], started inside `cgroup` when one is given: a mount's daemon
/// then lives there, not in this plugin's cgroup (see [`cgroup`](super::cgroup)).
async fn blobdrive_in(args: &[&str], cgroup: Option<&VolumeCgroup>) -> Result<String, Status> {
    let exe = std::env::current_exe()
        .map_err(|e| Status::internal(format!("cannot find this program: {e}")))?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(cgroup) = cgroup {
        let procs = cgroup
            .procs()
            .map_err(|e| Status::internal(format!("cannot open the volume cgroup: {e}")))?;
        // SAFETY: the closure only calls write(2) on a descriptor opened
        // before the fork, which is async-signal-safe.
        unsafe {
            command.pre_exec(move || join_in_child(&procs));
        }
    }
    let child = command.output();
    let out = tokio::time::timeout(COMMAND_LIMIT, child)
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

/// A path where a volume is looked for (stats, expand): required, but any
/// other path is only a place where no volume is found (csi-sanity asks at
/// `some/path` and expects NOT_FOUND). A relative path is never one: this
/// process's working directory is no place of the CO's.
fn volume_path_arg(p: &str) -> Result<PathBuf, Status> {
    if p.is_empty() {
        return Err(Status::invalid_argument("a volume path is required"));
    }
    if !p.starts_with('/') {
        return Err(Status::not_found(format!("no volume is mounted at {p}")));
    }
    Ok(PathBuf::from(p))
}

fn path_arg(p: &str, what: &str) -> Result<PathBuf, Status> {
    if p.is_empty() {
        return Err(Status::invalid_argument(format!("a {what} is required")));
    }
    if !p.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "{what} {p} is not absolute"
        )));
    }
    Ok(PathBuf::from(p))
}

fn c_path(p: &Path) -> Result<CString, Status> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Status::invalid_argument("a path holds a NUL byte"))
}

/// Bind-mounts `from` at `to`: nosuid, and nodev unless it is the block
/// device itself (`device`); read-only if asked.
fn bind(from: &Path, to: &Path, read_only: bool, device: bool) -> Result<(), Status> {
    let (src, dst) = (c_path(from)?, c_path(to)?);
    let fail = |what: &str| {
        Status::internal(format!(
            "cannot {what} {} at {}: {}",
            from.display(),
            to.display(),
            std::io::Error::last_os_error()
        ))
    };
    // SAFETY: both are valid NUL-terminated paths; a bind mount reads no type or data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(fail("bind-mount"));
    }
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID;
    if !device {
        flags |= libc::MS_NODEV;
    }
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: as above; a remount of the bind mount just made, changing its flags.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            dst.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = fail("restrict the bind mount of");
        let _ = system::umount(to, true);
        return Err(e);
    }
    Ok(())
}

fn rpc_capability(t: rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

/// The size of the file or block device at `path`, by seeking to its end.
fn byte_size(path: &Path) -> std::io::Result<u64> {
    use std::io::Seek;
    std::fs::File::open(path)?.seek(std::io::SeekFrom::End(0))
}

#[tonic::async_trait]
impl Node for NodeService {
    /// Mounts the drive at the staging path: its filesystem (made if the drive
    /// is blank), or for a block volume its loop device (FUSE at the path).
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        let staging = path_arg(&req.staging_target_path, "staging target path")?;
        let Some(cap) = req.volume_capability else {
            return Err(Status::invalid_argument("a volume capability is required"));
        };
        if let Some(why) = volume::unsupported(std::slice::from_ref(&cap)) {
            return Err(Status::invalid_argument(why));
        }
        let id = VolumeId::parse(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
        let warm = volume::warm_up(req.volume_context.get(volume::WARM_UP))?;
        if let Some(r) = staged_at(&staging) {
            if r.blob == id.spec() {
                return Ok(Response::new(NodeStageVolumeResponse {}));
            }
            return Err(Status::failed_precondition(format!(
                "{} holds volume {} already",
                staging.display(),
                r.blob
            )));
        }
        self.must_exist(&id).await?;
        std::fs::create_dir_all(&staging)
            .map_err(|e| Status::internal(format!("cannot make {}: {e}", staging.display())))?;
        let read_only = req
            .publish_context
            .get(volume::READONLY_CONTEXT)
            .is_some_and(|v| v == "true")
            || volume::read_only(&cap);
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
        let cache_args = self.disk_cache_args(&spec, warm);
        args.extend(cache_args.iter().map(String::as_str));
        blobdrive_in(&args, self.volume_cgroup.as_ref()).await?;
        tracing::info!("staged volume {spec} at {at} for node {}", self.node_id);
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    /// Takes the drive down (`blobdrive unmount`): everything cached written, the
    /// lease released. A drive fenced meanwhile (its volume unpublished from
    /// this node) comes down too, saying what it could not write.
    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        let staging = path_arg(&req.staging_target_path, "staging target path")?;
        if staged_at(&staging).is_none() {
            return Ok(Response::new(NodeUnstageVolumeResponse {}));
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
        tracing::info!("unstaged volume {} from {at}", req.volume_id);
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        let staging = path_arg(&req.staging_target_path, "staging target path")?;
        let target = path_arg(&req.target_path, "target path")?;
        let Some(cap) = req.volume_capability else {
            return Err(Status::invalid_argument("a volume capability is required"));
        };
        let Some(staged) = staged_at(&staging) else {
            let id = VolumeId::parse(&req.volume_id)
                .ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
            self.must_exist(&id).await?;
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id,
                staging.display()
            )));
        };
        if system::is_mountpoint(&target) {
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
        let read_only = req.readonly || volume::read_only(&cap);
        let block = matches!(cap.access_type, Some(AccessType::Block(_)));
        let from = match &cap.access_type {
            Some(AccessType::Block(_)) => {
                let dev = staged.device.clone().ok_or_else(|| {
                    Status::failed_precondition("the staged volume has no block device")
                })?;
                if let Some(parent) = target.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&target)
                    .map_err(|e| {
                        Status::internal(format!("cannot make {}: {e}", target.display()))
                    })?;
                PathBuf::from(dev)
            }
            _ => {
                std::fs::create_dir_all(&target).map_err(|e| {
                    Status::internal(format!("cannot make {}: {e}", target.display()))
                })?;
                staging.clone()
            }
        };
        bind(&from, &target, read_only, block)?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        let target = path_arg(&req.target_path, "target path")?;
        while system::is_mountpoint(&target) {
            system::umount(&target, false).map_err(|e| Status::internal(e.to_string()))?;
        }
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                let _ = std::fs::remove_dir(&target);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&target);
            }
            Err(_) => {}
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        let path = volume_path_arg(&req.volume_path)?;
        let meta = std::fs::metadata(&path)
            .ok()
            .filter(|_| system::is_mountpoint(&path))
            .ok_or_else(|| {
                Status::not_found(format!("no volume is mounted at {}", path.display()))
            })?;
        let usage = if meta.is_dir() {
            let st = system::statvfs(&path)
                .map_err(|e| Status::internal(format!("cannot statvfs {}: {e}", path.display())))?;
            let block = st.f_frsize;
            vec![
                VolumeUsage {
                    available: (st.f_bavail * block) as i64,
                    total: (st.f_blocks * block) as i64,
                    used: ((st.f_blocks - st.f_bfree) * block) as i64,
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: st.f_favail as i64,
                    total: st.f_files as i64,
                    used: (st.f_files - st.f_ffree) as i64,
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ]
        } else {
            let total = byte_size(&path)
                .map_err(|e| Status::internal(format!("cannot size {}: {e}", path.display())))?;
            vec![VolumeUsage {
                available: 0,
                total: total as i64,
                used: 0,
                unit: volume_usage::Unit::Bytes as i32,
            }]
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        }))
    }

    /// Grows a staged drive online through its daemon (`blobdrive resize`): the
    /// blob, the loop device and the filesystem.
    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("a volume id is required"));
        }
        volume_path_arg(&req.volume_path)?;
        let size = volume::size_for(req.capacity_range.as_ref())?;
        let id = VolumeId::parse(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
        let staged = record::load_all()
            .into_iter()
            .find(|r| r.blob == id.spec() && !r.read_only && record::alive(r))
            .ok_or_else(|| {
                Status::not_found(format!("volume {} is not staged on this node", id.spec()))
            })?;
        let at = staged.mountpoint.to_string_lossy().to_string();
        blobdrive(&["resize", &at, "--size", &size.to_string()]).await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc_capability(rpc::Type::StageUnstageVolume),
                rpc_capability(rpc::Type::GetVolumeStats),
                rpc_capability(rpc::Type::ExpandVolume),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: MAX_VOLUMES_PER_NODE,
            accessible_topology: None,
        }))
    }
}
