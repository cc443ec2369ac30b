//! The manual runs as written. Every shell block (a fence with language `sh`
//! or `bash`) of README.md and docs/*.md is run here, as root, against a local
//! emulator, exactly as the page shows it; a block that cannot run on a test
//! machine says so in the page, on the line before it:
//!
//! ```text
//! <!-- not run: needs an Azure account and the Azure CLI (az) -->
//! ```
//!
//! naming what it needs that a test machine does not have. A code block that is
//! not commands says what it is (```text, ```yaml, ...): one without a language
//! is refused, as is a mark with no reason or before a block that is not run.
//! docs/README.md gives writers these rules.
//!
//! Each page runs on a machine of its own: a private mount namespace whose root
//! is an overlay of this machine's (writes go to a tmpfs and vanish with it),
//! with private /run and /tmp and an empty /etc/fstab, chrooted into. The reader
//! there has done the README's first mount: blobdrive is installed (the binary
//! under test, as scripts/install.sh puts it: /usr/local/bin, the helpers in
//! /sbin), AZURE_STORAGE_CONNECTION_STRING names the emulator, and the drive
//! disks/data.vhd (64 GiB, ext4, holding hello.txt) is in it, not mounted; the
//! README itself starts from an empty account. The page's blocks run in order in
//! one bash (`set -euo pipefail`), in the checkout, so a block may use what an
//! earlier one set. One cargo is not the real one: `cargo build --release`,
//! which scripts/package.sh, install.sh and demo.sh run, takes many minutes on a
//! test machine, so it hands over the binary under test instead.
//!
//! `BLOBDRIVE_MANUAL_ONLY=boot.md cargo test --test manual` runs only the pages
//! whose path contains `boot.md` (every page is still checked for its marks).

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::azurite::{delete_every_container, put_container, Azurite};
use common::bd::{isolated_cs, Harness};
use common::mount::require_root;
use common::namespace::in_mount_namespace;

/// Blobdrive's own commands against this binary's own emulator (never one
/// shared through BLOBDRIVE_TEST_AZURITE_PORT): the test wipes its account
/// before each page.
const BD: Harness = Harness::new("manual-run").account(isolated_cs);

fn checkout() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Fence languages whose blocks are commands, run here.
const RUN: &[&str] = &["sh", "bash"];
/// Fence languages of blocks that are not commands.
const NOT_COMMANDS: &[&str] = &[
    "text",
    "yaml",
    "json",
    "promql",
    "toml",
    "ini",
    "dockerfile",
    "rust",
    "diff",
    "proto",
];
/// The mark before a block that cannot run here.
const MARK: &str = "<!-- not run:";

/// What a writer is told when a block fails or lacks its mark.
const RULES: &str = "A shell block runs as written on a test machine (as root, in a sandbox, \
against the emulator: docs/README.md says what each page starts with); one that cannot, for \
something a test machine does not have, is marked on the line before it: \
<!-- not run: WHAT IT NEEDS -->";

/// A fenced code block of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    /// The line of its opening fence (1-based).
    line: usize,
    lang: String,
    text: String,
    /// Why it is not run, from its mark.
    not_run: Option<String>,
}

impl Block {
    fn runs(&self) -> bool {
        RUN.contains(&self.lang.as_str()) && self.not_run.is_none()
    }
}

/// The code blocks of the page `path`, and what is wrong with them.
fn blocks(path: &str, text: &str) -> (Vec<Block>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut problems) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let Some((indent, fence, info)) = opening_fence(lines[i]) else {
            if let Some(p) = stray_mark(path, &lines, i) {
                problems.push(p);
            }
            i += 1;
            continue;
        };
        let start = i;
        let end = (i + 1..lines.len()).find(|&j| closes(lines[j], &fence));
        let Some(end) = end else {
            problems.push(format!(
                "{path}:{}: a code block that never ends",
                start + 1
            ));
            break;
        };
        let body: Vec<&str> = lines[start + 1..end]
            .iter()
            .map(|l| strip_indent(l, indent))
            .collect();
        let lang = info.split_whitespace().next().unwrap_or("").to_string();
        let not_run = mark_before(&lines, start);
        let at = format!("{path}:{}", start + 1);
        if lang.is_empty() {
            problems.push(format!(
                "{at}: a code block without a language: ```sh if it is commands (run by tests/manual.rs), ```text (or {}) if not",
                NOT_COMMANDS[1..].join(", ")
            ));
        } else if !RUN.contains(&lang.as_str()) && !NOT_COMMANDS.contains(&lang.as_str()) {
            problems.push(format!(
                "{at}: ```{lang} is neither commands (```sh) nor a known kind of text ({})",
                NOT_COMMANDS.join(", ")
            ));
        }
        match &not_run {
            Some(Err(e)) => problems.push(format!("{at}: {e}")),
            Some(Ok(_)) if !RUN.contains(&lang.as_str()) => problems.push(format!(
                "{at}: a not-run mark before a ```{lang} block, which is never run anyway"
            )),
            _ => {}
        }
        out.push(Block {
            line: start + 1,
            lang,
            text: body.join("\n") + "\n",
            not_run: not_run.and_then(Result::ok),
        });
        i = end + 1;
    }
    (out, problems)
}

