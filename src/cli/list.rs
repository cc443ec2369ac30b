//! `blobdrive list`: drives mounted on this machine.

use std::time::Duration;

use anyhow::Result;
use blobdrive::mount::{daemon, record};
use blobdrive::size::human;
use serde_json::json;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
The table has a row per mount (a dead daemon's pid marked \"(dead)\": `blobdrive unmount
MOUNTPOINT` cleans up after it), then a line per Kubernetes CSI node plugin that ran on
this machine: its cache budget and what its volumes take of it. --json prints the same as
one array: an object per mount (kind \"mount\"), then one per node plugin (kind
\"csi_node\": node_id, cache_budget, cache_taken, volumes).")]
pub struct Args {
    /// Print a JSON array instead of a table (see below).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    record::check_readable().map_err(anyhow::Error::msg)?;
    let records = record::load_all();
    let sizes: Vec<Option<u64>> = records.iter().map(disk_size).collect();
    let nodes = blobdrive::csi::cache_budgets_here();
    if args.json {
        let mut v: Vec<_> = records
            .iter()
            .zip(&sizes)
            .map(|(r, size)| {
                json!({
                    "kind": "mount",
                    "blob": r.blob,
                    "auth": r.auth,
                    "snapshot": r.snapshot,
                    "mountpoint": r.mountpoint,
                    "mode": r.mode,
                    "disk_size": size,
                    "device": r.device,
                    "read_only": r.read_only,
                    "cache_size": r.cache_size,
                    "worker_uid": r.worker_uid,
                    "pid": r.pid,
                    "running": record::alive(r),
                })
            })
            .collect();
        for n in &nodes {
            let mut node = serde_json::to_value(n)?;
            node["kind"] = "csi_node".into();
            v.push(node);
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if records.is_empty() {
        println!("no drives mounted");
    } else {
        print!("{}", table(&rows(&records, &sizes)));
    }
    for n in &nodes {
        println!("{n}");
    }
    Ok(())
}

/// The table's rows: a header, then one per mount.
fn rows(records: &[record::MountRecord], sizes: &[Option<u64>]) -> Vec<[String; 10]> {
    let mut rows = vec![[
        "BLOB",
        "MOUNTPOINT",
        "MODE",
        "SIZE",
        "DEVICE",
        "RO",
        "CACHE",
        "UID",
        "AUTH",
        "PID",
    ]
    .map(String::from)];
    for (r, size) in records.iter().zip(sizes) {
        let blob = match &r.snapshot {
            Some(s) => format!("{}@{s}", r.blob),
            None => r.blob.clone(),
        };
        let pid = if record::alive(r) {
            r.pid.to_string()
        } else {
            format!("{} (dead)", r.pid)
        };
        rows.push([
            blob,
            r.mountpoint.display().to_string(),
            r.mode.to_string(),
            size.map_or_else(|| "-".to_string(), human),
            r.device.as_deref().unwrap_or("-").to_string(),
            if r.read_only { "yes" } else { "no" }.to_string(),
            r.cache_size.map_or_else(|| "-".to_string(), human),
            r.worker_uid
                .map_or_else(|| "-".to_string(), |u| u.to_string()),
            if r.auth.is_empty() { "-" } else { &r.auth }.to_string(),
            pid,
        ]);
    }
    rows
}

/// The disk size a running daemon serves now (it changes when the drive is grown
/// while mounted), from its `stats`; `None` for a dead or silent one.
fn disk_size(r: &record::MountRecord) -> Option<u64> {
    if !record::alive(r) {
        return None;
    }
    let answer = daemon::control(&r.socket, "stats", Some(Duration::from_secs(2))).ok()?;
    serde_json::from_str::<serde_json::Value>(&answer).ok()?["disk_size"].as_u64()
}

/// Columns as wide as their widest cell, two spaces apart; the last (PID) is
/// right-aligned and no line has trailing blanks.
fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i] - cell.chars().count();
            if i == N - 1 {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn columns_fit_long_mountpoints() {
        let long = "/mnt/a/very/long/path/to/where/the/drive/is/mounted".to_string();
        let rows = [
            ["BLOB", "MOUNTPOINT", "PID"].map(String::from),
            ["disks/a.vhd".into(), long.clone(), "12345 (dead)".into()],
            ["d/b.vhd".into(), "/m".into(), "7".into()],
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        // Every column starts at the same offset on every line.
        let col = lines[1].find(&long).unwrap();
        assert_eq!(lines[0].find("MOUNTPOINT"), Some(col));
        assert_eq!(lines[2].find("/m"), Some(col));
        assert_eq!(lines[1].len(), lines[2].len());
        assert!(lines[0].ends_with("         PID"), "{t}");
        assert!(lines[2].ends_with(" 7"), "{t}");
    }
}
