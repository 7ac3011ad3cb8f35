//! Flags of `spechost serve`, validated into a [`ServeConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::common::{
    DEFAULT_MAX_TOKENS, SamplingArgs, SpeculationArgs, StackSettings, TargetArgs,
    check_plugin_settings_target_cascade, draft_settings, merge_plugin_settings, resolve_model,
    session_params,
};
use super::error::ConfigError;
use super::file::FileRun;
use crate::cascade::CascadeMode;
use crate::engine::{BatchLayout, DraftCut, MessageContents, SamplingParams, SessionParams};
use crate::models::DefaultModel;
use crate::plugins::SourceSpec;
use crate::server::{AllowedHosts, ConnectionLimits, CorsOrigins, ShareTarget};

/// Flags of `spechost serve`.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// The target, its context (per slot) and where plugins come from.
    #[command(flatten)]
    pub target: TargetArgs,
    /// The default speculation of requests, as for `run` (a request may choose other loaded
    /// plugins and policies, and a smaller draft length); the verify cost curve is measured up
    /// to `--draft-max` at start-up.
    #[command(flatten)]
    pub speculation: SpeculationArgs,
    /// Tokens generated for a request that gives no `max_tokens`.
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// The most `max_tokens` a request may ask for.
    #[arg(long)]
    pub max_tokens_limit: Option<usize>,
    /// The default sampling of requests that give none.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Addresses to listen on, comma-separated or repeated (`--host 127.0.0.1 --host ::1`),
    /// all on the one --port.
    #[arg(long, value_delimiter = ',')]
    pub host: Vec<String>,
    /// Port to listen on; 0 picks a free one (the address is printed on stdout).
    #[arg(long)]
    pub port: Option<u16>,
    /// Model names in the API, comma-separated (`/v1/models` lists each; answers carry the
    /// first; a request may name any); default: the --model alias or file stem.
    #[arg(long, value_delimiter = ',')]
    pub served_model_name: Vec<String>,
    /// Serve requests whatever `model` they name (for clients that hard-code one).
    #[arg(long)]
    pub accept_any_model: bool,
    /// Draft requests that have a grammar (`grammar`, `json_schema`, `response_format`)
    /// without the host's grammar source (what the grammar makes certain or likely), only with
    /// the cascade's; a request's `speculative.grammar_drafts` overrides it.
    #[arg(long)]
    pub no_grammar_drafts: bool,
    /// Requests generated at once (slots). Their tokens and drafts share every decode of one
    /// llama.cpp context, each request in a KV cache of its own of --ctx-size tokens.
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Most prompt tokens read per step for a request that is starting: running requests keep
    /// streaming between two chunks of a long prompt, and a cancelled request stops at the
    /// next chunk.
    #[arg(long, value_name = "TOKENS")]
    pub prefill_chunk: Option<usize>,
    /// How a verify batch whose requests draft different lengths goes to llama.cpp, which
    /// decodes such a batch in several passes over the weights: `split` keeps the passes,
    /// `padded` pads every request to the longest (one pass, more arithmetic), `auto` takes
    /// the cheaper by the measured verify costs (padded on memory-bound machines).
    #[arg(long, value_enum)]
    pub batch_layout: Option<BatchLayout>,
    /// Whether a step verifying several requests' rounds cuts drafts whose rows cost more
    /// beside the others than their expected accepted tokens are worth (each policy sizes its
    /// request's draft without knowing the step's other rounds): `auto` by the measured verify
    /// costs and each source's acceptance so far, `off` verifies every draft as proposed.
    #[arg(long, value_enum)]
    pub draft_cut: Option<DraftCut>,
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
    /// API keys of the inference endpoints (completions, chat, tokenize), comma-separated as
    /// llama-server's: a request must send one as `Authorization: Bearer <key>` (or
    /// `X-Api-Key`), else it gets 401. /health and /v1/models stay open. Prefer
    /// --api-key-file or the environment variable: a flag's value is visible in the process
    /// list.
    #[arg(long, env = "SPECHOST_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Read the API keys from this file, one per line (blank lines and `#` comments skipped).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<PathBuf>,
    /// Origins whose browser pages may call the server (CORS), comma-separated
    /// (`https://ui.example.com,http://localhost:5173`) or `*`: their preflights are answered
    /// and their pages may read the answers. Default: none (pages of other origins get 403).
    #[arg(long, value_name = "ORIGINS")]
    pub cors_origins: Option<String>,
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
    /// Share with the other replicas using this Redis (`redis://HOST:PORT[/NAMESPACE]`,
    /// namespace `spechost` by default): every finished response goes to their drafters and
    /// theirs to ours, and an admin update of the defaults reaches every replica. Without
    /// Redis the server serves alone and reconnects; replicas share only within a namespace.
    #[arg(long, value_name = "URL")]
    pub share: Option<String>,
}

