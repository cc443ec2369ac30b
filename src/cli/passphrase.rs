//! Where an encrypted drive's passphrase comes from, never the command line:
//! a key file (`--key-file FILE`, `-` for standard input: every byte of it,
//! as cryptsetup reads a key file, trailing newline included), an environment
//! variable, a systemd credential named `key` (`LoadCredential=key:...`), or
//! a prompt on the terminal (a line, without its newline, not echoed).
//!
//! A key file is opened without following a symlink and without blocking,
//! must be a regular file of at most 64 KiB, and readable by its owner alone:
//! it holds a secret, as a credentials file does.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use blobdrive::blobref::BlobRef;
use blobdrive::luks::secret::{Secret, MAX_SECRET};

use super::Context;

/// The variable a passphrase is read from when no key file is named.
pub const PASSPHRASE_ENV: &str = "BLOBDRIVE_PASSPHRASE";
/// The variable a new passphrase (`key add`, `key change`) is read from.
pub const NEW_PASSPHRASE_ENV: &str = "BLOBDRIVE_NEW_PASSPHRASE";
/// The systemd credential a unit hands the passphrase over as.
pub const CREDENTIAL: &str = "key";

/// Where to look for one passphrase, and what to ask a terminal.
pub struct Source<'a> {
    pub key_file: Option<&'a Path>,
    pub env: &'static str,
    /// Look for the systemd credential too (only for the drive's own
    /// passphrase at mount, not for a new one).
    pub credential: bool,
    pub prompt: &'a str,
    /// Ask twice on a terminal (a new passphrase).
    pub confirm: bool,
    /// Whether a terminal may be asked at all.
    pub ask: bool,
}

impl Source<'_> {
    /// The passphrase, or `None` when nothing gives one (no file, variable,
    /// credential, and no terminal to ask).
    pub fn read(&self) -> Result<Option<Secret>> {
        let got = if let Some(path) = self.key_file {
            Some(if path == Path::new("-") {
                read_all(std::io::stdin().lock(), "standard input")?
            } else {
                read_key_file(path)?
            })
        } else if let Some(v) = std::env::var_os(self.env) {
            use std::os::unix::ffi::OsStrExt;
            Some(Secret::from_slice(v.as_bytes()))
        } else if let Some(c) = self.credential.then(credential).flatten() {
            Some(read_key_file(&c)?)
        } else if self.ask && is_terminal() {
            Some(self.ask()?)
        } else {
            None
        };
        match got {
            Some(s) if s.is_empty() => bail!("the passphrase is empty"),
            other => Ok(other),
        }
    }

    /// [`Self::read`], failing with `missing` when nothing gives one.
    pub fn required(&self, missing: &str) -> Result<Secret> {
        self.read()?.ok_or_else(|| anyhow::anyhow!("{missing}"))
    }

    /// Asks the terminal.
    pub fn ask(&self) -> Result<Secret> {
        let first = prompt(self.prompt)?;
        if self.confirm {
            let again = prompt("Again: ")?;
            if first.as_bytes() != again.as_bytes() {
                bail!("the two passphrases differ");
            }
        }
        Ok(first)
    }
}

/// An encrypted drive's passphrase, from wherever it is given (see
/// `passphrase`); asked on a terminal only when the drive's disk starts with a
/// LUKS header. `None`: none given (the daemon refuses an encrypted drive
/// then, saying how to give one).
pub fn for_mount(ctx: &Context, r: &BlobRef, key_file: Option<&Path>) -> Result<Option<Secret>> {
    let source = Source {
        key_file,
        env: PASSPHRASE_ENV,
        credential: true,
        prompt: &format!("Passphrase for {r}: "),
        confirm: false,
        ask: false,
    };
    if let Some(p) = source.read()? {
        return Ok(Some(p));
    }
    if !is_terminal() {
        return Ok(None);
    }
    let (_, blob) = ctx.blob(&r.to_string())?;
    let luks = ctx.block_on(async {
        let blob_bytes = blob.properties().await?.content_length;
        let disk = blob_bytes.saturating_sub(blobdrive::vhd::FOOTER_SIZE);
        blobdrive::encrypted::is_luks(&blob, disk).await
    })?;
    if luks.unwrap_or(false) {
        return Ok(Some(source.ask()?));
    }
    Ok(None)
}

