//! `blobdrive lease status|break`: the lock a writable mount holds.
//!
//! These work on any page blob, valid VHD or not: breaking the lease of a damaged
//! drive must stay possible.

use anyhow::{bail, Result};
use blobdrive::azure::BlobClient;
use blobdrive::drive;
use serde::Serialize;

use super::Context;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Show whether the drive is leased (mounted writable somewhere).
    Status {
        /// The drive (container/name.vhd).
        blob: String,
        /// Print {"state":..,"duration":..} instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Break the lease left by a dead host so the drive can be mounted again.
    ///
    /// Only do this when the host holding the lease is really gone: a live daemon
    /// stops writing the moment its lease is broken, and any data it had not yet
    /// flushed is lost.
    Break {
        /// The drive (container/name.vhd).
        blob: String,
        /// Seconds (0-60) the current holder keeps the lease before it breaks;
        /// default: at once.
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(0..=60))]
        period: Option<u32>,
    },
}

#[derive(Debug, Serialize)]
struct Status {
    state: String,
    duration: Option<String>,
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
                println!("{}", serde_json::to_string(&Status { state, duration })?);
            } else {
                match duration {
                    Some(d) => println!("{r}: {state} ({d})"),
                    None => println!("{r}: {state}"),
                }
            }
            Ok(())
        }
        Command::Break { blob, period } => {
            let (r, client) = ctx.blob(&blob)?;
            if r.snapshot.is_some() {
                bail!("snapshots have no lease; name the base blob ({})", r.base());
            }
            ctx.block_on(break_lease(&client, &r.to_string(), period))?
        }
    }
}

/// How often the drive is read again and the break sent again when the drive
/// keeps changing between the two (the last writes of its holder landing).
const BREAK_ROUNDS: usize = 3;

/// Breaks the lease of `client`'s drive (named `r` in messages), each break sent on
/// the condition of the drive as just read: a copy of it that the service carries
/// out late, after a mount took the drive anew, is refused instead of breaking
/// that mount's lease. When an attempt went unanswered, the sequence number is
/// raised once the lease is broken, so that the ETag has moved on before anyone
/// can take the lease again.
async fn break_lease(client: &BlobClient, r: &str, period: Option<u32>) -> Result<()> {
    let mut round = 0;
    let broken = loop {
        round += 1;
        let p = drive::properties(client).await?;
        drive::check_page_blob(client, &p)?;
        let state = p.lease_state.as_deref().unwrap_or("available");
        if matches!(state, "available" | "broken" | "expired") {
            println!("{r}: no active lease (state: {state}); nothing changed");
            return Ok(());
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
            println!(
                "{r}: lease breaking; waiting {left} s for it to break (a request that got no answer must be fenced off)"
            );
            tokio::time::sleep(std::time::Duration::from_secs(left.into())).await;
        }
        client.increment_sequence_number(None).await?;
        println!("{r}: lease broken; the drive can be mounted again");
    } else if left == 0 {
        println!("{r}: lease broken; the drive can be mounted again");
    } else {
        println!("{r}: lease breaking; it will be broken in {left} s");
    }
    Ok(())
}
