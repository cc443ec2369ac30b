//! Microsoft Entra ID sign-in, end to end: every source of the chain against an
//! HTTPS Azurite taking bearer tokens, `--auth`, every bad input, TLS trust, and the
//! renewal machinery (401 → one renewal, rotated federated token files).
//!
//! The long-lived mount (tokens renewed under a mounted drive for several
//! lifetimes, and a renewal outage) is in `tests/entra_mount.rs`.

mod common;
mod stub;

use std::time::{Duration, Instant};

use blobdrive::azure::auth::entra::chain::EntraEnv;
use blobdrive::azure::auth::entra::keeper::TokenKeeper;
use blobdrive::azure::auth::entra::SourceKind;
use blobdrive::azure::{Account, BlobService, Credential};
use common::azurite::unique_container;
use common::entra::*;
use common::util::{json, stdout_of_success};
use stub::{Reply, Stub};

const MIB: usize = 1 << 20;

/// Creates a drive, reads its info, uploads and downloads data through the CLI
/// with `env` (which must lead to source `kind`), naming blobs by `blob_of`.
fn exercise(env: &[(String, String)], kind: &str, as_url: bool) {
    let az = TlsAzurite::shared();
    let mut env = trusting(env.to_vec());
    let container = unique_container(kind);
    let blob_of = |name: &str| {
        if as_url {
            format!("{}/{container}/{name}", az.endpoint())
        } else {
            format!("{container}/{name}")
        }
    };
    if !as_url {
        // A connection string with only the endpoint: no key, no SAS.
        env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.endpoint_only()));
    }
    let drive = blob_of("a.vhd");
    let args = ["create", &drive, "--size", "4MiB", "--create-container"];
    stdout_of_success(&args, blobdrive(&env, &args));
    let args = ["info", &drive, "--json"];
    let info = json(&stdout_of_success(&args, blobdrive(&env, &args)));
    assert_eq!(info["auth"], format!("Entra ID ({kind})"), "{info}");
    assert_eq!(info["size_bytes"], 4 * MIB as u64);
    let text = stdout_of_success(&["info"], blobdrive(&env, &["info", &drive]));
    assert!(
        text.contains(&format!("auth:         Entra ID ({kind})")),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..2 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    let src = dir.path().join("in.img");
    std::fs::write(&src, &data).unwrap();
    let copy = blob_of("b.vhd");
    let args = ["upload", src.to_str().unwrap(), &copy];
    stdout_of_success(&args, blobdrive(&env, &args));
    let back = dir.path().join("out.img");
    let args = ["download", &copy, back.to_str().unwrap(), "--format", "raw"];
    stdout_of_success(&args, blobdrive(&env, &args));
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), 2 * MIB, "uploads round up to a whole MiB");
    assert!(
        got == data,
        "downloaded bytes differ from the uploaded ones"
    );
}

#[test]
fn a_service_principal_with_a_secret_signs_in() {
    let tokens = TokenServer::start();
    exercise(
        &tokens.env_service_principal_secret(),
        "service-principal",
        false,
    );
    assert!(tokens.issued("secret") >= 4, "{:?}", tokens.log());
}

#[test]
fn a_service_principal_with_a_certificate_signs_in() {
    let tokens = TokenServer::start();
    exercise(
        &tokens.env_service_principal_certificate(),
        "service-principal",
        true,
    );
    // The server verified each assertion's RS256 signature and x5t.
    assert!(tokens.issued("certificate") >= 4, "{:?}", tokens.log());
    assert_eq!(tokens.issued("secret"), 0);
}

#[test]
fn workload_identity_signs_in() {
    let tokens = TokenServer::start();
    let file = tokens.dir.path().join("federated-token");
    exercise(
        &tokens.env_workload_identity(&file),
        "workload-identity",
        false,
    );
    assert!(tokens.issued("federated") >= 4, "{:?}", tokens.log());
}

#[test]
fn managed_identity_through_imds_signs_in() {
    let tokens = TokenServer::start();
    exercise(&tokens.env_imds(), "managed-identity", true);
    assert!(tokens.issued("imds") >= 4, "{:?}", tokens.log());
}