/// An opening fence: its indentation (a block in a list item is indented with
/// it), its fence (three or more backticks or tildes, as written) and its info
/// string.
fn opening_fence(line: &str) -> Option<(usize, String, String)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let c = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = rest.chars().take_while(|x| *x == c).count();
    (n >= 3).then(|| (indent, rest[..n].to_string(), rest[n..].trim().to_string()))
}

/// Whether `line` closes a block opened with `fence`.
fn closes(line: &str, fence: &str) -> bool {
    let t = line.trim();
    let c = fence.chars().next().unwrap_or('`');
    t.len() >= fence.len() && t.chars().all(|x| x == c)
}

/// `line` without up to `n` spaces of indentation (a block inside a list item).
fn strip_indent(line: &str, n: usize) -> &str {
    let spaces = line.len() - line.trim_start_matches(' ').len();
    &line[spaces.min(n)..]
}

/// The not-run mark on the last non-blank line before line `i`, if there is
/// one: its reason, or what is wrong with it.
fn mark_before(lines: &[&str], i: usize) -> Option<Result<String, String>> {
    let prev = lines[..i]
        .iter()
        .rev()
        .find(|l| !l.trim().is_empty())?
        .trim();
    if !prev.starts_with(MARK) {
        return None;
    }
    Some(
        prev.strip_suffix("-->")
            .map(|m| m[MARK.len()..].trim().to_string())
            .filter(|reason| !reason.is_empty())
            .ok_or_else(|| {
                format!("a not-run mark must say why on its one line: {MARK} WHAT IT NEEDS -->")
            }),
    )
}

/// A not-run mark at line `i` that no code block follows.
fn stray_mark(path: &str, lines: &[&str], i: usize) -> Option<String> {
    if !lines[i].trim().starts_with(MARK) {
        return None;
    }
    let next = lines[i + 1..].iter().find(|l| !l.trim().is_empty());
    match next.and_then(|l| opening_fence(l)) {
        Some(_) => None,
        None => Some(format!(
            "{path}:{}: a not-run mark with no code block after it",
            i + 1
        )),
    }
}

/// README.md, then every page of docs/, as paths from the checkout.
fn pages() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(checkout().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    [vec!["README.md".to_string()], docs].concat()
}

#[cfg(test)]
mod parsing {
    use super::*;

    #[test]
    fn blocks_marks_and_what_is_wrong_with_them() {
        let page = "\
Text.

```sh
echo one
```

1. A step:

   <!-- not run: needs a Kubernetes cluster -->
   ```sh
   kubectl apply -k x
     indented more
   ```

```
no language
```

<!-- not run: -->
```sh
echo two
```

```yaml
a: 1
```

<!-- not run: nothing follows -->

Text again.

<!-- not run: text is never run -->
```text
plain
```

````bash
echo ```
````
";
        let (b, problems) = blocks("p.md", page);
        let summary: Vec<(usize, &str, bool)> = b
            .iter()
            .map(|b| (b.line, b.lang.as_str(), b.runs()))
            .collect();
        assert_eq!(
            summary,
            vec![
                (3, "sh", true),
                (10, "sh", false),
                (15, "", false),
                (20, "sh", true),
                (24, "yaml", false),
                (33, "text", false),
                (37, "bash", true),
            ]
        );
        assert_eq!(b[0].text, "echo one\n");
        assert_eq!(b[1].text, "kubectl apply -k x\n  indented more\n");
        assert_eq!(b[1].not_run.as_deref(), Some("needs a Kubernetes cluster"));
        assert_eq!(b[6].text, "echo ```\n");
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].starts_with("p.md:15: a code block without a language"));
        assert!(problems[1].starts_with("p.md:20: a not-run mark must say why"));
        assert!(problems[2].starts_with("p.md:28: a not-run mark with no code block"));
        assert!(problems[3].starts_with("p.md:33: a not-run mark before a ```text block"));
        let (_, problems) = blocks("q.md", "```sh\necho\n");
        assert_eq!(problems, vec!["q.md:1: a code block that never ends"]);
        let (_, problems) = blocks("r.md", "```console\n$ x\n```\n");
        assert!(
            problems[0].starts_with("r.md:1: ```console is neither"),
            "{problems:?}"
        );
    }
}