/// Default address `spechost serve` listens on: loopback only.
pub const DEFAULT_SERVE_HOST: &str = "127.0.0.1";

/// Default port of `spechost serve`.
pub const DEFAULT_SERVE_PORT: u16 = 8080;

/// Default `--prefill-chunk`: a chunk of a long prompt holds running requests up for about as
/// long as 256 tokens take to read (half a second for SmolLM2-135M on 2 cores).
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

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
    /// The target, its threads and pinning, the draft model and where plugins come from.
    pub stack: StackSettings,
    /// The model's name in the API.
    pub model_id: String,
    /// Every name requests may use for the model (`model_id` first).
    pub model_aliases: Vec<String>,
    /// Whether requests naming another model are served too.
    pub accept_any_model: bool,
    /// Whether requests with a grammar draft with the grammar source by default.
    pub grammar_drafts: bool,
    /// Default draft sources in order (empty: plain decoding).
    pub cascade: Vec<SourceSpec>,
    /// Default cascade mode.
    pub cascade_mode: CascadeMode,
    /// Default policy plugin and its settings.
    pub policy: String,
    /// Policies loaded besides the default and the built-ins, which requests may then name
    /// (`spechost bench --clients` loads every policy file it measures). Empty for `serve`,
    /// where an admin loads other policy files with `PUT /admin/cascade`.
    pub other_policies: Vec<String>,
    /// Per-plugin configuration strings, by plugin name.
    pub plugin_configs: BTreeMap<String, String>,
    /// Default most draft tokens per round, and the most a request may ask for.
    pub max_draft_len: usize,
    /// `max_tokens` of requests that give none.
    pub default_max_tokens: usize,
    /// The most `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// Sampling of requests that give no sampling settings; the seed is drawn per request.
    pub sampling: SamplingParams,
    /// Settings of each slot's llama.cpp context.
    pub session: SessionParams,
    /// Host names or addresses to listen on, all on `port` (never empty).
    pub hosts: Vec<String>,
    /// Port to listen on (0: any free one).
    pub port: u16,
    /// Slots: requests generated at once.
    pub parallel: usize,
    /// Most prompt tokens read per step for a starting request.
    pub prefill_chunk: usize,
    /// Requests that may wait for a slot.
    pub max_queue: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Bearer token of the admin endpoints; `None` turns them off.
    pub admin_token: Option<String>,
    /// Keys of the inference endpoints; empty: open to every client.
    pub api_keys: Vec<String>,
    /// Whether `/metrics` is open to anyone.
    pub public_metrics: bool,
    /// The host names requests may address.
    pub allowed_hosts: AllowedHosts,
    /// The origins whose browser pages may call the server.
    pub cors_origins: CorsOrigins,
    /// Connection limits and timeouts.
    pub connections: ConnectionLimits,
    /// How special-token text inside chat messages is read.
    pub message_contents: MessageContents,
    /// Directory watched for changed plugin files.
    pub watch: Option<PathBuf>,
    /// Directory for persisted plugin state.
    pub state_dir: Option<PathBuf>,
    /// The Redis and namespace shared with other replicas (`--share`).
    pub share: Option<ShareTarget>,
}

