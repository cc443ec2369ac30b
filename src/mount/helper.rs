//! The mount(8) helper's command line: `mount.blobdrive SPEC DIR [-sfnv] [-N NS]
//! [-o OPTIONS] [-t TYPE]`, as mount(8) runs `/sbin/mount.TYPE` for an fstab line
//! or `mount -t blobdrive`. This module only parses and checks; the binary turns
//! the result into the same request `blobdrive mount` makes.
//!
//! What mount(8) hands over (util-linux 2.38, seen by running it): it keeps
//! `defaults`, `auto`, `noauto`, `comment=` and `x-*` to itself, always adds `rw`
//! or `ro`, expands `user` into `user,noexec,nosuid,nodev`, and passes `_netdev`,
//! `nofail` and every option it does not know as they are. The ones it keeps are
//! still accepted here, for a helper run by hand with an fstab line's options.

use std::path::PathBuf;

use thiserror::Error;

use super::Mode;
use crate::size::parse_size;

/// mount(8)'s exit status for "incorrect invocation or permissions".
pub const EXIT_USAGE: u8 = 1;
/// mount(8)'s exit status for "mount failure".
pub const EXIT_MOUNT_FAILED: u8 = 32;

/// Options that concern only mount(8) or systemd (ordering, `mount -a`, failure
/// handling), accepted and ignored.
const IGNORED: &[&str] = &["_netdev", "nofail", "auto", "noauto", "defaults"];

/// Options passed to the filesystem mount (mode fs) as they are: the usual
/// hardening and access-time choices for a disk from elsewhere. In modes block
/// and raw there is no filesystem mount, and the FUSE files are always
/// nosuid and nodev.
const FS_FLAGS: &[&str] = &[
    "nosuid",
    "nodev",
    "noexec",
    "suid",
    "dev",
    "exec",
    "noatime",
    "relatime",
    "strictatime",
    "nodiratime",
];

/// The options with a value (`NAME=VALUE`), the ones taken alone, and the ones
/// refused with a reason. With [`IGNORED`] and [`FS_FLAGS`] (and `x-*`) they are
/// every option the helper knows: [`parse_options`] refuses any other name before
/// it looks further, so this list is the whole of what it takes, and
/// mount.blobdrive(8) is checked against it.
const VALUED: &[&str] = &[
    "mode",
    "mkfs",
    "cache-size",
    "credentials",
    "disk-cache",
    "disk-cache-size",
    "metrics",
    "run-as",
    "key-file",
    "comment",
];
const ALONE: &[&str] = &["ro", "rw", "warm", "no-discard"];
const REFUSED: &[&str] = &["user", "users", "owner", "group"];

/// Flags of which a line may give at most one: each says the opposite of the
/// others, and which one mount(8) or the kernel would keep is not what the
/// reader of the line sees.
const EXCLUSIVE: &[&[&str]] = &[
    &["ro", "rw"],
    &["suid", "nosuid"],
    &["dev", "nodev"],
    &["exec", "noexec"],
    &["noatime", "relatime", "strictatime"],
];

/// Every option name the helper knows (besides the `x-*` family), valued or not,
/// refused with a reason or taken.
pub fn option_names() -> impl Iterator<Item = &'static str> {
    [VALUED, ALONE, REFUSED, IGNORED, FS_FLAGS]
        .into_iter()
        .flatten()
        .copied()
}

/// A bad helper command line: one line, naming what is wrong.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0}")]
pub struct UsageError(pub String);

/// What a helper invocation asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The drive: `container/name`, a URL, or `BLOB@SNAPSHOT`.
    pub spec: String,
    pub dir: PathBuf,
    pub options: Options,
    /// `-f`: check everything, mount nothing (mount(8)'s "fake").
    pub fake: bool,
    /// `-v`: say what was mounted.
    pub verbose: bool,
}

