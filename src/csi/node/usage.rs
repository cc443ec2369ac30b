//! NodeGetVolumeStats and NodeExpandVolume, for a path that is one of this
//! driver's volumes by its own records: the staging path of a mount of that
//! volume, or a target it published the volume at. Any other path (a
//! directory, someone's mount, `/proc`) is NOT_FOUND.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use tonic::Status;

use super::stage::{blobdrive, staged_at};
use crate::csi::paths;
use crate::csi::proto::*;
use crate::csi::targets;
use crate::csi::volume::{self, VolumeId};
use crate::mount::record::{self, MountRecord};
use crate::mount::system::{has_capability, CAP_SYS_RESOURCE};
use crate::mount::{superblock, Mode};

/// A path where a volume is looked for: required, but any other path is only a
/// place where no volume is found (csi-sanity asks at `some/path` and expects
/// NOT_FOUND). A relative path is never one: this process's working directory
/// is no place of the CO's.
fn volume_path_arg(p: &str) -> Result<PathBuf, Status> {
    if p.is_empty() {
        return Err(Status::invalid_argument("a volume path is required"));
    }
    if !p.starts_with('/') {
        return Err(Status::not_found(format!("no volume is mounted at {p}")));
    }
    Ok(PathBuf::from(p))
}

/// What is at a volume's path.
enum AtPath {
    /// The staging path: the mount itself.
    Staged(Box<MountRecord>),
    /// A target it was published at (a block volume's is its device node).
    Published { block: bool },
}

/// Which of volume `volume_id`'s paths `path` is; NOT_FOUND when it is none.
fn volume_at(volume_id: &str, path: &Path) -> Result<(PathBuf, AtPath), Status> {
    let not_found = || {
        Status::not_found(format!(
            "no volume {volume_id} is mounted at {} by this driver",
            path.display()
        ))
    };
    let resolved = paths::resolve(path).ok_or_else(not_found)?;
    if let Some(r) = staged_at(&resolved).filter(|r| r.blob == volume_id) {
        return Ok((resolved, AtPath::Staged(Box::new(r))));
    }
    match targets::at(&resolved) {
        Some(p) if p.volume_id == volume_id && super::bind::alive(&p) => {
            Ok((resolved, AtPath::Published { block: p.block }))
        }
        _ => Err(not_found()),
    }
}

/// Opens the volume at `path` for reading its size (no symlink followed).
fn open_volume(path: &Path, dir: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    if dir {
        flags |= libc::O_DIRECTORY;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
}

fn fstatvfs(f: &std::fs::File) -> std::io::Result<libc::statvfs> {
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `f` is open; `st` is a statvfs the call fills.
    if unsafe { libc::fstatvfs(f.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// The size of the file or block device `f`, by seeking to its end.
fn byte_size(mut f: &std::fs::File) -> std::io::Result<u64> {
    use std::io::Seek;
    f.seek(std::io::SeekFrom::End(0))
}

pub fn stats(req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse, Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let asked = volume_path_arg(&req.volume_path)?;
    let (path, at) = volume_at(&req.volume_id, &asked)?;
    let failed =
        |e: std::io::Error| Status::internal(format!("cannot size {}: {e}", path.display()));
    let device = match &at {
        AtPath::Published { block } => *block,
        AtPath::Staged(r) => r.mode != Mode::Fs,
    };
    let usage = if device {
        let total = match &at {
            AtPath::Staged(r) => r
                .device
                .as_deref()
                .map_or(Ok(0), |d| byte_size(&std::fs::File::open(d)?)),
            AtPath::Published { .. } => byte_size(&open_volume(&path, false).map_err(failed)?),
        }
        .map_err(failed)?;
        vec![VolumeUsage {
            available: 0,
            total: total as i64,
            used: 0,
            unit: volume_usage::Unit::Bytes as i32,
        }]
    } else {
        let st = fstatvfs(&open_volume(&path, true).map_err(failed)?).map_err(failed)?;
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
    };
    Ok(NodeGetVolumeStatsResponse {
        usage,
        volume_condition: None,
    })
}

/// The size of the disk under a staged volume, and what its ext4 filesystem
/// says of its own size (read from its superblock through the loop device).
fn sizes(staged: &MountRecord) -> Result<(u64, Option<superblock::Found>), Status> {
    let Some(dev) = staged.device.as_deref() else {
        return Ok((0, None));
    };
    let failed = |e: std::io::Error| Status::internal(format!("cannot read {dev}: {e}"));
    let f = std::fs::File::open(dev).map_err(failed)?;
    let disk = byte_size(&f).map_err(failed)?;
    if staged.mode != Mode::Fs {
        return Ok((disk, None));
    }
    let mut head = vec![0u8; superblock::HEAD_BYTES];
    let fd: OwnedFd = f.into();
    let n = nix_pread(&fd, &mut head).map_err(failed)?;
    head.truncate(n);
    Ok((disk, superblock::detect(&head)))
}

fn nix_pread(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes; `fd` is open.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Grows a staged drive online through its daemon (`blobdrive resize`): the
/// blob, the loop device and the filesystem. A drive already that large whose
/// filesystem fills it (it grew while unstaged, and staging grew the
/// filesystem) is answered at once: nothing to do, and nothing that needs a
/// capability. An ext4 that must grow while mounted needs CAP_SYS_RESOURCE:
/// without it the answer is FAILED_PRECONDITION saying the way out (the
/// resizer retries INTERNAL for ever).
pub async fn expand(req: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse, Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("a volume id is required"));
    }
    let asked = volume_path_arg(&req.volume_path)?;
    let size = volume::size_for(req.capacity_range.as_ref())?;
    let id = VolumeId::known(&req.volume_id)?;
    volume_at(&req.volume_id, &asked)?;
    let staged = record::load_all()
        .into_iter()
        .find(|r| r.blob == id.spec() && !r.read_only && record::alive(r))
        .ok_or_else(|| {
            Status::not_found(format!(
                "volume {} is not staged on this node writable",
                id.spec()
            ))
        })?;
    let (disk, fs) = sizes(&staged)?;
    let small = fs
        .as_ref()
        .is_some_and(|f| superblock::worth_growing(f.fstype, f.bytes, disk));
    if disk >= size && !small {
        return Ok(NodeExpandVolumeResponse {
            capacity_bytes: disk as i64,
        });
    }
    let ext4 = fs.as_ref().is_some_and(|f| f.fstype == "ext4");
    if ext4 && !has_capability(CAP_SYS_RESOURCE) {
        return Err(cannot_grow_online(&id));
    }
    let to = size.max(disk);
    let at = staged.mountpoint.to_string_lossy().to_string();
    blobdrive(&["resize", &at, "--size", &to.to_string()])
        .await
        .map_err(|e| {
            if e.message().contains("CAP_SYS_RESOURCE") {
                cannot_grow_online(&id)
            } else {
                e
            }
        })?;
    Ok(NodeExpandVolumeResponse {
        capacity_bytes: to as i64,
    })
}

fn cannot_grow_online(id: &VolumeId) -> Status {
    Status::failed_precondition(format!(
        "volume {} holds an ext4 filesystem, and growing it while it is mounted needs CAP_SYS_RESOURCE, which this node plugin and the mounts it starts lack: give the node plugin's container CAP_SYS_RESOURCE, or let the volume be unstaged (stop the pods that use it) and staged again: staging grows the filesystem to fill the disk before it is mounted, which needs no capability",
        id.spec()
    ))
}
