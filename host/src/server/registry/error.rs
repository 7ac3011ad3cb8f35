//! Why the registry refused an update or a request's choice of plugins.

use crate::plugins::LoadError;

/// Why an update (or a request's choice of sources) was refused. The published snapshot is
/// unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateError {
    /// A name that is not a loaded plugin.
    #[error(
        "plugin `{name}` is not loaded (loaded: {loaded}); name a loaded plugin, or load it as an admin with PUT /admin/cascade"
    )]
    UnknownPlugin {
        /// The name given.
        name: String,
        /// The loaded plugins, comma-separated.
        loaded: String,
    },
    /// The new plugin version could not be loaded.
    #[error("cannot load plugin `{plugin}`: {source}")]
    Load {
        /// The plugin.
        plugin: String,
        /// Why.
        #[source]
        source: LoadError,
    },
    /// The new plugin version or config faulted in its smoke test.
    #[error(
        "plugin `{plugin}` failed its smoke test ({fault}); the previous version stays in use, fix the plugin or its config and retry"
    )]
    SmokeTest {
        /// The plugin.
        plugin: String,
        /// What it did.
        fault: String,
    },
    /// A path whose file stem names a plugin already loaded from elsewhere.
    #[error(
        "a plugin named `{name}` is already loaded from {loaded}; rename {new} so its file stem differs, or reload `{name}` with POST /admin/plugins/reload"
    )]
    NameClash {
        /// The name both share.
        name: String,
        /// Where the loaded one came from.
        loaded: String,
        /// The path given.
        new: String,
    },
    /// A default `draft_max` of 0 or above the server's `--draft-max`.
    #[error(
        "draft_max must be between 1 and {limit} (the server's --draft-max, up to which it measured the verify cost), got {given}; use the cascade `none` to decode without speculation"
    )]
    DraftMax {
        /// The value given.
        given: usize,
        /// The server's `--draft-max`.
        limit: usize,
    },
    /// A policy that is not loaded.
    #[error(
        "policy `{name}` is not loaded (loaded: {loaded}); name a loaded policy, or load a policy file as an admin with PUT /admin/cascade"
    )]
    UnknownPolicy {
        /// The policy as given.
        name: String,
        /// The loaded policies, comma-separated.
        loaded: String,
    },
    /// A plugin that drafts with the draft model, on a server without one.
    #[error(
        "plugin `{plugin}` drafts with the draft model, but this server has none; choose another cascade, or start the server with --draft-model auto (the default target's draft) or --draft-model PATH.gguf"
    )]
    NoDraftModel {
        /// The plugin.
        plugin: String,
    },
    /// A replica published a plugin version whose bytes are not in the shared store (or do
    /// not hash to it).
    #[error(
        "plugin `{plugin}` version {sha256} published by another replica is not in the shared store; publish it again from that replica (PUT /admin/cascade or POST /admin/plugins/reload)"
    )]
    SharedVersionMissing {
        /// The plugin.
        plugin: String,
        /// The version published.
        sha256: String,
    },
    /// A malformed policy, or settings the policy refused; the message names the fix.
    #[error("{0}")]
    Policy(String),
}
