//! The mount daemon: sets a drive up layer by layer, serves it, and takes it down in
//! the reverse order.
//!
//! Setup order: check the drive, take the lease, learn the written ranges, start
//! the cache and FUSE, attach the loop device, mount the filesystem. Any failure
//! undoes what was done, so a failed mount leaves no FUSE mount, no loop device and
//! no lease. Teardown (unmount or SIGTERM) goes the other way and stops, keeping
//! everything that is left mounted, at the first step that cannot be done safely:
//! a busy filesystem, or dirty data that cannot be written yet.
//!
//! Where each part lives:
//! - `setup.rs`: bringing the drive up, in the order above, one phase each;
//! - `handles.rs`: what each phase leaves for teardown to undo (the record,
//!   the FUSE directory, the loop device, the filesystem, libmount's entry);
//! - `teardown.rs`: what happens at unmount, in the reverse order;
//! - `control.rs`: the control socket, how the CLI (`unmount`, `stats`,
//!   `snapshot`) talks to the daemon, both sides of it;
//! - `snapshot.rs`: the consistent snapshot the socket's `snapshot` takes;
//! - `resize.rs`: growing the mounted drive, on the socket's `resize`;
//! - `stats.rs`: the counters `stats` shows;
//! - `warm.rs`: the warm-up of the disk cache (`warm`, `mount --warm`).

mod control;
mod encryption;
mod handles;
mod resize;
mod setup;
mod snapshot;
mod stats;
mod teardown;
mod warm;

pub use control::{
    control, control_on, control_watching, control_with_progress, DISCARD_CMD, FLUSH_CMD,
};
pub use warm::CMD as WARM_CMD;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::thread::JoinHandle;

use fuser::BackgroundSession;
use tracing::error;

use super::rootpart::{self, Request, RootClient, Split, WorkerStart};
use super::{MountError, MountRequest, Ready};
use crate::azure::auth::entra::workload_identity::FederatedReader;
use crate::azure::{Account, BlobClient, BlobService};
use crate::blobref::BlobRef;
use crate::device::cache::Cache;
use crate::device::diskcache::files::BlobState;
use crate::device::stack::Stack;
use crate::device::LeaseLoss;
use crate::luks::secret::Secret;
use control::serve;
use handles::{AttachedLoop, FsMount};
use setup::limit_malloc_arenas;
use stats::StatsValues;

/// A mounted drive and everything set up for it, in setup order. This is the
/// worker of a split daemon (`mount::rootpart`): every root operation is a
/// request to the root part through `root`.
struct Mounted {
    req: MountRequest,
    rt: tokio::runtime::Runtime,
    blob: BlobClient,
    target: String,
    lease: Option<String>,
    fenced: Arc<LeaseLoss>,
    cache: Option<Arc<Cache<Stack>>>,
    flusher: Option<JoinHandle<()>>,
    session: Option<BackgroundSession>,
    fuse_dir: PathBuf,
    /// The loop device over `disk` (fs and block modes), attached by the root
    /// part.
    loop_dev: Option<AttachedLoop>,
    /// The filesystem mounted at the user's directory (fs mode).
    fs: Option<FsMount>,
    /// A plain `umount` of the filesystem has begun (see
    /// `Mounted::noticed_umount_begun`): I/O waits through outages without limit.
    umount_begun: bool,
    /// The channel to the root part, which does every root operation for the
    /// worker and speaks for the mount to `blobdrive mount` and to the service
    /// manager (the unit's main process, which alone may: `NotifyAccess=main`).
    root: RootClient,
    /// A stop that had to wait (busy) was logged already.
    stop_refused_logged: bool,
    /// The counters `stats` shows, readable from any thread.
    stats: Option<StatsValues>,
    /// Handles open on the FUSE file `disk`, counted by the FUSE layer.
    open_disk: Option<Arc<AtomicUsize>>,
    /// `unmount --discard-dirty` asked to drop what cannot be written (set by the
    /// control thread, also while a teardown already waits).
    discard: Arc<AtomicBool>,
    /// The FUSE mount is gone: nothing new can be written any more.
    fuse_gone: Arc<AtomicBool>,
    /// The filesystem's unmount is under way in the kernel, whose last sync
    /// writes through the daemon: a `--discard-dirty` then stops its waits.
    unmounting_fs: Arc<AtomicBool>,
    /// With a disk cache (`--disk-cache`, a layer of the cache's stack): the blob
    /// as the mount found it once it alone could write it. A clean unmount
    /// leaves the disk cache for the next mount only if the blob is then as the
    /// mount's own writes left it.
    disk_state: Option<BlobState>,
    /// The drive's directory in the disk cache directory, opened (and given to
    /// the worker's user) by the root part.
    disk_cache_dir: Option<std::fs::File>,
    /// The warm-ups of the disk cache (with one).
    warmer: Option<Arc<warm::Warmer>>,
    /// What a teardown that kept everything has to say all the same (the lease
    /// was lost while mounted, but no write failed): `unmount` prints it.
    lease_note: Option<String>,
    /// An encrypted drive's passphrase, until the drive is opened with it.
    passphrase: Option<Secret>,
    /// An encrypted drive, opened: its cipher until the cache's stack takes
    /// it, and where its data segment starts.
    encryption: Option<encryption::Encryption>,
}

