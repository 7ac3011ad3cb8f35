//! [`run`]: `bench --clients` from the flags to the report, in-process or against `--url`.
//!
//! In-process, in order: half the passes of the one-client level's requests through the engine
//! (the single-stream comparison, which also resolves `--prompt-style auto` from the model); then
//! the server on this thread (decoding must run on the process's main thread: GNU OpenMP is slow
//! otherwise, see `server::startup`) while the clients run on a thread of their own with their
//! own tokio runtime, and stop the server once the one-client level is done (or failed); then
//! the comparison's other passes through the engine; then the server again for the other levels,
//! their answers checked against the first server's references.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, mpsc};

use anyhow::Context as _;
use tokio::sync::Notify;

use super::super::prepare::TokenLimits;
use super::super::report::sampling_label;
use super::super::runner::{Configuration, measure_workloads};
use super::super::workload::Workload;
use super::levels::{Driven, Levels, Reference, drive};
use super::plan::{Row, plan_requests};
use super::report::{IN_PROCESS, ServeReport, ServerSettings};
use super::single_stream::OneClientShare;
use crate::config::{BenchConfig, BenchServer, PromptStyle, ServeBenchConfig, ServeConfig};
use crate::server::{Embedding, serve_embedded};

/// Measures every level, prints the table, writes the result files; an error when any answer
/// differed from its reference (after everything is written, so the evidence is kept).
pub fn run(config: &BenchConfig, serve: &ServeBenchConfig, cache_dir: &Path) -> anyhow::Result<()> {
    let workloads = Workload::read_all(&config.workloads)?;
    let limits = TokenLimits {
        default_max_tokens: config.default_max_tokens,
        max_tokens_cap: config.max_tokens_cap,
    };
    let mut settings = ServerSettings {
        server: IN_PROCESS.to_owned(),
        model: None,
        slots: None,
        threads: None,
        prompt_style: style_name(config.prompt_style),
        requests_per_client: serve.requests_per_client,
        passes: config.repeat,
        max_tokens_cap: config.max_tokens_cap,
    };
    let report = match &serve.server {
        BenchServer::InProcess(serve_config) => {
            let total = workloads.iter().map(|w| w.requests.len()).sum();
            let share = OneClientShare::new(total, serve.requests_per_client);
            let (before, after) = bracketing_passes(config.repeat);
            let run_passes = |repeat: usize| {
                let config = BenchConfig {
                    repeat,
                    ..config.clone()
                };
                measure_workloads(&config, share.workloads(&workloads), cache_dir)
                    .context("decoding the one-client requests through the engine")
            };
            let mut measurements = run_passes(before)?;
            let requests = plan_requests(
                &workloads,
                config.prompt_style,
                measurements.prompt_style,
                &limits,
                &config.sampling,
            )?;
            let rows: Vec<Row> = Configuration::all(config).iter().map(Row::of).collect();
            let levels = |client_counts| Levels {
                requests: &requests,
                rows: &rows,
                client_counts,
                requests_per_client: serve.requests_per_client,
                passes: config.repeat,
            };
            // The one-client level alone between the comparison's two halves, so that `run`
            // and `serve` are measured minutes apart, not the whole run apart; the server is
            // started again for the other levels.
            let (bracketed, rest) = bracketed_levels(&serve.client_counts);
            let mut driven = drive_in_process(serve_config, cache_dir, levels(bracketed), &[])?;
            if after > 0 {
                measurements.append_passes(run_passes(after)?, config.warmup);
            }
            if !rest.is_empty() {
                let later =
                    drive_in_process(serve_config, cache_dir, levels(rest), &driven.references)?;
                driven.extend(later, &rows);
            }
            settings.model = Some(serve_config.stack.model.clone());
            settings.slots = Some(serve_config.parallel);
            settings.threads = Some(serve_config.session.threads);
            settings.prompt_style = style_name(measurements.prompt_style);
            let run_rates = share.run_rates(&workloads, &measurements);
            ServeReport::new(
                settings,
                driven,
                &run_rates,
                measurements.mismatches,
                sampling_label(&config.sampling),
            )
        }
        BenchServer::Running { address, label } => {
            let requests = plan_requests(
                &workloads,
                config.prompt_style,
                config.prompt_style,
                &limits,
                &config.sampling,
            )?;
            let rows = [Row::running(label)];
            let driven = drive(
                &address.authority,
                Levels {
                    requests: &requests,
                    rows: &rows,
                    client_counts: &serve.client_counts,
                    requests_per_client: serve.requests_per_client,
                    passes: config.repeat,
                },
                &[],
            )?;
            settings.server.clone_from(&address.authority);
            ServeReport::new(
                settings,
                driven,
                &[],
                Vec::new(),
                sampling_label(&config.sampling),
            )
        }
    };
    print!("{}", report.markdown());
    if let Some(out) = &config.out {
        report.write(out)?;
        eprintln!("results written to {}", out.display());
    }
    if !report.outputs_match {
        anyhow::bail!(
            "{} answer(s) differ from their reference (listed above); a request's output (greedy, or sampled at its seed) must not depend on concurrency or speculation",
            report.differences.len() + report.run_mismatches.len()
        );
    }
    Ok(())
}

