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

mod error;
mod smoke;
mod snapshot;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

pub use self::error::UpdateError;
use self::smoke::smoke_test;
pub use self::snapshot::{
    CascadeChoice, PluginInfo, PolicyInfo, ResolvedPolicy, ResolvedSource, Snapshot, SourceKey,
    Speculation,
};
use self::snapshot::{Plugin, same_file};
use crate::cascade::{CascadeMode, ModelFacts, PolicySetup};
use crate::engine::check_max_draft_len;
use crate::plugins::{
    BUILTIN_POLICIES, BUILTINS, LoadError, LoadedPlugin, LoadedPolicy, PluginHost, SourceSpec,
    parse_policy,
};

/// A change of the defaults (`PUT /admin/cascade`); `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct DefaultsUpdate {
    /// New default cascade; paths to new `.wasm` files are loaded.
    pub cascade: Option<Vec<SourceSpec>>,
    /// New default draft length.
    pub max_draft_len: Option<usize>,
    /// New default cascade mode.
    pub mode: Option<CascadeMode>,
    /// New default policy (`Some(None)` removes it).
    pub policy: Option<Option<String>>,
    /// New config strings of loaded plugins (or of plugins this update loads), by name.
    pub plugin_configs: BTreeMap<String, String>,
}

/// The defaults another replica published (`serve --share`), to apply here: its default
/// cascade, each plugin at the version it runs, and its other defaults and plugin configs.
#[derive(Debug, Clone)]
pub struct SharedDefaults {
    /// The default cascade, in order.
    pub cascade: Vec<SharedPlugin>,
    /// Default draft length.
    pub max_draft_len: usize,
    /// Default cascade mode.
    pub mode: CascadeMode,
    /// Default policy: its settings string, with the policy named by its name (a file of the
    /// replica's version in `policy_file` when this server lacks that version).
    pub policy: Option<String>,
    /// The policy's file here, when the default policy is a file the replica published.
    pub policy_file: Option<SharedPlugin>,
    /// Config strings by plugin name (names this server has not loaded are left out).
    pub plugin_configs: BTreeMap<String, String>,
}

/// A plugin at the version another replica runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPlugin {
    /// Its name.
    pub name: String,
    /// sha256 of its `.wasm`, hex.
    pub sha256: String,
    /// A local copy of that `.wasm`, named `NAME.wasm`; `None` when this server already runs
    /// that version.
    pub file: Option<std::path::PathBuf>,
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
    max_draft_len_limit: usize,
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

