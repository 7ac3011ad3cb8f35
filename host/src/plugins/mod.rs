//! The wasmtime host for plugins: WebAssembly components that speak the `spechost:drafter` WIT
//! (`sdk/wit/drafter.wit`, at [`spechost_sdk::WIT_VERSION`]) and run sandboxed as cascade sources
//! (drafters) or draft-length policies.
//!
//! # Load steps, in order
//!
//! 1. **Engine** ([`PluginHost::new`]): component model on, epoch interruption on. One engine
//!    per process, with one ticker thread that advances its epoch every [`EPOCH_TICK`].
//! 2. **Compile cache**: a component is compiled once per (sha256 of the `.wasm`, engine
//!    compatibility hash) and kept as `<cache_dir>/components/<key>.cwasm`, written atomically.
//!    A corrupt entry is reported, recompiled and overwritten.
//! 3. **Component** ([`PluginHost::load`]): the cascade entry is resolved (a built-in name is
//!    searched for as `<name>.wasm`, see [`PluginHost::builtin_search_dirs`]; a path is used as
//!    is), read, checked to be a component rather than a core module, compiled or fetched from
//!    the cache, and checked to export `spechost:drafter/drafter-api` at a patch of the WIT's
//!    major.minor (`policy-api` for a policy).
//! 4. **Linker** (built in step 1): WASI 0.2, synchronous, with an empty context (no
//!    preopened directories, no environment, no arguments, no sockets or name lookup) and
//!    timers that fire at once (so a guest cannot sleep past its deadline inside the host),
//!    plus the `spechost:drafter/host` import `log`, rate-limited into `tracing` with the
//!    plugin's name.
//! 5. **`InstancePre`** ([`LoadedPlugin`]): imports resolved once, so instantiating is cheap.
//!    One trial instance checks that the plugin starts under the host's [`SandboxLimits`].
//! 6. **`Store<HostState>`** per source ([`LoadedPlugin::source`]): a fresh instance under
//!    [`SandboxLimits`] (memory, tables, instances, a deadline per guest call). The source
//!    keeps it until it traps, then replaces it.
//!
//! # Faults
//!
//! A [`PluginSource`] turns every misbehaviour into a [`SourceFault`](crate::cascade::SourceFault)
//! the cascade counts as an empty proposal, and warns naming the plugin and what it did: a trap
//! (with the guest's panic message), the deadline, the memory limit, a proposal that is too long,
//! holds ids outside the vocabulary or confidences outside [0, 1], or a config the plugin
//! rejected. A trap kills the instance; the next call re-creates it, re-opens the session and
//! replays the context. After `max_faults` faults the source is quarantined for the run.
//!
//! # Example
//!
//! ```no_run
//! use spechost::cascade::{DraftSource, ModelFacts};
//! use spechost::config::SourceSpec;
//! use spechost::plugins::{PluginHost, PluginHostConfig};
//!
//! # fn main() -> anyhow::Result<()> {
//! let host = PluginHost::new(PluginHostConfig {
//!     cache_dir: Some("/var/cache/spechost".into()),
//!     ..PluginHostConfig::default()
//! })?;
//! let lookup = host.load(&SourceSpec::Builtin("lookup".into()))?;
//! let mut source = lookup.source("");
//! let facts = ModelFacts { vocab_size: 32_000, bos: Some(1), eos: Some(2), eog: vec![2], context_size: 4096 };
//! source.begin(&facts, &[1, 5, 6, 7, 5, 6])?;
//! let proposal = source.propose(8)?;
//! # let _ = proposal;
//! # Ok(()) }
//! ```
//!
//! Not here: which sources a request uses and in what order (`cascade`), parsing cascade
//! entries and `--plugin-config` (`config`), and the target model (`engine`). Nothing generated from the
//! WIT leaves this module.

mod bindings;
mod bridge;
mod cache;
mod error;
mod loader;
mod log;
mod policy;
mod registry;
mod sandbox;
mod source;
mod state;

pub use self::bridge::MAX_BRIDGE_DRAFT_LEN;
pub use self::cache::file_sha256;
pub use self::error::LoadError;
pub use self::loader::{LoadedPlugin, LoadedPolicy, PluginHost, PluginHostConfig};
pub use self::log::{LOG_BURST, LOG_LINES_PER_SECOND, MAX_LOG_MESSAGE_CHARS};
pub use self::policy::PluginPolicy;
pub use self::registry::{BUILTIN_POLICIES, BUILTINS, PluginKind};
pub use self::sandbox::{
    DEFAULT_CALL_DEADLINE, DEFAULT_MAX_FAULTS, DEFAULT_MAX_HOST_RESOURCES, DEFAULT_MAX_INSTANCES,
    DEFAULT_MAX_MEMORIES, DEFAULT_MAX_TABLES, DEFAULT_MEMORY_LIMIT, DEFAULT_TABLE_ELEMENTS,
    EPOCH_TICK, MAX_HOST_TIME_IN_DEADLINES, SandboxLimits,
};
pub use self::source::PluginSource;
pub use self::state::{DEFAULT_MAX_STATE_BYTES, StateSlot};
