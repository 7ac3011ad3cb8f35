//! Command line, TOML file and environment, parsed once into typed settings, at the edge.
//!
//! Flow: clap parses [`Cli`]; each command's flags (`run.rs`, `serve.rs`, `bench.rs`,
//! `tools.rs`; the groups several commands share in `common.rs`) are validated by their
//! `into_config`, which for `run` first merges the TOML file (`file.rs`, flags win), into one
//! `*Config` per command. Nothing past this module reads flags, files or environment variables
//! (`env.rs` holds every read). Errors are [`ConfigError`]s whose messages name the fix.
//!
//! Not here: cascade entries and policy specs (`plugins::spec`, which the admin API and requests
//! parse too), and what the settings do (the commands).

mod bench;
mod cli;
mod common;
mod env;
mod error;
mod file;
mod plugin;
mod run;
mod serve;
mod tools;

pub use self::bench::{
    BenchArgs, BenchConfig, BenchServer, CheckOutputsArgs, CheckOutputsConfig,
    DEFAULT_BENCH_REPEAT, DEFAULT_BENCH_WARMUP, DEFAULT_COST_MAX_TOKENS,
    DEFAULT_REQUESTS_PER_CLIENT, FIXED_POLICY, PromptStyle, PromptsArgs, PromptsConfig,
    ServeBenchConfig, ServerAddress, SimulateArgs, SimulateConfig, TraceArgs, TraceConfig,
    WorkloadTargetArgs, WorkloadTargetConfig,
};
pub use self::cli::{Cli, Command, ModelsCommand, SuffixCommand};
pub(crate) use self::common::fresh_seed;
pub use self::common::{
    AUTO_DRAFT, DEFAULT_MAX_TOKENS, DEFAULT_POLICY, DraftSettings, MIN_CTX_SIZE, PlacementArgs,
    StackSettings, TargetArgs,
};
pub use self::env::cache_dir;
pub use self::error::ConfigError;
pub use self::plugin::{CheckArgs, KindArg, LangArg, NewArgs, PluginBenchArgs, PluginCommand};
pub use self::run::{RunArgs, RunConfig};
pub use self::serve::{
    DEFAULT_BODY_TIMEOUT_SECS, DEFAULT_HEADER_TIMEOUT_SECS, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_QUEUE, DEFAULT_MAX_TOKENS_LIMIT, DEFAULT_SERVE_HOST,
    DEFAULT_SERVE_PORT, DEFAULT_SHUTDOWN_TIMEOUT_SECS, MIN_ADMIN_TOKEN_LEN, ServeArgs, ServeConfig,
};
pub use self::tools::{InfoArgs, InfoConfig, QuantizeArgs, WarmArgs, WarmConfig};
