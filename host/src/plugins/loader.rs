//! [`PluginHost`] (engine, linker, ticker, compile cache) and [`LoadedPlugin`] (one checked,
//! linked component, ready to be instantiated cheaply).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine};

use super::bindings::{DRAFTER_API_EXPORT, Drafter, DrafterPre, WIT_VERSION};
use super::cache::{self, CompileCache};
use super::error::LoadError;
use super::registry;
use super::sandbox::{self, EpochTicker, HostState, SandboxLimits};
use super::source::PluginSource;
use crate::cascade::ModelFacts;
use crate::config::SourceSpec;

/// The spechost-sdk version whose drafters this host loads (same minor as the WIT package).
const SDK_VERSION: &str = "0.1";
/// The first 8 bytes of a WebAssembly binary: magic then version/layer.
const WASM_MAGIC: &[u8; 4] = b"\0asm";
/// Version and layer bytes of a core module (`01 00 00 00`); components use layer `01 00`.
const CORE_MODULE_LAYER: [u8; 2] = [0, 0];

/// How the plugin host is set up. Start from [`PluginHostConfig::default`].
#[derive(Debug, Clone, Default)]
pub struct PluginHostConfig {
    /// Directory of the compile cache (compiled components go to `<dir>/components/`);
    /// `None` compiles every plugin at every start.
    pub cache_dir: Option<PathBuf>,
    /// Directories searched first for built-in drafters, before those beside the executable.
    pub plugin_dirs: Vec<PathBuf>,
    /// Limits of sources made with [`LoadedPlugin::source`]; plugins are also checked to start
    /// under them when loaded.
    pub limits: SandboxLimits,
}

/// The wasmtime host for drafter plugins: one engine, its deadline ticker, the linker with the
/// sandbox's imports, and the compile cache. Create one per process and load every plugin
/// through it.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<HostState>,
    cache: CompileCache,
    search_dirs: Vec<PathBuf>,
    limits: SandboxLimits,
    ticker: Arc<EpochTicker>,
}

