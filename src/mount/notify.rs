//! The service manager's readiness protocol (sd_notify): when `NOTIFY_SOCKET` is
//! set, a daemon in the foreground tells systemd `READY=1` once the mountpoint
//! serves, `STATUS=...` while it runs, and `STOPPING=1` when it starts taking the
//! drive down. Each message is one datagram of `KEY=VALUE` lines sent to the
//! socket's path, or to a Linux abstract socket when the name starts with `@`.
//!
//! Written by hand: it is a few lines over `UnixDatagram`, and a dependency would
//! bring more than it saves. Sending is best effort: a manager that went away must
//! never stop the drive from being served or taken down.

use std::os::unix::net::{SocketAddr, UnixDatagram};

use tracing::debug;

/// The environment variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Where notifications go; `None` from [`Notifier::from_env`] when nobody listens.
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names, if it is set to something usable.
    pub fn from_env() -> Option<Notifier> {
        let name = std::env::var_os(NOTIFY_SOCKET_ENV)?;
        Notifier::new(name.to_str()?)
    }

    /// A notifier for a socket path, or `@name` for an abstract socket.
    pub fn new(name: &str) -> Option<Notifier> {
        let addr = if let Some(abs) = name.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(abs.as_bytes()).ok()?
        } else if name.starts_with('/') {
            SocketAddr::from_pathname(name).ok()?
        } else {
            // sd_notify(3) knows only these two forms (and vsock, not used here).
            debug!("{NOTIFY_SOCKET_ENV}={name:?} is neither a path nor @abstract: not notifying");
            return None;
        };
        let socket = UnixDatagram::unbound().ok()?;
        Some(Notifier { socket, addr })
    }

    /// A second handle on the same socket, for another thread.
    pub fn try_clone(&self) -> Option<Notifier> {
        Some(Notifier {
            socket: self.socket.try_clone().ok()?,
            addr: self.addr.clone(),
        })
    }

    /// Sends one message (lines of `KEY=VALUE`); failures are only logged.
    pub fn send(&self, message: &str) {
        if let Err(e) = self.socket.send_to_addr(message.as_bytes(), &self.addr) {
            debug!("notify {message:?}: {e}");
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// A `STATUS=` line (what `systemctl status` shows).
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// `STOPPING=1` with a status line saying why.
    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }
}

/// A status is a single line: a newline would start another assignment.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap()).unwrap();
        n.ready("serving\nx");
        let mut buf = [0u8; 256];
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving x");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("blobdrive-notify-test-{}", std::process::id());
        let abs = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let n = Notifier::new(&format!("@{name}")).unwrap();
        n.stopping("unmounting");
        let len = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=unmounting");

        assert!(Notifier::new("relative/path").is_none());
        // Nobody listening: sending is quiet.
        drop(listener);
        Notifier::new(path.to_str().unwrap())
            .unwrap()
            .status("gone");
    }
}
