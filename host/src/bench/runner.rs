//! The benchmark loop: one target, one session, every configuration on the same requests.
//!
//! Order, for each workload: `warmup + repeat` passes; in each pass the requests in file order,
//! and each request decoded by every configuration in turn (plain first). Interleaving the
//! configurations request by request, rather than pass by pass or all passes of one then the
//! next, puts the runs being compared seconds apart, so the machine's drift (heat, other load)
//! and its noisy minutes fall on all of them alike.
//!
//! A configuration gets a fresh cascade at the start of each pass and keeps it across that
//! pass's requests, so caches a source keeps across requests warm up as in a server. A fresh
//! one per pass keeps the passes alike: a cascade kept across passes would see every request
//! again and remember its answer.
//!
//! The first plain decoding of each request is the reference; every later output, of every
//! configuration and pass (plain included), must equal it token for token.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::ceiling::VerifyCosts;
use super::degenerate::{self, Degeneracy};
use super::prepare::{Prepared, TokenLimits, prepare, resolve_prompt_style};
use super::stats::Totals;
use super::workload::Workload;
use crate::cascade::{Cascade, CascadeMode, CascadeSettings, ModelFacts, Token};
use crate::config::{BenchConfig, FIXED_POLICY, PromptStyle};
use crate::engine::{GenerationStats, ObservedRatio, Request, Session, VerifyCurve};
use crate::plugins::{LoadedPlugin, LoadedPolicy, PluginHost};
use crate::plugins::{PolicySpec, SourceSpec};
use crate::stack::{DraftContexts, Stack, StackConfig, build_cascade};

/// How often the progress bar redraws its elapsed time while a request runs.
const PROGRESS_TICK: Duration = Duration::from_millis(250);

/// What one benchmark row decodes with: plain decoding, or a cascade with a policy, a mode
/// and a draft length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    /// Draft sources in order; empty for plain decoding.
    pub cascade: Vec<SourceSpec>,
    /// Most draft tokens per round; `None` for plain decoding.
    pub max_draft_len: Option<usize>,
    /// The draft-length policy; `None` for plain decoding.
    pub policy: Option<PolicySpec>,
    /// How the cascade picks a draft.
    pub mode: CascadeMode,
    /// Whether requests with a grammar also draft with the host's grammar source.
    pub grammar_drafts: bool,
}

impl Configuration {
    /// Plain decoding, the baseline.
    pub fn plain() -> Self {
        Self {
            cascade: Vec::new(),
            max_draft_len: None,
            policy: None,
            mode: CascadeMode::First,
            grammar_drafts: false,
        }
    }

    /// Plain decoding first, then every cascade with every mode, policy and grammar-source
    /// setting, in the order given: the `fixed` policy at every draft length (a K sweep), an
    /// adaptive policy once, capped at the largest (it picks K itself).
    pub fn all(config: &BenchConfig) -> Vec<Self> {
        let largest = config.max_draft_lens.iter().max().copied();
        let mut all = vec![Self::plain()];
        for cascade in &config.cascades {
            for &mode in &config.cascade_modes {
                for policy in &config.policies {
                    let max_draft_lens = if policy.name() == FIXED_POLICY {
                        config.max_draft_lens.clone()
                    } else {
                        largest.into_iter().collect()
                    };
                    for max_draft_len in max_draft_lens {
                        for &grammar_drafts in &config.grammar_drafts {
                            all.push(Self {
                                cascade: cascade.clone(),
                                max_draft_len: Some(max_draft_len),
                                policy: Some(policy.clone()),
                                mode,
                                grammar_drafts,
                            });
                        }
                    }
                }
            }
        }
        all
    }

    /// Every cascade in every mode with every draft length under the fixed policy, cascade by
    /// cascade, in the order given (what `simulate` replays).
    pub fn grid(
        cascades: &[Vec<SourceSpec>],
        modes: &[CascadeMode],
        max_draft_lens: &[usize],
    ) -> Vec<Self> {
        let mut grid = Vec::new();
        for cascade in cascades {
            for &mode in modes {
                grid.extend(max_draft_lens.iter().map(|&max_draft_len| Self {
                    cascade: cascade.clone(),
                    max_draft_len: Some(max_draft_len),
                    policy: None,
                    mode,
                    // A trace has no grammar to draft from; the label stays the cascade's.
                    grammar_drafts: true,
                }));
            }
        }
        grid
    }

