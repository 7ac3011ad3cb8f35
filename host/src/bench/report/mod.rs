//! The results of a benchmark as one serialisable value; `render` writes it as markdown and CSV.

mod render;

pub(super) use self::render::csv_field;

use std::path::PathBuf;

use serde::Serialize;

use super::ceiling::VerifyCostPoint;
use super::runner::{
    Configuration, DegenerateRequest, Measurements, Mismatch, RequestRow, WorkloadRun,
};
use super::stats::{Summary, Totals, acceptance_by_position, speedup};
use crate::cascade::SourceStats;
use crate::config::{BenchConfig, PromptStyle};
use crate::engine::{ObservedRatio, SamplingParams};

/// Everything a benchmark found; `results.json` is this value.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The target GGUF.
    pub model: PathBuf,
    /// How it was prompted: `chat` (its chat template) or `raw` (prompts continued).
    pub prompt_style: &'static str,
    /// Compute threads of the target.
    pub threads: usize,
    /// Context size, in tokens.
    pub ctx_size: u32,
    /// Measured passes per workload and configuration.
    pub repeat: usize,
    /// Unmeasured passes before them.
    pub warmup: usize,
    /// Measured runs of each batch size of the verify cost curves.
    pub cost_repeat: usize,
    /// Cap on each request's `max_tokens`, if one was given.
    pub max_tokens_cap: Option<usize>,
    /// Sampling of every request ([`sampling_label`]); outputs must match plain decoding's
    /// either way.
    pub sampling: String,
    /// Whether every output of every configuration equalled plain decoding.
    pub outputs_match: bool,
    /// The outputs that did not.
    pub mismatches: Vec<Mismatch>,
    /// Decodings that verified drawn drafts by rejection sampling (not compared with plain
    /// decoding: they follow its distribution, not its draw for the seed).
    pub drawn_requests: usize,
    /// Every request of every measured pass (`requests.csv`), degenerate ones included.
    #[serde(skip)]
    pub requests: Vec<RequestRow>,
    /// One entry per workload.
    pub workloads: Vec<WorkloadReport>,
    /// Every configuration on all workloads together (the mixed set), plain first; empty with
    /// one workload.
    pub mixed: Vec<MixedReport>,
}

/// One configuration on all workloads together: each pass's tokens over its time, summed over
/// the workloads, so a workload weighs by its generated tokens.
#[derive(Debug, Clone, Serialize)]
pub struct MixedReport {
    /// The configuration's label.
    pub label: String,
    /// Median, min and max over the measured passes.
    pub tokens_per_second: Summary,
    /// Median tok/s over plain decoding's on the same set; `null` when plain timed nothing.
    pub speedup: Option<f64>,
}

/// The results on one workload.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    /// The workload's name (its file stem).
    pub name: String,
    /// The workload file.
    pub path: PathBuf,
    /// Requests in the file.
    pub requests: usize,
    /// The requests whose plain output is no answer (an echo of the prompt, a loop): left out
    /// of every figure of this workload and of the mixed set.
    pub degenerate: Vec<DegenerateRequest>,
    /// `degenerate` over `requests`, in [0, 1].
    pub degenerate_share: f64,
    /// The target's verify cost curve on this workload.
    pub verify_cost: VerifyCostReport,
    /// One entry per configuration, plain first.
    pub configurations: Vec<ConfigurationReport>,
}

/// The target's verify cost curve, measured after one of the workload's prompts.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyCostReport {
    /// Tokens of context before each measured batch (the workload's median prompt length).
    pub context_tokens: usize,
    /// Median cost of one verify batch, by tokens in the batch.
    pub points: Vec<VerifyCostPoint>,
    /// What the workload's real verify decodes took over these points' prices, by tokens in
    /// the batch (sizes verified at least once).
    pub observed: Vec<ObservedRatio>,
}

