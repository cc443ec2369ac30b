//! The disk cache's files: the per-drive directory under the one the operator
//! named, its lock, the data file of slots, and the index a clean unmount leaves.
//!
//! The daemon runs as root and the directory is on a local filesystem other
//! users may reach, so nothing here follows a link or trusts a file it did not
//! make: the operator's directory must be root's and writable by no one else
//! (else another user could swap what is in it), it is held open and everything
//! below it is reached relative to that handle with `O_NOFOLLOW`, the drive's
//! directory is created 0700, and the index is read with a bound and checked
//! whole (crc32c) before any of it is believed.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::direct::DirectReader;
use super::index::{Chunk, CHUNK, PIECE, PIECES};
use super::lock::{lock_existing, lock_new, Holder};
use super::preadv::read_vectored_exact_at;
use super::reclaim::{empty_untrusted, LeftTo};

/// What a clean unmount saw of the blob after its last write: the cache is
/// current for exactly this blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobState {
    pub etag: String,
    pub content_length: u64,
    pub sequence_number: u64,
}

/// What a clean unmount left: the blob's state then, and the index's entries.
pub type Left = (BlobState, Vec<(u64, Chunk)>);

/// A drive's cache directory, and its lock file, locked (flock) for as long
/// as it is open (see [`open_drive_dir`]).
pub struct DriveDir {
    pub dir: File,
    pub lock: File,
}

impl DriveDir {
    /// Another handle of both: the lock is held until every handle is closed.
    pub fn try_clone(&self) -> std::io::Result<DriveDir> {
        Ok(DriveDir {
            dir: self.dir.try_clone()?,
            lock: self.lock.try_clone()?,
        })
    }
}

/// The files of one drive's cache, locked for this mount.
pub struct Files {
    dir: File,
    /// Held (flock) for as long as this is alive, when this process locked
    /// the directory (a split daemon's root part holds it for its worker).
    _lock: Option<File>,
    pub data: File,
    /// The same data file opened for direct reads, where its filesystem allows.
    direct: Option<DirectReader>,
}

const MAGIC: &[u8; 8] = b"BDDCIDX1";
/// Bytes per index entry: chunk, slot, valid mask, crcs.
const ENTRY: usize = 8 + 4 + 2 + 4 * PIECES;
/// An ETag longer than this is not one the service sends.
const MAX_ETAG: usize = 256;

fn cstr(name: &str) -> CString {
    CString::new(name).expect("no NUL in our own names")
}

/// Opens `name` in `dir` (`O_NOFOLLOW`): `flags` as for open(2).
fn open_at(dir: &File, name: &str, flags: i32) -> std::io::Result<File> {
    let n = cstr(name);
    // SAFETY: a valid directory fd and NUL-terminated name; the fd returned is ours.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            n.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The data file `data` in `dir` opened again, read-only with `O_DIRECT`: `None`
/// where the filesystem refuses it, or where the name no longer leads to the
/// very file `data` is (nothing then reads through it).
fn open_direct(dir: &File, data: &File) -> Option<File> {
    let f = open_at(dir, "data", libc::O_RDONLY | libc::O_DIRECT).ok()?;
    let (a, b) = (f.metadata().ok()?, data.metadata().ok()?);
    (a.dev() == b.dev() && a.ino() == b.ino()).then_some(f)
}

fn fsync_dir(dir: &File) -> std::io::Result<()> {
    dir.sync_all()
}

/// The directory name of one drive's cache: account, container and blob (and
/// snapshot), with every byte but letters, digits, `-` and `_` written `%XX`,
/// then a hash of the endpoint; shortened with a hash of the whole if long.
///
/// The endpoint is part of the key: a cache filled through one endpoint (a
/// proxy that rewrote bytes, another emulator) must not be served warm through
/// another that answers with the same name, ETag, length and sequence number.
pub fn dir_name(
    endpoint: &str,
    account: &str,
    container: &str,
    blob: &str,
    snapshot: Option<&str>,
) -> String {
    let mut whole = format!("{account}.{container}.{}", escape(blob));
    if let Some(s) = snapshot {
        whole.push('@');
        whole.push_str(&escape(s));
    }
    whole.push_str(".e");
    whole.push_str(&short_hash(endpoint));
    if whole.len() <= 200 {
        return whole;
    }
    let hex = short_hash(&whole);
    let mut cut = 180;
    while !whole.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}~{hex}", &whole[..cut])
}

