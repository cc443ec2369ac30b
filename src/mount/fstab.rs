//! The fstab line a mount(8) helper runs for, as its administrator wrote it.
//!
//! mount(8) hands a helper the options it made of the line, not the line: of
//! `rw,...,ro` it passes `ro` alone (the last wins), and `suid`, `dev` and
//! `exec`, its defaults, not at all (util-linux 2.38, seen by running it). A
//! contradiction in the line never reaches the helper's command line, so the
//! helper reads the line itself, found by its SPEC and DIR, to refuse it as the
//! manual says. Only reading: nothing here is trusted beyond naming options.

use std::io::Read;
use std::path::{Path, PathBuf};

/// What libmount reads instead of /etc/fstab when set (`mount -T` is not seen
/// by a helper; this is).
const FSTAB_ENV: &str = "LIBMOUNT_FSTAB";

/// More than any fstab holds; the rest is not read.
const MAX_BYTES: u64 = 1 << 20;

/// One line of type blobdrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The file and the line's number in it, for messages.
    pub place: String,
    /// The options field as written.
    pub options: String,
}

/// The fstab mount(8) reads: `$LIBMOUNT_FSTAB` when the real user is root (as
/// libmount honours it only then), else /etc/fstab.
pub fn path() -> PathBuf {
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    match std::env::var_os(FSTAB_ENV) {
        Some(p) if root && !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("/etc/fstab"),
    }
}

/// The lines of type `blobdrive` (or `blobdrive.*`) in the fstab that mount
/// `spec` at `dir`; none when there is no fstab or it cannot be read.
pub fn lines_for(spec: &str, dir: &Path) -> Vec<Line> {
    let path = path();
    let mut text = String::new();
    let read = std::fs::File::open(&path).and_then(|f| f.take(MAX_BYTES).read_to_string(&mut text));
    if read.is_err() {
        return Vec::new();
    }
    matching(&text, spec, dir)
        .into_iter()
        .map(|(n, options)| Line {
            place: format!("{} line {n}", path.display()),
            options,
        })
        .collect()
}

/// (line number, options) of each line of `text` that mounts `spec` at `dir`
/// with type blobdrive.
fn matching(text: &str, spec: &str, dir: &Path) -> Vec<(usize, String)> {
    let want_dir = canonical(dir);
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let (s, d, t) = (f.first()?, f.get(1)?, f.get(2)?);
            let ours = *t == "blobdrive" || t.starts_with("blobdrive.");
            (ours && unescape(s) == spec && canonical(Path::new(&unescape(d))) == want_dir)
                .then(|| (i + 1, f.get(3).map_or_else(String::new, |o| unescape(o))))
        })
        .collect()
}

/// The path with symbolic links resolved, when it exists (mount(8) hands the
/// helper a canonical DIR; the line may name it otherwise).
fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// An fstab field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_line_of_a_spec_and_dir() {
        let text = "\
# a comment
/dev/sda1  /  ext4  defaults  0 1
disks/data.vhd  /data  blobdrive  _netdev,rw,ro  0 0
disks/data.vhd  /other  blobdrive  rw  0 0
disks/logs.vhd  /data  blobdrive  rw  0 0
disks/data.vhd  /data  ext4  rw  0 0
disks/x\\040y.vhd  /mnt/a\\040b  blobdrive.sub  mode=raw
   disks/data.vhd   /data/   blobdrive   metrics=1:2
";
        assert_eq!(
            matching(text, "disks/data.vhd", Path::new("/data")),
            vec![
                (3, "_netdev,rw,ro".to_string()),
                (8, "metrics=1:2".to_string())
            ]
        );
        assert_eq!(
            matching(text, "disks/x y.vhd", Path::new("/mnt/a b")),
            vec![(7, "mode=raw".to_string())]
        );
        assert!(matching(text, "disks/none.vhd", Path::new("/data")).is_empty());
        assert!(matching("short line\n\\", "short", Path::new("line")).is_empty());
    }

    #[test]
    fn escapes_are_undone_and_anything_else_kept() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("a\\b\\0"), "a\\b\\0");
        assert_eq!(unescape("\\777"), "?");
        assert_eq!(unescape("x\\"), "x\\");
    }
}
