//! The entry-point scripts: each installs what it needs and nothing more, and the
//! demo says what it does.

use std::process::Command;

fn root() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

/// The packages `scripts/install-deps.sh ARGS --list` would install (nothing is).
fn set(args: &[&str]) -> Vec<String> {
    let out = Command::new(format!("{}/scripts/install-deps.sh", root()))
        .args(args)
        .arg("--list")
        .output()
        .expect("run install-deps.sh");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", root())).unwrap()
}

#[test]
fn benchmark_only_packages_are_installed_by_the_benchmark_only() {
    let tests = set(&[]);
    let demo = set(&["--demo"]);
    let bench = set(&["--bench"]);
    let only_bench = "s3backer".to_string();
    assert!(bench.contains(&only_bench), "{bench:?}");
    assert!(!tests.contains(&only_bench), "{tests:?}");
    assert!(!demo.contains(&only_bench), "{demo:?}");
    // The tests need qemu-img, xfs, fio, openssl, Python's cryptography, a
    // virtual environment (for the Azure SDK) and the packaging tools; the demo
    // none of them.
    for p in [
        "qemu-utils",
        "xfsprogs",
        "fio",
        "openssl",
        "python3-cryptography",
        "python3-venv",
        // tests/package.rs: building, checking and reading the Debian package.
        "dpkg-dev",
        "lintian",
        "man-db",
    ] {
        assert!(tests.contains(&p.to_string()), "{tests:?}");
        assert!(!demo.contains(&p.to_string()), "{demo:?}");
    }
    assert!(demo.iter().all(|p| tests.contains(p) && bench.contains(p)));
    // Each entry point asks for its own set; CI runs bench.sh, which installs its
    // extras itself, then test.sh.
    assert!(read("scripts/demo.sh").contains("scripts/install-deps.sh --demo\n"));
    assert!(read("scripts/bench.sh").contains("scripts/install-deps.sh --bench"));
    assert!(read("scripts/test.sh").contains("scripts/install-deps.sh\n"));
    let ci = read(".ci/run");
    let bench_at = ci
        .find("\nscripts/bench.sh --quick")
        .expect("CI runs bench.sh");
    let test_at = ci.find("\nexec scripts/test.sh").expect("CI runs test.sh");
    assert!(bench_at < test_at);
    assert!(ci.contains("\nscripts/install-deps.sh\n"));
}

#[test]
fn the_demo_shows_the_build_and_its_headers_say_what_runs() {
    let demo = read("scripts/demo.sh");
    let build = demo
        .lines()
        .find(|l| l.trim_start().starts_with("cargo build"))
        .expect("a cargo build line");
    assert!(
        !build.contains("--quiet") && !build.contains(" -q"),
        "{build}"
    );
    for header in demo.lines().filter(|l| l.starts_with("say ")) {
        assert!(
            !header.contains("sudo"),
            "the script runs no sudo: {header}"
        );
    }
}

/// `scripts/install.sh --destdir` stages exactly the binary, the mount(8) helper
/// link and the unit (its ExecStart pointing at the installed binary) under the
/// prefix asked for, and `--uninstall` takes them away again; nothing outside the
/// staging directory is touched.
#[test]
fn install_script_stages_binary_helper_and_unit_and_uninstall_removes_them() {
    let stage = tempfile::tempdir().unwrap();
    let d = stage.path().to_str().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(format!("{}/scripts/install.sh", root()))
            .args(["--destdir", d])
            .args(args)
            .output()
            .expect("run install.sh");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let listing = || -> Vec<String> {
        let mut all: Vec<String> = walk(stage.path())
            .into_iter()
            .map(|p| format!("/{}", p.strip_prefix(stage.path()).unwrap().display()))
            .collect();
        all.sort();
        all
    };
    let binary = env!("CARGO_BIN_EXE_blobdrive");
    for (prefix, unit) in [
        (
            "/usr/local",
            "/usr/local/lib/systemd/system/blobdrive@.service",
        ),
        ("/opt/bd", "/etc/systemd/system/blobdrive@.service"),
    ] {
        run(&["--prefix", prefix, "--binary", binary]);
        let bin = format!("{prefix}/bin/blobdrive");
        assert_eq!(
            listing(),
            {
                let mut want = vec![
                    bin.clone(),
                    "/sbin/mount.blobdrive".to_string(),
                    "/sbin/umount.blobdrive".to_string(),
                    unit.to_string(),
                ];
                want.sort();
                want
            },
            "{prefix}"
        );
        let staged_bin = format!("{d}{bin}");
        assert_eq!(
            std::fs::read(&staged_bin).unwrap(),
            std::fs::read(binary).unwrap()
        );
        for helper in ["mount.blobdrive", "umount.blobdrive"] {
            assert_eq!(
                std::fs::read_link(format!("{d}/sbin/{helper}")).unwrap(),
                std::path::PathBuf::from(&bin)
            );
        }
        let unit_text = std::fs::read_to_string(format!("{d}{unit}")).unwrap();
        assert!(
            unit_text.contains(&format!(
                "\nExecStart={bin} mount ${{BLOB}} %f --foreground"
            )),
            "{unit_text}"
        );
        assert!(!unit_text.contains("@BINDIR@"));
        let out = run(&["--prefix", prefix, "--uninstall"]);
        assert!(out.contains("removed /sbin/mount.blobdrive"), "{out}");
        assert!(out.contains("removed /sbin/umount.blobdrive"), "{out}");
        assert_eq!(
            listing(),
            Vec::<String>::new(),
            "{prefix}: left after --uninstall"
        );
    }
    // A helper of that name that is not ours is never replaced.
    std::fs::create_dir_all(format!("{d}/sbin")).unwrap();
    std::fs::write(format!("{d}/sbin/mount.blobdrive"), "someone else's").unwrap();
    let out = Command::new(format!("{}/scripts/install.sh", root()))
        .args(["--destdir", d, "--binary", binary])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a link to blobdrive"));
    assert_eq!(
        std::fs::read_to_string(format!("{d}/sbin/mount.blobdrive")).unwrap(),
        "someone else's"
    );
}

/// Files and symlinks under `dir` (directories are not listed).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
