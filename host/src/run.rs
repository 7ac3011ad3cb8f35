//! `spechost run`: one prompt through the target and the cascade; text to stdout, stats to
//! stderr.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;

use crate::cascade::{Cascade, CascadeSettings, DraftSource, ModelFacts};
use crate::config::{DraftSettings, RunConfig};
use crate::engine::{DraftModelHost, Request, Target, TargetParams};
use crate::plugins::{LoadError, LoadedPlugin, PluginHost, PluginHostConfig};

/// Loads the target and the cascade, generates, streams the text and prints the stats.
pub fn run(config: &RunConfig, cache_dir: &Path) -> anyhow::Result<()> {
    // Plugins first: a misspelt cascade entry fails before the model is loaded.
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir.to_owned()),
        plugin_dirs: config.plugin_dirs.clone(),
        ..PluginHostConfig::default()
    })
    .context("starting the plugin host")?;
    let plugins = config
        .cascade
        .iter()
        .map(|spec| host.load(spec))
        .collect::<Result<Vec<_>, _>>()?;
    let target = Target::load(&config.model, &config.target)?;
    // Offered to drafter plugins through the WIT `draft-model` import (wired in `plugins`).
    let _draft_model = load_draft_model(config.draft.as_ref(), &target, &config.target, cache_dir)?;
    let prompt = if config.raw {
        target.tokenize_raw(&config.prompt)
    } else {
        target.tokenize_chat(&config.prompt)?
    };
    let mut session = target.session(&config.session)?;
    let facts = target.facts(session.ctx_size());
    let mut cascade = build_cascade(&plugins, &config.plugin_configs, &facts)?;
    let request = Request {
        prompt,
        max_tokens: config.max_tokens,
        sampling: config.sampling.clone(),
        stop: config.stop.clone(),
        draft_max: config.draft_max,
    };
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
    if config.json {
        let report = serde_json::json!({
            "model": config.model,
            "cascade": cascade.source_names(),
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

/// Loads the draft model of `settings` for `target`, if any: makes a default draft from its base
/// model on first use (with the draft's threads), loads it as `loading` says, and checks that it
/// shares the target's tokenizer.
pub fn load_draft_model(
    settings: Option<&DraftSettings>,
    target: &Target,
    loading: &TargetParams,
    cache_dir: &Path,
) -> anyhow::Result<Option<Arc<DraftModelHost>>> {
    let Some(settings) = settings else {
        return Ok(None);
    };
    if let Some(default_draft) = settings.default_draft {
        default_draft
            .make(cache_dir, settings.model.threads)
            .with_context(|| format!("making the default draft model {}", default_draft.name()))?;
    }
    let draft = DraftModelHost::load_for(target, &settings.model, loading)?;
    Ok(Some(Arc::new(draft)))
}

/// Makes one source per loaded plugin, in cascade order, configured from `plugin_configs` (by
/// plugin name), after checking that each accepts its
/// configuration. A plugin that traps is not an error here: it faults during generation and is
/// quarantined, and generation goes on without it.
pub fn build_cascade(
    plugins: &[LoadedPlugin],
    plugin_configs: &BTreeMap<String, String>,
    facts: &ModelFacts,
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
    Ok(Cascade::new(sources, CascadeSettings::default()))
}
