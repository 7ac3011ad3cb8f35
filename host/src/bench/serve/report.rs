//! The server benchmark's results as one serialisable value, rendered as markdown (stdout and
//! `serve-results.md`), CSV (`serve-results.csv`, one line per level) and JSON
//! (`serve-results.json`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use super::super::report::csv_field;
use super::super::runner::Mismatch;
use super::super::stats::{Summary, speedup};
use super::figures::{LevelFigures, Percentiles};
use super::levels::{Difference, Driven, Level, Reference};

/// File names written into `--out`.
pub const SERVE_RESULTS_MARKDOWN: &str = "serve-results.md";
/// See [`SERVE_RESULTS_MARKDOWN`].
pub const SERVE_RESULTS_CSV: &str = "serve-results.csv";
/// See [`SERVE_RESULTS_MARKDOWN`].
pub const SERVE_RESULTS_JSON: &str = "serve-results.json";

/// What was driven, for the report's header.
#[derive(Debug, Clone, Serialize)]
pub struct ServerSettings {
    /// `in-process` or the `HOST:PORT` of a running server.
    pub server: String,
    /// The target GGUF of an in-process server.
    pub model: Option<PathBuf>,
    /// Slots of an in-process server.
    pub slots: Option<usize>,
    /// Compute threads of each llama.cpp context of an in-process server.
    pub threads: Option<usize>,
    /// `chat` or `raw`.
    pub prompt_style: &'static str,
    /// Requests each client sent per level.
    pub requests_per_client: usize,
    /// Measured passes of each level, the rows alternating.
    pub passes: usize,
    /// Cap on each request's `max_tokens`, if one was given.
    pub max_tokens_cap: Option<usize>,
}

/// `run` and one-client `serve` on the same requests, for one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct SingleStream {
    /// The configuration's label.
    pub configuration: String,
    /// Generation tok/s through the engine, as `spechost bench` and `run` decode (tokens after
    /// each request's first over the time after it, summed over the measured passes).
    pub run_tokens_per_second: f64,
    /// The same figure from the one-client level's client-side timings; `null` without one.
    pub serve_tokens_per_second: Option<f64>,
    /// `serve_tokens_per_second / run_tokens_per_second`.
    pub serve_over_run: Option<f64>,
}

/// One level as a report row.
#[derive(Debug, Clone, Serialize)]
pub struct ServeRow {
    /// The level as measured.
    #[serde(flatten)]
    pub level: Level,
    /// Aggregate tok/s over plain decoding's at the same client count ([`paired_speedup`]:
    /// the median over the passes of each pass's over plain decoding's tok/s interpolated to
    /// when it ran, between the plain passes before and after it); `null` for plain decoding
    /// and for a running server.
    pub over_plain: Option<f64>,
    /// Aggregate tok/s over the same configuration's at one client; `null` without one.
    pub over_one_client: Option<f64>,
}

/// Everything the server benchmark found; `serve-results.json` is this value.
#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    /// What was driven, and how.
    pub settings: ServerSettings,
    /// Sampling of every request (`report::sampling_label`); every answer must equal plain
    /// decoding's either way.
    pub sampling: String,
    /// Whether every answer equalled its reference, and every single-stream output equalled
    /// plain decoding.
    pub outputs_match: bool,
    /// One row per configuration and client count.
    pub rows: Vec<ServeRow>,
    /// `run` next to one-client `serve`, per configuration (in-process only).
    pub single_stream: Vec<SingleStream>,
    /// Answers that differed from their reference.
    pub differences: Vec<Difference>,
    /// Single-stream outputs that differed from plain decoding through the engine.
    pub run_mismatches: Vec<Mismatch>,
    /// Every request's reference text (its answer under plain decoding, or from the server at
    /// `--url`, at the fewest clients), for comparing runs with each other
    /// (`bench/serve-scaling.py`).
    pub references: Vec<Reference>,
}

