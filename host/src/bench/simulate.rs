//! `spechost simulate`: replays a [`Trace`] through cascades without the model, so a drafter's
//! acceptance on a workload takes seconds to measure instead of minutes.
//!
//! Each request goes through the engine's round protocol ([`generate`], the one decoding uses)
//! with a verifier that reads the target's tokens from the trace instead of sampling them: the
//! accepted prefix is the longest prefix of the draft that equals the trace's next tokens (of a
//! tree draft, the longest path from its root that does), and the round commits it plus the
//! trace's next token (fewer when the trace ends inside the draft, as generation stopped
//! there). Exact by construction: no second copy of the protocol.
//!
//! Greedy decoding commits exactly the trace's tokens under any cascade, so a deterministic
//! drafter sees the same calls in the same order as in `bench`: the counters (rounds, drafted,
//! accepted, per source) are equal, not just close. Requests of a workload are replayed in trace
//! order through one cascade per configuration, as `bench` does within a pass, so caches a
//! source keeps across requests warm up alike.
//!
//! Not here: timing of the target (the trace's verify cost curve gives the ideal speedup, see
//! [`ceiling`](super::ceiling)).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::report::SourceReport;
use super::runner::{Configuration, load_plugins};
use super::stats::Totals;
use super::trace::{Trace, TraceRequest, TraceTarget};
use crate::cascade::{Cascade, CascadeSettings, ModelFacts, Token, TreeShape};
use crate::config::SimulateConfig;
use crate::engine::{
    DEFAULT_TREE_LEAVES, EngineError, GenerationStats, Prefill, Request, RoundDecision, RoundDraft,
    SamplingParams, StopStrings, Verified, Verifier, VerifyBatch, generate,
};
use crate::plugins::{PluginHost, PluginHostConfig};
use crate::stack::build_cascade;

/// File names written into `--out`.
pub const SIMULATION_MARKDOWN: &str = "simulation.md";
/// See [`SIMULATION_MARKDOWN`].
pub const SIMULATION_JSON: &str = "simulation.json";

/// Replays one traced request of `target` through `cascade` with drafts of at most
/// `max_draft_len` tokens, through the same protocol as decoding ([`generate`]) with the
/// target's tokens read from the trace; returns the request's counters (`generation_time` is
/// the replay's wall time).
pub fn replay(
    request: &TraceRequest,
    target: &TraceTarget,
    max_draft_len: usize,
    cascade: &mut Cascade,
) -> GenerationStats {
    let replayed = Request {
        prompt: request.prompt.clone(),
        max_tokens: request.replay_max_tokens(),
        sampling: SamplingParams::greedy(),
        stop: StopStrings::default(),
        max_draft_len,
    };
    let mut verifier = TraceVerifier {
        target,
        output: &request.output,
        given: 0,
    };
    match generate(&mut verifier, &replayed, cascade, &mut |_| {}, &mut || {
        RoundDecision::Continue
    }) {
        Ok(outcome) => outcome.stats,
        // A trace that ends without a reason to stop (hand-made or truncated) ends the replay.
        Err(error) => {
            tracing::warn!(id = %request.id, %error, "replay ended early");
            GenerationStats {
                prompt_tokens: request.prompt.len(),
                ..GenerationStats::default()
            }
        }
    }
}

/// A traced request as the verifier of the round protocol: the target's tokens are the trace's.
struct TraceVerifier<'t> {
    target: &'t TraceTarget,
    output: &'t [Token],
    /// Output tokens given to the protocol so far.
    given: usize,
}

