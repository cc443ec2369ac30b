//! The Kubernetes manifests of deploy/kubernetes, parsed and checked against
//! each other and against the driver they deploy (tests/fixtures/csi/
//! deploy_rules.py lists the rules): the name and version GetPluginInfo answers
//! on a running `blobdrive csi` and whether it offers SnapshotMetadata, the
//! flags `blobdrive csi --help` lists, and where blobdrive keeps its run
//! directory. No cluster runs here: this is what
//! can be checked of a deployment without one.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::sdk::{csi_stubs, python};
use common::util::stdout_of_success;

/// A `blobdrive csi` started for one question, stopped when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// The name and version GetPluginInfo answers, and whether GetPluginCapabilities
/// offers SNAPSHOT_METADATA_SERVICE, asked of a driver started on a socket in
/// `dir` as the controller Deployment starts it (the questions touch no storage
/// account, so the account named is the emulator's, not running).
fn plugin_info(dir: &Path) -> (String, String, bool) {
    csi_stubs(dir);
    let socket = dir.join("csi.sock");
    let _driver = Driver(
        Command::new(env!("CARGO_BIN_EXE_blobdrive"))
            .args(["csi", "--role", "controller", "--endpoint"])
            .arg(format!("unix://{}", socket.display()))
            .env(
                "AZURE_STORAGE_CONNECTION_STRING",
                "UseDevelopmentStorage=true",
            )
            .stdout(Stdio::null())
            .spawn()
            .expect("start blobdrive csi"),
    );
    let until = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < until, "the driver's socket never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let ask = |method: &str| -> serde_json::Value {
        let out = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/csi/call.py"))
            .arg(dir)
            .arg(&socket)
            .args(["Identity", method, "{}"])
            .output()
            .expect("run call.py");
        serde_json::from_str(&stdout_of_success(&method, out)).unwrap()
    };
    let info = ask("GetPluginInfo");
    let field = |k: &str| {
        info[k]
            .as_str()
            .unwrap_or_else(|| panic!("{info}"))
            .to_string()
    };
    let capabilities = ask("GetPluginCapabilities").to_string();
    let metadata = capabilities.contains("SNAPSHOT_METADATA_SERVICE");
    (field("name"), field("vendor_version"), metadata)
}

#[test]
fn the_manifests_agree_with_each_other_and_with_the_driver() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let (name, version, metadata) = plugin_info(dir.path());
    let help = Command::new(env!("CARGO_BIN_EXE_blobdrive"))
        .args(["csi", "--help"])
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    let help_file = dir.path().join("help.txt");
    std::fs::write(&help_file, stdout_of_success(&"blobdrive csi --help", help)).unwrap();
    // Where blobdrive keeps its records when nothing moves them (a test run
    // that sets BLOBDRIVE_RUN_DIR cannot tell).
    let run_dir = match std::env::var_os("BLOBDRIVE_RUN_DIR") {
        None => blobdrive::mount::record::run_dir().display().to_string(),
        Some(_) => "-".to_string(),
    };
    let out = Command::new(python())
        .arg(root.join("tests/fixtures/csi/deploy_rules.py"))
        .arg(root.join("deploy/kubernetes"))
        .arg(&help_file)
        .args([&name, &version, &run_dir])
        .arg(if metadata { "yes" } else { "no" })
        .output()
        .expect("run deploy_rules.py");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.ends_with("all rules held\n"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
