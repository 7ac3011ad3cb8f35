//! `spechost plugin bench FILE.wasm`: replays a trace (the bundled one by default) through the
//! drafter alone and behind `lookup`, beside `lookup` alone, and prints each one's acceptance,
//! accepted tokens per draft round and ideal speedup by the trace's verify cost curve: whether
//! the drafter would pay, in seconds and without a model. It is [`simulate`] with the cascades
//! chosen for the author.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::bench::simulate::{SimulationReport, simulate};
use crate::cascade::CascadeMode;
use crate::config::SimulateConfig;
use crate::plugins::SourceSpec;

/// The built-in drafter the plugin is compared with and put behind.
const REFERENCE: &str = "lookup";

/// What `plugin bench` is asked to do.
#[derive(Debug, Clone)]
pub struct PluginBenchOptions {
    /// The drafter's `.wasm` file.
    pub plugin: PathBuf,
    /// The trace to replay.
    pub trace: PathBuf,
    /// How the trace is named in the output.
    pub trace_name: String,
    /// The drafter's configuration string.
    pub config: String,
    /// Draft lengths to replay with.
    pub max_draft_lens: Vec<usize>,
    /// Where to write simulation.md and simulation.json, if anywhere.
    pub out: Option<PathBuf>,
}

/// The cascades replayed: the reference, the plugin alone, the plugin behind the reference.
pub fn cascades(plugin: &Path) -> Vec<Vec<SourceSpec>> {
    let reference = SourceSpec::Builtin(REFERENCE.to_owned());
    let drafter = SourceSpec::Path(plugin.to_owned());
    vec![
        vec![reference.clone()],
        vec![drafter.clone()],
        vec![reference, drafter],
    ]
}

/// Replays the trace; returns the report and how long the replays took.
pub fn bench(
    options: &PluginBenchOptions,
    cache_dir: &Path,
) -> anyhow::Result<(SimulationReport, std::time::Duration)> {
    let name = SourceSpec::Path(options.plugin.clone()).name();
    anyhow::ensure!(
        name != REFERENCE,
        "the plugin file is named like the built-in `{REFERENCE}` it is compared with; rename the .wasm file"
    );
    let plugin_configs = if options.config.is_empty() {
        BTreeMap::new()
    } else {
        BTreeMap::from([(name, options.config.clone())])
    };
    let config = SimulateConfig {
        trace: options.trace.clone(),
        cascades: cascades(&options.plugin),
        max_draft_lens: options.max_draft_lens.clone(),
        cascade_modes: vec![CascadeMode::First],
        plugin_configs,
        plugin_dirs: Vec::new(),
        out: options.out.clone(),
    };
    let started = Instant::now();
    let report = simulate(&config, cache_dir)?;
    Ok((report, started.elapsed()))
}

/// Runs the bench and prints the table (and writes the files of `--out`).
pub fn run(options: &PluginBenchOptions, cache_dir: &Path) -> anyhow::Result<()> {
    let (report, took) = bench(options, cache_dir)?;
    println!(
        "spechost plugin bench {} on trace {} (recorded from {}), greedy; `ideal speedup` counts drafting as free and verification by the trace's cost curve\n",
        options.plugin.display(),
        options.trace_name,
        report.model.display()
    );
    print!("{}", report.markdown_table());
    println!("\nreplayed in {:.2} s", took.as_secs_f64());
    if let Some(out) = &options.out {
        crate::bench::simulate::write_files(&report, out)?;
        eprintln!("results written to {}", out.display());
    }
    Ok(())
}
