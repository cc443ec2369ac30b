//! `blobdrive manpages DIR`: writes the manual pages. blobdrive(8) and one
//! blobdrive-COMMAND(8) per command are made by clap_mangen from the same clap
//! definitions as `--help`, so the two cannot drift apart; the sections clap has
//! nothing for (FILES, ENVIRONMENT, EXIT STATUS, SECURITY, EXAMPLES, SEE ALSO) and
//! the pages of the mount(8) and umount(8) helpers, which have command lines of
//! their own outside clap, are written by hand in `man/` and built into the binary.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::CommandFactory;
use clap_mangen::Man;

/// The hand-written sections of blobdrive(8), after the generated ones.
const BLOBDRIVE_SECTIONS: &str = include_str!("man/blobdrive.sections.8");
/// mount.blobdrive(8): every option an fstab line may give.
pub const MOUNT_HELPER_PAGE: &str = include_str!("man/mount.blobdrive.8");
/// umount.blobdrive(8).
const UMOUNT_HELPER_PAGE: &str = include_str!("man/umount.blobdrive.8");

/// After the title: names, options and URLs are not hyphenated (a break inside
/// AZURE_STORAGE_CONNECTION_STRING reads as a different name), and lines are
/// not stretched to the margin around them.
const NO_HYPHENATION: &str = ".nh\n.ad l\n";

/// The section every page is in: blobdrive is an administrator's tool (mounting
/// needs root), as mount(8) is.
const SECTION: &str = "8";
const MANUAL: &str = "System Administration";

#[derive(Debug, clap::Args)]
#[command(after_help = "\
The pages: blobdrive(8), blobdrive-COMMAND(8) for each command (blobdrive-lease-status(8)
for a command's command), mount.blobdrive(8) with every fstab option, and
umount.blobdrive(8). The package installs them; `man -l DIR/blobdrive.8` reads one in
place.")]
pub struct Args {
    /// The directory to write the pages into (created if missing).
    pub dir: PathBuf,
    /// Print {"written": [PATH, ...]} instead of a path a line.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in pages() {
        let path = args.dir.join(&name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            println!("{}", path.display());
        }
        written.push(path);
    }
    if args.json {
        return super::print_json(&serde_json::json!({ "written": written }));
    }
    Ok(())
}

/// Every page: its file name and its roff text.
pub fn pages() -> Vec<(String, String)> {
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = vec![(
        format!("blobdrive.{SECTION}"),
        command_page(&cmd, BLOBDRIVE_SECTIONS),
    )];
    command_pages(&cmd, &mut pages);
    for page in [MOUNT_HELPER_PAGE, UMOUNT_HELPER_PAGE] {
        let name = page_name(page);
        pages.push((format!("{name}.{SECTION}"), with_version(page)));
    }
    pages
}

/// blobdrive-COMMAND(8) for every command under `parent`, and theirs under them.
fn command_pages(parent: &clap::Command, pages: &mut Vec<(String, String)>) {
    for sub in parent.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_display_name().unwrap_or(sub.get_name()).to_string();
        let parent_name = parent.get_display_name().unwrap_or(parent.get_name());
        let see_also = format!(
            ".SH \"SEE ALSO\"\n{}\n",
            man_refs(&[parent_name, "blobdrive"])
        );
        pages.push((format!("{name}.{SECTION}"), command_page(sub, &see_also)));
        command_pages(sub, pages);
    }
}

/// A command's page: what clap_mangen makes of its definition (title, NAME,
/// SYNOPSIS, DESCRIPTION, OPTIONS, its commands), its `--help` epilogue as NOTES,
/// then `extra`.
fn command_page(cmd: &clap::Command, extra: &str) -> String {
    let man = Man::new(cmd.clone()).section(SECTION);
    let mut out = Vec::new();
    let rendered = (|| -> std::io::Result<()> {
        man.render_title(&mut out)?;
        out.extend_from_slice(NO_HYPHENATION.as_bytes());
        man.render_name_section(&mut out)?;
        out.extend_from_slice(synopsis(cmd).as_bytes());
        man.render_description_section(&mut out)?;
        if cmd.get_arguments().any(|a| !a.is_hide_set()) {
            man.render_options_section(&mut out)?;
        }
        if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
            man.render_subcommands_section(&mut out)?;
        }
        Ok(())
    })();
    rendered.expect("rendering into memory cannot fail");
    let page = String::from_utf8(out).expect("clap_mangen writes UTF-8");
    // clap_mangen leaves out an empty date, which moves the source and manual
    // into the wrong fields of .TH; this one has them in place (and no date: the
    // page changes with the program, whose version it names).
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let title = format!(
        ".TH {name} {SECTION} \"\" \"blobdrive {}\" \"{MANUAL}\"",
        env!("CARGO_PKG_VERSION")
    );
    let mut page: String = page
        .lines()
        .map(|l| {
            if l.starts_with(".TH ") {
                title.as_str()
            } else {
                l
            }
        })
        .fold(String::new(), |mut acc, l| {
            acc.push_str(l);
            acc.push('\n');
            acc
        });
    if let Some(epilogue) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        page.push_str(".SH NOTES\n");
        page.push_str(&help_text_to_roff(&epilogue.to_string()));
    }
    page.push_str(&with_version(extra));
    page
}

