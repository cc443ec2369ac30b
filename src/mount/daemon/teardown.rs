//! Taking a drive down (unmount, SIGTERM, a failed setup): the reverse of setup,
//! refusing while the drive is in use and writing every cached byte before the
//! lease is released.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{error, info, warn};

use super::Mounted;
use crate::device::cache::Cache;
use crate::device::stack::Stack;
use crate::device::DeviceError;
use crate::mount::rootpart::Request;
use crate::mount::MountError;
use crate::size::human as human_bytes;

/// How long an unmount waits for handles of `disk` closed just before it to be
/// released (the kernel sends the release after close(2) has returned).
const RELEASE_GRACE: Duration = Duration::from_secs(2);

impl Mounted {
    /// Takes everything down in reverse order and returns what could not be kept
    /// (empty: a clean unmount). Refuses, leaving everything in place (call again
    /// to retry), while the filesystem is busy or the disk file is open. Once the
    /// FUSE mount is gone nothing new can be written, and the daemon waits out any
    /// outage until every cached byte is on the blob: it stops short of that only
    /// when the lease was lost, and then says what was dropped.
    pub(super) fn teardown(&mut self) -> Result<Vec<String>, MountError> {
        // From here on the cache may hold the only copy of what the filesystem
        // writes back as it unmounts: I/O waits for the service without limit.
        self.set_unbounded_waits(true);
        let result = self.take_down(Vec::new());
        if result.is_err() && !self.umount_begun {
            self.set_unbounded_waits(false);
        }
        result
    }

    /// Takes everything down after the FUSE session ended under the daemon (its
    /// connection aborted through `/sys/fs/fuse/connections`, or the FUSE
    /// directory unmounted lazily): nothing new can be written any more, so what
    /// is cached is written back first, even while processes still hold `disk` or
    /// sit in the mountpoint; what sits on the dead file (the filesystem, the loop
    /// device) is then taken down lazily if busy, the lease released and the record
    /// removed. Returns what could not be kept.
    pub(super) fn teardown_after_fuse_gone(&mut self) -> Vec<String> {
        self.set_unbounded_waits(true);
        self.fuse_gone.store(true, Ordering::SeqCst);
        self.session = None;
        let mut losses = Vec::new();
        if let Some(cache) = self.cache.clone() {
            if !self.req.read_only {
                losses.extend(self.write_back(&cache));
            }
        }
        self.noticed_plain_umount();
        if self.fs.take().is_some() {
            if let Err(e) = self.umount_fs_now(false) {
                warn!(
                    "{} is busy ({e}): detaching it lazily; its files are gone with the drive",
                    self.req.mountpoint.display()
                );
                if let Err(e) = self.umount_fs_now(true) {
                    error!("cannot detach {}: {e}", self.req.mountpoint.display());
                }
            }
        }
        if let Some(l) = self.loop_dev.take() {
            if let Err(e) = self.root.detach_loop() {
                warn!(
                    "cannot detach {} yet ({e}): it goes once its last user lets go",
                    l.dev
                );
            }
        }
        if let Err(e) = self.root.umount_fuse(true) {
            warn!("cannot detach {}: {e}", self.fuse_dir.display());
        }
        // Nothing is left that could refuse: the rest of the usual way down.
        self.open_disk = None;
        let so_far = losses.clone();
        self.take_down(losses).unwrap_or_else(|e| {
            let mut all = so_far;
            all.push(format!("taking the drive down: {e}"));
            all
        })
    }

    fn set_unbounded_waits(&self, on: bool) {
        if let Some(c) = &self.cache {
            c.backend().remote().set_wait_without_limit(on);
        }
    }

    /// Whether the filesystem this daemon mounted is gone without the daemon being
    /// asked: a plain `umount` (systemd's at shutdown too) of its last mount closed
    /// the loop device, and autoclear detached it, closing `disk`. Everything the
    /// filesystem wrote is in the cache or on the blob by then (the kernel drains
    /// the loop device before letting go of its file). Records that nothing of the
    /// filesystem or the device is left to take down (a directory mounted over the
    /// mountpoint since is someone else's) and says so once.
    pub(super) fn noticed_plain_umount(&mut self) -> bool {
        let Some(l) = self.loop_dev.as_ref().filter(|l| l.autoclear) else {
            return false;
        };
        if self.fs.is_none() || self.loop_still_attached() {
            return false;
        }
        info!(
            "{} was unmounted and {} detached itself: writing what is cached, releasing the lease and stopping",
            self.req.mountpoint.display(),
            l.dev
        );
        // (The root part put the device's settings back when it saw it let go,
        // and takes libmount's entry out when the drive is down.)
        self.fs = None;
        self.loop_dev = None;
        true
    }