impl Mounted {
    /// A drive about to be set up: its I/O runtime and blob client (with the
    /// request's retry policy), nothing set up yet.
    fn new(
        req: &MountRequest,
        account: &Account,
        blob_ref: &BlobRef,
        fuse_dir: PathBuf,
        root: RootClient,
    ) -> Result<Mounted, MountError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .thread_name("blobdrive-io")
            .build()
            .map_err(|e| MountError::with_source("cannot start the I/O runtime", e))?;
        let svc = BlobService::with_policy(blob_ref.account(account), req.io.retry.clone());
        Ok(Mounted {
            req: req.clone(),
            rt,
            blob: blob_ref.client(&svc),
            target: blob_ref.to_string(),
            lease: None,
            fenced: Arc::new(LeaseLoss::default()),
            cache: None,
            flusher: None,
            session: None,
            fuse_dir,
            loop_dev: None,
            fs: None,
            umount_begun: false,
            root,
            stop_refused_logged: false,
            open_disk: None,
            stats: None,
            discard: Arc::new(AtomicBool::new(false)),
            fuse_gone: Arc::new(AtomicBool::new(false)),
            unmounting_fs: Arc::new(AtomicBool::new(false)),
            disk_state: None,
            disk_cache_dir: None,
            warmer: None,
            lease_note: None,
            passphrase: None,
            encryption: None,
        })
    }

    /// Serves `GET /metrics` on a thread of its own for as long as the daemon
    /// runs (see `mount::metrics`).
    fn serve_metrics(&self, listener: std::net::TcpListener) {
        let fenced = self.fenced.clone();
        let had_lease = self.lease.is_some();
        let info = super::metrics::MountInfo {
            mode: self.req.mode.to_string(),
            fstype: self
                .fs
                .as_ref()
                .map(|f| f.fstype.clone())
                .unwrap_or_default(),
            read_only: self.req.read_only,
            snapshot: self.blob.snapshot().unwrap_or_default().to_string(),
        };
        let sources = super::metrics::Sources {
            info,
            service: self.blob.service().clone(),
            cache: self.cache.clone(),
            lease_held: Arc::new(move || had_lease && !fenced.is_lost()),
            warm: self.warmer.as_ref().map(|w| w.figures.clone()),
        };
        let registry = super::metrics::registry(&self.target, sources);
        if let Err(e) = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || super::metrics::serve(listener, registry))
        {
            tracing::warn!("cannot serve metrics: {e}");
        }
    }
}

/// Signs in: gives the account the credential it is used with (an Entra ID
/// sign-in fetches a token), or says why it cannot. Workload identity's
/// federated token file is read through the reader given, which asks the
/// root part: kubelet's token directories may be root's alone, and the
/// worker's Landlock keeps it out of them anyway.
pub type SignIn<'a> = &'a dyn Fn(Account, &FederatedReader) -> Result<Account, String>;

/// Runs a mount until it is unmounted: a root part, and a worker running as
/// the request's user (a uid of its own from blobdrive's pool unless told
/// otherwise, see `mount::uids`) that does everything
/// that talks to the storage service (see `mount::rootpart`). `account` names
/// the service; the worker signs in to it with `sign_in`, behind its walls (a
/// token endpoint's answer is network bytes too, and a sign-in may start a
/// thread, which the split must come before). `ready` is called exactly once:
/// with the mount's description when it is usable, or with the reason it
/// failed (after everything was undone).
pub fn run(
    req: MountRequest,
    account: Account,
    sign_in: SignIn,
    passphrase: Option<Secret>,
    ready: &mut dyn FnMut(Result<&Ready, String>),
) -> Result<(), MountError> {
    limit_malloc_arenas();
    // Nothing of the caller's (a shell's redirection, a node plugin's sockets)
    // reaches either part of the mount: the root part opens what it needs
    // after this, and hands the worker only its own.
    if let Err(e) = crate::privsep::close_inherited_descriptors() {
        let msg = format!("cannot close the descriptors the daemon was started with: {e}");
        ready(Err(msg.clone()));
        return Err(MountError::system(msg));
    }
    match rootpart::split(&req, &account, passphrase, ready) {
        Split::Root(result) => result,
        Split::Worker(start) => run_worker(req, account, sign_in, start),
    }
}