/// The `-o` options blobdrive understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub read_only: bool,
    pub mode: Mode,
    pub mkfs: Option<String>,
    /// As written (already checked to parse), for `--cache-size`.
    pub cache_size: Option<String>,
    pub credentials: Option<PathBuf>,
    /// Flags for the filesystem mount (see [`FS_FLAGS`]).
    pub fs_flags: Vec<String>,
    /// `metrics=HOST:PORT`, for `--metrics`.
    pub metrics: Option<String>,
    /// `disk-cache=DIR`, for `--disk-cache`.
    pub disk_cache: Option<PathBuf>,
    /// As written (already checked to parse), for `--disk-cache-size`.
    pub disk_cache_size: Option<String>,
    /// `run-as=USER` (a plain user name, checked), for `--run-as`: the user
    /// the daemon's network-facing part runs as ([`crate::privsep`]).
    pub run_as: Option<String>,
    /// `warm` or `warm=SIZE` (as written, checked to parse), for `--warm`:
    /// fill the disk cache once mounted (at most SIZE a second).
    pub warm: Option<String>,
    /// `key-file=PATH`, for `--key-file`: an encrypted drive's passphrase.
    pub key_file: Option<PathBuf>,
    /// `no-discard`, for `--no-discard`.
    pub no_discard: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            read_only: false,
            mode: Mode::Fs,
            mkfs: None,
            cache_size: None,
            credentials: None,
            fs_flags: Vec::new(),
            metrics: None,
            disk_cache: None,
            disk_cache_size: None,
            run_as: None,
            warm: None,
            key_file: None,
            no_discard: false,
        }
    }
}

/// Parses the helper's arguments (without argv[0]).
pub fn parse_args<I, S>(args: I) -> Result<Invocation, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut positional = Vec::new();
    let mut option_lists = Vec::new();
    let (mut fake, mut verbose, mut sloppy) = (false, false, false);
    let mut args = args.into_iter().map(Into::into);
    while let Some(a) = args.next() {
        if a == "--" {
            positional.extend(args.by_ref());
            break;
        }
        if let Some(rest) = a.strip_prefix("-o") {
            option_lists.push(value_of(rest, "-o", &mut args)?);
        } else if let Some(rest) = a.strip_prefix("-t") {
            let t = value_of(rest, "-t", &mut args)?;
            if t != "blobdrive" && !t.starts_with("blobdrive.") {
                return Err(UsageError(format!(
                    "filesystem type '{t}' is not blobdrive's (use type blobdrive)"
                )));
            }
        } else if let Some(rest) = a.strip_prefix("-N") {
            let ns = value_of(rest, "-N", &mut args)?;
            return Err(UsageError(format!(
                "-N {ns}: mounting into another mount namespace is not supported"
            )));
        } else if a.len() > 1 && a.starts_with('-') && !a.starts_with("--") {
            for c in a[1..].chars() {
                match c {
                    's' => sloppy = true,
                    'f' => fake = true,
                    'n' => {} // no mtab: libmount keeps none to update
                    'v' => verbose = true,
                    other => {
                        return Err(UsageError(format!(
                            "unknown flag -{other} (mount.blobdrive SPEC DIR [-sfnv] [-o OPTIONS])"
                        )))
                    }
                }
            }
        } else if a.starts_with("--") {
            return Err(UsageError(format!(
                "unknown argument {a} (mount.blobdrive SPEC DIR [-sfnv] [-o OPTIONS])"
            )));
        } else {
            positional.push(a);
        }
    }
    let [spec, dir]: [String; 2] = positional.try_into().map_err(|p: Vec<String>| {
        UsageError(format!(
            "expected SPEC and DIR, got {} argument(s) (mount.blobdrive SPEC DIR [-sfnv] [-o OPTIONS])",
            p.len()
        ))
    })?;
    let options = parse_options(&option_lists.join(","), sloppy)?;
    Ok(Invocation {
        spec,
        dir: PathBuf::from(dir),
        options,
        fake,
        verbose,
    })
}

fn unknown_option(opt: &str) -> UsageError {
    UsageError(format!(
        "unknown option '{opt}' (blobdrive takes ro, rw, mode=fs|block|raw, mkfs=ext4|xfs, cache-size=SIZE, disk-cache=DIR, disk-cache-size=SIZE, warm[=SIZE], credentials=FILE, key-file=PATH, no-discard, metrics=HOST:PORT, run-as=USER, suid and dev (off unless given: filesystems are nosuid,nodev by default), noexec, noatime, and ignores _netdev, nofail, auto, noauto, defaults, x-*)"
    ))
}

