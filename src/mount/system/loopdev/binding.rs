//! Which attachment a loop device serves, by numbers the kernel keeps.
//!
//! The kernel gives every attachment of a block device a disk sequence number
//! of its own (`diskseq`, from one counter for the whole machine: attaching and
//! detaching each take the next), so while a device's number is the one read
//! right after root attached it, the device is still attached to the file root
//! attached it to. Nothing the worker serving that file answers changes it.
//! It is read from the device held open (`BLKGETDISKSEQ`) before anything is
//! done to the device, and from sysfs by the device's number where the root
//! part only needs to know and must not wait (opening the device waits while
//! another call on it holds it, and such a call may wait on the worker).
//! The sysfs `backing_file` that was compared before is a path the kernel
//! writes from the file's name, which the worker can change: a
//! `FUSE_NOTIFY_INVAL_ENTRY` for `disk` made it end in " (deleted)", and root
//! took the device for one that had let go by itself.
//!
//! A kernel without disk sequence numbers (before 5.15) is asked with
//! LOOP_GET_STATUS64: the backing file's device and inode. That call asks the
//! file's filesystem for its attributes, so for `disk` it waits on the
//! worker's answer (and fails once the worker is dead), and the inode is the
//! worker's word; only the device number is the kernel's own. So it is asked
//! only where waiting is allowed ([`Now::Ask`] elsewhere), and a device on
//! the right filesystem with another inode is [`Serves::Unknown`], never taken
//! for one that let go.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::{check, LoopDevice, LoopInfo64, LOOP_GET_STATUS64};
use crate::mount::MountError;

/// One attachment of a loop device, as root made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The device's disk sequence number right after it was attached; `None`
    /// on a kernel without them.
    pub seq: Option<u64>,
    /// The backing file's device and inode (`fstat` of the descriptor root
    /// attached through), for a kernel without sequence numbers.
    pub backing: (u64, u64),
}

impl Binding {
    /// The attachment a mount's record names by its sequence number.
    pub fn recorded(seq: u64) -> Binding {
        Binding {
            seq: Some(seq),
            backing: (0, 0),
        }
    }
}

/// Whether a device still serves an attachment, asked of the device held open.
pub enum Serves {
    /// It does: the device, held open, so that it cannot let go and be given
    /// to another file while it is held.
    Yes(Pinned),
    /// It does not: it let go (and may serve another file since).
    No,
    /// It cannot be told, for the reason given: nothing is concluded.
    Unknown(String),
}

/// Whether a device still serves an attachment, as the kernel says at once:
/// read from sysfs by the device's number, without opening the device (an
/// open waits while another call on the device holds it, and such a call may
/// wait on the worker) or asking anyone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Now {
    Serves,
    Gone,
    /// Only [`LoopDevice::serves`] can tell (a kernel without sequence
    /// numbers; a number that cannot be read).
    Ask,
}

/// A loop device held open after it was checked to serve an attachment:
/// while it is held the kernel keeps the attachment (a detach, by autoclear
/// or LOOP_CLR_FD, takes effect at the last close), so what is done through
/// it, or on its number, is done to that attachment.
pub struct Pinned {
    pub dev: LoopDevice,
    pub file: File,
}

impl std::fmt::Display for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.dev.fmt(f)
    }
}

impl std::ops::Deref for Pinned {
    type Target = LoopDevice;
    fn deref(&self) -> &LoopDevice {
        &self.dev
    }
}

/// `_IOR(0x12, 128, __u64)` of linux/fs.h: the disk sequence number.
const BLKGETDISKSEQ: libc::c_ulong = 0x8008_1280;
/// The loop driver's request to let go of the backing file (linux/loop.h).
pub(super) const LOOP_CLR_FD: libc::c_ulong = 0x4C01;

/// The disk sequence number of the block device open as `f`; `None` on a
/// kernel without them.
pub(super) fn disk_seq(f: &File) -> Option<u64> {
    let mut seq: u64 = 0;
    // SAFETY: BLKGETDISKSEQ writes one u64 into `seq`.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETDISKSEQ, &mut seq) };
    (rc == 0).then_some(seq)
}

/// LOOP_GET_STATUS64 of the loop device open as `f`: the backing file's
/// device and inode, and the device's number. Waits on the backing file's
/// filesystem (see the module's doc). ENXIO: not attached.
pub(super) fn status(f: &File) -> std::io::Result<(u64, u64, u32)> {
    // SAFETY: an all-zero loop_info64 is a valid value of this plain C struct.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes a loop_info64 into `info`, which is one.
    check(unsafe { libc::ioctl(f.as_raw_fd(), LOOP_GET_STATUS64, &mut info) })?;
    Ok((info.lo_device, info.lo_inode, info.lo_number))
}