#[test]
fn managed_identity_through_app_service_signs_in() {
    let tokens = TokenServer::start();
    exercise(&tokens.env_app_service(), "managed-identity", false);
    assert!(tokens.issued("app-service") >= 4, "{:?}", tokens.log());
    assert_eq!(
        tokens.issued("imds"),
        0,
        "IDENTITY_ENDPOINT comes before IMDS"
    );
}

#[test]
fn the_azure_cli_signs_in_and_never_sees_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let fake_az = fixtures();
    let mut env = kv(&[
        ("FAKE_AZ_DIR", dir.path().to_str().unwrap()),
        // Closed: no managed identity here, so the chain reaches the CLI.
        (
            "AZURE_POD_IDENTITY_AUTHORITY_HOST",
            &format!("http://127.0.0.1:{}", closed_port()),
        ),
        ("AZURE_CLIENT_SECRET", "half-set-up-secret"),
        ("BLOBDRIVE_RETRY_BUDGET_SECS", "10"),
    ]);
    env.push((
        "PATH".into(),
        format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fake_az.display()),
    ));
    exercise(&env, "azure-cli", true);
    let log = std::fs::read_to_string(dir.path().join("az.log")).unwrap();
    assert!(log.lines().count() >= 4, "{log}");
    for line in log.lines() {
        let entry = json(line);
        let names = entry["env"].to_string();
        for secret in [
            "AZURE_CLIENT_SECRET",
            "AZURE_STORAGE_CONNECTION_STRING",
            "BLOBDRIVE_",
        ] {
            assert!(!names.contains(secret), "az saw {secret}: {line}");
        }
    }

    // Not signed in: the chain says so, naming `az login`.
    std::fs::write(dir.path().join("logged_out"), "").unwrap();
    let url = format!("{}/disks/a.vhd", TlsAzurite::shared().endpoint());
    let args = ["info", &url];
    let m = error_line(&args, blobdrive(&trusting(env.clone()), &args));
    assert!(
        m.contains("azure-cli: Azure CLI not signed in (run `az login`)"),
        "{m}"
    );
}

#[test]
fn auth_forces_a_source_or_a_credential_kind() {
    let tokens = TokenServer::start();
    let az = TlsAzurite::shared();
    let container = unique_container("forced");
    // Both a service principal and a managed identity are set up.
    let mut env = trusting(tokens.env_service_principal_secret());
    env.extend(tokens.env_imds());
    env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.endpoint_only()));
    let drive = format!("{container}/a.vhd");
    let args = ["create", &drive, "--size", "4MiB", "--create-container"];
    stdout_of_success(&args, blobdrive(&env, &args));
    assert_eq!(
        tokens.issued("imds"),
        0,
        "the chain starts with the service principal"
    );
    let args = ["--auth", "managed-identity", "info", &drive, "--json"];
    let info = json(&stdout_of_success(&args, blobdrive(&env, &args)));
    assert_eq!(info["auth"], "Entra ID (managed-identity)");
    assert_eq!(tokens.issued("imds"), 1);
    // BLOBDRIVE_AUTH is the same as --auth (the mount daemon gets it that way).
    let mut by_env = env.clone();
    by_env.push(("BLOBDRIVE_AUTH".into(), "managed-identity".into()));
    let info = json(&stdout_of_success(
        &["info"],
        blobdrive(&by_env, &["info", &drive, "--json"]),
    ));
    assert_eq!(info["auth"], "Entra ID (managed-identity)");
    // A user-assigned identity by flag.
    let args = [
        "--auth",
        "managed-identity",
        "--identity-client-id",
        "abc-123",
        "info",
        &drive,
    ];
    stdout_of_success(&args, blobdrive(&env, &args));
    let last = tokens.log().last().cloned().unwrap();
    assert_eq!(last["client_id"], "abc-123", "{last}");

    // The key over HTTPS, forced, and asked for where there is none.
    let mut keyed = trusting(vec![]);
    keyed.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.with_key()));
    let args = ["--auth", "key", "info", &drive, "--json"];
    assert_eq!(
        json(&stdout_of_success(&args, blobdrive(&keyed, &args)))["auth"],
        "account key"
    );
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(m.contains("--auth key needs an account key"), "{m}");
    let args = ["--auth", "sas", "info", &drive];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(m.contains("--auth sas needs a SAS"), "{m}");
    // A token never travels in the clear: plain http is refused before signing in.
    let mut plain = env.clone();
    plain.push((
        "AZURE_STORAGE_CONNECTION_STRING".into(),
        "BlobEndpoint=http://acct.blob.core.windows.net".into(),
    ));
    let before = tokens.log().len();
    let args = ["info", "disks/a.vhd"];
    let (out, took) = blobdrive_timed(&plain, &args);
    let m = error_line(&args, out);
    assert!(
        m.contains("sent only over https")
            && m.contains("http://acct.blob.core.windows.net is plain http"),
        "{m}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(tokens.log().len(), before);
    // Anonymous on a private container: Azurite refuses, nothing signed in.
    let before = tokens.log().len();
    let args = ["--auth", "anonymous", "info", &drive];
    error_line(&args, blobdrive(&env, &args));
    assert_eq!(tokens.log().len(), before);
}