/// The client counts (ascending) measured between the single-stream comparison's halves, and
/// those measured after it: the one-client level alone when there is one and others besides,
/// every level otherwise.
fn bracketed_levels(client_counts: &[usize]) -> (&[usize], &[usize]) {
    match client_counts {
        [1, _, ..] => client_counts.split_at(1),
        _ => (client_counts, &[]),
    }
}

/// How many of `repeat` passes of the single-stream comparison decode before the server's
/// one-client level and how many after: split around it, so that a shared machine's slower or
/// faster minutes during a run weigh on `run`'s passes as on `serve`'s (one pass goes before,
/// alone).
fn bracketing_passes(repeat: usize) -> (usize, usize) {
    let before = repeat.div_ceil(2);
    (before, repeat - before)
}

/// Runs the server on this thread and the clients on another until the clients are done.
/// Answers are checked against `earlier` references too.
fn drive_in_process(
    serve_config: &ServeConfig,
    cache_dir: &Path,
    levels: Levels<'_>,
    earlier: &[Reference],
) -> anyhow::Result<Driven> {
    let (listening, address) = mpsc::channel::<SocketAddr>();
    let stop = Arc::new(Notify::new());
    std::thread::scope(|scope| {
        let stop_when_done = StopOnDrop(Arc::clone(&stop));
        let clients = std::thread::Builder::new()
            .name("bench-clients".into())
            .spawn_scoped(scope, move || {
                // Stops the server however the clients end, panics included.
                let _stop = stop_when_done;
                let address = address
                    .recv()
                    .context("the in-process server stopped before it listened")?;
                drive(&address.to_string(), levels, earlier)
            })
            .context("starting the clients' thread")?;
        let served = serve_embedded(serve_config, cache_dir, Embedding { listening, stop });
        let driven = clients
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the clients' thread panicked")));
        served.context("running the in-process server")?;
        driven
    })
}

/// Notifies the server to stop when dropped.
struct StopOnDrop(Arc<Notify>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        // A permit is kept when the server is not waiting yet.
        self.0.notify_one();
    }
}

/// `chat` or `raw`.
fn style_name(style: PromptStyle) -> &'static str {
    match style {
        PromptStyle::Raw => "raw",
        PromptStyle::Chat | PromptStyle::Auto => "chat",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_client_level_is_bracketed_alone_when_others_follow() {
        assert_eq!(bracketed_levels(&[1, 2, 4, 8]), (&[1][..], &[2, 4, 8][..]));
        assert_eq!(bracketed_levels(&[1]), (&[1][..], &[][..]));
        assert_eq!(bracketed_levels(&[2, 4]), (&[2, 4][..], &[][..]));
    }
}
