//! The entry-point scripts: each installs what it needs and nothing more, the
//! user a mount daemon's worker runs as included, and the demo says what it does.
//! And the manual: a README of a page, every page of docs/ reachable from its
//! index, and no link into nothing.

mod common;

use std::process::Command;

use common::namespace::in_mount_namespace;

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
        // tests/manual.rs: the manual's commands as written.
        "sudo",
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

/// How the scripts and the CSI image make the worker's user (issue 42), when it
/// is missing.
const USERADD: &str = "useradd --system --no-create-home --shell /usr/sbin/nologin blobdrive";

/// Every way blobdrive gets onto a machine makes the user a mount daemon's
/// network-facing part runs as: scripts/install.sh (not for a staged install),
/// scripts/install-deps.sh, which the demo, the tests and CI run, the Debian
/// package's postinst, and the CSI driver's image. Each only when it is missing.
/// And each reserves the user's range of ids, which every mount's worker
/// takes a uid of its own from, with the one script that does it.
#[test]
fn every_way_to_install_makes_the_worker_s_user() {
    for script in ["scripts/install.sh", "scripts/install-deps.sh"] {
        let text = read(script);
        let at = text
            .find(&format!("\n        {USERADD}\n"))
            .or_else(|| text.find(&format!("\n    {USERADD}\n")))
            .unwrap_or_else(|| panic!("{script} does not run `{USERADD}`"));
        let guard = text[..at].rfind("\nif ").expect("a guard");
        assert!(
            text[guard..at].contains("! id blobdrive >/dev/null 2>&1"),
            "{script}: `{USERADD}` only when `id blobdrive` fails"
        );
    }
    let install = read("scripts/install.sh");
    assert!(install.contains("if [ -z \"$destdir\" ] && ! id blobdrive"));
    for (script, source) in [
        ("scripts/install.sh", ". scripts/debian/reserve-uids\n"),
        (
            "scripts/install-deps.sh",
            ". \"$(dirname \"$0\")/debian/reserve-uids\"\n",
        ),
    ] {
        let text = read(script);
        let at = text
            .find(source)
            .unwrap_or_else(|| panic!("{script} does not source reserve-uids"));
        assert!(
            text[at..]
                .trim_start_matches(source)
                .trim_start()
                .starts_with("reserve_uids\n"),
            "{script}"
        );
    }
    // The runtime image, the last stage, makes the user and its range.
    let dockerfile = read("deploy/kubernetes/Dockerfile");
    let runtime = &dockerfile[dockerfile.rfind("\nFROM ").unwrap()..];
    assert!(
        runtime.contains(&format!(
            "\nRUN (id blobdrive >/dev/null 2>&1 || {USERADD}) \\\n    && . /tmp/reserve-uids && reserve_uids"
        )),
        "{runtime}"
    );
    // The package's postinst has the script put in by package.sh.
    let postinst = read("scripts/debian/postinst");
    assert!(
        postinst.contains("\n#RESERVE_UIDS#\n    reserve_uids\n"),
        "{postinst}"
    );
    assert!(read("scripts/package.sh").contains("\nput postinst RESERVE_UIDS reserve-uids\n"));
    // The package's postinst, with Debian's adduser (tests/package.rs checks it
    // is made on a machine without it).
    let postinst = read("scripts/debian/postinst");
    let adduser = postinst
        .find("adduser --system")
        .expect("postinst runs adduser --system");
    assert!(postinst[..adduser].contains("if ! getent passwd blobdrive"));
    let call = &postinst[adduser..postinst[adduser..].find("\n    fi").unwrap() + adduser];
    for part in [
        "--no-create-home",
        "--shell /usr/sbin/nologin",
        " blobdrive",
    ] {
        assert!(call.contains(part), "{part}: {call}");
    }
}