#[test]
fn no_credential_anywhere_says_what_was_tried_within_30s() {
    let az = TlsAzurite::shared();
    let url = format!("{}/disks/a.vhd", az.endpoint());
    let closed = format!("http://127.0.0.1:{}", closed_port());
    for (imds, label, blob) in [
        (Some(closed.clone()), "closed local IMDS", url.as_str()),
        // The real IMDS address: outside Azure nothing answers there.
        (None, "169.254.169.254", url.as_str()),
        // An account named by AZURE_STORAGE_ACCOUNT, no key: Entra ID, not the
        // emulator (its endpoint is public Azure's; nothing is sent there).
        (Some(closed.clone()), "AZURE_STORAGE_ACCOUNT", "disks/a.vhd"),
    ] {
        let mut env = trusting(vec![]);
        if let Some(h) = &imds {
            env.push(("AZURE_POD_IDENTITY_AUTHORITY_HOST".into(), h.clone()));
        }
        if label == "AZURE_STORAGE_ACCOUNT" {
            env.push(("AZURE_STORAGE_ACCOUNT".into(), "acct".into()));
        }
        let args = ["info", blob];
        let (out, took) = blobdrive_timed(&env, &args);
        let m = error_line(&args, out);
        assert!(took < Duration::from_secs(30), "{label}: took {took:?}");
        for part in [
            "no Entra ID credential found (tried service-principal:",
            "AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET or AZURE_CLIENT_CERTIFICATE_PATH not set",
            "workload-identity: no workload identity: AZURE_FEDERATED_TOKEN_FILE",
            "managed-identity: no managed identity: ",
            "azure-cli: no Azure CLI: `az` is not on PATH",
            "--auth anonymous",
        ] {
            assert!(m.contains(part), "{label}: {part:?} missing: {m}");
        }
        let imds = imds.unwrap_or_else(|| "http://169.254.169.254".into());
        assert!(m.contains(&format!("at IMDS at {imds}")), "{label}: {m}");
    }
}

#[test]
fn an_unreachable_token_endpoint_is_named() {
    let port = closed_port();
    let env = trusting(kv(&[
        ("AZURE_TENANT_ID", TENANT),
        ("AZURE_CLIENT_ID", CLIENT_ID),
        ("AZURE_CLIENT_SECRET", SECRET),
        ("AZURE_AUTHORITY_HOST", &format!("https://127.0.0.1:{port}")),
    ]));
    let url = format!("{}/disks/a.vhd", TlsAzurite::shared().endpoint());
    let args = ["create", &url, "--size", "4MiB"];
    let (out, took) = blobdrive_timed(&env, &args);
    let m = error_line(&args, out);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(
        m.contains(&format!("Entra ID sign-in through service-principal failed: token endpoint https://127.0.0.1:{port} unreachable")),
        "{m}"
    );
    assert!(!m.contains(SECRET));
}