impl ServeArgs {
    /// Validates the flags into a [`ServeConfig`].
    pub fn into_config(self, cache_dir: &Path) -> Result<ServeConfig, ConfigError> {
        let model_arg = self
            .target
            .model
            .clone()
            .unwrap_or_else(|| DefaultModel::SmolLm2.alias().to_owned());
        let model = resolve_model(Some(model_arg.clone()), cache_dir)?;
        let mut model_aliases: Vec<String> = Vec::new();
        for name in self.served_model_name.iter().map(|name| name.trim()) {
            if name.is_empty() {
                return Err(ConfigError::EmptyModelName);
            }
            if !model_aliases.iter().any(|known| known == name) {
                model_aliases.push(name.to_owned());
            }
        }
        if model_aliases.is_empty() {
            model_aliases.push(match DefaultModel::from_alias(&model_arg) {
                Some(default) => default.alias().to_owned(),
                None => model.file_stem().map_or_else(
                    || model.display().to_string(),
                    |stem| stem.to_string_lossy().into_owned(),
                ),
            });
        }
        let model_id = model_aliases[0].clone();
        let speculation = self.speculation.resolve(&FileRun::default())?;
        // Requests may pick any loaded plugin, so settings may name a built-in outside the
        // default cascade too.
        let mut loadable = speculation.cascade.clone();
        for name in crate::plugins::BUILTINS {
            if !loadable.iter().any(|source| source.name() == *name) {
                loadable.push(SourceSpec::Builtin((*name).to_owned()));
            }
        }
        check_plugin_settings_target_cascade(&self.target.plugin_config, &loadable)?;
        let mut plugin_configs = BTreeMap::new();
        merge_plugin_settings(&mut plugin_configs, &self.target.plugin_config)?;

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
        let prefill_chunk = self.prefill_chunk.unwrap_or(DEFAULT_PREFILL_CHUNK);
        for (flag, value) in [
            ("--parallel", parallel),
            ("--max-body-bytes", max_body_bytes),
            ("--prefill-chunk", prefill_chunk),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroCount { flag });
            }
        }
        // One context decodes for every slot, with all the compute threads.
        let placement = self.target.placement.plan(&FileRun::default())?;
        let mut session = session_params(placement.threads, self.target.ctx_size)?;
        session.sequences = parallel;
        session.max_draft_len = speculation.max_draft_len;
        session.layout = self.batch_layout.unwrap_or_default();
        session.draft_cut = self.draft_cut.unwrap_or_default();
        let draft = draft_settings(
            self.target.draft_model.clone(),
            self.target.draft_threads,
            self.target.draft_overrides()?,
            Some(&model_arg),
            &session,
            &placement,
            cache_dir,
        )?;
        let sampling = self.sampling.resolve(&FileRun::default(), Some(0))?;
        let admin_token = admin_token(self.admin_token, self.admin_token_file.as_deref())?;
        let api_keys = api_keys(self.api_key.as_deref(), self.api_key_file.as_deref())?;
        let mut hosts = self.host;
        if hosts.is_empty() {
            hosts.push(DEFAULT_SERVE_HOST.to_owned());
        }
        if let Some(empty) = hosts.iter().position(|host| host.trim().is_empty()) {
            return Err(ConfigError::EmptyHost(empty + 1));
        }
        let allowed_hosts = match &self.allowed_hosts {
            Some(list) => {
                AllowedHosts::parse(list).map_err(|problem| ConfigError::AllowedHosts {
                    list: list.clone(),
                    problem,
                })?
            }
            None => AllowedHosts::for_listen_addresses(&hosts),
        };
        let cors_origins = match &self.cors_origins {
            Some(list) => CorsOrigins::parse(list).map_err(|problem| ConfigError::CorsOrigins {
                list: list.clone(),
                problem,
            })?,
            None => CorsOrigins::None,
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
        let share = self
            .share
            .as_deref()
            .map(|url| {
                ShareTarget::parse(url).map_err(|problem| ConfigError::Share {
                    url: url.to_owned(),
                    problem,
                })
            })
            .transpose()?;
        Ok(ServeConfig {
            stack: StackSettings {
                model,
                target: self.target.target_params(&placement)?,
                plugin_dirs: self.target.plugin_dirs(),
                placement,
                draft,
            },
            model_id,
            model_aliases,
            accept_any_model: self.accept_any_model,
            grammar_drafts: !self.no_grammar_drafts,
            cascade: speculation.cascade,
            cascade_mode: speculation.cascade_mode,
            policy: speculation.policy,
            other_policies: Vec::new(),
            plugin_configs,
            max_draft_len: speculation.max_draft_len,
            default_max_tokens,
            max_tokens_limit,
            sampling,
            session,
            hosts,
            port: self.port.unwrap_or(DEFAULT_SERVE_PORT),
            parallel,
            prefill_chunk,
            max_queue: self.max_queue.unwrap_or(DEFAULT_MAX_QUEUE),
            max_body_bytes,
            admin_token,
            api_keys,
            public_metrics: self.public_metrics,
            allowed_hosts,
            cors_origins,
            connections,
            message_contents: if self.message_special_tokens {
                MessageContents::Markup
            } else {
                MessageContents::Plain
            },
            watch: self.watch,
            state_dir: self.target.state_dir.clone(),
            share,
        })
    }
}

