//! The plugin registry: every loaded plugin and the default speculation settings, as one
//! immutable [`Snapshot`] that admin calls and the directory watcher replace atomically.
//!
//! An update, in order, always off the request path (admin handlers and the watcher run it on
//! a blocking thread, one update at a time):
//! 1. load what is new: read the `.wasm`, compile it (or fetch it from the compile cache),
//!    link it and check that it starts under the sandbox limits;
//! 2. smoke-test every new plugin version and every changed plugin config: open a session with
//!    the config, feed a short context, run a few propose/feedback/feed rounds, close it; any
//!    fault rejects the whole update;
//! 3. publish a new snapshot with the next generation number.
//!
//! A failed step leaves the published snapshot untouched, so a broken plugin version never
//! reaches a request. Slots compare the generation between rounds (`slot.rs`) and rebuild an
//! in-flight request's cascade from the new snapshot when its sources changed.
//!
//! Plugins are named as in `--cascade` (a built-in's name, a file's stem) and are never
//! unloaded; a request may use any loaded plugin, by name. Policies likewise: every built-in
//! policy is loaded at start-up, a policy file when `--policy` or `PUT /admin/cascade` names
//! it, and a request may choose any loaded policy with its own settings (`window,raise=0.9`).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::cascade::{DraftSource, Feedback, ModelFacts, PolicySetup, SourceFault, Token};
use crate::cascade::CascadeMode;
use crate::plugins::{SourceSpec, parse_policy};
use crate::plugins::{
    BUILTIN_POLICIES, BUILTINS, LoadError, LoadedPlugin, LoadedPolicy, PluginHost,
};

/// Rounds of propose → feedback → feed in a smoke test. The `panic` test plugin fails on its
/// third `propose`, so at least three.
const SMOKE_ROUNDS: usize = 4;
/// Draft length asked for in a smoke test.
const SMOKE_DRAFT_LEN: usize = 8;
/// Length of the smoke test's context.
const SMOKE_CONTEXT_LEN: usize = 64;
/// Distinct tokens in the smoke test's repeating context: a pattern that repeats gives drafters
/// that copy from their context something to propose.
const SMOKE_PATTERN_LEN: u32 = 7;

/// The defaults a request uses when it does not choose its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Speculation {
    /// Source names in cascade order (empty: plain decoding).
    pub cascade: Vec<String>,
    /// Most draft tokens per round.
    pub draft_max: usize,
    /// How the cascade picks a draft.
    pub mode: CascadeMode,
    /// Policy choosing each round's draft length, with its settings (`cost`,
    /// `window,raise=0.9`); `None` drafts `draft_max` every round.
    pub policy: Option<String>,
}

/// Which sources a request drafts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CascadeChoice {
    /// The snapshot's default cascade, whatever it is at each round.
    Default,
    /// These loaded plugins, by name, in order (empty: plain decoding).
    Named(Vec<String>),
}

/// A loaded plugin and the cascade entry it was loaded from (to load it again).
#[derive(Debug, Clone)]
struct Plugin {
    spec: SourceSpec,
    loaded: LoadedPlugin,
    /// Times it was reloaded, changed or not: a slot's instances of an earlier incarnation
    /// (quarantined ones included) are replaced by fresh ones.
    incarnation: u64,
}

/// One source of a resolved cascade: a plugin version and its config.
#[derive(Debug, Clone)]
pub struct ResolvedSource {
    /// The plugin version.
    pub plugin: LoadedPlugin,
    /// Its config string.
    pub config: String,
    /// The plugin's incarnation (see [`SourceKey::incarnation`]).
    pub incarnation: u64,
}

impl ResolvedSource {
    /// What tells two sources apart: name, version (sha256), config and incarnation.
    pub fn key(&self) -> SourceKey {
        SourceKey {
            name: self.plugin.name().to_owned(),
            sha256: self.plugin.sha256().to_owned(),
            config: self.config.clone(),
            incarnation: self.incarnation,
        }
    }
}

/// The policy of a request: a loaded policy and its settings.
#[derive(Debug, Clone)]
pub struct ResolvedPolicy {
    /// The policy version.
    pub policy: LoadedPolicy,
    /// Its settings (`raise=0.9`), possibly empty.
    pub config: String,
}

