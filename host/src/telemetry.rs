//! Logging, set up in one place: `tracing` to stderr, `spechost=info` unless `RUST_LOG` says
//! otherwise; colours only on a terminal (and not with `NO_COLOR` set), so logs written to files
//! and pipes hold plain text.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Default log filter when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "spechost=info";

/// Installs the stderr subscriber. Safe to call more than once (later calls do nothing).
pub fn init() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_target(false)
        .without_time()
        .try_init();
}
