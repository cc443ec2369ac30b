//! `blobdrive lease status|break`: the lock a writable mount holds.
//!
//! These work on any page blob, valid VHD or not: breaking the lease of a damaged
//! drive must stay possible.

use anyhow::{bail, Result};
use blobdrive::azure::BlobClient;
use blobdrive::drive;
use blobdrive::mount::record;
use serde::Serialize;

use super::Context;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Show whether the drive is leased (mounted writable somewhere).
    Status {
        /// The drive (container/name.vhd).
        blob: String,
        /// Print {"blob":..,"state":..,"duration":..} instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Break the lease left by a dead host so the drive can be mounted again.
    ///
    /// Only do this when the host holding the lease is really gone: a live daemon
    /// stops writing the moment its lease is broken, and any data it had not yet
    /// flushed is lost. A drive mounted writable on this machine is refused (unmount
    /// it instead), and so is any break by a user who cannot see this machine's
    /// mounts (run it as root); a leased drive is broken only with --yes.
    Break {
        /// The drive (container/name.vhd).
        blob: String,
        /// Seconds (0-60) the current holder keeps the lease before it breaks;
        /// default: at once.
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(0..=60))]
        period: Option<u32>,
        /// Break a lease that is held: its holder, if alive, loses every write it
        /// has not yet put on the blob, and each later write fails.
        #[arg(long)]
        yes: bool,
        /// Print one JSON object instead of text: blob, state (after: broken,
        /// breaking, or the state left as it was), seconds_left (until a
        /// breaking lease is broken; null otherwise) and changed (whether a
        /// lease was broken).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Serialize)]
struct Status {
    blob: String,
    state: String,
    duration: Option<String>,
}

/// What `lease break` did, as its text and its JSON say it.
#[derive(Debug, Serialize)]
struct Broken {
    blob: String,
    /// broken, breaking, or the state found when there was no lease to break.
    state: String,
    /// Seconds until a breaking lease is broken (none once broken).
    seconds_left: Option<u32>,
    /// Whether a lease was broken (or set breaking).
    changed: bool,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.blob;
        match (self.changed, self.seconds_left) {
            (false, _) => write!(
                f,
                "{r}: no active lease (state: {}); nothing changed",
                self.state
            ),
            (true, Some(left)) if left > 0 => {
                write!(f, "{r}: lease breaking; it will be broken in {left} s")
            }
            (true, _) => write!(f, "{r}: lease broken; the drive can be mounted again"),
        }
    }
}

pub fn run(ctx: &Context, cmd: Command) -> Result<()> {
    match cmd {
        Command::Status { blob, json } => {
            let (r, client) = ctx.blob(&blob)?;
            if r.snapshot.is_some() {
                bail!("snapshots have no lease; name the base blob ({})", r.base());
            }
            let props = ctx.block_on(async {
                let p = drive::properties(&client).await?;
                drive::check_page_blob(&client, &p)?;
                anyhow::Ok(p)
            })??;
            let state = props.lease_state.unwrap_or_else(|| "available".into());
            let duration = props.lease_duration.filter(|_| state == "leased");
            if json {
                let blob = r.to_string();
                let status = Status {
                    blob,
                    state,
                    duration,
                };
                println!("{}", serde_json::to_string(&status)?);
            } else {
                match duration {
                    Some(d) => println!("{r}: {state} ({d})"),
                    None => println!("{r}: {state}"),
                }
            }
            Ok(())
        }
        Command::Break {
            blob,
            period,
            yes,
            json,
        } => {
            let (r, client) = ctx.blob(&blob)?;
            if r.snapshot.is_some() {
                bail!("snapshots have no lease; name the base blob ({})", r.base());
            }
            let endpoint = client.service().account().endpoint_for_messages();
            refuse_if_mounted_here(&endpoint, &r.to_string())?;
            let done = ctx.block_on(break_lease(&client, &r.to_string(), period, yes))??;
            if json {
                return super::print_json(&serde_json::to_value(&done)?);
            }
            println!("{done}");
            Ok(())
        }
    }
}