    /// Whether the loop device is still attached over `disk` (the root part
    /// asks the kernel: the device's disk sequence number is the one it read
    /// right after attaching).
    /// Also when that cannot be told.
    fn loop_still_attached(&self) -> bool {
        self.root.loop_attached() != Some(false)
    }

    /// Whether a plain `umount` of the filesystem has begun: no mount of the
    /// loop device is left in the mount table while the device is still attached.
    /// The kernel takes a mount out of the table before the filesystem's last
    /// sync, so this is seen while that sync still runs. Its writes and flushes
    /// must then wait for the service without limit, as in `blobdrive unmount`:
    /// a flush failed by the I/O timeout would make the filesystem abort its
    /// journal and drop what it had not committed. (A lazy `umount -l` of a busy
    /// filesystem is seen the same way: its last users' fsyncs then wait without
    /// limit too.) Turns the unlimited waits on, once.
    pub(super) fn noticed_umount_begun(&mut self) -> bool {
        if self.fs.is_none() || self.umount_begun {
            return false;
        }
        if !self.loop_dev.as_ref().is_some_and(|l| l.autoclear) {
            return false;
        }
        if self.root.loop_mounted() != Some(false) {
            return false;
        }
        info!(
            "{} is being unmounted: its last writes wait for the storage service without limit",
            self.req.mountpoint.display()
        );
        self.umount_begun = true;
        self.set_unbounded_waits(true);
        true
    }

    /// `losses`: what was already lost on the way here.
    fn take_down(&mut self, mut losses: Vec<String>) -> Result<Vec<String>, MountError> {
        // A plain umount that came first leaves nothing of the filesystem here.
        self.noticed_plain_umount();
        self.refuse_if_disk_open()?;
        if self.fs.is_some() {
            self.umount_fs()?;
            self.fs = None;
            info!("unmounted {}", self.req.mountpoint.display());
        }
        if let Some(l) = &self.loop_dev {
            self.root.detach_loop()?;
            info!("detached {}", l.dev);
            self.loop_dev = None;
        }
        // The kernel refuses to unmount FUSE while any handle on `disk` is open,
        // also one opened since the check above; after it, no write can come in.
        if let Some(s) = self.session.take() {
            if let Err(e) = self.root.umount_fuse(false) {
                self.session = Some(s);
                return Err(match e {
                    MountError::Busy(_) => self.disk_busy(),
                    other => other,
                });
            }
            match s.umount_and_join() {
                // fuser tries to unmount again, and the kernel says it is not mounted.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => warn!("stopping the FUSE session: {e}"),
                Ok(()) => {}
            }
        } else if let Err(e) = self.root.umount_fuse(true) {
            // A setup that failed before FUSE was served: the root part's
            // FUSE mount goes before the drive is said to be down (the root
            // part takes that word only once its mounts are gone).
            warn!("cannot unmount {}: {e}", self.fuse_dir.display());
        }
        self.fuse_gone.store(true, Ordering::SeqCst);
        self.stop_warm_up();
        if let Some(cache) = self.cache.clone() {
            if !self.req.read_only && losses.is_empty() {
                losses.extend(self.write_back(&cache));
            }
            cache.close();
        }
        if let Some(f) = self.flusher.take() {
            let _ = f.join();
        }
        if losses.is_empty() && !self.fenced.is_lost() {
            self.keep_disk_cache();
        }
        if let Some(id) = self.lease.take() {
            if self.fenced.is_lost() {
                let (said, lost) = self.lease_lost_report(!losses.is_empty());
                warn!("{said}");
                if lost {
                    losses.push(said);
                } else {
                    self.lease_note = Some(said);
                }
            } else if let Err(e) = self.rt.block_on(self.blob.release_lease(&id)) {
                error!("could not release the lease on {}: {e}", self.target);
                // "All data is on the blob" only if nothing was dropped above.
                let kept = if losses.is_empty() {
                    "; all data is on the blob"
                } else {
                    ""
                };
                losses.push(format!(
                    "the lease on {t} could not be released ({e}): it is still held, so no other host can write the drive{kept}. Once nothing uses the drive, run `blobdrive lease break {t} --yes`",
                    t = self.target
                ));
            } else {
                info!("released the lease on {}", self.target);
            }
        }
        // The root part releases the record (leaving what was lost for
        // `blobdrive unmount`) and libmount's entry.
        let finished = Request::Finished {
            losses: losses.clone(),
        };
        if let Err(e) = self.root.done(&finished) {
            error!("the root part could not release the mount's record: {e}");
        }
        Ok(losses)
    }

