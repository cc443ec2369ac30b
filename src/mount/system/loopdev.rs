//! Loop devices: the block device a drive's FUSE file `disk` is attached to, and
//! the settings that make it suit a disk whose every request crosses a network.
//!
//! The root part attaches the device through a descriptor of `disk` it opened
//! and checked itself (`attach.rs`), and knows the attachment afterwards by
//! numbers the kernel keeps, never by a name the worker serving `disk` could
//! change (`binding.rs`): every action on the device first checks, on the
//! device held open, that it still serves that attachment.

mod attach;
mod binding;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub use attach::{Attached, RegularFile};
pub use binding::{Binding, Now, Pinned, Serves};

/// Most dirty data of the drive's filesystem the page cache holds before its
/// writers wait for writeback: see [`LoopDevice::limit_writeback`].
pub const LOOP_DIRTY_MAX: u64 = 256 * 1024 * 1024;

/// The logical block size a loop device is attached with: 512 bytes, or 4096
/// for an encrypted drive whose sectors are 4096 bytes, as dm-crypt's device
/// for it has (a filesystem made on the loop device then suits the device
/// `cryptsetup open` makes of a downloaded copy: mkfs.xfs takes the device's
/// logical block size as its sector size, and xfs mounts only where that is
/// at least as large). The worker names it; these two values are all it can
/// ask of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSize {
    B512,
    B4096,
}

impl BlockSize {
    /// The block size of `bytes`, when it is one of the two.
    pub fn of(bytes: u32) -> Option<BlockSize> {
        match bytes {
            512 => Some(BlockSize::B512),
            4096 => Some(BlockSize::B4096),
            _ => None,
        }
    }

    pub fn bytes(self) -> u32 {
        match self {
            BlockSize::B512 => 512,
            BlockSize::B4096 => 4096,
        }
    }
}

/// A loop device, `/dev/loopN`: one attached by this process, or one a mount
/// record names. Every operation on it goes through this type, so a device path
/// cannot be mixed up with any other string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    path: String,
    /// Its device number, as read from the node root opened when it attached
    /// it (`None` for one a record names): every later open of the path is
    /// checked against it.
    rdev: Option<u64>,
}

impl std::fmt::Display for LoopDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.path)
    }
}

impl LoopDevice {
    /// The device at `path` (as a mount record names it).
    pub fn at(path: impl Into<String>) -> LoopDevice {
        LoopDevice {
            path: path.into(),
            rdev: None,
        }
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its device number, when known (see the field).
    pub fn rdev(&self) -> Option<u64> {
        self.rdev
    }

    /// `loopN`, its name under /sys/block.
    fn name(&self) -> &str {
        self.path.trim_start_matches("/dev/")
    }

    /// The sysfs directory of the device's writeback settings.
    fn bdi_dir(&self) -> String {
        format!("/sys/block/{}/bdi", self.name())
    }

    /// Opens the device node (read-only: a close after writing would have
    /// udev probe the device again), checked to be a block device and, when
    /// its number is known, that device.
    pub fn open(&self) -> std::io::Result<File> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&self.path)?;
        let meta = f.metadata()?;
        if !meta.file_type().is_block_device() || self.rdev.is_some_and(|r| r != meta.rdev()) {
            return Err(std::io::Error::other(format!(
                "{} is not the device that was attached",
                self.path
            )));
        }
        Ok(f)
    }

    /// Raises the device's read-ahead so the kernel asks for large, overlapping
    /// reads of a sequential stream: each request costs a round trip to the blob, so
    /// reading ahead is what keeps the link busy. Best effort.
    pub fn set_readahead(&self, kib: u32) {
        let _ = std::fs::write(
            format!("/sys/block/{}/queue/read_ahead_kb", self.name()),
            kib.to_string(),
        );
    }

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
    /// [`LoopDevice::detach`] puts the kernel's defaults back before the device can
    /// serve anything else (or after it let go by itself: autoclear, when its
    /// filesystem is unmounted), and [`LoopDevice::released`] where the daemon
    /// learns of that without detaching. A device whose daemon was killed and that
    /// is then detached by hand keeps the limit until blobdrive uses it again:
    /// writeback to it then starts sooner, nothing else changes. Best effort: a
    /// kernel without these files keeps its defaults.
    pub fn limit_writeback(&self, max_bytes: u64) {
        let bdi = self.bdi_dir();
        let set = |file: &str, value: &str| {
            if let Err(e) = std::fs::write(format!("{bdi}/{file}"), value) {
                tracing::warn!("{self}: cannot set {file} to {value}: {e}");
            }
        };
        set("strict_limit", "1");
        set("max_bytes", &max_bytes.to_string());
    }

    /// After the device let go of the drive by itself (autoclear: its filesystem
    /// was unmounted): puts its default writeback rule back, unless something
    /// attached it again meanwhile (whose settings are its own).
    pub fn released(&self) {
        if !self.is_bound() {
            self.writeback_defaults();
        }
    }

    /// The file the device is attached to, as sysfs names it (`None` when it
    /// is not attached): a name for people to read, which the worker serving
    /// `disk` can change (see `binding.rs`), so nothing here decides by it.
    pub fn backing_file(&self) -> Option<std::path::PathBuf> {
        let text = std::fs::read_to_string(format!("/sys/block/{}/loop/backing_file", self.name()))
            .ok()?;
        Some(text.trim_end_matches('\n').into())
    }

    /// Whether the device is attached to any file: the kernel gives a bound
    /// device its `loop` directory in sysfs.
    fn is_bound(&self) -> bool {
        Path::new(&format!("/sys/block/{}/loop", self.name())).exists()
    }

    /// Puts back the kernel's default writeback rule (no limit of its own, no
    /// strict limit): undoes [`LoopDevice::limit_writeback`], so the device serves
    /// whatever uses it next as any other loop device. Best effort.
    fn writeback_defaults(&self) {
        let bdi = self.bdi_dir();
        for (file, value) in [("strict_limit", "0"), ("max_ratio", "100")] {
            let path = format!("{bdi}/{file}");
            if Path::new(&path).exists() {
                if let Err(e) = std::fs::write(&path, value) {
                    tracing::warn!("{self}: cannot put {file} back to {value}: {e}");
                }
            }
        }
    }

    /// Whether any mount (in this mount namespace) has the device as its source,
    /// per the `MAJOR:MINOR` of /proc/self/mountinfo. `None` when that cannot be
    /// told (its number unknown, mountinfo unreadable).
    pub fn is_mounted(&self) -> Option<bool> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        self.is_mounted_per(&info)
    }

    /// [`LoopDevice::is_mounted`], per the mount table `mountinfo` read already.
    pub fn is_mounted_per(&self, mountinfo: &str) -> Option<bool> {
        let want = self.devno()?;
        Some(
            mountinfo
                .lines()
                .any(|l| l.split(' ').nth(2) == Some(want.as_str())),
        )
    }

    /// The device's number as the mount table writes it (`MAJOR:MINOR`), from
    /// the number read when it was attached.
    pub fn devno(&self) -> Option<String> {
        let rdev = self.rdev?;
        Some(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
    }

    /// The processes holding the device open, and the mounts of it in any
    /// mount namespace, in words: what keeps a device detached while in use
    /// attached. (A mount namespace made while the filesystem was mounted,
    /// with its mounts private, keeps a copy that an unmount here does not
    /// reach: seen when a test of another program unshared its namespace
    /// meanwhile, and the loop device stayed attached after its filesystem's
    /// unmount.)
    fn users(&self) -> String {
        let mut users = super::holders(Path::new(&self.path));
        if let Some(devno) = self.devno() {
            users.extend(super::mounted_in_namespaces(&devno));
        }
        if users.is_empty() {
            return String::new();
        }
        format!(" (in use by {})", users.join(", "))
    }
}

