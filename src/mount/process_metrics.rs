//! The daemon's own figures under the names every Prometheus process exporter
//! uses (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
//! `process_open_fds`, ...), so that the README's memory bound and a daemon
//! leaking descriptors can be watched with the usual rules and dashboards. Read
//! from `/proc/self` when a scrape comes; a figure that cannot be read is left
//! out rather than reported as 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// The collector of the daemon's process figures.
#[derive(Debug, Default)]
pub struct ProcessFigures;

/// What `/proc/self/stat` says of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    /// Seconds since boot at which the process started.
    started_after_boot: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
}

/// Parses `/proc/self/stat`: the fields after the command name (which may hold
/// spaces and parentheses, so the split is at its last `)`), with the clock
/// tick and page size of this machine.
fn parse_stat(text: &str, ticks_per_second: f64, page_size: u64) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first here; utime is field 14, stime 15,
    // starttime 22, vsize 23, rss 24.
    let f: Vec<&str> = after.split_whitespace().collect();
    let num = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
    Some(Stat {
        cpu_seconds: (num(14)? + num(15)?) as f64 / ticks_per_second,
        started_after_boot: num(22)? as f64 / ticks_per_second,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)? * page_size,
    })
}

/// The machine's boot time (Unix seconds) from `/proc/stat`'s `btime` line.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn own_stat() -> Option<Stat> {
    // SAFETY: sysconf only reads configuration values.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if ticks <= 0 || page <= 0 {
        return None;
    }
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&text, ticks as f64, page as u64)
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

fn max_fds() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim.rlim_cur)
}

impl Collector for ProcessFigures {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if let Some(s) = own_stat() {
            enc.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time the daemon spent.",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<NoLabelSet, _, u64>(&s.cpu_seconds, None)?;
            gauge(
                &mut enc,
                "process_resident_memory_bytes",
                "Resident memory of the daemon.",
                s.resident_bytes as f64,
            )?;
            gauge(
                &mut enc,
                "process_virtual_memory_bytes",
                "Virtual memory of the daemon.",
                s.virtual_bytes as f64,
            )?;
            if let Some(boot) = std::fs::read_to_string("/proc/stat")
                .ok()
                .as_deref()
                .and_then(boot_time)
            {
                gauge(
                    &mut enc,
                    "process_start_time_seconds",
                    "When the daemon started (Unix time).",
                    boot + s.started_after_boot,
                )?;
            }
        }
        if let Some(n) = open_fds() {
            gauge(
                &mut enc,
                "process_open_fds",
                "File descriptors the daemon holds open.",
                n as f64,
            )?;
        }
        if let Some(n) = max_fds() {
            gauge(
                &mut enc,
                "process_max_fds",
                "The most file descriptors the daemon may hold open.",
                n as f64,
            )?;
        }
        Ok(())
    }
}

/// The names are whole here (the standard ones carry their unit already).
fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: f64,
) -> Result<(), std::fmt::Error> {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_after_the_last_parenthesis_of_the_name() {
        // A command name with spaces and a parenthesis, as a process may set.
        let line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 9 0 1234 200000000 3000 18446744073709551615";
        let s = parse_stat(line, 100.0, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.started_after_boot, 12.34);
        assert_eq!(s.virtual_bytes, 200_000_000);
        assert_eq!(s.resident_bytes, 3000 * 4096);
        assert_eq!(parse_stat("garbage", 100.0, 4096), None);
        assert_eq!(boot_time("cpu 1 2\nbtime 1700000000\n"), Some(1.7e9));
    }

    #[test]
    fn this_process_is_measured() {
        let s = own_stat().unwrap();
        assert!(s.resident_bytes > 1 << 20, "{s:?}");
        assert!(open_fds().unwrap() >= 3);
        assert!(max_fds().unwrap() >= open_fds().unwrap());
    }
}
