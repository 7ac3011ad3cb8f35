//! `spechost bench`: plain decoding and cascade configurations on the same workload requests,
//! in one process with one loaded target, greedy or at a temperature (each request at its own
//! seed, so every output still equals plain decoding's).
//!
//! In order:
//! 1. [`Workload::read`] parses each JSONL file into typed requests (a bad line is an error
//!    naming the file and line);
//! 2. [`measure`] loads the plugins, the target and one session, tokenizes every request,
//!    measures each workload's verify cost curve ([`VerifyCosts`]), and runs the passes: plain
//!    decoding (the baseline and the reference output) and each cascade with each draft
//!    length, one long-lived cascade per configuration and pass, checking every output against
//!    plain decoding token for token;
//! 3. each request's plain output is checked for [`Degeneracy`] (an echo of the prompt, a
//!    loop): such requests stay out of the headline [`Totals`], since prompt lookup predicts
//!    them trivially, and stay in `requests.csv`;
//! 4. [`Report::new`] turns the per-pass [`Totals`] into medians, speedups, acceptance, shares
//!    of time, and the ideal speedup and efficiency by the cost curve;
//! 5. [`run`] prints the markdown table on stdout, writes `results.md`, `results.csv`,
//!    `requests.csv`, `results.json`, `speedup.svg` and `acceptance-by-position.svg` into
//!    `--out`, and fails when any output differed from plain decoding.
//!
//! With `--clients`, [`serve`] measures `spechost serve` instead: concurrent clients over
//! HTTP, plain decoding and each cascade at each client count, next to the same requests
//! decoded through the engine.
//!
//! Beside the benchmark: [`trace`] records the target's greedy output on workloads once,
//! [`simulate`] replays it through cascades without the model (acceptance in seconds), and
//! [`prompts`] writes the exact prompt text for running llama.cpp's tools on it
//! (`bench/peers.sh`), and [`check_outputs`] flags those tools' degenerate answers by bench's
//! rule. [`VerifyCosts`] is the ceiling every speedup is compared with.
//!
//! Not here: flags (`config::BenchArgs`), the verify loop (`engine`), drafting (`cascade`,
//! `plugins`).

mod ceiling;
mod chart;
pub mod check_outputs;
mod degenerate;
mod prepare;
pub mod prompts;
mod report;
mod runner;
pub mod serve;
pub mod simulate;
mod stats;
pub mod trace;
mod workload;

use std::path::Path;

use anyhow::Context as _;

pub use self::ceiling::{VerifyCostPoint, VerifyCosts, points_markdown};
pub use self::chart::{acceptance_svg, speedup_svg};
pub use self::degenerate::{Degeneracy, ECHO_WORDS, LOOP_MIN_TOKENS, LOOP_REPEATS};
pub use self::prepare::{Prepared, TokenLimits, choose_prompt, prepare, resolve_prompt_style};
pub use self::report::{
    ConfigurationReport, Report, SourceReport, VerifyCostReport, WorkloadReport,
};
pub use self::runner::{
    Configuration, DegenerateRequest, Measurements, Mismatch, RequestRow, WorkloadRun, measure,
    measure_workloads,
};
pub use self::stats::{Summary, Totals, acceptance_by_position, percentile, speedup};
pub use self::workload::{
    ChatMessage, Completion, Prompt, Workload, WorkloadError, WorkloadRequest,
};

use crate::config::BenchConfig;

/// File names written into `--out`.
pub const RESULTS_MARKDOWN: &str = "results.md";
/// See [`RESULTS_MARKDOWN`].
pub const RESULTS_CSV: &str = "results.csv";
/// See [`RESULTS_MARKDOWN`].
pub const REQUESTS_CSV: &str = "requests.csv";
/// See [`RESULTS_MARKDOWN`].
pub const RESULTS_JSON: &str = "results.json";
/// See [`RESULTS_MARKDOWN`].
pub const SPEEDUP_SVG: &str = "speedup.svg";
/// See [`RESULTS_MARKDOWN`].
pub const ACCEPTANCE_SVG: &str = "acceptance-by-position.svg";

/// Measures, prints the tables (per workload, then the mixed set), writes the result files; an
/// error when any greedy output differed from plain decoding (after everything is written, so
/// the evidence is kept). With `--clients`, the server benchmark ([`serve::run`]) instead.
pub fn run(config: &BenchConfig, cache_dir: &Path) -> anyhow::Result<()> {
    if let Some(serve) = &config.serve {
        return serve::run(config, serve, cache_dir);
    }
    let measurements = measure(config, cache_dir)?;
    let report = Report::new(config, measurements);
    print!("{}", report.markdown_table());
    let mixed = report.mixed_markdown();
    if !mixed.is_empty() {
        print!("\n{mixed}");
    }
    if let Some(out) = &config.out {
        write_outputs(&report, out)?;
        eprintln!("results written to {}", out.display());
    }
    if !report.outputs_match {
        anyhow::bail!(
            "{} output(s) differ from plain decoding (listed above{}); speculation must never change the output of a request (greedy, or sampled at its seed)",
            report.mismatches.len(),
            if config.out.is_some() {
                " and in results.md"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// Writes every result file of `report` into `dir`, creating it.
pub fn write_outputs(report: &Report, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let charts = [
        ("speedup by configuration", SPEEDUP_SVG),
        ("acceptance by draft position", ACCEPTANCE_SVG),
    ];
    let json = serde_json::to_string_pretty(report).context("serialising the results")?;
    let files = [
        (RESULTS_MARKDOWN, report.markdown(&charts)),
        (RESULTS_CSV, report.csv()),
        (REQUESTS_CSV, report.requests_csv()),
        (RESULTS_JSON, json + "\n"),
        (SPEEDUP_SVG, speedup_svg(report)?),
        (ACCEPTANCE_SVG, acceptance_svg(report)?),
    ];
    for (name, contents) in files {
        let path = dir.join(name);
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
