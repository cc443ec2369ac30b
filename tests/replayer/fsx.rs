//! fsx on the first part of a raw drive, its every operation timed: fsx prints
//! each one (`-v`) before doing it, and its standard error is read as it comes,
//! so each line is known to have been printed between two moments on the
//! recorder's clock. An fsync had returned once the next line was printed.
//!
//! What fsx had written when an fsync began is fsx itself run again, with the
//! same seed, to that step, on a local file: its image then. A crash after that
//! fsync returned must leave that image in every sector no later operation (one
//! whose line could have been printed before the crash) touched.
//!
//! The drive's fsx is on a raw disk file in blockmode: fsx zeroes its part first,
//! and never changes the file's size.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::util::fsx_bin;
use crate::recorder::Clock;

use super::bytes::SECTOR;

/// Reads and writes of up to 1 MiB at any byte offset of the first `flen` bytes
/// (never the size), through pread/pwrite, mmap, sendfile and copy_file_range,
/// with hole punching (discards) and fsync among them.
fn config(flen: u64) -> String {
    format!(
        "blockmode = true\nnosizechecks = true\nflen = {flen}\n[opsize]\nmax = 1048576\nalign = 1\n[weights]\nread = 6\nwrite = 10\nmapread = 3\nmapwrite = 5\ninvalidate = 1\nfsync = 3\nfdatasync = 2\npunch_hole = 3\nsendfile = 1\nposix_fadvise = 1\ncopy_file_range = 2\nclose_open = 0\ntruncate = 0\nposix_fallocate = 0\n"
    )
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// fsync or fdatasync.
    Sync,
    /// Bytes `a..b` changed.
    Change(u64, u64),
    /// Nothing written.
    Read,
}

/// One operation, printed between `lo` and `hi`.
#[derive(Debug, Clone)]
struct Step {
    n: u64,
    kind: Kind,
    lo: Duration,
    hi: Duration,
}

/// What fsx's line says it does (an operation not known here counts as
/// changing everything).
fn parse(line: &str, flen: u64) -> Option<(u64, Kind)> {
    let rest = line.split_once(']').map_or(line, |(_, r)| r);
    let mut words = rest.split_whitespace();
    let n = words.next()?.parse().ok()?;
    let op = words.next()?;
    let hex = |w: &str| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok();
    let nums: Vec<u64> = rest
        .split(|c: char| c.is_whitespace() || "[]:=>().".contains(c))
        .filter(|w| w.starts_with("0x"))
        .filter_map(hex)
        .collect();
    let kind = match op {
        "fsync" | "fdatasync" => Kind::Sync,
        "read" | "mapread" | "sendfile" | "msync(MS_INVALIDATE)" | "posix_fadvise" => Kind::Read,
        "write" | "mapwrite" | "punch_hole" => Kind::Change(*nums.first()?, nums.get(1)? + 1),
        "copy_file_range" => Kind::Change(*nums.get(2)?, nums.get(3)? + 1),
        _ => Kind::Change(0, flen),
    };
    Some((n, kind))
}

pub struct FsxRun {
    steps: Vec<Step>,
    /// When fsx had exited.
    end: Duration,
    flen: u64,
    seed: u64,
    ops: u64,
    dir: PathBuf,
}