    /// What to say of a lease lost while mounted: when, and how many writes,
    /// fsyncs and discards of the drive's users failed (answered with EIO) while
    /// it was mounted; and whether anything written was lost (`dropped`: data
    /// written to the drive was dropped on the way down; or any of them failed:
    /// with the lease gone, what they carried can never reach the blob). After a
    /// lease broken under a mount, an application's `sync` failed and `unmount`
    /// said only "unmounted".
    fn lease_lost_report(&self, dropped: bool) -> (String, bool) {
        let when = self
            .fenced
            .lost_at()
            .map_or_else(|| "an unknown time".into(), httpdate::fmt_http_date);
        let failed = self
            .cache
            .as_ref()
            .map_or(0, |c| c.counters.failed_writes.load(Ordering::Relaxed));
        let t = &self.target;
        let lost = format!(
            "the lease on {t} was lost at {when} while it was mounted (another party broke or took it)"
        );
        if failed == 0 && dropped {
            return (lost, true);
        }
        if failed == 0 {
            return (
                format!("{lost}; no write failed, and everything written is on the blob"),
                false,
            );
        }
        let writes = if failed == 1 { "write" } else { "writes" };
        (
            format!("{lost}: {failed} {writes} to the drive failed while it was mounted (answered with an I/O error), and what they carried is not on the blob"),
            true,
        )
    }

    /// Leaves the disk cache for the next mount, once nothing reads or writes any
    /// more, if the blob is provably as this mount left it: a writer reads the
    /// blob's state and then renews its lease (which fails if the lease was ever
    /// broken, the only way another write could have come in); a reader finds the
    /// blob as it was when mounted. Otherwise the cache is left without an index,
    /// and the next mount starts it empty.
    fn keep_disk_cache(&self) {
        let tier = self.cache.as_ref().and_then(|c| c.backend().disk_cache());
        let (Some(tier), Some(found)) = (tier, &self.disk_state) else {
            return;
        };
        let not_kept = |why: String| info!("the disk cache is not kept for the next mount: {why}");
        if !tier.is_on() {
            return not_kept("it was turned off".into());
        }
        let now = match self.rt.block_on(self.blob.properties()) {
            Ok(p) => match super::setup::blob_state(&p) {
                Some(s) => s,
                None => return not_kept("the service sent no ETag".into()),
            },
            Err(e) => return not_kept(format!("cannot read the blob's state: {e}")),
        };
        let current = match &self.lease {
            Some(id) => match self.rt.block_on(self.blob.renew_lease(id)) {
                Ok(()) => Ok(()),
                Err(e) => Err(format!("the lease could not be confirmed ({e})")),
            },
            None if &now == found => Ok(()),
            None => Err("the blob changed while it was mounted read-only".into()),
        };
        if let Err(why) = current {
            return not_kept(why);
        }
        match tier.seal(&now) {
            Ok(()) => info!("the disk cache is kept for the next mount"),
            Err(e) => warn!("the disk cache is not kept for the next mount: {e}"),
        }
    }