impl LoopDevice {
    /// Whether the device still serves `b`, asked of the device held open
    /// (see the module's doc); may wait on the worker on a kernel without
    /// sequence numbers.
    pub fn serves(&self, b: &Binding) -> Serves {
        let file = match self.open() {
            Ok(f) => f,
            // The node is gone: so is the device.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Serves::No,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Serves::No,
            Err(e) => return Serves::Unknown(format!("cannot open {self}: {e}")),
        };
        let pinned = |file| {
            Serves::Yes(Pinned {
                dev: self.clone(),
                file,
            })
        };
        if let Some(seq) = b.seq {
            return match disk_seq(&file) {
                Some(now) if now == seq => pinned(file),
                Some(_) => Serves::No,
                None => Serves::Unknown(format!("{self} has no disk sequence number now")),
            };
        }
        match status(&file) {
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Serves::No,
            Err(e) => Serves::Unknown(format!("cannot ask {self} what it serves: {e}")),
            Ok((dev, _, _)) if dev != b.backing.0 => Serves::No,
            Ok((_, ino, _)) if ino != b.backing.1 => Serves::Unknown(format!(
                "{self} serves a file of the drive's filesystem, but not the inode it was attached to"
            )),
            Ok(_) => pinned(file),
        }
    }

    /// Whether the device still serves `b`, as the kernel says at once (see
    /// [`Now`]): its disk sequence number in sysfs, found by its device
    /// number.
    pub fn serves_now(&self, b: &Binding) -> Now {
        let (Some(seq), Some(rdev)) = (b.seq, self.rdev) else {
            return Now::Ask;
        };
        let path = format!(
            "/sys/dev/block/{}:{}/diskseq",
            libc::major(rdev),
            libc::minor(rdev)
        );
        match std::fs::read_to_string(path) {
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(now) if now == seq => Now::Serves,
                Ok(_) => Now::Gone,
                Err(_) => Now::Ask,
            },
            // The device itself is gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Now::Gone,
            Err(_) => Now::Ask,
        }
    }

    /// The device held open while it serves `b`; an error saying why not.
    pub fn pinned(&self, b: &Binding) -> Result<Pinned, MountError> {
        match self.serves(b) {
            Serves::Yes(p) => Ok(p),
            other => Err(self.not_serving(other)),
        }
    }

    /// Why an action on the device is not done, as [`LoopDevice::serves`]
    /// said it.
    fn not_serving(&self, said: Serves) -> MountError {
        MountError::system(match said {
            Serves::No => format!("{self} no longer serves the drive"),
            Serves::Unknown(why) => {
                format!("cannot tell whether {self} still serves the drive ({why})")
            }
            Serves::Yes(_) => format!("cannot tell whether {self} still serves the drive"),
        })
    }

    /// Detaches the device from the attachment `b` and waits until the kernel
    /// let go of its file (until then the FUSE mount below it cannot be
    /// unmounted), its default writeback rule put back first. A device that no
    /// longer serves `b` is not touched: it let go by itself (autoclear, its
    /// filesystem unmounted) and may already serve another drive, which the
    /// loop driver gives the first free device.
    ///
    /// The device is held open from the check to the detach, so it cannot let
    /// go and be given to another file in between: the kernel keeps a device
    /// someone holds open, and a detach (LOOP_CLR_FD) then takes effect at the
    /// last close, as with `losetup -d` on a device in use. One whose other
    /// users (a process holding it open, a filesystem still mounted from it)
    /// keep it past [`DETACH_WAIT`] is an error naming them; it detaches itself
    /// once they let go.
    pub fn detach(&self, b: &Binding) -> Result<(), MountError> {
        let pin = match self.serves(b) {
            Serves::Yes(p) => p,
            Serves::No => {
                self.released();
                return Ok(());
            }
            other => return Err(self.not_serving(other)),
        };
        self.writeback_defaults();
        // SAFETY: an ioctl without an argument on a descriptor we hold.
        if let Err(e) = check(unsafe { libc::ioctl(pin.file.as_raw_fd(), LOOP_CLR_FD as _, 0) }) {
            // ENXIO: not attached (any more).
            if e.raw_os_error() != Some(libc::ENXIO) {
                return Err(MountError::with_source(format!("cannot detach {self}"), e));
            }
        }
        drop(pin);
        let deadline = Instant::now() + DETACH_WAIT;
        while !matches!(self.serves(b), Serves::No) {
            if Instant::now() > deadline {
                return Err(MountError::system(format!(
                    "{self} is still attached {} s after detaching it{}; it detaches itself once nothing uses it",
                    DETACH_WAIT.as_secs(),
                    self.users()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// How long a detach waits for the device's other users to let go.
pub const DETACH_WAIT: Duration = Duration::from_secs(20);