impl FsxRun {
    /// Runs fsx (`ops` operations, `seed`) on the first `flen` bytes of
    /// `file`, which must end well; `dir` takes its artifacts.
    pub fn run(file: &Path, flen: u64, ops: u64, seed: u64, clock: Clock, dir: &Path) -> FsxRun {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("fsx.toml"), config(flen)).unwrap();
        let mut child = fsx(dir, ops, seed, file)
            .arg("-v")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fsx");
        let mut err = child.stderr.take().unwrap();
        let (mut steps, mut text) = (Vec::new(), String::new());
        let (mut pending, mut floor) = (String::new(), clock.now());
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let called = clock.now();
            let n = err.read(&mut buf).unwrap_or(0);
            let hi = clock.now();
            if n == 0 {
                break;
            }
            pending.push_str(&String::from_utf8_lossy(&buf[..n]));
            while let Some(nl) = pending.find('\n') {
                let line: String = pending.drain(..=nl).collect();
                if let Some((n, kind)) = parse(&line, flen) {
                    steps.push(Step {
                        n,
                        kind,
                        lo: floor,
                        hi,
                    });
                } else if text.len() < 8000 {
                    text.push_str(&line);
                }
            }
            // A read that filled the buffer may have left older lines behind.
            if n < buf.len() {
                floor = called;
            }
        }
        let out = child.wait_with_output().unwrap();
        let end = clock.now();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("All operations completed A-OK!"),
            "fsx on {} (seed {seed}) failed:\n{said}{text}",
            file.display()
        );
        FsxRun {
            steps,
            end,
            flen,
            seed,
            ops,
            dir: dir.to_path_buf(),
        }
    }

    /// When each fsync had surely returned (the next line was printed).
    fn synced(&self) -> Vec<(u64, Duration)> {
        self.steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == Kind::Sync)
            .map(|(i, s)| (s.n, self.steps.get(i + 1).map_or(self.end, |n| n.hi)))
            .collect()
    }

    pub fn sync_points(&self) -> Vec<Duration> {
        self.synced().into_iter().map(|(_, t)| t).collect()
    }

    /// What `disk` lost of fsx's bytes (its first `flen`), a state in which
    /// fsx's last fsync that returned by `settled` holds and no operation begun
    /// after `begun` landed: fsx's image at that fsync (from `oracle`) in every
    /// sector no later operation touched.
    pub fn lost_between(
        &self,
        settled: Duration,
        begun: Duration,
        disk: &[u8],
        oracle: &mut Oracle,
    ) -> Vec<String> {
        let Some(k) = self
            .synced()
            .into_iter()
            .filter(|(_, at)| *at <= settled)
            .map(|(k, _)| k)
            .next_back()
        else {
            return Vec::new();
        };
        let mut touched = vec![false; (self.flen / SECTOR) as usize];
        for s in self.steps.iter().filter(|s| s.n > k && s.lo < begun) {
            if let Kind::Change(a, b) = s.kind {
                for sector in a / SECTOR..b.div_ceil(SECTOR).min(self.flen / SECTOR) {
                    touched[sector as usize] = true;
                }
            }
        }
        let want = oracle.image(self, k);
        let mut lost = Vec::new();
        for (s, _) in touched.iter().enumerate().filter(|(_, t)| !**t) {
            let at = s * SECTOR as usize;
            let range = at..at + SECTOR as usize;
            if disk.get(range.clone()) != want.get(range) {
                lost.push(format!(
                    "fsx's sector {s} differs from fsx's image at its fsync of step {k}"
                ));
                if lost.len() >= 5 {
                    break;
                }
            }
        }
        lost
    }

    /// fsx's image after its last step: what the blob must hold at the end.
    pub fn final_image<'a>(&self, oracle: &'a mut Oracle) -> &'a [u8] {
        oracle.image(self, self.ops)
    }
}

/// fsx with its config in `dir`, `ops` operations from `seed`, on `file`.
fn fsx(dir: &Path, ops: u64, seed: u64, file: &Path) -> Command {
    let mut c = Command::new(fsx_bin());
    c.arg("-f")
        .arg(dir.join("fsx.toml"))
        .args(["-N", &ops.to_string(), "-S", &seed.to_string(), "-P"])
        .arg(dir)
        .arg(file);
    c
}

/// fsx's images after chosen steps, each made once by running it to that step
/// on a local file.
#[derive(Default)]
pub struct Oracle {
    images: HashMap<u64, Vec<u8>>,
}

impl Oracle {
    fn image(&mut self, run: &FsxRun, k: u64) -> &[u8] {
        self.images.entry(k).or_insert_with(|| {
            let file = run.dir.join(format!("oracle-{k}.img"));
            std::fs::File::create(&file)
                .unwrap()
                .set_len(run.flen)
                .unwrap();
            let out = fsx(&run.dir, k, run.seed, &file).output().unwrap();
            assert!(
                out.status.success(),
                "fsx run again to step {k} failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            let image = std::fs::read(&file).unwrap();
            let _ = std::fs::remove_file(&file);
            image
        })
    }
}