impl fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginHost")
            .field("cache", &self.cache)
            .field("search_dirs", &self.search_dirs)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl PluginHost {
    /// Builds the engine and the linker (steps 1 and 4 of the [module docs](super)) and starts
    /// the deadline ticker thread. No file is touched until a plugin is loaded. The ticker stops
    /// once the host and every plugin and source loaded from it have been dropped.
    pub fn new(config: PluginHostConfig) -> Result<Self, LoadError> {
        let mut engine_config = Config::new();
        engine_config
            .wasm_component_model(true)
            .epoch_interruption(true);
        let engine = Engine::new(&engine_config).map_err(|error| LoadError::Engine {
            reason: format!("{error:#}"),
        })?;

        let mut linker = Linker::<HostState>::new(&engine);
        let link = wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .and_then(|()| sandbox::link_instant_timers(&mut linker))
            .and_then(|()| {
                Drafter::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            });
        link.map_err(|error| LoadError::Engine {
            reason: format!("linking the sandbox's imports failed: {error:#}"),
        })?;

        let ticker = EpochTicker::start(&engine)?;
        let exe_dir = registry::current_exe_dir();
        Ok(Self {
            engine,
            linker,
            cache: CompileCache::new(config.cache_dir),
            search_dirs: registry::search_dirs(&config.plugin_dirs, exe_dir.as_deref()),
            limits: config.limits,
            ticker,
        })
    }

    /// Where the plugin of `spec` lives on disk: the path itself, or the first `<name>.wasm`
    /// found in [`Self::builtin_search_dirs`].
    pub fn resolve(&self, spec: &SourceSpec) -> Result<PathBuf, LoadError> {
        match spec {
            SourceSpec::Path(path) => Ok(path.clone()),
            SourceSpec::Builtin(name) => {
                registry::resolve_builtin(name, &self.search_dirs, Path::is_file)
            }
        }
    }

    /// The directories searched for built-ins, in order.
    pub fn builtin_search_dirs(&self) -> &[PathBuf] {
        &self.search_dirs
    }

    /// Loads a cascade entry (a built-in or a component file), named as
    /// [`SourceSpec::name`] says.
    pub fn load(&self, spec: &SourceSpec) -> Result<LoadedPlugin, LoadError> {
        let path = self.resolve(spec)?;
        self.load_named(&path, spec.name())
    }

    /// Loads the component at `path`, named by its file stem.
    pub fn load_file(&self, path: &Path) -> Result<LoadedPlugin, LoadError> {
        self.load(&SourceSpec::Path(path.to_path_buf()))
    }

    /// Steps 3 and 5: read, check, compile (or fetch from the cache), check the export, link,
    /// and start one instance to check that it starts under the host's limits.
    fn load_named(&self, path: &Path, name: String) -> Result<LoadedPlugin, LoadError> {
        let wasm = std::fs::read(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => LoadError::NotFound {
                path: path.to_path_buf(),
            },
            _ => LoadError::Unreadable {
                path: path.to_path_buf(),
                source,
            },
        })?;
        check_header(path, &wasm)?;
        let sha256 = cache::sha256(&wasm);

        let component = self
            .cache
            .load_or_compile(&self.engine, &wasm, &sha256, &name)
            .map_err(|error| LoadError::InvalidComponent {
                path: path.to_path_buf(),
                reason: format!("{error:#}"),
            })?;

        let exports: Vec<String> = component
            .component_type()
            .exports(&self.engine)
            .map(|(export, _)| export.to_owned())
            .collect();
        if !exports_drafter_api(&exports) {
            return Err(LoadError::MissingExport {
                plugin: name,
                expected: DRAFTER_API_EXPORT,
                found: if exports.is_empty() {
                    "nothing".to_owned()
                } else {
                    exports.join(", ")
                },
                sdk_version: SDK_VERSION,
            });
        }

        let incompatible = |error: wasmtime::Error| LoadError::Incompatible {
            plugin: name.clone(),
            reason: format!("{error:#}"),
            sdk_version: SDK_VERSION,
        };
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(incompatible)?;
        let pre = DrafterPre::new(instance_pre).map_err(incompatible)?;

        let plugin = LoadedPlugin {
            inner: Arc::new(Loaded {
                name: name.into(),
                path: path.to_path_buf(),
                sha256: cache::hex(&sha256),
                pre,
                engine: self.engine.clone(),
                limits: self.limits.clone(),
                _ticker: Arc::clone(&self.ticker),
            }),
        };
        PluginSource::check_starts(&plugin, &self.limits)?;
        tracing::info!(plugin = plugin.name(), path = %path.display(), sha256 = &plugin.sha256()[..16], "loaded drafter plugin");
        Ok(plugin)
    }
}

/// A checked, compiled and linked drafter component. Cheap to clone; make sources with
/// [`LoadedPlugin::source`].
#[derive(Clone)]
pub struct LoadedPlugin {
    inner: Arc<Loaded>,
}

struct Loaded {
    name: Arc<str>,
    path: PathBuf,
    sha256: String,
    pre: DrafterPre<HostState>,
    engine: Engine,
    /// Limits of sources made with [`LoadedPlugin::source`].
    limits: SandboxLimits,
    /// Keeps deadlines enforced for as long as this plugin can run.
    _ticker: Arc<EpochTicker>,
}

impl fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.inner.name)
            .field("path", &self.inner.path)
            .field("sha256", &self.inner.sha256)
            .finish_non_exhaustive()
    }
}

impl LoadedPlugin {
    /// The name sources of this plugin show: the built-in name or the file stem.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The file the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The sha256 of the `.wasm` file, in hex.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// A draft source running a fresh instance of this plugin under the host's limits,
    /// configured with `config` (the plugin's own `key=value,...` string, empty when none was
    /// given). The session opens at [`DraftSource::begin`](crate::cascade::DraftSource::begin),
    /// where a config the plugin rejects becomes a fault.
    ///
    /// Cheap: the component is already compiled and linked, so this only instantiates it. State
    /// the plugin keeps outside its sessions lives as long as this source, until the instance
    /// traps.
    pub fn source(&self, config: impl Into<String>) -> PluginSource {
        PluginSource::start(self.clone(), config.into(), self.inner.limits.clone())
    }

