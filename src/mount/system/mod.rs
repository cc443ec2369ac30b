//! The Linux side of mounting, the part that needs root: loop devices
//! (`loopdev`), filesystems (`fs`: detect, create, mount, grow, freeze),
//! mount points and directories (`dirs`), and processes (`procs`). Each failure
//! becomes one line naming the tool and its reason.

mod confined;
mod dirs;
pub mod filesystem;
mod fs;
mod fuse;
mod loopdev;
mod mountid;
pub mod newmount;
mod procs;

pub use confined::TOOL_USER;
pub(crate) use dirs::unescape_mountinfo;
pub use dirs::{
    check_same_dir, dir_id, id_of, is_mountpoint, make_private_dir, open_dir, resolve, umount,
};
pub use fs::{
    free_space, freeze, fs_size, fs_type, grow_ext4_unmounted, grow_fs, has_capability, mkfs,
    mount_fs, mount_on, statvfs, thaw, CAP_SYS_RESOURCE,
};
pub use fuse::{mount_fuse, open_disk, open_mount_root, umount_fuse, FuseMounted};
pub use loopdev::{
    set_autoclear, take_new_capacity, Attached, Binding, BlockSize, LoopDevice, Now, Pinned,
    RegularFile, Serves, LOOP_DIRTY_MAX,
};
pub use mountid::{check_kernel, MountId};
pub use procs::{children, holders, mounted_in_namespaces, pid_alive, state, threads_running};

use std::process::Command;

use super::MountError;

/// Where system tools are when nobody said (systemd's default `PATH`).
pub(super) const STANDARD_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A system tool's command, without the daemon's secrets: the tools blobdrive runs
/// (mkfs, blkid, e2fsck, resize2fs) need none of the account's variables,
/// and a child's environment is readable by anyone who can read its
/// `/proc/PID/environ` for as long as it runs. `NOTIFY_SOCKET` goes too: only the
/// daemon speaks for itself to the service manager.
///
/// mount(8) runs its helpers with no `PATH` at all, and the daemon started by
/// one inherits that: the tools are then looked for in the standard places.
pub(super) fn tool_command(name: &str) -> Command {
    let mut c = Command::new(name);
    if std::env::var_os("PATH").is_none_or(|p| p.is_empty()) {
        c.env("PATH", STANDARD_PATH);
    }
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        // IDENTITY_HEADER is App Service's managed identity secret.
        if k.starts_with("AZURE_")
            || k.starts_with("BLOBDRIVE_")
            || k.starts_with("IDENTITY_")
            || k == "NOTIFY_SOCKET"
        {
            c.env_remove(&*k);
        }
    }
    c
}

/// Runs a tool on the drive's device `dev`, confined (see `confined.rs`):
/// `Ok(stdout)` or an error with its first stderr line.
pub fn run_on(dev: &Pinned, tool: &str, args: &[&str]) -> Result<String, MountError> {
    said(tool, args, confined::output_on(dev, tool, args)?)
}

/// A tool's stdout when it succeeded, else an error with the first stderr line
/// that says something (escaped: a tool run on a drive may repeat its bytes).
fn said(tool: &str, args: &[&str], out: std::process::Output) -> Result<String, MountError> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        // The first line that says something: resize2fs starts with its version.
        let line = err
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with(&format!("{tool} 1.")))
            .unwrap_or("");
        Err(MountError::system(format!(
            "{tool} {} failed: {}",
            args.join(" "),
            if line.is_empty() {
                "no message".to_string()
            } else {
                crate::azure::text::escape_controls(line)
            }
        )))
    }
}