    /// The policy's name and settings as given (`window,raise=0.9`), or `none`.
    pub fn policy_name(&self) -> String {
        match &self.policy {
            Some(policy) if policy.config.is_empty() => policy.name(),
            Some(policy) => format!("{},{}", policy.name(), policy.config),
            None => "none".into(),
        }
    }

    /// Whether this is the plain baseline.
    pub fn is_plain(&self) -> bool {
        self.cascade.is_empty()
    }

    /// Source names, comma-separated (`lookup,suffix`), or `none`.
    pub fn cascade_name(&self) -> String {
        if self.is_plain() {
            return "none".into();
        }
        self.cascade
            .iter()
            .map(SourceSpec::name)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The row label: `plain`; `lookup,suffix K=8` with the fixed policy; otherwise
    /// `lookup,suffix window K≤24`, with ` scored` or ` tree` in those modes and ` no-grammar-drafts`
    /// without the grammar source.
    pub fn label(&self) -> String {
        let Some(max_draft_len) = self.max_draft_len.filter(|_| !self.is_plain()) else {
            return "plain".into();
        };
        let mode = match self.mode {
            CascadeMode::First => "",
            CascadeMode::Scored => " scored",
            CascadeMode::Tree => " tree",
        };
        let mode = if self.grammar_drafts {
            mode.to_owned()
        } else {
            format!("{mode} no-grammar-drafts")
        };
        let policy = self.policy_name();
        if policy == "fixed" || self.policy.is_none() {
            format!("{} K={max_draft_len}{mode}", self.cascade_name())
        } else {
            format!("{} {policy} K≤{max_draft_len}{mode}", self.cascade_name())
        }
    }
}

/// An output that differs from plain decoding of the same request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// The workload's name.
    pub workload: String,
    /// The configuration's label.
    pub configuration: String,
    /// The request's id.
    pub request: String,
    /// The pass, from 1 (warm-up passes included).
    pub pass: usize,
    /// Index of the first differing token.
    pub first_difference: usize,
    /// Tokens plain decoding generated.
    pub expected_tokens: usize,
    /// Tokens this configuration generated.
    pub generated_tokens: usize,
}

/// What was measured on one workload.
#[derive(Debug, Clone)]
pub struct WorkloadRun {
    /// The workload.
    pub workload: Workload,
    /// The target's verify cost curve after the workload's median-length prompt.
    pub verify_costs: VerifyCosts,
    /// What the workload's real verify decodes took over that curve's prices, by batch size.
    pub observed: Vec<ObservedRatio>,
    /// `passes[c]`: the measured passes of configuration `c`, in order, over the requests
    /// whose plain output is not degenerate (the headline figures).
    pub passes: Vec<Vec<Totals>>,
    /// The requests whose plain output is degenerate, in file order.
    pub degenerate: Vec<DegenerateRequest>,
}

/// A request whose plain-decoding output is no answer (see [`super::degenerate`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DegenerateRequest {
    /// The request's id.
    pub request: String,
    /// Why.
    pub degeneracy: Degeneracy,
}

/// One request decoded in a measured pass: a row of `requests.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRow {
    /// The workload's name.
    pub workload: String,
    /// The configuration's label.
    pub configuration: String,
    /// The measured pass, from 1.
    pub pass: usize,
    /// The request's id.
    pub request: String,
    /// Why plain decoding's output is no answer, if it is not.
    pub degeneracy: Option<Degeneracy>,
    /// Tokens generated, the first included.
    pub generated_tokens: usize,
    /// Time from the first token to the last.
    pub generation_time: Duration,
    /// Verify rounds.
    pub rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
}

/// Everything measured: configurations, per-workload passes, and output mismatches.
#[derive(Debug, Clone)]
pub struct Measurements {
    /// The configurations, plain first.
    pub configurations: Vec<Configuration>,
    /// One entry per workload, in the order given.
    pub workloads: Vec<WorkloadRun>,
    /// Every output that differed from plain decoding.
    pub mismatches: Vec<Mismatch>,
    /// Decodings that verified drawn drafts by rejection sampling, whose outputs follow the
    /// target's distribution but are not plain decoding's draw: not compared with it.
    pub drawn_requests: usize,
    /// Every request of every measured pass, degenerate ones included.
    pub requests: Vec<RequestRow>,
    /// How the model was prompted (`Chat` or `Raw`).
    pub prompt_style: PromptStyle,
    /// Compute threads of the target.
    pub threads: usize,
    /// Context size of the session, in tokens.
    pub ctx_size: u32,
}