/// Sets the autoclear flag of the device held open as `f` (LOOP_SET_STATUS64,
/// which unlike LOOP_GET_STATUS64 asks nothing of the backing file's
/// filesystem): the kernel detaches the device by itself when its last opener
/// closes it. Set once the filesystem on it is mounted (which holds it open),
/// so a plain `umount` of that filesystem detaches the device and so closes
/// the daemon's `disk` file: the daemon's cue to write back and stop. Set
/// earlier, the first close (blkid's, mkfs's) would detach it. The status
/// given is the one the device was attached with (no offset, no size limit,
/// no name); the flags the call cannot change (read-only, direct I/O) stay.
pub fn set_autoclear(f: &File) -> std::io::Result<()> {
    // SAFETY: an all-zero loop_info64 is a valid value of this plain C struct.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    info.lo_flags = LO_FLAGS_AUTOCLEAR;
    // SAFETY: the ioctl reads the loop_info64 it is given.
    check(unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_STATUS64, &info) })
}

/// Makes the device held open as `f` take its backing file's size again
/// (LOOP_SET_CAPACITY), after that file grew; returns its size in bytes now.
pub fn take_new_capacity(f: &File) -> std::io::Result<u64> {
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    check(unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_CAPACITY, 0) })?;
    block_size(f)
}

/// Sets the block size of the device held open as `f` to its sector size, as
/// mkfs.xfs sets it (which the kernel allows root alone): done while a tool
/// confined without that right runs and the device is held, since the kernel
/// sets the block size anew when a device's first opener opens it.
pub fn block_size_to_sector_size(f: &File) -> std::io::Result<()> {
    let mut sector: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int into `sector`; BLKBSZSET reads one.
    check(unsafe { libc::ioctl(f.as_raw_fd(), BLKSSZGET, &mut sector) })?;
    check(unsafe { libc::ioctl(f.as_raw_fd(), BLKBSZSET, &sector) })
}

/// Writes the dirty buffers of the device held open as `f` and drops its
/// cached ones (BLKFLSBUF, root's alone): what a tool confined without that
/// right asked for.
pub fn flush_buffers(f: &File) -> std::io::Result<()> {
    // SAFETY: BLKFLSBUF takes no argument.
    check(unsafe { libc::ioctl(f.as_raw_fd(), BLKFLSBUF, 0) })
}

/// The size in bytes of the block device open as `f` (BLKGETSIZE64).
pub fn block_size(f: &File) -> std::io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`.
    check(unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size) })?;
    Ok(size)
}

/// `Err` with the system's error when a call returned less than zero.
fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
/// `_IOR(0x12, 114, size_t)` of linux/fs.h.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 104)`, `_IOW(0x12, 113, size_t)` and `_IO(0x12, 97)` of
/// linux/fs.h.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKBSZSET: libc::c_ulong = 0x4008_1271;
const BLKFLSBUF: libc::c_ulong = 0x1261;

#[cfg(test)]
mod tests;