/// The machine a page runs on, as it is set up inside the sandbox (run with
/// bash in the chroot): blobdrive installed as scripts/install.sh puts it, an
/// empty fstab, and the cargo that hands over the binary under test for a
/// release build. $1: the binary, $2: the real cargo.
const SETUP: &str = r#"set -euo pipefail
bin="$1" real_cargo="$2"
ln -s "$bin" /usr/local/bin/blobdrive
ln -sfn /usr/local/bin/blobdrive /sbin/mount.blobdrive
ln -sfn /usr/local/bin/blobdrive /sbin/umount.blobdrive
echo '# the fstab of the sandbox tests/manual.rs runs a page in: no line yet' > /etc/fstab
cat > /usr/local/bin/cargo <<EOF
#!/bin/sh
# tests/manual.rs: a release build of blobdrive takes many minutes on a test
# machine, so this hands over the binary under test instead; any other cargo
# command is the real one.
case " \$* " in
    *" build "*"--release "*|*" build "*"--profile release "*)
        echo "cargo \$*: tests/manual.rs hands over the binary under test instead" >&2
        exec install -D -m 755 '$bin' target/release/blobdrive ;;
    *) PATH="\$(dirname '$real_cargo'):\$PATH" exec '$real_cargo' "\$@" ;;
esac
EOF
chmod 755 /usr/local/bin/cargo
"#;

/// What a page left mounted is taken down (run with bash in the chroot, after
/// the page). $1: the binary.
const CLEANUP: &str = r#"for rec in /run/blobdrive/mounts/*.json; do
    [ -e "$rec" ] || continue
    mp="$(sed -n 's/^  "mountpoint": "\(.*\)",$/\1/p' "$rec")"
    [ -n "$mp" ] && "$1" unmount "$mp" --discard-dirty --yes >/dev/null 2>&1
done
true
"#;

/// The sandbox (run with bash in a mount namespace of its own): $1 the scratch directory, $2
/// the binary, $3 the real cargo, $4 how many seconds a page may take; the
/// account in `MANUAL_CS`. It runs `$1/page.sh` in the chroot with a reader's
/// environment, its output on stdout, and exits with its status.
const SANDBOX: &str = r#"set -euo pipefail
scratch="$1" bin="$2" real_cargo="$3" limit="$4"
# The filesystems the page needs besides the root's, when they are mounts of
# their own: the checkout's, the scratch directory's, the binary's, cargo's.
needed="$(for p in "$PWD" "$scratch" "$bin" "$real_cargo"; do findmnt -n -o TARGET -T "$p"; done | sort -u | grep -vx / || true)"
# The copies of other tests' drives were let go of before bash started
# (tests/common/namespace.rs). Let go of every other mount copied into this
# namespace too, but the system's own and those the page needs; without
# touching libmount's utab, which the machine shares (-n), or running an
# unmount helper (-i).
findmnt -rn -o TARGET | sort -r | while read -r t; do
    case "$t" in /|/proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
    grep -qxF "$t" <<<"$needed" || umount -l -n -i "$t" 2>/dev/null || true
