//! Logging through the host: [`log`] and its [`Level`].
//!
//! Inside the sandbox a plugin has no terminal and no files; the host's `log` import is its only
//! voice. The host tags every message with the plugin's name and rate-limits it, so logging per
//! call at `Debug` or `Trace` is acceptable but per token is not. Outside WebAssembly (unit tests
//! with [`crate::testing::Harness`]) messages go to stderr instead.

use std::fmt;

pub use crate::bindings::drafter_world::spechost::drafter::host::Level;

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        })
    }
}

/// Writes `message` to the host's log at `level`.
///
/// In a plugin running under spechost this calls the host's `log` import. Built natively, for
/// tests, it prints `[level] message` to stderr.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::host_log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level}] {message}");
}
