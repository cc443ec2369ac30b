//! Small helpers every end-to-end test binary uses.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A current-thread runtime for the library calls a test makes directly.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Parses command output as JSON, or fails showing it.
pub fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The stdout of a command that must have succeeded; fails the test with its
/// output otherwise.
pub fn stdout_of_success(what: &impl std::fmt::Debug, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A command's exit status, stdout and stderr, for a failed assertion's message.
pub fn output_text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd` with its standard output a pipe whose reader is already gone, as
/// `| head` leaves it once head has read its fill; standard error is captured.
pub fn output_into_closed_pipe(cmd: &mut Command) -> Output {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into the array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nothing else.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    cmd.stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

/// Runs a bash script.
pub fn sh(script: &str) -> Output {
    Command::new("bash").arg("-c").arg(script).output().unwrap()
}

/// Runs a bash script that must succeed; returns its stdout.
pub fn sh_ok(script: &str) -> String {
    stdout_of_success(&script, sh(script))
}

/// A whole number from the environment variable `name`, if set and valid (the
/// knobs that lengthen soak tests and replay their seeds).
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Creates `d` (and its parents) as a run directory blobdrive accepts: root's
/// alone (0700), as it refuses one that group or others could write to.
pub fn private_dir(d: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(d).unwrap();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// A bash command printing, one a line, the words bash's completion offers for
/// the command line `words` (the last one being completed): it sources the
/// completion script `script` and calls its function `_blobdrive` as bash does
/// for `complete -F`, with the command, the word being completed and the one
/// before it.
pub fn bash_completion_command(script: &std::path::Path, words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    format!(
        "(source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; _blobdrive blobdrive \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\")",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        words.join(" "),
    )
}

/// The words bash's completion offers (see [`bash_completion_command`]).
pub fn bash_completions(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let out = sh_ok(&bash_completion_command(script, words));
    out.lines().map(str::to_string).collect()
}

/// Waits until `cond` holds, asking every 100 ms; fails the test, naming `what`,
/// once `limit` has passed without it.
pub fn wait_for(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    wait_for_every(what, limit, Duration::from_millis(100), cond)
}

/// [`wait_for`], asking every `every` (a condition that costs a command or a
/// request).
pub fn wait_for_every(
    what: &str,
    limit: Duration,
    every: Duration,
    mut cond: impl FnMut() -> bool,
) {
    wait_for_some(what, limit, every, || cond().then_some(()))
}

/// The first value `found` gives, asking every `every`; fails the test, naming
/// `what`, once `limit` has passed without one.
pub fn wait_for_some<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut found: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = found() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(every);
    }
}

/// Waits until process `pid` is gone, failing the test, naming `what`, after
/// `limit`.
pub fn wait_for_exit(pid: u64, what: &str, limit: Duration) {
    let proc = format!("/proc/{pid}");
    wait_for(what, limit, || !std::path::Path::new(&proc).exists());
}

/// A port on 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP GET on loopback: (status line, body).
pub fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    let out = String::from_utf8_lossy(&out).to_string();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Every regular file under `dir` that is on `dir`'s own filesystem. A
/// directory that is another mount is not entered: a run directory holds the
/// FUSE directory of each live fs-mode drive, and reading its `disk` would
/// read the whole drive and hold it open meanwhile, so that its unmount (by
/// another test of the binary, in another thread) is refused as busy, naming
/// this process. Symlinks are not followed.
pub fn files_on_its_filesystem(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dev) = std::fs::symlink_metadata(dir).map(|m| m.dev()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                dirs.push(e.path());
            } else if m.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// Half-open ranges sorted, empty ones dropped, touching and overlapping ones
/// joined: how a set of extents is compared whatever order and pieces it came
/// in.
pub fn merged_ranges(mut all: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    all.retain(|r| r.0 < r.1);
    all.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in all {
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// fsx, the File System eXerciser: `BLOBDRIVE_FSX`, else the one
/// `scripts/install-deps.sh` builds into target/tools, else one on the PATH.
pub fn fsx_bin() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("BLOBDRIVE_FSX") {
        return std::path::PathBuf::from(p);
    }
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin/fsx");
    if built.exists() {
        return built;
    }
    let on_path = sh("command -v fsx");
    assert!(
        on_path.status.success(),
        "fsx is not installed: scripts/install-deps.sh builds it into target/tools (or set BLOBDRIVE_FSX)"
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&on_path.stdout).trim())
}

/// Discards `len` bytes at `offset` of the open file or device `f` (hole
/// punching, which blobdrive turns into Clear Pages); fails the test if refused.
pub fn discard(f: &std::fs::File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on an open descriptor with in-range arguments.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as i64,
            len as i64,
        )
    };
    assert_eq!(rc, 0, "discard failed: {}", std::io::Error::last_os_error());
}

/// Whether this process has CAP_SYS_RESOURCE (bit 24 of CapEff), as a daemon
/// it starts will: growing a mounted ext4 takes it.
pub fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap();
    u64::from_str_radix(hex.trim(), 16).unwrap() >> 24 & 1 == 1
}

/// `len` bytes of a pattern that differs with `seed` (and from one sector of
/// 512 bytes to the next).
pub fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 512 * 7 + i * 31 + seed * 131) % 251) as u8)
        .collect()
}
