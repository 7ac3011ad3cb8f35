//! Flags of the measuring commands: `bench`, `trace`, `prompts` and `simulate`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;

use super::common::{
    DEFAULT_MAX_TOKENS, DEFAULT_POLICY, SamplingArgs, StackSettings, TargetArgs,
    check_max_draft_len, check_plugin_settings_target_cascade, draft_settings,
    merge_plugin_settings, parse_cascade_modes, resolve_model, sampling_params, session_params,
};
use super::env::env_plugin_dirs;
use super::error::ConfigError;
use super::file::FileRun;
use super::serve::{DEFAULT_MAX_QUEUE, ServeArgs, ServeConfig};
use crate::cascade::CascadeMode;
use crate::engine::{
    DEFAULT_MAX_DRAFT_LEN, DEFAULT_TREE_LEAVES, SamplingParams, SessionParams, TargetParams,
};
use crate::plugins::{PolicySpec, SourceSpec, parse_cascade, parse_policy};

/// How a model is prompted: chat template or raw continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PromptStyle {
    /// Chat requests for a model whose GGUF has a chat template (instruction-tuned), raw
    /// prompts for one without (a base model).
    #[default]
    Auto,
    /// The messages in the model's chat template.
    Chat,
    /// The raw prompt, continued.
    Raw,
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
    /// How to prompt the model: `auto` sends a request's `messages` through the chat template
    /// of a model whose GGUF has one (instruction-tuned), and its raw `prompt` to a model
    /// without (a base model); `chat` or `raw` force one form.
    #[arg(long, value_enum, default_value_t)]
    pub prompt_style: PromptStyle,
    /// A cascade to measure, as for `run --cascade` (repeatable). Plain decoding always runs as
    /// the baseline. Not with --url: that server decodes as it was started.
    #[arg(
        long = "cascade",
        short = 'c',
        value_name = "SOURCES",
        required_unless_present = "url"
    )]
    pub cascades: Vec<String>,
    /// Draft lengths (K) to measure each cascade with, comma-separated (default: 24, as for
    /// `run`). The `fixed` policy runs at each (a K sweep); an adaptive policy runs once,
    /// choosing K up to the largest.
    #[arg(long = "draft-max", value_name = "K,K,...", value_delimiter = ',')]
    pub max_draft_lens: Vec<usize>,
    /// A draft-length policy to measure each cascade with, as for `run --policy` (repeatable;
    /// default: `cost`, as for `run`; `fixed` drafts exactly K every round and sweeps every
    /// --draft-max).
    #[arg(long = "policy", value_name = "POLICY[,KEY=VALUE...]")]
    pub policies: Vec<String>,
    /// Cascade modes to measure, comma-separated: `first`, `scored`, `tree` (default: first).
    #[arg(long = "cascade-mode", value_name = "MODE,MODE", value_delimiter = ',')]
    pub cascade_modes: Vec<String>,
    /// Whether requests with a grammar (a workload line's `json_schema`) also draft with the
    /// host's grammar source, comma-separated: `on`, `off` (default: on, as `serve`); `on,off`
    /// measures both. Rows without it are labelled `no-grammar-drafts`.
    #[arg(
        long = "grammar-drafts",
        value_name = "on|off,...",
        value_delimiter = ','
    )]
    pub grammar_drafts: Vec<String>,
    /// Measured passes over each workload; tok/s is the median over them. With --clients, also
    /// the measured passes of each level, the configurations alternating pass by pass.
    #[arg(long, default_value_t = DEFAULT_BENCH_REPEAT)]
    pub repeat: usize,
    /// Unmeasured passes over each workload first (pages the model in, starts thread pools).
    #[arg(long, default_value_t = DEFAULT_BENCH_WARMUP)]
    pub warmup: usize,
    /// Cap on each request's max_tokens.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// Sampling of every request, plain decoding's included (default: greedy). With a
    /// temperature, outputs still match plain decoding token for token: each request samples
    /// with its own seed (--seed plus its index in its workload), the same in every pass and
    /// configuration.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Seed of the first request of each workload, with a temperature.
    #[arg(long, default_value_t = DEFAULT_BENCH_SEED)]
    pub seed: u32,
    /// Largest verify batch of each workload's verify cost curve; the curve always reaches the
    /// largest --draft-max + 1, which the ideal speedup needs.
    #[arg(long, default_value_t = DEFAULT_COST_MAX_TOKENS)]
    pub cost_max_tokens: usize,
    /// Measured runs of each batch size for the verify cost curve (its median is the cost).
    #[arg(long, default_value_t = crate::engine::DEFAULT_COST_REPETITIONS)]
    pub cost_repeat: usize,
    /// Directory for results.md, results.csv, results.json and the SVG charts (with
    /// --clients: serve-results.md, serve-results.csv and serve-results.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The server benchmark: concurrent clients of each level, comma-separated (`1,2,4,8`).
    /// A server is started in this process with a slot per client of the largest level (or the
    /// one at --url is driven), and each level's clients send the workloads' requests over
    /// HTTP, streamed, with plain decoding and then each cascade, --repeat times over (tok/s:
    /// the median pass); --warmup then applies to the single-stream comparison through the
    /// engine, whose --repeat passes are split around the one-client level (half before, the
    /// rest after; the server is then started again for the other levels).
    #[arg(long = "clients", value_name = "C,C,...", value_delimiter = ',')]
    pub client_counts: Vec<usize>,
    /// With --clients: requests each client sends per level (default: 12).
    #[arg(long, value_name = "N")]
    pub requests_per_client: Option<usize>,
    /// With --clients: drive the server already running at this address (llama-server,
    /// another spechost build) instead of starting one; its requests carry no `speculative`
    /// block, so it decodes as it was started.
    #[arg(long, value_name = "http://HOST:PORT")]
    pub url: Option<String>,
    /// With --url: the name of its rows (default: the URL).
    #[arg(long, value_name = "NAME")]
    pub label: Option<String>,
}

