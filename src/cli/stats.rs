//! `blobdrive stats`: a mounted drive's request and cache counters.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use blobdrive::mount::record::MountRecord;
use blobdrive::mount::warmup::WarmStatus;
use blobdrive::mount::{daemon, record};
use blobdrive::size::human;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the drive is mounted.
    pub mountpoint: PathBuf,
    /// Print one JSON object: the daemon's figures (more than the text
    /// shows), with the blob, snapshot and mountpoint.
    #[arg(long)]
    pub json: bool,
}

/// The record of the live mount at `mountpoint` (and the mountpoint as
/// recorded), or why there is none to talk to.
pub(super) fn live_mount(mountpoint: &Path) -> Result<(PathBuf, MountRecord)> {
    let (mp, rec) = record::at_mountpoint(mountpoint).map_err(anyhow::Error::msg)?;
    let Some(rec) = rec else {
        bail!("nothing is mounted by blobdrive at {}", mp.display());
    };
    if !record::alive(&rec) {
        bail!(
            "the daemon of {} (pid {}) is dead; run `blobdrive unmount {}`",
            mp.display(),
            rec.pid,
            mp.display()
        );
    }
    Ok((mp, rec))
}

pub fn run(args: Args) -> Result<()> {
    let (mp, rec) = live_mount(&args.mountpoint)?;
    let answer = daemon::control(&rec.socket, "stats", Some(Duration::from_secs(10)))?;
    let mut v: serde_json::Value = serde_json::from_str(&answer)
        .map_err(|_| anyhow::anyhow!("unexpected answer from the daemon: {answer}"))?;
    plain(&mut v);
    if !v.is_object() {
        bail!("unexpected answer from the daemon: {v}");
    }
    // What the text names the mount by, from this machine's record.
    v["blob"] = rec.blob.clone().into();
    v["snapshot"] = rec.snapshot.clone().into();
    v["mountpoint"] = mp.display().to_string().into();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let drive = match &rec.snapshot {
        Some(s) => format!("{}@{s}", rec.blob),
        None => rec.blob.clone(),
    };
    println!("drive:          {drive} at {}", mp.display());
    println!(
        "disk:           {} ({} bytes), {} allocated",
        human(n("disk_size")),
        n("disk_size"),
        human(n("allocated_bytes"))
    );
    println!(
        "lease:          {}",
        v["lease_state"].as_str().unwrap_or("?")
    );
    println!(
        "put page calls: {} ({} uploaded)",
        n("put_page_requests"),
        human(n("bytes_uploaded"))
    );
    println!(
        "get calls:      {} ({} downloaded)",
        n("get_requests"),
        human(n("bytes_downloaded"))
    );
    println!("clear calls:    {}", n("clear_requests"));
    println!("retries:        {}", n("retries"));
    println!(
        "cache:          {} hits, {} misses, {} hole reads",
        n("cache_hits"),
        n("cache_misses"),
        n("hole_reads")
    );
    println!(
        "cached:         {} of {}",
        human(n("cached_bytes")),
        human(n("cache_size"))
    );
    println!("dirty:          {}", human(n("dirty_bytes")));
    let d = &v["disk_cache"];
    if d.is_object() {
        let m = |k: &str| d[k].as_u64().unwrap_or(0);
        let state = match d["off_reason"].as_str() {
            Some(why) => format!("off ({why})"),
            None if d["warm_start"].as_bool() == Some(true) => "on, started warm".into(),
            None => "on".into(),
        };
        println!(
            "disk cache:     {state}, {}",
            d["dir"].as_str().unwrap_or("?")
        );
        println!(
            "                {} hits ({}), {} misses, {} evictions, {} checksum failures",
            m("hits"),
            human(m("hit_bytes")),
            m("misses"),
            m("evictions"),
            m("checksum_failures")
        );
        println!(
            "                {} of {} held",
            human(m("bytes")),
            human(m("size_limit"))
        );
    }
    if let Ok(w) = serde_json::from_value::<WarmStatus>(v["warm_up"].clone()) {
        println!("warm-up:        {}", w.summary());
    }
    Ok(())
}

/// Escapes every control character in the strings (keys too) of `v`: the
/// answer is the worker's word, and JSON carries an escape sequence as
/// `\u001b` to be printed raw once parsed.
fn plain(v: &mut serde_json::Value) {
    use blobdrive::azure::text::escape_controls;
    use serde_json::Value;
    match v {
        Value::String(s) => *s = escape_controls(s),
        Value::Array(items) => items.iter_mut().for_each(plain),
        Value::Object(map) => {
            let taken = std::mem::take(map);
            for (k, mut item) in taken {
                plain(&mut item);
                map.insert(escape_controls(&k), item);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hostile_answer_s_strings_are_shown_not_acted_on() {
        let mut v: serde_json::Value = serde_json::from_str(
            r#"{"lease_state": "\u001b]0;owned\u0007", "disk_cache": {"dir": ["\u009b2J"], "k\u001b": 1}}"#,
        )
        .unwrap();
        super::plain(&mut v);
        let shown = format!("{} {v:#}", v["lease_state"].as_str().unwrap());
        // (Pretty JSON has its own newlines.)
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "{shown:?}"
        );
        assert_eq!(v["lease_state"], "\\u{1b}]0;owned\\u{7}");
        assert_eq!(v["disk_cache"]["k\\u{1b}"], 1);
    }
}