impl ResolvedPolicy {
    /// What tells two policies apart: name, version (sha256) and settings.
    pub fn key(&self) -> SourceKey {
        SourceKey {
            name: self.policy.name().to_owned(),
            sha256: self.policy.sha256().to_owned(),
            config: self.config.clone(),
            incarnation: 0,
        }
    }

    /// The policy and settings as a request or `--policy` writes them.
    pub fn label(&self) -> String {
        if self.config.is_empty() {
            self.policy.name().to_owned()
        } else {
            format!("{},{}", self.policy.name(), self.config)
        }
    }
}

/// Identity of a source (or a policy): two sources with equal keys draft alike.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceKey {
    /// Plugin name.
    pub name: String,
    /// sha256 of the plugin's `.wasm`.
    pub sha256: String,
    /// The plugin's config string.
    pub config: String,
    /// How many times the plugin was reloaded before this instance was made (0 for
    /// policies): a reload replaces every instance, which ends their quarantine.
    pub incarnation: u64,
}

/// The loaded plugins and the defaults, as published at one generation.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Increases by one with every published update.
    pub generation: u64,
    /// Default speculation settings.
    pub defaults: Speculation,
    plugins: BTreeMap<String, Plugin>,
    plugin_configs: BTreeMap<String, String>,
    policies: BTreeMap<String, LoadedPolicy>,
}

/// A plugin as `GET /admin/cascade` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PluginInfo {
    /// The plugin's name.
    pub name: String,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// sha256 of that file, hex.
    pub sha256: String,
    /// Its config string.
    pub config: String,
    /// Times it was reloaded; each reload starts every slot's instance afresh.
    pub incarnation: u64,
}

/// A loaded policy as `GET /admin/cascade` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyInfo {
    /// The policy's name.
    pub name: String,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// sha256 of that file, hex.
    pub sha256: String,
}

impl Snapshot {
    /// The sources of `choice`, in order, with their configs.
    pub fn resolve(&self, choice: &CascadeChoice) -> Result<Vec<ResolvedSource>, UpdateError> {
        let names = match choice {
            CascadeChoice::Default => &self.defaults.cascade,
            CascadeChoice::Named(names) => names,
        };
        names
            .iter()
            .map(|name| {
                let plugin = self.plugin(name)?;
                Ok(ResolvedSource {
                    plugin: plugin.loaded.clone(),
                    config: self.config_of(name),
                    incarnation: plugin.incarnation,
                })
            })
            .collect()
    }