impl Verifier for TraceVerifier<'_> {
    fn facts(&self) -> ModelFacts {
        self.target.facts()
    }

    fn batch_size(&self) -> usize {
        self.target.batch_size
    }

    fn is_eog(&self, token: Token) -> bool {
        self.target.eog.contains(&token)
    }

    fn token_bytes(&self, _token: Token, out: &mut Vec<u8>) {
        // A trace records tokens, not text: nothing to stream, no stop strings to find.
        out.clear();
    }

    fn verify_costs(&self, _context_len: usize) -> Vec<Duration> {
        self.target.verify_costs().per_batch
    }

    fn prefill(
        &mut self,
        _request: &Request,
        _stop: &mut dyn FnMut() -> bool,
    ) -> Result<Prefill, EngineError> {
        let &first = self.output.first().ok_or(EngineError::TraceEnded)?;
        self.given = 1;
        Ok(Prefill::Done {
            first,
            cached: 0,
            logprobs: Vec::new(),
        })
    }

    fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
        let upcoming = &self.output[self.given..];
        if upcoming.is_empty() {
            return Err(EngineError::TraceEnded);
        }
        let n_accepted = TreeShape::new(&round.tokens, &round.parents)
            .follow(upcoming)
            .len();
        // The accepted prefix plus the target's next token, cut where the trace ends (generation
        // stopped there).
        let target = &upcoming[..(n_accepted + 1).min(upcoming.len())];
        self.given += target.len();
        // What the recorded target took for a batch of this size: the policy learns from it as
        // it would from the real target.
        let time = self
            .target
            .verify_costs()
            .per_batch
            .get(round.tokens.len())
            .copied()
            .unwrap_or_default();
        Ok(Verified {
            drafted: round.tokens.len(),
            tokens: target.to_vec(),
            logprobs: Vec::new(),
            batch: VerifyBatch::alone(round, target.len(), time),
            replayed: 0,
        })
    }

    fn max_tree_leaves(&self) -> usize {
        // As the session a trace is recorded with: a tree is followed along the trace exactly.
        DEFAULT_TREE_LEAVES
    }
}

/// The replay of one configuration over one workload.
#[derive(Debug, Clone, Serialize)]
pub struct SimulatedConfiguration {
    /// `SOURCES K=N`.
    pub label: String,
    /// Source names in order.
    pub cascade: Vec<String>,
    /// Most draft tokens per round.
    #[serde(rename = "draft_max")]
    pub max_draft_len: Option<usize>,
    /// Verify rounds.
    pub rounds: u64,
    /// Rounds that verified a draft.
    pub draft_rounds: u64,
    /// Rounds whose draft was a tree.
    pub tree_rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Tokens committed by the rounds (every output token after each request's first).
    pub committed: u64,
    /// Accepted over drafted tokens, in [0, 1].
    pub acceptance: f64,
    /// Mean accepted draft tokens per round that verified a draft.
    pub mean_accepted_per_draft_round: f64,
    /// Mean tokens committed per round.
    pub mean_committed_per_round: f64,
    /// The speedup these rounds would give with free drafting, by the trace's verify cost
    /// curve; `null` when a batch size is off the curve.
    pub ideal_speedup: Option<f64>,
    /// `verify_batches[n - 1]`: rounds that verified `n` tokens.
    pub verify_batches: Vec<u64>,
    /// Per-source results, in cascade order.
    pub sources: Vec<SourceReport>,
    /// Wall time of the replay, in ms.
    pub wall_time_ms: f64,
    /// Time inside the cascade's sources, in ms.
    pub draft_time_ms: f64,
}

/// The replays of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct SimulatedWorkload {
    /// The workload's name.
    pub name: String,
    /// Requests replayed.
    pub requests: usize,
    /// One entry per configuration.
    pub configurations: Vec<SimulatedConfiguration>,
}

/// Everything a simulation found; `simulation.json` is this value.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationReport {
    /// The trace replayed.
    pub trace: PathBuf,
    /// The target it was recorded with.
    pub model: PathBuf,
    /// One entry per workload of the trace, in trace order.
    pub workloads: Vec<SimulatedWorkload>,
}

