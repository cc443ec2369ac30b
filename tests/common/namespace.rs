//! Mount namespaces for the tests' sandboxes that hold on to no other test's
//! drive.
//!
//! A new mount namespace starts with a copy of every mount of the machine. A
//! copy of another test's drive (its FUSE mount, the filesystem on its loop
//! device) keeps that filesystem, and so its loop device, alive after the
//! drive's own unmount: that unmount waits for the loop device in vain
//! ("/dev/loopN is still attached 20 s after detaching it"), and when the
//! namespace ends, its end does the filesystem's final unmount, a journal
//! commit through a FUSE daemon that may be gone or in a simulated outage by
//! then, and hangs there in D state. scripts/test.sh runs the test binaries
//! side by side, so any namespace a test makes copies the others' drives.
//!
//! [`in_mount_namespace`] makes the namespace (its mounts private, so nothing
//! done in it reaches the machine) and lets go of those copies before its
//! program runs: every `fuse.blobdrive` mount, every filesystem on a loop
//! device (binds of one too), and whatever is mounted beneath them.
//!
//! Why it is done this way, the least racy there is:
//! - in the child itself, between fork and exec: the copies exist from the
//!   unshare(2) on, and are gone microseconds later, before the program is
//!   even loaded, where a shell snippet would run only once bash and findmnt
//!   had started (tens of milliseconds; seconds under the lanes' load);
//! - with umount2(2), not umount(8): libmount would update /run/mount/utab,
//!   a file the namespace shares with the machine, holding the entries that
//!   make a plain `umount` of a drive run `umount.blobdrive`, and may itself
//!   run such a helper, which on a copy would unmount the real drive;
//! - each detached by its own path, deepest first (/proc/self/mountinfo lists
//!   a mount after the one it is on), so no path reaches a mount stacked on
//!   it instead, and the namespace's own mountinfo says exactly what was
//!   copied (a list read by the parent beforehand would miss a mount made
//!   between the read and the unshare).
//!
//! What remains is the moment between the unshare and the detach: a drive
//! unmounted right then is held that long, and its final unmount is done by
//! that detach, while its daemon still serves (an unmount waits for its loop
//! device to go before the daemon stops).
//!
//! The child of a fork of a process with threads may only make system calls
//! until it execs: every buffer is allocated before the fork.

use std::ffi::OsStr;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The most of /proc/self/mountinfo read: a namespace with more is refused,
/// not let go of in part.
const MOUNTINFO_MAX: usize = 4 << 20;
/// The most mounts let go of.
const MOUNTS_MAX: usize = 1 << 14;

/// `program`, to be run in a mount namespace of its own whose copies of the
/// machine's drives are let go of before it starts (see the module).
pub fn in_mount_namespace(program: impl AsRef<OsStr>) -> Command {
    entering(program, None)
}

/// The same, but copies of the filesystem on the device `keep` (its
/// `MAJOR:MINOR`) stay: for a test of what such a copy does.
pub fn in_mount_namespace_keeping(program: impl AsRef<OsStr>, keep: &str) -> Command {
    entering(program, Some(keep))
}

fn entering(program: impl AsRef<OsStr>, keep: Option<&str>) -> Command {
    let mut c = Command::new(program);
    let mut let_go = LetGo::new(keep);
    // SAFETY: the closure makes system calls only, on buffers allocated here.
    unsafe {
        c.pre_exec(move || let_go.enter());
    }
    c
}

/// What the child needs to let go of the copies, allocated before the fork.
struct LetGo {
    /// /proc/self/mountinfo as the new namespace has it.
    info: Vec<u8>,
    /// The ids of the mounts let go of, and where their mount point is in
    /// `info`.
    chosen: Vec<(u64, usize, usize)>,
    /// A mount point, unescaped, NUL-terminated.
    path: Vec<u8>,
    keep: Vec<u8>,
}

/// One line of mountinfo: the fields read of it.
struct Line<'a> {
    id: u64,
    parent: u64,
    dev: &'a [u8],
    point: &'a [u8],
    fstype: &'a [u8],
    source: &'a [u8],
}