impl ServeReport {
    /// The report of `driven`; `run_rates` are the single-stream generation tok/s by
    /// configuration label (empty for a running server).
    pub fn new(
        settings: ServerSettings,
        driven: Driven,
        run_rates: &[(String, f64)],
        run_mismatches: Vec<Mismatch>,
        sampling: String,
    ) -> Self {
        let find = |configuration: &str, clients: usize| {
            driven
                .levels
                .iter()
                .find(|l| l.configuration == configuration && l.clients == clients)
        };
        let plain = driven.levels.first().map(|l| l.configuration.clone());
        // The levels come row by row, in the order each pass cycle decodes the rows (plain
        // decoding's first).
        let mut configurations: Vec<&str> = driven
            .levels
            .iter()
            .map(|level| level.configuration.as_str())
            .collect();
        configurations.dedup();
        let position_in_cycle = |configuration: &str| {
            let index = configurations.iter().position(|c| *c == configuration);
            index.unwrap_or(0) as f64 / configurations.len() as f64
        };
        let running = settings.server != IN_PROCESS;
        let rows = driven
            .levels
            .iter()
            .map(|level| {
                let rate = level.figures.tokens_per_second;
                let over_plain = plain
                    .as_deref()
                    .filter(|plain| !running && *plain != level.configuration)
                    .and_then(|plain| find(plain, level.clients))
                    .and_then(|plain| {
                        paired_speedup(
                            &level.figures,
                            &plain.figures,
                            position_in_cycle(&level.configuration),
                        )
                    });
                let over_one_client = find(&level.configuration, 1)
                    .and_then(|one| speedup(rate, one.figures.tokens_per_second));
                ServeRow {
                    level: level.clone(),
                    over_plain,
                    over_one_client,
                }
            })
            .collect();
        let single_stream = run_rates
            .iter()
            .map(|(configuration, run_rate)| {
                let serve = find(configuration, 1).map(|l| l.figures.generation_tokens_per_second);
                SingleStream {
                    configuration: configuration.clone(),
                    run_tokens_per_second: *run_rate,
                    serve_tokens_per_second: serve,
                    serve_over_run: serve.and_then(|serve| speedup(serve, *run_rate)),
                }
            })
            .collect();
        Self {
            settings,
            sampling,
            outputs_match: driven.differences.is_empty() && run_mismatches.is_empty(),
            rows,
            single_stream,
            differences: driven.differences,
            run_mismatches,
            references: driven.references,
        }
    }

