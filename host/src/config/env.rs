//! The environment variables spechost reads, all of them, at the edge: the cache directory,
//! extra plugin directories, and the OpenMP variables `spechost info` reports.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The OpenMP variables of the environment (`OMP_*`, `GOMP_*`): libgomp reads them when it
/// loads, and some override spechost's pinning.
pub(super) fn openmp_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| name.starts_with("OMP_") || name.starts_with("GOMP_"))
        .collect()
}

/// Directories from `SPECHOST_PLUGIN_DIR` (colon-separated).
pub(super) fn env_plugin_dirs() -> Vec<PathBuf> {
    std::env::var_os("SPECHOST_PLUGIN_DIR")
        .map(|dirs| std::env::split_paths(&dirs).collect())
        .unwrap_or_default()
}

/// Where spechost caches models and compiled plugins: `$SPECHOST_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/spechost`, else `~/.cache/spechost`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPECHOST_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("spechost");
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("spechost")
}