#[test]
fn tokens_that_expire_at_once_are_a_failure_named_by_endpoint_not_a_loop() {
    // An identity endpoint answering `expires_in: 0`, or an `expires_on` an hour
    // past: one `info` asked it 173 times in 15 s, each token due for renewal
    // at once. Now the token is a failed answer: one line naming the endpoint,
    // and the command asks at most 10 times in all.
    let az = TlsAzurite::shared();
    type EnvOf = fn(&TokenServer) -> Vec<(String, String)>;
    let cases: [(EnvOf, &str, &str, &str); 2] = [
        (TokenServer::env_imds, "in", "0", "expires in 0 s"),
        (
            TokenServer::env_app_service,
            "on",
            "-3600",
            "expired 3600 s before it came",
        ),
    ];
    for (env_of, expiry, lifetime, says) in cases {
        let tokens = TokenServer::start();
        tokens.set("expiry", expiry);
        tokens.set("lifetime", lifetime);
        let mut env = trusting(env_of(&tokens));
        env.push(("AZURE_STORAGE_CONNECTION_STRING".into(), az.endpoint_only()));
        let url = format!("{}/disks/a.vhd", az.endpoint());
        let args = ["info", &url];
        let (out, took) = blobdrive_timed(&env, &args);
        let asked = tokens.log().len();
        eprintln!("expires_{expiry}: {asked} token requests in {took:?}");
        assert!(asked <= 10, "{asked} token requests in {took:?}");
        let m = error_line(&args, out);
        let endpoint = if expiry == "in" {
            format!("IMDS at {}", tokens.imds())
        } else {
            format!("IDENTITY_ENDPOINT {}", tokens.imds())
        };
        assert!(m.contains(&endpoint) && m.contains(says), "{m}");
        assert!(m.contains("a token must be valid for at least 60 s"), "{m}");
        assert!(took < Duration::from_secs(15), "{took:?}");
    }
}

/// IDENTITY_ENDPOINT and AZURE_POD_IDENTITY_AUTHORITY_HOST take plain http to
/// another host (Azure App Service and pod identity work so): allowed, and
/// said once, naming the variable and the host, never the header; nothing is
/// said for this machine's loopback. In a network namespace of its own, so
/// nothing leaves the machine.
#[test]
fn plain_http_identity_endpoints_off_loopback_are_warned_of_once() {
    let run = |vars: &[(&str, &str)]| -> String {
        let out = std::process::Command::new("unshare")
            .arg("-n")
            .arg(env!("CARGO_BIN_EXE_blobdrive"))
            .args([
                "info",
                "http://127.0.0.1:1/devstoreaccount1/disks/a.vhd",
                "--auth",
                "managed-identity",
            ])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("BLOBDRIVE_RUN_DIR", run_dir())
            .envs(vars.iter().copied())
            .output()
            .expect("run blobdrive in a network namespace of its own (unshare -n)");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for (vars, var) in [
        (
            &[
                ("IDENTITY_ENDPOINT", "http://192.0.2.1:8081/msi/token"),
                ("IDENTITY_HEADER", IDENTITY_HEADER),
            ][..],
            "IDENTITY_ENDPOINT",
        ),
        (
            &[("AZURE_POD_IDENTITY_AUTHORITY_HOST", "http://192.0.2.1:2579")],
            "AZURE_POD_IDENTITY_AUTHORITY_HOST",
        ),
    ] {
        let err = run(vars);
        let said: Vec<&str> = err
            .lines()
            .filter(|l| l.contains(&format!("{var} is plain http to http://192.0.2.1:")))
            .collect();
        assert_eq!(said.len(), 1, "{var}: {err}");
        assert!(said[0].contains("cross the network unencrypted"), "{err}");
        assert!(!err.contains(IDENTITY_HEADER), "{err}");
    }
    let err = run(&[
        ("IDENTITY_ENDPOINT", "http://127.0.0.1:1/msi/token"),
        ("IDENTITY_HEADER", IDENTITY_HEADER),
    ]);
    assert!(!err.contains("is plain http"), "{err}");
}

#[test]
fn a_wrong_secret_is_refused_in_one_line_without_showing_it() {
    let tokens = TokenServer::start();
    let mut env = trusting(tokens.env_service_principal_secret());
    env.retain(|(k, _)| k != "AZURE_CLIENT_SECRET");
    env.push(("AZURE_CLIENT_SECRET".into(), "wrong-secret-value".into()));
    let url = format!("{}/disks/a.vhd", TlsAzurite::shared().endpoint());
    let args = ["info", &url];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains("through service-principal failed")
            && m.contains("HTTP 401 invalid_client: AADSTS7000215"),
        "{m}"
    );
    assert!(!m.contains("wrong-secret-value"), "{m}");
}

