//! `spechost run`: one prompt through the target and the cascade; text to stdout, stats to
//! stderr.

use std::io::{IsTerminal, Write};
use std::path::Path;

use crate::cascade::CascadeSettings;
use crate::config::RunConfig;
use crate::engine::Request;
use crate::placement;
use crate::plugins::save_plugin_states;
use crate::stack::{DraftContexts, Stack, StackConfig, build_cascade};

/// Loads the target and the cascade, generates, streams the text and prints the stats.
pub fn run(config: &RunConfig, cache_dir: &Path) -> anyhow::Result<()> {
    let stack = Stack::load(
        &StackConfig {
            settings: &config.stack,
            state_dir: config.state_dir.as_deref(),
            cache_dir,
        },
        DraftContexts::PerInstance,
        |host| {
            let plugins = config
                .cascade
                .iter()
                .map(|spec| host.load(spec))
                .collect::<Result<Vec<_>, _>>()?;
            let policy = if plugins.is_empty() {
                None
            } else {
                Some(host.load_policy(&config.policy.plugin)?)
            };
            Ok(((plugins.clone(), policy), plugins))
        },
    )?;
    let (plugins, policy) = &stack.plugins;
    let target = &stack.target;
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
    let mut cascade = build_cascade(
        plugins,
        &config.plugin_configs,
        &facts,
        settings,
        policy
            .as_ref()
            .map(|policy| (policy, config.policy.config.as_str())),
        config.max_draft_len,
    )?;
    let request = Request {
        prompt,
        max_tokens: config.max_tokens,
        sampling: config.sampling.clone(),
        stop: config.stop.clone(),
        max_draft_len: config.max_draft_len,
    };
    // Refused before the verify curve is measured for it.
    session.check_request(&request)?;
    if !cascade.is_empty() {
        session.measure_verify_curve_after(&request.prompt, config.max_draft_len)?;
    }
    let mut stdout = std::io::stdout().lock();
    let outcome = session.generate(&request, &mut cascade, &mut |piece| {
        // A closed pipe (`| head`) must not abort generation; the stats still print.
        let _ = stdout.write_all(piece.text.as_bytes());
        let _ = stdout.flush();
    })?;
    if stdout.is_terminal() {
        let _ = writeln!(stdout);
    }
    drop(stdout);
    // The plugins' cross-request state, for the next run (with a state directory).
    cascade.checkpoint();
    save_plugin_states(plugins);
    if config.json {
        let report = serde_json::json!({
            "model": config.stack.model,
            "cascade": cascade.source_names(),
            "cascade_mode": config.cascade_mode,
            "policy": cascade.policy_name(),
            "draft_max": config.max_draft_len,
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
                "plan": config.stack.placement,
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
