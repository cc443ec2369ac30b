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
    for only_bench in ["s3backer", "python3-venv"] {
        assert!(bench.contains(&only_bench.to_string()), "{bench:?}");
        assert!(!tests.contains(&only_bench.to_string()), "{tests:?}");
        assert!(!demo.contains(&only_bench.to_string()), "{demo:?}");
    }
    // The tests need qemu-img, xfs, fio, openssl and Python's cryptography; the
    // demo none of them.
    for p in [
        "qemu-utils",
        "xfsprogs",
        "fio",
        "openssl",
        "python3-cryptography",
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
