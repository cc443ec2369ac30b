//! What the Entra ID tests stand on: a certificate authority made at test time, an
//! HTTPS Azurite that takes bearer tokens (`--oauth basic`), a token server
//! standing for Entra ID, IMDS and App Service (`tests/fixtures/entra/token_server.py`),
//! a fake `az` (`tests/fixtures/entra/az`), and a way to run the CLI with exactly
//! the environment a test gives it.
//!
//! Every process started here is ended by pid: each is a child of a guard (or of
//! the test itself) that waits for EOF on a pipe only this process holds, so it
//! goes away also when the test binary dies.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
pub const CLIENT_ID: &str = "11111111-2222-3333-4444-555555555555";
pub const SECRET: &str = "s3cr3t-value-never-shown";
pub const IDENTITY_HEADER: &str = "identity-header-never-shown";

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/entra")
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().expect("run a helper");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and a client
/// certificate (with its key, PEM) for the service principal.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    /// The client certificate and its private key in one PEM file.
    pub client_pem: PathBuf,
}

impl Pki {
    /// One per test binary.
    pub fn shared() -> &'static Pki {
        static PKI: OnceLock<Pki> = OnceLock::new();
        PKI.get_or_init(Pki::make)
    }

    /// Made afresh in the target's temp directory, one per test binary (so the
    /// binaries that run at once never share one, and runs leave no litter in /tmp).
    fn make() -> Pki {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pki-{}", env!("CARGO_CRATE_NAME")));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = |n: &str| dir.join(n);
        let openssl = |args: &[&str]| {
            run_ok(Command::new("openssl").args(args).current_dir(&dir));
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "3",
            "-subj",
            "/CN=blobdrive test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            p("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "3",
            "-extfile",
            "server.ext",
        ]);
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "client.key",
            "-out",
            "client.crt",
            "-days",
            "3",
            "-subj",
            "/CN=blobdrive test app",
        ]);
        let pem = format!(
            "{}{}",
            std::fs::read_to_string(p("client.crt")).unwrap(),
            std::fs::read_to_string(p("client.key")).unwrap()
        );
        std::fs::write(p("client.pem"), pem).unwrap();
        Pki {
            ca: p("ca.pem"),
            server_cert: p("server.pem"),
            server_key: p("server.key"),
            client_cert: p("client.crt"),
            client_pem: p("client.pem"),
            dir,
        }
    }
}

