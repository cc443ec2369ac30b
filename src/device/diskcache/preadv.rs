//! Vectored reads that fill every buffer: the one read both the data file's
//! buffered handle ([`super::files`]) and its direct one ([`super::direct`]) make.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Fills `bufs` in turn from `file` at `offset` with `preadv`, until every byte
/// is read: a short read goes on where it stopped, the end of the file is an
/// error (`UnexpectedEof`), never a buffer left partly unread.
pub fn read_vectored_exact_at(
    file: &File,
    bufs: &mut [&mut [u8]],
    mut offset: u64,
) -> std::io::Result<()> {
    let (mut i, mut skip) = (0, 0);
    while i < bufs.len() {
        let iov: Vec<libc::iovec> = bufs[i..]
            .iter_mut()
            .take(libc::UIO_MAXIOV as usize)
            .enumerate()
            .map(|(k, b)| {
                let b = if k == 0 { &mut b[skip..] } else { &mut b[..] };
                libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                }
            })
            .collect();
        // SAFETY: each iovec points into a live, exclusively borrowed buffer of
        // at least iov_len bytes.
        let n = unsafe {
            libc::preadv(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        offset += n as u64;
        let mut n = n as usize;
        while n > 0 {
            let left = bufs[i].len() - skip;
            if n >= left {
                n -= left;
                i += 1;
                skip = 0;
            } else {
                skip += n;
                n = 0;
            }
        }
        while i < bufs.len() && bufs[i].len() == skip {
            i += 1;
            skip = 0;
        }
    }
    Ok(())
}
