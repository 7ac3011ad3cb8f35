//! The wasmtime host for plugins: WebAssembly components that speak the `spechost:drafter` WIT
//! (`sdk/wit/drafter.wit`, version [`spechost_sdk::WIT_VERSION`]) and run sandboxed, as cascade
//! sources ([`DrafterWorld`]) or as draft-length policies ([`PolicyWorld`]).
//!
//! # Load steps, in order
//!
//! 1. **Engine** ([`PluginHost::new`]): component model on, epoch interruption on. One engine
//!    per process, with one ticker thread that advances its epoch every [`EPOCH_TICK`].
//! 2. **Compile cache**: a component is compiled once per (sha256 of the `.wasm`, engine
//!    compatibility hash) and kept as `<cache_dir>/components/<key>.cwasm`, written atomically.
//!    A corrupt entry is reported, recompiled and overwritten.
//! 3. **Component** ([`PluginHost::load`], [`PluginHost::load_policy`]): the entry is resolved
//!    (a built-in name is searched for as `<name>.wasm` or `policy_<name>.wasm`, see
//!    [`PluginHost::builtin_search_dirs`]; a path is used as is), read, checked to be a
//!    component rather than a core module, compiled or fetched from the cache, and checked to
//!    export `spechost:drafter/drafter-api` (`policy-api` for a policy) at a patch of the WIT's
//!    major.minor; other versions are refused naming the SDK to rebuild with.
//! 4. **Linker** (built in step 1): WASI 0.2, synchronous, with an empty context (no
//!    preopened directories, no environment, no arguments, no sockets or name lookup) and
//!    timers that fire at once (so a guest cannot sleep past its deadline inside the host),
//!    plus the `spechost:drafter` imports: `log` (rate-limited into `tracing` with the plugin's
//!    name), `state`, `draft-model` and `tree`.
//! 5. **`InstancePre`** ([`Loaded`]: [`LoadedPlugin`] or [`LoadedPolicy`]): imports resolved
//!    once, so instantiating is cheap. One trial instance checks that the plugin starts under
//!    the host's [`SandboxLimits`].
//! 6. **`Store<HostState>`** per source ([`LoadedPlugin::source`]) or policy
//!    ([`LoadedPolicy::policy`]): a fresh instance under [`SandboxLimits`] (memory, tables,
//!    instances, a deadline per guest call), kept until it traps, then replaced.
//!
//! # Faults
//!
//! Drafters and policies are supervised by one generic type (`supervised.rs`), so both turn
//! every misbehaviour into a [`SourceFault`](crate::cascade::SourceFault) the same way, and warn
//! naming the plugin and what it did: a trap (with the guest's panic message), the deadline, the
//! memory limit, or a config the plugin rejected. A trap kills the instance; the next call
//! re-creates it and re-opens the session, and a [`PluginSource`] replays the request's context
//! into it (a [`PluginPolicy`] starts afresh). After `max_faults` faults the plugin is
//! quarantined for the run. A source also faults a proposal that breaks the rules of
//! [`spechost_sdk::check_proposal`] (too long, ids outside the vocabulary, confidences outside
//! [0, 1]) or a tree shape that breaks [`spechost_sdk::check_tree`]: the same functions the
//! SDK's test harness applies to plugins in their unit tests.
//! The cascade counts a source's fault as an empty proposal; a policy's makes the round plain
//! decoding.
//!
//! # Example
//!
//! ```no_run
//! use spechost::cascade::{DraftSource, ModelFacts};
//! use spechost::plugins::SourceSpec;
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
//! Not here: which sources a request uses and in what order (`cascade`), the command line
//! and `--plugin-config` (`config`), and the target model (`engine`). Nothing generated
//! from the WIT leaves this module: `bindings.rs` converts it to the cascade's own records, so a
//! change to a WIT record breaks compilation there, and in spechost-sdk, and nowhere else.

mod bindings;
mod bridge;
mod cache;
mod error;
mod loaded;
mod loader;
mod log;
mod policy;
mod registry;
mod sandbox;
mod source;
mod spec;
mod state;
mod supervised;
mod tree;
mod world;

pub use self::bridge::MAX_BRIDGE_DRAFT_LEN;
pub use self::cache::file_sha256;
pub use self::error::LoadError;
pub use self::loaded::{Loaded, LoadedPlugin, LoadedPolicy};
pub use self::loader::{PluginHost, PluginHostConfig};
pub use self::log::{LOG_BURST, LOG_LINES_PER_SECOND, MAX_LOG_MESSAGE_CHARS};
pub use self::policy::PluginPolicy;
pub use self::registry::{BUILTIN_POLICIES, BUILTINS, PluginKind};
pub use self::sandbox::{
    DEFAULT_CALL_DEADLINE, DEFAULT_MAX_FAULTS, DEFAULT_MAX_HOST_RESOURCES, DEFAULT_MAX_INSTANCES,
    DEFAULT_MAX_MEMORIES, DEFAULT_MAX_TABLES, DEFAULT_MEMORY_LIMIT, DEFAULT_TABLE_ELEMENTS,
    EPOCH_TICK, MAX_HOST_TIME_IN_DEADLINES, SandboxLimits,
};
pub use self::source::PluginSource;
pub use self::spec::{PolicySpec, SourceSpec, SpecError, parse_cascade, parse_policy};
pub use self::state::{DEFAULT_MAX_STATE_BYTES, StateSlot, save_plugin_states};
pub use self::world::{DrafterWorld, PolicyWorld, World};