/// The results of one configuration on one workload.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigurationReport {
    /// `plain` or `SOURCES K=N`.
    pub label: String,
    /// Source names in order; empty for plain decoding.
    pub cascade: Vec<String>,
    /// Most draft tokens per round; `null` for plain decoding.
    #[serde(rename = "draft_max")]
    pub max_draft_len: Option<usize>,
    /// Generation tokens per second of each measured pass, in order.
    pub tokens_per_second_by_pass: Vec<f64>,
    /// Median, min and max of `tokens_per_second_by_pass`.
    pub tokens_per_second: Summary,
    /// Median tok/s over plain decoding's median tok/s; `null` when plain timed nothing.
    pub speedup: Option<f64>,
    /// The speedup this configuration's rounds would give if drafting and bookkeeping were
    /// free and each verify batch cost what the workload's curve says (see `bench::ceiling`);
    /// `null` when a batch size is off the curve.
    pub ideal_speedup: Option<f64>,
    /// `speedup / ideal_speedup`: the share of the ideal the loop achieves.
    pub efficiency: Option<f64>,
    /// Generated tokens per pass.
    pub generated_tokens: u64,
    /// Accepted over drafted tokens, over all measured passes, in [0, 1].
    pub acceptance: f64,
    /// Mean accepted draft tokens per round that verified a draft.
    pub mean_accepted_per_draft_round: f64,
    /// Mean tokens committed per verify round (accepted draft tokens plus the target's own).
    pub mean_committed_per_round: f64,
    /// Share of generation time spent drafting, in [0, 1].
    pub draft_share: f64,
    /// Share of generation time spent in verify batches, in [0, 1].
    pub verify_share: f64,
    /// Verify rounds, over all measured passes.
    pub rounds: u64,
    /// Rounds that verified a draft, over all measured passes.
    pub draft_rounds: u64,
    /// Draft tokens verified, over all measured passes.
    pub drafted: u64,
    /// Draft tokens accepted, over all measured passes.
    pub accepted: u64,
    /// Rounds that verified drafts drawn at the temperature by rejection sampling, over all
    /// measured passes: their requests' outputs are not compared with plain decoding's.
    pub drawn_rounds: u64,
    /// Rounds whose draft was a tree of several continuations, over all measured passes.
    pub tree_rounds: u64,
    /// `verify_batches[n - 1]`: rounds that verified `n` tokens, over all measured passes.
    pub verify_batches: Vec<u64>,
    /// Per-source results, in cascade order.
    pub sources: Vec<SourceReport>,
    /// Whether every output equalled plain decoding.
    pub outputs_match: bool,
}

/// The results of one source of a configuration, over all measured passes.
#[derive(Debug, Clone, Serialize)]
pub struct SourceReport {
    /// The cascade's counters, summed over requests and measured passes (`time` in µs).
    #[serde(flatten)]
    pub stats: SourceStats,
    /// Rounds won over all verify rounds, in [0, 1].
    pub won_share: f64,
    /// For draft positions 1..=K: the share of the source's winning rounds that accepted it.
    pub acceptance_by_position: Vec<f64>,
}

impl SourceReport {
    /// The report of a source's counters over `rounds` verify rounds of drafts of at most
    /// `positions` tokens.
    pub fn new(stats: &SourceStats, rounds: u64, positions: usize) -> Self {
        Self {
            won_share: if rounds == 0 {
                0.0
            } else {
                stats.won as f64 / rounds as f64
            },
            acceptance_by_position: acceptance_by_position(stats, positions),
            stats: stats.clone(),
        }
    }
}

/// How a benchmark's requests were sampled: `greedy`, or the temperature, the filters that are
/// on and the seed of each workload's first request (the next requests take the next seeds).
pub fn sampling_label(sampling: &SamplingParams) -> String {
    if sampling.is_greedy() {
        return "greedy".to_owned();
    }
    let mut label = format!("temperature {}", sampling.temperature);
    if sampling.top_k > 0 {
        label.push_str(&format!(", top-k {}", sampling.top_k));
    }
    if sampling.top_p < 1.0 {
        label.push_str(&format!(", top-p {}", sampling.top_p));
    }
    if sampling.min_p > 0.0 {
        label.push_str(&format!(", min-p {}", sampling.min_p));
    }
    label.push_str(&format!(", seeds from {}", sampling.seed));
    label
}

