//! `--watch DIR`: reloads a loaded plugin when its `.wasm` file in `DIR` changes.
//!
//! The watcher polls the modification time and size of the loaded plugins' files every
//! [`POLL_INTERVAL`] rather than subscribing to file-system events: it is a handful of `stat`
//! calls, it behaves the same on every file system (network mounts and container overlays
//! included), and it needs no dependency. A change is acted on once the file has stayed the
//! same for one more poll (debounced), so a file still being written is not loaded half-way.
//! What is acted on is a file whose contents differ from the version the server runs (the
//! loaded plugin's sha256), so a file replaced before the watcher first saw it is still
//! reloaded, and a file touched without change is not.
//! The reload itself is the admin one (`Registry::reload`): compiled and smoke-tested off the
//! request path, published only if it passes; a broken version is logged and the old one kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::metrics::{Metrics, ReloadOutcome};
use super::registry::Registry;
use super::share::Sharing;
use crate::plugins::file_sha256;

/// How often the watched files are checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What identifies a version of a file: modification time and size.
type Stamp = (SystemTime, u64);

/// Debounces the changes of one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Debounce {
    /// The version last acted on; `None` before the file was first seen settled.
    settled: Option<Stamp>,
    /// A different version seen at the last poll, acted on if it is still there at the next.
    pending: Option<Stamp>,
}

impl Debounce {
    /// Takes this poll's stamp (`None`: the file is missing); `true` when a new version has
    /// settled (the first one seen included) and should be compared with the loaded one.
    fn observe(&mut self, now: Option<Stamp>) -> bool {
        if now.is_none() || now == self.settled {
            self.pending = None;
            return false;
        }
        if self.pending == now {
            self.settled = now;
            self.pending = None;
            return true;
        }
        self.pending = now;
        false
    }
}

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// Watches `dir` until the runtime shuts down; a reload is also published to the other
/// replicas (`sharing`, with `--share`).
pub async fn run(
    dir: PathBuf,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    sharing: Arc<Sharing>,
) {
    let dir = dir.canonicalize().unwrap_or(dir);
    tracing::info!(dir = %dir.display(), "watching plugin files");
    let mut files: BTreeMap<PathBuf, Debounce> = BTreeMap::new();
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        let mut changed = Vec::new();
        for plugin in registry.snapshot().plugins() {
            let path = plugin.path.canonicalize().unwrap_or(plugin.path);
            if path.parent() != Some(dir.as_path()) {
                continue;
            }
            let now = stamp(&path);
            let settled = files.entry(path.clone()).or_default().observe(now);
            if settled && file_sha256(&path).is_ok_and(|sha256| sha256 != plugin.sha256) {
                changed.push(plugin.name);
            }
        }
        if changed.is_empty() {
            continue;
        }
        let reloading = Arc::clone(&registry);
        let names = changed.clone();
        let result = tokio::task::spawn_blocking(move || reloading.reload(Some(&names))).await;
        match result {
            Ok(Ok(report)) => {
                metrics.reload(ReloadOutcome::Published);
                tracing::info!(plugins = %changed.join(","), reloaded = %report.reloaded.join(","), generation = report.generation, "reloaded changed plugin files");
                sharing.publish_update(&registry.snapshot());
            }
            Ok(Err(error)) => {
                metrics.reload(ReloadOutcome::Rejected);
                tracing::warn!(plugins = %changed.join(","), %error, "changed plugin file refused; the previous version stays in use");
            }
            Err(error) => {
                metrics.reload(ReloadOutcome::Rejected);
                tracing::error!(%error, "plugin reload panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, len: u64) -> Option<Stamp> {
        Some((SystemTime::UNIX_EPOCH + Duration::from_secs(secs), len))
    }

    /// A file already seen settled at `stamp`.
    fn settled_at(stamp: Option<Stamp>) -> Debounce {
        Debounce {
            settled: stamp,
            pending: None,
        }
    }

    #[test]
    fn the_first_version_seen_is_reported_once_settled_to_be_compared_with_the_loaded_one() {
        let mut debounce = Debounce::default();
        assert!(!debounce.observe(None), "not there yet");
        assert!(!debounce.observe(at(1, 100)), "first seen: wait one poll");
        assert!(debounce.observe(at(1, 100)), "settled");
        assert!(!debounce.observe(at(1, 100)), "reported once");
    }

    #[test]
    fn a_change_is_acted_on_once_it_holds_for_a_poll() {
        let mut debounce = settled_at(at(1, 100));
        assert!(!debounce.observe(at(1, 100)), "unchanged");
        assert!(!debounce.observe(at(2, 50)), "changed: wait one poll");
        assert!(!debounce.observe(at(2, 80)), "still being written");
        assert!(debounce.observe(at(2, 80)), "settled");
        assert!(!debounce.observe(at(2, 80)), "acted on once");
    }

    #[test]
    fn a_missing_file_is_not_a_change() {
        let mut debounce = settled_at(at(1, 100));
        assert!(!debounce.observe(None));
        assert!(!debounce.observe(None));
        assert!(!debounce.observe(at(1, 100)), "back as it was");
        assert!(!debounce.observe(at(3, 100)));
        assert!(debounce.observe(at(3, 100)), "replaced");
    }
}