    /// Refuses while a process other than the loop device holds `disk` open: its
    /// later writes would have nowhere to go. close(2) returns before the
    /// kernel's release of the handle reaches the daemon, so a handle closed
    /// just before the unmount is given [`RELEASE_GRACE`] to be released (a test
    /// that closed the file and unmounted at once was refused as busy, naming no
    /// process, in one fresh-clone run).
    fn refuse_if_disk_open(&self) -> Result<(), MountError> {
        let Some(open) = &self.open_disk else {
            return Ok(());
        };
        let mine = usize::from(self.loop_dev.is_some());
        let until = std::time::Instant::now() + RELEASE_GRACE;
        while open.load(Ordering::SeqCst) > mine {
            if std::time::Instant::now() >= until {
                return Err(self.disk_busy());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Unmounts the filesystem. Its last sync, in the kernel, writes through this
    /// daemon and waits for the service without limit; with `--discard-dirty`
    /// asked (now, or while it waits), it stops waiting instead, so an unmount
    /// over a service that is gone for good ends, dropping what it cannot write.
    fn umount_fs(&self) -> Result<(), MountError> {
        self.unmounting_fs.store(true, Ordering::SeqCst);
        let backend = self.cache.as_ref().map(|c| c.backend());
        if self.discard.load(Ordering::SeqCst) {
            backend.inspect(|b| b.remote().stop_waiting());
        }
        let done = self.umount_fs_now(false);
        self.unmounting_fs.store(false, Ordering::SeqCst);
        if done.is_err() {
            // Still mounted: its I/O waits through outages again.
            backend.inspect(|b| b.remote().resume_waiting());
        }
        done
    }

    /// Unmounts the filesystem at the user's directory (lazily: even while
    /// busy); the root part does.
    fn umount_fs_now(&self, lazy: bool) -> Result<(), MountError> {
        self.root.umount_fs(lazy)
    }

    fn disk_busy(&self) -> MountError {
        let disk = self.fuse_dir.join("disk");
        let holders = self.root.holders();
        MountError::Busy(if holders.is_empty() {
            format!("{} (open)", disk.display())
        } else {
            format!("{} (open by {})", disk.display(), holders.join(", "))
        })
    }

    /// Writes every cached byte, waiting out outages (the backend does not give up
    /// during unmount). Returns what was dropped if the lease was lost, if
    /// `unmount --discard-dirty` asked to drop what cannot be written, or if
    /// the service kept answering with errors that waiting does not end for
    /// longer than the I/O timeout (see [`Self::answered_in_vain`]).
    fn write_back(&self, cache: &Cache<Stack>) -> Option<String> {
        let mut pause = Duration::from_secs(1);
        let started = std::time::Instant::now();
        loop {
            if self.discard.load(Ordering::SeqCst) {
                // One more try without waiting through an outage; what it cannot
                // write is dropped.
                cache.backend().remote().stop_waiting();
                if cache.flush().is_ok() {
                    return None;
                }
                let msg = format!(
                    "--discard-dirty: dropped {} ({} bytes) written to the drive but not on the blob, which could not take it ({})",
                    human_bytes(cache.dirty_bytes()),
                    cache.dirty_bytes(),
                    cache
                        .backend()
                        .remote()
                        .health()
                        .last_error
                        .as_deref()
                        .unwrap_or("no answer")
                );
                error!("{msg}");
                return Some(msg);
            }
            match cache.flush() {
                Ok(()) => return None,
                Err(DeviceError::LeaseLost(e)) => {
                    let msg = format!(
                        "the lease on {} was lost, so {} written to the drive but not yet on the blob were dropped ({e})",
                        self.target,
                        human_bytes(cache.dirty_bytes())
                    );
                    error!("{msg}");
                    return Some(msg);
                }
                Err(e) if started.elapsed() >= cache.backend().remote().io_timeout() => {
                    return Some(self.answered_in_vain(cache, started, &e));
                }
                Err(e) => {
                    // Not an outage (those are waited out below this): keep the data
                    // and try again; a waiting `unmount` shows this error.
                    warn!(
                        "unmount cannot write {} yet: {e}; trying again in {} s",
                        human_bytes(cache.dirty_bytes()),
                        pause.as_secs()
                    );
                    let until = std::time::Instant::now() + pause;
                    while std::time::Instant::now() < until && !self.discard.load(Ordering::SeqCst)
                    {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

impl Mounted {
    /// What an unmount says when it gives up on writing back: the service
    /// answered, since `started`, every try with an error waiting does not
    /// end (`e`: refused, or answers that are not the ones asked for), for
    /// longer than the I/O timeout. An outage is waited out without limit
    /// (the cache holds the only copy); a service that answers cannot be, or
    /// one that refused every write for ever held an unmount for ever.
    fn answered_in_vain(
        &self,
        cache: &Cache<Stack>,
        started: std::time::Instant,
        e: &DeviceError,
    ) -> String {
        let msg = format!(
            "{} written to the drive were dropped, never put on the blob: for the {} s this unmount tried, every try ended in an error that waiting does not end: {e}",
            human_bytes(cache.dirty_bytes()),
            started.elapsed().as_secs()
        );
        error!("{msg}");
        msg
    }
}

/// The daemon's result once it took everything down: an error naming whatever
/// could not be kept, so its exit status tells.
pub(super) fn finished(losses: Vec<String>) -> Result<(), MountError> {
    if losses.is_empty() {
        return Ok(());
    }
    for l in &losses {
        error!("{l}");
    }
    Err(MountError::Data(losses.join("; ")))
}