/// A port nothing listens on: 1 (tcpmux), privileged and never handed out for
/// port 0, so no server another test starts meanwhile can take it. A port bound
/// and closed again could be: once a managed-identity server of a test running
/// beside this one got it, and a test meant to reach the Azure CLI signed in as a
/// managed identity (a fresh-clone run).
pub fn closed_port() -> u16 {
    assert!(
        !listening(1),
        "something listens on 127.0.0.1:1; the tests need it closed"
    );
    1
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// Guard for an HTTPS Azurite: starts it with its blobs on disk in `$6` (see
/// `common::azurite` for why not in memory), prints its pid, and stops it
/// (SIGTERM, then SIGKILL, by that pid) when its stdin reaches EOF, then removes
/// `$6`.
const AZURITE_GUARD: &str = r#"
trap '' INT HUP PIPE
mkdir -p "$6"
"$1" --location "$6" --disableTelemetry --blobHost 127.0.0.1 --blobPort "$2" \
    --skipApiVersionCheck --loose --oauth basic --cert "$3" --key "$4" >"$5" 2>&1 </dev/null &
pid=$!
echo "$pid"
cat >/dev/null
kill -TERM "$pid" 2>/dev/null
stopped() { for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done; return 1; }
stopped || { kill -KILL "$pid" 2>/dev/null; stopped; }
rm -rf "$6"
"#;

/// Azurite over HTTPS with `--oauth basic`, its certificate signed by [`Pki`]'s CA.
pub struct TlsAzurite {
    pub port: u16,
    pub pid: u32,
    _guard_stdin: ChildStdin,
}

impl TlsAzurite {
    /// One per test binary; stopped when the binary exits.
    pub fn shared() -> &'static TlsAzurite {
        static AZ: OnceLock<TlsAzurite> = OnceLock::new();
        AZ.get_or_init(TlsAzurite::start)
    }

    fn start() -> TlsAzurite {
        let pki = Pki::shared();
        let bin =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/node_modules/.bin/azurite-blob");
        assert!(
            bin.exists(),
            "{} missing: run npm ci --prefix scripts",
            bin.display()
        );
        for _ in 0..3 {
            let port = super::util::free_port();
            let log = pki.dir.join(format!("azurite-{port}.log"));
            let mut guard = Command::new("bash")
                .arg("-c")
                .arg(AZURITE_GUARD)
                .arg("azurite-tls-guard")
                .arg(&bin)
                .arg(port.to_string())
                .arg(&pki.server_cert)
                .arg(&pki.server_key)
                .arg(&log)
                .arg(pki.dir.join(format!("azurite-{port}-data")))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn the Azurite guard");
            let mut line = String::new();
            BufReader::new(guard.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let pid: u32 = line.trim().parse().expect("the guard prints Azurite's pid");
            let stdin = guard.stdin.take().unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline && !listening(port) {
                std::thread::sleep(Duration::from_millis(100));
            }
            if listening(port) {
                // The guard lives as long as its stdin's write end: this process.
                std::mem::forget(guard);
                return TlsAzurite {
                    port,
                    pid,
                    _guard_stdin: stdin,
                };
            }
            drop(stdin);
            let _ = guard.wait();
        }
        panic!(
            "HTTPS Azurite did not start (logs in {})",
            pki.dir.display()
        );
    }

    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}/devstoreaccount1", self.port)
    }

    /// A connection string holding only the endpoint: no key, no SAS.
    pub fn endpoint_only(&self) -> String {
        format!("BlobEndpoint={}", self.endpoint())
    }

    /// The emulator's Shared Key over HTTPS.
    pub fn with_key(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=https;AccountName=devstoreaccount1;AccountKey={};BlobEndpoint={}",
            super::azurite::DEV_KEY,
            self.endpoint()
        )
    }
}

/// The token server (one per test, so each can set its own lifetime and mode).
pub struct TokenServer {
    pub dir: tempfile::TempDir,
    pub https_port: u16,
    pub http_port: u16,
    child: Child,
}

