//! [`PluginHost`]: the engine, the linker, the deadline ticker and the compile cache, and the
//! load steps that turn a cascade or policy entry into a [`Loaded`] component.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

use super::bindings::{DRAFT_MODEL, DRAFTER_API, Drafter, POLICY_API, WIT_VERSION, interface_name};
use super::cache::{self, CompileCache};
use super::error::LoadError;
use super::loaded::{Loaded, LoadedInner, LoadedPlugin, LoadedPolicy};
use super::registry::{self, PluginKind};
use super::sandbox::{self, EpochTicker, HostState, SandboxLimits};
use super::spec::SourceSpec;
use super::state::{DEFAULT_MAX_STATE_BYTES, StateSlot};
use super::supervised::Supervised;
use super::world::{AttachedDraftModel, DraftModelCell, DrafterExtras, World};
use crate::cascade::{DraftModelCosts, DraftModelFactory};

/// The first 8 bytes of a WebAssembly binary: magic then version/layer.
const WASM_MAGIC: &[u8; 4] = b"\0asm";
/// Version and layer bytes of a core module (`01 00 00 00`); components use layer `01 00`.
const CORE_MODULE_LAYER: [u8; 2] = [0, 0];
/// Extension of plugin state files in the state directory: `<state_dir>/<plugin>.state`.
const STATE_FILE_EXTENSION: &str = "state";

/// How the plugin host is set up. Start from [`PluginHostConfig::default`].
#[derive(Debug, Clone, Default)]
pub struct PluginHostConfig {
    /// Directory of the compile cache (compiled components go to `<dir>/components/`);
    /// `None` compiles every plugin at every start.
    pub cache_dir: Option<PathBuf>,
    /// Directories searched first for built-in plugins, before those beside the executable.
    pub plugin_dirs: Vec<PathBuf>,
    /// Limits of sources made with [`LoadedPlugin::source`]; plugins are also checked to start
    /// under them when loaded.
    pub limits: SandboxLimits,
    /// Where drafters' cross-request state is persisted, as `<dir>/<plugin name>.state`; `None`
    /// keeps it in memory for the life of the process.
    pub state_dir: Option<PathBuf>,
}

/// The wasmtime host for plugins: one engine, its deadline ticker, the linker with the
/// sandbox's imports, and the compile cache. Create one per process and load every plugin
/// through it.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<HostState>,
    cache: CompileCache,
    search_dirs: Vec<PathBuf>,
    limits: SandboxLimits,
    state_dir: Option<PathBuf>,
    draft_model: DraftModelCell,
    ticker: Arc<EpochTicker>,
}

