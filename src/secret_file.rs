//! Files that hold secrets (credentials files, key files), opened as such a
//! file must be: without following a symlink and without blocking (a FIFO
//! would otherwise hang a boot or a mount), then checked on the opened file, so
//! that the file read is the file checked: a regular file, no permission for
//! group or others, owned by whom the caller requires, no larger than the
//! caller reads. Each caller says what went wrong in its own words.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a file of secrets was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("it is a symbolic link")]
    Symlink,
    #[error("it is not a regular file")]
    NotAFile,
    #[error("it belongs to uid {0}")]
    Owner(u32),
    /// Its permission bits, which give group or others some access.
    #[error("it is readable or writable by group or others (mode {0:04o})")]
    TooOpen(u32),
    #[error("it is larger than allowed")]
    TooLarge,
}

/// Opens the file of secrets at `path`, checked as the module says: owned by
/// `owner` when one is given, at most `max` bytes long (a reader still bounds
/// what it reads: a file may grow after the check).
pub fn open(path: &Path, owner: Option<u32>, max: u64) -> Result<File, SecretFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => SecretFileError::Symlink,
            _ => SecretFileError::Read(e),
        })?;
    let meta = file.metadata().map_err(SecretFileError::Read)?;
    if !meta.is_file() {
        return Err(SecretFileError::NotAFile);
    }
    if owner.is_some_and(|uid| uid != meta.uid()) {
        return Err(SecretFileError::Owner(meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(SecretFileError::TooOpen(meta.mode() & 0o7777));
    }
    if meta.len() > max {
        return Err(SecretFileError::TooLarge);
    }
    Ok(file)
}
