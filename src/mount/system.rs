//! The Linux side of mounting: loop devices, filesystem detection and creation,
//! mount and umount. Each failure becomes one line naming the tool and its reason.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::MountError;

/// Where system tools are when nobody said (systemd's default `PATH`).
const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A system tool's command, without the daemon's secrets: the tools blobdrive runs
/// (losetup, mkfs, mount, fsfreeze, blkid) need none of the account's variables,
/// and a child's environment is readable by anyone who can read its
/// `/proc/PID/environ` for as long as it runs. `NOTIFY_SOCKET` goes too: only the
/// daemon speaks for itself to the service manager.
///
/// mount(8) runs its helpers with no `PATH` at all, and the daemon started by
/// one inherits that: the tools are then looked for in the standard places.
fn tool_command(name: &str) -> Command {
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

/// Runs a tool; `Ok(stdout)` or an error with its first stderr line.
pub fn run(tool: &str, args: &[&str]) -> Result<String, MountError> {
    let out = tool_command(tool)
        .args(args)
        .output()
        .map_err(|e| MountError::System(format!("cannot run {tool}: {e}")))?;
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
        Err(MountError::System(format!(
            "{tool} {} failed: {}",
            args.join(" "),
            if line.is_empty() { "no message" } else { line }
        )))
    }
}