impl Report {
    /// Summarises `measurements` of a benchmark run with `config`.
    pub fn new(config: &BenchConfig, measurements: Measurements) -> Self {
        let Measurements {
            configurations,
            workloads,
            mismatches,
            drawn_requests,
            requests,
            prompt_style,
            threads,
            ctx_size,
        } = measurements;
        let mixed = if workloads.len() > 1 {
            mixed_reports(&configurations, &workloads)
        } else {
            Vec::new()
        };
        let workloads = workloads
            .into_iter()
            .map(|run| {
                let medians: Vec<Option<Summary>> = run
                    .passes
                    .iter()
                    .map(|passes| Summary::of(&rates(passes)))
                    .collect();
                let plain = medians.first().copied().flatten();
                let configurations = configurations
                    .iter()
                    .zip(&run.passes)
                    .map(|(configuration, passes)| {
                        let label = configuration.label();
                        let by_pass = rates(passes);
                        let summary = Summary::of(&by_pass).unwrap_or(Summary {
                            median: 0.0,
                            min: 0.0,
                            max: 0.0,
                        });
                        let mut totals = Totals::default();
                        passes.iter().for_each(|pass| totals.add(pass));
                        let positions = configuration.max_draft_len.unwrap_or(0);
                        let outputs_match = !mismatches
                            .iter()
                            .any(|m| m.workload == run.workload.name && m.configuration == label);
                        let speedup = plain.and_then(|plain| speedup(summary.median, plain.median));
                        let ideal_speedup = run
                            .verify_costs
                            .ideal_speedup(totals.timed_tokens, &totals.verify_batches);
                        ConfigurationReport {
                            cascade: configuration
                                .cascade
                                .iter()
                                .map(crate::plugins::SourceSpec::name)
                                .collect(),
                            max_draft_len: configuration.max_draft_len,
                            speedup,
                            ideal_speedup,
                            efficiency: speedup
                                .zip(ideal_speedup)
                                .map(|(measured, ideal)| measured / ideal),
                            generated_tokens: totals.generated_tokens / passes.len().max(1) as u64,
                            acceptance: totals.acceptance(),
                            mean_accepted_per_draft_round: totals.mean_accepted_per_draft_round(),
                            mean_committed_per_round: totals.mean_committed_per_round(),
                            draft_share: totals.draft_share(),
                            verify_share: totals.verify_share(),
                            rounds: totals.rounds,
                            draft_rounds: totals.draft_rounds,
                            drafted: totals.drafted,
                            accepted: totals.accepted,
                            drawn_rounds: totals.drawn_rounds,
                            tree_rounds: totals.tree_rounds,
                            sources: totals
                                .sources
                                .iter()
                                .map(|stats| SourceReport::new(stats, totals.rounds, positions))
                                .collect(),
                            verify_batches: totals.verify_batches.clone(),
                            tokens_per_second_by_pass: by_pass,
                            tokens_per_second: summary,
                            outputs_match,
                            label,
                        }
                    })
                    .collect();
                let requests = run.workload.requests.len();
                WorkloadReport {
                    name: run.workload.name.clone(),
                    path: run.workload.path.clone(),
                    requests,
                    degenerate_share: run.degenerate.len() as f64 / requests.max(1) as f64,
                    degenerate: run.degenerate.clone(),
                    verify_cost: VerifyCostReport {
                        context_tokens: run.verify_costs.context_tokens,
                        points: run.verify_costs.points(),
                        observed: run.observed.clone(),
                    },
                    configurations,
                }
            })
            .collect();
        Self {
            model: config.stack.model.clone(),
            prompt_style: match prompt_style {
                PromptStyle::Raw => "raw",
                PromptStyle::Chat | PromptStyle::Auto => "chat",
            },
            threads,
            ctx_size,
            repeat: config.repeat,
            warmup: config.warmup,
            cost_repeat: config.cost_repeat,
            max_tokens_cap: config.max_tokens_cap,
            sampling: sampling_label(&config.sampling),
            outputs_match: mismatches.is_empty(),
            mismatches,
            drawn_requests,
            requests,
            workloads,
            mixed,
        }
    }
}

