//! [`Stack`]: what `run`, `bench` and `serve` load before they decode, once, in one order.
//!
//! 1. The placement's warnings are logged, and this thread (and so the plugin host's threads,
//!    started next) is pinned to the auxiliary CPUs.
//! 2. The plugin host starts and the command loads its plugins and policies (a closure of the
//!    command's): a misspelt cascade entry fails before the model is loaded.
//! 3. A plugin that drafts with the draft model needs one (`--draft-model`).
//! 4. This thread, which decodes (`run`, `bench`, a server's batcher), is pinned to the compute
//!    CPUs, so llama.cpp's OpenMP workers, started at its first decode, inherit them.
//! 5. The target loads; then the draft model, if any (a default draft is made from its base
//!    model on first use), is checked against the target's tokenizer and, for
//!    [`DraftContexts::PerInstance`], measured on a context of the plugins' kind (its costs,
//!    and its agreement with the target on a built-in text) and offered to them with those
//!    figures.
//!
//! Also here: building a cascade of loaded plugins with their configs and policy
//! ([`build_cascade`]), which checks every config before anything decodes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use crate::cascade::{
    Cascade, CascadeSettings, DraftModelCosts, DraftModelFactory, DraftSource, ModelFacts,
    PolicySetup,
};
use crate::config::{DraftSettings, StackSettings};
use crate::engine::{DraftModelHost, Target, measure_agreement, measure_draft_model};
use crate::placement::PinnedDraftFactory;
use crate::plugins::{LoadError, LoadedPlugin, LoadedPolicy, PluginHost, PluginHostConfig};

/// What a [`Stack`] loads.
#[derive(Debug, Clone, Copy)]
pub struct StackConfig<'a> {
    /// The target, its threads and pinning, the draft model and where plugins come from.
    pub settings: &'a StackSettings,
    /// Where plugins' cross-request state is kept, if anywhere.
    pub state_dir: Option<&'a Path>,
    /// spechost's cache (compiled plugins, default models).
    pub cache_dir: &'a Path,
}

/// How plugin instances that draft with the draft model get their contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftContexts {
    /// Each opens a llama.cpp context of its own (`run`, `bench`): the stack attaches the
    /// draft model to the plugin host (on `--draft-cpus`, if given).
    PerInstance,
    /// Each gets a sequence of one context, drafted for together (a server's batcher): the
    /// caller attaches the batcher's factory to the plugin host; the stack only loads the
    /// model.
    Batched,
}

/// The plugin host with the command's plugins, the target, and the draft model.
pub struct Stack<P> {
    /// The plugin host (the draft model attached, for [`DraftContexts::PerInstance`]).
    pub host: PluginHost,
    /// What the command's closure loaded.
    pub plugins: P,
    /// The target.
    pub target: Arc<Target>,
    /// The draft model, if any (`--draft-model`).
    pub draft_model: Option<Arc<DraftModelHost>>,
}

impl<P> Stack<P> {
    /// Loads the stack in the [module's](self) order. `load_plugins` loads the command's
    /// plugins and policies from the host and returns them with the plugins that must have a
    /// draft model if they draft with one (the command's default cascade).
    pub fn load(
        config: &StackConfig<'_>,
        draft_contexts: DraftContexts,
        load_plugins: impl FnOnce(&PluginHost) -> anyhow::Result<(P, Vec<LoadedPlugin>)>,
    ) -> anyhow::Result<Self> {
        let settings = config.settings;
        for warning in &settings.placement.warnings {
            tracing::warn!("{warning}");
        }
        settings
            .placement
            .pin_auxiliary()
            .context("pinning the plugin host's threads")?;
        let host = PluginHost::new(PluginHostConfig {
            cache_dir: Some(config.cache_dir.to_owned()),
            plugin_dirs: settings.plugin_dirs.clone(),
            state_dir: config.state_dir.map(Path::to_owned),
            ..PluginHostConfig::default()
        })
        .context("starting the plugin host")?;
        let (plugins, drafting) = load_plugins(&host)?;
        require_draft_model(&drafting, settings.draft.as_ref())?;
        settings
            .placement
            .pin_compute()
            .context("pinning the target's compute threads")?;
        let target = Arc::new(Target::load(&settings.model, &settings.target)?);
        let draft_model = load_draft_model(config, &target)?;
        if let (Some(draft_model), DraftContexts::PerInstance) = (&draft_model, draft_contexts) {
            let factory = per_instance_factory(config, Arc::clone(draft_model));
            let costs = measure_draft_model_costs(
                factory.as_ref(),
                draft_model,
                &target,
                settings.placement.threads,
            );
            host.attach_draft_model(factory, costs);
        }
        Ok(Self {
            host,
            plugins,
            target,
            draft_model,
        })
    }
}