/// Attaches `file` to a free loop device; returns `/dev/loopN`.
pub fn loop_attach(file: &Path, read_only: bool) -> Result<String, MountError> {
    let f = file
        .to_str()
        .ok_or_else(|| MountError::System("path is not UTF-8".into()))?;
    let mut args = vec!["--find", "--show"];
    if read_only {
        args.push("--read-only");
    }
    args.push(f);
    // Another process may take the device `--find` chose; losetup then fails: retry.
    let mut last = None;
    for _ in 0..5 {
        match run("losetup", &args) {
            Ok(dev) => return Ok(dev),
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    Err(last.expect("tried"))
}

/// Raises a loop device's read-ahead so the kernel asks for large, overlapping
/// reads of a sequential stream: each request costs a round trip to the blob, so
/// reading ahead is what keeps the link busy. Best effort.
pub fn loop_readahead(dev: &str, kib: u32) {
    let name = dev.trim_start_matches("/dev/");
    let _ = std::fs::write(
        format!("/sys/block/{name}/queue/read_ahead_kb"),
        kib.to_string(),
    );
}

/// Most dirty data of the drive's filesystem the page cache holds before its
/// writers wait for writeback: see [`loop_writeback_limit`].
pub const LOOP_DIRTY_MAX: u64 = 256 * 1024 * 1024;

/// Gives a writable loop device over the drive the writeback rule the kernel
/// gives FUSE's own files: a limit of its own on dirty data (`max_bytes`) that
/// binds even while the machine's global limits are far off (`strict_limit`).
///
/// Without it, writeback to the drive starts only at fsync or after 30 s, or once
/// a tenth of the machine's memory is dirty (2.3 GiB here): a 1 GiB write first
/// filled the page cache and only then started uploading. With it, uploads start
/// after some tens of MiB and go on while the writer writes, a sync or unmount has
/// at most this much to send beyond the daemon's own cache, and a writer faster
/// than the storage account is slowed to its pace instead of filling memory.
/// [`loop_detach`] puts the kernel's defaults back before the device can serve
/// anything else (or after it let go by itself: autoclear, when its filesystem
/// is unmounted), and [`loop_released`] where the daemon learns of that without
/// detaching. A device whose daemon was killed and that is then detached by hand
/// keeps the limit until blobdrive uses it again: writeback to it then starts
/// sooner, nothing else changes. Best effort: a kernel without these files keeps
/// its defaults.
pub fn loop_writeback_limit(dev: &str, max_bytes: u64) {
    let bdi = bdi_dir(dev);
    let set = |file: &str, value: &str| {
        if let Err(e) = std::fs::write(format!("{bdi}/{file}"), value) {
            tracing::warn!("{dev}: cannot set {file} to {value}: {e}");
        }
    };
    set("strict_limit", "1");
    set("max_bytes", &max_bytes.to_string());
}

/// After a loop device with autoclear let go of the drive by itself (its
/// filesystem was unmounted): puts its default writeback rule back, unless
/// something attached it again meanwhile (whose settings are its own).
pub fn loop_released(dev: &str) {
    if loop_backing_file(dev).is_none() {
        loop_writeback_defaults(dev);
    }
}

/// Puts back the kernel's default writeback rule of a loop device (no limit of
/// its own, no strict limit): undoes [`loop_writeback_limit`], so the device
/// serves whatever uses it next as any other loop device. Best effort.
fn loop_writeback_defaults(dev: &str) {
    let bdi = bdi_dir(dev);
    for (file, value) in [("strict_limit", "0"), ("max_ratio", "100")] {
        let path = format!("{bdi}/{file}");
        if Path::new(&path).exists() {
            if let Err(e) = std::fs::write(&path, value) {
                tracing::warn!("{dev}: cannot put {file} back to {value}: {e}");
            }
        }
    }
}

/// The sysfs directory of a block device's writeback settings.
fn bdi_dir(dev: &str) -> String {
    format!("/sys/block/{}/bdi", dev.trim_start_matches("/dev/"))
}

/// Puts a loop device in direct-I/O mode: it then sends each request to the disk
/// file as asynchronous direct I/O, so a filesystem's queued requests reach the
/// daemon (and the storage service) together. In buffered mode the loop worker
/// reads and writes the file one request at a time: under 10 ms of network latency
/// random reads at queue depth 32 went from 80 to about 950 per second with it (see
/// docs/benchmarks.md). Best effort: a kernel that refuses leaves buffered mode.
pub fn loop_direct_io(dev: &str) {
    if let Err(e) = run("losetup", &["--direct-io=on", dev]) {
        tracing::warn!("{dev} stays in buffered mode: {e}");
    }
}

/// Detaches a loop device and waits until the kernel let go of its backing file
/// (until then the FUSE mount below it cannot be unmounted), its default
/// writeback rule put back first.
pub fn loop_detach(dev: &str) -> Result<(), MountError> {
    if !Path::new(dev).exists() {
        return Ok(());
    }
    let name = dev.trim_start_matches("/dev/");
    let backing = format!("/sys/block/{name}/loop/backing_file");
    // Also when it let go by itself (autoclear) and there is nothing to detach.
    loop_writeback_defaults(dev);
    if !Path::new(&backing).exists() {
        return Ok(());
    }
    if let Err(e) = run("losetup", &["-d", dev]) {
        // A device with autoclear set may have let go by itself just now.
        if Path::new(&backing).exists() {
            return Err(e);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Path::new(&backing).exists() {
        if Instant::now() > deadline {
            return Err(MountError::System(format!(
                "{dev} is still attached 20 s after detaching it"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The file a loop device is attached to, if it is attached (sysfs says).
pub fn loop_backing_file(dev: &str) -> Option<std::path::PathBuf> {
    let name = dev.trim_start_matches("/dev/");
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(std::path::PathBuf::from(text.trim_end_matches('\n')))
}

/// Whether any mount (in this mount namespace) has the block device `dev` as its
/// source, per the `MAJOR:MINOR` of /proc/self/mountinfo. `None` when that
/// cannot be told (the device node is gone, mountinfo unreadable).
pub fn device_is_mounted(dev: &str) -> Option<bool> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dev).ok()?;
    if !meta.file_type().is_block_device() {
        return None;
    }
    let rdev = meta.rdev();
    let want = format!("{}:{}", libc::major(rdev), libc::minor(rdev));
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    Some(
        info.lines()
            .any(|l| l.split(' ').nth(2) == Some(want.as_str())),
    )
}

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// Sets a loop device's autoclear flag: the kernel detaches it by itself when its
/// last opener closes it. Set once the filesystem on it is mounted (which holds it
/// open), so a plain `umount` of that filesystem detaches the device and so closes
/// the daemon's `disk` file: the daemon's cue to write back and stop. Set earlier,
/// the first close (blkid's, mkfs's) would detach it.
pub fn loop_set_autoclear(dev: &str) -> Result<(), MountError> {
    use std::os::fd::AsRawFd;
    let fail =
        |e: std::io::Error| MountError::System(format!("cannot set autoclear on {dev}: {e}"));
    let f = std::fs::File::open(dev).map_err(fail)?;
    // SAFETY: an all-zero loop_info64 is a valid value of this plain C struct.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes a loop_info64 into `info`, which is one.
    if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_GET_STATUS64, &mut info) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    info.lo_flags |= LO_FLAGS_AUTOCLEAR;
    // SAFETY: the ioctl reads the loop_info64 it was given; offset, size limit
    // and name are the device's own, so only the flag changes.
    if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_STATUS64, &info) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    Ok(())
}

const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
/// `_IOR(0x12, 114, size_t)` of linux/fs.h.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// Makes a loop device take its backing file's size again (LOOP_SET_CAPACITY),
/// after that file grew; returns the device's size in bytes now.
pub fn loop_set_capacity(dev: &str) -> Result<u64, MountError> {
    use std::os::fd::AsRawFd;
    let fail = |e: std::io::Error| MountError::System(format!("cannot grow {dev}: {e}"));
    let f = std::fs::File::open(dev).map_err(fail)?;
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_CAPACITY, 0) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`.
    if unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    Ok(size)
}

/// Grows the filesystem of `dev`, mounted at `mountpoint`, to fill the device, in
/// place and while in use: `resize2fs` for ext4, `xfs_growfs` for xfs. Only if
/// `mountpoint` (not followed if a symlink) is still the root of `dev`'s
/// filesystem.
pub fn grow_fs(dev: &str, fstype: &str, mountpoint: &Path) -> Result<(), MountError> {
    drop(open_root_of(mountpoint, dev, "growing")?);
    let mp = mountpoint
        .to_str()
        .ok_or_else(|| MountError::System("mountpoint is not UTF-8".into()))?;
    match fstype {
        "ext4" => run("resize2fs", &[dev]).map(|_| ()),
        "xfs" => run("xfs_growfs", &["-d", mp]).map(|_| ()),
        other => Err(MountError::System(format!(
            "a {other} filesystem is not grown by blobdrive"
        ))),
    }
}

/// Grows the ext4 filesystem on `dev`, not mounted, to fill the device:
/// `e2fsck -f -p` first (resize2fs refuses a filesystem not checked since it was
/// last mounted; `-p` repairs only what is safe without asking, the journal's
/// replay included), then `resize2fs`. Unlike growing it mounted, this needs no
/// `CAP_SYS_RESOURCE`.
pub fn grow_ext4_unmounted(dev: &str) -> Result<(), MountError> {
    let out = tool_command("e2fsck")
        .args(["-f", "-p", dev])
        .output()
        .map_err(|e| MountError::System(format!("cannot run e2fsck: {e}")))?;
    // 0: clean; 1: errors corrected.
    if !matches!(out.status.code(), Some(0 | 1)) {
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let line = said
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("no message");
        return Err(MountError::System(format!(
            "e2fsck -f -p {dev} found what it repairs only when asked ({line}), so the filesystem was not grown"
        )));
    }
    run("resize2fs", &[dev]).map(|_| ())
}

/// `CAP_SYS_RESOURCE` of <linux/capability.h>: growing a mounted ext4 needs it
/// (the kernel checks it in `ext4_resize_begin`); containers often drop it.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has capability `cap` in effect (/proc/self/status).
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|eff| eff >> cap & 1 == 1)
}

/// The total size in bytes of the filesystem mounted at `path` (statvfs).
pub fn fs_size(path: &Path) -> Option<u64> {
    statvfs(path).map(|st| st.f_blocks * st.f_frsize)
}

/// Bytes free for root on the filesystem holding `path` (statvfs).
pub fn free_space(path: &Path) -> Option<u64> {
    statvfs(path).map(|st| st.f_bfree * st.f_frsize)
}

fn statvfs(path: &Path) -> Option<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid path and `st` a statvfs the call fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st)
}

/// The filesystem type on a device, if any.
pub fn fs_type(dev: &str) -> Result<Option<String>, MountError> {
    let out = tool_command("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", dev])
        .output()
        .map_err(|e| MountError::System(format!("cannot run blkid: {e}")))?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok((!t.is_empty()).then_some(t))
        }
        // 2: nothing found.
        Some(2) => Ok(None),
        _ => Err(MountError::System(format!(
            "blkid {dev} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// Creates a filesystem without discarding the whole disk first (that would be a
/// Clear Pages over every byte of a drive that is already empty).
pub fn mkfs(dev: &str, fstype: &str) -> Result<(), MountError> {
    match fstype {
        "ext4" => run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", dev]).map(|_| ()),
        "xfs" => run("mkfs.xfs", &["-q", "-f", "-K", dev]).map(|_| ()),
        other => Err(MountError::System(format!(
            "--mkfs {other}: only ext4 and xfs are supported"
        ))),
    }
}

/// Mounts `dev` at the directory `at` (opened by [`open_dir`], so the mount lands
/// on the directory that was checked, whatever its path leads to by now). A
/// read-only ext4 whose journal needs recovery (a crash-consistent snapshot) is
/// mounted without replaying it. `flags` (e.g. `nosuid`, `noatime`) are mount(8)'s
/// words for the kernel's flags.
pub fn mount_fs(
    dev: &str,
    at: &std::os::fd::OwnedFd,
    fstype: &str,
    read_only: bool,
    flags: &[String],
) -> Result<(), MountError> {
    if !read_only {
        return mount_at(dev, at, fstype, flags, "");
    }
    let mut ro: Vec<String> = flags.to_vec();
    ro.push("ro".into());
    match mount_at(dev, at, fstype, &ro, "") {
        Ok(()) => Ok(()),
        Err(e) if fstype == "ext4" => mount_at(dev, at, fstype, &ro, "noload").map_err(|_| e),
        Err(e) if fstype == "xfs" => mount_at(dev, at, fstype, &ro, "norecovery").map_err(|_| e),
        Err(e) => Err(e),
    }
}

/// The kernel's mount flags for mount(8)'s words; `None` for a word that is not a
/// flag.
fn mount_flag(word: &str) -> Option<(libc::c_ulong, bool)> {
    Some(match word {
        "ro" => (libc::MS_RDONLY, true),
        "rw" => (libc::MS_RDONLY, false),
        "nosuid" => (libc::MS_NOSUID, true),
        "suid" => (libc::MS_NOSUID, false),
        "nodev" => (libc::MS_NODEV, true),
        "dev" => (libc::MS_NODEV, false),
        "noexec" => (libc::MS_NOEXEC, true),
        "exec" => (libc::MS_NOEXEC, false),
        "noatime" => (libc::MS_NOATIME, true),
        "relatime" => (libc::MS_RELATIME, true),
        "strictatime" => (libc::MS_STRICTATIME, true),
        "nodiratime" => (libc::MS_NODIRATIME, true),
        _ => return None,
    })
}

/// mount(2) of `dev` onto the directory `at` through `/proc/self/fd/N`.
fn mount_at(
    dev: &str,
    at: &std::os::fd::OwnedFd,
    fstype: &str,
    words: &[String],
    data: &str,
) -> Result<(), MountError> {
    use std::os::fd::AsRawFd;
    let mut flags: libc::c_ulong = 0;
    for w in words {
        let (bit, on) =
            mount_flag(w).ok_or_else(|| MountError::System(format!("unknown mount option {w}")))?;
        if on {
            flags |= bit;
        } else {
            flags &= !bit;
        }
    }
    let c = |v: &str| {
        std::ffi::CString::new(v).map_err(|_| MountError::System("NUL in a mount argument".into()))
    };
    let (src, target) = (c(dev)?, c(&format!("/proc/self/fd/{}", at.as_raw_fd()))?);
    let (ty, data) = (c(fstype)?, c(data)?);
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            ty.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    Err(MountError::System(format!(
        "cannot mount the {fstype} filesystem of {dev}: {}",
        std::io::Error::last_os_error()
    )))
}

/// Opens the directory `path` without following a symlink in its last part, and
/// only if it still is the directory `id` names (see [`check_same_dir`]): later
/// operations on it go through the descriptor, never the path again.
pub fn open_dir(path: &Path, id: Option<(u64, u64)>) -> Result<std::os::fd::OwnedFd, MountError> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| MountError::System("path contains NUL".into()))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    let changed = || {
        MountError::System(format!(
            "{} is no longer the directory that was checked before mounting (renamed, replaced or a symlink now): nothing was mounted there",
            path.display()
        ))
    };
    if fd < 0 {
        return Err(changed());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let meta = std::fs::File::from(
        fd.try_clone()
            .map_err(|e| MountError::System(e.to_string()))?,
    )
    .metadata()
    .map_err(|e| MountError::System(format!("cannot use {}: {e}", path.display())))?;
    if id.is_some_and(|id| id != (meta.dev(), meta.ino())) {
        return Err(changed());
    }
    Ok(fd)
}

/// Freezes the filesystem mounted at `mountpoint` (FIFREEZE through a descriptor
/// opened without following a symlink, and only if it is the root of `dev`'s
/// filesystem); thawed by [`thaw`] on the same descriptor.
pub fn freeze(mountpoint: &Path, dev: &str) -> Result<std::fs::File, MountError> {
    use std::os::fd::AsRawFd;
    let f = open_root_of(mountpoint, dev, "freezing")?;
    // SAFETY: FIFREEZE on an open directory of the filesystem; the argument is ignored.
    if unsafe { libc::ioctl(f.as_raw_fd(), FIFREEZE, 0) } != 0 {
        return Err(MountError::System(format!(
            "cannot freeze {}: {}",
            mountpoint.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(f)
}

/// `mountpoint` opened as a directory without following a symlink, if it is the
/// root of `dev`'s filesystem; otherwise an error saying it is not `doing` it.
fn open_root_of(mountpoint: &Path, dev: &str, doing: &str) -> Result<std::fs::File, MountError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(mountpoint)
        .map_err(|e| MountError::System(format!("cannot open {}: {e}", mountpoint.display())))?;
    let here = f
        .metadata()
        .map_err(|e| MountError::System(e.to_string()))?
        .dev();
    let device = std::fs::metadata(dev)
        .map_err(|e| MountError::System(format!("cannot check {dev}: {e}")))?
        .rdev();
    if here != device {
        return Err(MountError::System(format!(
            "{} is not the filesystem of {dev} any more: not {doing} it",
            mountpoint.display()
        )));
    }
    Ok(f)
}

/// Thaws what [`freeze`] froze.
pub fn thaw(frozen: &std::fs::File) -> Result<(), MountError> {
    use std::os::fd::AsRawFd;
    // SAFETY: FITHAW on the descriptor FIFREEZE was given.
    if unsafe { libc::ioctl(frozen.as_raw_fd(), FITHAW, 0) } != 0 {
        return Err(MountError::System(format!(
            "cannot thaw: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` of linux/fs.h.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// Unmounts `path`; a busy filesystem is [`MountError::Busy`] and stays mounted.
pub fn umount(path: &Path, lazy: bool) -> Result<(), MountError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| MountError::System("path contains NUL".into()))?;
    // Never through a symlink put in the mountpoint's place since it was checked.
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), flags) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) => Err(MountError::Busy(path.display().to_string())),
        Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()), // not mounted (any more)
        _ => Err(MountError::System(format!(
            "cannot unmount {}: {err}",
            path.display()
        ))),
    }
}