/// The mixed-set rows: for configuration `c` and pass `p`, the totals of pass `p` of `c` on
/// every workload, added.
fn mixed_reports(configurations: &[Configuration], workloads: &[WorkloadRun]) -> Vec<MixedReport> {
    let summaries: Vec<Option<Summary>> = (0..configurations.len())
        .map(|c| {
            let passes = workloads
                .iter()
                .map(|w| w.passes[c].len())
                .min()
                .unwrap_or(0);
            let by_pass: Vec<Totals> = (0..passes)
                .map(|p| {
                    let mut totals = Totals::default();
                    workloads.iter().for_each(|w| totals.add(&w.passes[c][p]));
                    totals
                })
                .collect();
            Summary::of(&rates(&by_pass))
        })
        .collect();
    let plain = summaries.first().copied().flatten();
    configurations
        .iter()
        .zip(summaries)
        .filter_map(|(configuration, summary)| {
            let summary = summary?;
            Some(MixedReport {
                label: configuration.label(),
                speedup: plain.and_then(|plain| speedup(summary.median, plain.median)),
                tokens_per_second: summary,
            })
        })
        .collect()
}

/// Tok/s of each pass.
fn rates(passes: &[Totals]) -> Vec<f64> {
    passes.iter().map(Totals::tokens_per_second).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::render::csv_field;
    use super::*;
    use crate::bench::ceiling::VerifyCosts;
    use crate::bench::degenerate::Degeneracy;
    use crate::bench::workload::Workload;
    use crate::config::BenchArgs;
    use crate::plugins::SourceSpec;

    fn config() -> BenchConfig {
        BenchArgs {
            target: crate::config::TargetArgs {
                model: Some("/models/m.gguf".into()),
                ..Default::default()
            },
            workloads: vec!["w/edit.jsonl".into()],
            cascades: vec!["lookup,suffix".into()],
            max_draft_lens: vec![4],
            repeat: 2,
            cost_repeat: 1,
            ..BenchArgs::default()
        }
        .into_config(std::path::Path::new("/tmp"))
        .expect("valid flags")
    }

    /// A pass of one request committing `tokens` tokens in `verify_batches.iter().sum()`
    /// rounds.
    fn pass(tokens: u64, secs: f64, verify_batches: Vec<u64>, sources: Vec<SourceStats>) -> Totals {
        Totals {
            requests: 1,
            generated_tokens: tokens + 1,
            timed_tokens: tokens,
            generation_time: Duration::from_secs_f64(secs),
            rounds: verify_batches.iter().sum(),
            draft_rounds: 5,
            drafted: 20,
            accepted: 10,
            drawn_rounds: 0,
            tree_rounds: 0,
            verify_batches,
            verify_time: Duration::from_secs_f64(secs * 0.9),
            draft_time: Duration::from_secs_f64(secs * 0.05),
            sources,
        }
    }

    fn report(mismatches: Vec<Mismatch>) -> Report {
        let workload =
            Workload::parse("w/edit.jsonl".as_ref(), "{\"prompt\": \"x\"}").expect("workload");
        let mut lookup = SourceStats::named("lookup");
        (lookup.won, lookup.drafted, lookup.accepted) = (4, 16, 8);
        lookup.accepted_by_position = vec![4, 3, 1];
        let suffix = SourceStats {
            won: 1,
            accepted_by_position: vec![1],
            ..SourceStats::named("suffix")
        };
        let measurements = Measurements {
            drawn_requests: 0,
            configurations: vec![
                Configuration::plain(),
                Configuration {
                    cascade: vec![
                        SourceSpec::Builtin("lookup".into()),
                        SourceSpec::Builtin("suffix".into()),
                    ],
                    max_draft_len: Some(4),
                    policy: Some(crate::plugins::parse_policy("fixed").expect("valid policy")),
                    mode: crate::cascade::CascadeMode::First,
                    grammar_drafts: true,
                },
            ],
            workloads: vec![WorkloadRun {
                workload,
                passes: vec![
                    vec![
                        pass(100, 1.0, vec![100], vec![]),
                        pass(100, 1.25, vec![100], vec![]),
                    ],
                    vec![
                        pass(
                            100,
                            0.5,
                            vec![0, 0, 0, 0, 25],
                            vec![lookup.clone(), suffix.clone()],
                        ),
                        pass(100, 0.625, vec![0, 0, 0, 0, 25], vec![lookup, suffix]),
                    ],
                ],
                // Plain decoding costs 1 ms a token; a round of 5 tokens 1.6 ms.
                verify_costs: VerifyCosts {
                    context_tokens: 50,
                    per_batch: [1000, 1100, 1200, 1300, 1600]
                        .into_iter()
                        .map(Duration::from_micros)
                        .collect(),
                },
                observed: Vec::new(),
                degenerate: vec![DegenerateRequest {
                    request: "echoed".into(),
                    degeneracy: Degeneracy::Echo,
                }],
            }],
            mismatches,
            requests: vec![RequestRow {
                workload: "edit".into(),
                configuration: "plain".into(),
                pass: 1,
                request: "echoed".into(),
                degeneracy: Some(Degeneracy::Echo),
                generated_tokens: 40,
                generation_time: Duration::from_millis(250),
                rounds: 39,
                drafted: 0,
                accepted: 0,
            }],
            prompt_style: PromptStyle::Chat,
            threads: 2,
            ctx_size: 4096,
        };
        Report::new(&config(), measurements)
    }

    #[test]
    fn mixed_set_weighs_workloads_by_their_tokens() {
        let run = |name: &str, plain_secs, cascade_secs| WorkloadRun {
            workload: Workload::parse(
                std::path::Path::new(&format!("w/{name}.jsonl")),
                "{\"prompt\": \"x\"}",
            )
            .expect("workload"),
            passes: vec![
                vec![pass(100, plain_secs, vec![100], vec![])],
                vec![pass(100, cascade_secs, vec![0, 0, 0, 0, 25], vec![])],
            ],
            verify_costs: VerifyCosts {
                context_tokens: 1,
                per_batch: Vec::new(),
            },
            observed: Vec::new(),
            degenerate: Vec::new(),
        };
        let configurations = [
            Configuration::plain(),
            Configuration {
                cascade: vec![SourceSpec::Builtin("lookup".into())],
                max_draft_len: Some(4),
                policy: None,
                mode: crate::cascade::CascadeMode::First,
                grammar_drafts: true,
            },
        ];
        // Twice as fast on `a`, half as fast on `b`: 200 tokens in 3 s plain, in 4.5 s drafted.
        let mixed = mixed_reports(&configurations, &[run("a", 1.0, 0.5), run("b", 2.0, 4.0)]);
        let [plain, lookup] = &mixed[..] else {
            panic!("two rows: {mixed:?}");
        };
        assert_eq!((plain.label.as_str(), plain.speedup), ("plain", Some(1.0)));
        assert!((plain.tokens_per_second.median - 200.0 / 3.0).abs() < 1e-9);
        assert_eq!(lookup.label, "lookup K=4");
        let speedup = lookup.speedup.expect("plain timed tokens");
        assert!((speedup - 3.0 / 4.5).abs() < 1e-9, "{lookup:?}");
        assert!(
            report(Vec::new()).mixed.is_empty(),
            "no mixed set of one workload"
        );
    }

    #[test]
    fn degenerate_requests_are_named_in_the_markdown_and_kept_in_requests_csv() {
        let report = report(Vec::new());
        assert!((report.workloads[0].degenerate_share - 1.0).abs() < 1e-9);
        let markdown = report.markdown(&[]);
        assert!(
            markdown.contains("1 degenerate (100.0%: `echoed` echo), left out of the figures"),
            "{markdown}"
        );
        let csv = report.requests_csv();
        assert_eq!(
            csv.lines().nth(1),
            Some("edit,plain,1,echoed,echo,40,0.250000,39,0,0"),
            "{csv}"
        );
        let results = report.csv();
        let header: Vec<&str> = results.lines().next().expect("header").split(',').collect();
        let row: Vec<&str> = results.lines().nth(1).expect("a row").split(',').collect();
        let column = |name: &str| header.iter().position(|h| *h == name).expect(name);
        assert_eq!(
            (row[column("requests")], row[column("degenerate")]),
            ("0", "1")
        );
    }

    #[test]
    fn report_takes_medians_and_speedup_of_medians() {
        let report = report(Vec::new());
        let [plain, cascade] = &report.workloads[0].configurations[..] else {
            panic!(
                "two configurations, seen {:?}",
                report.workloads[0].configurations
            );
        };
        assert_eq!(plain.tokens_per_second.median, 90.0, "seen {plain:?}");
        assert_eq!(cascade.tokens_per_second.median, 180.0, "seen {cascade:?}");
        assert_eq!(cascade.speedup, Some(2.0));
        assert_eq!(plain.speedup, Some(1.0));
        // 200 tokens at 1 ms each against 50 rounds of 1.6 ms.
        let ideal = cascade.ideal_speedup.expect("on the curve");
        assert!((ideal - 2.5).abs() < 1e-9, "seen {cascade:?}");
        let efficiency = cascade.efficiency.expect("both speedups");
        assert!((efficiency - 0.8).abs() < 1e-9, "seen {cascade:?}");
        assert_eq!(plain.ideal_speedup, Some(1.0), "seen {plain:?}");
        assert!((cascade.mean_committed_per_round - 4.0).abs() < 1e-12);
        assert_eq!(
            cascade.sources[0].acceptance_by_position,
            vec![1.0, 0.75, 0.25, 0.0]
        );
        assert!(
            (cascade.sources[0].won_share - 8.0 / 50.0).abs() < 1e-12,
            "seen {:?}",
            cascade.sources[0]
        );
        assert!(report.outputs_match);
    }

    #[test]
    fn markdown_table_has_one_row_per_configuration() {
        let table = report(Vec::new()).markdown_table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "header, rule and two rows in:\n{table}");
        assert!(
            lines[0].starts_with("| workload | configuration | tok/s (median)"),
            "{table}"
        );
        assert_eq!(
            lines[2],
            "| edit | plain | 90.0 | 80.0–100.0 | 1.00x | 1.00x | 100.0% | – | – | – | 5.0% | 90.0% | baseline |"
        );
        assert_eq!(
            lines[3],
            "| edit | lookup,suffix K=4 | 180.0 | 160.0–200.0 | 2.00x | 2.50x | 80.0% | 50.0% | 2.00 | lookup 4 (16.0%), suffix 1 (4.0%) | 5.0% | 90.0% | same |"
        );
    }

    #[test]
    fn mismatches_are_loud_in_markdown_and_json() {
        let report = report(vec![Mismatch {
            workload: "edit".into(),
            configuration: "lookup,suffix K=4".into(),
            request: "line-1".into(),
            pass: 2,
            first_difference: 7,
            expected_tokens: 101,
            generated_tokens: 101,
        }]);
        assert!(!report.outputs_match);
        assert!(report.markdown_table().contains("| **DIFFERS** |"));
        let markdown = report.markdown(&[("speedup", "speedup.svg")]);
        assert!(markdown.contains("1 output(s) differ"), "{markdown}");
        assert!(
            markdown.contains("request `line-1` (pass 2): first difference at token 7"),
            "{markdown}"
        );
        assert!(markdown.contains("![speedup](speedup.svg)"), "{markdown}");
        assert!(
            markdown.contains("`edit`, context 50 tokens:")
                && markdown.contains("| 5 | 1600 | 1.60 | 0.320 |"),
            "verify cost curve missing: {markdown}"
        );
        let json = serde_json::to_value(&report).expect("serialisable");
        assert_eq!(json["outputs_match"], false);
        assert_eq!(
            json["workloads"][0]["configurations"][1]["outputs_match"],
            false
        );
        assert_eq!(
            json["workloads"][0]["configurations"][0]["draft_max"],
            serde_json::Value::Null
        );
        assert_eq!(
            json["workloads"][0]["configurations"][1]["sources"][0]["won"],
            8
        );
    }

    #[test]
    fn csv_has_a_header_and_quotes_fields_with_commas() {
        let csv = report(Vec::new()).csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3, "{csv}");
        assert!(
            lines[0].starts_with("workload,configuration,cascade,draft_max,"),
            "{csv}"
        );
        assert!(
            lines[1]
                .starts_with("edit,plain,,,0,1,101,90.000,80.000,100.000,1.0000,1.0000,1.0000,"),
            "{}",
            lines[1]
        );
        assert!(
            lines[2].starts_with("edit,\"lookup,suffix K=4\",\"lookup,suffix\",4,0,1,101,180.000,"),
            "{}",
            lines[2]
        );
        assert!(
            lines[2].ends_with(",lookup=4;suffix=1,true"),
            "{}",
            lines[2]
        );
        let columns = lines[0].split(',').count();
        assert_eq!(columns, 20, "{}", lines[0]);
        assert_eq!(csv_field("a\"b"), "\"a\"\"b\"");
    }
}
