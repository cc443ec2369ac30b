//! Growing a drive: the page blob grows to the new size plus its footer, the
//! footer is written at the new end and the old one cleared.
//!
//! A crash or an interrupt can come between any two steps, so the steps are
//! ordered, each can be done again without harm, and the blob says a resize is
//! under way from the first step to the last: metadata `blobdrive_resize=FROM:TO`.
//! While it is there, every command that opens the drive (`info`, `mount`, ...)
//! refuses it, naming the `resize` that completes it, and running that `resize`
//! again picks up where the first one stopped.
//!
//! Nothing else may write the blob meanwhile: a drive mounted nowhere is grown
//! under a short lease of its own (60 s, [`grow`]); a mounted drive by its daemon,
//! under the mount's lease and write fence (`mount::daemon`'s resize, which runs
//! each [`Growth`] step itself and then grows what is above the blob).

use std::sync::Arc;

use crate::azure::{BlobClient, WriteFence};
use crate::drive::{self, resize_pending, Drive, DriveError, RESIZE_MARKER};
use crate::vhd::{self, Footer, Geometry, FOOTER_SIZE};

/// How long the resize's lease lasts (renewed by nothing: the steps take a
/// few requests).
const LEASE_SECS: u32 = 60;

/// The steps of a resize, in the order they are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Record `FROM:TO` in the metadata.
    Mark,
    /// Set the blob's length to TO + 512: the grown part reads as zeros.
    Grow,
    /// Write the footer for TO at the new end.
    Footer,
    /// Clear the old footer's page (now inside the disk: it must read as zeros).
    ClearOld,
    /// Remove the mark.
    Unmark,
}

pub const STEPS: [Step; 5] = [
    Step::Mark,
    Step::Grow,
    Step::Footer,
    Step::ClearOld,
    Step::Unmark,
];

/// What a resize did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resized {
    Grown {
        from: u64,
        to: u64,
    },
    /// The drive already had that size.
    Unchanged(u64),
}

/// What growing a drive to a size takes, learnt from the blob: nothing (it has
/// that size), or the steps from one size to the other.
pub enum Plan {
    Unchanged(u64),
    Grow(Growth),
}

/// A grow from `from` to `to` bytes of disk, begun or not.
pub struct Growth {
    pub from: u64,
    pub to: u64,
    /// The metadata the blob carries besides the mark: kept as it is.
    others: Vec<(String, String)>,
    /// The blob's ETag when the plan was made: the lease is taken only while it
    /// holds, so the plan is the blob's under the lease, and a copy of the acquire
    /// that lands after the first step changed the blob is refused.
    etag: Option<String>,
}

/// Checks that `blob` can grow to a disk of `size` bytes and says what it takes:
/// a drive with a resize under way continues it (to that size only), a smaller
/// size is refused. Reads only.
pub async fn plan(blob: &BlobClient, size: u64) -> Result<Plan, DriveError> {
    let target = blob.target();
    let props = drive::properties(blob).await?;
    drive::check_page_blob(blob, &props)?;
    let etag = props.etag.clone();
    let others = props
        .metadata
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case(RESIZE_MARKER))
        .cloned()
        .collect();
    let from = match resize_pending(&props) {
        Some((from, to)) if to == size => from,
        Some((from, to)) => return Err(DriveError::ResizeIncomplete { target, from, to }),
        None => {
            let from = Drive::from_properties(blob, props).await?.disk_size();
            if size < from {
                return Err(DriveError::Shrink {
                    target,
                    from,
                    to: size,
                });
            }
            if size == from {
                return Ok(Plan::Unchanged(size));
            }
            from
        }
    };
    vhd::check_disk_size(size).map_err(|source| DriveError::Vhd {
        target: target.clone(),
        source,
    })?;
    Ok(Plan::Grow(Growth {
        from,
        to: size,
        others,
        etag,
    }))
}

/// Grows the drive `blob` to a disk of `size` bytes (see the module's text).
pub async fn grow(blob: &BlobClient, size: u64) -> Result<Resized, DriveError> {
    grow_steps(blob, size, STEPS.len()).await
}