/// The first 8 bytes of `s`'s SHA-256, in hex.
fn short_hash(s: &str) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(s.as_bytes());
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Refuses a directory another user could change: it must be root's (or
/// `also`'s: the worker's user of a split daemon, for a drive's own directory)
/// and not writable by group or others. `what` names it in the error.
fn check_owned(
    meta: &std::fs::Metadata,
    what: &str,
    strict: bool,
    also: Option<u32>,
) -> Result<(), String> {
    let forbidden = if strict { 0o077 } else { 0o022 };
    let owner_ok = meta.uid() == 0 || Some(meta.uid()) == also;
    if !owner_ok || meta.mode() & forbidden != 0 {
        return Err(format!(
            "{what} must be root's and {} (it is uid {}, mode {:o})",
            if strict {
                "closed to group and others"
            } else {
                "writable by no one else"
            },
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Checks that `dir` can hold disk caches (an existing directory, root's,
/// writable by no one else, not a symbolic link), without changing anything.
pub fn check_dir(dir: &Path) -> Result<File, String> {
    let shown = dir.display();
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                format!("--disk-cache {shown}: not a directory (a symbolic link is not followed)")
            }
            _ => format!("--disk-cache {shown}: {e}"),
        })?;
    let meta = f
        .metadata()
        .map_err(|e| format!("--disk-cache {shown}: {e}"))?;
    check_owned(&meta, &format!("--disk-cache {shown}"), false, None)?;
    Ok(f)
}

/// Opens (creating it 0700) the directory of one drive's cache, `name` under
/// `parent` (see [`check_dir`]), not following a link, and locks it: one
/// another mount holds is refused before anything in it is changed, naming
/// that mount (`holder` names the pid holding the lock). It must be root's, or
/// with `owner` (the uid and gid of a split daemon's worker, which does the
/// cache's I/O) root's, that user's, or a pool uid (`left_to` tells) whose
/// mount's root part was killed before it could take the directory back:
/// kept if no one uses that uid now, emptied if another mount does. With
/// `owner` it is then given to that user, and so are the files a root daemon
/// or that idle uid left in it: regular, with one link, which a hard link the
/// worker made to another's file is not.
pub fn open_drive_dir(
    parent: &Path,
    name: &str,
    owner: Option<(u32, u32)>,
    left_to: &dyn Fn(u32) -> LeftTo,
    holder: Holder,
) -> Result<DriveDir, String> {
    let top = check_dir(parent)?;
    let shown = parent.join(name);
    let shown = shown.display();
    let n = cstr(name);
    // SAFETY: valid fd and NUL-terminated name.
    if unsafe { libc::mkdirat(top.as_raw_fd(), n.as_ptr(), 0o700) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(format!("cannot create {shown}: {e}"));
        }
    }
    let dir = open_at(&top, name, libc::O_RDONLY | libc::O_DIRECTORY).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
            format!("{shown} is not a directory (a symbolic link is not followed)")
        } else {
            format!("cannot open {shown}: {e}")
        }
    })?;
    let meta = dir
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut left_by = meta.uid();
    let mut meta = meta;
    // A live mount's directory is refused before anything in it changes.
    let mut lock = lock_existing(&dir, &shown.to_string(), left_by, holder)?;
    let also = match owner {
        Some((uid, _)) if left_by != 0 && left_by != uid => match left_to(left_by) {
            LeftTo::Idle => Some(left_by),
            LeftTo::InUse => {
                empty_untrusted(&dir).map_err(|e| {
                    format!("{shown} was left to uid {left_by}, which another mount now runs as, and cannot be emptied: {e}")
                })?;
                tracing::warn!("the disk cache {shown} was left to uid {left_by}, which another mount now runs as: emptied, this mount starts cold");
                left_by = 0;
                // (Its file is gone with the rest.)
                lock = None;
                meta = dir
                    .metadata()
                    .map_err(|e| format!("cannot read {shown}: {e}"))?;
                Some(uid)
            }
            LeftTo::NotPool => Some(uid),
        },
        Some((uid, _)) => Some(uid),
        None => None,
    };
    check_owned(&meta, &shown.to_string(), true, also)?;
    if let Some((uid, gid)) = owner {
        give_to(&dir, (uid, gid), left_by)
            .map_err(|e| format!("cannot give {shown} to uid {uid}: {e}"))?;
    }
    let lock = match lock {
        Some(l) => l,
        None => lock_new(&dir, &shown.to_string(), holder)?,
    };
    // A split daemon's root part holds it: root's, not the worker's.
    // SAFETY: fchown on a valid descriptor.
    if owner.is_some() && unsafe { libc::fchown(lock.as_raw_fd(), 0, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("cannot make {shown}/lock root's: {e}"));
    }
    Ok(DriveDir { dir, lock })
}