#[test]
fn a_missing_or_expired_federated_token_file_is_named() {
    let tokens = TokenServer::start();
    let file = tokens.dir.path().join("federated-token");
    let env = trusting(tokens.env_workload_identity(&file));
    let url = format!("{}/disks/a.vhd", TlsAzurite::shared().endpoint());
    let args = ["info", &url];
    std::fs::write(&file, federated_token(2, -60)).unwrap();
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains("through workload-identity failed: the federated token in")
            && m.contains("has expired"),
        "{m}"
    );
    std::fs::remove_file(&file).unwrap();
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains("cannot read the federated token file AZURE_FEDERATED_TOKEN_FILE=")
            && m.contains("No such file"),
        "{m}"
    );
    assert_eq!(tokens.issued("federated"), 0);
}

#[test]
fn a_client_certificate_that_is_not_pem_says_how_to_convert_it() {
    let tokens = TokenServer::start();
    let pfx = tokens.dir.path().join("app.pfx");
    std::fs::write(&pfx, [0x30u8, 0x82, 0x05, 0x00, 0x02, 0x01, 0x03]).unwrap();
    let mut env = trusting(tokens.env_service_principal_certificate());
    env.retain(|(k, _)| k != "AZURE_CLIENT_CERTIFICATE_PATH");
    env.push((
        "AZURE_CLIENT_CERTIFICATE_PATH".into(),
        pfx.to_str().unwrap().into(),
    ));
    let url = format!("{}/disks/a.vhd", TlsAzurite::shared().endpoint());
    let args = ["info", &url];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains("is not PEM") && m.contains("openssl pkcs12 -in"),
        "{m}"
    );
}

/// A blob service that refuses every request with 403, as Azure does for an
/// identity without a data role.
fn denying_stub() -> Stub {
    Stub::start(|_, _| {
        Reply::error(
            403,
            "AuthorizationPermissionMismatch",
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthorizationPermissionMismatch</Code><Message>This request is not authorized to perform this operation using this permission.\nRequestId:1</Message></Error>",
        )
    })
}

#[test]
fn an_identity_without_a_role_is_told_which_role_it_needs() {
    let tokens = TokenServer::start();
    let stub = denying_stub();
    let mut env = tokens.env_imds();
    env.push((
        "AZURE_STORAGE_CONNECTION_STRING".into(),
        format!("BlobEndpoint={}", stub.endpoint()),
    ));
    let args = ["info", "disks/a.vhd"];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains("the identity signed in through managed-identity has no data access")
            && m.contains("needs the role \"Storage Blob Data Reader\""),
        "{m}"
    );
    let args = ["create", "disks/a.vhd", "--size", "4MiB"];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains("needs the role \"Storage Blob Data Contributor\""),
        "{m}"
    );
    let reqs = stub.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        let auth = r.header("authorization").unwrap_or_default();
        assert!(auth.starts_with("Bearer ey"), "{auth}");
        assert!(r.header("x-ms-version").unwrap() >= "2017-11-09");
    }
    // Refused at once: a 403 is not retried.
    assert_eq!(reqs.len(), 2, "{reqs:?}");
}