/// Loads the policies a server starts with: the file of each of `specs` (`name[,key=value...]`)
/// that names one, the default policy first, then every built-in policy found. A missing
/// built-in is skipped.
pub fn load_startup_policies<'a>(
    host: &PluginHost,
    specs: impl IntoIterator<Item = &'a String>,
) -> anyhow::Result<Vec<LoadedPolicy>> {
    let mut loaded: Vec<LoadedPolicy> = Vec::new();
    for spec in specs {
        let spec = parse_policy(spec)?;
        if matches!(spec.plugin, SourceSpec::Path(_))
            && !loaded.iter().any(|policy| policy.name() == spec.name())
        {
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
        let max_draft_len_limit = defaults.max_draft_len;
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
            max_draft_len_limit,
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
        max_draft_len: usize,
    ) -> bool {
        let checked = self
            .checked_policies
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        checked
            .iter()
            .any(|(key, checked_sources, checked_max_draft_len)| {
                *key == policy.key()
                    && checked_sources == sources
                    && *checked_max_draft_len == max_draft_len
            })
    }

    /// `policy` for requests drafting with `sources` up to `draft_max` tokens, after checking
    /// in a throw-away instance that the policy accepts its settings. Runs plugin code: call it
    /// off the async runtime.
    pub fn check_policy(
        &self,
        policy: ResolvedPolicy,
        sources: Vec<String>,
        max_draft_len: usize,
    ) -> Result<ResolvedPolicy, UpdateError> {
        if self.policy_checked(&policy, &sources, max_draft_len) {
            return Ok(policy);
        }
        let setup = PolicySetup {
            sources: sources.clone(),
            max_draft_len,
            verify_costs: Vec::new(),
            draft_model: None,
            prompt_len: 0,
            max_tokens: 0,
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
        checked.push_back((policy.key(), sources, max_draft_len));
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
        if check_max_draft_len(defaults.max_draft_len, self.max_draft_len_limit).is_err() {
            return Err(UpdateError::DraftMax {
                given: defaults.max_draft_len,
                limit: self.max_draft_len_limit,
            });
        }
        if let Some(policy) = &defaults.policy {
            self.check_policy(
                snapshot.policy(policy)?,
                defaults.cascade.clone(),
                defaults.max_draft_len,
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
        if let Some(max_draft_len) = update.max_draft_len {
            next.defaults.max_draft_len = max_draft_len;
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
        self.check_and_publish(next, to_test)
    }

    /// Applies the defaults another replica published: loads the plugin versions this server
    /// lacks from their local copies (a plugin of the same name at another version is
    /// replaced, its instances started afresh), then checks, smoke-tests and publishes as
    /// [`Self::update_defaults`] does. Blocks: call it off the async runtime.
    pub fn apply_shared(&self, shared: SharedDefaults) -> Result<Arc<Snapshot>, UpdateError> {
        let _one_at_a_time = self.updates.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = Snapshot::clone(&self.snapshot());
        next.generation += 1;
        let mut to_test: Vec<String> = Vec::new();
        for source in &shared.cascade {
            let current = next.plugins.get(&source.name);
            if current.is_some_and(|plugin| plugin.loaded.sha256() == source.sha256) {
                continue;
            }
            let spec = SourceSpec::Path(shared_file(source)?);
            let loaded = self.load(&spec)?;
            check_shared_version(source, loaded.sha256())?;
            let incarnation = current.map_or(0, |plugin| plugin.incarnation + 1);
            next.plugins.insert(
                source.name.clone(),
                Plugin {
                    spec,
                    loaded,
                    incarnation,
                },
            );
            to_test.push(source.name.clone());
        }
        next.defaults.cascade = shared.cascade.iter().map(|s| s.name.clone()).collect();
        for (name, config) in shared.plugin_configs {
            if next.plugins.contains_key(&name) && next.plugin_configs.get(&name) != Some(&config) {
                next.plugin_configs.insert(name.clone(), config);
                to_test.push(name);
            }
        }
        next.defaults.max_draft_len = shared.max_draft_len;
        next.defaults.mode = shared.mode;
        next.defaults.policy = match (&shared.policy_file, shared.policy) {
            (Some(file), Some(settings)) => {
                let current = next.policies.get(&file.name);
                if current.is_none_or(|policy| policy.sha256() != file.sha256) {
                    let spec = SourceSpec::Path(shared_file(file)?);
                    let loaded =
                        self.host
                            .load_policy(&spec)
                            .map_err(|source| UpdateError::Load {
                                plugin: file.name.clone(),
                                source,
                            })?;
                    check_shared_version(file, loaded.sha256())?;
                    next.policies.insert(file.name.clone(), loaded);
                }
                Some(settings)
            }
            (_, policy) => policy,
        };
        self.check_and_publish(next, to_test)
    }

    /// Checks `next`'s defaults and smoke-tests the plugins named in `to_test` with their
    /// configs, then publishes `next`; changes nothing when a check fails.
    fn check_and_publish(
        &self,
        next: Snapshot,
        mut to_test: Vec<String>,
    ) -> Result<Arc<Snapshot>, UpdateError> {
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
            max_draft_len = next.defaults.max_draft_len,
            "published plugin registry"
        );
        next
    }
}

/// The local copy of a replica's plugin version this server lacks.
fn shared_file(plugin: &SharedPlugin) -> Result<std::path::PathBuf, UpdateError> {
    plugin
        .file
        .clone()
        .ok_or_else(|| UpdateError::SharedVersionMissing {
            plugin: plugin.name.clone(),
            sha256: plugin.sha256.clone(),
        })
}

/// Checks that a replica's plugin file holds the version it published.
fn check_shared_version(plugin: &SharedPlugin, loaded_sha256: &str) -> Result<(), UpdateError> {
    if loaded_sha256 == plugin.sha256 {
        return Ok(());
    }
    Err(UpdateError::SharedVersionMissing {
        plugin: plugin.name.clone(),
        sha256: plugin.sha256.clone(),
    })
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
