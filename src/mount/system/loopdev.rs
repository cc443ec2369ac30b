//! Loop devices: the block device a drive's FUSE file `disk` is attached to, and
//! the settings that make it suit a disk whose every request crosses a network.

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::run;
use crate::mount::MountError;

/// Most dirty data of the drive's filesystem the page cache holds before its
/// writers wait for writeback: see [`LoopDevice::limit_writeback`].
pub const LOOP_DIRTY_MAX: u64 = 256 * 1024 * 1024;

/// The loop driver's request to let go of the backing file (linux/loop.h).
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;

/// A loop device, `/dev/loopN`: one attached by this process, or one a mount
/// record names. Every operation on it goes through this type, so a device path
/// cannot be mixed up with any other string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    path: String,
}

impl std::fmt::Display for LoopDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.path)
    }
}

impl LoopDevice {
    /// The device at `path` (as a mount record names it).
    pub fn at(path: impl Into<String>) -> LoopDevice {
        LoopDevice { path: path.into() }
    }

    /// Attaches `file` (a drive's FUSE file `disk`) set up for a disk across a
    /// network: a long read-ahead, direct I/O (no second page cache beside
    /// the filesystem's), and when writable a writeback limit. Both the
    /// one-process daemon and a split daemon's root part attach through it.
    pub fn attach_for_network(file: &Path, read_only: bool) -> Result<LoopDevice, MountError> {
        let dev = LoopDevice::attach(file, read_only)?;
        dev.set_readahead(4096);
        dev.use_direct_io();
        if !read_only {
            dev.limit_writeback(LOOP_DIRTY_MAX);
        }
        tracing::info!("attached {dev}");
        Ok(dev)
    }

