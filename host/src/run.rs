//! `spechost run`: one prompt through the target and the cascade; text to stdout, stats to
//! stderr.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use crate::cascade::{
    Cascade, CascadeSettings, DraftModelFactory, DraftSource, ModelFacts, PolicySetup,
};
use crate::config::{DraftSettings, RunConfig};
use crate::engine::{
    DEFAULT_COST_REPETITIONS, DraftModelHost, Request, Session, Target, TargetParams,
};
use crate::placement::{self, PinnedDraftFactory};
use crate::plugins::{LoadError, LoadedPlugin, LoadedPolicy, PluginHost, PluginHostConfig};

/// Loads the target and the cascade, generates, streams the text and prints the stats.
pub fn run(config: &RunConfig, cache_dir: &Path) -> anyhow::Result<()> {
    for warning in &config.placement.warnings {
        tracing::warn!("{warning}");
    }
    // Threads started from here on (the plugin host's) inherit the auxiliary CPUs.
    config
        .placement
        .pin_auxiliary()
        .context("pinning the plugin host's threads")?;
    // Plugins first: a misspelt cascade entry fails before the model is loaded.
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir.to_owned()),
        plugin_dirs: config.plugin_dirs.clone(),
        state_dir: config.state_dir.clone(),
        ..PluginHostConfig::default()
    })
    .context("starting the plugin host")?;
    let plugins = config
        .cascade
        .iter()
        .map(|spec| host.load(spec))
        .collect::<Result<Vec<_>, _>>()?;
    require_draft_model(&plugins, config.draft.as_ref())?;
    let policy = if plugins.is_empty() {
        None
    } else {
        Some(host.load_policy(&config.policy.plugin)?)
    };
    // llama.cpp's OpenMP workers, started at the first decode, inherit the compute CPUs.
    config
        .placement
        .pin_compute()
        .context("pinning the target's compute threads")?;
    let target = Target::load(&config.model, &config.target)?;
    // Offered to drafter plugins through the WIT `draft-model` import.
    if let Some(draft_model) =
        load_draft_model(config.draft.as_ref(), &target, &config.target, cache_dir)?
    {
        host.attach_draft_model(draft_model);
    }
    let prompt = if config.raw {
        target.tokenize_raw(&config.prompt)
    } else {
        target.tokenize_chat(&config.prompt)?
    };
    let mut session = target.session(&config.session)?;
    let facts = target.facts(session.ctx_size());
    let settings = CascadeSettings {
        mode: config.cascade_mode,
        ..CascadeSettings::default()
    };
    let policy = policy
        .as_ref()
        .map(|policy| (policy, config.policy.config.as_str()));
    let mut cascade = build_cascade(
        &plugins,
        &config.plugin_configs,
        &facts,
        settings,
        policy,
        config.draft_max,
    )?;
    let mut request = Request {
        prompt,
        max_tokens: config.max_tokens,
        sampling: config.sampling.clone(),
        stop: config.stop.clone(),
        draft_max: config.draft_max,
        verify_costs: Vec::new(),
    };
    // Refused before the verify curve is measured for it.
    session.check_request(&request)?;
    if !cascade.is_empty() {
        request.verify_costs =
            measure_verify_costs(&mut session, &request.prompt, config.draft_max)?;
    }
    let mut stdout = std::io::stdout().lock();
    let outcome = session.generate(&request, &mut cascade, &mut |text| {
        // A closed pipe (`| head`) must not abort generation; the stats still print.
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    })?;
    if stdout.is_terminal() {
        let _ = writeln!(stdout);
    }
    drop(stdout);
    persist_plugin_state(&mut cascade, &plugins);
    if config.json {
        let report = serde_json::json!({
            "model": config.model,
            "cascade": cascade.source_names(),
            "cascade_mode": config.cascade_mode,
            "policy": cascade.policy_name(),
            "draft_max": config.draft_max,
            "sampling": config.sampling,
            "stop_reason": outcome.stop_reason,
            "tokens_per_second": {
                "prompt": outcome.stats.prompt_tokens_per_second(),
                "generation": outcome.stats.generation_tokens_per_second(),
            },
            "acceptance": outcome.stats.acceptance(),
            "overhead": outcome.stats.overhead(),
            "mean_accepted_per_draft_round": outcome.stats.mean_accepted_per_draft_round(),
            "stats": outcome.stats,
            "placement": {
                "plan": config.placement,
                "threads": placement::thread_cpus()?,
            },
        });
        eprintln!("{report}");
    } else {
        eprint!("{}", outcome.stats.render());
        if !config.sampling.is_greedy() {
            eprintln!("seed        {}", config.sampling.seed);
        }
    }
    Ok(())
}