done
ov="$scratch/ov"
mkdir -p "$ov"
mount -t tmpfs -o mode=0700 blobdrive-manual "$ov"
r="$ov/root"
mkdir "$r"
# A filesystem seen through an overlay whose writes go to the tmpfs.
n=0
layer() {
    n=$((n + 1))
    mkdir -p "$ov/upper$n" "$ov/work$n"
    mount -t overlay overlay -o "lowerdir=$1,upperdir=$ov/upper$n,workdir=$ov/work$n" "$r$1"
}
layer /
while read -r m; do [ -n "$m" ] && layer "$m"; done <<<"$needed"
for d in proc sys dev; do mount --rbind "/$d" "$r/$d"; done
mount -t tmpfs -o mode=0755 tmpfs "$r/run"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
# The private /tmp would hide a checkout, scratch directory, binary or cargo
# that lives under /tmp (a clone in /tmp/fresh): each such directory of /tmp
# is seen again, through an overlay as the rest.
for p in "$PWD" "$scratch" "$bin" "$real_cargo"; do
    case "$p" in /tmp/?*) ;; *) continue ;; esac
    top="/tmp/$(cut -d/ -f3 <<<"$p")"
    [ -d "$r$top" ] && continue
    mkdir -p "$r$top"
    layer "$top"
done
chroot "$r" /bin/bash "$scratch/setup.sh" "$bin" "$real_cargo"
set +e
timeout -k 10 "$limit" chroot "$r" /usr/bin/env -i HOME=/root USER=root LOGNAME=root \
    SHELL=/bin/bash LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    AZURE_STORAGE_CONNECTION_STRING="$MANUAL_CS" /bin/bash "$scratch/page.sh" 2>&1