/// Replays the trace through every configured cascade and draft length.
pub fn simulate(config: &SimulateConfig, cache_dir: &Path) -> anyhow::Result<SimulationReport> {
    let trace = Trace::read(&config.trace)?;
    let configurations = Configuration::grid(
        &config.cascades,
        &config.cascade_modes,
        &config.max_draft_lens,
    );
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(cache_dir.to_owned()),
        plugin_dirs: config.plugin_dirs.clone(),
        ..PluginHostConfig::default()
    })
    .context("starting the plugin host")?;
    let plugins = load_plugins(&host, &configurations)?;
    let facts = trace.target.facts();
    let costs = trace.target.verify_costs();
    let mut workloads = Vec::new();
    for (name, requests) in trace.workloads() {
        let mut replays = Vec::with_capacity(configurations.len());
        for (configuration, plugins) in configurations.iter().zip(&plugins) {
            let mut cascade = build_cascade(
                plugins,
                &config.plugin_configs,
                &facts,
                CascadeSettings {
                    mode: configuration.mode,
                    ..CascadeSettings::default()
                },
                None,
                configuration.max_draft_len.unwrap_or(0),
            )?;
            let max_draft_len = configuration
                .max_draft_len
                .context("simulated configurations have a draft length")?;
            let started = Instant::now();
            let mut totals = Totals::default();
            for request in requests {
                totals.add_request(&replay(request, &trace.target, max_draft_len, &mut cascade));
            }
            let wall_time = started.elapsed();
            replays.push(SimulatedConfiguration {
                label: configuration.label(),
                cascade: configuration.cascade.iter().map(|s| s.name()).collect(),
                max_draft_len: configuration.max_draft_len,
                rounds: totals.rounds,
                draft_rounds: totals.draft_rounds,
                tree_rounds: totals.tree_rounds,
                drafted: totals.drafted,
                accepted: totals.accepted,
                committed: totals.timed_tokens,
                acceptance: totals.acceptance(),
                mean_accepted_per_draft_round: totals.mean_accepted_per_draft_round(),
                mean_committed_per_round: totals.mean_committed_per_round(),
                ideal_speedup: costs.ideal_speedup(totals.timed_tokens, &totals.verify_batches),
                sources: totals
                    .sources
                    .iter()
                    .map(|stats| SourceReport::new(stats, totals.rounds, max_draft_len))
                    .collect(),
                verify_batches: totals.verify_batches,
                wall_time_ms: millis(wall_time),
                draft_time_ms: millis(totals.draft_time),
            });
        }
        workloads.push(SimulatedWorkload {
            name: name.to_owned(),
            requests: requests.len(),
            configurations: replays,
        });
    }
    Ok(SimulationReport {
        trace: config.trace.clone(),
        model: trace.target.path.clone(),
        workloads,
    })
}

fn millis(time: Duration) -> f64 {
    time.as_secs_f64() * 1e3
}

impl SimulationReport {
    /// The results table, in markdown.
    pub fn markdown_table(&self) -> String {
        let mut out = String::from(
            "| workload | configuration | rounds | drafted | accepted | acceptance | accepted/draft round | committed/round | ideal speedup | rounds won | replay time |\n\
             |---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|\n",
        );
        for workload in &self.workloads {
            for c in &workload.configurations {
                let won = c
                    .sources
                    .iter()
                    .map(|s| format!("{} {}", s.stats.name, s.stats.won))
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {:.1}% | {:.2} | {:.2} | {} | {} | {:.1} ms |",
                    workload.name,
                    c.label,
                    c.rounds,
                    c.drafted,
                    c.accepted,
                    100.0 * c.acceptance,
                    c.mean_accepted_per_draft_round,
                    c.mean_committed_per_round,
                    c.ideal_speedup
                        .map_or_else(|| "–".to_owned(), |s| format!("{s:.2}x")),
                    won,
                    c.wall_time_ms
                );
            }
        }
        out
    }

    /// `simulation.md`: what was replayed, and the table.
    pub fn markdown(&self) -> String {
        let mut out = String::from("# spechost simulate\n\n");
        let _ = writeln!(
            out,
            "Trace `{}` of `{}`, replayed without the model. `ideal speedup` assumes free drafting and the trace's verify cost curve.\n",
            self.trace.display(),
            self.model.display()
        );
        out.push_str(&self.markdown_table());
        out
    }
}

