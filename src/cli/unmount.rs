//! `blobdrive unmount`: ask the daemon to take the drive down, or clean up after a
//! daemon that died.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use blobdrive::mount::system::{Binding, LoopDevice};
use blobdrive::mount::{daemon, record, system, utab, Mode};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Unmounting writes every cached byte to the blob first, waiting out an outage of the
storage service (it says every few seconds what it waits for), then releases the
lease. It is refused, leaving everything mounted, while the filesystem is busy or a
process holds the raw disk file open. A lease lost while mounted is told: when, and
how many writes failed while mounted. It exits non-zero, naming what happened, if the
lease was lost with data not yet written or after writes failed, or could not be
released, and after cleaning up behind a daemon that died while holding the lease. A
part of the daemon stopped (SIGSTOP, a debugger) for 15 s ends the wait, naming the
process and what to do. A plain `umount DIR` does the same through
umount.blobdrive (installed by the package, or by scripts/install.sh).")]
pub struct Args {
    /// Where the drive is mounted (as given to `blobdrive mount`).
    pub mountpoint: PathBuf,
    /// The way out when the storage service refuses writes for good (e.g. full):
    /// take the drive down and drop the cached data that cannot be written,
    /// saying how much. Data is lost, so it exits non-zero and needs --yes. Also
    /// stops an unmount that is already waiting.
    #[arg(long)]
    pub discard_dirty: bool,
    /// Confirms --discard-dirty.
    #[arg(long)]
    pub yes: bool,
    /// Print one JSON object instead of text: mountpoint, blob, done
    /// ("unmounted", or "cleaned_up" after a daemon that died) and note (what
    /// the daemon had to say besides, such as a lease lost while mounted).
    #[arg(long)]
    pub json: bool,
}

/// What an unmount did, as its text and its JSON say it.
#[derive(Debug, serde::Serialize)]
pub struct TakenDown {
    pub mountpoint: PathBuf,
    pub blob: String,
    /// `unmounted` by the daemon, or `cleaned_up` after one that died.
    pub done: &'static str,
    pub note: Option<String>,
}

impl std::fmt::Display for TakenDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mp, blob) = (self.mountpoint.display(), &self.blob);
        match self.done {
            "cleaned_up" => write!(f, "cleaned up after the dead daemon of {mp} ({blob})")?,
            _ => write!(f, "unmounted {mp} ({blob})")?,
        }
        if let Some(note) = &self.note {
            write!(f, "\n{note}")?;
        }
        Ok(())
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.discard_dirty && !args.yes {
        bail!("--discard-dirty drops the data written to the drive but not yet on the blob; add --yes to confirm");
    }
    let mp = args
        .mountpoint
        .canonicalize()
        .unwrap_or_else(|_| args.mountpoint.clone());
    record::check_readable().map_err(anyhow::Error::msg)?;
    let json = args.json;
    let found = take_down(
        &mp,
        args.discard_dirty,
        &mut |p| eprintln!("blobdrive: {p}"),
        &mut |done| {
            if json {
                println!("{}", serde_json::to_string_pretty(done).unwrap_or_default());
            } else {
                println!("{done}");
            }
        },
    )?;
    if !found {
        bail!(
            "nothing is mounted by blobdrive at {} (see `blobdrive list`)",
            mp.display()
        );
    }
    Ok(())
}

/// Takes down the drive mounted at `mp` (canonical): asks its daemon to unmount
/// (or to drop what cannot be written, with `discard`), or cleans up behind a
/// daemon that died. `progress` gets what an unmount waits for, every few
/// seconds; `say` what was done. Returns false, having done nothing, when
/// blobdrive has nothing mounted there; an error when something was lost or
/// could not be done.
pub fn take_down(
    mp: &Path,
    discard: bool,
    progress: &mut dyn FnMut(&str),
    say: &mut dyn FnMut(&TakenDown),
) -> Result<bool> {
    let said = |rec: &record::MountRecord, done, note: Option<&str>| TakenDown {
        mountpoint: mp.to_path_buf(),
        blob: rec.blob.clone(),
        done,
        note: note.map(blobdrive::azure::text::escape_controls),
    };
    let id = record::id_for(mp);
    let Some(rec) = record::load(&id) else {
        if let Some(lost) = record::take_outcome(&id) {
            return Err(lost_by_itself(mp, &lost));
        }
        return Ok(false);
    };
    if record::alive(&rec) {
        // No timeout: the daemon answers once everything is written, however long
        // that takes (saying every few seconds what it waits for); it answers at
        // once if the filesystem or the disk file is busy.
        let cmd = if discard {
            daemon::DISCARD_CMD
        } else {
            "unmount"
        };
        let mut stalled = Stalled::new(rec.pid, mp);
        let answer = daemon::control_watching(&rec.socket, cmd, progress, &mut || stalled.check());
        match answer {
            Ok(a) if a == "ok" || a.starts_with("ok ") => {
                wait_gone(rec.pid);
                record::take_outcome(&rec.id);
                // Kept everything, with something to say all the same (a lease
                // lost while mounted, no write failed).
                say(&said(&rec, "unmounted", a.strip_prefix("ok ")));
                return Ok(true);
            }
            Ok(a) if a.starts_with("failed ") => {
                // The daemon stopped, but not everything was kept.
                wait_gone(rec.pid);
                record::take_outcome(&rec.id);
                bail!("{}", &a["failed ".len()..]);
            }
            Ok(a) => bail!("{}", a.strip_prefix("error ").unwrap_or(&a)),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => bail!("{e}"),
            Err(e) if record::alive(&rec) => {
                bail!(
                    "cannot reach the daemon (pid {}) of {}: {e}",
                    rec.pid,
                    mp.display()
                )
            }
            Err(_) if record::load(&rec.id).is_none() => {
                // It finished by itself just now (a plain umount of the
                // filesystem, or SIGTERM), removing its record (a daemon that died
                // leaves it), and a note first if it could not keep everything.
                if let Some(lost) = record::take_outcome(&rec.id) {
                    return Err(lost_by_itself(mp, &lost));
                }
                say(&said(&rec, "unmounted", None));
                return Ok(true);
            }
            Err(_) => {} // it died just now: clean up below
        }
    }
    clean_dead(
        &rec.mountpoint,
        rec.mode,
        rec.device.as_deref().map(|d| (d, rec.device_seq)),
        &rec.fuse_dir,
    )?;
    record::remove(&rec.id);
    say(&said(&rec, "cleaned_up", None));
    if !rec.read_only && rec.snapshot.is_none() {
        // Non-zero, so scripts notice: the drive cannot be mounted again until the
        // lease is broken, and unflushed writes are gone.
        bail!(
            "the lease on {} is still held by the dead mount; writes it had not flushed are lost. Once no other host uses the drive, run `blobdrive lease break {} --yes`",
            rec.blob,
            rec.blob
        );
    }
    Ok(true)
}