impl Measurements {
    /// Adds the passes of `later`, a second measurement of the same workloads and
    /// configurations, after this one's, which decoded `warmup` warm-up passes before its
    /// measured ones: `later`'s passes are numbered on from this one's last.
    pub fn append_passes(&mut self, later: Measurements, warmup: usize) {
        let measured = self.requests.iter().map(|r| r.pass).max().unwrap_or(0);
        let decoded = warmup + measured;
        for (run, later_run) in self.workloads.iter_mut().zip(later.workloads) {
            for (passes, later_passes) in run.passes.iter_mut().zip(later_run.passes) {
                passes.extend(later_passes);
            }
        }
        self.mismatches
            .extend(later.mismatches.into_iter().map(|mismatch| Mismatch {
                pass: mismatch.pass + decoded,
                ..mismatch
            }));
        self.drawn_requests += later.drawn_requests;
        self.requests
            .extend(later.requests.into_iter().map(|row| RequestRow {
                pass: row.pass + measured,
                ..row
            }));
    }
}

/// Reads the workloads, loads the plugins and the target, then runs every pass; see the
/// [module docs](self).
pub fn measure(config: &BenchConfig, cache_dir: &std::path::Path) -> anyhow::Result<Measurements> {
    let workloads = Workload::read_all(&config.workloads)?;
    measure_workloads(config, workloads, cache_dir)
}

