//! Cross-request plugin state: the one blob per plugin behind the WIT `state` import.
//!
//! Order of operations:
//! 1. [`PluginHost::load`](super::PluginHost::load) gives each plugin a [`StateSlot`]; when a
//!    state file is configured it is read now (a missing file is an empty slot; an unreadable or
//!    oversized one is ignored with a warning, and the plugin starts empty).
//! 2. Instances read the slot with `state.load` and replace it with `state.save`. The slot is
//!    shared by every instance of the plugin in the process, and it outlives instances that
//!    trap, so a restarted instance finds what its predecessor saved.
//! 3. At a checkpoint the host asks instances to save (`checkpoint` export, see
//!    [`PluginSource::checkpoint`](super::PluginSource)) and [`StateSlot::persist`] writes the
//!    slot to its file atomically (temporary file, fsync, rename), only if it changed.
//!
//! The blob's format belongs to the plugin; the host never parses it. A crash while writing
//! leaves the previous file whole.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::bindings::StateHost;
use super::cache::{remove_stale_temporaries, write_atomically};
use super::sandbox::{HostState, Moment, format_bytes};

/// Default cap on a plugin's state blob.
pub const DEFAULT_MAX_STATE_BYTES: usize = 256 << 20;

/// The state blob of one plugin, shared by its instances. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StateSlot {
    inner: Arc<SlotInner>,
}

#[derive(Debug)]
struct SlotInner {
    /// Where the blob is persisted; `None` keeps it in memory for the life of the process.
    file: Option<PathBuf>,
    max_bytes: usize,
    blob: Mutex<Blob>,
}

#[derive(Debug, Default)]
struct Blob {
    bytes: Option<Arc<Vec<u8>>>,
    /// Saved since it was last read from or written to the file.
    dirty: bool,
}

impl StateSlot {
    /// A slot persisted to `file` (read now if it exists), or in memory only when `None`.
    /// `plugin` names the plugin in warnings.
    pub(super) fn open(plugin: &str, file: Option<PathBuf>, max_bytes: usize) -> Self {
        if let Some(path) = file.as_deref() {
            remove_stale_temporaries(path);
        }
        let bytes = file
            .as_deref()
            .and_then(|path| read_state_file(plugin, path, max_bytes));
        Self {
            inner: Arc::new(SlotInner {
                file,
                max_bytes,
                blob: Mutex::new(Blob {
                    bytes: bytes.map(Arc::new),
                    dirty: false,
                }),
            }),
        }
    }

    /// The file the slot is persisted to, if any.
    pub fn file(&self) -> Option<&Path> {
        self.inner.file.as_deref()
    }

    /// The blob currently held, if any.
    pub fn blob(&self) -> Option<Arc<Vec<u8>>> {
        self.lock().bytes.clone()
    }

    /// Writes the blob to the slot's file if it changed since it was read or last written.
    /// Returns whether a file was written.
    pub fn persist(&self) -> std::io::Result<bool> {
        let Some(path) = self.inner.file.as_deref() else {
            return Ok(false);
        };
        let mut blob = self.lock();
        let Some(bytes) = blob.bytes.clone().filter(|_| blob.dirty) else {
            return Ok(false);
        };
        let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty());
        write_atomically(dir.unwrap_or(Path::new(".")), path, &bytes)?;
        blob.dirty = false;
        Ok(true)
    }

    fn save(&self, bytes: Vec<u8>) -> Result<(), String> {
        if bytes.len() > self.inner.max_bytes {
            return Err(format!(
                "state blob of {} exceeds the host's limit of {}",
                format_bytes(bytes.len()),
                format_bytes(self.inner.max_bytes)
            ));
        }
        let mut blob = self.lock();
        blob.bytes = Some(Arc::new(bytes));
        blob.dirty = true;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Blob> {
        // The lock guards plain data and no code panics while holding it.
        self.inner
            .blob
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Reads a state file; `None` (with a warning unless it is simply absent) when it cannot be used.
fn read_state_file(plugin: &str, path: &Path, max_bytes: usize) -> Option<Vec<u8>> {
    match std::fs::metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Ok(meta) if meta.len() > max_bytes as u64 => {
            tracing::warn!(plugin, path = %path.display(), "state file is {} bytes, over the {} limit; ignored, the plugin starts empty", meta.len(), format_bytes(max_bytes));
            return None;
        }
        _ => {}
    }
    match std::fs::read(path) {
        Ok(bytes) => {
            tracing::info!(plugin, path = %path.display(), bytes = bytes.len(), "loaded plugin state");
            Some(bytes)
        }
        Err(error) => {
            tracing::warn!(plugin, path = %path.display(), "cannot read state file: {error}; ignored, the plugin starts empty");
            None
        }
    }
}

impl StateHost for HostState {
    fn load(&mut self) -> Option<Vec<u8>> {
        let started = Moment::now();
        let blob = self.state.blob().map(|bytes| bytes.as_ref().clone());
        self.clock.credit(started.elapsed());
        blob
    }

    fn save(&mut self, blob: Vec<u8>) -> Result<(), String> {
        let started = Moment::now();
        let saved = self.state.save(blob);
        self.clock.credit(started.elapsed());
        saved
    }
}

/// Writes the state file of each of `plugins` whose state changed since it was last written
/// (when a state directory is set). A failure is a warning that leaves the old file in place.
pub fn save_plugin_states<'a>(plugins: impl IntoIterator<Item = &'a super::LoadedPlugin>) {
    for plugin in plugins {
        let state = plugin.state();
        match state.persist() {
            Ok(true) => {
                tracing::info!(plugin = plugin.name(), path = ?state.file(), "saved plugin state");
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(plugin = plugin.name(), path = ?state.file(), "cannot save plugin state: {error}; the previous state file, if any, is left as it was");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("spechost-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn saved_blob_is_persisted_once_and_reloaded() {
        let dir = temp_dir("roundtrip");
        let file = dir.join("suffix.state");
        let slot = StateSlot::open("suffix", Some(file.clone()), 1 << 20);
        assert!(slot.blob().is_none(), "a missing file is an empty slot");
        assert!(
            !slot.persist().expect("persist"),
            "nothing saved, nothing written"
        );
        slot.save(b"v1".to_vec()).expect("save");
        assert!(slot.persist().expect("persist"), "a saved blob is written");
        assert!(
            !slot.persist().expect("persist"),
            "unchanged blob is not rewritten"
        );
        let reopened = StateSlot::open("suffix", Some(file), 1 << 20);
        assert_eq!(
            reopened.blob().as_deref().map(Vec::as_slice),
            Some(&b"v1"[..])
        );
        let leftovers: Vec<_> = std::fs::read_dir(&dir).expect("dir").collect();
        assert_eq!(
            leftovers.len(),
            1,
            "only the state file remains: {leftovers:?}"
        );
    }

    #[test]
    fn oversized_blobs_are_refused_on_save_and_ignored_on_load() {
        let dir = temp_dir("limits");
        let file = dir.join("big.state");
        std::fs::write(&file, vec![7u8; 100]).expect("write");
        let slot = StateSlot::open("big", Some(file), 10);
        assert!(slot.blob().is_none(), "oversized file ignored");
        let err = slot.save(vec![0; 11]).expect_err("too big");
        assert_eq!(
            err,
            "state blob of 11 bytes exceeds the host's limit of 10 bytes"
        );
    }
}