/// SYNOPSIS with each option's value, as `--help` shows it (`[--auth HOW]`,
/// `[--mode fs|block|raw]`): clap_mangen's leaves values out, and an option
/// shown bare reads as a flag.
fn synopsis(cmd: &clap::Command) -> String {
    let bold = |t: &str| format!("\\fB{}\\fR", escape(t));
    let italic = |t: &str| format!("\\fI{}\\fR", escape(t));
    // As it is typed: `blobdrive lease status`, not the page's name.
    let name = cmd
        .get_bin_name()
        .or(cmd.get_display_name())
        .unwrap_or(cmd.get_name());
    let mut words = vec![bold(name)];
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        // A name the definition gave (`HOW`), else the values there are
        // (`fs|block|raw`), else the argument's name in capitals.
        let value = || {
            let default_name = arg.get_id().as_str().to_uppercase();
            let named = arg
                .get_value_names()
                .map(|n| {
                    n.iter()
                        .map(|n| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .filter(|n| *n != default_name);
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            match named {
                Some(n) => n,
                None if values.is_empty() => default_name,
                None => values.join("|"),
            }
        };
        if arg.is_positional() {
            let v = italic(&value());
            words.push(if arg.is_required_set() {
                v
            } else {
                format!("[{v}]")
            });
            continue;
        }
        let flag = match (arg.get_short(), arg.get_long()) {
            (Some(s), Some(l)) => format!("{}|{}", bold(&format!("-{s}")), bold(&format!("--{l}"))),
            (Some(s), None) => bold(&format!("-{s}")),
            (None, Some(l)) => bold(&format!("--{l}")),
            (None, None) => continue,
        };
        // A value is kept on its option's line (`\ `, roff's unbreakable space).
        let taken = if arg.get_action().takes_values() {
            format!("{flag}\\ {}", italic(&value()))
        } else {
            flag
        };
        let repeated = matches!(
            arg.get_action(),
            clap::ArgAction::Count | clap::ArgAction::Append
        );
        words.push(format!("[{taken}]{}", if repeated { "..." } else { "" }));
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        words.push(italic("COMMAND"));
    }
    format!(".SH SYNOPSIS\n{}\n", words.join(" "))
}

/// `--help` prose as roff: paragraphs filled, and the indented lines (examples,
/// lists) kept as they are, as they read in a terminal.
fn help_text_to_roff(text: &str) -> String {
    let mut out = String::new();
    let mut in_block = false;
    let mut para_open = false;
    for line in text.lines() {
        if line.trim().is_empty() {
            if in_block {
                out.push_str(".RE\n.fi\n");
                in_block = false;
            }
            para_open = false;
            continue;
        }
        if !para_open {
            out.push_str(".PP\n");
            para_open = true;
        }
        let indented = line.starts_with("  ");
        if indented && !in_block {
            out.push_str(".nf\n.RS 2\n");
            in_block = true;
        } else if !indented && in_block {
            out.push_str(".RE\n.fi\n");
            in_block = false;
        }
        let text = if indented { &line[2..] } else { line };
        let _ = writeln!(out, "{}", escape(text));
    }
    if in_block {
        out.push_str(".RE\n.fi\n");
    }
    out
}

/// Text made safe for roff: backslashes shown, a leading `.` or `'` not taken for
/// a request, and `-` a minus (so that options copied from the page work).
fn escape(line: &str) -> String {
    let s = line.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// `\fBa\fR(8), \fBb\fR(8)`.
fn man_refs(names: &[&str]) -> String {
    let mut seen = Vec::new();
    for n in names {
        if !seen.contains(n) {
            seen.push(*n);
        }
    }
    seen.iter()
        .map(|n| format!("\\fB{}\\fR({SECTION})", n.replace('-', "\\-")))
        .collect::<Vec<_>>()
        .join(",\n")
}

/// A hand-written page with `@VERSION@` replaced.
fn with_version(page: &str) -> String {
    page.replace("@VERSION@", env!("CARGO_PKG_VERSION"))
}

/// The page's name from its `.TH` line.
fn page_name(page: &str) -> String {
    page.lines()
        .find_map(|l| l.strip_prefix(".TH "))
        .and_then(|l| l.split_whitespace().next())
        .expect("a hand-written page starts with .TH")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use blobdrive::mount::helper;

    fn page(name: &str) -> String {
        pages()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no page {name}"))
            .1
    }

    #[test]
    fn a_page_for_every_command_and_helper_and_none_for_the_daemon() {
        let names: Vec<String> = pages().into_iter().map(|(n, _)| n).collect();
        for want in [
            "blobdrive.8",
            "blobdrive-mount.8",
            "blobdrive-lease.8",
            "blobdrive-lease-status.8",
            "blobdrive-snapshot-prune.8",
            "blobdrive-completions.8",
            "blobdrive-manpages.8",
            "mount.blobdrive.8",
            "umount.blobdrive.8",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
        assert!(!names
            .iter()
            .any(|n| n.contains("daemon") || n.contains("help")));
    }

    #[test]
    fn the_main_page_has_the_generated_and_the_written_sections() {
        let p = page("blobdrive.8");
        for section in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH OPTIONS",
            ".SH NOTES",
            ".SH FILES",
            ".SH ENVIRONMENT",
            ".SH \"EXIT STATUS\"",
            ".SH SECURITY",
            ".SH EXAMPLES",
            ".SH \"SEE ALSO\"",
        ] {
            assert!(p.contains(section), "blobdrive.8 lacks {section}");
        }
        // Straight from the clap definitions, options with their values.
        assert!(p.contains("blobdrive\\-mount(8)"));
        let plain_page = plain(&p);
        let synopsis = plain_page
            .lines()
            .skip_while(|l| *l != ".SH SYNOPSIS")
            .nth(1)
            .unwrap();
        for option in [
            "[--connection-string CS]",
            "[--auth HOW]",
            "[-v|--verbose]...",
            "COMMAND",
        ] {
            assert!(synopsis.contains(option), "{option}: {synopsis}");
        }
        let m = plain(&page("blobdrive-mount.8"));
        for option in [
            "BLOB MOUNTPOINT",
            "[--mode fs|block|raw]",
            "[--mkfs ext4|xfs]",
            "[--read-only]",
        ] {
            assert!(m.contains(option), "{option}: {m}");
        }
        assert!(p.contains("\\-\\-connection\\-string"));
        assert!(!p.contains("@VERSION@"));
        let m = page("blobdrive-mount.8");
        assert!(m.contains("\\-\\-disk\\-cache\\-size"), "{m}");
    }

    /// The page's words: roff's font changes and quotes taken out, `\-` as `-`.
    fn plain(page: &str) -> String {
        page.replace("\\fB", "")
            .replace("\\fI", "")
            .replace("\\fR", "")
            .replace("\\-", "-")
            .replace("\\ ", " ")
            .replace('"', " ")
    }

    /// Whether `word` occurs in `text` on its own, not inside a longer name
    /// (`dev` in `nodev` does not count).
    fn mentions(text: &str, word: &str) -> bool {
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        text.match_indices(word).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + word.len()..].chars().next();
            !before.is_some_and(name_char) && !after.is_some_and(name_char)
        })
    }

    /// Every option the helper's parser takes, and every flag, is in its page.
    #[test]
    fn the_helper_page_names_every_option_the_parser_takes() {
        let text = plain(&page("mount.blobdrive.8"));
        let mut missing: Vec<String> = helper::option_names()
            .filter(|n| !mentions(&text, n))
            .map(String::from)
            .collect();
        for flag in ["-s", "-f", "-n", "-v", "-o", "-t", "-N"] {
            if !mentions(&text, flag) {
                missing.push(flag.into());
            }
        }
        if !text.contains("x-*") {
            missing.push("x-*".into());
        }
        assert!(missing.is_empty(), "mount.blobdrive.8 lacks {missing:?}");
        // The check can tell: a name in a longer one is not a mention.
        assert!(!mentions("nodev,nosuid", "dev") && mentions("a dev,b", "dev"));
    }

    #[test]
    fn help_prose_keeps_its_examples_as_lines() {
        let r = help_text_to_roff(
            "First line\nsecond.\n\nExamples:\n  a -b\n  .c\nafter\n\n  x\n\nend",
        );
        assert_eq!(
            r,
            ".PP\nFirst line\nsecond.\n.PP\nExamples:\n.nf\n.RS 2\na \\-b\n\\&.c\n.RE\n.fi\nafter\n\
             .PP\n.nf\n.RS 2\nx\n.RE\n.fi\n.PP\nend\n"
        );
    }
}