/// [`measure`] on workloads already read (`bench --clients` gives the requests of its
/// one-client level only).
pub fn measure_workloads(
    config: &BenchConfig,
    workloads: Vec<Workload>,
    cache_dir: &std::path::Path,
) -> anyhow::Result<Measurements> {
    let configurations = Configuration::all(config);
    // Its ticker thread is started with the plugin host's, on the auxiliary CPUs; the length
    // is known once the requests are tokenized.
    let mut progress = None;
    let stack = Stack::load(
        &StackConfig {
            settings: &config.stack,
            state_dir: None,
            cache_dir,
        },
        DraftContexts::PerInstance,
        |host| {
            let plugins = load_plugins(host, &configurations)?;
            let all: Vec<LoadedPlugin> = plugins.iter().flatten().cloned().collect();
            progress = Some(progress_bar(0));
            Ok((plugins, all))
        },
    )?;
    let progress = progress.expect("the plugins were loaded");
    let (host, plugins, target) = (&stack.host, &stack.plugins, &*stack.target);
    let mut session = target.session(&config.session)?;
    let facts = target.facts(session.ctx_size());
    let mut loaded_policies: Vec<(&SourceSpec, LoadedPolicy)> = Vec::new();
    for spec in configurations
        .iter()
        .filter_map(|c| c.policy.as_ref())
        .map(|p| &p.plugin)
    {
        if !loaded_policies.iter().any(|(known, _)| *known == spec) {
            loaded_policies.push((spec, host.load_policy(spec)?));
        }
    }
    let policies: Vec<Option<LoadedPolicy>> = configurations
        .iter()
        .map(|c| {
            let spec = &c.policy.as_ref()?.plugin;
            loaded_policies
                .iter()
                .find(|(known, _)| *known == spec)
                .map(|(_, policy)| policy.clone())
        })
        .collect();
    // A fresh cascade for each configuration, in order.
    let new_cascades = || -> anyhow::Result<Vec<Cascade>> {
        configurations
            .iter()
            .enumerate()
            .map(|(index, configuration)| {
                new_cascade(
                    &plugins[index],
                    policies[index].as_ref(),
                    configuration,
                    config,
                    &facts,
                )
            })
            .collect()
    };
    // Every plugin must accept its configuration before hours of measuring start.
    new_cascades()?;
    let limits = TokenLimits {
        default_max_tokens: config.default_max_tokens,
        max_tokens_cap: config.max_tokens_cap,
    };
    let prepared = workloads
        .iter()
        .map(|w| {
            prepare(
                target,
                w,
                config.prompt_style,
                &limits,
                &config.sampling,
                session.ctx_size(),
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let largest_draft = config.max_draft_lens.iter().max().copied().unwrap_or(0);
    let largest_batch = config.cost_max_tokens.max(largest_draft + 1);

    let passes = config.warmup + config.repeat;
    let total_requests: usize =
        prepared.iter().map(Vec::len).sum::<usize>() * passes * configurations.len();
    progress.set_length(total_requests as u64);
    let mut mismatches = Vec::new();
    let mut drawn_requests = 0;
    let mut all_requests = Vec::new();
    let mut runs = Vec::new();
    for (workload, requests) in workloads.into_iter().zip(prepared) {
        progress.set_message(format!("{} · measuring verify costs", workload.name));
        let verify_costs =
            measure_verify_costs(&mut session, &requests, largest_batch, config.cost_repeat)
                .with_context(|| {
                    format!("measuring verify costs on workload `{}`", workload.name)
                })?;
        // Policies get this workload's curve.
        session.set_verify_curve(VerifyCurve::new(vec![(
            verify_costs.context_tokens,
            verify_costs.per_batch.clone(),
        )]));
        let mut run = WorkloadRun {
            passes: vec![Vec::new(); configurations.len()],
            degenerate: Vec::new(),
            verify_costs,
            observed: Vec::new(),
            workload,
        };
        let mut reference: Vec<Option<Vec<Token>>> = vec![None; requests.len()];
        let mut degeneracies: Vec<Option<Degeneracy>> = vec![None; requests.len()];
        for pass in 0..passes {
            let warming_up = pass < config.warmup;
            let mut cascades = new_cascades()?;
            let mut totals = vec![Totals::default(); configurations.len()];
            for ((request, expected), degeneracy) in
                requests.iter().zip(&mut reference).zip(&mut degeneracies)
            {
                progress.set_message(format!(
                    "{} · {} · pass {}/{passes}{}",
                    run.workload.name,
                    request.id,
                    pass + 1,
                    if warming_up { " (warm-up)" } else { "" }
                ));
                for ((configuration, cascade), totals) in
                    configurations.iter().zip(&mut cascades).zip(&mut totals)
                {
                    let mut context = PassContext {
                        session: &mut session,
                        cascade,
                        configuration,
                        workload: &run.workload.name,
                        pass: pass + 1,
                        warmup: config.warmup,
                    };
                    let outcome = context.decode(request)?;
                    if expected.is_none() {
                        *degeneracy =
                            degenerate::check(&request.opening, &outcome.text, &outcome.tokens);
                    }
                    if degeneracy.is_none() {
                        totals.add_request(&outcome.stats);
                    }
                    if !warming_up {
                        all_requests.push(context.row(request, *degeneracy, &outcome.stats));
                    }
                    match expected {
                        None => *expected = Some(outcome.tokens),
                        // Drawn drafts follow the target's distribution, not plain decoding's
                        // draw for the seed: there is nothing to compare token for token.
                        Some(_) if outcome.stats.drawn_rounds > 0 => drawn_requests += 1,
                        Some(expected) => {
                            if let Some(mismatch) =
                                context.compare(request, expected, &outcome.tokens)
                            {
                                progress.suspend(|| report_mismatch(&mismatch));
                                mismatches.push(mismatch);
                            }
                        }
                    }
                    progress.inc(1);
                }
            }
            if !warming_up {
                for (passes, totals) in run.passes.iter_mut().zip(totals) {
                    passes.push(totals);
                }
            }
        }
        run.degenerate = requests
            .iter()
            .zip(degeneracies)
            .filter_map(|(request, degeneracy)| {
                Some(DegenerateRequest {
                    request: request.id.clone(),
                    degeneracy: degeneracy?,
                })
            })
            .collect();
        run.observed = session.observed_costs();
        runs.push(run);
    }
    progress.finish_and_clear();
    Ok(Measurements {
        configurations,
        workloads: runs,
        mismatches,
        drawn_requests,
        requests: all_requests,
        prompt_style: resolve_prompt_style(config.prompt_style, target),
        threads: config.session.threads,
        ctx_size: session.ctx_size(),
    })
}

/// The verify cost curve for batches of 1..=`largest_batch` tokens after the prompt of median
/// length among `requests` (cut to what the batch and the context hold), each the median of
/// `repetitions` runs.
pub(super) fn measure_verify_costs(
    session: &mut Session<'_>,
    requests: &[Prepared],
    largest_batch: usize,
    repetitions: usize,
) -> anyhow::Result<VerifyCosts> {
    let mut by_length: Vec<&Prepared> = requests.iter().collect();
    by_length.sort_by_key(|r| r.request.prompt.len());
    let context = &by_length
        .get(by_length.len() / 2)
        .context("a workload has at least one request")?
        .request
        .prompt;
    let room = session.ctx_size() as usize - context.len();
    let largest_batch = largest_batch.min(session.batch_size()).min(room).max(1);
    let per_batch = session.measure_verify_costs(context, largest_batch, repetitions)?;
    Ok(VerifyCosts {
        context_tokens: context.len(),
        per_batch,
    })
}

/// The plugins of each configuration's cascade, in order; each plugin is loaded (and compiled)
/// once, however many configurations use it.
pub(super) fn load_plugins(
    host: &PluginHost,
    configurations: &[Configuration],
) -> anyhow::Result<Vec<Vec<LoadedPlugin>>> {
    let mut loaded: Vec<(&SourceSpec, LoadedPlugin)> = Vec::new();
    for spec in configurations.iter().flat_map(|c| &c.cascade) {
        if !loaded.iter().any(|(known, _)| *known == spec) {
            loaded.push((spec, host.load(spec)?));
        }
    }
    Ok(configurations
        .iter()
        .map(|c| {
            c.cascade
                .iter()
                .map(|spec| {
                    let (_, plugin) = loaded
                        .iter()
                        .find(|(known, _)| *known == spec)
                        .expect("every spec of a configuration was loaded above");
                    plugin.clone()
                })
                .collect()
        })
        .collect())
}

/// A fresh cascade of `plugins` with `policy`, as `configuration` says (empty for plain
/// decoding).
fn new_cascade(
    plugins: &[LoadedPlugin],
    policy: Option<&LoadedPolicy>,
    configuration: &Configuration,
    config: &BenchConfig,
    facts: &ModelFacts,
) -> anyhow::Result<Cascade> {
    if plugins.is_empty() {
        return Ok(Cascade::empty());
    }
    let settings = CascadeSettings {
        mode: configuration.mode,
        grammar_drafts: configuration.grammar_drafts,
        ..CascadeSettings::default()
    };
    let policy_config = configuration
        .policy
        .as_ref()
        .map_or("", |policy| policy.config.as_str());
    build_cascade(
        plugins,
        &config.plugin_configs,
        facts,
        settings,
        policy.map(|policy| (policy, policy_config)),
        configuration.max_draft_len.unwrap_or(0),
    )
}

/// One configuration's decoding of a request in a pass over a workload.
struct PassContext<'s, 't> {
    session: &'s mut Session<'t>,
    cascade: &'s mut Cascade,
    configuration: &'s Configuration,
    workload: &'s str,
    /// The pass, from 1, warm-up passes included.
    pass: usize,
    /// Warm-up passes before the measured ones.
    warmup: usize,
}

impl PassContext<'_, '_> {
    fn decode(&mut self, prepared: &Prepared) -> anyhow::Result<crate::engine::Outcome> {
        let request = Request {
            max_draft_len: self.configuration.max_draft_len.unwrap_or(0),
            ..prepared.request.clone()
        };
        self.session
            .generate(&request, self.cascade, &mut |_| {})
            .with_context(|| {
                format!(
                    "decoding request `{}` of workload `{}` with {}",
                    prepared.id,
                    self.workload,
                    self.configuration.label()
                )
            })
    }

    /// The `requests.csv` row of `prepared`, decoded with `stats` in this pass.
    fn row(
        &self,
        prepared: &Prepared,
        degeneracy: Option<Degeneracy>,
        stats: &GenerationStats,
    ) -> RequestRow {
        RequestRow {
            workload: self.workload.to_owned(),
            configuration: self.configuration.label(),
            pass: self.pass - self.warmup,
            request: prepared.id.clone(),
            degeneracy,
            generated_tokens: stats.generated_tokens,
            generation_time: stats.generation_time,
            rounds: stats.rounds,
            drafted: stats.drafted,
            accepted: stats.accepted,
        }
    }

    fn compare(&self, prepared: &Prepared, expected: &[Token], got: &[Token]) -> Option<Mismatch> {
        let first_difference = first_difference(expected, got)?;
        Some(Mismatch {
            workload: self.workload.to_owned(),
            configuration: self.configuration.label(),
            request: prepared.id.clone(),
            pass: self.pass,
            first_difference,
            expected_tokens: expected.len(),
            generated_tokens: got.len(),
        })
    }
}

/// Index of the first differing token, or `None` when the outputs are equal.
pub(super) fn first_difference(a: &[Token], b: &[Token]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

fn report_mismatch(mismatch: &Mismatch) {
    eprintln!(
        "MISMATCH: {} · {} · request `{}` (pass {}): output differs from plain decoding at token {} ({} tokens, plain gave {})",
        mismatch.workload,
        mismatch.configuration,
        mismatch.request,
        mismatch.pass,
        mismatch.first_difference,
        mismatch.generated_tokens,
        mismatch.expected_tokens
    );
}

/// A progress bar on stderr, or a hidden one when stderr is not a terminal (logs, CI).
pub(super) fn progress_bar(total_requests: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {pos}/{len} requests, eta {eta}  {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let progress = ProgressBar::new(total_requests).with_style(style);
    progress.enable_steady_tick(PROGRESS_TICK);
    progress
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels of every configuration `args` measures, in order.
    fn labels(args: crate::config::BenchArgs) -> Vec<String> {
        let config = crate::config::BenchArgs {
            workloads: vec!["edit.jsonl".into()],
            repeat: 1,
            cost_repeat: 1,
            ..args
        }
        .into_config(std::path::Path::new("/tmp"))
        .expect("valid flags");
        Configuration::all(&config)
            .iter()
            .map(Configuration::label)
            .collect()
    }

    #[test]
    fn the_default_policy_runs_once_and_fixed_sweeps_every_draft_length() {
        let default = labels(crate::config::BenchArgs {
            cascades: vec!["lookup".into()],
            max_draft_lens: vec![4, 8],
            ..crate::config::BenchArgs::default()
        });
        assert_eq!(default, ["plain", "lookup cost K≤8"]);
        let labels = labels(crate::config::BenchArgs {
            cascades: vec!["lookup".into(), "lookup,suffix".into()],
            max_draft_lens: vec![4, 8],
            policies: vec!["fixed".into()],
            ..crate::config::BenchArgs::default()
        });
        assert_eq!(
            labels,
            [
                "plain",
                "lookup K=4",
                "lookup K=8",
                "lookup,suffix K=4",
                "lookup,suffix K=8"
            ]
        );
        assert_eq!(Configuration::plain().cascade_name(), "none");
    }

    #[test]
    fn adaptive_policies_run_once_at_the_largest_draft_length() {
        let labels = labels(crate::config::BenchArgs {
            cascades: vec!["lookup".into()],
            max_draft_lens: vec![4, 16, 8],
            policies: vec!["fixed".into(), "cost".into(), "window,raise=0.9".into()],
            ..crate::config::BenchArgs::default()
        });
        assert_eq!(
            labels,
            [
                "plain",
                "lookup K=4",
                "lookup K=16",
                "lookup K=8",
                "lookup cost K≤16",
                "lookup window,raise=0.9 K≤16"
            ]
        );
    }

    #[test]
    fn appended_passes_are_numbered_after_the_first_measurement() {
        let row = |pass| RequestRow {
            workload: "w".into(),
            configuration: "plain".into(),
            pass,
            request: "r".into(),
            degeneracy: None,
            generated_tokens: 3,
            generation_time: Duration::from_millis(10),
            rounds: 2,
            drafted: 0,
            accepted: 0,
        };
        let mismatch = |pass| Mismatch {
            workload: "w".into(),
            configuration: "lookup".into(),
            request: "r".into(),
            pass,
            first_difference: 1,
            expected_tokens: 3,
            generated_tokens: 3,
        };
        let measurements = |requests, mismatches, drawn_requests| Measurements {
            configurations: vec![Configuration::plain()],
            workloads: Vec::new(),
            mismatches,
            drawn_requests,
            requests,
            prompt_style: PromptStyle::Chat,
            threads: 1,
            ctx_size: 512,
        };
        let mut first = measurements(vec![row(1), row(2)], vec![mismatch(2)], 1);
        // Its second pass is the first measured one after a warm-up pass.
        let later = measurements(vec![row(1)], vec![mismatch(2)], 2);
        first.append_passes(later, 1);
        let passes: Vec<usize> = first.requests.iter().map(|r| r.pass).collect();
        assert_eq!(passes, [1, 2, 3]);
        let decoded: Vec<usize> = first.mismatches.iter().map(|m| m.pass).collect();
        assert_eq!(decoded, [2, 5], "1 warm-up and 2 measured passes before");
        assert_eq!(first.drawn_requests, 3);
    }

    #[test]
    fn first_difference_finds_changed_and_truncated_outputs() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2]), Some(2));
    }
}
