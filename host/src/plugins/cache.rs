//! The compile cache: each component is compiled to native code once per machine.
//!
//! A compiled component is stored as `<cache_dir>/components/<key>.cwasm`, where the key is the
//! sha256 of the `.wasm` bytes followed by a hash of the engine's compile settings
//! ([`Engine::precompile_compatibility_hash`]). A new plugin build or a new wasmtime gets a new
//! key, so a stale entry is never read; old entries are simply left behind.
//!
//! Files are written to a temporary name in the same directory and renamed into place, so a
//! reader sees either no file or a whole one. A file that fails to load anyway (disk corruption,
//! a hand edit) is reported with a warning, recompiled and overwritten. A cache that cannot be
//! written (read-only disk) costs a compile per start, not an error.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Subdirectory of the cache directory that holds compiled components.
const COMPONENTS_SUBDIR: &str = "components";
/// File extension of a compiled component.
const COMPILED_EXTENSION: &str = "cwasm";
/// Hex digits of the engine hash kept in the key: 64 bits tell engine configurations apart.
const ENGINE_HASH_HEX_LEN: usize = 16;

/// Where compiled components are kept; `None` compiles every time.
#[derive(Debug, Clone)]
pub(super) struct CompileCache {
    dir: Option<PathBuf>,
}

impl CompileCache {
    /// A cache under `cache_dir/components/`, or no cache at all.
    pub(super) fn new(cache_dir: Option<PathBuf>) -> Self {
        Self {
            dir: cache_dir.map(|dir| dir.join(COMPONENTS_SUBDIR)),
        }
    }

    /// The compiled form of `wasm` (whose sha256 is `wasm_sha256`), from the cache when it holds
    /// a good copy, else compiled now and stored. `Err` carries wasmtime's compile error.
    pub(super) fn load_or_compile(
        &self,
        engine: &Engine,
        wasm: &[u8],
        wasm_sha256: &[u8; 32],
        plugin: &str,
    ) -> wasmtime::Result<Component> {
        let Some(dir) = &self.dir else {
            return Component::from_binary(engine, wasm);
        };
        let path = dir.join(format!(
            "{}.{COMPILED_EXTENSION}",
            cache_key(wasm_sha256, engine)
        ));
        if path.is_file() {
            match deserialize_own_file(engine, &path) {
                Ok(component) => {
                    tracing::debug!(plugin, path = %path.display(), "loaded compiled plugin from cache");
                    return Ok(component);
                }
                Err(error) => tracing::warn!(
                    plugin,
                    path = %path.display(),
                    "compiled plugin cache file is unusable ({error}); recompiling and overwriting it"
                ),
            }
        }
        let component = Component::from_binary(engine, wasm)?;
        match component.serialize() {
            Ok(compiled) => {
                if let Err(error) = write_atomically(dir, &path, &compiled) {
                    tracing::warn!(
                        plugin,
                        path = %path.display(),
                        "cannot write the plugin compile cache ({error}); the plugin will be compiled again next start"
                    );
                }
            }
            Err(error) => tracing::warn!(
                plugin,
                "cannot serialize the compiled plugin ({error}); not caching it"
            ),
        }
        Ok(component)
    }
}

/// Loads a compiled component that this module wrote.
#[allow(unsafe_code)]
fn deserialize_own_file(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: `Component::deserialize_file` trusts the file to be wasmtime's own output. This one
    // is: only `write_atomically` creates files in the cache directory, from
    // `Component::serialize`; the name carries the sha256 of the source wasm and the engine's
    // compatibility hash, so it is never read by another engine configuration or for another
    // component; and the rename makes every file whole. wasmtime still checks the header and
    // version, and a failure here is handled by recompiling.
    unsafe { Component::deserialize_file(engine, path) }
}

/// Writes `bytes` to `path` through a temporary file in `dir` and a rename.
pub(super) fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    /// Tells apart temporary files of concurrent writers within this process.
    static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

    fs::create_dir_all(dir)?;
    let temp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map(|name| name.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
    ));
    let written = fs::File::create(&temp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    let renamed = written.and_then(|()| fs::rename(&temp, path));
    if renamed.is_err() {
        // Best effort: a leftover temporary file is harmless, it is never read.
        let _ = fs::remove_file(&temp);
    }
    renamed
}

/// Removes the temporary files that writers of `path` killed before their rename left behind
/// (`write_atomically` names them `.<file name>.<pid>.<n>.tmp`). Files of this process, and of
/// processes still running (as `/proc` tells, where there is one), are kept: they may be in use.
pub(super) fn remove_stale_temporaries(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|file| file.strip_prefix(&prefix)?.strip_suffix(".tmp"))
            .and_then(|rest| rest.split('.').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists();
        if !alive {
            // Best effort, like the write: a file that stays is still never read.
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// `<sha256 of the wasm, hex>-<engine compatibility hash, hex prefix>`.
pub(super) fn cache_key(wasm_sha256: &[u8; 32], engine: &Engine) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let engine_hash = hex(&hasher.0.finalize());
    format!(
        "{}-{}",
        hex(wasm_sha256),
        &engine_hash[..ENGINE_HASH_HEX_LEN]
    )
}

/// The sha256 of `bytes`.
pub(super) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The sha256 of the file at `path`, in hex: what [`LoadedPlugin::sha256`] says of the file a
/// plugin was loaded from, so a watcher can tell whether the file on disk is still that version.
///
/// [`LoadedPlugin::sha256`]: super::LoadedPlugin::sha256
pub fn file_sha256(path: &std::path::Path) -> std::io::Result<String> {
    Ok(hex(&sha256(&std::fs::read(path)?)))
}

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

/// Feeds a `Hash` into sha256, so the engine hash is stable across processes and Rust versions
/// (unlike `DefaultHasher`, whose algorithm is unspecified).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_two_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab]), "000fab");
    }

    #[test]
    fn cache_key_is_wasm_hash_then_engine_hash() {
        let engine = Engine::default();
        let sha = sha256(b"not really wasm");
        let key = cache_key(&sha, &engine);
        let (wasm_part, engine_part) = key.split_once('-').expect("key has a `-` separator");
        assert_eq!(wasm_part, hex(&sha), "key: {key}");
        assert_eq!(engine_part.len(), ENGINE_HASH_HEX_LEN, "key: {key}");
        assert_eq!(key, cache_key(&sha, &engine), "key must be deterministic");
    }

    #[test]
    fn cache_key_changes_with_engine_settings() {
        let plain = Engine::default();
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let with_epochs = Engine::new(&config).expect("engine with epochs builds");
        let sha = sha256(b"x");
        assert_ne!(
            cache_key(&sha, &plain),
            cache_key(&sha, &with_epochs),
            "code compiled with epoch checks must not be shared with code compiled without"
        );
    }

    #[test]
    fn atomic_write_leaves_only_the_final_file() {
        let dir = std::env::temp_dir().join(format!("spechost-cache-test-{}", std::process::id()));
        let path = dir.join("k.cwasm");
        write_atomically(&dir, &path, b"abc").expect("temp dir is writable");
        write_atomically(&dir, &path, b"defg").expect("overwrite works");
        let names: Vec<_> = fs::read_dir(&dir)
            .expect("dir exists")
            .filter_map(|entry| entry.ok().map(|e| e.file_name()))
            .collect();
        assert_eq!(fs::read(&path).ok(), Some(b"defg".to_vec()));
        assert_eq!(names.len(), 1, "files left: {names:?}");
        let _ = fs::remove_dir_all(&dir);
    }
}