/// Fails, before any model is loaded, when a plugin drives the draft model (it imports
/// `draft-model`) but no `--draft-model` was given: it would draft nothing.
fn require_draft_model(
    plugins: &[LoadedPlugin],
    draft: Option<&DraftSettings>,
) -> anyhow::Result<()> {
    match plugins.iter().find(|p| p.uses_draft_model()) {
        Some(plugin) if draft.is_none() => anyhow::bail!(
            "the cascade's `{}` drafts with the draft model, but none is loaded; add --draft-model auto (the default target's draft) or --draft-model PATH.gguf",
            plugin.name()
        ),
        _ => Ok(()),
    }
}

/// Loads the draft model of `config` for `target`, if any: makes a default draft from its base
/// model on first use (with the draft's threads), loads it as the target is loaded, and checks
/// that it shares the target's tokenizer.
fn load_draft_model(
    config: &StackConfig<'_>,
    target: &Target,
) -> anyhow::Result<Option<Arc<DraftModelHost>>> {
    let Some(settings) = &config.settings.draft else {
        return Ok(None);
    };
    if let Some(default_draft) = settings.default_draft {
        default_draft
            .make(config.cache_dir, settings.model.threads)
            .with_context(|| format!("making the default draft model {}", default_draft.name()))?;
    }
    Ok(Some(Arc::new(DraftModelHost::load_for(
        target,
        &settings.model,
        &config.settings.target,
    )?)))
}

/// The factory of a context per plugin instance: with draft CPUs, its contexts compute there.
fn per_instance_factory(
    config: &StackConfig<'_>,
    draft_model: Arc<DraftModelHost>,
) -> Arc<dyn DraftModelFactory> {
    match config.settings.draft.as_ref().and_then(|d| d.cpus.as_ref()) {
        Some(cpus) => Arc::new(PinnedDraftFactory::new(draft_model, cpus.clone())),
        None => draft_model,
    }
}

/// What drafting with `draft_model` costs on a context of `factory` (one of its own, or one on
/// the draft CPUs), opened for the measurement and dropped, and how often it agrees with
/// `target` (computing on `threads` threads); `None`, with a warning, when it cannot be
/// measured (policies then learn it from the asks).
pub fn measure_draft_model_costs(
    factory: &dyn DraftModelFactory,
    draft_model: &DraftModelHost,
    target: &Target,
    threads: usize,
) -> Option<DraftModelCosts> {
    match factory.open() {
        Ok(mut model) => {
            let costs = measure_draft_model(
                model.as_mut(),
                draft_model.vocab_size(),
                draft_model.ctx_size() as usize,
            )?;
            Some(DraftModelCosts {
                agreement: measure_agreement(target, threads, model.as_mut()),
                ..costs
            })
        }
        Err(reason) => {
            tracing::warn!(%reason, "cannot open a draft context to measure the draft model; policies learn its cost from their asks");
            None
        }
    }
}

/// Makes one source per loaded plugin, in cascade order, configured from `plugin_configs` (by
/// plugin name), with `policy` (a loaded policy and its settings) choosing each round's draft
/// length up to `max_draft_len`. Checks first that each plugin and the policy accept their
/// configuration. A plugin that traps is not an error here: it faults during generation and is
/// quarantined, and generation goes on without it.
pub fn build_cascade(
    plugins: &[LoadedPlugin],
    plugin_configs: &BTreeMap<String, String>,
    facts: &ModelFacts,
    settings: CascadeSettings,
    policy: Option<(&LoadedPolicy, &str)>,
    max_draft_len: usize,
) -> anyhow::Result<Cascade> {
    let mut sources: Vec<Box<dyn DraftSource>> = Vec::new();
    for plugin in plugins {
        let plugin_config = plugin_configs
            .get(plugin.name())
            .cloned()
            .unwrap_or_default();
        if let Err(error @ LoadError::Config { .. }) = plugin.check_config(&plugin_config, facts) {
            return Err(error.into());
        }
        sources.push(Box::new(plugin.source(plugin_config)));
    }
    let cascade = Cascade::new(sources, settings);
    let Some((policy, policy_config)) = policy else {
        return Ok(cascade);
    };
    let setup = PolicySetup {
        sources: cascade.source_names(),
        max_draft_len,
        verify_costs: Vec::new(),
        draft_model: None,
        prompt_len: 0,
        max_tokens: 0,
    };
    if let Err(error @ LoadError::Config { .. }) = policy.check_config(policy_config, facts, &setup)
    {
        return Err(error.into());
    }
    Ok(cascade.with_policy(Box::new(policy.policy(policy_config))))
}