/// Runs `script` with bash in a private mount namespace where /usr, /etc and
/// /var (and /sbin, where it is not a link into /usr) are overlays whose writes
/// go to a tmpfs, systemd's run directory is hidden, and /etc's user database
/// has no user blobdrive: whatever the script installs, that user included, is
/// seen by it alone and is gone with the namespace.
fn without_the_user(script: &str) -> std::process::Output {
    // SAFETY: geteuid cannot fail.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs as root");
    let scratch = tempfile::Builder::new()
        .prefix("blobdrive-scripts.")
        .tempdir()
        .unwrap();
    let prologue = format!(
        r#"set -euo pipefail
ov='{ov}'
mount -t tmpfs -o mode=0700 blobdrive-scripts-test "$ov"
dirs="usr etc var"
[ -L /sbin ] || dirs="$dirs sbin"
for d in $dirs; do
    mkdir -p "$ov/$d.upper" "$ov/$d.work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$ov/$d.upper,workdir=$ov/$d.work" "/$d"
done
[ -d /run/systemd ] && mount -t tmpfs tmpfs /run/systemd
for f in /etc/passwd /etc/shadow /etc/group /etc/gshadow /etc/subuid /etc/subgid; do
    if [ -e "$f" ]; then sed -i '/^blobdrive:/d' "$f"; fi
done
if id blobdrive >/dev/null 2>&1; then echo "the user is still there" >&2; exit 1; fi
cd '{root}'
"#,
        ov = scratch.path().display(),
        root = root(),
    );
    in_mount_namespace("bash")
        .arg("-c")
        .arg(format!("{prologue}{script}"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run bash in a mount namespace of its own")
}

/// The user's range of ids, in `out`'s lines `subuid=...` and `subgid=...`:
/// one line in each file, the same 65536 ids from 100000 on.
fn assert_range_reserved(out: &std::process::Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(key))
            .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect()
    };
    let (uids, gids) = (line("subuid="), line("subgid="));
    assert_eq!(uids.len(), 1, "one range: {text}");
    assert_eq!(uids, gids, "{text}");
    let f: Vec<&str> = uids[0].split(':').collect();
    assert_eq!(f[0], "blobdrive");
    assert!(f[1].parse::<u64>().unwrap() >= 100000, "{text}");
    assert_eq!(f[2], "65536", "{text}");
}

/// What `getent passwd blobdrive` says of the user made, in `out`'s line
/// `user=...`: a system user (uid below 1000) with no shell and no home made.
fn assert_system_user_made(out: &std::process::Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    let entry = text
        .lines()
        .find_map(|l| l.strip_prefix("user="))
        .unwrap_or_else(|| panic!("no user made: {all}"));
    let f: Vec<&str> = entry.split(':').collect();
    assert_eq!(f.len(), 7, "{entry}");
    assert_eq!(f[0], "blobdrive");
    assert!(f[2].parse::<u32>().unwrap() < 1000, "a system uid: {entry}");
    assert_eq!(f[6], "/usr/sbin/nologin", "{entry}");
    assert!(!text.contains("HOME-MADE"), "{all}");
}

/// On a machine without the user, `scripts/install-deps.sh --demo` (what the
/// demo runs; the tests' set and the benchmarks' make it the same way) and
/// `scripts/install.sh` make it and reserve its range of ids, once; a staged
/// install does neither.
#[test]
fn the_scripts_make_the_worker_s_user_when_it_is_missing() {
    let report = r#"
echo "user=$(getent passwd blobdrive)"
home="$(getent passwd blobdrive | cut -d: -f6)"
if [ -n "$home" ] && [ -e "$home" ]; then echo HOME-MADE; fi
echo "subuid=$(grep '^blobdrive:' /etc/subuid | tr '\n' ' ')"
echo "subgid=$(grep '^blobdrive:' /etc/subgid | tr '\n' ' ')"
"#;
    let deps = without_the_user(&format!(
        "scripts/install-deps.sh --demo\nscripts/install-deps.sh --demo\necho SECOND-RUN-DONE\n{report}\n"
    ));
    assert_system_user_made(&deps);
    assert_range_reserved(&deps);
    let said = String::from_utf8_lossy(&deps.stdout);
    assert_eq!(
        said.matches("creating the system user blobdrive").count(),
        1,
        "{said}"
    );
    assert!(said.contains("SECOND-RUN-DONE"), "{said}");

    let binary = env!("CARGO_BIN_EXE_blobdrive");
    let install = without_the_user(&format!(
        r#"stage="$(mktemp -d)"
scripts/install.sh --destdir "$stage" --binary '{binary}' >/dev/null
id blobdrive >/dev/null 2>&1 && echo STAGED-MADE-USER
grep -q '^blobdrive:' /etc/subuid && echo STAGED-RESERVED
rm -rf "$stage"
scripts/install.sh --binary '{binary}'
{report}"#
    ));
    assert_system_user_made(&install);
    assert_range_reserved(&install);
    let said = String::from_utf8_lossy(&install.stdout);
    assert!(!said.contains("STAGED-MADE-USER"), "{said}");
    assert!(!said.contains("STAGED-RESERVED"), "{said}");
    assert!(said.contains("created the system user blobdrive"), "{said}");
}