impl LetGo {
    fn new(keep: Option<&str>) -> LetGo {
        LetGo {
            info: Vec::with_capacity(MOUNTINFO_MAX),
            chosen: Vec::with_capacity(MOUNTS_MAX),
            path: Vec::with_capacity(libc::PATH_MAX as usize + 1),
            keep: keep.unwrap_or_default().as_bytes().to_vec(),
        }
    }

    /// In the child: the namespace, private, then the copies let go of.
    fn enter(&mut self) -> io::Result<()> {
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: integers and NUL-terminated strings that outlive the calls.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // First: a detach in a namespace whose mounts still share their
            // peers' events would unmount the machine's own.
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
        }
        self.read_mountinfo()?;
        self.choose()?;
        self.detach()
    }

    fn read_mountinfo(&mut self) -> io::Result<()> {
        self.info.clear();
        // SAFETY: a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c"/proc/self/mountinfo".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        check(fd)?;
        let read = loop {
            let spare = self.info.capacity() - self.info.len();
            if spare == 0 {
                break Err(io::Error::from_raw_os_error(libc::E2BIG));
            }
            // SAFETY: `spare` bytes past the length are ours to fill.
            let n = unsafe {
                libc::read(
                    fd,
                    self.info.as_mut_ptr().add(self.info.len()).cast(),
                    spare,
                )
            };
            match n {
                0 => break Ok(()),
                n if n < 0 => break Err(io::Error::last_os_error()),
                // SAFETY: the kernel wrote `n` bytes there.
                n => unsafe { self.info.set_len(self.info.len() + n as usize) },
            }
        };
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        read
    }

    /// The drives' mounts, and every mount beneath one: each comes after
    /// the mount it is on, so one pass finds them all. The root stays.
    fn choose(&mut self) -> io::Result<()> {
        self.chosen.clear();
        let base = self.info.as_ptr() as usize;
        for text in self.info.split(|b| *b == b'\n') {
            let Some(l) = Line::parse(text) else { continue };
            let drive = l.fstype == b"fuse.blobdrive" || l.source.starts_with(b"/dev/loop");
            let kept = !self.keep.is_empty() && l.dev == self.keep.as_slice();
            let beneath = self.chosen.iter().any(|(id, ..)| *id == l.parent);
            if l.point == b"/" || !(beneath || (drive && !kept)) {
                continue;
            }
            if self.chosen.len() == self.chosen.capacity() {
                return Err(io::Error::from_raw_os_error(libc::E2BIG));
            }
            let at = l.point.as_ptr() as usize - base;
            self.chosen.push((l.id, at, l.point.len()));
        }
        Ok(())
    }

    /// Detaches the chosen mounts, the last listed first.
    fn detach(&mut self) -> io::Result<()> {
        for i in (0..self.chosen.len()).rev() {
            let (_, at, len) = self.chosen[i];
            unescape(&self.info[at..at + len], &mut self.path)?;
            // SAFETY: `path` is NUL-terminated.
            check(unsafe { libc::umount2(self.path.as_ptr().cast(), libc::MNT_DETACH) })?;
        }
        Ok(())
    }
}

impl Line<'_> {
    /// `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE
    /// SUPER-OPTIONS` (proc_pid_mountinfo(5)).
    fn parse(text: &[u8]) -> Option<Line<'_>> {
        let mut f = text.split(|b| *b == b' ');
        let id = number(f.next()?)?;
        let parent = number(f.next()?)?;
        let dev = f.next()?;
        let _root = f.next()?;
        let point = f.next()?;
        f.find(|x| *x == b"-")?;
        Some(Line {
            id,
            parent,
            dev,
            point,
            fstype: f.next()?,
            source: f.next()?,
        })
    }
}

fn number(text: &[u8]) -> Option<u64> {
    text.iter().try_fold(0u64, |n, b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// mountinfo's octal escapes (`\040` for a space) undone into `out`, with a
/// NUL after; within `out`'s capacity.
fn unescape(text: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    let mut i = 0;
    while i < text.len() {
        let b = match &text[i..] {
            [b'\\', a, b, c, ..] if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) => {
                i += 4;
                (a - b'0') << 6 | (b - b'0') << 3 | (c - b'0')
            }
            _ => {
                i += 1;
                text[i - 1]
            }
        };
        if out.len() + 1 == out.capacity() {
            return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
        }
        out.push(b);
    }
    out.push(0);
    Ok(())
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