/// Whether `path` is a mount point (per /proc/self/mountinfo).
pub fn is_mountpoint(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|mp| unescape_mountinfo(mp) == want)
    })
}

/// Undoes the octal escapes (`\040` for a space) of a path in
/// /proc/self/mountinfo, as the kernel writes them, and in libmount's utab.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| {
            b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn pid_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as i32, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A zombie (dead, not yet reaped) is not a running daemon.
    exists && is_zombie(Path::new(&format!("/proc/{pid}/stat"))) != Some(true)
}

/// Whether the process or thread whose `stat` file is at `stat` is a zombie;
/// `None` if that cannot be read.
fn is_zombie(stat: &Path) -> Option<bool> {
    let text = std::fs::read_to_string(stat).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.trim_start().starts_with('Z'))
}

/// Whether any thread of process `pid` is still running. A process's main
/// thread can be a zombie while its other threads are still being killed, and
/// its sockets and files close only when the last of them is gone.
pub fn threads_running(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| is_zombie(&t.path().join("stat")) == Some(false))
}

/// The processes holding `path` open, as "pid N (name)", found in /proc.
pub fn holders(path: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
        {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            found.push(format!("pid {pid} ({})", comm.trim()));
        }
    }
    found
}

/// A directory's (device, inode), read without following a symlink.
pub fn dir_id(path: &Path) -> Result<(u64, u64), MountError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| MountError::System(format!("cannot use {}: {e}", path.display())))?;
    if !meta.is_dir() {
        return Err(MountError::System(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    Ok((meta.dev(), meta.ino()))
}

/// Refuses to mount at `path` unless it still is the directory `id` names: the
/// command that checked it ran earlier, and the path may since lead elsewhere
/// (renamed, replaced, or a symlink now).
pub fn check_same_dir(path: &Path, id: Option<(u64, u64)>) -> Result<(), MountError> {
    match id {
        Some(id) => open_dir(path, Some(id)).map(drop),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountpoint_that_changed_since_it_was_checked_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mp = tmp.path().join("mnt");
        std::fs::create_dir(&mp).unwrap();
        let id = dir_id(&mp).unwrap();
        assert!(check_same_dir(&mp, Some(id)).is_ok());
        // Replaced by another directory of the same name.
        std::fs::rename(&mp, tmp.path().join("old")).unwrap();
        std::fs::create_dir(&mp).unwrap();
        assert!(check_same_dir(&mp, Some(id)).is_err());
        // A symlink to the directory that was checked.
        std::fs::remove_dir(&mp).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("old"), &mp).unwrap();
        let err = check_same_dir(&mp, Some(id)).unwrap_err().to_string();
        assert!(err.contains("no longer the directory"), "{err}");
    }
}