/// Fails, before any model is loaded, when a plugin drives the draft model (it imports
/// `draft-model`) but no `--draft-model` was given: it would draft nothing.
pub fn require_draft_model(
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

/// Loads the draft model of `settings` for `target`, if any: makes a default draft from its base
/// model on first use (with the draft's threads), loads it as `loading` says, and checks that it
/// shares the target's tokenizer. With draft CPUs, its contexts compute there.
pub fn load_draft_model(
    settings: Option<&DraftSettings>,
    target: &Target,
    loading: &TargetParams,
    cache_dir: &Path,
) -> anyhow::Result<Option<Arc<dyn DraftModelFactory>>> {
    let Some(settings) = settings else {
        return Ok(None);
    };
    if let Some(default_draft) = settings.default_draft {
        default_draft
            .make(cache_dir, settings.model.threads)
            .with_context(|| format!("making the default draft model {}", default_draft.name()))?;
    }
    let draft: Arc<dyn DraftModelFactory> =
        Arc::new(DraftModelHost::load_for(target, &settings.model, loading)?);
    Ok(Some(match &settings.cpus {
        Some(cpus) => Arc::new(PinnedDraftFactory::new(draft, cpus.clone())),
        None => draft,
    }))
}

/// Measures the target's verify cost for 1..=`draft_max + 1` tokens after `context` (for the
/// policy), logging the curve.
pub fn measure_verify_costs(
    session: &mut Session<'_>,
    context: &[crate::cascade::Token],
    draft_max: usize,
) -> anyhow::Result<Vec<std::time::Duration>> {
    let started = std::time::Instant::now();
    let room = (session.ctx_size() as usize).saturating_sub(context.len());
    let largest = (draft_max + 1).min(session.batch_size()).min(room).max(1);
    let costs = session
        .measure_verify_costs(context, largest, DEFAULT_COST_REPETITIONS)
        .context("measuring the target's verify cost")?;
    let first = costs.first().copied().unwrap_or_default();
    let last = costs.last().copied().unwrap_or_default();
    tracing::info!(
        one_token_ms = first.as_secs_f64() * 1e3,
        tokens = costs.len(),
        all_tokens_ms = last.as_secs_f64() * 1e3,
        relative = last.as_secs_f64() / first.as_secs_f64().max(1e-9),
        took_ms = started.elapsed().as_secs_f64() * 1e3,
        "measured the verify cost curve"
    );
    Ok(costs)
}

/// Asks the cascade's sources to save their cross-request state, then writes each plugin's
/// state file (when a state directory is set). A failure is a warning: the output is done.
pub fn persist_plugin_state(cascade: &mut Cascade, plugins: &[LoadedPlugin]) {
    cascade.checkpoint();
    save_plugin_states(plugins);
}

/// Writes the state file of each of `plugins` whose state changed since it was last written
/// (when a state directory is set). A failure is a warning that leaves the old file in place.
pub fn save_plugin_states<'a>(plugins: impl IntoIterator<Item = &'a LoadedPlugin>) {
    for plugin in plugins {
        let state = plugin.state();
        match state.persist() {
            Ok(true) => {
                tracing::info!(plugin = plugin.name(), path = ?state.file(), "saved plugin state");
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(plugin = plugin.name(), path = ?state.file(), "cannot save plugin state: {error}; the previous state file, if any, is left as it was");
            }
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
    };
    if let Err(error @ LoadError::Config { .. }) = policy.check_config(policy_config, facts, &setup)
    {
        return Err(error.into());
    }
    Ok(cascade.with_policy(Box::new(policy.policy(policy_config))))
}
