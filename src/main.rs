//! The `blobdrive` command.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the whole cause chain joined with ": ".
            eprintln!("blobdrive: error: {e:#}");
            ExitCode::FAILURE
        }
    }
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
        .init();
}