/// Writes the passphrase on the mount daemon's standard input (a pipe, whose
/// buffer holds it; the daemon reads it whole before anything else).
pub fn hand_over(child: &mut std::process::Child, passphrase: Option<Secret>) -> Result<()> {
    if let (Some(p), Some(mut stdin)) = (passphrase, child.stdin.take()) {
        std::io::Write::write_all(&mut stdin, p.as_bytes())
            .context("cannot hand the passphrase to the mount daemon")?;
    }
    Ok(())
}

/// In the mount daemon: the passphrase `blobdrive mount` wrote on standard
/// input, when it said one `follows`.
pub fn handed_over(follows: bool) -> Result<Option<Secret>> {
    follows
        .then(|| read_all(std::io::stdin().lock(), "standard input"))
        .transpose()
}

/// `$CREDENTIALS_DIRECTORY/key`, when systemd handed one over (and it holds
/// anything: the unit template's empty default means none).
fn credential() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY")?;
    let path = Path::new(&dir).join(CREDENTIAL);
    let len = std::fs::metadata(&path).ok()?.len();
    (len > 0).then_some(path)
}

/// A key file's bytes, checked as the module's doc says (by
/// [`blobdrive::secret_file`], as a credentials file is checked, whoever owns
/// it).
pub fn read_key_file(path: &Path) -> Result<Secret> {
    use blobdrive::secret_file::SecretFileError as E;
    let shown = path.display();
    let what = format!("the key file {shown}");
    let file = blobdrive::secret_file::open(path, None, MAX_SECRET as u64).map_err(|e| match e {
        E::Read(e) => anyhow::anyhow!("cannot read {what}: {e}"),
        E::Symlink => anyhow::anyhow!("{what} is a symbolic link: name the file itself"),
        E::NotAFile => anyhow::anyhow!("{what} is not a regular file"),
        E::Owner(uid) => anyhow::anyhow!("{what} belongs to uid {uid}"),
        E::TooOpen(mode) => anyhow::anyhow!(
            "{what} is readable or writable by group or others (mode {mode:04o}): it holds a secret; make it its owner's alone (chmod 600 {shown})"
        ),
        E::TooLarge => too_large(&what),
    })?;
    read_all(file, &what)
}

/// A key too large to be one.
fn too_large(what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what} is larger than {MAX_SECRET} bytes: not a key file")
}

/// Every byte of `r`, at most [`MAX_SECRET`], into locked memory.
fn read_all(r: impl Read, what: &str) -> Result<Secret> {
    let mut s = Secret::zeroed(MAX_SECRET + 1);
    let mut n = 0;
    let mut r = r.take(MAX_SECRET as u64 + 1);
    loop {
        match r.read(&mut s.bytes_mut()[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => bail!("cannot read {what}: {e}"),
        }
    }
    if n > MAX_SECRET {
        return Err(too_large(what));
    }
    s.truncate(n);
    Ok(s)
}

pub fn is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stdin())
}

/// Reads a line from the terminal on standard input with echo off.
fn prompt(text: &str) -> Result<Secret> {
    eprint!("{text}");
    // SAFETY: termios is plain old data, filled in by tcgetattr.
    let mut old: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and pointer.
    let have = unsafe { libc::tcgetattr(0, &mut old) } == 0;
    if have {
        let mut quiet = old;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: as above.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &quiet) };
    }
    let line = read_line();
    if have {
        // SAFETY: puts back what was there.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &old) };
    }
    eprintln!();
    line
}

/// One line of standard input, without its newline, byte by byte (nothing of
/// it is left in a buffer of std's).
fn read_line() -> Result<Secret> {
    let mut s = Secret::zeroed(MAX_SECRET);
    let mut n = 0;
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: reads one byte into a valid buffer.
        let got = unsafe { libc::read(0, byte.as_mut_ptr() as *mut libc::c_void, 1) };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            bail!("cannot read the passphrase: {e}");
        }
        if got == 0 || byte[0] == b'\n' {
            break;
        }
        if n == MAX_SECRET {
            bail!("the passphrase is longer than {MAX_SECRET} bytes");
        }
        s.bytes_mut()[n] = byte[0];
        n += 1;
    }
    zeroize::Zeroize::zeroize(&mut byte);
    s.truncate(n);
    Ok(s)
}
