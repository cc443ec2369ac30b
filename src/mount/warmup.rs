//! A warm-up's figures (`blobdrive warm`, `mount --warm`): what the daemon
//! keeps as it goes, what `stats`, the metrics and the `warm` command's
//! progress lines show of it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::azure::text::escape_controls;
use crate::size::human;

/// Who started a warm-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// `blobdrive warm`.
    #[default]
    Command,
    /// `mount --warm` (fstab `warm`, a CSI volume's `warmUp`).
    Mount,
}

/// One warm-up as it stands: running, or how the last one ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmStatus {
    pub running: bool,
    pub started_by: Origin,
    /// Bytes of allocated pages on the drive.
    pub allocated: u64,
    /// Of them, bytes gone through: fetched, found cached, or skipped.
    pub done: u64,
    /// Bytes read from the storage service.
    pub fetched: u64,
    /// Bytes the disk cache held already.
    pub already_cached: u64,
    /// Allocated bytes left out because the disk cache has no room for them.
    pub skipped: u64,
    pub seconds: f64,
    /// `--max-rate`, in bytes a second.
    pub max_rate: Option<u64>,
    /// Stopped before the end (Ctrl-C, an unmount).
    pub stopped: bool,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

impl WarmStatus {
    /// One line saying where a warm-up stands (for `warm` and `stats`), its
    /// reason escaped: the figures come from the daemon, whose words are
    /// hostile to whoever reads them.
    pub fn summary(&self) -> String {
        let s = self;
        let figures = format!(
            "{} fetched, {} cached already, {} skipped{}",
            human(s.fetched),
            human(s.already_cached),
            human(s.skipped),
            if s.skipped > 0 {
                " (no room left in the disk cache)"
            } else {
                ""
            }
        );
        let pct = (s.done * 100).checked_div(s.allocated).unwrap_or(100);
        match (&s.error, s.running, s.stopped) {
            (Some(e), _, _) => format!(
                "failed after {:.1} s ({}); {figures}",
                s.seconds,
                escape_controls(e)
            ),
            (None, true, _) => format!(
                "running, {pct}% of {} allocated gone through, {figures}, {:.0} s so far",
                human(s.allocated),
                s.seconds
            ),
            (None, false, true) => format!(
                "stopped at {pct}% of {} allocated after {:.1} s: {figures}",
                human(s.allocated),
                s.seconds
            ),
            (None, false, false) => format!(
                "done, {} allocated in {:.1} s: {figures}",
                human(s.allocated),
                s.seconds
            ),
        }
    }
}

/// The daemon's account of its warm-ups: the current (or last) one, and the
/// bytes all of them fetched.
#[derive(Debug, Default)]
pub struct Warming {
    /// `None` before the first warm-up; the time is when it began.
    current: Mutex<Option<(WarmStatus, Instant)>>,
    fetched_total: AtomicU64,
}

impl Warming {
    /// Changes the current warm-up's figures (if there is one).
    fn update(&self, f: impl FnOnce(&mut WarmStatus, Instant)) {
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((s, began)) = c.as_mut() {
            f(s, *began);
        }
    }

    /// Starts the account of a new warm-up, unless one runs.
    pub fn begin(&self, started_by: Origin, max_rate: Option<u64>) -> bool {
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if c.as_ref().is_some_and(|(s, _)| s.running) {
            return false;
        }
        let status = WarmStatus {
            running: true,
            started_by,
            max_rate,
            ..WarmStatus::default()
        };
        *c = Some((status, Instant::now()));
        true
    }

    /// The plan is known: `allocated` bytes, `skipped` of them left out.
    pub fn planned(&self, allocated: u64, skipped: u64) {
        self.update(|s, _| {
            s.allocated = allocated;
            s.skipped = skipped;
            s.done = skipped;
        });
    }

    /// A piece of the plan done: `allocated` bytes of it, `fetched` read from
    /// the service, `held` found in the cache.
    pub fn progressed(&self, allocated: u64, fetched: u64, held: u64) {
        self.fetched_total.fetch_add(fetched, Relaxed);
        self.update(|s, _| {
            s.done += allocated;
            s.fetched += fetched;
            s.already_cached += held;
        });
    }

    /// The warm-up is over: `stopped` early, or failed with `error`.
    pub fn end(&self, stopped: bool, error: Option<String>) {
        self.update(|s, began| {
            s.seconds = began.elapsed().as_secs_f64();
            s.running = false;
            s.stopped = stopped;
            s.error = error;
        });
    }

    /// The current warm-up's figures (the last one's once it ended); `None`
    /// before the first.
    pub fn status(&self) -> Option<WarmStatus> {
        let c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        c.as_ref().map(|(s, began)| {
            let mut now = s.clone();
            if now.running {
                now.seconds = began.elapsed().as_secs_f64();
            }
            now
        })
    }

    /// Bytes every warm-up of the mount fetched.
    pub fn fetched_total(&self) -> u64 {
        self.fetched_total.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warm_up_at_a_time_and_its_figures_add_up() {
        let w = Warming::default();
        assert_eq!(w.status(), None);
        assert!(w.begin(Origin::Mount, None));
        assert!(!w.begin(Origin::Command, Some(1)), "one runs already");
        w.planned(100, 10);
        w.progressed(60, 40, 20);
        let s = w.status().unwrap();
        assert!(s.running);
        assert_eq!((s.done, s.fetched, s.already_cached), (70, 40, 20));
        w.end(true, None);
        let s = w.status().unwrap();
        assert!(!s.running && s.stopped && s.started_by == Origin::Mount);
        assert!(w.begin(Origin::Command, Some(5)));
        w.progressed(1, 1, 0);
        assert_eq!(w.status().unwrap().fetched, 1);
        assert_eq!(w.fetched_total(), 41);
    }

    #[test]
    fn a_reason_from_the_daemon_is_shown_escaped() {
        let s = WarmStatus {
            allocated: 100,
            done: 50,
            error: Some("\x1b]0;owned\x07bad".into()),
            ..WarmStatus::default()
        };
        let line = s.summary();
        assert!(!line.contains('\x1b') && !line.contains('\x07'), "{line}");
        assert!(line.contains("\\u{1b}]0;owned"), "{line}");
        let running = WarmStatus {
            running: true,
            allocated: 200,
            done: 50,
            ..WarmStatus::default()
        };
        assert!(running.summary().starts_with("running, 25% of 200 bytes"));
    }
}
