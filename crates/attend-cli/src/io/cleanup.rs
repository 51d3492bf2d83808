//! Temporary files that go on every way out, signals included.
//!
//! [`Outputs`](super::outputs::Outputs) registers each temporary file here before
//! creating it and forgets it once it is renamed into place or removed. An error
//! unwinds through `Outputs`'s `Drop`, which removes them; a SIGINT, SIGTERM or
//! SIGHUP does not unwind, so the first registration starts a thread that
//! receives those signals, removes every registered file and exits with 128 + the
//! signal's number, as a shell reports a process killed by it. A command that
//! writes no file (`attend serve`, which drains on SIGTERM) keeps the signals'
//! usual handling.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use attend::Error;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The temporary files that exist (or are about to) and are not yet in place.
static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn pending() -> MutexGuard<'static, Vec<PathBuf>> {
    // A panic while the list was held cannot leave it half-changed: a push or a
    // retain either happened or did not.
    PENDING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts the signal thread, once.
fn watch_signals() -> Result<(), Error> {
    static WATCHING: OnceLock<Result<(), String>> = OnceLock::new();
    WATCHING
        .get_or_init(|| on_signals().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| Error::value(format!("cannot watch for signals: {e}")))
}

/// Removes the registered files when SIGINT, SIGTERM or SIGHUP arrives, then exits
/// with 128 + the signal's number.
fn on_signals() -> std::io::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("attend-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                // The list stays locked until the process is gone, so no new
                // temporary file is registered after the sweep. (A writer that
                // reopens a registered file in the instant between the sweep and
                // the exit could still leave it: the window is what exit takes.)
                let files = pending();
                for f in files.iter() {
                    let _ = std::fs::remove_file(f);
                }
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

/// Registers `path` before it is created (watching for signals from the first).
pub fn register(path: &Path) -> Result<(), Error> {
    watch_signals()?;
    pending().push(path.to_path_buf());
    Ok(())
}

/// Forgets `path` once it is in place or removed.
pub fn forget(path: &Path) {
    pending().retain(|p| p != path);
}