    /// The results, in markdown: the levels, the single-stream comparison, the differences.
    pub fn markdown(&self) -> String {
        let settings = &self.settings;
        let mut out = match (settings.slots, settings.threads) {
            (Some(slots), Some(threads)) if settings.server == IN_PROCESS => format!(
                "Server benchmark: spechost serve in-process ({slots} slots, {threads} compute thread(s) per context), "
            ),
            _ => format!("Server benchmark: the server at {}, ", settings.server),
        };
        let _ = writeln!(
            out,
            "{} prompts, {}, {} requests per client per level (after one warm-up request), streamed, {} pass(es) of each level, \
             the configurations alternating; tok/s is all clients' completion tokens over the pass's wall time (the median pass), \
             vs plain the median of each pass's over plain decoding's tok/s interpolated to when it ran (between its passes before and after), \
             times are measured by the clients (over every pass's requests).\n",
            settings.prompt_style, self.sampling, settings.requests_per_client, settings.passes
        );
        out.push_str(
            "| configuration | clients | requests | tok/s | passes' tok/s | vs plain | vs 1 client | TTFT p50 ms | TTFT p95 ms | per-token p50 ms | per-token p95 ms | identical |\n",
        );
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
        for row in &self.rows {
            let level = &row.level;
            let (ttft_p50, ttft_p95) = millis(level.figures.time_to_first_token);
            let (tpot_p50, tpot_p95) = millis(level.figures.time_per_output_token);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {} | {} | {} | {ttft_p50} | {ttft_p95} | {tpot_p50} | {tpot_p95} | {} |",
                level.configuration,
                level.clients,
                level.figures.requests,
                level.figures.tokens_per_second,
                pass_rates(&level.figures.pass_tokens_per_second, " / "),
                ratio(row.over_plain),
                ratio(row.over_one_client),
                if level.identical { "yes" } else { "**no**" },
            );
        }
        if !self.single_stream.is_empty() {
            out.push_str(
                "\nOne stream: `run` (the engine, as `spechost bench` and `spechost run` decode) next to `serve` with one client, \
                 on the same requests (`run`'s passes split before and after the one-client level); both generation tok/s: tokens after each request's first over the time after it (prompt excluded).\n\n",
            );
            out.push_str("| configuration | run tok/s | serve tok/s (1 client) | serve / run |\n");
            out.push_str("|---|--:|--:|--:|\n");
            for single in &self.single_stream {
                let _ = writeln!(
                    out,
                    "| {} | {:.1} | {} | {} |",
                    single.configuration,
                    single.run_tokens_per_second,
                    single
                        .serve_tokens_per_second
                        .map_or_else(|| "–".to_owned(), |rate| format!("{rate:.1}")),
                    ratio(single.serve_over_run),
                );
            }
        }
        for difference in &self.differences {
            let _ = writeln!(
                out,
                "\nDIFFERS: {} at {} client(s), pass {}, request `{}` of `{}`: from character {} ({} characters; the reference has {})",
                difference.configuration,
                difference.clients,
                difference.pass,
                difference.request,
                difference.workload,
                difference.first_difference,
                difference.generated_chars,
                difference.expected_chars
            );
        }
        for mismatch in &self.run_mismatches {
            let _ = writeln!(
                out,
                "\nDIFFERS through the engine: {} · request `{}` of `{}` from token {}",
                mismatch.configuration,
                mismatch.request,
                mismatch.workload,
                mismatch.first_difference
            );
        }
        out
    }

    /// One CSV line per level.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "configuration,clients,requests,completion_tokens,wall_seconds,tokens_per_second,pass_tokens_per_second,over_plain,over_one_client,\
             ttft_p50_ms,ttft_p95_ms,tpot_p50_ms,tpot_p95_ms,generation_tokens_per_second,identical\n",
        );
        for row in &self.rows {
            let level = &row.level;
            let figures = &level.figures;
            let optional =
                |value: Option<f64>| value.map_or_else(String::new, |v| format!("{v:.4}"));
            let fields = [
                csv_field(&level.configuration),
                level.clients.to_string(),
                figures.requests.to_string(),
                figures.completion_tokens.to_string(),
                format!("{:.4}", figures.wall_seconds),
                format!("{:.3}", figures.tokens_per_second),
                pass_rates(&figures.pass_tokens_per_second, ";"),
                optional(row.over_plain),
                optional(row.over_one_client),
                optional(figures.time_to_first_token.map(|p| p.p50_ms)),
                optional(figures.time_to_first_token.map(|p| p.p95_ms)),
                optional(figures.time_per_output_token.map(|p| p.p50_ms)),
                optional(figures.time_per_output_token.map(|p| p.p95_ms)),
                format!("{:.3}", figures.generation_tokens_per_second),
                level.identical.to_string(),
            ];
            out.push_str(&fields.join(","));
            out.push('\n');
        }
        out
    }

    /// Writes the markdown, CSV and JSON files into `dir`, creating it.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::to_string_pretty(self).context("serialising the results")?;
        for (name, contents) in [
            (SERVE_RESULTS_MARKDOWN, self.markdown()),
            (SERVE_RESULTS_CSV, self.csv()),
            (SERVE_RESULTS_JSON, json + "\n"),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, contents)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}

/// `figures`' tok/s over `baseline`'s: the median of the passes' ratios, the ratio of the
/// medians when the passes do not pair up.
///
/// The rows alternate pass by pass: a cycle decodes the baseline's pass, then the others, this
/// one `position` of the way through it (1/2 for the second of two rows). Each pass is over the
/// baseline's tok/s interpolated to when it ran, geometrically between the baseline's pass of
/// the same index and the next one (after the last cycle, that pass alone), so a shared
/// machine slowing down or speeding up during a level weighs on both sides of each ratio alike,
/// not only a slow phase that lasts a whole cycle.
fn paired_speedup(figures: &LevelFigures, baseline: &LevelFigures, position: f64) -> Option<f64> {
    let (passes, baseline_passes) = (
        &figures.pass_tokens_per_second,
        &baseline.pass_tokens_per_second,
    );
    if passes.is_empty() || passes.len() != baseline_passes.len() {
        return speedup(figures.tokens_per_second, baseline.tokens_per_second);
    }
    let ratios: Option<Vec<f64>> = passes
        .iter()
        .enumerate()
        .map(|(index, &rate)| {
            let before = baseline_passes[index];
            let base = baseline_passes.get(index + 1).map_or(before, |&after| {
                before.powf(1.0 - position) * after.powf(position)
            });
            speedup(rate, base)
        })
        .collect();
    Some(Summary::of(&ratios?)?.median)
}

