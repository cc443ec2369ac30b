//! The `blobdrive` command.

// The library's `println!`, `print!`, `eprintln!` and `eprint!`, in place of the
// standard ones, which panic when nobody reads the output any more
// (`blobdrive::output` says why).
#[macro_use]
extern crate blobdrive;

mod cli;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    if cli::helper::invoked_as(cli::helper::HELPER_NAME) {
        init_logging(0);
        return cli::helper::run(std::env::args_os().skip(1).collect());
    }
    if cli::helper::invoked_as(cli::umount_helper::UMOUNT_HELPER_NAME) {
        init_logging(0);
        return cli::umount_helper::run(std::env::args_os().skip(1).collect());
    }
    let cli = cli::Cli::parse();
    init_logging(cli.log_level());
    let done = cli.run();
    // Output lost to a full disk or a failing device is a failure of the
    // command; output whose reader went away (`| head`) is not.
    let done = done.and_then(|()| match blobdrive::output::stdout_failure() {
        Some(e) => Err(anyhow::anyhow!("cannot write the output: {e}")),
        None => Ok(()),
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the whole cause chain joined with ": ", any control
            // character a service slipped into it shown, not acted on.
            let line = blobdrive::azure::text::escape_controls(&cli::error_text(&e));
            eprintln!("blobdrive: error: {line}");
            ExitCode::FAILURE
        }
    }
}

/// Colour only for a terminal, and never with `NO_COLOR` set (any value but empty,
/// as <https://no-color.org> says): a daemon's log file gets plain text.
fn use_colour() -> bool {
    use std::io::IsTerminal;
    colour_wanted(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn colour_wanted(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Logs go to stderr; warnings by default so a normal run prints only its result.
fn init_logging(verbose: u8) {
    let filter = std::env::var("BLOBDRIVE_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| {
            EnvFilter::new(match verbose {
                0 => "warn",
                1 => "info",
                2 => "debug",
                _ => "trace",
            })
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(use_colour())
        .init();
}

#[cfg(test)]
mod tests {
    use super::colour_wanted;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_wanted(true, None));
        assert!(colour_wanted(true, Some(OsStr::new(""))));
        assert!(!colour_wanted(true, Some(OsStr::new("1"))));
        assert!(!colour_wanted(false, None));
    }
}
