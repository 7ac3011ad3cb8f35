//! The `spechost:drafter/host` interface: `log`, rate-limited, into `tracing`.
//!
//! Each line is emitted with the plugin's name in the `plugin` field, at the level the plugin
//! asked for. A plugin may log [`LOG_BURST`] lines at once and [`LOG_LINES_PER_SECOND`] on
//! average; lines beyond that are counted and the count is reported with the next line that
//! gets through. Messages are cut to [`MAX_LOG_MESSAGE_CHARS`] and stripped of control
//! characters.

use std::sync::Arc;
use std::time::Instant;

use super::bindings::{Level, LogHost, TypesHost};
use super::sandbox::{HostState, sanitize};

/// Lines a plugin may log back to back before rate limiting starts.
pub const LOG_BURST: u32 = 20;
/// Lines per second a plugin may log on average.
pub const LOG_LINES_PER_SECOND: u32 = 10;
/// Longest log message kept, in characters.
pub const MAX_LOG_MESSAGE_CHARS: usize = 1000;

/// A token bucket over one plugin instance's log lines.
pub(super) struct LogGate {
    plugin: Arc<str>,
    /// Lines that may be logged now, refilled at [`LOG_LINES_PER_SECOND`] up to [`LOG_BURST`].
    allowance: f64,
    last_refill: Instant,
    /// Lines refused since the last line that got through.
    dropped: u64,
}

impl LogGate {
    pub(super) fn new(plugin: Arc<str>) -> Self {
        Self {
            plugin,
            allowance: f64::from(LOG_BURST),
            last_refill: Instant::now(),
            dropped: 0,
        }
    }

    /// Whether a line may be logged at `now`; `Some(n)` says yes, after `n` refused lines.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        let elapsed = now
            .saturating_duration_since(self.last_refill)
            .as_secs_f64();
        self.last_refill = now;
        self.allowance =
            (self.allowance + elapsed * f64::from(LOG_LINES_PER_SECOND)).min(f64::from(LOG_BURST));
        if self.allowance >= 1.0 {
            self.allowance -= 1.0;
            Some(std::mem::take(&mut self.dropped))
        } else {
            self.dropped += 1;
            None
        }
    }
}

/// `spechost:drafter/types` has no functions; the linker still wants its (empty) host trait.
impl TypesHost for HostState {}

impl LogHost for HostState {
    fn log(&mut self, level: Level, message: String) {
        let Some(dropped) = self.log.admit(Instant::now()) else {
            return;
        };
        let plugin = &*self.log.plugin;
        let message = sanitize(&message, MAX_LOG_MESSAGE_CHARS);
        // `tracing` macros need the level as a constant, hence one arm per level.
        match level {
            Level::Trace => tracing::trace!(plugin, dropped, "{message}"),
            Level::Debug => tracing::debug!(plugin, dropped, "{message}"),
            Level::Info => tracing::info!(plugin, dropped, "{message}"),
            Level::Warn => tracing::warn!(plugin, dropped, "{message}"),
            Level::Error => tracing::error!(plugin, dropped, "{message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate_limited_then_reports_dropped_lines() {
        let mut gate = LogGate::new("p".into());
        let start = Instant::now();
        for line in 0..LOG_BURST {
            assert_eq!(
                gate.admit(start),
                Some(0),
                "line {line} of the burst was refused"
            );
        }
        assert_eq!(gate.admit(start), None, "line after the burst was admitted");
        assert_eq!(gate.admit(start), None);
        let later = start + Duration::from_secs(1) / LOG_LINES_PER_SECOND;
        assert_eq!(
            gate.admit(later),
            Some(2),
            "the next line reports the 2 dropped ones"
        );
    }
}
