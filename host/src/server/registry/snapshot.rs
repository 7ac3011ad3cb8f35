//! What one generation of the registry publishes: the loaded plugins and policies, their
//! configs, and the default speculation settings; and how a request's choice resolves against it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::UpdateError;
use crate::cascade::CascadeMode;
use crate::plugins::{LoadedPlugin, LoadedPolicy, SourceSpec, parse_policy};

/// The defaults a request uses when it does not choose its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Speculation {
    /// Source names in cascade order (empty: plain decoding).
    pub cascade: Vec<String>,
    /// Most draft tokens per round.
    #[serde(rename = "draft_max")]
    pub max_draft_len: usize,
    /// How the cascade picks a draft.
    pub mode: CascadeMode,
    /// Whether requests with a grammar also draft with the host's grammar source.
    pub grammar_drafts: bool,
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
pub(super) struct Plugin {
    pub(super) spec: SourceSpec,
    pub(super) loaded: LoadedPlugin,
    /// Times it was reloaded, changed or not: a slot's instances of an earlier incarnation
    /// (quarantined ones included) are replaced by fresh ones.
    pub(super) incarnation: u64,
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
    pub(super) plugins: BTreeMap<String, Plugin>,
    pub(super) plugin_configs: BTreeMap<String, String>,
    pub(super) policies: BTreeMap<String, LoadedPolicy>,
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

    /// The loaded plugin `name`.
    pub(super) fn plugin(&self, name: &str) -> Result<&Plugin, UpdateError> {
        self.plugins
            .get(name)
            .ok_or_else(|| UpdateError::UnknownPlugin {
                name: name.to_owned(),
                loaded: self.loaded_list(),
            })
    }

    /// The config string of plugin `name` (empty when none was set).
    pub(super) fn config_of(&self, name: &str) -> String {
        self.plugin_configs.get(name).cloned().unwrap_or_default()
    }

    /// The loaded plugins' names for an error message.
    fn loaded_list(&self) -> String {
        if self.plugins.is_empty() {
            "none".to_owned()
        } else {
            self.plugin_names().join(", ")
        }
    }
}

/// Whether `a` and `b` name the same file.
pub(super) fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
