//! The entry-point scripts: each installs what it needs and nothing more, and the
//! demo says what it does. And the manual: a README of a page, every page of docs/
//! reachable from its index, and no link into nothing.

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

/// The README stays a front page; every page of docs/ is linked from the index,
/// docs/README.md; every relative link of the README and of docs/*.md names a
/// file that exists, and a `#part` of one names a heading of that page.
#[test]
fn the_manual_is_a_front_page_and_an_index_with_no_link_into_nothing() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; the rest belongs in docs/"
    );
    let docs = std::path::Path::new(root()).join("docs");
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(&docs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    let index = std::fs::read_to_string(docs.join("README.md")).unwrap();
    let indexed: Vec<String> = links(&index).into_iter().map(|l| file_part(&l)).collect();
    for page in &pages {
        let name = page.file_name().unwrap().to_str().unwrap().to_string();
        assert!(
            name == "README.md" || indexed.contains(&name),
            "docs/{name} is not linked from the index, docs/README.md"
        );
    }
    pages.push(std::path::Path::new(root()).join("README.md"));
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let dir = page.parent().unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, part) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            assert!(
                target.exists(),
                "{}: the link {link} names nothing",
                page.display()
            );
            if !part.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let headings = headings(&std::fs::read_to_string(&target).unwrap());
                assert!(
                    headings.iter().any(|h| h == part),
                    "{}: the link {link} names no heading of {} ({headings:?})",
                    page.display(),
                    target.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links found");
}

/// The targets of the Markdown links `[text](target)` of `text`, outside code
/// blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

/// The file a link names, without its `#part`.
fn file_part(link: &str) -> String {
    link.split('#').next().unwrap().to_string()
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push(line);
        }
    }
    out
}

/// The anchors of a page's headings, as GitHub makes them: lower case, spaces
/// as hyphens, other punctuation dropped.
fn headings(text: &str) -> Vec<String> {
    prose(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
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