/// Simulates, prints the table, writes the result files.
pub fn run(config: &SimulateConfig, cache_dir: &Path) -> anyhow::Result<()> {
    let report = simulate(config, cache_dir)?;
    print!("{}", report.markdown_table());
    if let Some(out) = &config.out {
        write_files(&report, out)?;
        eprintln!("results written to {}", out.display());
    }
    Ok(())
}

/// Writes [`SIMULATION_MARKDOWN`] and [`SIMULATION_JSON`] of `report` into `out`.
pub fn write_files(report: &SimulationReport, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let json = serde_json::to_string_pretty(report).context("serialising the results")?;
    for (name, contents) in [
        (SIMULATION_MARKDOWN, report.markdown()),
        (SIMULATION_JSON, json + "\n"),
    ] {
        let path = out.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cascade::{CascadeSettings, DraftSource, ModelFacts, Proposal, SourceFault};
    use crate::engine::StopReason;

    /// Proposes `script[round]` in round `round`, and records the budgets and fed tokens.
    struct Scripted {
        script: Vec<Vec<Token>>,
        round: usize,
        budgets: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
        fed: std::sync::Arc<std::sync::Mutex<Vec<Token>>>,
    }

    impl DraftSource for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn begin(&mut self, _facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
            self.fed.lock().expect("test log").extend_from_slice(prompt);
            Ok(())
        }
        fn propose(&mut self, max_len: usize) -> Result<Proposal, SourceFault> {
            self.budgets.lock().expect("test log").push(max_len);
            let tokens = self.script.get(self.round).cloned().unwrap_or_default();
            self.round += 1;
            Ok(Proposal::from_tokens(tokens))
        }
        fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
            self.fed.lock().expect("test log").extend_from_slice(tokens);
            Ok(())
        }
    }

    type Log<T> = std::sync::Arc<std::sync::Mutex<Vec<T>>>;

    fn scripted(script: Vec<Vec<Token>>) -> (Cascade, Log<usize>, Log<Token>) {
        let budgets = Log::default();
        let fed = Log::default();
        let source = Scripted {
            script,
            round: 0,
            budgets: budgets.clone(),
            fed: fed.clone(),
        };
        let cascade = Cascade::new(vec![Box::new(source)], CascadeSettings::default());
        (cascade, budgets, fed)
    }

    fn target(context_size: u32, batch_size: usize) -> TraceTarget {
        TraceTarget {
            format: crate::bench::trace::TRACE_FORMAT,
            path: "m.gguf".into(),
            sha256: "00".into(),
            vocab_size: 100,
            bos: None,
            eos: Some(2),
            eog: vec![2],
            context_size,
            batch_size,
            threads: 2,
            verify_cost_context_tokens: 0,
            verify_costs_us: Vec::new(),
        }
    }

    fn request(output: Vec<Token>, max_tokens: usize) -> TraceRequest {
        TraceRequest {
            workload: "w".into(),
            id: "r".into(),
            max_tokens,
            prompt: vec![1, 5],
            output,
            stop_reason: StopReason::MaxTokens,
        }
    }

    #[test]
    fn the_trace_verifier_accepts_the_matching_prefix_plus_the_target_token() {
        let target = target(512, 512);
        let verify = |draft: &[Token], upcoming: &[Token]| {
            let output: Vec<Token> = std::iter::once(1).chain(upcoming.iter().copied()).collect();
            let mut verifier = TraceVerifier {
                target: &target,
                output: &output,
                given: 1,
            };
            let round = RoundDraft {
                last: 1,
                tokens: draft.to_vec(),
                parents: Vec::new(),
                survival: Vec::new(),
                n_past: 2,
                max_draft_len: 8,
                distributions: Vec::new(),
            };
            verifier.verify(&round).expect("the trace goes on").tokens
        };
        assert_eq!(verify(&[7, 8, 9], &[7, 8, 4, 5]), vec![7, 8, 4]);
        assert_eq!(verify(&[7, 8], &[7, 8, 4]), vec![7, 8, 4]);
        assert_eq!(verify(&[], &[3, 4]), vec![3]);
        assert_eq!(verify(&[6], &[3, 4]), vec![3]);
        // The trace ends inside the draft: generation stopped on the last accepted token.
        assert_eq!(verify(&[7, 8, 9], &[7, 8]), vec![7, 8]);
    }

    #[test]
    fn replay_counts_rounds_and_feeds_exactly_the_trace() {
        // Output 10..=16 then the end-of-generation token 2; first token 10 comes from the
        // prompt.
        let output: Vec<Token> = (10..17).chain([2]).collect();
        let (mut cascade, budgets, fed) = scripted(vec![
            vec![11, 12, 99], // 2 accepted, commits 11 12 13
            vec![],           // no draft: commits 14
            vec![15, 16, 2],  // all 3 accepted; generation ends there
        ]);
        let stats = replay(
            &request(output.clone(), 12),
            &target(512, 512),
            3,
            &mut cascade,
        );
        assert_eq!(
            (
                stats.rounds,
                stats.draft_rounds,
                stats.drafted,
                stats.accepted
            ),
            (3, 2, 6, 5),
            "seen {stats:?}"
        );
        assert_eq!(stats.verify_batches, vec![1, 0, 0, 2], "seen {stats:?}");
        assert_eq!(*budgets.lock().expect("log"), vec![3, 3, 3]);
        let mut expected = vec![1, 5];
        expected.extend(&output);
        assert_eq!(
            *fed.lock().expect("log"),
            expected,
            "prompt, then every output token"
        );
        let won = &stats.sources[0];
        assert_eq!(
            (won.won, won.accepted_by_position.clone()),
            (2, vec![2, 2, 1])
        );
    }

    #[test]
    fn an_output_a_stop_string_ended_is_replayed_to_its_end() {
        // Stopped after 4 of 12 tokens, neither at max_tokens nor with the end-of-generation
        // token: the replay ends where the trace does, with every token counted.
        let output: Vec<Token> = (10..14).collect();
        let stopped = TraceRequest {
            stop_reason: StopReason::StopString,
            ..request(output, 12)
        };
        let (mut cascade, budgets, _) = scripted(vec![vec![11, 12]]);
        let stats = replay(&stopped, &target(512, 512), 8, &mut cascade);
        assert_eq!((stats.rounds, stats.accepted), (1, 2), "seen {stats:?}");
        assert_eq!(
            budgets.lock().expect("log")[0],
            2,
            "3 tokens remain after the first"
        );
    }

    #[test]
    fn replay_budget_follows_the_verify_loop_rule() {
        // max_tokens 6: after the first token 5 remain, so the first draft may take 4.
        let output: Vec<Token> = (10..16).collect();
        let (mut cascade, budgets, _) = scripted(vec![vec![11, 12, 13, 14]]);
        replay(
            &request(output.clone(), 6),
            &target(512, 512),
            8,
            &mut cascade,
        );
        assert_eq!(
            *budgets.lock().expect("log"),
            vec![4],
            "drafts cut to leave the target's token"
        );

        // A batch of 3 allows drafts of 2; a context of 4 cells after a 2-token prompt, 1.
        let (mut cascade, budgets, _) = scripted(vec![]);
        replay(
            &request(output.clone(), 6),
            &target(512, 3),
            8,
            &mut cascade,
        );
        assert_eq!(budgets.lock().expect("log")[0], 2);
        let (mut cascade, budgets, _) = scripted(vec![]);
        replay(&request(output, 6), &target(4, 512), 8, &mut cascade);
        assert_eq!(budgets.lock().expect("log")[0], 1);
    }

    #[test]
    fn single_token_output_begins_and_ends_without_rounds() {
        let (mut cascade, budgets, fed) = scripted(vec![vec![3]]);
        let stats = replay(&request(vec![2], 8), &target(512, 512), 8, &mut cascade);
        assert_eq!(stats.rounds, 0);
        assert!(budgets.lock().expect("log").is_empty());
        assert_eq!(*fed.lock().expect("log"), vec![1, 5, 2]);
    }
}