    /// The loaded policy that `spec` (`name[,key=value...]`) names, with its settings. The
    /// settings are checked when the policy opens ([`Registry::check_policy`]).
    pub fn policy(&self, spec: &str) -> Result<ResolvedPolicy, UpdateError> {
        let parsed = parse_policy(spec).map_err(|error| UpdateError::Policy(error.to_string()))?;
        let name = parsed.name();
        let policy = self
            .policies
            .get(&name)
            .filter(|policy| match &parsed.plugin {
                SourceSpec::Path(path) => same_file(policy.path(), path),
                SourceSpec::Builtin(_) => true,
            })
            .ok_or_else(|| UpdateError::UnknownPolicy {
                name: spec.to_owned(),
                loaded: self.policies.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        Ok(ResolvedPolicy {
            policy: policy.clone(),
            config: parsed.config,
        })
    }

    /// Every loaded policy with its file and version.
    pub fn policies(&self) -> Vec<PolicyInfo> {
        self.policies
            .values()
            .map(|policy| PolicyInfo {
                name: policy.name().to_owned(),
                path: policy.path().to_owned(),
                sha256: policy.sha256().to_owned(),
            })
            .collect()
    }

    /// Whether a slot's cached instance of the policy `key` may still be used.
    pub fn is_current_policy(&self, key: &SourceKey) -> bool {
        self.policies
            .get(&key.name)
            .is_some_and(|policy| policy.sha256() == key.sha256)
    }

    /// Every loaded plugin, for saving their state.
    pub fn loaded_plugins(&self) -> impl Iterator<Item = &LoadedPlugin> {
        self.plugins.values().map(|plugin| &plugin.loaded)
    }

    /// Names of the loaded plugins, sorted.
    pub fn plugin_names(&self) -> Vec<String> {
        self.plugins.keys().cloned().collect()
    }

    /// Every loaded plugin with its file, version and config.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        self.plugins
            .iter()
            .map(|(name, plugin)| PluginInfo {
                name: name.clone(),
                path: plugin.loaded.path().to_owned(),
                sha256: plugin.loaded.sha256().to_owned(),
                config: self.config_of(name),
                incarnation: plugin.incarnation,
            })
            .collect()
    }

    /// Whether a slot's cached source of `key` may still be used: it is the current version,
    /// config and incarnation of a loaded plugin.
    pub fn is_current(&self, key: &SourceKey) -> bool {
        self.plugins.get(&key.name).is_some_and(|plugin| {
            plugin.loaded.sha256() == key.sha256
                && plugin.incarnation == key.incarnation
                && self.config_of(&key.name) == key.config
        })
    }

    fn plugin(&self, name: &str) -> Result<&Plugin, UpdateError> {
        self.plugins
            .get(name)
            .ok_or_else(|| UpdateError::UnknownPlugin {
                name: name.to_owned(),
                loaded: self.loaded_list(),
            })
    }

    fn config_of(&self, name: &str) -> String {
        self.plugin_configs.get(name).cloned().unwrap_or_default()
    }

    fn loaded_list(&self) -> String {
        if self.plugins.is_empty() {
            "none".to_owned()
        } else {
            self.plugin_names().join(", ")
        }
    }
}

/// Why an update (or a request's choice of sources) was refused. The published snapshot is
/// unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateError {
    /// A name that is not a loaded plugin.
    #[error(
        "plugin `{name}` is not loaded (loaded: {loaded}); name a loaded plugin, or load it as an admin with PUT /admin/cascade"
    )]
    UnknownPlugin {
        /// The name given.
        name: String,
        /// The loaded plugins, comma-separated.
        loaded: String,
    },
    /// The new plugin version could not be loaded.
    #[error("cannot load plugin `{plugin}`: {source}")]
    Load {
        /// The plugin.
        plugin: String,
        /// Why.
        #[source]
        source: LoadError,
    },
    /// The new plugin version or config faulted in its smoke test.
    #[error(
        "plugin `{plugin}` failed its smoke test ({fault}); the previous version stays in use, fix the plugin or its config and retry"
    )]
    SmokeTest {
        /// The plugin.
        plugin: String,
        /// What it did.
        fault: String,
    },
    /// A path whose file stem names a plugin already loaded from elsewhere.
    #[error(
        "a plugin named `{name}` is already loaded from {loaded}; rename {new} so its file stem differs, or reload `{name}` with POST /admin/plugins/reload"
    )]
    NameClash {
        /// The name both share.
        name: String,
        /// Where the loaded one came from.
        loaded: String,
        /// The path given.
        new: String,
    },
    /// A default `draft_max` of 0 or above the server's `--draft-max`.
    #[error(
        "draft_max must be between 1 and {limit} (the server's --draft-max, up to which it measured the verify cost), got {given}; use the cascade `none` to decode without speculation"
    )]
    DraftMax {
        /// The value given.
        given: usize,
        /// The server's `--draft-max`.
        limit: usize,
    },
    /// A policy that is not loaded.
    #[error(
        "policy `{name}` is not loaded (loaded: {loaded}); name a loaded policy, or load a policy file as an admin with PUT /admin/cascade"
    )]
    UnknownPolicy {
        /// The policy as given.
        name: String,
        /// The loaded policies, comma-separated.
        loaded: String,
    },
    /// A plugin that drafts with the draft model, on a server without one.
    #[error(
        "plugin `{plugin}` drafts with the draft model, but this server has none; choose another cascade, or start the server with --draft-model auto (the default target's draft) or --draft-model PATH.gguf"
    )]
    NoDraftModel {
        /// The plugin.
        plugin: String,
    },
    /// A malformed policy, or settings the policy refused; the message names the fix.
    #[error("{0}")]
    Policy(String),
}