/// [`grow`], stopping after the first `steps` steps: what a crash between two
/// steps leaves, for tests.
#[doc(hidden)]
pub async fn grow_steps(blob: &BlobClient, size: u64, steps: usize) -> Result<Resized, DriveError> {
    let growth = match plan(blob, size).await? {
        Plan::Unchanged(s) => return Ok(Resized::Unchanged(s)),
        Plan::Grow(g) => g,
    };
    let lease = drive::short_lease(blob, LEASE_SECS, growth.etag.as_deref(), "resized").await?;
    let fence = WriteFence::new(blob.clone(), Some(lease.clone()));
    let mut done = Ok(());
    for step in STEPS.iter().take(steps) {
        done = growth.run(blob, *step, &lease, &fence).await;
        if done.is_err() {
            break;
        }
    }
    let released = blob.release_lease(&lease).await;
    done?;
    released?;
    Ok(Resized::Grown {
        from: growth.from,
        to: size,
    })
}

impl Growth {
    /// Carries out one step under `lease`, the old footer's clear fenced by
    /// `fence`. A mounted drive's daemon runs them with its own lease and fence,
    /// its writes to the blob paused for [`Step::Grow`].
    pub async fn run(
        &self,
        blob: &BlobClient,
        step: Step,
        lease: &str,
        fence: &Arc<WriteFence>,
    ) -> Result<(), DriveError> {
        let (from, to) = (self.from, self.to);
        let others: Vec<(&str, &str)> = self
            .others
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match step {
            Step::Mark => {
                let mark = format!("{from}:{to}");
                let mut with = others;
                with.push((RESIZE_MARKER, &mark));
                blob.set_metadata(&with, Some(lease)).await?;
            }
            // Conditional on the blob as it is now: an attempt given up on and
            // carried out after the footer was written (which changes the ETag)
            // is refused, instead of cutting a blob grown further since back to
            // this length. The footer is fenced like the clear below (a copy
            // landing after a further grow would put it where the disk has data
            // by then); a late mark makes the drive refused until the resize
            // runs again.
            Step::Grow => {
                let props = blob.properties().await?;
                if props.content_length != to + FOOTER_SIZE {
                    blob.resize(to + FOOTER_SIZE, Some(lease), props.etag.as_deref())
                        .await?;
                }
            }
            Step::Footer => {
                let footer = new_footer(blob, from, to).await?;
                blob.put_pages_fenced(to, footer.to_bytes().to_vec().into(), Some(lease), fence)
                    .await?;
            }
            // A clear given up on and carried out once the drive is in use again
            // would zero what was written there since: it is fenced (see
            // `WriteFence`), which holds while the same lease lives on (a mounted
            // drive's), and offline the resize's lease is released before
            // anything else can write.
            Step::ClearOld => {
                blob.clear_pages_fenced(from, FOOTER_SIZE, Some(lease), fence)
                    .await?
            }
            Step::Unmark => blob.set_metadata(&others, Some(lease)).await?,
        }
        Ok(())
    }
}

/// The footer for a disk of `to` bytes: the old footer's (at `from`) with the
/// new size and the geometry `create` writes, or the one already at the new end
/// when an earlier run wrote it (the old one may be cleared by then).
async fn new_footer(blob: &BlobClient, from: u64, to: u64) -> Result<Footer, DriveError> {
    let vhd_err = |source| DriveError::Vhd {
        target: blob.target(),
        source,
    };
    let at_end = blob.read(to, FOOTER_SIZE).await?;
    if let Ok(f) = Footer::parse_fixed_for_blob(&at_end, to + FOOTER_SIZE) {
        return Ok(f);
    }
    let old = blob.read(from, FOOTER_SIZE).await?;
    let old = Footer::parse_fixed_for_blob(&old, from + FOOTER_SIZE).map_err(vhd_err)?;
    Ok(Footer {
        current_size: to,
        geometry: Geometry::MAX,
        ..old
    })
}
