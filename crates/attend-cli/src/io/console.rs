//! Standard output and standard error without panics.
//!
//! `println!` panics when standard output is a closed pipe (`attend … | head -c1`)
//! or a full disk (`> /dev/full`); `eprintln!` likewise for standard error. Every
//! command prints through [`outln!`] / [`out!`] instead, which return the failure
//! as an [`Error`] on `"standard output"` for `?` to pass up, and through
//! [`errln!`] / [`err!`], which drop a failure to write to standard error: there is
//! nowhere left to report it, and the exit status still tells.
//!
//! `main` turns a broken pipe into a quiet exit with status 141, the status of a
//! process killed by SIGPIPE as a shell reports it (what `cat`, `seq` and the other
//! coreutils give in `… | head`), so that `set -o pipefail` scripts see the same
//! from attend as from them; any other failure is a one-line error with status 2.
//! (Clippy's `print_stdout` and `print_stderr`, denied in `main.rs`, keep the
//! panicking macros out.)

use std::fmt::Arguments;
use std::io::Write;

use attend::Error;

/// The name of standard output in errors.
const STDOUT: &str = "standard output";

/// The exit status of a process killed by SIGPIPE, as a shell reports it.
pub const BROKEN_PIPE_STATUS: u8 = 128 + 13;

/// Writes to standard output and flushes, so that a failure surfaces here.
pub fn print(args: Arguments<'_>) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(|e| Error::io(STDOUT, e))
}

/// Writes to standard error, dropping a failure.
pub fn eprint(args: Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.flush());
}

/// Whether `err` is a write to a pipe whose reader has gone.
pub fn is_broken_pipe(err: &Error) -> bool {
    matches!(err, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe)
}

/// `print!` to standard output, returning `Result<(), attend::Error>`.
macro_rules! out {
    ($($arg:tt)*) => { $crate::io::console::print(format_args!($($arg)*)) };
}

/// `println!` to standard output, returning `Result<(), attend::Error>`.
macro_rules! outln {
    () => { $crate::io::console::print(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::io::console::print(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` that cannot panic.
macro_rules! err {
    ($($arg:tt)*) => { $crate::io::console::eprint(format_args!($($arg)*)) };
}

/// `eprintln!` that cannot panic.
macro_rules! errln {
    () => { $crate::io::console::eprint(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::io::console::eprint(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {err, errln, out, outln};
