//! Flags of `spechost run`, merged over the TOML file into a [`RunConfig`].

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use clap::Args;

use super::common::{
    DEFAULT_MAX_TOKENS, SamplingArgs, SpeculationArgs, StackSettings, TargetArgs,
    check_plugin_settings_target_cascade, draft_settings, merge_plugin_settings, resolve_model,
    session_params,
};
use super::error::ConfigError;
use super::file::{FileConfig, read_file_config, table_to_plugin_config};
use crate::cascade::CascadeMode;
use crate::engine::{DEFAULT_TREE_LEAVES, SamplingParams, SessionParams, StopStrings};
use crate::plugins::{PolicySpec, SourceSpec, parse_policy};

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
    /// The cascade, its policy and mode, the draft length.
    #[command(flatten)]
    pub speculation: SpeculationArgs,
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// Sampling.
    #[command(flatten)]
    pub sampling: SamplingArgs,
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

/// Everything `spechost run` needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The target, its threads and pinning, the draft model and where plugins come from.
    pub stack: StackSettings,
    /// The prompt text.
    pub prompt: String,
    /// Whether to skip the chat template.
    pub raw: bool,
    /// Draft sources in order (empty: plain decoding).
    pub cascade: Vec<SourceSpec>,
    /// Per-plugin configuration strings (`key=value,key=value`), by source name.
    pub plugin_configs: BTreeMap<String, String>,
    /// Where plugins' cross-request state is kept, if anywhere.
    pub state_dir: Option<PathBuf>,
    /// The draft-length policy.
    pub policy: PolicySpec,
    /// How the cascade picks a draft.
    pub cascade_mode: CascadeMode,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Most draft tokens per round.
    pub max_draft_len: usize,
    /// Sampling settings.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: StopStrings,
    /// llama.cpp context settings; `threads` is the plan's.
    pub session: SessionParams,
    /// Stats as JSON.
    pub json: bool,
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

        let model_name = self.target.model.clone().or(run.model.clone());
        let model = resolve_model(model_name.clone(), cache_dir)?;

        let speculation = self.speculation.resolve(&run)?;
        check_plugin_settings_target_cascade(&self.target.plugin_config, &speculation.cascade)?;
        let policy = parse_policy(&speculation.policy)?;

        let max_tokens = self
            .max_tokens
            .or(run.max_tokens)
            .unwrap_or(DEFAULT_MAX_TOKENS);
        if max_tokens == 0 {
            return Err(ConfigError::ZeroMaxTokens);
        }
        let mut session = session_params(placement.threads, self.target.ctx_size.or(run.ctx_size))?;
        session.max_draft_len = speculation.max_draft_len;
        if speculation.cascade_mode == CascadeMode::Tree {
            session.tree_leaves = DEFAULT_TREE_LEAVES;
        }
        let draft = draft_settings(
            self.target.draft_model.clone().or(run.draft_model.clone()),
            self.target.draft_threads.or(run.draft_threads),
            self.target.draft_overrides()?,
            model_name.as_deref(),
            &session,
            &placement,
            cache_dir,
        )?;
        let sampling = self.sampling.resolve(&run, self.seed.or(run.seed))?;
        let stop = StopStrings::new(run.stop.into_iter().chain(self.stop))?;
        let prompt = read_prompt(self.prompt, self.prompt_file.as_deref())?;
        Ok(RunConfig {
            stack: StackSettings {
                model,
                target: self.target.target_params(&placement)?,
                plugin_dirs: self.target.plugin_dirs(),
                placement,
                draft,
            },
            prompt,
            raw: self.raw,
            cascade: speculation.cascade,
            plugin_configs,
            state_dir: self.target.state_dir.clone().or(run.state_dir),
            policy,
            cascade_mode: speculation.cascade_mode,
            max_tokens,
            max_draft_len: speculation.max_draft_len,
            sampling,
            stop,
            session,
            json: self.json,
        })
    }
}

pub(super) fn read_prompt(
    prompt: Option<String>,
    file: Option<&Path>,
) -> Result<String, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn zero_draft_max_is_an_error_naming_the_fix() {
        let args = RunArgs {
            prompt: Some("hi".into()),
            speculation: SpeculationArgs {
                max_draft_len: Some(0),
                ..SpeculationArgs::default()
            },
            ..RunArgs::default()
        };
        let err = args.into_config(Path::new("/tmp")).expect_err("K=0");
        assert!(err.to_string().contains("--cascade none"), "got {err}");
    }
}