#[test]
fn an_untrusted_certificate_fails_at_once_and_says_how_to_trust_a_ca() {
    let az = TlsAzurite::shared();
    let container = unique_container("tls");
    let drive = format!("{container}/a.vhd");
    let keyed = kv(&[("AZURE_STORAGE_CONNECTION_STRING", &az.with_key())]);
    // Without SSL_CERT_FILE the test CA is in no trust store.
    let args = ["create", &drive, "--size", "4MiB", "--create-container"];
    let (out, took) = blobdrive_timed(&keyed, &args);
    let m = error_line(&args, out);
    assert!(took < Duration::from_secs(5), "took {took:?}: {m}");
    assert!(
        m.contains(&format!(
            "TLS certificate of 127.0.0.1:{} not trusted (UnknownIssuer)",
            az.port
        )) && m.contains("update-ca-certificates")
            && m.contains("SSL_CERT_FILE=/path/to/ca.pem"),
        "{m}"
    );
    assert!(!m.contains("attempt"), "{m}");
    // Trusted through SSL_CERT_FILE, the same command works.
    stdout_of_success(&args, blobdrive(&trusting(keyed.clone()), &args));
    // And through SSL_CERT_DIR (a directory of PEM files), too.
    let certs = tempfile::tempdir().unwrap();
    std::fs::copy(&Pki::shared().ca, certs.path().join("ca.pem")).unwrap();
    let mut by_dir = keyed.clone();
    by_dir.push(("SSL_CERT_DIR".into(), certs.path().to_str().unwrap().into()));
    let args = ["info", &drive];
    stdout_of_success(&args, blobdrive(&by_dir, &args));

    // A token endpoint with an untrusted certificate: the same advice.
    let tokens = TokenServer::start();
    let env = tokens.env_service_principal_secret();
    let url = format!("{}/{drive}", az.endpoint());
    let args = ["info", &url];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(
        m.contains(&format!(
            "TLS certificate of 127.0.0.1:{} not trusted",
            tokens.https_port
        )) && m.contains("SSL_CERT_FILE"),
        "{m}"
    );
}

/// Makes this process trust the test CA, before any HTTP client of it is
/// built: the library reads the trust store once per process (a mount's root
/// part reads it for its worker), so every test that signs in through the
/// library itself calls this first, whichever of them runs first.
fn trust_the_test_ca_in_process() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| std::env::set_var("SSL_CERT_FILE", &Pki::shared().ca));
}

/// The library directly: a rotated federated token file is read again at renewal.
#[test]
fn workload_identity_renewals_read_the_rotated_file() {
    trust_the_test_ca_in_process();
    let tokens = TokenServer::start();
    let file = tokens.dir.path().join("federated-token");
    let vars = tokens.env_workload_identity(&file);
    let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let env = EntraEnv {
        tenant_id: get("AZURE_TENANT_ID"),
        client_id: get("AZURE_CLIENT_ID"),
        federated_token_file: get("AZURE_FEDERATED_TOKEN_FILE"),
        authority_host: get("AZURE_AUTHORITY_HOST"),
        ..EntraEnv::default()
    };
    let keeper = TokenKeeper::sign_in(env, None).unwrap();
    assert_eq!(keeper.kind(), SourceKind::WorkloadIdentity);
    let first = keeper.bearer().unwrap();
    // The platform rotates the file; the server now accepts only the new token.
    // A renewal (forced here: a token must live a minute, so waiting for the
    // scheduled one at half its life would take 30 s; the keeper's unit tests
    // and tests/entra_mount.rs wait for those) sends the new one.
    tokens.rotate_federated(&file, 2);
    common::util::rt().block_on(keeper.renew_now()).unwrap();
    let second = keeper.bearer().unwrap();
    assert_ne!(first, second, "renewed");
    assert_eq!(keeper.last_error(), None);
    assert!(tokens.issued("federated") >= 2, "{:?}", tokens.log());
    assert!(
        tokens.log().iter().all(|e| e["status"] == 200),
        "the old token was never sent again: {:?}",
        tokens.log()
    );
}

