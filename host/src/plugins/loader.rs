//! [`PluginHost`] (engine, linker, ticker, compile cache) and [`LoadedPlugin`] (one checked,
//! linked component, ready to be instantiated cheaply).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

use super::bindings::{
    DRAFT_MODEL, DRAFTER_API, Drafter, DrafterPre, POLICY_API, PolicyPre, WIT_VERSION,
    interface_name,
};
use super::cache::{self, CompileCache};
use super::error::LoadError;
use super::policy::PluginPolicy;
use super::registry::{self, PluginKind};
use super::sandbox::{self, EpochTicker, HostState, SandboxLimits, Services};
use super::source::PluginSource;
use super::state::{DEFAULT_MAX_STATE_BYTES, StateSlot};
use crate::cascade::{DraftModelFactory, ModelFacts, PolicySetup};
use crate::config::SourceSpec;

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

/// The draft model, attached to the host once it is loaded (after the plugins, so that a
/// misspelt cascade fails before any model loads) and seen by every plugin loaded from it.
type DraftModelCell = Arc<OnceLock<Arc<dyn DraftModelFactory>>>;

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
    /// the WIT `draft-model` import. A host has at most one draft model: a second call is
    /// ignored and returns `false`.
    pub fn attach_draft_model(&self, factory: Arc<dyn DraftModelFactory>) -> bool {
        self.draft_model.set(factory).is_ok()
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
        let name = spec.name();
        let path = self.resolve(spec, PluginKind::Policy)?;
        let (component, sha256) = self.compile(&path, &name, PluginKind::Policy)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .and_then(PolicyPre::new)
            .map_err(|error| incompatible(&name, error))?;
        let policy = LoadedPolicy {
            inner: Arc::new(LoadedPolicyInner {
                name: name.into(),
                path: path.clone(),
                sha256,
                pre,
                engine: self.engine.clone(),
                limits: self.limits.clone(),
                _ticker: Arc::clone(&self.ticker),
            }),
        };
        PluginPolicy::check_starts(&policy)?;
        tracing::info!(policy = policy.name(), path = %path.display(), sha256 = &policy.sha256()[..16], "loaded policy plugin");
        Ok(policy)
    }

    /// Steps 3 and 5 for a drafter: compile, link, and start one instance to check that it
    /// starts under the host's limits.
    fn load_drafter(
        &self,
        spec: &SourceSpec,
        state_file: Option<PathBuf>,
    ) -> Result<LoadedPlugin, LoadError> {
        let name = spec.name();
        let path = self.resolve(spec, PluginKind::Drafter)?;
        let (component, sha256) = self.compile(&path, &name, PluginKind::Drafter)?;
        let uses_draft_model = component
            .component_type()
            .imports(&self.engine)
            .any(|(import, _)| import == interface_name(DRAFT_MODEL));
        let pre = self
            .linker
            .instantiate_pre(&component)
            .and_then(DrafterPre::new)
            .map_err(|error| incompatible(&name, error))?;
        let state = StateSlot::open(&name, state_file, DEFAULT_MAX_STATE_BYTES);
        let plugin = LoadedPlugin {
            inner: Arc::new(Loaded {
                name: name.into(),
                path: path.clone(),
                sha256,
                pre,
                engine: self.engine.clone(),
                limits: self.limits.clone(),
                state,
                draft_model: Arc::clone(&self.draft_model),
                uses_draft_model,
                _ticker: Arc::clone(&self.ticker),
            }),
        };
        PluginSource::check_starts(&plugin, &self.limits)?;
        tracing::info!(plugin = plugin.name(), path = %path.display(), sha256 = &plugin.sha256()[..16], uses_draft_model, "loaded drafter plugin");
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
    /// The plugin's cross-request state, shared by all its instances.
    state: StateSlot,
    draft_model: DraftModelCell,
    /// Whether the component imports `draft-model` (it then counts as an expensive source).
    uses_draft_model: bool,
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

    /// Whether the plugin drives the host's draft model (it imports `draft-model`): such a
    /// source is expensive, and the scored cascade asks it only when cheap sources fall short.
    pub fn uses_draft_model(&self) -> bool {
        self.inner.uses_draft_model
    }

    /// The plugin's cross-request state; [`StateSlot::persist`] writes it to its file.
    pub fn state(&self) -> &StateSlot {
        &self.inner.state
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

    /// The host services an instance of this plugin gets.
    pub(super) fn services(&self) -> Services {
        Services {
            state: Some(self.inner.state.clone()),
            draft_model: self.inner.draft_model.get().cloned(),
        }
    }
}

/// A checked, compiled and linked policy component. Cheap to clone; make per-request policies
/// with [`LoadedPolicy::policy`].
#[derive(Clone)]
pub struct LoadedPolicy {
    inner: Arc<LoadedPolicyInner>,
}

struct LoadedPolicyInner {
    name: Arc<str>,
    path: PathBuf,
    sha256: String,
    pre: PolicyPre<HostState>,
    engine: Engine,
    limits: SandboxLimits,
    /// Keeps deadlines enforced for as long as this policy can run.
    _ticker: Arc<EpochTicker>,
}

impl fmt::Debug for LoadedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedPolicy")
            .field("name", &self.inner.name)
            .field("path", &self.inner.path)
            .field("sha256", &self.inner.sha256)
            .finish_non_exhaustive()
    }
}

impl LoadedPolicy {
    /// The built-in name or the file stem.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The file the policy was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The sha256 of the `.wasm` file, in hex.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// A policy running a fresh instance of this component, configured with `config`.
    pub fn policy(&self, config: impl Into<String>) -> PluginPolicy {
        PluginPolicy::start(self.clone(), config.into())
    }

    /// Checks, in a throw-away instance, that the policy accepts `config` for `facts` and
    /// `setup`: a bad setting is a configuration error before generation starts.
    pub fn check_config(
        &self,
        config: &str,
        facts: &ModelFacts,
        setup: &PolicySetup,
    ) -> Result<(), LoadError> {
        PluginPolicy::check_config(self, config, facts, setup)
    }

    pub(super) fn shared_name(&self) -> Arc<str> {
        Arc::clone(&self.inner.name)
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(super) fn pre(&self) -> &PolicyPre<HostState> {
        &self.inner.pre
    }

    pub(super) fn limits(&self) -> &SandboxLimits {
        &self.inner.limits
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
