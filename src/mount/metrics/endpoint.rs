//! The port the figures are served on: `GET /metrics` and nothing else, each
//! client on a thread of its own, none of them able to hold the port.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use tracing::{debug, warn};

use super::render;

/// Longest request head read from a scraper, and how long it may take.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// What `--metrics` takes, for messages.
const ADDR_FORMS: &str = "expected HOST:PORT, e.g. 127.0.0.1:9101, [::1]:9101 or localhost:9101";

/// Checks that `addr` reads as HOST:PORT (an IPv4 address, an IPv6 one in
/// brackets, or a host name, then a port number) without resolving the name:
/// fstab options are checked at boot, maybe before any name can be looked up.
pub fn check_addr(addr: &str) -> Result<(), String> {
    let bad = || ADDR_FORMS.to_string();
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        }
    };
    host_ok.then_some(()).ok_or_else(bad)
}

/// Binds the metrics port: done before the mount is set up, so an address in use
/// fails the mount with one line and nothing done. A host name is looked up
/// (`localhost` in /etc/hosts) and the first of its addresses that can be bound
/// is.
pub fn bind(addr: &str) -> Result<TcpListener, String> {
    check_addr(addr).map_err(|e| format!("--metrics {addr}: {e}"))?;
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| format!("--metrics {addr}: cannot look up its host: {e}"))?
        .collect();
    TcpListener::bind(&addrs[..]).map_err(|e| format!("cannot serve metrics on {addr}: {e}"))
}

/// Serves `GET /metrics` on `listener` for as long as the process lives, each
/// connection on a thread of its own (at most [`MAX_CLIENTS`] at once), so that
/// a client that trickles its request cannot hold back a scrape; every request
/// must arrive whole within [`CLIENT_TIMEOUT`].
pub fn serve(listener: TcpListener, registry: Registry) {
    let registry = Arc::new(registry);
    let clients = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let Some(slot) = ClientSlot::take(&clients) else {
                    debug!("a metrics client turned away: {MAX_CLIENTS} already connected");
                    continue;
                };
                let registry = registry.clone();
                // The slot goes with the closure: dropped with it if no thread
                // could be started, at the thread's end otherwise.
                let spawned = std::thread::Builder::new()
                    .name("blobdrive-metrics".into())
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let _slot = slot;
                        if let Err(e) = answer(stream, &registry) {
                            debug!("a metrics client: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    warn!("cannot start a thread for a metrics client: {e}");
                }
            }
            Err(e) => {
                debug!("accepting a metrics client: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Most metrics clients served at once: a scraper or two, with room for a few
/// that hang; past it a connection is closed unanswered.
const MAX_CLIENTS: usize = 16;

/// One of the [`MAX_CLIENTS`] places, given back when dropped.
struct ClientSlot(Arc<AtomicUsize>);

impl ClientSlot {
    fn take(clients: &Arc<AtomicUsize>) -> Option<ClientSlot> {
        clients
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_CLIENTS).then_some(n + 1)
            })
            .ok()
            .map(|_| ClientSlot(clients.clone()))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads one request head (bounded in size, and in time as a whole: a client
/// sending a byte every few seconds is cut off at [`CLIENT_TIMEOUT`]) and
/// answers it.
fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= MAX_REQUEST_HEAD {
            return reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request head too long\n",
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the request did not arrive whole in time",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => reply(
            &mut stream,
            "200 OK",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            &render(registry),
        ),
        (_, "/metrics") => reply(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n",
        ),
        _ => reply(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "only /metrics is served here\n",
        ),
    }
}

fn reply(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