/// How long a part of the daemon may stay stopped while `unmount` waits on it.
const STOPPED_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(15);

/// Watches a mount's daemon while `unmount` waits for its answer: the wait has
/// no time limit (an outage is waited out), but a daemon whose root part or
/// worker is stopped (SIGSTOP, a debugger) cannot answer until someone lets it
/// go on, so after [`STOPPED_GIVE_UP`] of that the wait ends, saying which
/// process and what to do.
struct Stalled<'a> {
    root: u32,
    mp: &'a Path,
    since: Option<std::time::Instant>,
}

impl<'a> Stalled<'a> {
    fn new(root: u32, mp: &'a Path) -> Stalled<'a> {
        Stalled {
            root,
            mp,
            since: None,
        }
    }

    /// `Err` with what to say once a part of the daemon was stopped for long.
    fn check(&mut self) -> Result<(), String> {
        let stopped = |pid: u32| matches!(system::state(pid), Some('T' | 't'));
        let which = if stopped(self.root) {
            Some(("its root part", self.root))
        } else {
            system::children(self.root)
                .into_iter()
                .find(|&w| stopped(w))
                .map(|w| ("its network-facing part", w))
        };
        let Some((part, pid)) = which else {
            self.since = None;
            return Ok(());
        };
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() < STOPPED_GIVE_UP {
            return Ok(());
        }
        let mp = self.mp.display();
        Err(format!(
            "the daemon of {mp} does not answer: {part} (pid {pid}) has been stopped for {} s (kill -STOP, or a debugger), and the unmount waits on it. Nothing more is done until it runs again: `kill -CONT {pid}` lets it go on, and the unmount then finishes by itself (`blobdrive list` shows when it is gone); or `kill -KILL {}` ends the mount at once, dropping what it had not written, after which `blobdrive unmount {mp}` cleans up",
            STOPPED_GIVE_UP.as_secs(),
            self.root
        ))
    }
}

/// Removes what a dead daemon left: its filesystem mount, loop device (named
/// by the record with the disk sequence number it had when attached) and FUSE
/// mount (whose connection is dead, so nothing can hang on it).
fn clean_dead(
    mountpoint: &Path,
    mode: Mode,
    device: Option<(&str, Option<u64>)>,
    fuse_dir: &Path,
) -> Result<()> {
    if mode == Mode::Fs && system::is_mountpoint(mountpoint) {
        if let Err(e) = system::umount(mountpoint, false) {
            match e {
                blobdrive::mount::MountError::Busy(_) => return Err(e.into()),
                _ => system::umount(mountpoint, true)?,
            }
        }
    }
    // Only while it still serves this drive's file: a device that detached itself
    // (autoclear) may already have been given to another drive.
    match device {
        Some((dev, Some(seq))) => LoopDevice::at(dev).detach(&Binding::recorded(seq))?,
        Some((dev, None)) => tracing::warn!(
            "the record does not say which attachment of {dev} was the drive's (an older blobdrive wrote it, or the kernel has no disk sequence numbers): it is left as it is; `losetup -d {dev}` detaches it once you know it is the drive's"
        ),
        None => {}
    }
    if system::is_mountpoint(fuse_dir) {
        system::umount(fuse_dir, true)?;
    }
    if mode == Mode::Fs {
        let _ = std::fs::remove_dir(fuse_dir);
    }
    if let Err(e) = utab::remove(mountpoint) {
        tracing::warn!("{e}");
    }
    Ok(())
}

/// The error of an `unmount` that comes after its daemon stopped by itself and
/// left a note of what it could not keep.
fn lost_by_itself(mp: &Path, lost: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "the daemon of {} stopped by itself and could not keep everything: {lost}",
        mp.display()
    )
}

/// Waits (at most 10 s) until no thread of the daemon runs: then its sockets are
/// closed too (a `--metrics` port can be bound again by the next mount).
fn wait_gone(pid: u32) {
    for _ in 0..200 {
        if !system::pid_alive(pid) && !system::threads_running(pid) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
