//! Flags of `spechost plugin new`, `plugin check` and `plugin bench`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use super::bench::check_max_draft_lens;
use super::common::check_max_draft_len;
use super::error::ConfigError;
use crate::authoring::bench::PluginBenchOptions;
use crate::authoring::check::{CheckOptions, DEFAULT_REQUESTS_PER_WORKLOAD};
use crate::authoring::scaffold::{Lang, NewPlugin, built_sdk};
use crate::authoring::trace::{trace_file, trace_name};
use crate::engine::DEFAULT_MAX_DRAFT_LEN;
use crate::plugins::{PluginKind, SandboxLimits};

/// `spechost plugin ...`
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Make a plugin project (a drafter or a policy, in Rust or Python) that builds with one
    /// command and loads in `spechost run` unchanged.
    New(NewArgs),
    /// Run the conformance suite on a plugin: it links against this host, handles its config,
    /// stays valid, within time and memory, deterministic and restorable over a recorded trace.
    /// Exits with 1 when a check fails.
    Check(CheckArgs),
    /// Replay a recorded trace through a drafter, alone and behind `lookup`: acceptance, tokens
    /// accepted per round and the ideal speedup, in seconds and without a model.
    Bench(PluginBenchArgs),
}

/// The kinds of plugin `plugin new` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// A draft source (`--cascade`).
    Drafter,
    /// A draft-length policy (`--policy`).
    Policy,
}

/// The languages `plugin new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LangArg {
    /// A crate on spechost-sdk, built for wasm32-wasip2.
    Rust,
    /// A Python module, built into a component by componentize-py.
    Python,
}

/// Flags of `spechost plugin new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The project's name (its directory, crate and .wasm file): lowercase letters, digits,
    /// `-` and `_`.
    pub name: String,
    /// What kind of plugin.
    #[arg(long, value_enum, default_value = "drafter")]
    pub kind: KindArg,
    /// The language.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: LangArg,
    /// Where to create the project directory.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The spechost-sdk crate a Rust project depends on: the `sdk/` folder of a spechost
    /// checkout or an unpacked `cargo package -p spechost-sdk` (default: the SDK this binary
    /// was built from).
    #[arg(long, value_name = "DIR")]
    pub sdk: Option<PathBuf>,
}

impl NewArgs {
    /// Validates the flags into a [`NewPlugin`].
    pub fn into_config(self) -> Result<NewPlugin, ConfigError> {
        let lang = match self.lang {
            LangArg::Rust => Lang::Rust,
            LangArg::Python => Lang::Python,
        };
        let sdk = match (self.sdk, lang) {
            (Some(sdk), _) => sdk,
            (None, Lang::Python) => PathBuf::new(),
            (None, Lang::Rust) => built_sdk().ok_or(ConfigError::NoSdk)?,
        };
        Ok(NewPlugin {
            name: self.name,
            kind: match self.kind {
                KindArg::Drafter => PluginKind::Drafter,
                KindArg::Policy => PluginKind::Policy,
            },
            lang,
            dir: self.dir,
            sdk,
        })
    }
}

/// Flags of `spechost plugin check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plugin's .wasm file.
    pub plugin: PathBuf,
    /// A trace recorded by `spechost trace` (default: the one bundled with spechost, the default
    /// model on the example workloads).
    #[arg(long, value_name = "TRACE.jsonl")]
    pub trace: Option<PathBuf>,
    /// The plugin's settings for the replays, `key=value,...` as in `--plugin-config`.
    #[arg(long, default_value = "")]
    pub config: String,
    /// Requests of each workload of the trace to replay.
    #[arg(long, default_value_t = DEFAULT_REQUESTS_PER_WORKLOAD)]
    pub requests: usize,
    /// Draft length asked of a drafter each round (a policy's max-draft-len).
    #[arg(long = "draft-max", default_value_t = DEFAULT_MAX_DRAFT_LEN)]
    pub max_draft_len: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl CheckArgs {
    /// Validates the flags into [`CheckOptions`]; writes the bundled trace into the cache when
    /// none is given.
    pub fn into_config(self, cache_dir: &Path) -> Result<(CheckOptions, bool), ConfigError> {
        if self.requests == 0 {
            return Err(ConfigError::ZeroRequests);
        }
        check_max_draft_len(self.max_draft_len)?;
        let trace = trace_file(self.trace.as_deref(), cache_dir).map_err(ConfigError::Trace)?;
        let options = CheckOptions {
            trace_name: trace_name(self.trace.as_deref()),
            trace,
            plugin: self.plugin,
            config: self.config,
            requests_per_workload: self.requests,
            max_draft_len: self.max_draft_len,
            limits: SandboxLimits::default(),
            cache_dir: Some(cache_dir.to_owned()),
        };
        Ok((options, self.json))
    }
}

/// Flags of `spechost plugin bench`.
#[derive(Debug, Args)]
pub struct PluginBenchArgs {
    /// The drafter's .wasm file.
    pub plugin: PathBuf,
    /// A trace recorded by `spechost trace` (default: the bundled one).
    #[arg(long, value_name = "TRACE.jsonl")]
    pub trace: Option<PathBuf>,
    /// The drafter's settings, `key=value,...` as in `--plugin-config`.
    #[arg(long, default_value = "")]
    pub config: String,
    /// Draft lengths (K) to replay with, comma-separated (default: 8).
    #[arg(long = "draft-max", value_name = "K,K,...", value_delimiter = ',')]
    pub max_draft_lens: Vec<usize>,
    /// Directory for simulation.md and simulation.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl PluginBenchArgs {
    /// Validates the flags into [`PluginBenchOptions`]; writes the bundled trace into the
    /// cache when none is given.
    pub fn into_config(self, cache_dir: &Path) -> Result<PluginBenchOptions, ConfigError> {
        let max_draft_lens = check_max_draft_lens(self.max_draft_lens)?;
        let trace = trace_file(self.trace.as_deref(), cache_dir).map_err(ConfigError::Trace)?;
        Ok(PluginBenchOptions {
            trace_name: trace_name(self.trace.as_deref()),
            trace,
            plugin: self.plugin,
            config: self.config,
            max_draft_lens,
            out: self.out,
        })
    }
}