/// [`ServerSettings::server`] of a server started in this process.
pub const IN_PROCESS: &str = "in-process";

/// `1.23x`, or `–`.
fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |value| format!("{value:.2}x"))
}

/// Each pass's tok/s with one decimal, joined by `separator`.
fn pass_rates(rates: &[f64], separator: &str) -> String {
    let rates: Vec<String> = rates.iter().map(|rate| format!("{rate:.1}")).collect();
    rates.join(separator)
}

/// The percentiles with one decimal, or dashes.
fn millis(percentiles: Option<Percentiles>) -> (String, String) {
    percentiles.map_or_else(
        || ("–".to_owned(), "–".to_owned()),
        |p| (format!("{:.1}", p.p50_ms), format!("{:.1}", p.p95_ms)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(configuration: &str, clients: usize, tokens_per_second: f64) -> Level {
        Level {
            configuration: configuration.into(),
            clients,
            figures: LevelFigures {
                requests: 2 * clients,
                completion_tokens: 100,
                wall_seconds: 1.0,
                tokens_per_second,
                pass_tokens_per_second: vec![tokens_per_second],
                time_to_first_token: Percentiles::of(&[std::time::Duration::from_millis(30)]),
                time_per_output_token: None,
                generation_tokens_per_second: tokens_per_second + 10.0,
            },
            identical: true,
        }
    }

    fn settings(server: &str) -> ServerSettings {
        ServerSettings {
            server: server.into(),
            model: None,
            slots: Some(2),
            threads: Some(1),
            prompt_style: "chat",
            requests_per_client: 2,
            passes: 2,
            max_tokens_cap: None,
        }
    }

    #[test]
    fn rows_compare_with_plain_at_the_same_clients_and_with_one_client() {
        let driven = Driven {
            levels: vec![
                level("plain", 1, 100.0),
                level("plain", 2, 150.0),
                level("lookup cost K≤24", 1, 200.0),
                level("lookup cost K≤24", 2, 240.0),
            ],
            differences: Vec::new(),
            references: Vec::new(),
        };
        let runs = [
            ("plain".to_owned(), 110.0),
            ("lookup cost K≤24".to_owned(), 200.0),
        ];
        let report = ServeReport::new(
            settings(IN_PROCESS),
            driven,
            &runs,
            Vec::new(),
            "greedy".into(),
        );
        let ratios: Vec<(Option<f64>, Option<f64>)> = report
            .rows
            .iter()
            .map(|r| (r.over_plain, r.over_one_client))
            .collect();
        assert_eq!(
            ratios,
            [
                (None, Some(1.0)),
                (None, Some(1.5)),
                (Some(2.0), Some(1.0)),
                (Some(1.6), Some(1.2))
            ]
        );
        let single = &report.single_stream[0];
        assert_eq!(single.serve_tokens_per_second, Some(110.0), "{single:?}");
        assert!(
            (single.serve_over_run.expect("both measured") - 1.0).abs() < 1e-9,
            "{single:?}"
        );
        let markdown = report.markdown();
        assert!(
            markdown.contains(
                "| lookup cost K≤24 | 2 | 4 | 240.0 | 240.0 | 1.60x | 1.20x | 30.0 | 30.0 | – | – | yes |"
            ),
            "{markdown}"
        );
        let csv = report.csv();
        assert!(
            csv.lines()
                .nth(3)
                .is_some_and(|line| line.starts_with("lookup cost K≤24,1,")),
            "labels without commas stay bare: {csv}"
        );
        assert!(
            csv.contains(",240.000,240.0,1.6000,1.2000,"),
            "each pass's tok/s in one field: {csv}"
        );
        assert!(report.outputs_match);
    }

    #[test]
    fn the_plain_ratio_pairs_each_pass_with_plain_decoding_interpolated_to_when_it_ran() {
        let with_passes = |rates: &[f64]| {
            let mut level = level("any", 4, 0.0);
            level.figures.pass_tokens_per_second = rates.to_vec();
            level.figures.tokens_per_second = Summary::of(rates).expect("rates").median;
            level.figures
        };
        // A machine slowing down by 10% a cycle, the cascade 10% faster than plain decoding
        // halfway through each: over the plain pass just before it, it would seem 4.4% faster.
        let plain = with_passes(&[100.0, 90.0, 81.0]);
        let halfway = |pass: i32| 110.0 * 0.9f64.powf(f64::from(pass) + 0.5);
        let cascade = with_passes(&[halfway(0), halfway(1), 1.1 * 81.0]);
        let paired = paired_speedup(&cascade, &plain, 0.5).expect("both timed");
        assert!((paired - 1.1).abs() < 1e-9, "{paired}");
        // A third row, two thirds of the way through each cycle.
        let third = |pass: i32| 110.0 * 0.9f64.powf(f64::from(pass) + 2.0 / 3.0);
        let later = with_passes(&[third(0), third(1), third(2)]);
        let paired = paired_speedup(&later, &plain, 2.0 / 3.0).expect("both timed");
        assert!((paired - 1.1).abs() < 1e-9, "{paired}");
        // Passes that do not pair up: the ratio of the medians.
        let fewer = with_passes(&[81.0, 99.0]);
        let unpaired = paired_speedup(&fewer, &plain, 0.5).expect("both timed");
        assert!((unpaired - 1.0).abs() < 1e-9, "{unpaired}");
        assert_eq!(
            paired_speedup(&cascade, &with_passes(&[100.0, 0.0, 120.0]), 0.5),
            None
        );
    }

    #[test]
    fn each_row_is_compared_with_plain_decoding_where_it_ran_in_the_cycle() {
        let with_passes = |configuration: &str, rates: [f64; 2]| {
            let mut level = level(configuration, 2, rates[0]);
            level.figures.pass_tokens_per_second = rates.to_vec();
            level
        };
        // Plain decoding at 90 then 120 tok/s, both cascades decoding as fast as it: the
        // second row ran a third of the way from one plain pass to the next, the third two
        // thirds (the second pass of each, after the last plain pass, meets 120 alone).
        let interpolated = |share: f64| 90f64.powf(1.0 - share) * 120f64.powf(share);
        let driven = Driven {
            levels: vec![
                with_passes("plain", [90.0, 120.0]),
                with_passes("lookup", [interpolated(1.0 / 3.0), 120.0]),
                with_passes("suffix", [interpolated(2.0 / 3.0), 120.0]),
            ],
            differences: Vec::new(),
            references: Vec::new(),
        };
        let report = ServeReport::new(
            settings(IN_PROCESS),
            driven,
            &[],
            Vec::new(),
            "greedy".into(),
        );
        for row in &report.rows[1..] {
            let ratio = row.over_plain.expect("paired");
            assert!(
                (ratio - 1.0).abs() < 1e-9,
                "{}: {ratio}",
                row.level.configuration
            );
        }
    }

    #[test]
    fn a_running_server_has_no_plain_ratio_and_a_difference_fails_the_report() {
        let difference = Difference {
            configuration: "llama-server".into(),
            clients: 2,
            pass: 1,
            workload: "extract".into(),
            request: "e1".into(),
            first_difference: 7,
            expected_chars: 20,
            generated_chars: 21,
        };
        let driven = Driven {
            levels: vec![
                level("llama-server", 1, 100.0),
                level("llama-server", 2, 180.0),
            ],
            differences: vec![difference],
            references: Vec::new(),
        };
        let report = ServeReport::new(
            settings("127.0.0.1:8080"),
            driven,
            &[],
            Vec::new(),
            "greedy".into(),
        );
        assert_eq!(report.rows[1].over_plain, None);
        assert_eq!(report.rows[1].over_one_client, Some(1.8));
        assert!(!report.outputs_match);
        let markdown = report.markdown();
        assert!(
            markdown.contains(
                "DIFFERS: llama-server at 2 client(s), pass 1, request `e1` of `extract`: from character 7"
            ),
            "{markdown}"
        );
        assert!(report.single_stream.is_empty());
    }
}