/// The worker of a split daemon, walled already: sets the drive up on what the
/// root part opened for it, serves it, and takes it down, asking the root part
/// for everything that needs root. The mount's outcome goes to the root part,
/// which tells `blobdrive mount` and the service manager.
fn run_worker(
    req: MountRequest,
    account: Account,
    sign_in: SignIn,
    start: WorkerStart,
) -> Result<(), MountError> {
    let WorkerStart {
        client,
        fuse,
        fuse_dir,
        control,
        metrics,
        disk_cache,
        passphrase,
    } = start;
    let failed = |client: &RootClient, msg: String| {
        client.tell(&Request::Failed {
            message: msg.clone(),
        });
        MountError::system(msg)
    };
    let blob_ref = match BlobRef::parse(&req.blob) {
        Ok(b) => b,
        Err(e) => return Err(failed(&client, e.to_string())),
    };
    let asks_root = client.clone();
    let federated: FederatedReader = Arc::new(move || asks_root.federated_token());
    let account = match sign_in(account, &federated) {
        Ok(a) => a,
        Err(e) => return Err(failed(&client, e)),
    };
    let mut m = match Mounted::new(&req, &account, &blob_ref, fuse_dir, client.clone()) {
        Ok(m) => m,
        Err(e) => return Err(failed(&client, e.to_string())),
    };
    m.disk_cache_dir = disk_cache;
    m.passphrase = passphrase;
    let said = match setup::setup(&mut m, fuse) {
        Ok(said) => said,
        Err(e) => {
            let msg = e.to_string();
            match m.teardown() {
                Ok(losses) => losses.iter().for_each(|l| error!("{l}")),
                Err(t) => error!("cleaning up after a failed mount: {t}"),
            }
            failed(&client, msg);
            return Err(e);
        }
    };
    if let Some(listener) = metrics {
        m.serve_metrics(listener);
    }
    client.done(&Request::Ready {
        status: m.status_line(),
        warnings: said.warnings,
        notes: said.notes,
        auth: Some(m.blob.service().account().credential.describe()),
    })?;
    if m.req.warm {
        m.warm_at_mount();
    }
    serve(&mut m, control)
}

#[cfg(test)]
mod tests {
    /// The worker's code, which reaches root operations only through its
    /// channel to the root part: `mount::system` (the root part's room) is
    /// named here only for the filesystem steps' value types. (`control/probe.rs`, which tries root operations on
    /// purpose to show them refused, is not part of it.)
    const WORKER_SOURCES: [(&str, &str); 12] = [
        ("mod.rs", include_str!("mod.rs")),
        ("control.rs", include_str!("control.rs")),
        ("encryption.rs", include_str!("encryption.rs")),
        ("handles.rs", include_str!("handles.rs")),
        ("resize.rs", include_str!("resize.rs")),
        ("setup.rs", include_str!("setup.rs")),
        ("snapshot.rs", include_str!("snapshot.rs")),
        ("stats.rs", include_str!("stats.rs")),
        ("teardown.rs", include_str!("teardown.rs")),
        ("warm.rs", include_str!("warm.rs")),
        (
            "../rootpart/channel.rs",
            include_str!("../rootpart/channel.rs"),
        ),
        (
            "../rootpart/client.rs",
            include_str!("../rootpart/client.rs"),
        ),
    ];

    #[test]
    fn the_worker_reaches_root_operations_only_through_the_root_part() {
        let allowed = ["system::filesystem"];
        for (file, text) in WORKER_SOURCES {
            let code_of_file = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code_of_file.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                let mut rest = code;
                while let Some(i) = rest.find("system::") {
                    let at = &rest[i..];
                    // (`filesystem::` is not `system::`.)
                    let word_starts =
                        !rest[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
                    assert!(
                        !word_starts || allowed.iter().any(|a| at.starts_with(a)),
                        "{file}:{}: the worker calls a root operation itself: {line}",
                        n + 1
                    );
                    rest = &rest[i + "system::".len()..];
                }
                assert!(
                    !code.contains("libc::mount") && !code.contains("libc::umount"),
                    "{file}:{}: {line}",
                    n + 1
                );
            }
        }
    }
}
