//! The Azurite every integration test talks to.
//!
//! Each test binary starts its own emulator, once, through `scripts/azurite.sh`
//! (free port, bounded wait), under a guard shell that stops it by pid when the
//! test binary exits; `BLOBDRIVE_TEST_AZURITE_PORT` points a binary at one that
//! is already running instead. Its blobs are kept on disk, in its state
//! directory (`AZURITE_PERSISTENCE=disk`), not in memory: Azurite collects
//! garbage every ten minutes from its start, and over a large in-memory store
//! that kept it from answering for over 18 minutes at full CPU (issue 46), which
//! a binary run long (under load, or with the soak knobs) would meet. Statics are never dropped, so the guard does not wait for
//! a destructor: it waits for EOF on a pipe whose only write end this process holds,
//! and the kernel closes that when the process ends, however it ends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const DEV_ACCOUNT: &str = "devstoreaccount1";
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Environment variable naming the port of an Azurite that is already running.
pub const PORT_ENV: &str = "BLOBDRIVE_TEST_AZURITE_PORT";

/// Service version the harness's own requests speak.
const API_VERSION: &str = "2021-12-02";

/// How long `shared()` waits for an emulator it starts itself (including a first
/// `npm ci` when scripts/node_modules is missing).
const START_TIMEOUT: Duration = Duration::from_secs(180);

pub struct Azurite {
    pub port: u16,
    /// Pid of the emulator when this test binary started it; `None` when it came
    /// from `BLOBDRIVE_TEST_AZURITE_PORT`.
    pub own_pid: Option<u32>,
}

static SHARED: OnceLock<Azurite> = OnceLock::new();
static ISOLATED: OnceLock<Azurite> = OnceLock::new();

impl Azurite {
    /// The emulator shared by every test in this binary.
    pub fn shared() -> &'static Azurite {
        SHARED.get_or_init(|| match std::env::var(PORT_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                let port: u16 = v
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{PORT_ENV}={v:?} is not a port number"));
                if let Err(e) = connect(port) {
                    panic!("{PORT_ENV}={port}, but nothing accepts connections there: {e}");
                }
                Azurite {
                    port,
                    own_pid: None,
                }
            }
            _ => start_own(),
        })
    }

    /// An emulator of this test binary's own, even when the suite shares one, for
    /// tests whose request timeouts are a second or two: the shared emulator holds
    /// everything the suite wrote before them (gigabytes, by the end of a full
    /// run) and, busy with the tests running beside them, answered them too late
    /// (seen as EIO after an outage had ended, and in the torture test as an
    /// outage that never ended). Stopped by pid when the binary exits.
    #[allow(dead_code)] // not every test binary needs one
    pub fn isolated() -> &'static Azurite {
        ISOLATED.get_or_init(start_own)
    }

    pub fn blob_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{DEV_ACCOUNT}", self.port)
    }

    /// A client of the emulator's account.
    pub fn service(&self) -> blobdrive::azure::BlobService {
        service(&self.connection_string())
    }

    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};BlobEndpoint={};",
            self.blob_endpoint()
        )
    }
}

fn connect(port: u16) -> std::io::Result<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(5))
}

/// Guard shell. $1 = scripts/azurite.sh, $2 = state directory. It ignores
/// SIGINT/SIGHUP (a Ctrl-C kills the test binary, which is what ends the guard's
/// wait) and SIGPIPE (so a vanished reader cannot skip the stop).
const GUARD: &str = r#"
trap '' INT HUP PIPE
"$1" start "$2" >/dev/null || exit 1
echo ready 2>/dev/null
cat >/dev/null
"$1" stop "$2" >/dev/null 2>&1
rm -rf "$2"
"#;

