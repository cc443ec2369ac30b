//! `blobdrive list`: drives mounted on this machine.

use anyhow::Result;
use blobdrive::mount::record;
use serde_json::json;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let records = record::load_all();
    if args.json {
        let v: Vec<_> = records
            .iter()
            .map(|r| {
                json!({
                    "blob": r.blob,
                    "snapshot": r.snapshot,
                    "mountpoint": r.mountpoint,
                    "mode": r.mode,
                    "device": r.device,
                    "read_only": r.read_only,
                    "pid": r.pid,
                    "running": record::alive(r),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if records.is_empty() {
        println!("no drives mounted");
        return Ok(());
    }
    println!(
        "{:<32} {:<28} {:<6} {:<12} {:<3} {:>8}",
        "BLOB", "MOUNTPOINT", "MODE", "DEVICE", "RO", "PID"
    );
    for r in &records {
        let blob = match &r.snapshot {
            Some(s) => format!("{}@{s}", r.blob),
            None => r.blob.clone(),
        };
        let pid = if record::alive(r) {
            r.pid.to_string()
        } else {
            format!("{} (dead)", r.pid)
        };
        println!(
            "{:<32} {:<28} {:<6} {:<12} {:<3} {:>8}",
            blob,
            r.mountpoint.display(),
            r.mode.to_string(),
            r.device.as_deref().unwrap_or("-"),
            if r.read_only { "yes" } else { "no" },
            pid
        );
    }
    Ok(())
}
