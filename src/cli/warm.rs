//! `blobdrive warm`: fill a mounted drive's disk cache with its data, through the
//! mount's daemon (which does the fetching, behind the applications' reads).
//!
//! The daemon's words are hostile here as everywhere: its progress and its
//! answer are read as JSON into numbers, and any text it sends (a reason) is
//! printed with its control characters escaped.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{bail, Result};
use blobdrive::azure::text::escape_controls;
use blobdrive::mount::daemon;
use blobdrive::mount::warmup::WarmStatus;
use blobdrive::size::parse_size;
use blobdrive::transfer::progress::Progress;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Fetches every allocated page of the drive (as Get Page Ranges lists them; holes are
never fetched) that the disk cache does not hold yet, in offset order, until the
cache is full. The mount's own fetch workers do it, at most 4 ranged reads at a
time and only while no application read waits for them. A bar shows the bytes of
allocated pages gone through on a terminal; plain lines otherwise.

Ctrl-C stops it after the reads in flight (exit status 1); run it again and it
fetches only what is still missing. `blobdrive stats` and the metrics show a
warm-up while it runs. `blobdrive mount --warm` (fstab `warm`) starts one as the
mount becomes ready. See docs/disk-cache.md for what a warm-up can and cannot
keep current.

Example:
  sudo blobdrive warm /data --max-rate 100MiB")]
pub struct Args {
    /// Where the drive is mounted (with --disk-cache).
    pub mountpoint: PathBuf,
    /// Fetch at most SIZE a second (e.g. 100MiB) [default: no limit].
    #[arg(long, value_name = "SIZE")]
    pub max_rate: Option<String>,
    /// Print a JSON summary (mountpoint, fetched, already_cached, skipped,
    /// seconds, allocated, stopped) instead of progress and a line.
    #[arg(long)]
    pub json: bool,
}

/// The connection's descriptor, for the Ctrl-C handler (-1: none).
static SOCKET: AtomicI32 = AtomicI32::new(-1);

/// Ctrl-C: closes this side of the connection, which the daemon takes as "stop"
/// (it answers once the reads in flight end). A second Ctrl-C is the default
/// one (`SA_RESETHAND`).
extern "C" fn on_interrupt(_: libc::c_int) {
    let fd = SOCKET.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: shutdown(2) is async-signal-safe; a closed descriptor only
        // makes it fail.
        unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    }
}

fn catch_interrupt() {
    // SAFETY: a zeroed sigaction with a plain handler is a valid argument.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

pub fn run(args: Args) -> Result<()> {
    let max_rate = match &args.max_rate {
        Some(s) => match parse_size(s)? {
            0 => bail!("--max-rate must be more than 0"),
            n => Some(n),
        },
        None => None,
    };
    let (mp, rec) = super::stats::live_mount(&args.mountpoint)?;
    let conn = std::os::unix::net::UnixStream::connect(&rec.socket)?;
    SOCKET.store(conn.as_raw_fd(), Ordering::SeqCst);
    catch_interrupt();
    let cmd = match max_rate {
        Some(r) => format!("{} max-rate={r}", daemon::WARM_CMD),
        None => daemon::WARM_CMD.to_string(),
    };
    let mut shown = Shown::new(args.json);
    // Progress comes every second; a minute without a line is a daemon gone
    // silent.
    let answer = daemon::control_on(conn, &cmd, Some(Duration::from_secs(60)), &mut |line| {
        if let Ok(s) = serde_json::from_str::<WarmStatus>(line) {
            shown.update(&s);
        }
    });
    SOCKET.store(-1, Ordering::SeqCst);
    shown.finish();
    let answer = answer?;
    let end = match answer.split_once(' ') {
        Some(("ok", json)) => serde_json::from_str::<WarmStatus>(json).ok(),
        Some(("error", why)) => bail!("{}", escape_controls(why)),
        _ => None,
    };
    let Some(end) = end else {
        bail!(
            "unexpected answer from the daemon: {}",
            escape_controls(&answer.chars().take(200).collect::<String>())
        );
    };
    if args.json {
        let mut v = summary(&end);
        v["mountpoint"] = mp.display().to_string().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("warm-up of {}: {}", mp.display(), end.summary());
    }
    // (A Ctrl-C that came as the last reads ended stopped nothing.)
    if end.stopped {
        bail!(
            "stopped before the end; run `blobdrive warm {}` again to fetch the rest",
            mp.display()
        );
    }
    Ok(())
}

/// The `--json` summary: the figures a script that runs `warm --json` reads.
fn summary(s: &WarmStatus) -> serde_json::Value {
    serde_json::json!({
        "fetched": s.fetched,
        "already_cached": s.already_cached,
        "skipped": s.skipped,
        "seconds": s.seconds,
        "allocated": s.allocated,
        "stopped": s.stopped,
    })
}

/// The progress shown: a bar on a terminal, plain lines otherwise, nothing
/// with `--json`. Made once the daemon says how much is allocated.
struct Shown {
    quiet: bool,
    progress: Option<Progress>,
    done: u64,
}

impl Shown {
    fn new(quiet: bool) -> Shown {
        Shown {
            quiet,
            progress: None,
            done: 0,
        }
    }

    fn update(&mut self, s: &WarmStatus) {
        if s.allocated == 0 {
            return;
        }
        let quiet = self.quiet;
        let p = self
            .progress
            .get_or_insert_with(|| Progress::new("warming", s.allocated, quiet));
        let done = s.done.min(s.allocated);
        if done > self.done {
            p.add(done - self.done);
            self.done = done;
        }
    }

    fn finish(&self) {
        if let Some(p) = &self.progress {
            p.finish();
        }
    }
}