/// Starts an emulator owned by this test process and guarded as described at the
/// top of this file.
fn start_own() -> Azurite {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("scripts/azurite.sh");
    let state: PathBuf = tempfile::Builder::new()
        .prefix("blobdrive-test-azurite.")
        .tempdir()
        .expect("temp dir for Azurite state")
        .keep();

    let mut guard = Command::new("bash")
        .env("AZURITE_PERSISTENCE", "disk")
        .arg("-c")
        .arg(GUARD)
        .arg("azurite-guard")
        .arg(&script)
        .arg(&state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn bash for the Azurite guard");

    // Wait for the guard's "ready" line on a helper thread, so the wait is bounded.
    let out = guard.stdout.take().expect("guard stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let ready = matches!(rx.recv_timeout(START_TIMEOUT), Ok(line) if line == "ready\n");
    if !ready {
        // Closing our end of its stdin makes the guard stop whatever it may still
        // start (it is not killed: that would orphan the emulator).
        drop(guard.stdin.take());
        let tail = log_tail(&state);
        if let Ok(Some(_)) = guard.try_wait() {
            let _ = std::fs::remove_dir_all(&state);
        }
        panic!(
            "Azurite did not start (waited up to {} s; see also stderr above).\n\
             --- last lines of {}/log ---\n{tail}",
            START_TIMEOUT.as_secs(),
            state.display(),
        );
    }

    // Keep the write end of the guard's stdin open for the rest of the process's
    // life: leaked on purpose, closed by the kernel at exit.
    std::mem::forget(guard.stdin.take());
    std::mem::forget(guard);

    let read_num = |file: &str| -> String {
        std::fs::read_to_string(state.join(file))
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", state.display()))
            .trim()
            .to_string()
    };
    let port = read_num("port").parse().expect("port number in state dir");
    let pid = read_num("pid").parse().expect("pid in state dir");
    Azurite {
        port,
        own_pid: Some(pid),
    }
}

fn log_tail(state: &Path) -> String {
    match std::fs::read_to_string(state.join("log")) {
        Ok(log) => {
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        }
        Err(e) => format!("(no log: {e})"),
    }
}

/// A client of the account `cs` reaches.
pub fn service(cs: &str) -> blobdrive::azure::BlobService {
    use blobdrive::azure::{Account, BlobService};
    BlobService::new(Account::from_connection_string(cs).unwrap())
}

/// A client of the blob `container/name` in the account `cs` reaches.
pub fn blob_client(cs: &str, spec: &str) -> blobdrive::azure::BlobClient {
    let (c, n) = spec.split_once('/').unwrap();
    service(cs).blob(c, n)
}

/// ETag and full content of `blob`: what "unchanged" means.
pub fn fingerprint(blob: &blobdrive::azure::BlobClient) -> (Option<String>, Vec<u8>) {
    super::util::rt().block_on(async {
        let p = blob.properties().await.unwrap();
        let data = blob.read(0, p.content_length).await.unwrap();
        (p.etag, data.to_vec())
    })
}

/// A container name unique to this test run, valid for Azure: lower-case letters,
/// digits and single hyphens, 3 to 63 characters, e.g. `t-snapshot-list-3f9c0a...`.
pub fn unique_container(tag: &str) -> String {
    let mut clean = String::new();
    for c in tag.chars() {
        if c.is_ascii_alphanumeric() {
            clean.push(c.to_ascii_lowercase());
        } else if !clean.is_empty() && !clean.ends_with('-') {
            clean.push('-');
        }
        if clean.len() >= 30 {
            break;
        }
    }
    let clean = clean.trim_end_matches('-');
    let id = uuid::Uuid::new_v4().simple().to_string();
    if clean.is_empty() {
        format!("t-{}", &id[..16])
    } else {
        format!("t-{clean}-{}", &id[..16])
    }
}

/// Creates container `name`, panicking unless Azurite answers 201 Created.
pub fn create_container(az: &Azurite, name: &str) {
    let (status, body) = put_container(az, name);
    assert_eq!(
        status, 201,
        "create container {name:?}: HTTP {status}\n{body}"
    );
}

/// Sends a Shared Key-signed `PUT /devstoreaccount1/<name>?restype=container` over a
/// plain TCP socket (independent of the project's client) and returns the HTTP
/// status and body: 201 when created, 409 when it exists already.
pub fn put_container(az: &Azurite, name: &str) -> (u16, String) {
    signed_request(az, "PUT", name, "restype", "container")
}

/// Every container of the emulator's account, emptied and deleted: the account
/// as new (Azurite deletes at once; the name can be used again straight away).
pub fn delete_every_container(az: &Azurite) {
    let (status, body) = signed_request(az, "GET", "", "comp", "list");
    assert_eq!(status, 200, "list containers: HTTP {status}\n{body}");
    for part in body.split("<Name>").skip(1) {
        let name = part.split("</Name>").next().unwrap_or_default();
        let (status, body) = signed_request(az, "DELETE", name, "restype", "container");
        assert_eq!(
            status, 202,
            "delete container {name}: HTTP {status}\n{body}"
        );
    }
}

/// Sends a Shared Key-signed request without a body to `/devstoreaccount1/<path>`
/// with one query parameter over a plain TCP socket (independent of the
/// project's client): the HTTP status and body.
fn signed_request(
    az: &Azurite,
    method: &str,
    path: &str,
    param: &str,
    value: &str,
) -> (u16, String) {
    let date = httpdate::fmt_http_date(SystemTime::now());
    let resource = if path.is_empty() {
        format!("/{DEV_ACCOUNT}/{DEV_ACCOUNT}")
    } else {
        format!("/{DEV_ACCOUNT}/{DEV_ACCOUNT}/{path}")
    };
    let string_to_sign = format!(
        "{method}\n\n\n\n\n\n\n\n\n\n\n\n\
         x-ms-date:{date}\nx-ms-version:{API_VERSION}\n\
         {resource}\n{param}:{value}"
    );
    let key = base64::engine::general_purpose::STANDARD
        .decode(DEV_KEY)
        .expect("dev key is base64");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("any key length works");
    mac.update(string_to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let url_path = &resource[DEV_ACCOUNT.len() + 1..];
    let request = format!(
        "{method} {url_path}?{param}={value} HTTP/1.1\r\n\
         Host: 127.0.0.1:{port}\r\n\
         x-ms-date: {date}\r\n\
         x-ms-version: {API_VERSION}\r\n\
         Authorization: SharedKey {DEV_ACCOUNT}:{signature}\r\n\
         Content-Length: 0\r\n\
         Connection: close\r\n\r\n",
        port = az.port
    );
    let mut stream = connect(az.port).expect("connect to Azurite");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    stream
        .write_all(request.as_bytes())
        .expect("send request to Azurite");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .expect("read Azurite's response");
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
