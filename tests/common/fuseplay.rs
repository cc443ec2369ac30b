//! A compromised worker's FUSE answers, played on its `/dev/fuse` descriptor
//! taken from it while it is stopped: the lookup of `disk` is answered with a
//! symlink (to any file of the machine) or a node of the test's choosing, and
//! `FUSE_NOTIFY_INVAL_ENTRY` for `disk` is sent as a worker can send it. Only
//! what the root part's use of `disk` asks is answered (the handshake, the
//! lookup, the attributes, the link's target); anything else is refused.
//! The kernel's FUSE protocol, as <linux/fuse.h> lays it out.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What the lookup of `disk` is answered with.
#[derive(Clone, Debug)]
pub enum Disk {
    /// A symlink to this path.
    Symlink(PathBuf),
    /// A node of this mode (type and permissions) and device number.
    Node { mode: u32, rdev: u32 },
}

/// A FUSE server answering on a worker's `/dev/fuse` until stopped.
pub struct Player {
    fuse: Arc<OwnedFd>,
    disk: Arc<Mutex<Disk>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The node id the played `disk` gets: none a real worker gives.
const PLAYED: u64 = 0x7000_0000;

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const READLINK: u32 = 5;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;
const NOTIFY_INVAL_ENTRY: i32 = 3;

impl Player {
    /// Serves on `fuse` (a copy of the worker's `/dev/fuse` descriptor): the
    /// worker must be stopped, or it would take requests too.
    pub fn start(fuse: OwnedFd, disk: Disk) -> Player {
        let fuse = Arc::new(fuse);
        let disk = Arc::new(Mutex::new(disk));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, d, s) = (fuse.clone(), disk.clone(), stop.clone());
        let thread = std::thread::spawn(move || serve(&f, &d, &s));
        Player {
            fuse,
            disk,
            stop,
            thread: Some(thread),
        }
    }

    /// Answers `disk` with `disk` from now on, and has the kernel forget the
    /// answer it has (so that it asks again).
    pub fn answer(&self, disk: Disk) {
        *self.disk.lock().unwrap() = disk;
        self.inval_disk();
    }

    /// `FUSE_NOTIFY_INVAL_ENTRY` for `disk` in the root directory, as a
    /// worker sends it.
    pub fn inval_disk(&self) {
        inval_disk(&self.fuse);
    }
}

impl Drop for Player {
    /// Stops serving, has the kernel forget the played `disk`, and lets go of
    /// the descriptor (a copy left open would keep the drive's FUSE
    /// connection alive after the worker died, and every access to it
    /// waiting).
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.inval_disk();
    }
}

/// `FUSE_NOTIFY_INVAL_ENTRY` for `disk` in the root directory, written to the
/// `/dev/fuse` descriptor `fuse`; whether the kernel took it (it refuses one
/// for a name it does not hold).
pub fn inval_disk(fuse: &OwnedFd) -> bool {
    let name = b"disk";
    let mut msg = out_header(0, NOTIFY_INVAL_ENTRY, 16 + 16 + name.len() + 1);
    msg.extend_from_slice(&1u64.to_ne_bytes());
    msg.extend_from_slice(&(name.len() as u32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(name);
    msg.push(0);
    write_all(fuse, &msg)
}

fn serve(fuse: &OwnedFd, disk: &Mutex<Disk>, stop: &AtomicBool) {
    let mut buf = vec![0u8; 17 << 20];
    while !stop.load(SeqCst) {
        let mut p = libc::pollfd {
            fd: fuse.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, 50) } != 1 {
            continue;
        }
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(fuse.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 40 {
            continue;
        }
        let req = &buf[..n as usize];
        let (opcode, unique, node) = (u32_at(req, 4), u64_at(req, 8), u64_at(req, 16));
        let body = &req[40..];
        let d = disk.lock().unwrap().clone();
        let reply: Result<Vec<u8>, i32> = match opcode {
            FORGET | BATCH_FORGET | INTERRUPT => continue,
            INIT => Ok(init_out(u32_at(body, 8))),
            LOOKUP if node == 1 && body.starts_with(b"disk\0") => Ok(entry_out(&d)),
            LOOKUP => Err(libc::ENOENT),
            GETATTR if node == 1 => Ok(attr_out(&attr(1, libc::S_IFDIR | 0o755, 0, 0))),
            GETATTR if node == PLAYED => Ok(attr_out(&played_attr(&d))),
            READLINK if node == PLAYED => match &d {
                Disk::Symlink(to) => Ok(to.as_os_str().as_encoded_bytes().to_vec()),
                Disk::Node { .. } => Err(libc::EINVAL),
            },
            _ => Err(libc::ENOSYS),
        };
        let msg = match reply {
            Ok(body) => {
                let mut m = out_header(unique, 0, 16 + body.len());
                m.extend_from_slice(&body);
                m
            }
            Err(errno) => out_header(unique, -errno, 16),
        };
        write_all(fuse, &msg);
    }
}

fn write_all(fuse: &OwnedFd, msg: &[u8]) -> bool {
    // SAFETY: writes `msg.len()` bytes from `msg`.
    let n = unsafe { libc::write(fuse.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
    n == msg.len() as isize
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// `struct fuse_out_header`: its length (the whole message's), error, unique.
fn out_header(unique: u64, error: i32, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&error.to_ne_bytes());
    m.extend_from_slice(&unique.to_ne_bytes());
    m
}

/// `struct fuse_init_out` of protocol 7.31, nothing asked for.
fn init_out(max_readahead: u32) -> Vec<u8> {
    let mut m = Vec::new();
    for v in [7u32, 31, max_readahead, 0] {
        m.extend_from_slice(&v.to_ne_bytes());
    }
    m.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    m.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    m.extend_from_slice(&(128u32 << 10).to_ne_bytes()); // max_write
    m.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    m.resize(64, 0);
    m
}

/// `struct fuse_attr`: node, mode, size, device number.
fn attr(ino: u64, mode: u32, size: u64, rdev: u32) -> Vec<u8> {
    let mut a = Vec::with_capacity(88);
    for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [0u32, 0, 0, mode, 1, 0, 0, rdev, 4096, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    a
}

fn played_attr(d: &Disk) -> Vec<u8> {
    match d {
        Disk::Symlink(to) => attr(
            PLAYED,
            libc::S_IFLNK | 0o777,
            to.as_os_str().len() as u64,
            0,
        ),
        Disk::Node { mode, rdev } => attr(PLAYED, *mode, 0, *rdev),
    }
}

/// `struct fuse_entry_out` for the played `disk`, valid for no time (the
/// kernel asks again at its next use).
fn entry_out(d: &Disk) -> Vec<u8> {
    let mut e = Vec::with_capacity(128);
    for v in [PLAYED, 0, 0, 0] {
        e.extend_from_slice(&v.to_ne_bytes());
    }
    e.extend_from_slice(&[0u8; 8]);
    e.extend_from_slice(&played_attr(d));
    e
}

/// `struct fuse_attr_out`, valid for no time.
fn attr_out(a: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m.extend_from_slice(a);
    m
}