/// A change of the defaults (`PUT /admin/cascade`); `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct DefaultsUpdate {
    /// New default cascade; paths to new `.wasm` files are loaded.
    pub cascade: Option<Vec<SourceSpec>>,
    /// New default draft length.
    pub draft_max: Option<usize>,
    /// New default cascade mode.
    pub mode: Option<CascadeMode>,
    /// New default policy (`Some(None)` removes it).
    pub policy: Option<Option<String>>,
    /// New config strings of loaded plugins (or of plugins this update loads), by name.
    pub plugin_configs: BTreeMap<String, String>,
}

/// What a reload did, plugin by plugin.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadReport {
    /// The generation now published.
    pub generation: u64,
    /// Plugins whose file changed and whose new version is now in use.
    pub reloaded: Vec<String>,
    /// Plugins whose file is unchanged (their quarantined instances, if any, start afresh).
    pub unchanged: Vec<String>,
}

/// Distinct policy settings remembered as checked ([`Registry::policy_checked`]).
const CHECKED_POLICIES: usize = 256;

/// Policy settings that opened in a throw-away instance: a policy version, its settings, the
/// sources and draft length of the requests they were checked for.
type CheckedPolicy = (SourceKey, Vec<String>, usize);

/// The registry: the plugin host and the published [`Snapshot`].
pub struct Registry {
    host: PluginHost,
    facts: ModelFacts,
    current: ArcSwap<Snapshot>,
    /// One update at a time: each reads the current snapshot and publishes the next.
    updates: Mutex<()>,
    /// The most a default or a request's `draft_max` may be (`--draft-max`).
    draft_max_limit: usize,
    /// The last [`CHECKED_POLICIES`] policy settings that passed their check, oldest first.
    checked_policies: Mutex<VecDeque<CheckedPolicy>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("generation", &self.current.load().generation)
            .finish_non_exhaustive()
    }
}

