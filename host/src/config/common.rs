//! Flags and checks shared by several commands: where the compute threads run
//! ([`PlacementArgs`]), the target and its plugins ([`TargetArgs`]), sampling ([`SamplingArgs`]),
//! the draft model, and the one check of a draft length.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;

use super::env::env_plugin_dirs;
use super::error::ConfigError;
use super::file::FileRun;
use crate::cascade::CascadeMode;
use crate::engine::{
    self, ChatTemplateChoice, DEFAULT_MAX_DRAFT_LEN, DraftAcceptance, DraftModelConfig,
    MAX_DRAFT_LEN_LIMIT, MaxDraftLenError, ModelOverrides, OverrideError, SamplingParams,
    SessionParams, TargetParams,
};
use crate::models::{DefaultDraft, DefaultModel, target_variant};
use crate::placement::{CpuList, NumaMode, PlacementRequest, Plan, Topology};
use crate::plugins::{SourceSpec, parse_cascade, parse_policy};

/// Default number of tokens to generate.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Smallest accepted context size.
pub const MIN_CTX_SIZE: u32 = 16;

/// The default `--policy`: the one that weighs expected accepted tokens against the target's
/// measured verify cost, so it drafts only what pays and falls back to plain decoding (with
/// shadow drafts to notice when speculation would pay again) when nothing does. On CPU the
/// verify batch is far from free (on 2 cores, 9 tokens cost ~5x one on SmolLM2-135M), which is
/// what acceptance-threshold controllers like `window` do not see.
pub const DEFAULT_POLICY: &str = "cost";

/// The speculation flags of `run` and `serve`: which sources draft, how the cascade picks a
/// draft, which policy chooses each round's length, and the most it may choose.
#[derive(Debug, Args, Default, Clone)]
pub struct SpeculationArgs {
    /// Draft sources in order, comma-separated: built-in names or paths to .wasm components;
    /// `none` decodes without speculation (default: lookup). For `serve`, the default of
    /// requests, which may choose other loaded plugins by name.
    #[arg(long, short = 'c')]
    pub cascade: Option<String>,
    /// Draft-length policy: a built-in (cost, window, fixed, heuristic, content) or a .wasm
    /// path, then its settings: `window,raise=0.85,window=64` (default: cost).
    #[arg(long)]
    pub policy: Option<String>,
    /// How the cascade picks a draft: `first` (first source with a proposal, in order),
    /// `scored` (highest expected accepted length; the draft model only when others fall short)
    /// or `tree` (as `scored`, with the other proposals verified beside it as branches of a
    /// tree of at most the draft length; `run` and `bench` only, a server verifies chains).
    #[arg(long)]
    pub cascade_mode: Option<String>,
    /// Most draft tokens verified per round (K, default 24); the policy chooses up to this
    /// many. For `serve`, also the most a request may ask for.
    #[arg(long = "draft-max")]
    pub max_draft_len: Option<usize>,
}

/// [`SpeculationArgs`] resolved: the TOML file's values under the flags, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speculation {
    /// Draft sources in order (empty: plain decoding).
    pub cascade: Vec<SourceSpec>,
    /// The policy and its settings, checked to parse (`cost`, `window,raise=0.9`).
    pub policy: String,
    /// How the cascade picks a draft.
    pub cascade_mode: CascadeMode,
    /// Most draft tokens per round.
    pub max_draft_len: usize,
}

impl SpeculationArgs {
    /// The flags over `file`'s values, over the defaults (`lookup`, `cost`, `first`, 24).
    pub(super) fn resolve(self, file: &FileRun) -> Result<Speculation, ConfigError> {
        let cascade = parse_cascade(
            self.cascade
                .as_deref()
                .or(file.cascade.as_deref())
                .unwrap_or(DEFAULT_CASCADE),
        )?;
        let policy = self
            .policy
            .or_else(|| file.policy.clone())
            .unwrap_or_else(|| DEFAULT_POLICY.to_owned());
        parse_policy(&policy)?;
        Ok(Speculation {
            cascade,
            policy,
            cascade_mode: parse_cascade_mode(
                self.cascade_mode.or_else(|| file.cascade_mode.clone()),
            )?,
            max_draft_len: check_max_draft_len(
                self.max_draft_len
                    .or(file.max_draft_len)
                    .unwrap_or(DEFAULT_MAX_DRAFT_LEN),
            )?,
        })
    }
}

