//! The unprivileged user a split mount daemon's worker runs as (issue 42), and
//! the range of ids reserved for it that each mount's worker takes one of,
//! made when this host has none, as scripts/install.sh,
//! scripts/install-deps.sh and the Debian package do: every test binary that
//! mounts as root needs them once the split is the default.

use std::process::Command;
use std::sync::Once;
use std::time::Duration;

/// The user the tests' workers run as (blobdrive's default, `privsep::DEFAULT_USER`).
pub const USER: &str = blobdrive::privsep::DEFAULT_USER;

/// Creates [`USER`] when this host has none; once per test binary, and only
/// as root (a test that is not root mounts nothing, and could make no user).
/// Test binaries run side by side, and two may create it at once: a `useradd`
/// that lost the race finds it made (status 9) or the user database locked
/// (status 1 or 10), and looks again.
pub fn ensure_user() {
    static MADE: Once = Once::new();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    MADE.call_once(|| {
        let mut last = String::new();
        for _ in 0..20 {
            if Command::new("id")
                .arg(USER)
                .output()
                .is_ok_and(|o| o.status.success())
            {
                return;
            }
            let made = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    USER,
                ])
                .output()
                .expect("run useradd");
            if made.status.success() || made.status.code() == Some(9) {
                return;
            }
            last = String::from_utf8_lossy(&made.stderr).into_owned();
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("useradd {USER} kept failing: {last}");
    });
    RESERVED.call_once(reserve_ids);
}

static RESERVED: Once = Once::new();

/// Reserves the ids each mount's worker runs as one of (the user's range in
/// /etc/subuid and /etc/subgid) when the host has none, with the very script
/// the package, scripts/install.sh and scripts/install-deps.sh use. Two
/// binaries may run it at once: a usermod that finds the files locked is
/// tried again.
fn reserve_ids() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/debian/reserve-uids");
    let mut last = String::new();
    for _ in 0..20 {
        let out = Command::new("sh")
            .args(["-c", &format!(". '{script}' && reserve_uids")])
            .output()
            .expect("run sh");
        if out.status.success() {
            return;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("reserving ids for {USER} kept failing: {last}");
}