/// A 401 (a token revoked or expired early), or Azurite's 403 for an expired
/// token, makes the credential renew once and the request go again with the new
/// token; a 403 for another reason does not.
#[test]
fn a_refused_token_is_renewed_once_and_the_request_retried() {
    trust_the_test_ca_in_process();
    let tokens = TokenServer::start();
    let env = EntraEnv {
        imds_host: Some(tokens.imds()),
        ..EntraEnv::default()
    };
    let rt = common::util::rt();
    let service = |stub: &Stub| {
        BlobService::new(Account {
            name: "devstoreaccount1".into(),
            blob_endpoint: url::Url::parse(&stub.endpoint()).unwrap(),
            credential: Credential::Entra(TokenKeeper::sign_in(env.clone(), None).unwrap()),
        })
    };
    for (status, code, message, renews) in [
        (
            401,
            "InvalidAuthenticationInfo",
            "Server failed to authenticate the request.",
            true,
        ),
        (
            403,
            "AuthenticationFailed",
            "Lifetime validation failed. The token is expired.",
            true,
        ),
        (
            403,
            "AuthenticationFailed",
            "Signature did not match.",
            false,
        ),
    ] {
        let body =
            format!("<Error><Code>{code}</Code><Message>{message}\nRequestId:1</Message></Error>");
        let stub = Stub::start(move |_, i| {
            if i == 0 {
                Reply::error(status, code, &body)
            } else {
                Reply::status(201).with("ETag", "\"0x1\"")
            }
        });
        let issued = tokens.issued("imds");
        let outcome = rt.block_on(service(&stub).container("disks").create());
        let reqs = stub.requests();
        if renews {
            outcome.unwrap();
            assert_eq!(
                reqs.len(),
                2,
                "{status} {message}: one refused, one retried"
            );
            let a0 = reqs[0].header("authorization").unwrap();
            let a1 = reqs[1].header("authorization").unwrap();
            assert_ne!(a0, a1, "the retry carries the renewed token");
            assert_eq!(tokens.issued("imds"), issued + 2, "sign-in and one renewal");
        } else {
            assert_eq!(outcome.unwrap_err().status(), Some(403));
            assert_eq!(reqs.len(), 1, "{message}: not retried");
        }
    }

    // A second 401 in a row is the answer: one renewal per request.
    let stub = Stub::start(|_, _| Reply::error(401, "InvalidAuthenticationInfo", ""));
    let svc = service(&stub);
    let started = Instant::now();
    let e = rt.block_on(svc.container("disks").create()).unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    assert_eq!(stub.requests().len(), 2);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_token_endpoint_cannot_write_escape_sequences_to_the_terminal() {
    // A hostile identity endpoint on this machine answers with a description that
    // would clear the screen and set the terminal's title, followed by 10,000
    // characters.
    let hostile = format!("\x1b[2J\x1b]0;owned\x07\u{9b}1m{}", "z".repeat(10_000));
    let body =
        serde_json::json!({ "error": "invalid_request\x1b[5m", "error_description": hostile })
            .to_string();
    let imds = Stub::start(move |_, _| Reply::Respond {
        status: 400,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: body.clone().into_bytes(),
    });
    let service = denying_stub();
    let env = kv(&[
        ("AZURE_POD_IDENTITY_AUTHORITY_HOST", &imds.endpoint()),
        (
            "AZURE_STORAGE_CONNECTION_STRING",
            &format!("BlobEndpoint={}", service.endpoint()),
        ),
        ("BLOBDRIVE_AUTH", "managed-identity"),
    ]);
    let args = ["info", "disks/a.vhd"];
    let m = error_line(&args, blobdrive(&env, &args));
    assert!(!imds.requests().is_empty(), "the endpoint was not asked");
    assert!(!m.chars().any(char::is_control), "{m:?}");
    assert!(m.contains("\\u{1b}]0;owned\\u{7}"), "{m}");
    assert!(m.len() < 2000, "{} characters: {m}", m.len());
}