/// Loads the policies a server starts with: the default policy's file, if `--policy` names
/// one, then every built-in policy found. A missing built-in is skipped.
pub fn load_startup_policies(
    host: &PluginHost,
    default: Option<&str>,
) -> anyhow::Result<Vec<LoadedPolicy>> {
    let mut loaded = Vec::new();
    if let Some(spec) = default {
        let spec = parse_policy(spec)?;
        if matches!(spec.plugin, SourceSpec::Path(_)) {
            loaded.push(host.load_policy(&spec.plugin)?);
        }
    }
    for name in BUILTIN_POLICIES {
        if loaded
            .iter()
            .any(|policy: &LoadedPolicy| policy.name() == *name)
        {
            continue;
        }
        match host.load_policy(&SourceSpec::Builtin((*name).to_owned())) {
            Ok(policy) => loaded.push(policy),
            Err(LoadError::BuiltinMissing { searched, .. }) => {
                tracing::info!(policy = name, %searched, "built-in policy not found; requests cannot choose it");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(loaded)
}

/// Loads the plugins a server starts with: the default cascade's entries, then every built-in
/// found (so requests can choose them). A missing built-in that the default cascade does not
/// name is skipped; any other failure is returned.
pub fn load_startup_plugins(
    host: &PluginHost,
    cascade: &[SourceSpec],
) -> Result<Vec<(SourceSpec, LoadedPlugin)>, LoadError> {
    let mut loaded: Vec<(SourceSpec, LoadedPlugin)> = Vec::new();
    for spec in cascade {
        loaded.push((spec.clone(), host.load(spec)?));
    }
    for name in BUILTINS {
        if loaded.iter().any(|(spec, _)| spec.name() == *name) {
            continue;
        }
        let spec = SourceSpec::Builtin((*name).to_owned());
        match host.load(&spec) {
            Ok(plugin) => loaded.push((spec, plugin)),
            Err(LoadError::BuiltinMissing { searched, .. }) => {
                tracing::info!(plugin = name, %searched, "built-in plugin not found; requests cannot choose it");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(loaded)
}

impl Registry {
    /// A registry over `plugins` (from [`load_startup_plugins`]) and `policies` (from
    /// [`load_startup_policies`]) with `defaults`, after checking that every plugin accepts its
    /// config from `plugin_configs` and the default policy its settings. `defaults.draft_max`
    /// is also the most any later default or request may ask for.
    pub fn start(
        host: PluginHost,
        facts: ModelFacts,
        plugins: Vec<(SourceSpec, LoadedPlugin)>,
        policies: Vec<LoadedPolicy>,
        plugin_configs: BTreeMap<String, String>,
        defaults: Speculation,
    ) -> Result<Self, UpdateError> {
        let mut by_name = BTreeMap::new();
        for (spec, loaded) in plugins {
            let name = loaded.name().to_owned();
            let config = plugin_configs.get(&name).cloned().unwrap_or_default();
            loaded
                .check_config(&config, &facts)
                .map_err(|source| UpdateError::Load {
                    plugin: name.clone(),
                    source,
                })?;
            by_name.insert(
                name,
                Plugin {
                    spec,
                    loaded,
                    incarnation: 0,
                },
            );
        }
        let draft_max_limit = defaults.draft_max;
        let snapshot = Snapshot {
            generation: 0,
            defaults,
            plugins: by_name,
            plugin_configs,
            policies: policies
                .into_iter()
                .map(|policy| (policy.name().to_owned(), policy))
                .collect(),
        };
        let registry = Self {
            host,
            facts,
            current: ArcSwap::from_pointee(snapshot),
            updates: Mutex::new(()),
            draft_max_limit,
            checked_policies: Mutex::new(VecDeque::new()),
        };
        registry.check_defaults(&registry.snapshot())?;
        Ok(registry)
    }

    /// Whether `policy` already opened with its settings for requests drafting with `sources`
    /// up to `draft_max` tokens (recently: the last [`CHECKED_POLICIES`] are remembered), so a
    /// request need not try it again. Runs no plugin code.
    pub fn policy_checked(
        &self,
        policy: &ResolvedPolicy,
        sources: &[String],
        draft_max: usize,
    ) -> bool {
        let checked = self
            .checked_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        checked
            .iter()
            .any(|(key, checked_sources, checked_draft_max)| {
                *key == policy.key()
                    && checked_sources == sources
                    && *checked_draft_max == draft_max
            })
    }

    /// `policy` for requests drafting with `sources` up to `draft_max` tokens, after checking
    /// in a throw-away instance that the policy accepts its settings. Runs plugin code: call it
    /// off the async runtime.
    pub fn check_policy(
        &self,
        policy: ResolvedPolicy,
        sources: Vec<String>,
        draft_max: usize,
    ) -> Result<ResolvedPolicy, UpdateError> {
        if self.policy_checked(&policy, &sources, draft_max) {
            return Ok(policy);
        }
        let setup = PolicySetup {
            sources: sources.clone(),
            max_draft_len: draft_max,
            verify_costs: Vec::new(),
        };
        policy
            .policy
            .check_config(&policy.config, &self.facts, &setup)
            .map_err(|error| UpdateError::Policy(error.to_string()))?;
        let mut checked = self
            .checked_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if checked.len() == CHECKED_POLICIES {
            checked.pop_front();
        }
        checked.push_back((policy.key(), sources, draft_max));
        Ok(policy)
    }

    /// Checks that each of `sources` that drafts with the draft model has one to draft with.
    pub fn check_draft_model(&self, sources: &[ResolvedSource]) -> Result<(), UpdateError> {
        match sources.iter().find(|s| s.plugin.uses_draft_model()) {
            Some(source) if !self.host.has_draft_model() => Err(UpdateError::NoDraftModel {
                plugin: source.plugin.name().to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Checks that the defaults of `snapshot` can run: their plugins and policy are loaded, the
    /// draft model is there if a plugin needs it, and the policy accepts its settings.
    fn check_defaults(&self, snapshot: &Snapshot) -> Result<(), UpdateError> {
        let defaults = &snapshot.defaults;
        self.check_draft_model(&snapshot.resolve(&CascadeChoice::Default)?)?;
        if defaults.draft_max == 0 || defaults.draft_max > self.draft_max_limit {
            return Err(UpdateError::DraftMax {
                given: defaults.draft_max,
                limit: self.draft_max_limit,
            });
        }
        if let Some(policy) = &defaults.policy {
            self.check_policy(
                snapshot.policy(policy)?,
                defaults.cascade.clone(),
                defaults.draft_max,
            )?;
        }
        Ok(())
    }

    /// The published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The published generation; cheap enough to read every round.
    pub fn generation(&self) -> u64 {
        self.current.load().generation
    }

    /// Changes the defaults: loads new plugins, smoke-tests new plugins and changed configs,
    /// then publishes. Blocks (compiling a plugin takes a while): call it off the async runtime.
    pub fn update_defaults(&self, update: DefaultsUpdate) -> Result<Arc<Snapshot>, UpdateError> {
        let _one_at_a_time = self.updates.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot();
        let mut next = Snapshot::clone(&current);
        next.generation += 1;
        let mut to_test: Vec<String> = Vec::new();

        if let Some(specs) = &update.cascade {
            let mut names = Vec::with_capacity(specs.len());
            for spec in specs {
                let name = spec.name();
                match next.plugins.get(&name) {
                    Some(plugin) => check_same_source(&name, plugin, spec)?,
                    None => {
                        let loaded = self.load(spec)?;
                        next.plugins.insert(
                            name.clone(),
                            Plugin {
                                spec: spec.clone(),
                                loaded,
                                incarnation: 0,
                            },
                        );
                        to_test.push(name.clone());
                    }
                }
                names.push(name);
            }
            next.defaults.cascade = names;
        }
        for (name, config) in &update.plugin_configs {
            next.plugin(name)?;
            if next.plugin_configs.get(name) != Some(config) {
                next.plugin_configs.insert(name.clone(), config.clone());
                to_test.push(name.clone());
            }
        }
        if let Some(draft_max) = update.draft_max {
            next.defaults.draft_max = draft_max;
        }
        if let Some(mode) = update.mode {
            next.defaults.mode = mode;
        }
        if let Some(policy) = update.policy {
            if let Some(spec) = &policy {
                self.load_policy_file(&mut next, spec)?;
            }
            next.defaults.policy = policy;
        }
        self.check_defaults(&next)?;

        to_test.sort();
        to_test.dedup();
        for name in &to_test {
            let plugin = next.plugin(name)?;
            smoke_test(&plugin.loaded, &next.config_of(name), &self.facts)?;
        }
        Ok(self.publish(next))
    }

    /// Loads `names` (all plugins when `None`) again from their files; those whose file changed
    /// are smoke-tested and, if all pass, published together. Every named plugin starts a new
    /// incarnation, changed or not, so slots replace their instances and quarantines end.
    /// Blocks: call it off the async runtime.
    pub fn reload(&self, names: Option<&[String]>) -> Result<ReloadReport, UpdateError> {
        let _one_at_a_time = self.updates.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot();
        let mut next = Snapshot::clone(&current);
        next.generation += 1;
        let names = match names {
            Some(names) => names.to_vec(),
            None => current.plugin_names(),
        };
        let mut report = ReloadReport::default();
        for name in &names {
            let plugin = next.plugin(name)?.clone();
            let loaded = self.load(&plugin.spec)?;
            let incarnation = plugin.incarnation + 1;
            if loaded.sha256() == plugin.loaded.sha256() {
                report.unchanged.push(name.clone());
                next.plugins.insert(
                    name.clone(),
                    Plugin {
                        incarnation,
                        ..plugin
                    },
                );
                continue;
            }
            smoke_test(&loaded, &next.config_of(name), &self.facts)?;
            next.plugins.insert(
                name.clone(),
                Plugin {
                    spec: plugin.spec,
                    loaded,
                    incarnation,
                },
            );
            report.reloaded.push(name.clone());
        }
        report.generation = self.publish(next).generation;
        Ok(report)
    }

    /// Loads the policy file `spec` names into `next`, unless it names a built-in or a loaded
    /// file. A file whose stem is the name of another loaded policy is refused.
    fn load_policy_file(&self, next: &mut Snapshot, spec: &str) -> Result<(), UpdateError> {
        let parsed = parse_policy(spec).map_err(|error| UpdateError::Policy(error.to_string()))?;
        let SourceSpec::Path(path) = &parsed.plugin else {
            return Ok(());
        };
        let name = parsed.name();
        if let Some(loaded) = next.policies.get(&name) {
            if same_file(loaded.path(), path) {
                return Ok(());
            }
            return Err(UpdateError::NameClash {
                name,
                loaded: loaded.path().display().to_string(),
                new: path.display().to_string(),
            });
        }
        let loaded = self
            .host
            .load_policy(&parsed.plugin)
            .map_err(|source| UpdateError::Load {
                plugin: name.clone(),
                source,
            })?;
        next.policies.insert(name, loaded);
        Ok(())
    }

    fn load(&self, spec: &SourceSpec) -> Result<LoadedPlugin, UpdateError> {
        self.host.load(spec).map_err(|source| UpdateError::Load {
            plugin: spec.name(),
            source,
        })
    }

    fn publish(&self, next: Snapshot) -> Arc<Snapshot> {
        let next = Arc::new(next);
        self.current.store(Arc::clone(&next));
        tracing::info!(
            generation = next.generation,
            cascade = %next.defaults.cascade.join(","),
            draft_max = next.defaults.draft_max,
            "published plugin registry"
        );
        next
    }
}

/// A cascade entry may name an already loaded plugin: a bare name means the loaded plugin of
/// that name, whether it is a built-in or came from a file; a path must be the file it came
/// from.
fn check_same_source(name: &str, loaded: &Plugin, spec: &SourceSpec) -> Result<(), UpdateError> {
    let SourceSpec::Path(path) = spec else {
        return Ok(());
    };
    if matches!(&loaded.spec, SourceSpec::Path(loaded_path) if same_file(loaded_path, path)) {
        return Ok(());
    }
    Err(UpdateError::NameClash {
        name: name.to_owned(),
        loaded: loaded.loaded.path().display().to_string(),
        new: path.display().to_string(),
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Runs `plugin` with `config` through a short request in a throw-away instance; any fault
/// (a rejected config, a trap, a time-out, an invalid proposal) fails the test.
pub fn smoke_test(
    plugin: &LoadedPlugin,
    config: &str,
    facts: &ModelFacts,
) -> Result<(), UpdateError> {
    let name = plugin.name().to_owned();
    plugin
        .check_config(config, facts)
        .map_err(|source| UpdateError::Load {
            plugin: name.clone(),
            source,
        })?;
    let failed = |fault: SourceFault| UpdateError::SmokeTest {
        plugin: name.clone(),
        fault: fault.what,
    };
    let mut source = plugin.source(config);
    let context = smoke_context(facts.vocab_size);
    source.begin(facts, &context).map_err(failed)?;
    for round in 0..SMOKE_ROUNDS {
        let proposal = source.propose(SMOKE_DRAFT_LEN).map_err(failed)?;
        let target_token = context[(context.len() + round) % context.len()];
        let n_accepted = usize::from(proposal.tokens.first() == Some(&target_token));
        source
            .feedback(Feedback {
                won: !proposal.tokens.is_empty(),
                n_accepted: n_accepted as u32,
                target_token,
            })
            .map_err(failed)?;
        source.feed(&[target_token]).map_err(failed)?;
    }
    source.end();
    match source.last_fault() {
        Some(fault) => Err(failed(fault.clone())),
        None => Ok(()),
    }
}

/// A context that repeats a short pattern of valid token ids.
fn smoke_context(vocab_size: u32) -> Vec<Token> {
    let distinct = SMOKE_PATTERN_LEN.min(vocab_size).max(1);
    (0..SMOKE_CONTEXT_LEN as u32)
        .map(|i| i % distinct)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoke_context_repeats_valid_tokens() {
        let context = smoke_context(5);
        assert_eq!(context.len(), SMOKE_CONTEXT_LEN);
        assert!(context.iter().all(|&t| t < 5), "context: {context:?}");
        assert_eq!(&context[..6], &[0, 1, 2, 3, 4, 0]);
        assert!(smoke_context(1).iter().all(|&t| t == 0));
    }
}
