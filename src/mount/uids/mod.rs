//! A uid of its own for every mount's worker.
//!
//! Workers of one uid could signal each other (stop one, kill it and lose its
//! unflushed writes), read each other's `/proc` and reach each other's files.
//! So unless `--run-as` names a user, a mount's worker runs as an id nobody
//! else has, as its uid and its gid, picked from the ids reserved for
//! blobdrive: the `blobdrive` user's ranges in `/etc/subuid` and
//! `/etc/subgid` (`reserved.rs`), which the package, `scripts/install.sh` and
//! `scripts/install-deps.sh` add as container tools reserve a user's
//! subordinate ids. An id is given only if no account has it (`/etc/passwd`,
//! `/etc/group`, and the user database through NSS), no running process has
//! it (`in_use.rs`) and no live mount holds it (`claims.rs`); it is picked
//! under a lock, so two mounts starting at once never get the same one, and
//! given back when the mount's root part ends (a root part killed outright
//! leaves a claim whose holder is gone, which the next pick removes).
//!
//! The claims are the machine's, in `/run/blobdrive/uids` whatever run
//! directory a mount keeps its record in (`BLOBDRIVE_RUN_DIR`): ids are
//! shared by every mount on the host.

mod claims;
mod in_use;
mod reserved;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::device::diskcache::reclaim::LeftTo;
use claims::ClaimsDir;
pub use claims::Holder;
pub use reserved::{IdRange, MIN_ID};

/// The user whose reserved ids the pool gives out.
pub const POOL_USER: &str = crate::privsep::DEFAULT_USER;

/// Where the pool reads and keeps what it needs (the system's files, or a
/// test's).
#[derive(Debug, Clone)]
pub struct Places {
    pub subuid: PathBuf,
    pub subgid: PathBuf,
    pub passwd: PathBuf,
    pub group: PathBuf,
    pub proc_dir: PathBuf,
    /// The claims directory, and the directory from which its levels are
    /// checked to be root's alone.
    pub claims: PathBuf,
    pub claims_root: PathBuf,
    /// Also ask the user database (NSS: LDAP, sssd) whether an id is an
    /// account's.
    pub nss: bool,
}

impl Places {
    /// The machine's.
    pub fn system() -> Places {
        Places {
            subuid: "/etc/subuid".into(),
            subgid: "/etc/subgid".into(),
            passwd: "/etc/passwd".into(),
            group: "/etc/group".into(),
            proc_dir: "/proc".into(),
            claims: "/run/blobdrive/uids".into(),
            claims_root: "/run/blobdrive".into(),
            nss: true,
        }
    }
}

/// Why no id could be given.
#[derive(Debug, Error)]
pub enum UidError {
    #[error("no uids are reserved for blobdrive's mounts (each mount's network-facing part runs as a uid of its own): /etc/subuid and /etc/subgid give the user {POOL_USER} no range above 65535; reserve one no other line of theirs overlaps, e.g. `usermod --add-subuids 200000-265535 --add-subgids 200000-265535 {POOL_USER}` (the Debian package, scripts/install.sh and scripts/install-deps.sh do), or name a user with --run-as")]
    NotReserved,
    #[error("every uid reserved for blobdrive's mounts ({0} of them) is in use or an account's: unmount a drive, or reserve more in /etc/subuid and /etc/subgid")]
    Exhausted(u64),
    #[error("the uid pool: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> UidError {
    let what = what.into();
    move |source| UidError::Io { what, source }
}

/// An id held for a mount: its worker's uid and gid. Given back when released
/// or dropped, by the process that took it only (a child forked meanwhile
/// holds a copy and gives nothing back).
pub struct Claim {
    id: u64,
    holder: Holder,
    dir: ClaimsDir,
}

impl Claim {
    pub fn uid(&self) -> u32 {
        self.id as u32
    }

    pub fn gid(&self) -> u32 {
        self.id as u32
    }

    /// Gives the id back to the pool.
    pub fn release(self) {}
}

impl Drop for Claim {
    fn drop(&mut self) {
        if std::process::id() == self.holder.pid {
            self.dir.remove(self.id, Some(self.holder));
        }
    }
}

/// The user a mount's worker runs as: the user `run_as` names (`--run-as`,
/// fstab's `run-as=`), or else an id of the pool, held (by this process, the
/// mount's root part) until the returned claim is released or dropped.
pub fn worker_for(
    run_as: Option<&str>,
) -> Result<(crate::privsep::WorkerUser, Option<Claim>), String> {
    match run_as {
        Some(name) => crate::privsep::WorkerUser::lookup(name)
            .map(|u| (u, None))
            .map_err(|e| e.to_string()),
        None => {
            let claim = claim(&Places::system()).map_err(|e| e.to_string())?;
            let user = crate::privsep::WorkerUser {
                uid: claim.uid(),
                gid: claim.gid(),
            };
            Ok((user, Some(claim)))
        }
    }
}

