//! `umount.blobdrive`: the same binary called by that name (a symlink in /sbin) is
//! the helper util-linux's `umount` runs for a drive's mount, because the daemon
//! names it in libmount's table (see `blobdrive::mount::utab`). `umount DIR`, and
//! systemd's unmount at shutdown, then behave as `blobdrive unmount DIR`: they
//! return once every cached byte is on the blob, the lease is released and the
//! daemon is gone, so the network can go down after it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use blobdrive::mount::{record, system, utab};

use super::unmount;

/// The name umount(8) runs the helper by.
pub const UMOUNT_HELPER_NAME: &str = "umount.blobdrive";

/// umount(8)'s exit statuses: a bad command line, and an unmount that failed.
const EXIT_USAGE: u8 = 1;
const EXIT_FAILED: u8 = 32;

const USAGE: &str = "\
usage: umount.blobdrive DIR [-flnrv] [-t TYPE]

The umount(8) helper for drives mounted by blobdrive: `umount DIR` runs it (the
daemon names it in /run/mount/utab), and it does what `blobdrive unmount DIR` does:
writes every cached byte to the blob (waiting out an outage, saying what it waits
for), releases the lease and stops the daemon, and only then returns. A busy
filesystem stays mounted (exit 32), naming the processes that use it. Anything that
is not a drive blobdrive mounted (an empty directory, /proc) is refused (exit 32),
and nothing is done.
  -l  detach now (lazy); the daemon writes back and stops once the last user lets go
  -v  say what was unmounted
  -f, -n, -r, -t TYPE  accepted and ignored (to drop data that cannot be written,
      use `blobdrive unmount --discard-dirty --yes DIR`)";

/// The helper's command line.
#[derive(Debug, Default, PartialEq)]
struct Invocation {
    target: PathBuf,
    lazy: bool,
    verbose: bool,
}

fn parse(args: Vec<OsString>) -> Result<Invocation, String> {
    let mut inv = Invocation::default();
    let mut target = None;
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let text = a.to_str().unwrap_or("");
        match text {
            "-t" => {
                args.next().ok_or("-t needs a type")?;
            }
            "-N" => return Err("-N (another mount namespace) is not supported".into()),
            flags if flags.starts_with('-') && flags.len() > 1 => {
                for c in flags[1..].chars() {
                    match c {
                        'l' => inv.lazy = true,
                        'v' => inv.verbose = true,
                        'f' | 'n' | 'r' => {}
                        other => return Err(format!("unknown flag -{other}")),
                    }
                }
            }
            _ if target.is_none() => target = Some(PathBuf::from(a)),
            _ => return Err("more than one DIR".into()),
        }
    }
    inv.target = target.ok_or("no DIR given")?;
    Ok(inv)
}

/// Runs the helper with its arguments (argv[0] left out).
pub fn run(args: Vec<OsString>) -> ExitCode {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "-V" || a == "--version") {
        println!(
            "{UMOUNT_HELPER_NAME} (blobdrive {})",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    let inv = match parse(args) {
        Ok(i) => i,
        Err(e) => {
            eprintln!(
                "{UMOUNT_HELPER_NAME}: {e} ({})",
                USAGE.lines().next().unwrap_or("")
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match unmount_dir(&inv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{UMOUNT_HELPER_NAME}: {}", super::error_text(&e));
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn unmount_dir(inv: &Invocation) -> anyhow::Result<()> {
    record::check_readable().map_err(anyhow::Error::msg)?;
    let dir = &inv.target;
    if inv.lazy {
        // Named without a look at the mount itself (a lazy unmount is for one
        // that may not answer): its parent resolved, its own name kept.
        let whole = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        let named = match (whole.parent(), whole.file_name()) {
            (Some(p), Some(name)) => p.canonicalize().map(|p| p.join(name)).ok(),
            _ => None,
        };
        let mp = named.unwrap_or(whole);
        if record::load(&record::id_for(&mp)).is_none() {
            return Err(not_ours(dir));
        }
        // The daemon sees the filesystem go and stops by itself once its last
        // user lets go, writing everything back first.
        system::umount(dir, true)?;
        forget(dir);
        return Ok(());
    }
    let mp = dir.canonicalize().unwrap_or_else(|_| dir.clone());
    let verbose = inv.verbose;
    let found = unmount::take_down(
        &mp,
        false,
        &mut |p| eprintln!("{UMOUNT_HELPER_NAME}: {p}"),
        &mut |done| {
            if verbose {
                println!("{done}")
            }
        },
    )?;
    if !found {
        return Err(not_ours(dir));
    }
    Ok(())
}

/// The refusal of `dir`, which blobdrive has nothing mounted at (an empty
/// directory, `/proc`): nothing is unmounted. An entry of this program's left
/// for it in libmount's table (for a mount ID the kernel has since given to
/// another mount), which is what made umount(8) run this helper, is taken out,
/// so that the next `umount` unmounts what is there as it would any mount.
fn not_ours(dir: &Path) -> anyhow::Error {
    let d = dir.display();
    if utab::has_entry(dir) {
        forget(dir);
        return anyhow::anyhow!(
            "{d} is not a drive mounted by blobdrive any more: nothing was unmounted, and the stale entry in /run/mount/utab that sent umount here was removed; run umount again to unmount what is there"
        );
    }
    anyhow::anyhow!(
        "{d} is not a drive mounted by blobdrive (`blobdrive list` shows those): nothing was done"
    )
}

/// Takes the helper's entry for `dir` out of libmount's table.
fn forget(dir: &Path) {
    if let Err(e) = utab::remove(dir) {
        tracing::warn!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn takes_what_libmount_passes() {
        assert_eq!(
            parse(args(&[
                "/data",
                "-n",
                "-l",
                "-f",
                "-v",
                "-r",
                "-t",
                "fuse.blobdrive"
            ]))
            .unwrap(),
            Invocation {
                target: "/data".into(),
                lazy: true,
                verbose: true
            }
        );
        assert_eq!(
            parse(args(&["/data"])).unwrap().target,
            PathBuf::from("/data")
        );
        assert!(parse(args(&["-lv", "/d"])).unwrap().lazy);
        for bad in [
            &["/a", "/b"][..],
            &[],
            &["/a", "-x"],
            &["/a", "-t"],
            &["/a", "-N", "1"],
        ] {
            assert!(parse(args(bad)).is_err(), "{bad:?}");
        }
    }
}
