//! Microsoft's Python SDK for Blob Storage as a second reader of a drive's blob
//! (`tests/fixtures/sdk_read_blob.py`), from the virtual environment that
//! `scripts/install-deps.sh` makes in `target/tools/py`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::util::{json, stdout_of_success};

/// The virtual environment's Python, or `BLOBDRIVE_TEST_PYTHON`.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("BLOBDRIVE_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/py/bin/python");
    assert!(
        venv.exists(),
        "the Python SDK is not installed: scripts/install-deps.sh puts it in target/tools/py (or set BLOBDRIVE_TEST_PYTHON)"
    );
    venv
}

/// Reads the drive `spec` (container/blob) through `cs` with the SDK: writes the
/// disk's bytes to `out` and returns what it saw of the blob (`blob_type`,
/// `size`, `lease_state`, `lease_status`, `page_ranges`, `footer_problems`).
pub fn read_blob(cs: &str, spec: &str, out: &Path) -> serde_json::Value {
    let (container, blob) = spec.split_once('/').unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sdk_read_blob.py");
    let run = Command::new(python())
        .arg(script)
        .args([container, blob])
        .arg(out)
        .env("AZURE_STORAGE_CONNECTION_STRING", cs)
        .output()
        .expect("run the Python SDK");
    json(&stdout_of_success(&"sdk_read_blob.py", run))
}