/// This process, as a claim's holder.
fn me(places: &Places) -> Result<Holder, UidError> {
    let pid = std::process::id();
    let start = in_use::start_time(&places.proc_dir, pid).ok_or_else(|| UidError::Io {
        what: "cannot read this process's start time".into(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    Ok(Holder { pid, start })
}

/// The ids the pool may give, from the reservations.
pub fn reserved_ids(places: &Places) -> Result<Vec<IdRange>, UidError> {
    let passwd = reserved::read_bounded(&places.passwd).map_err(io("cannot read passwd"))?;
    let pool_uid = passwd
        .lines()
        .find_map(|l| l.strip_prefix(POOL_USER)?.strip_prefix(':'))
        .and_then(|rest| rest.split(':').nth(1)?.parse::<u32>().ok());
    let read =
        |p: &Path| reserved::read_bounded(p).map_err(io(format!("cannot read {}", p.display())));
    let uids = reserved::parse(&read(&places.subuid)?, POOL_USER, pool_uid);
    let gids = reserved::parse(&read(&places.subgid)?, POOL_USER, pool_uid);
    Ok(reserved::usable(&uids, &gids))
}

/// Takes an id for a mount whose root part is this process.
pub fn claim(places: &Places) -> Result<Claim, UidError> {
    let ranges = reserved_ids(places)?;
    if ranges.is_empty() {
        return Err(UidError::NotReserved);
    }
    let holder = me(places)?;
    let dir = ClaimsDir::open(&places.claims, &places.claims_root)
        .map_err(io(format!("{}", places.claims.display())))?;
    let _locked = dir.lock().map_err(io("cannot take the lock"))?;
    let taken = taken_ids(places, &dir)?;
    let id = in_turn(&ranges, dir.last_given())
        .find(|id| !(taken.contains(id) || places.nss && nss_knows(*id)))
        .ok_or_else(|| UidError::Exhausted(ranges.iter().map(IdRange::count).sum()))?;
    dir.write(id, holder)
        .map_err(io(format!("cannot record uid {id} as taken")))?;
    dir.set_last_given(id);
    Ok(Claim { id, holder, dir })
}

/// Every id of `ranges` once, starting after `last` (the id given last) and
/// going round. An id given back is thus given again only after all the
/// others: whatever its last mount left behind (a killed mount's disk cache
/// directory, still its worker's) is not another mount's at once.
fn in_turn(ranges: &[IdRange], last: Option<u64>) -> impl Iterator<Item = u64> + '_ {
    let all = || ranges.iter().flat_map(|r| r.start..r.end);
    let after = last
        .and_then(|last| all().position(|id| id == last))
        .map_or(0, |at| at + 1);
    all().skip(after).chain(all().take(after))
}

/// The ids not to give: accounts', running processes', and those live mounts
/// hold. Claims whose holder is gone are removed on the way.
fn taken_ids(places: &Places, dir: &ClaimsDir) -> Result<HashSet<u64>, UidError> {
    let passwd = reserved::read_bounded(&places.passwd).map_err(io("cannot read passwd"))?;
    let group = reserved::read_bounded(&places.group).map_err(io("cannot read group"))?;
    let mut taken = in_use::account_ids(&passwd, &group);
    taken.extend(
        in_use::process_ids(&places.proc_dir)
            .map_err(io(format!("cannot read {}", places.proc_dir.display())))?,
    );
    for (id, holder) in dir
        .read()
        .map_err(io(format!("cannot read {}", dir.path().display())))?
    {
        if in_use::start_time(&places.proc_dir, holder.pid) == Some(holder.start) {
            taken.insert(id);
        } else {
            dir.remove(id, Some(holder));
        }
    }
    Ok(taken)
}

/// Whether `id` is of the pool and whether anything uses it now (a live
/// mount's claim, a process). A drive's disk cache directory is left with a
/// pool id as its owner when its mount's root part was killed before it could
/// take the directory back: idle, it may be given to a new mount's id; in use,
/// another mount's worker could have changed what is in it. An answer that
/// cannot be had counts as in use.
pub fn pool_id_state(places: &Places, id: u64) -> LeftTo {
    let Ok(ranges) = reserved_ids(places) else {
        return LeftTo::NotPool;
    };
    if !ranges.iter().any(|r| r.contains(id)) {
        return LeftTo::NotPool;
    }
    let Ok(dir) = ClaimsDir::open(&places.claims, &places.claims_root) else {
        return LeftTo::InUse;
    };
    let Ok(_locked) = dir.lock() else {
        return LeftTo::InUse;
    };
    match taken_ids(places, &dir) {
        Ok(taken) if !taken.contains(&id) => LeftTo::Idle,
        _ => LeftTo::InUse,
    }
}

/// Whether the user database (NSS) has a user of uid `id` or a group of gid
/// `id`; an answer that cannot be had counts as yes.
fn nss_knows(id: u64) -> bool {
    let Ok(id) = u32::try_from(id) else {
        return true;
    };
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd and group are plain old data, filled in by the calls;
    // every pointer is valid for the call and buf's length is given.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(id, &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut found);
        if rc != 0 || !found.is_null() {
            return true;
        }
        let mut grp: libc::group = std::mem::zeroed();
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(id, &mut grp, buf.as_mut_ptr().cast(), buf.len(), &mut found);
        rc != 0 || !found.is_null()
    }
}

#[cfg(test)]
mod tests;
