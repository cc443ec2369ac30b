//! Small helpers every end-to-end test binary uses.

use std::process::{Command, Output};

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
