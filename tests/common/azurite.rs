//! The Azurite every integration test talks to.
//!
//! `scripts/test.sh` starts one emulator for the whole run and exports its port in
//! `BLOBDRIVE_TEST_AZURITE_PORT`; a test binary run alone (`cargo test --test cli`)
//! starts its own through `scripts/azurite.sh`, under a guard process that stops it
//! by pid when the test binary exits, since statics are never dropped.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

pub const DEV_ACCOUNT: &str = "devstoreaccount1";
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub struct Azurite {
    pub port: u16,
}

static SHARED: OnceLock<Azurite> = OnceLock::new();

impl Azurite {
    pub fn shared() -> &'static Azurite {
        SHARED.get_or_init(|| {
            if let Some(port) = std::env::var("BLOBDRIVE_TEST_AZURITE_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
            {
                return Azurite { port };
            }
            start_own()
        })
    }

    pub fn blob_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{DEV_ACCOUNT}", self.port)
    }

    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};BlobEndpoint={};",
            self.blob_endpoint()
        )
    }
}

/// Starts an emulator owned by this test process. A small shell guard holds the
/// read end of a pipe whose write end only this process has: when the test binary
/// exits (however it exits), the guard's read ends and it stops Azurite by pid.
fn start_own() -> Azurite {
    let root = env!("CARGO_MANIFEST_DIR");
    let state = tempfile::Builder::new()
        .prefix("blobdrive-test-azurite.")
        .tempdir()
        .expect("temp dir")
        .keep();
    let state = state.to_str().expect("utf-8 temp path").to_string();
    let script = format!(
        "set -e; '{root}/scripts/azurite.sh' start '{state}' >/dev/null; echo ready; \
         cat >/dev/null || true; '{root}/scripts/azurite.sh' stop '{state}' >/dev/null 2>&1; rm -rf '{state}'"
    );
    let mut guard = Command::new("bash")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the Azurite guard");
    let mut out = guard.stdout.take().expect("guard stdout");
    let mut buf = [0u8; 6];
    out.read_exact(&mut buf)
        .expect("Azurite did not start (see the output above)");
    assert_eq!(&buf, b"ready\n");
    // Keep the guard's stdin open for the life of the process: leak it on purpose.
    std::mem::forget(guard.stdin.take());
    std::mem::forget(guard);
    let port = std::fs::read_to_string(format!("{state}/port"))
        .expect("port file")
        .trim()
        .parse()
        .expect("port number");
    Azurite { port }
}

/// A container name unique to this test run: lower-case, 3 to 63 characters.
pub fn unique_container(tag: &str) -> String {
    let tag: String = tag
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .take(30)
        .collect();
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("t-{tag}-{}", &id[..16])
}