impl TokenServer {
    // The child is kept in the TokenServer, whose Drop waits for it.
    #[allow(clippy::zombie_processes)]
    pub fn start() -> TokenServer {
        let pki = Pki::shared();
        let dir = tempfile::Builder::new()
            .prefix("blobdrive-tokens.")
            .tempdir()
            .unwrap();
        let mut child = Command::new("python3")
            .arg(fixtures().join("token_server.py"))
            .args(["--dir", dir.path().to_str().unwrap()])
            .args([
                "--tenant",
                TENANT,
                "--client-id",
                CLIENT_ID,
                "--secret",
                SECRET,
            ])
            .arg("--client-cert")
            .arg(&pki.client_cert)
            .args(["--identity-header", IDENTITY_HEADER])
            .arg("--cert")
            .arg(&pki.server_cert)
            .arg("--key")
            .arg(&pki.server_key)
            .stdin(Stdio::piped())
            .spawn()
            .expect("start the token server");
        let read_port = |name: &str| {
            std::fs::read_to_string(dir.path().join(name))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let (Some(https_port), Some(http_port)) =
                (read_port("https_port"), read_port("http_port"))
            {
                return TokenServer {
                    dir,
                    https_port,
                    http_port,
                    child,
                };
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the token server did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn authority(&self) -> String {
        format!("https://127.0.0.1:{}", self.https_port)
    }

    pub fn imds(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    pub fn app_service(&self) -> String {
        format!("http://127.0.0.1:{}/msi/token", self.http_port)
    }

    pub fn set(&self, file: &str, value: &str) {
        std::fs::write(self.dir.path().join(file), value).unwrap();
    }

    /// Every token request so far, as logged.
    pub fn log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("log.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Tokens handed out of kind `kind`.
    pub fn issued(&self, kind: &str) -> usize {
        self.log()
            .iter()
            .filter(|e| e["kind"] == kind && e["status"] == 200)
            .count()
    }

    /// Environment of each source, pointing at this server.
    pub fn env_service_principal_secret(&self) -> Vec<(String, String)> {
        kv(&[
            ("AZURE_TENANT_ID", TENANT),
            ("AZURE_CLIENT_ID", CLIENT_ID),
            ("AZURE_CLIENT_SECRET", SECRET),
            ("AZURE_AUTHORITY_HOST", &self.authority()),
        ])
    }

    pub fn env_service_principal_certificate(&self) -> Vec<(String, String)> {
        kv(&[
            ("AZURE_TENANT_ID", TENANT),
            ("AZURE_CLIENT_ID", CLIENT_ID),
            (
                "AZURE_CLIENT_CERTIFICATE_PATH",
                Pki::shared().client_pem.to_str().unwrap(),
            ),
            ("AZURE_AUTHORITY_HOST", &self.authority()),
        ])
    }

    /// Workload identity with a federated token file the server accepts.
    pub fn env_workload_identity(&self, file: &Path) -> Vec<(String, String)> {
        self.rotate_federated(file, 1);
        kv(&[
            ("AZURE_TENANT_ID", TENANT),
            ("AZURE_CLIENT_ID", CLIENT_ID),
            ("AZURE_FEDERATED_TOKEN_FILE", file.to_str().unwrap()),
            ("AZURE_AUTHORITY_HOST", &self.authority()),
        ])
    }

    /// Writes federated token number `n` to `file` and makes the server accept only it.
    pub fn rotate_federated(&self, file: &Path, n: u32) {
        let token = federated_token(n, 3600);
        std::fs::write(file, &token).unwrap();
        self.set("federated_expected", &token);
    }

    pub fn env_imds(&self) -> Vec<(String, String)> {
        kv(&[("AZURE_POD_IDENTITY_AUTHORITY_HOST", &self.imds())])
    }

    pub fn env_app_service(&self) -> Vec<(String, String)> {
        kv(&[
            ("IDENTITY_ENDPOINT", &self.app_service()),
            ("IDENTITY_HEADER", IDENTITY_HEADER),
        ])
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        // EOF on its stdin ends it; the kill (same pid, our child) is for a wedged one.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Kubernetes-style service account token: a JWT expiring in `life_secs`
/// (negative: already expired), numbered `n`.
pub fn federated_token(n: u32, life_secs: i64) -> String {
    use base64::Engine;
    let b = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    format!(
        "{}.{}.c2ln",
        b(serde_json::json!({"alg": "RS256", "kid": "k8s"})),
        b(
            serde_json::json!({"iss": "https://oidc.k8s.test", "sub": "system:serviceaccount:default:app", "aud": "api://AzureADTokenExchange", "exp": now + life_secs, "n": n})
        )
    )
}

/// Runs the CLI with exactly `env` (plus PATH, HOME and a private run directory),
/// so nothing from the test runner's environment changes what it finds.
pub fn blobdrive(env: &[(String, String)], args: &[&str]) -> Output {
    blobdrive_timed(env, args).0
}

/// [`blobdrive`], and how long it took.
pub fn blobdrive_timed(env: &[(String, String)], args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobdrive"));
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env(
            "HOME",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into()),
        )
        .env("BLOBDRIVE_RUN_DIR", run_dir())
        .env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run blobdrive");
    (out, started.elapsed())
}

/// The run directory of these tests' mounts.
pub fn run_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("entra-run");
    super::util::private_dir(&d);
    d
}

/// `env` plus SSL_CERT_FILE trusting the test CA.
pub fn trusting(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    env.push((
        "SSL_CERT_FILE".into(),
        Pki::shared().ca.to_str().unwrap().into(),
    ));
    env
}

/// The one error line of a failed command.
pub fn error_line(what: &[&str], out: Output) -> String {
    assert!(
        !out.status.success(),
        "{what:?} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{what:?}: not one line: {err}");
    err.trim().to_string()
}