/// Refuses to break the lease of a drive that a daemon of this machine holds: its
/// mount would lose what it has not yet written and fail every later write, when
/// `unmount` writes everything and gives the lease back. A dead daemon's mount is
/// cleaned up by `unmount` too, which then says whether the lease still needs
/// breaking. No `--yes` overrides this: the mount is right here. Nor is the break
/// made when this machine's mounts cannot be seen (a user other than root cannot
/// read the run directory): a warning there was followed by a break that cost a
/// mount here its writes.
fn refuse_if_mounted_here(endpoint: &str, blob: &str) -> Result<()> {
    if let Err(e) = record::check_readable() {
        bail!(
            "cannot tell whether {blob} is mounted writable on this machine, whose mount would lose its writes to a break: {e}. Nothing was broken"
        );
    }
    let Some(m) = record::writable_mount(endpoint, blob) else {
        return Ok(());
    };
    let mp = m.mountpoint.display();
    if record::alive(&m) {
        bail!(
            "{blob} is mounted writable on this machine at {mp}: breaking its lease would make that mount lose the writes it has not yet put on the blob and fail every later one; run `blobdrive unmount {mp}` instead, which writes everything and gives the lease back. Nothing was broken"
        );
    }
    bail!(
        "{blob} was mounted writable on this machine at {mp} and its daemon (pid {}) is dead; run `blobdrive unmount {mp}` first: it cleans up and says whether the lease still needs breaking. Nothing was broken",
        m.pid
    )
}

/// The refusal of a break of a held lease without `--yes`: what the holder loses.
fn needs_yes(r: &str, state: &str, duration: Option<&str>, period: Option<u32>) -> String {
    let held = match (state, duration) {
        ("breaking", _) => "its lease is already breaking".to_string(),
        (_, Some(d)) => format!("it is leased ({d})"),
        _ => "it is leased".to_string(),
    };
    let when = match period {
        Some(p) if p > 0 => format!("in {p} s"),
        _ => "at once".to_string(),
    };
    format!(
        "{r}: {held}, by a writable mount on another machine or a resize under way. Breaking it fences that holder {when}: every write it has not yet put on the blob is lost and each later one fails with an I/O error. If its host is really gone, run `blobdrive lease break {r} --yes`. Nothing was broken"
    )
}

/// How often the drive is read again and the break sent again when the drive
/// keeps changing between the two (the last writes of its holder landing).
const BREAK_ROUNDS: usize = 3;

/// Breaks the lease of `client`'s drive (named `r` in messages), each break sent on
/// the condition of the drive as just read: a copy of it that the service carries
/// out late, after a mount took the drive anew, is refused instead of breaking
/// that mount's lease. When an attempt went unanswered, the sequence number is
/// raised once the lease is broken, so that the ETag has moved on before anyone
/// can take the lease again. A held lease is broken only when `yes`.
async fn break_lease(
    client: &BlobClient,
    r: &str,
    period: Option<u32>,
    yes: bool,
) -> Result<Broken> {
    let outcome = |state: &str, seconds_left, changed| Broken {
        blob: r.to_string(),
        state: state.to_string(),
        seconds_left,
        changed,
    };
    let mut round = 0;
    let broken = loop {
        round += 1;
        let p = drive::properties(client).await?;
        drive::check_page_blob(client, &p)?;
        let state = p.lease_state.as_deref().unwrap_or("available");
        if matches!(state, "available" | "broken" | "expired") {
            return Ok(outcome(state, None, false));
        }
        if !yes {
            bail!(needs_yes(r, state, p.lease_duration.as_deref(), period));
        }
        match client.break_lease_if_match(period, p.etag.as_deref()).await {
            // Written since it was read: a dead host's last requests can still
            // land for a while; a live holder keeps writing.
            Err(e) if e.is_changed_since_read() && round < BREAK_ROUNDS => {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) if e.is_changed_since_read() => bail!(
                "{r} kept changing while its lease was being broken ({BREAK_ROUNDS} tries): its holder is writing it; is it really dead? Nothing was broken"
            ),
            got => break got?,
        }
    };
    let left = broken.seconds_left;
    if broken.earlier_attempt_unanswered {
        // Once the lease is broken a write needs no lease id.
        if left > 0 {
            eprintln!(
                "{r}: lease breaking; waiting {left} s for it to break (a request that got no answer must be fenced off)"
            );
            tokio::time::sleep(std::time::Duration::from_secs(left.into())).await;
        }
        client.increment_sequence_number(None).await?;
        return Ok(outcome("broken", None, true));
    }
    Ok(if left == 0 {
        outcome("broken", None, true)
    } else {
        outcome("breaking", Some(left), true)
    })
}
