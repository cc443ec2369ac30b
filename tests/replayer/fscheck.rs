//! A filesystem state checked as the next mount would meet it: a copy of the
//! disk, mounted through a loop device as a detached mount that nothing else
//! reaches (`detached.rs`; the kernel replays the journal or log, as a mount
//! after a crash does), its files copied out, unmounted, then the filesystem's
//! own checker, which must find nothing to repair. A test that dies leaves no
//! mount behind, and the loop device (autoclear) goes with it.
//!
//! An encrypted drive's state is decrypted first, by cryptsetup and an AES-XTS
//! not blobdrive's (`sealed.rs`).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::detached::Detached;
use super::image::Pieces;
use super::sealed::Unsealer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fs {
    Ext4,
    Xfs,
}

impl Fs {
    pub fn name(self) -> &'static str {
        match self {
            Fs::Ext4 => "ext4",
            Fs::Xfs => "xfs",
        }
    }

    /// The mount's flags for the copy: the live drive's xfs is mounted on
    /// this machine with the same UUID.
    fn mount_flags(self) -> &'static [&'static str] {
        match self {
            Fs::Ext4 => &[],
            Fs::Xfs => &["nouuid"],
        }
    }

    /// The checker, which changes nothing (`-n`) and exits 0 only for a
    /// filesystem with nothing to repair.
    fn checker(self, image: &Path) -> Command {
        let mut c = match self {
            Fs::Ext4 => Command::new("e2fsck"),
            Fs::Xfs => Command::new("xfs_repair"),
        };
        match self {
            Fs::Ext4 => c.args(["-f", "-n"]),
            Fs::Xfs => c.args(["-n", "-f"]),
        };
        c.arg(image);
        c
    }
}

/// What is wrong with a filesystem state.
#[derive(Debug)]
pub enum Fault {
    /// The mount that replays the journal failed, or the files could not be
    /// read: nothing was copied.
    Recovery(String),
    /// The checker, run after the mount, found something to repair.
    Checker(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Recovery(e) | Fault::Checker(e) => f.write_str(e),
        }
    }
}

impl Fault {
    /// Whether it is xfs_repair finding the superblocks in conflict, and
    /// nothing before that: what a crash during XFS's own online grow leaves
    /// (it writes the secondary superblocks after the grow's commit).
    pub fn is_xfs_superblocks_of_a_grow(&self) -> bool {
        let Fault::Checker(e) = self else {
            return false;
        };
        let first = e.split_once("): ").map_or("", |(_, c)| c);
        e.starts_with("xfs ")
            && (first.starts_with("would write modified primary superblock")
                || first.starts_with("primary/secondary superblock"))
    }
}

/// Where a state's image and files go (on tmpfs: a state is written, mounted
/// and read once).
pub struct Scratch {
    dir: tempfile::TempDir,
    /// For an encrypted drive (its disk a LUKS2 volume), what decrypts it.
    unsealer: Option<Unsealer>,
}

impl Scratch {
    pub fn new(tag: &str, encrypted: bool) -> Scratch {
        let base = Path::new("/dev/shm");
        let dir = tempfile::Builder::new()
            .prefix(&format!("blobdrive-replay-{tag}."))
            .tempdir_in(if base.is_dir() {
                base
            } else {
                Path::new(env!("CARGO_TARGET_TMPDIR"))
            })
            .unwrap();
        Scratch {
            dir,
            unsealer: encrypted.then(Unsealer::default),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// For an encrypted drive, holds the decryption of `disk` to OpenSSL's
    /// (see [`Unsealer::assert_agrees_with_openssl`]).
    pub fn check_decryption(&self, disk: &Pieces) {
        if let Some(u) = &self.unsealer {
            u.assert_agrees_with_openssl(disk, self.dir.path());
        }
    }

    /// Where the last checked state's files were copied.
    pub fn files(&self) -> PathBuf {
        self.path("files")
    }

    /// The image of the filesystem on `disk`: the disk, or an encrypted
    /// drive's data segment decrypted. The error: what could not decrypt it.
    fn write_image(&self, disk: &Pieces) -> Result<PathBuf, String> {
        let image = self.path("disk.img");
        match &self.unsealer {
            None => write_sparse(disk, &image),
            Some(u) => u.write_plaintext(disk, &self.path("sealed.img"), &image)?,
        }
        Ok(image)
    }

    /// Checks the filesystem `fs` on `disk`: recovered by a mount, its files
    /// copied to [`Scratch::files`], then its checker. The error says what
    /// failed, with the tool's own words.
    pub fn check(&self, fs: Fs, disk: &Pieces) -> Result<(), Fault> {
        let recovery =
            |what: &str, e: String| Fault::Recovery(format!("{} state: {what}: {e}", fs.name()));
        let image = self
            .write_image(disk)
            .map_err(|e| recovery("it could not be decrypted", e))?;
        let files = self.files();
        let _ = std::fs::remove_dir_all(&files);
        std::fs::create_dir_all(&files).unwrap();
        let mounted = Detached::mount(&image, fs.name(), fs.mount_flags())
            .map_err(|e| recovery("the kernel could not mount it", e))?;
        let out = mounted
            .command("cp")
            .arg("-a")
            .arg(format!("{}/.", mounted.root()))
            .arg(&files)
            .output()
            .unwrap();
        mounted.unmount();
        if !out.status.success() {
            return Err(recovery(
                "its files could not be read after the mount",
                last_lines(&out.stderr, 6),
            ));
        }
        let checked = fs.checker(&image).output().unwrap();
        if !checked.status.success() {
            return Err(Fault::Checker(format!(
                "{} state, recovered by a mount: its checker exited {:?}: {}",
                fs.name(),
                checked.status.code(),
                complaints(&[checked.stdout, checked.stderr].concat())
            )));
        }
        Ok(())
    }
}

/// The last `n` lines of a tool's output, on one line.
fn last_lines(out: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(out);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Writes `disk` to `path` as a sparse file: only the pieces that are not zeros.
pub(super) fn write_sparse(disk: &Pieces, path: &Path) {
    let _ = std::fs::remove_file(path);
    let f = std::fs::File::create(path).unwrap();
    f.set_len(disk.len() as u64).unwrap();
    for (at, piece) in disk.written() {
        f.write_all_at(piece, at).unwrap();
    }
}

/// What a checker found, without its progress lines (xfs_repair's phases
/// and AG numbers, the lines every run prints).
fn complaints(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    let said: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("Phase ")
                && !l.starts_with("- ")
                && !l.contains("host filesystem geometry")
                && !l.contains("sector size mismatch")
                && !l.starts_with("the image and the host")
                && !l.starts_with("Pass ")
                && !l.starts_with("No modify flag set")
        })
        .collect();
    said[..said.len().min(12)].join(" | ")
}

/// Keeps a failing state's image for a look afterwards: its path.
pub fn keep(disk: &Pieces, tag: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("replay-{tag}.img"));
    write_sparse(disk, &path);
    path
}
