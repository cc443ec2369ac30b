//! What `blobdrive mount` says once the drive is ready: a line of text (and
//! what it made, warned and noted on standard error), or the same as one JSON
//! object with `--json`.

use blobdrive::mount::{Mode, Ready};

use super::Say;

/// Says that the drive `blob` is ready as `say` asks. Warnings always go to
/// standard error; with JSON they are in the object too.
pub fn say_ready(ready: &Ready, blob: &str, say: Say) {
    for w in &ready.warnings {
        eprintln!("warning: {w}");
    }
    match say {
        Say::Mounted => print_text(ready, blob),
        Say::Json => println!("{}", json(ready, blob)),
        Say::Quiet => ready.notes.iter().for_each(|n| eprintln!("{n}")),
    }
}

fn print_text(ready: &Ready, blob: &str) {
    for n in &ready.notes {
        eprintln!("{n}");
    }
    let ro = if ready.read_only { " read-only" } else { "" };
    match ready.mode {
        Mode::Fs => {
            if ready.formatted {
                eprintln!(
                    "created a new {} filesystem on {blob}",
                    ready.fstype.as_deref().unwrap_or("")
                );
            }
            println!(
                "mounted {blob} at {} ({}{ro} on {})",
                ready.mountpoint.display(),
                ready.fstype.as_deref().unwrap_or("?"),
                ready.device.as_deref().unwrap_or("?")
            );
        }
        Mode::Block => {
            eprintln!(
                "{blob} attached{ro}; FUSE files in {}",
                ready.fuse_dir.display()
            );
            println!("{}", ready.device.as_deref().unwrap_or("?"));
        }
        Mode::Raw => {
            eprintln!("{blob} served{ro}");
            println!("{}", ready.fuse_dir.join("disk").display());
        }
    }
}

/// The facts the text tells, as one object: the filesystem (fs), the loop
/// device (fs, block), the FUSE directory and its `disk` file, whether a
/// filesystem was made, and the warnings and notes.
fn json(ready: &Ready, blob: &str) -> String {
    let v = serde_json::json!({
        "blob": blob,
        "mountpoint": ready.mountpoint,
        "mode": ready.mode,
        "read_only": ready.read_only,
        "fstype": ready.fstype,
        "formatted": ready.formatted,
        "device": ready.device,
        "fuse_dir": ready.fuse_dir,
        "disk": ready.fuse_dir.join("disk"),
        "pid": ready.pid,
        "warnings": ready.warnings,
        "notes": ready.notes,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}