    /// Attaches `file` to a free loop device.
    pub fn attach(file: &Path, read_only: bool) -> Result<LoopDevice, MountError> {
        let f = file
            .to_str()
            .ok_or_else(|| MountError::system("path is not UTF-8"))?;
        let mut args = vec!["--find", "--show"];
        if read_only {
            args.push("--read-only");
        }
        args.push(f);
        // Another process may take the device `--find` chose; losetup then fails: retry.
        let mut last = None;
        for _ in 0..5 {
            match run("losetup", &args) {
                Ok(dev) => return Ok(LoopDevice::at(dev)),
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        Err(last.expect("tried"))
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `loopN`, its name under /sys/block.
    fn name(&self) -> &str {
        self.path.trim_start_matches("/dev/")
    }

    /// The sysfs directory of the device's writeback settings.
    fn bdi_dir(&self) -> String {
        format!("/sys/block/{}/bdi", self.name())
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
        if self.backing_file().is_none() {
            self.writeback_defaults();
        }
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

    /// Puts the device in direct-I/O mode: it then sends each request to the disk
    /// file as asynchronous direct I/O, so a filesystem's queued requests reach the
    /// daemon (and the storage service) together. In buffered mode the loop worker
    /// reads and writes the file one request at a time: under 10 ms of network
    /// latency random reads at queue depth 32 went from 80 to about 950 per second
    /// with it (see docs/benchmarks.md). Best effort: a kernel that refuses leaves
    /// buffered mode.
    pub fn use_direct_io(&self) {
        if let Err(e) = run("losetup", &["--direct-io=on", &self.path]) {
            tracing::warn!("{self} stays in buffered mode: {e}");
        }
    }

    /// Detaches the device from `backing` (the file it was attached over, as
    /// the kernel names it) and waits until the kernel let go of it (until
    /// then the FUSE mount below it cannot be unmounted), its default
    /// writeback rule put back first. A device no longer over `backing` is not
    /// touched: it let go by itself (autoclear, its filesystem unmounted) and
    /// may already serve another drive, which `losetup --find` gives the first
    /// free device. `None` (the file could not be read at attaching) detaches
    /// whatever the device is attached over.
    ///
    /// The device is held open from the check to the detach, so it cannot let
    /// go and be given to another file in between: the kernel keeps a device
    /// someone holds open, and a detach (LOOP_CLR_FD) then takes effect at the
    /// last close, as with `losetup -d` on a device in use.
    pub fn detach(&self, backing: Option<&Path>) -> Result<(), MountError> {
        let ours = || match (self.backing_file(), backing) {
            (Some(now), Some(b)) => now == b,
            (now, None) => now.is_some(),
            (None, Some(_)) => false,
        };
        let pin = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(MountError::system(format!("cannot open {self}: {e}"))),
        };
        if !ours() {
            self.released();
            return Ok(());
        }
        self.writeback_defaults();
        // SAFETY: an ioctl without an argument on a descriptor we hold.
        if unsafe { libc::ioctl(pin.as_raw_fd(), LOOP_CLR_FD as _, 0) } != 0 {
            let e = std::io::Error::last_os_error();
            // ENXIO: not attached (any more).
            if e.raw_os_error() != Some(libc::ENXIO) {
                return Err(MountError::system(format!("cannot detach {self}: {e}")));
            }
        }
        drop(pin);
        let deadline = Instant::now() + Duration::from_secs(20);
        while ours() {
            if Instant::now() > deadline {
                return Err(MountError::system(format!(
                    "{self} is still attached 20 s after detaching it"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The file the device is attached to, if it is attached (sysfs says).
    pub fn backing_file(&self) -> Option<PathBuf> {
        let text = std::fs::read_to_string(format!("/sys/block/{}/loop/backing_file", self.name()))
            .ok()?;
        Some(PathBuf::from(text.trim_end_matches('\n')))
    }

    /// Whether any mount (in this mount namespace) has the device as its source,
    /// per the `MAJOR:MINOR` of /proc/self/mountinfo. `None` when that cannot be
    /// told (the device node is gone, mountinfo unreadable).
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

    /// The device's number as the mount table writes it (`MAJOR:MINOR`);
    /// `None` when its node is gone or is not a block device.
    pub fn devno(&self) -> Option<String> {
        use std::os::unix::fs::FileTypeExt;
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&self.path).ok()?;
        if !meta.file_type().is_block_device() {
            return None;
        }
        let rdev = meta.rdev();
        Some(format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
    }

    /// Sets the autoclear flag: the kernel detaches the device by itself when its
    /// last opener closes it. Set once the filesystem on it is mounted (which holds
    /// it open), so a plain `umount` of that filesystem detaches the device and so
    /// closes the daemon's `disk` file: the daemon's cue to write back and stop.
    /// Set earlier, the first close (blkid's, mkfs's) would detach it.
    pub fn set_autoclear(&self) -> Result<(), MountError> {
        use std::os::fd::AsRawFd;
        let fail = |e: std::io::Error| {
            MountError::with_source(format!("cannot set autoclear on {self}"), e)
        };
        let f = std::fs::File::open(&self.path).map_err(fail)?;
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

    /// Makes the device take its backing file's size again (LOOP_SET_CAPACITY),
    /// after that file grew; returns the device's size in bytes now.
    pub fn take_new_capacity(&self) -> Result<u64, MountError> {
        use std::os::fd::AsRawFd;
        let fail = |e: std::io::Error| MountError::with_source(format!("cannot grow {self}"), e);
        let f = std::fs::File::open(&self.path).map_err(fail)?;
        // SAFETY: LOOP_SET_CAPACITY takes no argument.
        if unsafe { libc::ioctl(f.as_raw_fd(), LOOP_SET_CAPACITY, 0) } != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        block_size(&f).map_err(fail)
    }

    /// The device opened, its block size set to its sector size, as mkfs.xfs
    /// sets it (which the kernel allows root alone): held open while a tool
    /// confined without that right runs, since the kernel sets the block
    /// size anew when a device's first opener opens it.
    pub fn held_at_sector_size(&self) -> Result<std::fs::File, MountError> {
        use std::os::fd::AsRawFd;
        let fail = |e| MountError::with_source(format!("cannot set the block size of {self}"), e);
        let f = std::fs::File::open(&self.path).map_err(fail)?;
        let mut sector: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int into `sector`; BLKBSZSET reads one.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKSSZGET, &mut sector) } != 0
            || unsafe { libc::ioctl(f.as_raw_fd(), BLKBSZSET, &sector) } != 0
        {
            return Err(fail(std::io::Error::last_os_error()));
        }
        Ok(f)
    }

    /// Writes the device's dirty buffers and drops its cached ones
    /// (BLKFLSBUF, root's alone): what a tool confined without that right
    /// asked for.
    pub fn flush_buffers(&self) -> Result<(), MountError> {
        use std::os::fd::AsRawFd;
        let fail = |e| MountError::with_source(format!("cannot flush the buffers of {self}"), e);
        let f = std::fs::File::open(&self.path).map_err(fail)?;
        // SAFETY: BLKFLSBUF takes no argument.
        if unsafe { libc::ioctl(f.as_raw_fd(), BLKFLSBUF, 0) } != 0 {
            return Err(fail(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The device's size in bytes.
    pub fn size(&self) -> Result<u64, MountError> {
        let fail = |e| MountError::with_source(format!("cannot read the size of {self}"), e);
        block_size(&std::fs::File::open(&self.path).map_err(fail)?).map_err(fail)
    }
}

/// The size in bytes of the block device open as `f` (BLKGETSIZE64).
fn block_size(f: &std::fs::File) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`.
    if unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(size)
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
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
/// `_IOR(0x12, 114, size_t)` of linux/fs.h.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 104)`, `_IOW(0x12, 113, size_t)` and `_IO(0x12, 97)` of
/// linux/fs.h.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKBSZSET: libc::c_ulong = 0x4008_1271;
const BLKFLSBUF: libc::c_ulong = 0x1261;

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of 1 MiB in `dir`, by its real path (as sysfs names it).
    fn backing(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
        p.canonicalize().unwrap()
    }

    /// A mount's loop device let go of its disk by itself and `losetup
    /// --find` gave it to another file before the mount's teardown detached
    /// it (seen in a CI run, where test binaries attach loop devices at the
    /// same time): the teardown leaves the other file's device alone, and the
    /// other's own detach still works.
    #[test]
    fn a_device_given_to_another_file_meanwhile_is_not_detached() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (mine, other) = (backing(dir.path(), "mine"), backing(dir.path(), "other"));
        // Another process may take the device between the two steps: again.
        let dev = (0..5)
            .find_map(|_| {
                let dev = LoopDevice::attach(&mine, false).unwrap();
                run("losetup", &["-d", dev.path()]).unwrap();
                let again = run("losetup", &[dev.path(), other.to_str().unwrap()]);
                again.is_ok().then_some(dev)
            })
            .expect("a loop device given to the other file");
        assert_eq!(dev.backing_file().as_deref(), Some(other.as_path()));
        dev.detach(Some(&mine)).unwrap();
        let after = dev.backing_file();
        if after.is_some() {
            dev.detach(Some(&other)).unwrap();
        }
        assert_eq!(
            after.as_deref(),
            Some(other.as_path()),
            "the other's device"
        );
        assert_eq!(dev.backing_file(), None);
        dev.detach(Some(&other)).unwrap();
    }
}