/// The sampling flags of `run` and `serve` (for `serve`, the defaults of requests that give
/// none).
#[derive(Debug, Args, Default, Clone)]
pub struct SamplingArgs {
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
    /// How drafts of a draft model are verified at a temperature: `rejection` (the draft
    /// model draws at the temperature; each token is accepted with probability min(1, p/q))
    /// or `compare` (greedy drafts, kept where the target's own draw equals them: the same
    /// output as plain decoding with the same seed). Both give exactly the target's
    /// distribution; greedy requests and requests with a grammar always compare.
    #[arg(long, value_enum)]
    pub draft_acceptance: Option<DraftAcceptance>,
}

impl SamplingArgs {
    /// The flags over `file`'s values, checked, with `seed` (a fresh one when `None`).
    pub(super) fn resolve(
        &self,
        file: &FileRun,
        seed: Option<u32>,
    ) -> Result<SamplingParams, ConfigError> {
        let mut params = sampling_params(
            self.temp.or(file.temp),
            self.top_k.or(file.top_k),
            self.top_p.or(file.top_p),
            self.min_p.or(file.min_p),
            seed,
        )?;
        params.draft_acceptance = self
            .draft_acceptance
            .or(file.draft_acceptance)
            .unwrap_or_default();
        Ok(params)
    }
}

/// The default cascade of `run` and `serve`.
pub const DEFAULT_CASCADE: &str = "lookup";

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
    pub(super) fn plan(&self, file: &FileRun) -> Result<Plan, ConfigError> {
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
    /// Let llama.cpp compute every matrix product and attention of batches. By default the
    /// host computes the products of Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K weights (SmolLM2,
    /// Gemma 3 and the Q4_0 draft models throughout, the K-quants of `Q4_K_M` models) when the
    /// CPU has AVX2, in one pass over the weights, and the flash attention of batches over the
    /// Q8_0 cache, after checking a short batch bit-exact against decoding its tokens one by
    /// one: the same output, faster.
    /// (`--llama-output-layer`, its name before it covered every product, still works.)
    #[arg(long, alias = "llama-output-layer")]
    pub llama_matmul: bool,
    /// Chat template of chat prompts: one of llama.cpp's built-in templates by name (chatml,
    /// llama3, gemma, mistral-v7, phi3, ...), a Jinja template file, or a Jinja template's text
    /// (default: the GGUF's, through llama.cpp's built-in templates).
    #[arg(long, value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    /// Render the GGUF's own chat template as Jinja, as Hugging Face's transformers does,
    /// instead of through the llama.cpp built-in template it resembles.
    #[arg(long)]
    pub jinja: bool,
    /// Draft model for drafter plugins that use one: a .gguf path with the target's tokenizer,
    /// a default draft (smollm2-draft, gemma3-draft), or `auto` (the default target's draft).
    /// Default drafts are made from their target on first use.
    #[arg(long, value_name = "PATH|NAME")]
    pub draft_model: Option<String>,
    /// Compute threads of the draft model (default: the target's).
    #[arg(long)]
    pub draft_threads: Option<usize>,
    /// Override a metadata key of the target, as llama.cpp's `--override-kv` does
    /// (repeatable): KEY=TYPE:VALUE with TYPE int, float, bool or str. The key must be in the
    /// model, with a value of that type.
    #[arg(long = "override-kv", value_name = "KEY=TYPE:VALUE")]
    pub override_kv: Vec<String>,
    /// Experts each token goes through in a mixture-of-experts target (its architecture's
    /// `expert_used_count`, 1 to its expert count; `spechost info --model` shows both).
    #[arg(long, value_name = "N")]
    pub experts: Option<u32>,
    /// `--override-kv` for the draft model (repeatable).
    #[arg(long = "draft-override-kv", value_name = "KEY=TYPE:VALUE")]
    pub draft_override_kv: Vec<String>,
    /// `--experts` for the draft model.
    #[arg(long, value_name = "N")]
    pub draft_experts: Option<u32>,
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
    pub(super) fn target_params(&self, plan: &Plan) -> Result<TargetParams, ConfigError> {
        Ok(TargetParams {
            use_mmap: !self.no_mmap,
            use_mlock: self.mlock,
            numa: plan.numa,
            host_batch_products: !self.llama_matmul,
            chat_template: self.chat_template()?,
            overrides: overrides(&self.override_kv, self.experts)?,
        })
    }

    /// `--draft-override-kv` and `--draft-experts`, parsed (checked against the draft model
    /// when it loads).
    pub(super) fn draft_overrides(&self) -> Result<ModelOverrides, ConfigError> {
        overrides(&self.draft_override_kv, self.draft_experts)
    }

    /// `--chat-template` and `--jinja`: a file is read as a Jinja template, text with Jinja
    /// markup is one, anything else names a llama.cpp built-in.
    fn chat_template(&self) -> Result<ChatTemplateChoice, ConfigError> {
        let Some(value) = &self.chat_template else {
            return Ok(if self.jinja {
                ChatTemplateChoice::GgufJinja
            } else {
                ChatTemplateChoice::Gguf
            });
        };
        let path = Path::new(value);
        if path.is_file() {
            let source =
                std::fs::read_to_string(path).map_err(|source| ConfigError::ChatTemplateFile {
                    path: path.to_owned(),
                    source,
                })?;
            return Ok(ChatTemplateChoice::Jinja {
                source,
                origin: format!("--chat-template {}", path.display()),
            });
        }
        if value.contains("{%") || value.contains("{{") {
            return Ok(ChatTemplateChoice::Jinja {
                source: value.clone(),
                origin: "--chat-template".into(),
            });
        }
        Ok(ChatTemplateChoice::Builtin(value.clone()))
    }

    /// Plugin directories: the flags' first, then `$SPECHOST_PLUGIN_DIR`'s.
    pub(super) fn plugin_dirs(&self) -> Vec<PathBuf> {
        self.plugin_dirs
            .iter()
            .cloned()
            .chain(env_plugin_dirs())
            .collect()
    }
}