/// The README stays a front page; every page of docs/ is linked from the index,
/// docs/README.md; every relative link of the README and of docs/*.md names a
/// file that exists, and a `#part` of one names a heading of that page.
/// `sh -c SCRIPT` with `scripts/debian/PIECE` sourced first; its output,
/// which must be a success.
fn with_piece(piece: &str, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(". '{}/scripts/debian/{piece}'\n{script}", root()))
        .output()
        .expect("run sh");
    assert!(out.status.success(), "{script}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The mounts that block a removal of the package (prerm) or an uninstall
/// (install.sh), as `blobdrive list --json` lists them: one a line, a
/// snapshot's and a dead daemon's said so, odd characters as written, and
/// nothing of the CSI node plugins listed after them; nothing when nothing
/// is mounted or the program fails. The pieces are where package.sh and
/// install.sh put them.
#[test]
fn the_mounts_that_block_a_removal_are_read_from_list_json() {
    let dir = tempfile::tempdir().unwrap();
    let fake = |name: &str, json: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\ncat <<'J'\n{json}\nJ\n")).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        p.display().to_string()
    };
    let listed = fake(
        "listed",
        r#"[
  {
    "auth": "account key",
    "blob": "c/d.vhd",
    "kind": "mount",
    "mountpoint": "/mnt/a \"b\", c",
    "pid": 12,
    "running": true,
    "snapshot": null
  },
  {"blob":"c/e.vhd","kind":"mount","mountpoint":"/x","pid":1,"running":false,"snapshot":"2026-11-22T11:05:54.5810000Z","device":null},
  {
    "cache_budget": 6313000000,
    "cache_taken": 0,
    "kind": "csi_node",
    "node_id": "node-a",
    "volumes": 0
  }
]"#,
    );
    assert_eq!(
        with_piece("mounted-drives", &format!("mounted_drives '{listed}'")),
        "c/d.vhd at /mnt/a \"b\", c\n\
         c/e.vhd@2026-11-22T11:05:54.5810000Z at /x (its daemon is dead: blobdrive unmount /x cleans up)\n"
    );
    let only_nodes = fake(
        "nodes",
        r#"[{"cache_budget": 1, "cache_taken": 0, "kind": "csi_node", "node_id": "n", "volumes": 0}]"#,
    );
    for bd in [only_nodes.as_str(), "/bin/false", "/nonexistent/blobdrive"] {
        assert_eq!(
            with_piece("mounted-drives", &format!("mounted_drives '{bd}'")),
            "",
            "{bd}"
        );
    }
    assert!(read("scripts/debian/prerm").contains("\n#MOUNTED_DRIVES#\n"));
    assert!(read("scripts/package.sh").contains("\nput prerm MOUNTED_DRIVES mounted-drives\n"));
    assert!(read("scripts/install.sh").contains(". scripts/debian/mounted-drives\n"));
}

/// The helpers where mount(8) looks for them: the package ships them in
/// /usr/sbin; where /sbin is a directory of its own (not merged /usr),
/// postinst links them into it, leaving a name something else has alone, and
/// postrm takes only its own links away; on a merged /usr it makes nothing.
#[test]
fn the_helpers_are_linked_into_sbin_only_where_it_is_not_usr_sbin() {
    let split = tempfile::tempdir().unwrap();
    let r = split.path().display().to_string();
    std::fs::create_dir_all(split.path().join("usr/sbin")).unwrap();
    std::fs::create_dir(split.path().join("sbin")).unwrap();
    std::os::unix::fs::symlink(
        "/usr/local/bin/blobdrive",
        split.path().join("sbin/umount.blobdrive"),
    )
    .unwrap();
    with_piece(
        "helper-links",
        &format!("helper_links_add '{r}'; helper_links_add '{r}'"),
    );
    let link = |name: &str| std::fs::read_link(split.path().join("sbin").join(name));
    assert_eq!(
        link("mount.blobdrive").unwrap(),
        std::path::Path::new("/usr/sbin/mount.blobdrive")
    );
    assert_eq!(
        link("umount.blobdrive").unwrap(),
        std::path::Path::new("/usr/local/bin/blobdrive")
    );
    with_piece("helper-links", &format!("helper_links_remove '{r}'"));
    assert!(link("mount.blobdrive").is_err(), "its own link is gone");
    assert!(link("umount.blobdrive").is_ok(), "another's is left");
    let merged = tempfile::tempdir().unwrap();
    let m = merged.path().display().to_string();
    std::fs::create_dir_all(merged.path().join("usr/sbin")).unwrap();
    std::os::unix::fs::symlink("usr/sbin", merged.path().join("sbin")).unwrap();
    with_piece("helper-links", &format!("helper_links_add '{m}'"));
    assert_eq!(
        std::fs::read_dir(merged.path().join("usr/sbin"))
            .unwrap()
            .count(),
        0
    );
    for (script, call) in [
        ("postinst", "helper_links_add \"\""),
        ("postrm", "helper_links_remove \"\""),
    ] {
        let text = read(&format!("scripts/debian/{script}"));
        assert!(
            text.contains("\n#HELPER_LINKS#\n") && text.contains(call),
            "{script}"
        );
        assert!(read("scripts/package.sh")
            .contains(&format!("\nput {script} HELPER_LINKS helper-links\n")));
    }
}

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