fn value_of(
    attached: &str,
    flag: &str,
    rest: &mut impl Iterator<Item = String>,
) -> Result<String, UsageError> {
    if !attached.is_empty() {
        return Ok(attached.to_string());
    }
    rest.next()
        .ok_or_else(|| UsageError(format!("{flag} needs a value")))
}

/// The options of a comma-separated list, blanks dropped.
fn options_of(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// Refuses an option given twice, with a value or not (`metrics=` twice:
/// which one counts?; `noatime,noatime`, `ro,ro`: a line that says a thing
/// twice was written in error, and the reader cannot tell which one a later
/// edit meant), and flags that contradict each other (`rw,ro`), naming them.
/// `comment=` and `x-*` are mount(8)'s and systemd's, which may repeat them
/// (`x-systemd.requires=` once per unit): they are not looked at.
pub fn check_repeats(list: &str) -> Result<(), UsageError> {
    let opts: Vec<&str> = options_of(list).collect();
    let name_of = |o: &str| o.split_once('=').map_or(o, |(n, _)| n).to_string();
    for (i, opt) in opts.iter().enumerate() {
        let name = name_of(opt);
        if name == "comment" || name.starts_with("x-") {
            continue;
        }
        if let Some(again) = opts[i + 1..].iter().find(|o| name_of(o) == name) {
            return Err(UsageError(format!(
                "option {name} is given twice ({opt} and {again}): give it once"
            )));
        }
    }
    for group in EXCLUSIVE {
        let mut given = opts.iter().filter(|o| group.contains(o));
        if let Some(first) = given.next() {
            if let Some(other) = given.find(|o| *o != first) {
                return Err(UsageError(format!(
                    "options {first} and {other} contradict each other: keep one"
                )));
            }
        }
    }
    Ok(())
}

/// Parses a comma-separated option list. With `sloppy` (mount's `-s`), options
/// blobdrive does not know are ignored instead of refused. An option given
/// twice, or flags that contradict each other, are refused either way
/// ([`check_repeats`]).
pub fn parse_options(list: &str, sloppy: bool) -> Result<Options, UsageError> {
    check_repeats(list)?;
    let mut o = Options::default();
    for opt in options_of(list) {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        let need = |what: &str| -> Result<&str, UsageError> {
            value
                .filter(|v| !v.is_empty())
                .ok_or_else(|| UsageError(format!("option {name} needs a value: {name}={what}")))
        };
        let known = name.starts_with("x-") || option_names().any(|n| n == name);
        match name {
            _ if !known && sloppy => {}
            _ if !known => return Err(unknown_option(opt)),
            "ro" if value.is_none() => o.read_only = true,
            "rw" if value.is_none() => o.read_only = false,
            "warm" => match value {
                None => o.warm = Some(String::new()),
                Some(v) => {
                    match parse_size(v) {
                        Ok(n) if n > 0 => {}
                        Ok(_) => return Err(UsageError("option warm=0: a warm-up's rate must be more than 0".into())),
                        Err(e) => return Err(UsageError(format!("option warm={v}: {e}"))),
                    }
                    o.warm = Some(v.to_string());
                }
            },
            "mode" => {
                o.mode = match need("fs|block|raw")? {
                    "fs" => Mode::Fs,
                    "block" => Mode::Block,
                    "raw" => Mode::Raw,
                    other => {
                        return Err(UsageError(format!(
                            "option mode={other}: the mode is fs, block or raw"
                        )))
                    }
                }
            }
            "mkfs" => match need("ext4|xfs")? {
                t @ ("ext4" | "xfs") => o.mkfs = Some(t.to_string()),
                other => {
                    return Err(UsageError(format!(
                        "option mkfs={other}: blobdrive creates ext4 or xfs"
                    )))
                }
            },
            "cache-size" => {
                let v = need("SIZE")?;
                parse_size(v).map_err(|e| UsageError(format!("option cache-size={v}: {e}")))?;
                o.cache_size = Some(v.to_string());
            }
            "credentials" => o.credentials = Some(PathBuf::from(need("FILE")?)),
            "key-file" => o.key_file = Some(PathBuf::from(need("PATH")?)),
            "no-discard" if value.is_none() => o.no_discard = true,
            "disk-cache" => o.disk_cache = Some(PathBuf::from(need("DIR")?)),
            "disk-cache-size" => {
                let v = need("SIZE")?;
                parse_size(v)
                    .map_err(|e| UsageError(format!("option disk-cache-size={v}: {e}")))?;
                o.disk_cache_size = Some(v.to_string());
            }
            "metrics" => {
                let v = need("HOST:PORT")?;
                crate::mount::metrics::check_addr(v)
                    .map_err(|e| UsageError(format!("option metrics={v}: {e}")))?;
                o.metrics = Some(v.to_string());
            }
            "run-as" => {
                let v = need("USER")?;
                crate::privsep::check_user_name(v)
                    .map_err(|e| UsageError(format!("option run-as: {e}")))?;
                o.run_as = Some(v.to_string());
            }
            "user" | "users" | "owner" | "group" => {
                return Err(UsageError(format!(
                    "option {name}: blobdrive drives are mounted by root only (the mount needs FUSE, a loop device and a lease); remove {name}"
                )))
            }
            n if value.is_none() && IGNORED.contains(&n) => {}
            n if n.starts_with("x-") || n == "comment" => {}
            n if value.is_none() && FS_FLAGS.contains(&n) => o.fs_flags.push(n.to_string()),
            _ if sloppy => {}
            _ => return Err(unknown_option(opt)),
        }
    }
    if o.disk_cache_size.is_some() && o.disk_cache.is_none() {
        return Err(UsageError(
            "option disk-cache-size needs disk-cache=DIR too".into(),
        ));
    }
    if o.warm.is_some() && o.disk_cache.is_none() {
        return Err(UsageError(
            "option warm needs disk-cache=DIR too: the warm-up fills the disk cache".into(),
        ));
    }
    if o.mkfs.is_some() && o.read_only {
        return Err(UsageError(
            "option mkfs needs a writable mount, and ro was given".into(),
        ));
    }
    if o.mkfs.is_some() && o.mode != Mode::Fs {
        return Err(UsageError(format!(
            "option mkfs only goes with mode=fs, not mode={}",
            o.mode
        )));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(args: &[&str]) -> Result<Invocation, UsageError> {
        parse_args(args.iter().copied())
    }

    #[test]
    fn what_mount_passes_for_an_fstab_line() {
        let i = inv(&[
            "disks/data.vhd",
            "/data",
            "-v",
            "-o",
            "rw,credentials=/etc/blobdrive/acct.env,_netdev,nofail,mode=fs,mkfs=ext4,cache-size=64MiB,nosuid,nodev,metrics=127.0.0.1:9101,disk-cache=/var/cache/blobdrive,disk-cache-size=20GiB,run-as=bd-worker,warm=100MiB,key-file=/etc/blobdrive/data.key,no-discard",
        ])
        .unwrap();
        assert_eq!(i.spec, "disks/data.vhd");
        assert_eq!(i.dir, PathBuf::from("/data"));
        assert!(i.verbose && !i.fake);
        assert_eq!(
            i.options,
            Options {
                read_only: false,
                mode: Mode::Fs,
                mkfs: Some("ext4".into()),
                cache_size: Some("64MiB".into()),
                credentials: Some("/etc/blobdrive/acct.env".into()),
                fs_flags: vec!["nosuid".into(), "nodev".into()],
                metrics: Some("127.0.0.1:9101".into()),
                disk_cache: Some("/var/cache/blobdrive".into()),
                disk_cache_size: Some("20GiB".into()),
                run_as: Some("bd-worker".into()),
                warm: Some("100MiB".into()),
                key_file: Some("/etc/blobdrive/data.key".into()),
                no_discard: true,
            }
        );
        // Flags together, options attached, a subtype, several -o.
        let i = inv(&[
            "c/n.vhd@2026-01-01T00:00:00Z",
            "/m",
            "-sfn",
            "-oro",
            "-o",
            "mode=raw",
            "-t",
            "blobdrive",
        ])
        .unwrap();
        assert!(i.fake && i.options.read_only && i.options.mode == Mode::Raw);
        // What mount(8) keeps to itself is still accepted by hand.
        let o = parse_options(
            "defaults,auto,noauto,x-systemd.automount,x-foo=1,comment=hi",
            false,
        )
        .unwrap();
        assert_eq!(o, Options::default());
    }

    #[test]
    fn anything_else_is_one_line_naming_it() {
        let e = parse_options("rw,bogus=1", false).unwrap_err().0;
        assert!(e.starts_with("unknown option 'bogus=1'"), "{e}");
        assert!(!e.contains('\n'));
        assert!(parse_options("rw,bogus=1", true).is_ok(), "-s ignores it");
        let e = parse_options("mode=disk", false).unwrap_err().0;
        assert!(e.contains("mode=disk"), "{e}");
        let e = parse_options("mkfs=btrfs", false).unwrap_err().0;
        assert!(e.contains("mkfs=btrfs"), "{e}");
        let e = parse_options("metrics=localhost", false).unwrap_err().0;
        assert!(
            e.contains("metrics=localhost") && e.contains("HOST:PORT"),
            "{e}"
        );
        let named = parse_options("metrics=localhost:9101", false).unwrap();
        assert_eq!(named.metrics.as_deref(), Some("localhost:9101"));
        let e = parse_options("cache-size=1GB", false).unwrap_err().0;
        assert!(e.starts_with("option cache-size=1GB: "), "{e}");
        let e = parse_options("disk-cache=/c,disk-cache-size=1GB", false)
            .unwrap_err()
            .0;
        assert!(e.starts_with("option disk-cache-size=1GB: "), "{e}");
        let e = parse_options("disk-cache-size=1GiB", false).unwrap_err().0;
        assert!(e.contains("needs disk-cache=DIR"), "{e}");
        let e = parse_options("warm", false).unwrap_err().0;
        assert!(e.contains("warm needs disk-cache=DIR"), "{e}");
        assert_eq!(
            parse_options("warm,disk-cache=/c", false)
                .unwrap()
                .warm
                .as_deref(),
            Some("")
        );
        for bad in ["warm=0", "warm=1MB", "warm="] {
            let e = parse_options(&format!("disk-cache=/c,{bad}"), false)
                .unwrap_err()
                .0;
            assert!(e.starts_with("option warm"), "{bad}: {e}");
        }
        let e = parse_options("credentials=", false).unwrap_err().0;
        assert!(e.contains("credentials=FILE"), "{e}");
        let e = parse_options("user,noexec,nosuid,nodev", false)
            .unwrap_err()
            .0;
        assert!(e.starts_with("option user:"), "{e}");
        let e = parse_options("ro,mkfs=xfs", false).unwrap_err().0;
        assert!(e.contains("writable"), "{e}");
        let e = parse_options("mode=block,mkfs=xfs", false).unwrap_err().0;
        assert!(e.contains("mode=block"), "{e}");
        // `ro=1` is not `ro`.
        assert!(parse_options("ro=1", false).is_err());
        // run-as names a user plainly: not a uid, a path, a group, or shell.
        for bad in [
            "run-as=0",
            "run-as=root:root",
            "run-as=../x",
            "run-as=Admin",
            "run-as=a;b",
        ] {
            let e = parse_options(bad, false).unwrap_err().0;
            assert!(e.starts_with("option run-as: '"), "{bad}: {e}");
            assert!(e.contains("is not a user name"), "{e}");
        }
        let e = parse_options("run-as=", false).unwrap_err().0;
        assert!(e.contains("run-as=USER"), "{e}");
        let long = format!("run-as={}", "a".repeat(33));
        assert!(parse_options(&long, false).is_err());
        assert_eq!(
            parse_options("mode=raw,run-as=_bd", false)
                .unwrap()
                .run_as
                .as_deref(),
            Some("_bd")
        );
    }

    #[test]
    fn an_option_given_twice_or_contradicted_is_named() {
        for (list, needle) in [
            ("rw,ro", "options rw and ro contradict each other"),
            ("ro,credentials=/c,rw", "options ro and rw contradict"),
            ("nosuid,suid", "options nosuid and suid"),
            ("noatime,relatime", "options noatime and relatime"),
            (
                "metrics=127.0.0.1:1,metrics=127.0.0.1:2",
                "option metrics is given twice (metrics=127.0.0.1:1 and metrics=127.0.0.1:2)",
            ),
            ("mode=fs,mode=raw", "option mode is given twice"),
            (
                "cache-size=64MiB,cache-size=64MiB",
                "option cache-size is given twice",
            ),
            (
                "credentials=/a,credentials=/b",
                "option credentials is given twice",
            ),
            (
                "disk-cache=/c,warm,warm=8MiB",
                "option warm is given twice (warm and warm=8MiB)",
            ),
        ] {
            let e = parse_options(list, false).unwrap_err().0;
            assert!(e.starts_with(needle), "{list}: {e}");
            assert!(!e.contains('\n'));
            // Sloppy or not: -s is for options blobdrive does not know.
            assert!(parse_options(list, true).is_err(), "{list}");
        }
        // A flag twice too, whatever it is.
        for (list, needle) in [
            ("ro,ro", "option ro is given twice (ro and ro)"),
            ("noatime,noatime", "option noatime is given twice"),
            ("nosuid,nodev,nosuid", "option nosuid is given twice"),
            ("_netdev,nofail,_netdev", "option _netdev is given twice"),
            ("defaults,defaults", "option defaults is given twice"),
        ] {
            let e = parse_options(list, false).unwrap_err().0;
            assert!(e.starts_with(needle), "{list}: {e}");
        }
        // mount(8)'s and systemd's own may repeat.
        for fine in [
            "comment=a,comment=b",
            "x-a=1,x-a=2",
            "x-systemd.requires=a.service,x-systemd.requires=b.service",
            "noatime,nodiratime",
        ] {
            assert!(parse_options(fine, false).is_ok(), "{fine}");
        }
        // The check alone, as the helper runs it on an fstab line as written:
        // it does not judge options mount(8) takes for itself.
        assert!(check_repeats("defaults,async,user,rw").is_ok());
        assert!(check_repeats("defaults,rw,noauto,ro").is_err());
    }

    /// Every name in the list is one the parser handles (none falls through to
    /// "unknown"), so the list, which the manual page is checked against, is what
    /// the parser takes.
    #[test]
    fn every_listed_option_is_handled() {
        for name in option_names() {
            let sample = match name {
                "mode" => "mode=raw".to_string(),
                "mkfs" => "mkfs=xfs".to_string(),
                "cache-size" | "disk-cache-size" => format!("disk-cache=/c,{name}=1GiB"),
                "warm" => "disk-cache=/c,warm".to_string(),
                "metrics" => "metrics=127.0.0.1:9101".to_string(),
                n if VALUED.contains(&n) => format!("{n}=x"),
                n => n.to_string(),
            };
            match parse_options(&sample, false) {
                Ok(_) => {}
                Err(e) => assert!(
                    REFUSED.contains(&name) && !e.0.starts_with("unknown"),
                    "{sample}: {e}"
                ),
            }
        }
        assert!(parse_options("x-systemd.requires=network.target", false).is_ok());
    }

    #[test]
    fn bad_command_lines() {
        assert!(inv(&["only-one"]).unwrap_err().0.contains("SPEC and DIR"));
        assert!(inv(&["a/b", "/m", "-o"])
            .unwrap_err()
            .0
            .contains("-o needs"));
        assert!(inv(&["a/b", "/m", "-t", "ext4"])
            .unwrap_err()
            .0
            .contains("'ext4'"));
        assert!(inv(&["a/b", "/m", "-N", "/proc/1/ns/mnt"])
            .unwrap_err()
            .0
            .contains("namespace"));
        assert!(inv(&["a/b", "/m", "-x"]).unwrap_err().0.contains("-x"));
        assert!(inv(&["a/b", "/m", "--bogus"])
            .unwrap_err()
            .0
            .contains("--bogus"));
    }
}
