//! Flags of the tool subcommands: `suffix warm`, `models quantize` and `info`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;

use super::common::{PlacementArgs, resolve_model};
use super::env::{env_plugin_dirs, openmp_env};
use super::error::ConfigError;
use super::file::FileRun;
use crate::engine::SessionParams;
use crate::models::{EmbeddingsType, QuantType, QuantizeRequest, default_output};
use crate::placement::{Plan, Topology};
use crate::plugins::{SourceSpec, parse_cascade};

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
    /// Validates the flags into a [`WarmConfig`](WarmConfig).
    pub fn into_config(self, cache_dir: &Path) -> Result<WarmConfig, ConfigError> {
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
        Ok(WarmConfig {
            model: resolve_model(self.model, cache_dir)?,
            plugin: plugins.remove(0),
            plugin_config: self.plugin_config.join(","),
            plugin_dirs,
            corpus: self.corpus,
            out: self.out,
        })
    }
}

/// What `spechost suffix warm` needs.
#[derive(Debug, Clone)]
pub struct WarmConfig {
    /// The model whose tokenizer turns the corpus into tokens (the target it will serve).
    pub model: PathBuf,
    /// The drafter to warm (`suffix` or a component path).
    pub plugin: SourceSpec,
    /// Its settings, `key=value,...`.
    pub plugin_config: String,
    /// Extra directories searched for built-in plugins.
    pub plugin_dirs: Vec<PathBuf>,
    /// The corpus file.
    pub corpus: PathBuf,
    /// Where the state blob is written (read first if it exists: warming adds to it).
    pub out: PathBuf,
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
        let input = resolve_model(Some(self.model), cache_dir)?;
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

/// Flags of `spechost info`.
#[derive(Debug, Args, Default)]
pub struct InfoArgs {
    /// The placement to plan, as for `run`.
    #[command(flatten)]
    pub placement: PlacementArgs,
    /// Also describe this model (a .gguf path or a default model name): its architecture,
    /// its metadata keys, its experts (for `--experts`), and how speculation runs on it.
    #[arg(long, short = 'm')]
    pub model: Option<String>,
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
    /// The model to describe, if any.
    pub model: Option<PathBuf>,
}

impl InfoArgs {
    /// Reads this machine's layout and plans the placement the flags ask for.
    pub fn into_config(self, cache_dir: &Path) -> Result<InfoConfig, ConfigError> {
        let plan = self.placement.plan(&FileRun::default())?;
        let model = self
            .model
            .map(|model| resolve_model(Some(model), cache_dir))
            .transpose()?;
        Ok(InfoConfig {
            topology: Topology::read_host()?,
            plan,
            openmp_env: openmp_env(),
            json: self.json,
            model,
        })
    }
}
