//! [`Loaded`]: one checked, compiled and linked component, ready to be instantiated cheaply;
//! [`LoadedPlugin`] for drafters, [`LoadedPolicy`] for policies.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::Engine;

use super::error::LoadError;
use super::policy::PluginPolicy;
use super::sandbox::{EpochTicker, SandboxLimits};
use super::source::PluginSource;
use super::state::StateSlot;
use super::supervised::Supervised;
use super::world::{DrafterRequest, DrafterWorld, PolicyRequest, PolicyWorld, World};
use crate::cascade::{DraftModelCosts, ModelFacts, PolicySetup};

/// A checked, compiled and linked drafter component. Make sources with
/// [`LoadedPlugin::source`].
pub type LoadedPlugin = Loaded<DrafterWorld>;

/// A checked, compiled and linked policy component. Make per-cascade policies with
/// [`LoadedPolicy::policy`].
pub type LoadedPolicy = Loaded<PolicyWorld>;

/// A component of world `W`, checked, compiled and linked by
/// [`PluginHost`](super::PluginHost): each instance made from it only has to be instantiated.
/// Cheap to clone.
pub struct Loaded<W: World> {
    inner: Arc<LoadedInner<W>>,
}

/// What a [`Loaded`] shares between its clones, as the host's loader gathers it.
pub(super) struct LoadedInner<W: World> {
    pub(super) name: Arc<str>,
    pub(super) path: PathBuf,
    pub(super) sha256: String,
    pub(super) pre: W::Pre,
    pub(super) engine: Engine,
    /// The host's limits: those of instances made without limits of their own.
    pub(super) limits: SandboxLimits,
    pub(super) extras: W::Extras,
    /// The CPU time the loader's check instance took to start, set once it has.
    pub(super) start_time: OnceLock<Duration>,
    /// Keeps deadlines enforced for as long as this plugin can run.
    pub(super) _ticker: Arc<EpochTicker>,
}

impl<W: World> Clone for Loaded<W> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<W: World> fmt::Debug for Loaded<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("kind", &W::KIND)
            .field("name", &self.inner.name)
            .field("path", &self.inner.path)
            .field("sha256", &self.inner.sha256)
            .finish_non_exhaustive()
    }
}

impl<W: World> Loaded<W> {
    pub(super) fn new(inner: LoadedInner<W>) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The name instances of this plugin show: the built-in name or the file stem.
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

    /// The CPU time an instance took to start when the plugin was loaded (its data copied in,
    /// its start-up code run): what each restart after a trap costs again.
    pub fn start_time(&self) -> Duration {
        self.inner.start_time.get().copied().unwrap_or_default()
    }

    pub(super) fn record_start_time(&self, time: Duration) {
        // Set once, by the loader; a second call would keep the first time.
        let _ = self.inner.start_time.set(time);
    }

    pub(super) fn shared_name(&self) -> Arc<str> {
        Arc::clone(&self.inner.name)
    }

    pub(super) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(super) fn pre(&self) -> &W::Pre {
        &self.inner.pre
    }

    pub(super) fn limits(&self) -> &SandboxLimits {
        &self.inner.limits
    }

    pub(super) fn extras(&self) -> &W::Extras {
        &self.inner.extras
    }
}

impl Loaded<DrafterWorld> {
    /// Whether the plugin drives the host's draft model (it imports `draft-model`): such a
    /// source is expensive, and the scored cascade asks it only when cheap sources fall short.
    pub fn uses_draft_model(&self) -> bool {
        self.inner.extras.uses_draft_model
    }

    /// What drafting with the host's draft model costs, for a plugin that drives it, once the
    /// draft model is attached and was measured.
    pub fn draft_model_costs(&self) -> Option<DraftModelCosts> {
        let extras = &self.inner.extras;
        if !extras.uses_draft_model {
            return None;
        }
        extras.draft_model.get()?.costs
    }

    /// The plugin's cross-request state; [`StateSlot::persist`] writes it to its file.
    pub fn state(&self) -> &StateSlot {
        &self.inner.extras.state
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
        self.source_with_limits(config, self.limits().clone())
    }

    /// Like [`Self::source`], under other limits than the host's.
    pub fn source_with_limits(
        &self,
        config: impl Into<String>,
        limits: SandboxLimits,
    ) -> PluginSource {
        PluginSource::start(self.clone(), config.into(), limits)
    }

    /// Checks, in a throw-away instance, that the plugin accepts `config` for a model with
    /// `facts`: its `open` must return `ok`. Run before generation so a bad setting is a
    /// configuration error, not a fault in the middle of a request.
    pub fn check_config(&self, config: &str, facts: &ModelFacts) -> Result<(), LoadError> {
        let request = DrafterRequest::new(facts, &[]);
        Supervised::check_config(self, config, request, self.limits())
    }
}

impl Loaded<PolicyWorld> {
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
        let request = PolicyRequest::new(facts, setup);
        Supervised::check_config(self, config, request, self.limits())
    }
}
