//! [`ConfigError`]: every way the command line, the TOML file or the environment can be wrong,
//! each message naming the fix.

use std::path::PathBuf;

use super::common::MIN_CTX_SIZE;
use super::serve::MIN_ADMIN_TOKEN_LEN;
use crate::engine::{MAX_DRAFT_LEN_LIMIT, StopStringsError};
use crate::placement::{PlacementError, TopologyError};
use crate::plugins::SpecError;

/// Why the configuration is invalid. Every message says how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `plugin new --lang rust` without `--sdk`, from a binary whose SDK source is gone.
    #[error(
        "this spechost binary was not built from a checkout that still has its `sdk/` folder; pass --sdk with the `sdk/` folder of a spechost checkout or an unpacked `cargo package -p spechost-sdk`"
    )]
    NoSdk,
    /// `plugin check --requests 0`.
    #[error("--requests must be at least 1 (requests of each workload to replay)")]
    ZeroRequests,
    /// The bundled trace cannot be written into the cache.
    #[error("{0:#}; set SPECHOST_CACHE_DIR to a writable directory, or pass --trace")]
    Trace(anyhow::Error),
    /// `--draft-max 0`.
    #[error(
        "--draft-max must be at least 1 (got 0); use --cascade none to decode without speculation"
    )]
    ZeroMaxDraftLen,
    /// `--draft-max` above [`MAX_DRAFT_LEN_LIMIT`].
    #[error(
        "--draft-max {given} is above {MAX_DRAFT_LEN_LIMIT}; a verify batch that large costs far more than it can save, use at most {MAX_DRAFT_LEN_LIMIT}"
    )]
    MaxDraftLenTooLarge {
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
    /// `--draft-override-kv` or `--draft-experts` without a draft model.
    #[error(
        "--draft-override-kv or --draft-experts is set but there is no draft model; add --draft-model or drop them"
    )]
    DraftOverridesWithoutModel,
    /// A bad `--override-kv` (or its draft twin).
    #[error(transparent)]
    Override(#[from] crate::engine::OverrideError),
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
    /// A target variant could not be made from its default model.
    #[error("cannot make the model {model}: {source}")]
    MakeModel {
        /// The variant's name.
        model: String,
        /// Why.
        source: crate::models::QuantizeError,
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
    /// A bad cascade entry or policy spec.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Bad `--plugin-config`.
    #[error("invalid --plugin-config `{0}`: write it as plugin.key=value, e.g. lookup.max_ngram=3")]
    PluginConfig(String),
    /// Bad `--cascade-mode`.
    #[error("invalid --cascade-mode: {0}")]
    CascadeMode(String),
    /// Bad `--grammar-drafts`.
    #[error("invalid --grammar-drafts value `{0}`: use `on`, `off`, or `on,off` to measure both")]
    GrammarDrafts(String),
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
    /// The `--chat-template` file cannot be read.
    #[error("cannot read the --chat-template file {path}: {source}; check the path")]
    ChatTemplateFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An entry of `--host` is empty.
    #[error(
        "--host entry {0} is empty; give addresses such as 127.0.0.1 or ::1, separated by commas or in several --host flags"
    )]
    EmptyHost(usize),
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
    /// `--api-key-file` cannot be read.
    #[error("cannot read --api-key-file {path}: {source}; check the path and its permissions")]
    ApiKeyFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An empty API key.
    #[error(
        "{given} gives an empty API key; give each key as non-empty text (a file: one per line)"
    )]
    NoApiKey {
        /// The flag (and file) it came from.
        given: String,
    },
    /// An empty `--served-model-name`.
    #[error("--served-model-name has an empty name; give each name as text, comma-separated")]
    EmptyModelName,
    /// Bad `--cors-origins`.
    #[error("invalid --cors-origins `{list}`: {problem}")]
    CorsOrigins {
        /// The value given.
        list: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Bad `--allowed-hosts`.
    #[error("invalid --allowed-hosts `{list}`: {problem}")]
    AllowedHosts {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A `--share` URL that cannot be used.
    #[error("--share {url}: {problem}")]
    Share {
        /// The URL as given.
        url: String,
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
    /// A flag of `bench --clients` without what it needs, or with what it excludes.
    #[error("{flag} {fix}")]
    ServeBenchFlag {
        /// The flag.
        flag: &'static str,
        /// Why it does not fit, and what to do.
        fix: &'static str,
    },
    /// A `--url` that is not `http://HOST:PORT`.
    #[error(
        "invalid --url `{url}`: {problem}; give the running server's address as http://HOST:PORT, e.g. http://127.0.0.1:8080"
    )]
    BenchUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        problem: String,
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
