//! The FUSE face of a mounted drive: a directory holding `disk` (the disk's bytes,
//! exactly its size; the VHD footer is not part of it and so can never be written)
//! and `stats` (the daemon's counters as JSON).
//!
//! Thin by design: every data operation goes straight to the [`Cache`]. Files are
//! opened in direct-I/O mode so the kernel keeps no second copy of the data; the
//! daemon's cache is the only one below the filesystem's own page cache.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{debug, warn};

use crate::device::cache::Cache;
use crate::device::{Backend, DeviceError};

mod fetchers;

mod syncers;
mod writers;
use fetchers::Fetchers;
pub use fetchers::{BackgroundFetches, BackgroundJob, BACKGROUND as BACKGROUND_FETCHES};
use syncers::Syncers;
use writers::Writers;

thread_local! {
    /// Each FUSE thread's read buffer, reused: a fresh zeroed buffer per request
    /// cost a memset and new pages every time (`Cache::read` writes every byte).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

const ROOT: u64 = 1;
const DISK: u64 = 2;
const STATS: u64 = 3;
const TTL: Duration = Duration::from_secs(1);
/// `fallocate` modes the loop driver sends for discard and write-zeroes.
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// Produces the `stats` file's content on every read.
pub type StatsFn = Arc<dyn Fn() -> String + Send + Sync>;

pub struct DiskFs<B: Backend> {
    cache: Arc<Cache<B>>,
    /// Where reads that miss the cache go; started by `init` (the FUSE session's
    /// start), so a filesystem that is never mounted starts no threads.
    fetchers: Option<Fetchers>,
    /// Where the daemon's background work reaches the fetch workers.
    background: BackgroundFetches,
    /// Where fsync and close of `disk` go, so no FUSE thread waits on a flush.
    syncers: Option<Syncers>,
    /// Where writes that must wait for room go, so no FUSE thread waits on one.
    writers: Option<Writers>,
    stats: StatsFn,
    /// Handles open on `disk` (a loop device over it holds one).
    open_disk: Arc<AtomicUsize>,
    read_only: bool,
    /// Discards (hole punching, zeroing ranges) are refused (`--no-discard`).
    no_discard: bool,
    uid: u32,
    gid: u32,
    started: SystemTime,
}

impl<B: Backend> DiskFs<B> {
    /// Files belong to `uid`/`gid` (the mounting user), readable by them alone.
    pub fn new(cache: Arc<Cache<B>>, stats: StatsFn, read_only: bool, uid: u32, gid: u32) -> Self {
        DiskFs {
            cache,
            fetchers: None,
            background: BackgroundFetches::default(),
            syncers: None,
            writers: None,
            stats,
            open_disk: Arc::new(AtomicUsize::new(0)),
            read_only,
            no_discard: false,
            uid,
            gid,
            started: SystemTime::now(),
        }
    }

    /// Refuses discards from now on: hole punching and zeroing ranges of
    /// `disk` answer EOPNOTSUPP, so the loop device's discards fail (fstrim
    /// says the device does not support them) and zeroing falls back to writes.
    pub fn refuse_discards(mut self, refuse: bool) -> Self {
        self.no_discard = refuse;
        self
    }

    /// The count of handles open on `disk`, kept up to date as they open and close:
    /// teardown reads it to refuse an unmount that would cut off a writer.
    pub fn open_disk_handles(&self) -> Arc<AtomicUsize> {
        self.open_disk.clone()
    }

    /// Where the daemon sends work for the fetch workers to do behind the
    /// reads (a warm-up of the disk cache); it reaches them once the FUSE
    /// session has started them.
    pub fn background_fetches(&self) -> BackgroundFetches {
        self.background.clone()
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            ROOT => (FileType::Directory, 0o700, 0, 2),
            DISK => (
                FileType::RegularFile,
                if self.read_only { 0o400 } else { 0o600 },
                self.cache.size(),
                1,
            ),
            // Size 0: content is made on read; direct I/O makes readers read to EOF.
            STATS => (FileType::RegularFile, 0o400, 0, 1),
            _ => return None,
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

/// Makes the kernel forget what it holds of `disk`'s attributes (its size, after
/// the drive grew), so that the next `stat` asks the daemon instead of waiting
/// out the attribute timeout.
pub fn forget_disk_attrs(session: &fuser::BackgroundSession) -> std::io::Result<()> {
    session.notifier().inval_inode(INodeNo(DISK), -1, 0)
}

/// Logs a failed operation (`what`, e.g. "read 4096 bytes at 0") and gives the
/// errno the application is answered with, counted by the cache (see
/// [`Cache::answered_error`]): one place for every FUSE reply of a device error,
/// so that none goes unlogged, uncounted or gets another errno.
pub(crate) fn failed<B: Backend>(
    cache: &Cache<B>,
    what: std::fmt::Arguments<'_>,
    e: &DeviceError,
) -> Errno {
    warn!("{what} failed: {e}");
    Errno::from_i32(cache.answered_error(e))
}

/// [`failed`] for a request that changes the drive (a write, an fsync, a
/// discard), counted as a failed write (see [`Cache::answered_write_error`]).
pub(crate) fn failed_write<B: Backend>(
    cache: &Cache<B>,
    what: std::fmt::Arguments<'_>,
    e: &DeviceError,
) -> Errno {
    warn!("{what} failed: {e}");
    Errno::from_i32(cache.answered_write_error(e))
}

impl<B: Backend> Filesystem for DiskFs<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large requests mean fewer round trips through the daemon; the kernel caps
        // it at what it supports.
        let _ = config.set_max_write(1024 * 1024);
        let _ = config.set_max_readahead(1024 * 1024);
        // Direct-I/O files cannot be memory-mapped unless the kernel is told they
        // may (Linux 6.6 on): then a shared mapping of `disk` works, its pages are
        // written back through FUSE like any write, and msync/fsync flush them. An
        // older kernel refuses the flag and mmap stays ENODEV.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // Asynchronous direct I/O: the kernel sends queued direct reads and writes
        // of one process together instead of one at a time, and lets this many be
        // outstanding, so a queue depth above one reaches the storage service.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(fetchers::WORKERS as u16);
        let _ = config.set_congestion_threshold(fetchers::WORKERS as u16 * 3 / 4);
        self.fetchers = Some(Fetchers::start(self.cache.clone(), &self.background)?);
        self.syncers = Some(Syncers::start(self.cache.clone())?);
        self.writers = Some(Writers::start(self.cache.clone())?);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let ino = match (u64::from(parent), name.to_str()) {
            (ROOT, Some("disk")) => DISK,
            (ROOT, Some("stats")) => STATS,
            _ => return reply.error(Errno::ENOENT),
        };
        let attr = self.attr(ino).expect("known inode");
        reply.entry(&TTL, &attr, fuser::Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino.into()) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr(ino.into()) else {
            return reply.error(Errno::ENOENT);
        };
        // The disk's size is fixed; truncating it (as `>` redirection would) is refused.
        if size.is_some_and(|s| s != attr.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &attr);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let acc = flags.0 & libc::O_ACCMODE;
        match u64::from(ino) {
            DISK => {
                if self.read_only && acc != libc::O_RDONLY {
                    return reply.error(Errno::EROFS);
                }
                // The handle says whether it may write: closing a read-only handle
                // must not flush (nor fail because a flush failed).
                let fh = u64::from(acc != libc::O_RDONLY);
                self.open_disk.fetch_add(1, Ordering::SeqCst);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            STATS => {
                if acc != libc::O_RDONLY {
                    return reply.error(Errno::EACCES);
                }
                reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
            }
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match u64::from(ino) {
            DISK => {
                let disk = self.cache.size();
                if offset >= disk {
                    return reply.data(&[]);
                }
                let len = (size as u64).min(disk - offset) as usize;
                let mut reply = reply;
                if let Some(fetchers) = &self.fetchers {
                    if !self.cache.is_cached(offset, len as u64) {
                        match fetchers.read(offset, len, reply) {
                            None => return,
                            Some(back) => reply = back,
                        }
                    }
                }
                READ_BUF.with_borrow_mut(|buf| {
                    if buf.len() < len {
                        buf.resize(len, 0);
                    }
                    let out = &mut buf[..len];
                    match self.cache.read(offset, out) {
                        Ok(()) => reply.data(out),
                        Err(e) => reply.error(failed(
                            &self.cache,
                            format_args!("read {len} bytes at {offset}"),
                            &e,
                        )),
                    }
                })
            }
            STATS => {
                let text = (self.stats)();
                let b = text.as_bytes();
                let start = (offset as usize).min(b.len());
                let end = (start + size as usize).min(b.len());
                reply.data(&b[start..end]);
            }
            _ => reply.error(Errno::EISDIR),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if u64::from(ino) != DISK {
            return reply.error(Errno::EACCES);
        }
        // As on a block device, a write across the end writes the part inside and
        // says how much that was; only a write wholly past the end fails.
        let size = self.cache.size();
        if offset >= size {
            return reply.error(Errno::ENOSPC);
        }
        let data = &data[..(size - offset).min(data.len() as u64) as usize];
        if let Some(writers) = &self.writers {
            if !self.cache.has_room(data.len() as u64) {
                return writers.write(offset, data.to_vec(), reply);
            }
        }
        match self.cache.write(offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(failed_write(
                &self.cache,
                format_args!("write of {} bytes at {offset}", data.len()),
                &e,
            )),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): like NFS, closing a file makes what was written through it
        // durable. A read-only handle wrote nothing, so its close neither flushes
        // nor waits on (or fails with) an outage.
        if fh.0 == 0 {
            return reply.ok();
        }
        self.sync(ino, reply)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if u64::from(ino) == DISK {
            self.open_disk.fetch_sub(1, Ordering::SeqCst);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync(ino, reply)
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if u64::from(ino) != DISK {
            return reply.error(Errno::EACCES);
        }
        if offset.saturating_add(length) > self.cache.size() {
            return reply.error(Errno::ENOSPC);
        }
        let discards = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0;
        if discards && self.no_discard {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let result = if discards {
            // Both leave zeros behind; a cleared page reads as zeros and costs nothing.
            debug!(offset, length, mode, "discard");
            self.cache.discard(offset, length)
        } else if mode & !FALLOC_FL_KEEP_SIZE == 0 {
            // Preallocation inside a fixed-size disk: every byte already exists.
            Ok(())
        } else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(failed_write(
                &self.cache,
                format_args!("discard {length} bytes at {offset}"),
                &e,
            )),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if u64::from(ino) == ROOT {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOTDIR);
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if u64::from(ino) != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, "."),
            (ROOT, FileType::Directory, ".."),
            (DISK, FileType::RegularFile, "disk"),
            (STATS, FileType::RegularFile, "stats"),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.cache.size() / 4096;
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }

    // Extended attributes: none. ENOSYS tells the kernel this filesystem has no
    // xattr support at all, so it stops asking and answers every later call itself
    // with EOPNOTSUPP; fuser's defaults answer the same but log a warning per call
    // (`getxattr security.capability` on every write through the loop device).
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }
}

impl<B: Backend> DiskFs<B> {
    fn sync(&self, ino: INodeNo, reply: ReplyEmpty) {
        if u64::from(ino) != DISK || self.read_only {
            return reply.ok();
        }
        if let Some(syncers) = &self.syncers {
            return syncers.flush(reply);
        }
        match self.cache.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(failed_write(&self.cache, format_args!("flush"), &e)),
        }
    }
}