rc=$?
chroot "$r" /bin/bash "$scratch/cleanup.sh" "$bin"
for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$r" ] && kill -9 "${p#/proc/}" 2>/dev/null
done
exit "$rc"
"#;

/// How long a page may take before it counts as hung.
const PAGE_LIMIT_SECS: u32 = 600;

/// The bash that runs a page's blocks in order: each from a file of its own
/// (`block-LINE.sh`), between markers that say which block ran and, from the
/// ERR trap, which command of it failed.
fn page_script(scratch: &Path, blocks: &[&Block]) -> String {
    let mut s = format!(
        "set -eEuo pipefail\n\
         trap 'rc=$?; printf \"\\n@@manual failed %s %s %s\\n\" \"${{BASH_SOURCE[0]##*/}}\" \"$LINENO\" \"$rc\"' ERR\n\
         cd '{}'\n",
        checkout().display()
    );
    for b in blocks {
        let _ = writeln!(
            s,
            "printf '@@manual start {0}\\n'\nsource '{1}/block-{0}.sh'\nprintf '@@manual ok {0}\\n'",
            b.line,
            scratch.display()
        );
    }
    s
}

/// What a page's run said about a block that failed: the doc line of the
/// command, its status, and the block's output.
fn failure(path: &str, blocks: &[&Block], out: &str, status: Option<i32>) -> String {
    let mut block_line = None;
    let mut failed = None;
    let mut said = Vec::new();
    for l in out.lines() {
        if let Some(n) = l.strip_prefix("@@manual start ") {
            block_line = n.parse::<usize>().ok();
            said.clear();
            failed = None;
        } else if let Some(f) = l.strip_prefix("@@manual failed ") {
            // The last: a command substitution that failed says so first, then
            // the command around it, on the block's line.
            failed = Some(f.to_string());
        } else if !l.starts_with("@@manual ok ") {
            said.push(l);
        }
    }
    let tail = said[said.len().saturating_sub(40)..].join("\n    ");
    let Some(line) = block_line else {
        return format!("{path}: the page did not start (status {status:?}):\n    {tail}");
    };
    let block = blocks.iter().find(|b| b.line == line);
    let what = failed.as_deref().and_then(|f| {
        let mut w = f.split_whitespace();
        let file = w.next()?;
        let n: usize = w.next()?.parse().ok()?;
        let rc = w.next()?;
        let at: usize = file
            .strip_prefix("block-")?
            .strip_suffix(".sh")?
            .parse()
            .ok()?;
        let text = blocks
            .iter()
            .find(|b| b.line == at)?
            .text
            .lines()
            .nth(n - 1)?;
        Some((at + n, rc.to_string(), text.trim().to_string()))
    });
    let head = match what {
        Some((doc_line, rc, text)) => format!(
            "{path}:{doc_line}: this command of the block at line {line} failed (exit {rc}):\n    {text}"
        ),
        None if status == Some(124) || status == Some(137) => format!(
            "{path}:{line}: the block did not finish within {PAGE_LIMIT_SECS} s"
        ),
        None => format!("{path}:{line}: the block failed (status {status:?})"),
    };
    let shown = block.map_or(String::new(), |b| b.text.replace('\n', "\n    "));
    format!("{head}\n  the block:\n    {shown}\n  what it printed (the last 40 lines):\n    {tail}")
}

/// Runs the blocks of page `path` in a sandbox of their own: what failed, if
/// anything.
fn run_page(path: &str, blocks: &[&Block], scratch: &Path) -> Option<String> {
    let dir = scratch.join(path.replace('/', "-"));
    std::fs::create_dir_all(&dir).unwrap();
    for b in blocks {
        std::fs::write(dir.join(format!("block-{}.sh", b.line)), &b.text).unwrap();
    }
    std::fs::write(dir.join("page.sh"), page_script(&dir, blocks)).unwrap();
    std::fs::write(dir.join("setup.sh"), SETUP).unwrap();
    std::fs::write(dir.join("cleanup.sh"), CLEANUP).unwrap();
    let sandbox = dir.join("sandbox.sh");
    std::fs::write(&sandbox, SANDBOX).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = in_mount_namespace("bash")
        .arg(&sandbox)
        .arg(&dir)
        .arg(env!("CARGO_BIN_EXE_blobdrive"))
        .arg(cargo)
        .arg(PAGE_LIMIT_SECS.to_string())
        .env("MANUAL_CS", BD.cs())
        .current_dir(checkout())
        .stdin(Stdio::null())
        .output()
        .expect("run bash in a mount namespace of its own");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let ran_all = blocks
        .iter()
        .all(|b| text.contains(&format!("@@manual ok {}\n", b.line)));
    if out.status.success() && ran_all {
        return None;
    }
    Some(failure(path, blocks, &text, out.status.code()))
}

/// What the README's first mount leaves, which every other page starts from:
/// disks/data.vhd, 64 GiB, ext4 with hello.txt, not mounted. Made once, kept as
/// a (sparse) VHD in `scratch` and uploaded for each page.
fn reader_s_drive(scratch: &Path) -> PathBuf {
    let spec = "disks/data.vhd";
    BD.ok(&["create", spec, "--size", "64GiB", "--create-container"]);
    let mp = BD.mp();
    BD.mount(spec, &mp, &["--mkfs", "ext4"]);
    std::fs::write(mp.path().join("hello.txt"), "hello\n").unwrap();
    BD.unmount(&mp);
    let image = scratch.join("data.vhd");
    BD.ok(&["download", spec, image.to_str().unwrap()]);
    image
}

/// The account as the page `path` starts with it: empty for the README, the
/// reader's drive for the rest.
fn account_for(path: &str, image: &Path) {
    let az = Azurite::isolated();
    delete_every_container(az);
    if path != "README.md" {
        let (status, body) = put_container(az, "disks");
        assert_eq!(status, 201, "{body}");
        BD.ok(&["upload", image.to_str().unwrap(), "disks/data.vhd"]);
    }
}

#[test]
fn every_shell_block_of_the_manual_runs_as_written_or_says_why_not() {
    require_root();
    let only = std::env::var("BLOBDRIVE_MANUAL_ONLY").unwrap_or_default();
    let mut problems = Vec::new();
    let mut to_run = Vec::new();
    for path in pages() {
        let text = std::fs::read_to_string(checkout().join(&path)).unwrap();
        let (blocks, wrong) = blocks(&path, &text);
        problems.extend(wrong);
        if path.contains(&only) {
            to_run.push((path, blocks));
        }
    }
    let scratch = tempfile::Builder::new()
        .prefix("manual.")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    delete_every_container(Azurite::isolated());
    let image = reader_s_drive(scratch.path());
    let (mut ran, mut not_run) = (0, 0);
    for (path, blocks) in &to_run {
        let runs: Vec<&Block> = blocks.iter().filter(|b| b.runs()).collect();
        not_run += blocks
            .iter()
            .filter(|b| RUN.contains(&b.lang.as_str()) && !b.runs())
            .count();
        if runs.is_empty() {
            continue;
        }
        ran += runs.len();
        account_for(path, &image);
        let start = std::time::Instant::now();
        let failed = run_page(path, &runs, scratch.path());
        eprintln!(
            "{path}: {} block(s) in {:.1?}{}",
            runs.len(),
            start.elapsed(),
            if failed.is_some() { ", FAILED" } else { "" }
        );
        problems.extend(failed);
    }
    eprintln!("ran {ran} shell blocks; {not_run} marked not run");
    assert!(
        problems.is_empty(),
        "{} problem(s) in the manual:\n\n{}\n\n{RULES}",
        problems.len(),
        problems.join("\n\n")
    );
}