/// Default `--requests-per-client` of `bench --clients`.
pub const DEFAULT_REQUESTS_PER_CLIENT: usize = 12;

/// `bench --clients`: the server benchmark, validated.
#[derive(Debug, Clone)]
pub struct ServeBenchConfig {
    /// Concurrent clients of each level, ascending, none twice.
    pub client_counts: Vec<usize>,
    /// Requests each client sends per level.
    pub requests_per_client: usize,
    /// The server the clients drive.
    pub server: BenchServer,
}

/// The server `bench --clients` drives.
#[derive(Debug, Clone)]
pub enum BenchServer {
    /// Started in this process with these settings: the bench's target, threads, context,
    /// draft model and plugins, a slot per client of the largest level, every cascade's
    /// sources loaded.
    InProcess(Box<ServeConfig>),
    /// Already running at `address`; its rows are named `label`.
    Running {
        /// Where it listens.
        address: ServerAddress,
        /// The name of its rows.
        label: String,
    },
}

/// The address of a running server, from `--url http://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddress {
    /// `HOST:PORT` as given (`127.0.0.1:8080`, `[::1]:8080`, `localhost:8080`): what the
    /// clients connect to and send as the `Host` header.
    pub authority: String,
}

impl ServerAddress {
    /// Parses `http://HOST:PORT` (a trailing `/` is allowed; no path, query or TLS).
    pub fn parse(url: &str) -> Result<Self, ConfigError> {
        let problem = |problem: &str| ConfigError::BenchUrl {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        let uri: hyper::Uri = url.parse().map_err(|_| problem("it is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(_) => return Err(problem("only plain http:// is supported")),
            None => return Err(problem("it has no http:// scheme")),
        }
        let authority = uri.authority().ok_or_else(|| problem("it names no host"))?;
        if authority.host().is_empty() {
            return Err(problem("it names no host"));
        }
        if authority.port_u16().is_none() {
            return Err(problem("it names no port"));
        }
        if authority.as_str().contains('@') {
            return Err(problem("it carries user information"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(problem(
                "it has a path; the clients add /v1/chat/completions and /v1/completions themselves",
            ));
        }
        Ok(Self {
            authority: authority.as_str().to_owned(),
        })
    }
}

/// The policy whose configurations sweep every `--draft-max` given: it drafts exactly K tokens
/// each round. Other policies run once, choosing K up to the largest.
pub const FIXED_POLICY: &str = "fixed";

/// Default `--repeat` of `spechost bench`.
pub const DEFAULT_BENCH_REPEAT: usize = 3;

/// Default `--warmup` of `spechost bench`.
pub const DEFAULT_BENCH_WARMUP: usize = 1;

/// Default `--seed` of `spechost bench`: a fixed one, so a run can be repeated.
pub const DEFAULT_BENCH_SEED: u32 = 1;

/// Everything `spechost bench` needs, validated. Every output must equal plain decoding token
/// for token, greedy or sampled (with a temperature, at each request's seed).
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The target, its threads and pinning, the draft model and where plugins come from.
    pub stack: StackSettings,
    /// Workload files, in the order given; each is named by its file stem.
    pub workloads: Vec<PathBuf>,
    /// How the model is prompted.
    pub prompt_style: PromptStyle,
    /// Cascades to measure, each non-empty, in the order given.
    pub cascades: Vec<Vec<SourceSpec>>,
    /// Draft lengths to measure every cascade with, in the order given.
    pub max_draft_lens: Vec<usize>,
    /// Policies to measure every cascade with, in the order given.
    pub policies: Vec<PolicySpec>,
    /// Cascade modes to measure every cascade with, in the order given.
    pub cascade_modes: Vec<CascadeMode>,
    /// Grammar-source settings to measure every cascade with, in the order given.
    pub grammar_drafts: Vec<bool>,
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
    /// Sampling of every request; each request's seed is this one's plus its index in its
    /// workload.
    pub sampling: SamplingParams,
    /// Per-plugin configuration strings, by source name.
    pub plugin_configs: BTreeMap<String, String>,
    /// llama.cpp context settings; `threads` is the plan's.
    pub session: SessionParams,
    /// Where to write the result files, if anywhere.
    pub out: Option<PathBuf>,
    /// The server benchmark (`--clients`), if asked for.
    pub serve: Option<ServeBenchConfig>,
}

impl BenchArgs {
    /// Validates the flags into a [`BenchConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<BenchConfig, ConfigError> {
        let model = resolve_model(self.target.model.clone(), cache_dir)?;
        check_workload_names(&self.workloads)?;
        let cascades = parse_cascades(&self.cascades)?;
        let serve = self.serve_bench(&cascades, cache_dir)?;
        let plugin_configs = plugin_configs_for(&self.target.plugin_config, &cascades)?;
        let max_draft_lens = check_max_draft_lens(self.max_draft_lens)?;
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
            policies.push(parse_policy(DEFAULT_POLICY)?);
        }
        let cascade_modes = parse_cascade_modes(self.cascade_modes)?;
        let grammar_drafts = parse_grammar_drafts(&self.grammar_drafts)?;
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
        let mut session = session_params(placement.threads, self.target.ctx_size)?;
        if cascade_modes.contains(&CascadeMode::Tree) {
            // Every configuration runs in the one session, chains and trees alike.
            session.tree_leaves = DEFAULT_TREE_LEAVES;
        }
        let draft = draft_settings(
            self.target.draft_model.clone(),
            self.target.draft_threads,
            self.target.draft_overrides()?,
            self.target.model.as_deref(),
            &session,
            &placement,
            cache_dir,
        )?;
        Ok(BenchConfig {
            stack: StackSettings {
                model,
                target: self.target.target_params(&placement)?,
                plugin_dirs: self.target.plugin_dirs(),
                placement,
                draft,
            },
            workloads: self.workloads,
            prompt_style: self.prompt_style,
            cascades,
            max_draft_lens,
            policies,
            cascade_modes,
            grammar_drafts,
            repeat: self.repeat,
            warmup: self.warmup,
            cost_max_tokens: self.cost_max_tokens,
            cost_repeat: self.cost_repeat,
            max_tokens_cap: self.max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            sampling: SamplingParams {
                draft_acceptance: self.sampling.draft_acceptance.unwrap_or_default(),
                ..sampling_params(
                    self.sampling.temp,
                    self.sampling.top_k,
                    self.sampling.top_p,
                    self.sampling.min_p,
                    Some(self.seed),
                )?
            },
            plugin_configs,
            session,
            out: self.out,
            serve,
        })
    }

    /// The server benchmark's settings: `None` without --clients (and then none of its flags
    /// may be given).
    fn serve_bench(
        &self,
        cascades: &[Vec<SourceSpec>],
        cache_dir: &Path,
    ) -> Result<Option<ServeBenchConfig>, ConfigError> {
        let needs_clients = |flag| ConfigError::ServeBenchFlag {
            flag,
            fix: "belongs to the server benchmark; add --clients 1,2,4 (or drop it)",
        };
        if self.client_counts.is_empty() {
            return match (&self.url, self.requests_per_client, &self.label) {
                (Some(_), _, _) => Err(needs_clients("--url")),
                (_, Some(_), _) => Err(needs_clients("--requests-per-client")),
                (_, _, Some(_)) => Err(needs_clients("--label")),
                (None, None, None) => Ok(None),
            };
        }
        let mut client_counts = Vec::with_capacity(self.client_counts.len());
        for &clients in &self.client_counts {
            if clients == 0 {
                return Err(ConfigError::ZeroCount { flag: "--clients" });
            }
            if client_counts.contains(&clients) {
                return Err(ConfigError::Repeated {
                    flag: "--clients",
                    value: clients.to_string(),
                });
            }
            client_counts.push(clients);
        }
        client_counts.sort_unstable();
        let requests_per_client = self
            .requests_per_client
            .unwrap_or(DEFAULT_REQUESTS_PER_CLIENT);
        if requests_per_client == 0 {
            return Err(ConfigError::ZeroCount {
                flag: "--requests-per-client",
            });
        }
        let server = match &self.url {
            Some(url) => {
                if !cascades.is_empty() {
                    return Err(ConfigError::ServeBenchFlag {
                        flag: "--cascade",
                        fix: "is not sent to a server given by --url, which decodes as it was started; drop --cascade and name its rows with --label",
                    });
                }
                if self.prompt_style == PromptStyle::Auto {
                    return Err(ConfigError::ServeBenchFlag {
                        flag: "--prompt-style auto",
                        fix: "needs the model, which is not loaded here with --url; pass --prompt-style chat or raw",
                    });
                }
                BenchServer::Running {
                    address: ServerAddress::parse(url)?,
                    label: self.label.clone().unwrap_or_else(|| url.clone()),
                }
            }
            None if self.label.is_some() => {
                return Err(ConfigError::ServeBenchFlag {
                    flag: "--label",
                    fix: "names the rows of a server given by --url; add --url or drop --label (in-process rows are named by their cascades)",
                });
            }
            None => {
                let largest = *client_counts.last().expect("--clients is not empty");
                let mut serve = self
                    .in_process_serve_args(cascades, largest)
                    .into_config(cache_dir)?;
                // Requests name the rest of the policies measured; their files must be loaded.
                serve.other_policies = self.policies.iter().skip(1).cloned().collect();
                BenchServer::InProcess(Box::new(serve))
            }
        };
        Ok(Some(ServeBenchConfig {
            client_counts,
            requests_per_client,
            server,
        }))
    }

    /// `spechost serve`'s flags for the in-process server: the bench's target, placement,
    /// context, draft model and plugins; every cascade's sources loaded (requests pick theirs
    /// by name); the first policy and mode and the largest draft length as defaults (requests
    /// send their own); a slot per client of the largest level, on a free loopback port.
    fn in_process_serve_args(&self, cascades: &[Vec<SourceSpec>], slots: usize) -> ServeArgs {
        let mut sources: Vec<&SourceSpec> = Vec::new();
        for source in cascades.iter().flatten() {
            if !sources.contains(&source) {
                sources.push(source);
            }
        }
        let cascade = sources
            .iter()
            .map(|source| match source {
                SourceSpec::Builtin(name) => name.clone(),
                SourceSpec::Path(path) => path.display().to_string(),
            })
            .collect::<Vec<_>>()
            .join(",");
        let target = &self.target;
        ServeArgs {
            target: TargetArgs {
                model: target.model.clone(),
                placement: super::common::PlacementArgs {
                    threads: target.placement.threads,
                    cpus: target.placement.cpus.clone(),
                    draft_cpus: target.placement.draft_cpus.clone(),
                    numa: target.placement.numa,
                },
                ctx_size: target.ctx_size,
                mlock: target.mlock,
                no_mmap: target.no_mmap,
                llama_matmul: target.llama_matmul,
                chat_template: target.chat_template.clone(),
                jinja: target.jinja,
                draft_model: target.draft_model.clone(),
                draft_threads: target.draft_threads,
                override_kv: target.override_kv.clone(),
                experts: target.experts,
                draft_override_kv: target.draft_override_kv.clone(),
                draft_experts: target.draft_experts,
                plugin_config: target.plugin_config.clone(),
                plugin_dirs: target.plugin_dirs.clone(),
                // As in `bench`'s own passes: no state from earlier runs.
                state_dir: None,
            },
            speculation: super::common::SpeculationArgs {
                cascade: Some(if cascade.is_empty() {
                    "none".to_owned()
                } else {
                    cascade
                }),
                policy: self.policies.first().cloned(),
                cascade_mode: self.cascade_modes.first().cloned(),
                max_draft_len: self.max_draft_lens.iter().max().copied(),
            },
            parallel: Some(slots),
            port: Some(0),
            // Clients are closed-loop: at most one request each waits, plus the warm-up.
            max_queue: Some(DEFAULT_MAX_QUEUE.max(2 * slots)),
            ..ServeArgs::default()
        }
    }
}

/// Workloads are named by their file stems, so no two may share one.
pub(super) fn check_workload_names(workloads: &[PathBuf]) -> Result<(), ConfigError> {
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
pub(super) fn parse_cascades(specs: &[String]) -> Result<Vec<Vec<SourceSpec>>, ConfigError> {
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
pub(super) fn plugin_configs_for(
    settings: &[String],
    cascades: &[Vec<SourceSpec>],
) -> Result<BTreeMap<String, String>, ConfigError> {
    let all_sources: Vec<SourceSpec> = cascades.iter().flatten().cloned().collect();
    check_plugin_settings_target_cascade(settings, &all_sources)?;
    let mut plugin_configs = BTreeMap::new();
    merge_plugin_settings(&mut plugin_configs, settings)?;
    Ok(plugin_configs)
}

/// Parses `--grammar-drafts on,off`: each once, in the order given; `on` when none is given.
pub(super) fn parse_grammar_drafts(given: &[String]) -> Result<Vec<bool>, ConfigError> {
    let mut parsed = Vec::new();
    for value in given {
        let on = match value.trim() {
            "on" => true,
            "off" => false,
            other => return Err(ConfigError::GrammarDrafts(other.to_owned())),
        };
        if parsed.contains(&on) {
            return Err(ConfigError::Repeated {
                flag: "--grammar-drafts",
                value: value.clone(),
            });
        }
        parsed.push(on);
    }
    if parsed.is_empty() {
        parsed.push(true);
    }
    Ok(parsed)
}

/// Checks a `--draft-max K,K,...` list: each at least 1, none twice; the default when empty.
pub(super) fn check_max_draft_lens(given: Vec<usize>) -> Result<Vec<usize>, ConfigError> {
    let mut max_draft_lens = Vec::new();
    for max_draft_len in given {
        check_max_draft_len(max_draft_len)?;
        if max_draft_lens.contains(&max_draft_len) {
            return Err(ConfigError::Repeated {
                flag: "--draft-max",
                value: max_draft_len.to_string(),
            });
        }
        max_draft_lens.push(max_draft_len);
    }
    if max_draft_lens.is_empty() {
        max_draft_lens.push(DEFAULT_MAX_DRAFT_LEN);
    }
    Ok(max_draft_lens)
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
    /// How to prompt the model, as for `bench`: `auto` sends a request's `messages` through the chat template
    /// of a model whose GGUF has one (instruction-tuned), and its raw `prompt` to a model
    /// without (a base model); `chat` or `raw` force one form.
    #[arg(long, value_enum, default_value_t)]
    pub prompt_style: PromptStyle,
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
    /// How the model is prompted.
    pub prompt_style: PromptStyle,
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
            model: resolve_model(self.target.model.clone(), cache_dir)?,
            workloads: self.workloads,
            prompt_style: self.prompt_style,
            max_tokens_cap: self.max_tokens,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            session: session_params(placement.threads, self.target.ctx_size)?,
            target: self.target.target_params(&placement)?,
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

/// Flags of `spechost check-outputs`.
#[derive(Debug, Args, Default)]
pub struct CheckOutputsArgs {
    /// The target (for its chat template and tokenizer) and the workloads the outputs answer.
    #[command(flatten)]
    pub inputs: WorkloadTargetArgs,
    /// Other tools' outputs, one JSON object per line with the request's `workload` (file
    /// stem), `id` and the generated `text`; other fields are kept.
    #[arg(long, value_name = "FILE.jsonl")]
    pub outputs: PathBuf,
}

/// Everything `spechost check-outputs` needs, validated.
#[derive(Debug, Clone)]
pub struct CheckOutputsConfig {
    /// The target and the workloads.
    pub inputs: WorkloadTargetConfig,
    /// The outputs to check.
    pub outputs: PathBuf,
}

impl CheckOutputsArgs {
    /// Validates the flags into a [`CheckOutputsConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<CheckOutputsConfig, ConfigError> {
        Ok(CheckOutputsConfig {
            inputs: self.inputs.into_config("check-outputs", cache_dir)?,
            outputs: self.outputs,
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
    pub max_draft_lens: Vec<usize>,
    /// Cascade modes to replay each cascade in, comma-separated: `first`, `scored`, `tree` (default:
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
    pub max_draft_lens: Vec<usize>,
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
            max_draft_lens: check_max_draft_lens(self.max_draft_lens)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn bench_flags_are_checked_with_the_fix_named() {
        let args = |cascades: &[&str], max_draft_lens: &[usize], repeat: usize| BenchArgs {
            workloads: vec!["w/edit.jsonl".into()],
            cascades: cascades.iter().map(|c| c.to_string()).collect(),
            max_draft_lens: max_draft_lens.to_vec(),
            repeat,
            cost_repeat: 1,
            ..BenchArgs::default()
        };
        let config = args(&["lookup", "lookup,x.wasm"], &[4, 8], 2)
            .into_config(Path::new("/tmp"))
            .expect("valid");
        assert_eq!(
            (config.cascades.len(), config.max_draft_lens.clone()),
            (2, vec![4, 8])
        );
        let defaults = args(&["lookup"], &[], 1)
            .into_config(Path::new("/tmp"))
            .expect("valid");
        assert_eq!(defaults.max_draft_lens, vec![DEFAULT_MAX_DRAFT_LEN]);
        assert_eq!(
            (defaults.policies.clone(), defaults.cascade_modes.clone()),
            (
                vec![parse_policy(DEFAULT_POLICY).expect("valid")],
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
    fn clients_flags_are_checked_with_the_fix_named() {
        let args = |clients: &[usize]| BenchArgs {
            workloads: vec!["w/extract.jsonl".into()],
            cascades: vec!["lookup".into(), "lookup,suffix".into()],
            max_draft_lens: vec![8, 16],
            client_counts: clients.to_vec(),
            cost_repeat: 1,
            repeat: 1,
            ..BenchArgs::default()
        };
        let config = args(&[4, 1, 2])
            .into_config(Path::new("/tmp"))
            .expect("valid");
        let serve = config.serve.expect("--clients switches serve mode on");
        assert_eq!(serve.client_counts, vec![1, 2, 4], "measured ascending");
        assert_eq!(serve.requests_per_client, DEFAULT_REQUESTS_PER_CLIENT);
        let BenchServer::InProcess(server) = serve.server else {
            panic!(
                "no --url: the server runs in-process, got {:?}",
                serve.server
            );
        };
        assert_eq!(
            (server.parallel, server.port, server.max_draft_len),
            (4, 0, 16),
            "a slot per client of the largest level, a free port, the largest draft length"
        );
        let sources: Vec<String> = server.cascade.iter().map(SourceSpec::name).collect();
        assert_eq!(
            sources,
            ["lookup", "suffix"],
            "every cascade's sources, once"
        );
        assert!(
            server.max_queue >= 4,
            "queue for every client: {}",
            server.max_queue
        );
        let two_policies = BenchArgs {
            policies: vec!["cost".into(), "./old_cost.wasm,decay=0.9".into()],
            ..args(&[1])
        }
        .into_config(Path::new("/tmp"))
        .expect("valid");
        let Some(BenchServer::InProcess(server)) = two_policies.serve.map(|serve| serve.server)
        else {
            panic!("the server runs in-process");
        };
        assert_eq!(
            (server.policy.as_str(), server.other_policies.as_slice()),
            ("cost", ["./old_cost.wasm,decay=0.9".to_owned()].as_slice()),
            "the first policy is the default, the rest are loaded for requests to name"
        );
        let running = BenchArgs {
            cascades: Vec::new(),
            url: Some("http://127.0.0.1:8081/".into()),
            label: Some("llama-server".into()),
            prompt_style: PromptStyle::Raw,
            requests_per_client: Some(3),
            ..args(&[1, 8])
        }
        .into_config(Path::new("/tmp"))
        .expect("valid")
        .serve
        .expect("serve mode");
        assert_eq!(running.requests_per_client, 3);
        let BenchServer::Running { address, label } = running.server else {
            panic!("--url drives a running server, got {:?}", running.server);
        };
        assert_eq!(
            (address.authority.as_str(), label.as_str()),
            ("127.0.0.1:8081", "llama-server")
        );
        let with_url = |url: &str| BenchArgs {
            cascades: Vec::new(),
            url: Some(url.into()),
            prompt_style: PromptStyle::Chat,
            ..args(&[1])
        };
        for (bad, needle) in [
            (args(&[1, 0]), "--clients must be at least 1"),
            (args(&[2, 1, 2]), "--clients `2` appears twice"),
            (
                BenchArgs {
                    requests_per_client: Some(0),
                    ..args(&[1])
                },
                "--requests-per-client must be at least 1",
            ),
            (
                BenchArgs {
                    url: Some("http://127.0.0.1:8080".into()),
                    ..args(&[])
                },
                "--url belongs to the server benchmark; add --clients",
            ),
            (
                BenchArgs {
                    requests_per_client: Some(2),
                    ..args(&[])
                },
                "--requests-per-client belongs to the server benchmark",
            ),
            (
                BenchArgs {
                    label: Some("x".into()),
                    ..args(&[1])
                },
                "add --url or drop --label",
            ),
            (
                BenchArgs {
                    url: Some("http://127.0.0.1:8080".into()),
                    prompt_style: PromptStyle::Chat,
                    ..args(&[1])
                },
                "drop --cascade and name its rows with --label",
            ),
            (
                BenchArgs {
                    prompt_style: PromptStyle::Auto,
                    ..with_url("http://127.0.0.1:8080")
                },
                "pass --prompt-style chat or raw",
            ),
            (with_url("127.0.0.1:8080"), "it has no http:// scheme"),
            (with_url("https://example.com:443"), "only plain http://"),
            (with_url("http://localhost"), "it names no port"),
            (with_url("http://localhost:8080/v1"), "it has a path"),
            (with_url("http:// bad"), "it is not a URL"),
        ] {
            let err = bad
                .into_config(Path::new("/tmp"))
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "wanted `{needle}` in: {err}");
        }
        let err = with_url("http://localhost")
            .into_config(Path::new("/tmp"))
            .expect_err("no port")
            .to_string();
        assert!(
            err.contains("give the running server's address as http://HOST:PORT"),
            "the fix is named: {err}"
        );
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
            max_draft_lens: vec![4, 8],
            plugin_config: settings.iter().map(|c| c.to_string()).collect(),
            ..SimulateArgs::default()
        };
        let config = args(&["lookup", "lookup,suffix"], &["suffix.alpha=2"])
            .into_config()
            .expect("valid");
        assert_eq!(config.cascades.len(), 2);
        assert_eq!(config.max_draft_lens, vec![4, 8]);
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
