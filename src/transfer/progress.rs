//! Progress for people: a bar (bytes, rate, time left) on a terminal, plain lines
//! about every 10% otherwise, so logs of scripted runs stay readable.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::size::human;

pub struct Progress {
    total: u64,
    done: AtomicU64,
    bar: Option<ProgressBar>,
    started: Instant,
    last_tenth: Mutex<u64>,
    label: String,
    quiet: bool,
}

impl Progress {
    /// `total` bytes to move; `quiet` prints nothing (tests, --json).
    pub fn new(label: &str, total: u64, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            b.set_message(label.to_string());
            b
        });
        Progress {
            total,
            done: AtomicU64::new(0),
            bar,
            started: Instant::now(),
            last_tenth: Mutex::new(0),
            label: label.to_string(),
            quiet,
        }
    }

    pub fn add(&self, n: u64) {
        let done = self.done.fetch_add(n, Relaxed) + n;
        if let Some(b) = &self.bar {
            b.set_position(done);
            return;
        }
        if self.quiet || self.total == 0 {
            return;
        }
        let tenth = done * 10 / self.total;
        let mut last = self.last_tenth.lock().unwrap_or_else(|p| p.into_inner());
        if tenth > *last {
            *last = tenth;
            let secs = self.started.elapsed().as_secs_f64().max(0.001);
            let rate = done as f64 / secs;
            let left = if rate > 0.0 {
                (self.total - done.min(self.total)) as f64 / rate
            } else {
                0.0
            };
            eprintln!(
                "{}: {}% ({} of {}), {}/s, {:.0} s left",
                self.label,
                tenth * 10,
                human(done),
                human(self.total),
                human(rate as u64),
                left
            );
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
