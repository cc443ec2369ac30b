//! `blobdrive completions SHELL`: the shell's completion script on stdout, made by
//! clap_complete from the same definitions as `--help`, so it knows every command
//! and option the binary has. The package installs its output; from a source
//! install, e.g. `blobdrive completions bash > /etc/bash_completion.d/blobdrive`.

use anyhow::Result;
use clap::CommandFactory;

/// The shells whose completions are built and tested.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Where the scripts go (the package puts them there):
  bash  /usr/share/bash-completion/completions/blobdrive
  zsh   /usr/share/zsh/vendor-completions/_blobdrive (or a directory in $fpath)
  fish  /usr/share/fish/vendor_completions.d/blobdrive.fish")]
pub struct Args {
    /// The shell to write the completion script for.
    pub shell: Shell,
}

/// Writes the script for `shell` to `out`.
pub fn write(shell: Shell, out: &mut dyn std::io::Write) {
    let generator = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut cmd = super::Cli::command();
    cmd.build();
    clap_complete::generate(generator, &mut visible(&cmd), "blobdrive", out);
}

/// A copy of `cmd` without its hidden commands and arguments (the internal
/// `__daemon`): clap_complete offers hidden commands like any other. `cmd` must be
/// built, so the copy takes the help and version flags and the global options as
/// they were given to each command.
fn visible(cmd: &clap::Command) -> clap::Command {
    let mut copy = clap::Command::new(cmd.get_name().to_string())
        .disable_help_flag(true)
        .disable_version_flag(true)
        .disable_help_subcommand(true)
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(visible),
        );
    if let Some(version) = cmd.get_version() {
        copy = copy.version(version.to_string());
    }
    if let Some(about) = cmd.get_about() {
        copy = copy.about(about.clone());
    }
    copy
}

pub fn run(args: Args) -> Result<()> {
    let mut buf = Vec::new();
    write(args.shell, &mut buf);
    // One write, so a closed pipe is an error here and not a panic in clap_complete.
    std::io::Write::write_all(&mut std::io::stdout().lock(), &buf)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(shell: Shell) -> String {
        let mut buf = Vec::new();
        write(shell, &mut buf);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn every_shell_knows_the_commands_and_not_the_hidden_daemon() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = script(shell);
            for word in ["mount", "unmount", "snapshot", "cache-size", "completions"] {
                assert!(s.contains(word), "{shell:?} lacks {word}");
            }
            assert!(
                !s.contains("__daemon"),
                "{shell:?} offers the internal daemon"
            );
        }
    }
}
