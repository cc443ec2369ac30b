//! The root part of a privilege-separated mount, and the seam between it and
//! the unprivileged worker (walled by [`crate::privsep`]).
//!
//! A mount daemon is two processes. The root part does what needs root and never
//! reads a byte from the network: before the worker exists it claims the
//! mount's record, mounts FUSE, binds the metrics port and the control socket,
//! and builds the walls; then it forks the worker, which puts the walls up
//! (`crate::privsep`) before it starts any thread and then does everything that
//! talks to the storage service. From then on the root part only answers the
//! worker's requests ([`Request`]), a fixed set carrying no paths: the root part
//! knows the mountpoint, the FUSE directory and the loop device itself, and acts
//! only on those. It resolves no path inside the FUSE filesystem the worker
//! serves: `disk` is opened beneath the FUSE mount's root, refusing symlinks,
//! and the loop device attached through that descriptor; from then on the
//! device and both mounts are known by the kernel's numbers, and nothing the
//! worker says or serves changes what the root part holds.
//!
//! Where each part lives:
//! - this file: the root part's state (`RootPart`);
//! - `channel.rs`: the requests and answers, one JSON line each, every line
//!   bounded ([`LINE_MAX`]), and the root part's [`answer_one`];
//! - `client.rs`: the worker's end, [`RootClient`];
//! - `start.rs`: the root part's work before the fork, and the fork;
//! - `server.rs`: its life after the fork: serving the worker's requests, each
//!   handed to the file for its kind, and what it does when the worker stops
//!   (or dies);
//! - `guards.rs`: what it has put in place, each held as a guard that undoes
//!   it, so that teardown is dropping what is held;
//! - the requests by kind: `outcome.rs`, the worker's word on the mount (kept
//!   in the record and libmount's entry, passed on to `blobdrive mount` and the
//!   service manager); `fuse.rs`, the FUSE mount; `loopdev.rs`, the loop
//!   device over `disk`; `filesystem.rs`, the filesystem on it; `token.rs`,
//!   the federated token;
//! - `errand.rs`: the calls that wait on the worker's files, each on a thread
//!   of its own so that the root part never waits on the worker;
//! - `watch.rs`: what the root part does whatever it waits for (signals, the
//!   worker's log, a thaw owed);
//! - `log.rs`: the worker's log, copied bounded and escaped.
//!
//! The worker's code (`mount::daemon`) reaches root operations only through a
//! [`RootClient`]; `mount::system` is the root part's room.

mod channel;
mod client;
mod errand;
mod filesystem;
mod fuse;
mod guards;
mod log;
mod loopdev;
mod outcome;
mod server;
mod start;
mod token;
mod watch;

use std::path::PathBuf;

use crate::mount::notify::Notifier;
use crate::mount::record::MountRecord;
use crate::mount::system::filesystem::Prepared;
use crate::mount::system::MountId;
use crate::mount::{MountRequest, Ready};
use errand::Errand;
use filesystem::MountTable;
use guards::InPlace;
use watch::Watch;

pub use channel::{answer_one, Answer, ChannelError, Ops, Request, LINE_MAX};
pub use client::RootClient;
pub use start::{split, Split, WorkerStart};

/// What the root part did and still answers for.
struct RootPart {
    req: MountRequest,
    record_id: String,
    /// The mount's record as claimed (saved again when it names a device).
    rec: MountRecord,
    /// Where FUSE is mounted (the user's directory in modes raw and block).
    fuse_dir: PathBuf,
    /// The FUSE mount, by the numbers the kernel gave it as it was made (its
    /// mount id, device and unique mount id): how the root part tells its own
    /// FUSE mount is still there, and finds its root again, never by the FUSE
    /// directory's path alone.
    fuse_id: Option<MountId>,
    /// What it put in place and has not undone yet.
    held: InPlace,
    /// The filesystem on the loop device as `PrepareFs` found (or made) it.
    fs: Option<Prepared>,
    /// The mount table, read again only when it changed.
    mount_table: MountTable,
    /// The worker, the root part's signals and the worker's log, once served.
    watch: Option<Watch>,
    /// The call under way on a thread of its own (see `errand.rs`).
    errand: Option<Errand>,
    /// The answer of an errand that ended after its request was answered
    /// `Pending`, for the worker's asking again.
    kept: Option<(Request, Answer)>,
    /// The worker asked for the log to be removed (after a clean unmount):
    /// done as the root part ends, when nothing writes to it any more.
    remove_log: bool,
    notifier: Option<Notifier>,
    /// The worker's word on the mount, for `blobdrive mount`, not yet passed on.
    said: Option<Result<Ready, String>>,
    /// The worker's word was passed on (it may say it once).
    has_said: bool,
    /// What the worker's `Finished` left as lost.
    losses: Vec<String>,
    /// Why the mount failed, as the worker said it.
    failed: Option<String>,
}

impl RootPart {
    fn new(req: MountRequest, rec: MountRecord) -> RootPart {
        RootPart {
            req,
            record_id: rec.id.clone(),
            fuse_dir: rec.fuse_dir.clone(),
            rec,
            fuse_id: None,
            held: InPlace::default(),
            fs: None,
            mount_table: MountTable::default(),
            watch: None,
            errand: None,
            kept: None,
            remove_log: false,
            notifier: Notifier::from_env(),
            said: None,
            has_said: false,
            losses: Vec::new(),
            failed: None,
        }
    }
}