impl fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginHost")
            .field("cache", &self.cache)
            .field("search_dirs", &self.search_dirs)
            .field("limits", &self.limits)
            .field("state_dir", &self.state_dir)
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
        // The drafter world's imports are a superset of the policy world's (`host`), so one
        // linker serves both kinds.
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
            state_dir: config.state_dir,
            draft_model: DraftModelCell::default(),
            ticker,
        })
    }

    /// Gives every drafter loaded from this host (before or after) access to `factory` through
    /// the WIT `draft-model` import, and tells their policies what drafting with it `costs`
    /// (when measured). A host has at most one draft model: a second call is ignored and
    /// returns `false`.
    pub fn attach_draft_model(
        &self,
        factory: Arc<dyn DraftModelFactory>,
        costs: Option<DraftModelCosts>,
    ) -> bool {
        self.draft_model
            .set(AttachedDraftModel { factory, costs })
            .is_ok()
    }

    /// Whether a draft model is attached.
    pub fn has_draft_model(&self) -> bool {
        self.draft_model.get().is_some()
    }

    /// Where the plugin of `spec` lives on disk: the path itself, or the first built-in file
    /// of that name found in [`Self::builtin_search_dirs`].
    pub fn resolve(&self, spec: &SourceSpec, kind: PluginKind) -> Result<PathBuf, LoadError> {
        match spec {
            SourceSpec::Path(path) => Ok(path.clone()),
            SourceSpec::Builtin(name) => {
                registry::resolve_builtin(kind, name, &self.search_dirs, Path::is_file)
            }
        }
    }

    /// The directories searched for built-ins, in order.
    pub fn builtin_search_dirs(&self) -> &[PathBuf] {
        &self.search_dirs
    }

    /// Loads a cascade entry (a built-in drafter or a component file), named as
    /// [`SourceSpec::name`] says. Its state is persisted in the host's state directory, if any.
    pub fn load(&self, spec: &SourceSpec) -> Result<LoadedPlugin, LoadError> {
        let name = spec.name();
        let state_file = self
            .state_dir
            .as_ref()
            .map(|dir| dir.join(format!("{name}.{STATE_FILE_EXTENSION}")));
        self.load_drafter(spec, state_file)
    }

    /// Like [`Self::load`], with the plugin's state read from and persisted to `state_file`.
    pub fn load_with_state_file(
        &self,
        spec: &SourceSpec,
        state_file: &Path,
    ) -> Result<LoadedPlugin, LoadError> {
        self.load_drafter(spec, Some(state_file.to_path_buf()))
    }

    /// Loads the drafter component at `path`, named by its file stem.
    pub fn load_file(&self, path: &Path) -> Result<LoadedPlugin, LoadError> {
        self.load(&SourceSpec::Path(path.to_path_buf()))
    }

    /// Loads a `--policy` entry (a built-in policy or a component file).
    pub fn load_policy(&self, spec: &SourceSpec) -> Result<LoadedPolicy, LoadError> {
        self.load_world(spec, |_component| ())
    }

    /// Steps 3 and 5 for a drafter, whose state slot opens once it is linked.
    fn load_drafter(
        &self,
        spec: &SourceSpec,
        state_file: Option<PathBuf>,
    ) -> Result<LoadedPlugin, LoadError> {
        let name = spec.name();
        self.load_world(spec, |component| DrafterExtras {
            state: StateSlot::open(&name, state_file, DEFAULT_MAX_STATE_BYTES),
            draft_model: Arc::clone(&self.draft_model),
            uses_draft_model: component
                .component_type()
                .imports(&self.engine)
                .any(|(import, _)| import == interface_name(DRAFT_MODEL)),
        })
    }

    /// Steps 3 and 5 for a plugin of world `W`: compile, link, gather what the world needs
    /// besides the component (`extras`), and start one instance to check that it starts under
    /// the host's limits.
    fn load_world<W: World>(
        &self,
        spec: &SourceSpec,
        extras: impl FnOnce(&Component) -> W::Extras,
    ) -> Result<Loaded<W>, LoadError> {
        let name = spec.name();
        let path = self.resolve(spec, W::KIND)?;
        let (component, sha256) = self.compile(&path, &name, W::KIND)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .and_then(W::pre)
            .map_err(|error| incompatible(&name, error))?;
        let plugin = Loaded::new(LoadedInner {
            name: name.into(),
            path,
            sha256,
            pre,
            engine: self.engine.clone(),
            limits: self.limits.clone(),
            extras: extras(&component),
            start_time: OnceLock::new(),
            _ticker: Arc::clone(&self.ticker),
        });
        let start_time = Supervised::check_starts(&plugin, &self.limits)?;
        plugin.record_start_time(start_time);
        tracing::info!(
            plugin = plugin.name(),
            kind = W::KIND.as_str(),
            path = %plugin.path().display(),
            sha256 = &plugin.sha256()[..16],
            start_cpu_ms = format!("{:.1}", plugin.start_time().as_secs_f64() * 1e3),
            "loaded {} plugin",
            W::KIND.as_str()
        );
        Ok(plugin)
    }

    /// Step 3: read, check, compile (or fetch from the cache), check the export of `kind`.
    /// Returns the component and the file's sha256 in hex.
    fn compile(
        &self,
        path: &Path,
        name: &str,
        kind: PluginKind,
    ) -> Result<(Component, String), LoadError> {
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
            .load_or_compile(&self.engine, &wasm, &sha256, name)
            .map_err(|error| LoadError::InvalidComponent {
                path: path.to_path_buf(),
                reason: format!("{error:#}"),
            })?;

        let expected = interface_name(match kind {
            PluginKind::Drafter => DRAFTER_API,
            PluginKind::Policy => POLICY_API,
        });
        let exports: Vec<String> = component
            .component_type()
            .exports(&self.engine)
            .map(|(export, _)| export.to_owned())
            .collect();
        if !exports_interface(&exports, &expected) {
            return Err(LoadError::MissingExport {
                plugin: name.to_owned(),
                expected,
                found: if exports.is_empty() {
                    "nothing".to_owned()
                } else {
                    exports.join(", ")
                },
                sdk_version: sdk_version(),
            });
        }
        Ok((component, cache::hex(&sha256)))
    }
}

/// The error for a component whose imports or exports do not fit the sandbox.
fn incompatible(plugin: &str, error: wasmtime::Error) -> LoadError {
    LoadError::Incompatible {
        plugin: plugin.to_owned(),
        reason: format!("{error:#}"),
        sdk_version: sdk_version(),
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

/// Whether `exports` holds the interface `expected` (`package/name@version`) at a version this
/// host speaks: exactly `expected`, or another patch of the same minor (semver-compatible
/// while the major is 0).
fn exports_interface(exports: &[String], expected: &str) -> bool {
    let (unversioned, _) = expected
        .split_once('@')
        .expect("export names carry an @version");
    let compatible_prefix = format!("{unversioned}@{}.", compatible_minor(WIT_VERSION));
    exports
        .iter()
        .any(|export| export == expected || export.starts_with(&compatible_prefix))
}

/// `0.7` for `0.7.1`: the part of a version that must match for semver compatibility when
/// the major is 0.
fn compatible_minor(version: &str) -> &str {
    version.rsplit_once('.').map_or(version, |(minor, _)| minor)
}

/// The spechost-sdk version whose plugins this host loads, as error messages name it: the WIT
/// package's major.minor, which the SDK's own version shares.
fn sdk_version() -> &'static str {
    compatible_minor(WIT_VERSION)
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
            exports_interface(
                &names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                &interface_name(DRAFTER_API),
            )
        };
        let minor = compatible_minor(WIT_VERSION);
        assert!(has(&[&interface_name(DRAFTER_API)]));
        assert!(has(&[
            "wasi:cli/run@0.2.0",
            &format!("spechost:drafter/drafter-api@{minor}.3")
        ]));
        for retired in ["0.1.0", "0.2.0", "0.3.0"] {
            let export = format!("spechost:drafter/drafter-api@{retired}");
            assert!(!has(&[&export]), "{export} is refused");
        }
        assert!(!has(&[&format!("spechost:drafter/drafter-api@{minor}0.0")]));
        assert!(!has(&[&interface_name(POLICY_API)]));
        assert!(!has(&[]));
    }
}
