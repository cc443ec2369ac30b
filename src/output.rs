//! Where every command's output and messages go: standard output and standard
//! error, written so that a reader who went away is no reason to stop.
//!
//! The standard `println!` panics when its write fails, and with SIGPIPE ignored
//! (as Rust programs start) a pipe whose reader is gone (`blobdrive stats | head
//! -1`, a closed terminal) fails every write with EPIPE: a panic, exit 101 and a
//! backtrace. Letting SIGPIPE kill the process instead would stop a command in
//! the middle of what it does (an `unmount` with its drive half taken down), and
//! would kill a mount's daemon whenever a peer closes a socket under it. So the
//! crate's `println!`, `print!`, `eprintln!` and `eprint!` (macros that replace the
//! standard ones in this crate and in the `blobdrive` binary) come here: output
//! nobody can read any more is dropped and the command goes on to its end, with
//! its own exit status. Any other failure of standard output (a full disk, EIO)
//! loses output someone wanted, so it is kept for [`stdout_failure`], which the
//! binary turns into a failing exit.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set once standard output's reader is gone: later output is not even tried.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// Set once standard error's reader is gone.
static STDERR_GONE: AtomicBool = AtomicBool::new(false);
/// The first failure of standard output other than a reader gone.
static STDOUT_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Writes `args` to standard output (the `print!` of this crate).
pub fn out(args: fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut o = io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        stdout_failed(e);
    }
}

/// Writes `args` to standard error (the `eprint!` of this crate). A failure has
/// nowhere to be told, so it is dropped.
pub fn err(args: fmt::Arguments<'_>) {
    if STDERR_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut e = io::stderr().lock();
    if let Err(x) = e.write_fmt(args) {
        if x.kind() == io::ErrorKind::BrokenPipe {
            STDERR_GONE.store(true, Ordering::Relaxed);
        }
    }
}

fn stdout_failed(e: io::Error) {
    if e.kind() == io::ErrorKind::BrokenPipe {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        return;
    }
    let mut first = STDOUT_FAILURE.lock().unwrap_or_else(|p| p.into_inner());
    first.get_or_insert_with(|| e.to_string());
}

/// Flushes standard output, then tells the first failure of it that was not its
/// reader going away (that loses nothing anyone would read), if there was one.
pub fn stdout_failure() -> Option<String> {
    if !STDOUT_GONE.load(Ordering::Relaxed) {
        if let Err(e) = io::stdout().lock().flush() {
            stdout_failed(e);
        }
    }
    STDOUT_FAILURE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// The crate's `println!`, `print!`, `eprintln!` and `eprint!`, which never
/// panic (see the module's documentation). Declared by `lib.rs` and `main.rs`
/// before their modules, which is what makes them replace the standard ones
/// there.
#[macro_export]
macro_rules! println {
    () => { $crate::output::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// See [`println!`].
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::output::out(format_args!($($arg)*)) };
}

/// See [`println!`].
#[macro_export]
macro_rules! eprintln {
    () => { $crate::output::err(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// See [`println!`].
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::output::err(format_args!($($arg)*)) };
}