    /// Checks, in a throw-away instance, that the plugin accepts `config` for a model with
    /// `facts`: its `open` must return `ok`. Run before generation so a bad setting is a
    /// configuration error, not a fault in the middle of a request.
    pub fn check_config(&self, config: &str, facts: &ModelFacts) -> Result<(), LoadError> {
        PluginSource::check_config(self, config, facts, &self.inner.limits)
    }

    /// Like [`Self::source`], under other limits than the host's.
    pub fn source_with_limits(
        &self,
        config: impl Into<String>,
        limits: SandboxLimits,
    ) -> PluginSource {
        PluginSource::start(self.clone(), config.into(), limits)
    }

    pub(super) fn shared_name(&self) -> Arc<str> {
        Arc::clone(&self.inner.name)
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(super) fn pre(&self) -> &DrafterPre<HostState> {
        &self.inner.pre
    }
}

/// Rejects files that are not WebAssembly, or are core modules rather than components.
fn check_header(path: &Path, wasm: &[u8]) -> Result<(), LoadError> {
    match wasm.get(..8) {
        Some(header) if header.starts_with(WASM_MAGIC) => {
            if header[6..8] == CORE_MODULE_LAYER {
                Err(LoadError::NotAComponent {
                    path: path.to_path_buf(),
                })
            } else {
                Ok(())
            }
        }
        _ => Err(LoadError::NotWasm {
            path: path.to_path_buf(),
            len: wasm.len(),
        }),
    }
}

/// Whether `exports` holds the drafter interface at a version this host speaks: exactly
/// [`DRAFTER_API_EXPORT`], or a later patch of the same `0.1` minor (semver-compatible).
fn exports_drafter_api(exports: &[String]) -> bool {
    let (unversioned, _) = DRAFTER_API_EXPORT
        .split_once('@')
        .expect("DRAFTER_API_EXPORT has an @version");
    let compatible_prefix = format!("{unversioned}@{}.", compatible_minor(WIT_VERSION));
    exports
        .iter()
        .any(|export| export == DRAFTER_API_EXPORT || export.starts_with(&compatible_prefix))
}

/// `0.1` for `0.1.0`: the part of a version that must match for semver compatibility when
/// the major is 0.
fn compatible_minor(version: &str) -> &str {
    version.rsplit_once('.').map_or(version, |(minor, _)| minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_module_header_is_not_a_component() {
        let err = check_header(Path::new("m.wasm"), b"\0asm\x01\0\0\0").expect_err("core module");
        assert!(
            matches!(err, LoadError::NotAComponent { .. }),
            "got {err:?}"
        );
        assert!(err.to_string().contains("wasm32-wasip2"), "message: {err}");
    }

    #[test]
    fn component_header_passes_and_junk_does_not() {
        assert!(check_header(Path::new("c.wasm"), b"\0asm\x0d\0\x01\0rest").is_ok());
        for junk in [&b""[..], b"\0as", b"ELF\x7f....", b"\0asm\x01"] {
            let err = check_header(Path::new("j.wasm"), junk).expect_err("junk is rejected");
            assert!(
                matches!(err, LoadError::NotWasm { .. }),
                "{junk:?} gave {err:?}"
            );
        }
    }

    #[test]
    fn drafter_export_matches_same_minor_only() {
        let has = |names: &[&str]| {
            exports_drafter_api(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert!(has(&["spechost:drafter/drafter-api@0.1.0"]));
        assert!(has(&[
            "wasi:cli/run@0.2.0",
            "spechost:drafter/drafter-api@0.1.3"
        ]));
        assert!(!has(&["spechost:drafter/drafter-api@0.2.0"]));
        assert!(!has(&["spechost:drafter/drafter-api@0.10.0"]));
        assert!(!has(&[]));
    }
}