/// The admin token from the flag (or its environment variable) or from a file's first line,
/// at least [`MIN_ADMIN_TOKEN_LEN`] characters.
pub(super) fn admin_token(
    flag: Option<String>,
    file: Option<&Path>,
) -> Result<Option<String>, ConfigError> {
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

/// The API keys of `--api-key` (comma-separated) or `--api-key-file` (one per line, blank
/// lines and `#` comments skipped); empty when neither is given.
fn api_keys(flag: Option<&str>, file: Option<&Path>) -> Result<Vec<String>, ConfigError> {
    let (keys, source): (Vec<String>, &str) = match (file, flag) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ApiKeyFile {
                path: path.to_owned(),
                source,
            })?;
            let keys = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_owned)
                .collect::<Vec<_>>();
            if keys.is_empty() {
                return Err(ConfigError::NoApiKey {
                    given: format!("--api-key-file {}", path.display()),
                });
            }
            (keys, "--api-key-file")
        }
        (None, Some(list)) => (
            list.split(',').map(|key| key.trim().to_owned()).collect(),
            "--api-key",
        ),
        (None, None) => return Ok(Vec::new()),
    };
    if keys.iter().any(String::is_empty) {
        return Err(ConfigError::NoApiKey {
            given: source.to_owned(),
        });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::common::DEFAULT_POLICY;
    use crate::config::run::RunArgs;
    use crate::engine::MAX_DRAFT_LEN_LIMIT;
    use crate::plugins::parse_policy;
    #[test]
    fn serve_defaults_and_limits_are_checked() {
        let config = ServeArgs::default()
            .into_config(Path::new("/tmp"))
            .expect("defaults are valid");
        assert_eq!(
            (
                config.hosts[0].as_str(),
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
            (config.policy.as_str(), config.max_draft_len),
            (DEFAULT_POLICY, run.max_draft_len),
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
        assert_eq!(named.model_aliases, ["my-model"]);
        let aliased = ServeArgs {
            served_model_name: vec!["gpt-4o".into(), "local".into(), "gpt-4o".into()],
            ..ServeArgs::default()
        }
        .into_config(Path::new("/tmp"))
        .expect("valid");
        assert_eq!(aliased.model_id, "gpt-4o");
        assert_eq!(
            aliased.model_aliases,
            ["gpt-4o", "local"],
            "once each, in order"
        );
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
                    served_model_name: vec!["a".into(), " ".into()],
                    ..ServeArgs::default()
                },
                "empty name",
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
                    share: Some("http://127.0.0.1:6379".into()),
                    ..ServeArgs::default()
                },
                "--share http://127.0.0.1:6379: it must start with redis://",
            ),
            (
                ServeArgs {
                    speculation: SpeculationArgs {
                        max_draft_len: Some(MAX_DRAFT_LEN_LIMIT + 1),
                        ..SpeculationArgs::default()
                    },
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
            speculation: SpeculationArgs {
                cascade: Some("lookup".into()),
                ..SpeculationArgs::default()
            },
            target: TargetArgs {
                plugin_config: vec!["suffix.max_depth=32".into()],
                ..TargetArgs::default()
            },
            ..ServeArgs::default()
        };
        let config = args.into_config(Path::new("/tmp")).expect("valid");
        assert_eq!(config.plugin_configs["suffix"], "max_depth=32");
    }
}