/// The draft model of `run`, `bench` and `serve`: `--draft-model` resolved, with its context settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftSettings {
    /// The file and its context settings (the target's context size; `--draft-threads`, else
    /// one per `--draft-cpus` CPU, else the target's threads).
    pub model: DraftModelConfig,
    /// Set when the file is a default draft, which is made from its base model on first use.
    pub default_draft: Option<DefaultDraft>,
    /// `--draft-cpus`: the CPUs every draft context computes on.
    pub cpus: Option<CpuList>,
}

/// Adds `plugin.key=value` settings to the per-plugin configuration strings.
pub(super) fn merge_plugin_settings(
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
pub(super) fn check_plugin_settings_target_cascade(
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

/// Parses `--cascade-mode`.
pub(super) fn parse_cascade_mode(mode: Option<String>) -> Result<CascadeMode, ConfigError> {
    mode.map_or(Ok(CascadeMode::First), |mode| {
        mode.trim().parse().map_err(ConfigError::CascadeMode)
    })
}

/// Parses the modes of a repeatable `--cascade-mode`: each once, in the order given; ordered
/// mode when none is given.
pub(super) fn parse_cascade_modes(modes: Vec<String>) -> Result<Vec<CascadeMode>, ConfigError> {
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

/// Checks one `--draft-max`: at least 1, at most [`MAX_DRAFT_LEN_LIMIT`].
pub(super) fn check_max_draft_len(max_draft_len: usize) -> Result<usize, ConfigError> {
    engine::check_max_draft_len(max_draft_len, MAX_DRAFT_LEN_LIMIT).map_err(|error| match error {
        MaxDraftLenError::Zero => ConfigError::ZeroMaxDraftLen,
        MaxDraftLenError::AboveLimit { given, .. } => ConfigError::MaxDraftLenTooLarge { given },
    })
}

/// The model path: a default model's cached file for its alias, a target variant's (made from
/// its cached default model on first use, see [`TARGET_VARIANTS`](crate::models::TARGET_VARIANTS)),
/// else the path as given; the default target when none was given.
pub(super) fn resolve_model(
    model: Option<String>,
    cache_dir: &Path,
) -> Result<PathBuf, ConfigError> {
    let model = model.unwrap_or_else(|| DEFAULT_TARGET.alias().to_owned());
    if let Some(variant) = target_variant(&model) {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        return variant
            .make(cache_dir, threads)
            .map_err(|source| ConfigError::MakeModel { model, source });
    }
    Ok(DefaultModel::from_alias(&model)
        .map_or_else(|| PathBuf::from(&model), |m| m.path(cache_dir)))
}

/// `--override-kv` values and `--experts`, parsed.
fn overrides(kv: &[String], experts: Option<u32>) -> Result<ModelOverrides, ConfigError> {
    Ok(ModelOverrides {
        kv: kv
            .iter()
            .map(|given| given.parse())
            .collect::<Result<_, OverrideError>>()?,
        experts,
    })
}

/// The draft model from `--draft-model`, `--draft-threads` and the plan's `--draft-cpus`: a
/// default draft by name (or `auto`, the draft of the default target `model_name`), else a
/// path. Its contexts get the target's size, and `--draft-threads` threads, else one per draft
/// CPU, else the target's.
pub(super) fn draft_settings(
    draft_model: Option<String>,
    draft_threads: Option<usize>,
    overrides: ModelOverrides,
    model_name: Option<&str>,
    session: &SessionParams,
    plan: &Plan,
    cache_dir: &Path,
) -> Result<Option<DraftSettings>, ConfigError> {
    let Some(name) = draft_model else {
        if overrides != ModelOverrides::default() {
            return Err(ConfigError::DraftOverridesWithoutModel);
        }
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
        let base = DefaultModel::from_alias(model_name)
            .or_else(|| target_variant(model_name).map(|variant| variant.base))
            .ok_or_else(|| ConfigError::NoDefaultDraft {
                model: model_name.to_owned(),
            })?;
        Some(DefaultDraft::of(base))
    } else {
        DefaultDraft::from_name(&name)
    };
    let path = match default_draft {
        Some(draft) => draft.path(cache_dir),
        None => resolve_model(Some(name), cache_dir)?,
    };
    Ok(Some(DraftSettings {
        model: DraftModelConfig {
            path,
            ctx_size: session.ctx_size,
            threads: draft_threads
                .or(plan.draft_cpus.as_ref().map(CpuList::len))
                .unwrap_or(session.threads),
            overrides,
        },
        default_draft,
        cpus: plan.draft_cpus.clone(),
    }))
}

/// What every command that decodes loads before it starts, validated: `Stack::load` takes it
/// whole.
#[derive(Debug, Clone)]
pub struct StackSettings {
    /// The target GGUF.
    pub model: PathBuf,
    /// How the target (and the draft model) are loaded.
    pub target: TargetParams,
    /// Threads and CPU pinning.
    pub placement: Plan,
    /// The draft model offered to drafter plugins, if any.
    pub draft: Option<DraftSettings>,
    /// Extra directories searched for built-in plugins, before the default ones.
    pub plugin_dirs: Vec<PathBuf>,
}

/// `--draft-model auto`: the default draft of the (default) target.
pub const AUTO_DRAFT: &str = "auto";

/// The target when `--model` is not given.
pub(super) const DEFAULT_TARGET: DefaultModel = DefaultModel::SmolLm2;

/// Context settings: the plan's thread count and `--ctx-size`, checked.
pub(super) fn session_params(
    threads: usize,
    ctx_size: Option<u32>,
) -> Result<SessionParams, ConfigError> {
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

pub(super) fn sampling_params(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunArgs;
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
                .map(|c| c.stack.draft.expect("a draft model"))
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
        assert_eq!(config.stack.draft.expect("draft").model.threads, 1);
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
        assert_eq!(plain.stack.draft, None);
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
            .stack
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
            message.contains("`first`")
                && message.contains("`scored`")
                && message.contains("`tree`"),
            "message: {message}"
        );
    }
}
