//! Attaching a loop device through a descriptor: the file is the one root
//! opened and checked (see `system::fuse::open_disk`), handed to the kernel as
//! that descriptor (LOOP_CONFIGURE), never named by a path something could
//! lead elsewhere between a check and the attach.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::time::Duration;

use super::binding::{disk_seq, status};
use super::{check, LoopDevice, LoopInfo64, LOOP_DIRTY_MAX, LO_FLAGS_READ_ONLY};
use super::{Binding, BlockSize, Pinned};
use crate::mount::MountError;

/// `struct loop_config` of <linux/loop.h>.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;

/// A regular file open for a loop device to be attached through, with its
/// device and inode as `fstat` gave them when it was checked to be one (what
/// the kernel must then say it attached): checked once, where it was opened
/// (`system::fuse::open_disk` for a drive's `disk`).
#[derive(Debug)]
pub struct RegularFile {
    pub file: File,
    pub id: (u64, u64),
}

impl RegularFile {
    /// `file`, once `fstat` says it is a regular file.
    pub fn checked(file: File) -> Result<RegularFile, MountError> {
        let id = regular_id(&file)?;
        Ok(RegularFile { file, id })
    }
}

/// The device and inode of the regular file open as `file`; refused when it
/// is anything else.
fn regular_id(file: &File) -> Result<(u64, u64), MountError> {
    let meta = file
        .metadata()
        .map_err(|e| MountError::with_source("cannot attach a loop device", e))?;
    if !meta.file_type().is_file() {
        return Err(MountError::system(
            "cannot attach a loop device: not a regular file",
        ));
    }
    Ok((meta.dev(), meta.ino()))
}

/// A loop device this process attached, and the attachment it made.
pub struct Attached {
    /// The device, held open since before it was attached.
    pub pinned: Pinned,
    pub binding: Binding,
}

impl LoopDevice {
    /// Attaches `disk` (a drive's FUSE file `disk`, opened and checked by
    /// root) set up for a disk across a network: a long read-ahead, direct I/O
    /// (no second page cache beside the filesystem's), and when writable a
    /// writeback limit.
    pub fn attach_for_network(
        disk: &RegularFile,
        read_only: bool,
        block: BlockSize,
    ) -> Result<Attached, MountError> {
        let a = LoopDevice::attach_regular(&disk.file, disk.id, read_only, block)?;
        let dev = &a.pinned.dev;
        dev.set_readahead(4096);
        use_direct_io(&a.pinned.file, dev);
        if !read_only {
            dev.limit_writeback(LOOP_DIRTY_MAX);
        }
        tracing::info!("attached {dev}");
        Ok(a)
    }

    /// Attaches the regular file open as `file` to a free loop device, read-only
    /// when asked, its logical block size `block`: the loop driver names a free device, which is opened and
    /// checked to be that block device, and the file is handed to it by its
    /// descriptor. The kernel then says what it attached (LOOP_GET_STATUS64:
    /// the file's device and inode, as `fstat` of `file` gave them, and the
    /// device's number), and the attachment is known by its disk sequence
    /// number from then on (see `binding.rs`).
    pub fn attach_through(
        file: &File,
        read_only: bool,
        block: BlockSize,
    ) -> Result<Attached, MountError> {
        LoopDevice::attach_regular(file, regular_id(file)?, read_only, block)
    }

    /// [`LoopDevice::attach_through`] of a file already checked to be a
    /// regular file whose device and inode are `backing`.
    fn attach_regular(
        file: &File,
        backing: (u64, u64),
        read_only: bool,
        block: BlockSize,
    ) -> Result<Attached, MountError> {
        let fail = |e: std::io::Error| MountError::with_source("cannot attach a loop device", e);
        // Another process may take the device the driver named first: again.
        let mut last = None;
        for _ in 0..5 {
            match configure_free(file, read_only, block) {
                Ok(done) => return checked(done, backing),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(fail(e)),
            }
        }
        Err(fail(last.expect("tried")))
    }
}

/// What the driver named, opened, and attached: the device held open, and its
/// number as the driver named it.
fn configure_free(
    file: &File,
    read_only: bool,
    block: BlockSize,
) -> std::io::Result<(LoopDevice, File, u32)> {
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")?;
    // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
    let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
    check(n)?;
    let path = format!("/dev/loop{n}");
    // Writable unless the mount is not: the driver makes the device read-only
    // when it was opened so.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)?;
    let meta = held.metadata()?;
    if !meta.file_type().is_block_device() {
        return Err(std::io::Error::other(format!(
            "{path} is not a block device"
        )));
    }
    configure(&held, file, read_only, block)?;
    let dev = LoopDevice {
        path,
        rdev: Some(meta.rdev()),
    };
    Ok((dev, held, n as u32))
}

/// LOOP_CONFIGURE of the device `held` with the file `file`: attached, its
/// flags and block size set, in one call (Linux 5.8, which a mount needs:
/// see `system::mountid`).
fn configure(held: &File, file: &File, read_only: bool, block: BlockSize) -> std::io::Result<()> {
    // SAFETY: an all-zero loop_config is a valid value of this plain C struct.
    let mut config: LoopConfig = unsafe { std::mem::zeroed() };
    config.fd = file.as_raw_fd() as u32;
    config.block_size = block.bytes();
    if read_only {
        config.info.lo_flags = LO_FLAGS_READ_ONLY;
    }
    // SAFETY: the ioctl reads the loop_config it is given, whose descriptor
    // is open for as long as the call runs.
    check(unsafe { libc::ioctl(held.as_raw_fd(), LOOP_CONFIGURE, &config) })
}

/// The attachment `done` made, once the kernel said it is the file whose
/// device and inode are `backing` on the device the driver named; detached
/// again otherwise.
fn checked(done: (LoopDevice, File, u32), backing: (u64, u64)) -> Result<Attached, MountError> {
    let (dev, held, n) = done;
    let seq = disk_seq(&held);
    let binding = Binding { seq, backing };
    let said = status(&held);
    let pinned = Pinned { dev, file: held };
    let wrong = match said {
        Ok((d, i, number)) if (d, i) == backing && number == n => return Ok(Attached { pinned, binding }),
        Ok((d, i, number)) => format!(
            "the kernel attached loop{number}, device {d} inode {i}, not loop{n} over device {} inode {}",
            backing.0, backing.1
        ),
        Err(e) => format!("cannot ask {} what it attached: {e}", pinned.dev),
    };
    // SAFETY: an ioctl without an argument on the descriptor held.
    unsafe { libc::ioctl(pinned.file.as_raw_fd(), super::binding::LOOP_CLR_FD as _, 0) };
    Err(MountError::system(format!("{wrong}: detached it")))
}

/// Puts the device in direct-I/O mode: it then sends each request to the disk
/// file as asynchronous direct I/O, so a filesystem's queued requests reach the
/// daemon (and the storage service) together. In buffered mode the loop worker
/// reads and writes the file one request at a time: under 10 ms of network
/// latency random reads at queue depth 32 went from 80 to about 950 per second
/// with it (see docs/benchmarks.md). Best effort: a kernel that refuses leaves
/// buffered mode.
fn use_direct_io(held: &File, dev: &LoopDevice) {
    // SAFETY: LOOP_SET_DIRECT_IO takes its value as its argument.
    if let Err(e) = check(unsafe { libc::ioctl(held.as_raw_fd(), LOOP_SET_DIRECT_IO, 1) }) {
        tracing::warn!("{dev} stays in buffered mode: {e}");
    }
}