/// Takes a drive's directory `dir` back from the worker's uid `uid` once its
/// mount is down: it and the files that uid left in it (regular, one link)
/// become root's again, so that no later worker given the same uid finds a
/// directory of another drive its own.
pub fn take_back(dir: &File, uid: u32) -> std::io::Result<()> {
    if uid == 0 {
        return Ok(());
    }
    chown_files(dir, uid, (0, 0))?;
    // SAFETY: fchown on a valid descriptor.
    if unsafe { libc::fchown(dir.as_raw_fd(), 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The bytes the data file in the drive's directory `dir` takes on its
/// filesystem (0 when there is none).
pub fn data_bytes_in(dir: &File) -> u64 {
    open_at(dir, "data", libc::O_RDONLY | libc::O_NONBLOCK)
        .and_then(|f| f.metadata())
        .map_or(0, |m| m.blocks() * 512)
}

/// The free bytes of the filesystem `dir` is on.
pub fn free_space_of(dir: &File) -> Option<u64> {
    // SAFETY: statvfs is plain old data, filled in by fstatvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to one statvfs.
    if unsafe { libc::fstatvfs(dir.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bfree * st.f_frsize)
}

/// Gives the directory `dir` to `to` (uid, gid), with the files root or the
/// directory's previous owner `from` made in it.
fn give_to(dir: &File, to: (u32, u32), from: u32) -> std::io::Result<()> {
    // SAFETY: fchown on a valid descriptor.
    if unsafe { libc::fchown(dir.as_raw_fd(), to.0, to.1) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    chown_files(dir, 0, to)?;
    if from != 0 && from != to.0 {
        chown_files(dir, from, to)?;
    }
    Ok(())
}

/// Gives the cache's own files in `dir` that are `from`'s (regular, with one
/// link) to `to` (uid, gid).
fn chown_files(dir: &File, from: u32, to: (u32, u32)) -> std::io::Result<()> {
    for name in ["data", "index", "index.new"] {
        let Ok(f) = open_at(dir, name, libc::O_RDONLY | libc::O_NONBLOCK) else {
            continue;
        };
        let m = f.metadata()?;
        if m.file_type().is_file() && m.nlink() == 1 && m.uid() == from {
            // SAFETY: fchown on a valid descriptor.
            if unsafe { libc::fchown(f.as_raw_fd(), to.0, to.1) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

impl Files {
    /// Opens (creating it 0700) the directory `name` under `parent` and takes its
    /// lock: a second mount of the same drive with the same parent is refused.
    pub fn open(parent: &Path, name: &str) -> Result<Files, String> {
        let holder = |pid: Option<u32>| match pid {
            Some(pid) => format!("pid {pid}"),
            None => "another mount".to_string(),
        };
        let d = open_drive_dir(parent, name, None, &|_| LeftTo::NotPool, &holder)?;
        Files::open_in(d.dir, Some(d.lock), &parent.join(name))
    }

    /// Opens the files of the drive's cache directory `dir` (opened and
    /// locked by [`open_drive_dir`]; `shown` names it), keeping `lock` (the
    /// lock's handle, when this process is to hold it).
    pub fn open_in(dir: File, lock: Option<File>, shown: &Path) -> Result<Files, String> {
        let shown = shown.display();
        let data = open_at(&dir, "data", libc::O_RDWR | libc::O_CREAT)
            .map_err(|e| format!("cannot open {shown}/data: {e}"))?;
        if !data
            .metadata()
            .map(|m| m.file_type().is_file())
            .unwrap_or(false)
        {
            return Err(format!("{shown}/data is not a regular file"));
        }
        let direct = open_direct(&dir, &data).map(DirectReader::new);
        Ok(Files {
            dir,
            _lock: lock,
            data,
            direct,
        })
    }

    /// Fills `bufs` in turn from the data file at `offset` (one read, scattered):
    /// directly where every buffer is aligned and the filesystem allows, else
    /// through the page cache.
    pub fn read_data_vectored(&self, bufs: &mut [&mut [u8]], offset: u64) -> std::io::Result<()> {
        if let Some(d) = &self.direct {
            if d.read_vectored_exact_at(bufs, offset)? {
                return Ok(());
            }
        }
        read_vectored_exact_at(&self.data, bufs, offset)
    }

    /// Reads `buf.len()` bytes of the data file at `offset`: directly where the
    /// read is aligned and the filesystem allows, else through the page cache.
    pub fn read_data(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if let Some(d) = &self.direct {
            if d.read_exact_at(buf, offset)? {
                return Ok(());
            }
        }
        self.data.read_exact_at(buf, offset)
    }

    /// Takes the index a clean unmount left, if any, and removes it, so that
    /// from now on (until the next clean unmount writes one) a crash leaves no
    /// index to trust. `None` when there was none or it does not hold together.
    pub fn take_index(&self, slots: u32) -> std::io::Result<Option<Left>> {
        // An index may name as many chunks as the data file has slots: a cache
        // mounted again with a smaller limit reads all of it and keeps what
        // fits (a bound of the new slots alone threw it all away).
        let had = u32::try_from(self.data.metadata()?.len() / CHUNK).unwrap_or(u32::MAX);
        let slots = slots.max(had);
        let f = match open_at(&self.dir, "index", libc::O_RDONLY | libc::O_NONBLOCK) {
            Ok(f) => Some(f),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        let parsed = match f {
            None => None,
            Some(mut f) => {
                let limit = (64 + MAX_ETAG + ENTRY * slots as usize + 4) as u64;
                let mut bytes = Vec::new();
                let regular = f.metadata()?.file_type().is_file();
                if regular {
                    (&mut f).take(limit + 1).read_to_end(&mut bytes)?;
                }
                self.unlink("index")?;
                fsync_dir(&self.dir)?;
                if regular && bytes.len() as u64 <= limit {
                    decode(&bytes)
                } else {
                    None
                }
            }
        };
        Ok(parsed)
    }

    /// Copies the chunk in slot `from` of the data file to slot `to`, synced: a
    /// cache mounted again with a smaller limit moves what it keeps into the
    /// slots that remain. (Each block's crc32c goes with it in the index, so a
    /// copy cut short is found out on reading, never served.)
    pub fn move_slot(&self, from: u32, to: u32) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; CHUNK as usize];
        self.data.read_exact_at(&mut buf, u64::from(from) * CHUNK)?;
        self.data.write_all_at(&buf, u64::from(to) * CHUNK)
    }

    /// Makes the data file `slots` slots long and, unless `keep`, empty first.
    pub fn size_data(&self, slots: u32, keep: bool) -> std::io::Result<()> {
        if !keep {
            self.data.set_len(0)?;
        }
        self.data.set_len(u64::from(slots) * CHUNK)
    }

    /// Writes the index for `state` (the data file synced first, the index
    /// replaced atomically), so the next mount can trust the data file as is.
    pub fn write_index(&self, state: &BlobState, entries: &[(u64, Chunk)]) -> std::io::Result<()> {
        self.data.sync_all()?;
        let bytes = encode(state, entries);
        let _ = self.unlink("index.new");
        let mut f = open_at(
            &self.dir,
            "index.new",
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        )?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        let (a, b) = (cstr("index.new"), cstr("index"));
        let fd = self.dir.as_raw_fd();
        // SAFETY: valid fd and NUL-terminated names.
        if unsafe { libc::renameat(fd, a.as_ptr(), fd, b.as_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        fsync_dir(&self.dir)
    }

    fn unlink(&self, name: &str) -> std::io::Result<()> {
        let n = cstr(name);
        // SAFETY: valid fd and NUL-terminated name.
        if unsafe { libc::unlinkat(self.dir.as_raw_fd(), n.as_ptr(), 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the directory was removed under the mount (the data file still
    /// works then, but nothing would find it again).
    pub fn removed(&self) -> bool {
        self.data.metadata().map(|m| m.nlink() == 0).unwrap_or(true)
            || self.dir.metadata().map(|m| m.nlink() == 0).unwrap_or(true)
    }
}

fn encode(state: &BlobState, entries: &[(u64, Chunk)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + state.etag.len() + ENTRY * entries.len() + 4);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&(CHUNK as u32).to_le_bytes());
    b.extend_from_slice(&(PIECE as u32).to_le_bytes());
    b.extend_from_slice(&state.content_length.to_le_bytes());
    b.extend_from_slice(&state.sequence_number.to_le_bytes());
    b.extend_from_slice(&(state.etag.len() as u16).to_le_bytes());
    b.extend_from_slice(state.etag.as_bytes());
    b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (chunk, c) in entries {
        b.extend_from_slice(&chunk.to_le_bytes());
        b.extend_from_slice(&c.slot.to_le_bytes());
        b.extend_from_slice(&c.valid.to_le_bytes());
        for crc in &c.crc {
            b.extend_from_slice(&crc.to_le_bytes());
        }
    }
    let sum = crc32c::crc32c(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// Reads what [`encode`] wrote; `None` for anything else.
fn decode(bytes: &[u8]) -> Option<Left> {
    let (body, sum) = bytes.split_at(bytes.len().checked_sub(4)?);
    if crc32c::crc32c(body) != u32::from_le_bytes(sum.try_into().ok()?) {
        return None;
    }
    let mut r = Reader(body);
    if r.take(8)? != MAGIC || u64::from(r.u32()?) != CHUNK || u64::from(r.u32()?) != PIECE {
        return None;
    }
    let content_length = r.u64()?;
    let sequence_number = r.u64()?;
    let etag_len = r.u16()? as usize;
    if etag_len > MAX_ETAG {
        return None;
    }
    let etag = String::from_utf8(r.take(etag_len)?.to_vec()).ok()?;
    let count = r.u64()?;
    if count.checked_mul(ENTRY as u64)? != r.0.len() as u64 {
        return None;
    }
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let chunk = r.u64()?;
        let slot = r.u32()?;
        let valid = r.u16()?;
        let mut crc = [0u32; PIECES];
        for c in &mut crc {
            *c = r.u32()?;
        }
        entries.push((chunk, Chunk { slot, valid, crc }));
    }
    Some((
        BlobState {
            etag,
            content_length,
            sequence_number,
        },
        entries,
    ))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests;
