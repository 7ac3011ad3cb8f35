//! Why a drafter plugin could not be loaded or started.
//!
//! Load errors stop startup: they are configuration mistakes (a wrong path, a plugin built for
//! the wrong target or WIT version). Faults of a running plugin are not here; they are
//! [`SourceFault`](crate::cascade::SourceFault)s and never stop generation.

use std::path::PathBuf;

/// Why a drafter plugin could not be loaded. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The wasmtime engine could not be configured on this machine.
    #[error(
        "cannot start the WebAssembly engine: {reason}; check that this CPU is supported by wasmtime"
    )]
    Engine {
        /// What wasmtime said.
        reason: String,
    },
    /// The thread that enforces call deadlines could not be spawned.
    #[error(
        "cannot start the plugin deadline thread: {source}; the process may be out of threads or memory"
    )]
    Ticker {
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// A cascade or policy entry names no built-in plugin.
    #[error(
        "no built-in {kind} `{name}`; built-ins are {known}, or give a path to a .wasm file (e.g. `./my_{kind}.wasm`)"
    )]
    UnknownBuiltin {
        /// `drafter` or `policy`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// A built-in plugin is known but its `.wasm` file is in none of the searched directories.
    #[error(
        "built-in {kind} `{name}` not found in {searched}; run `scripts/build-plugins.sh` or point the plugin directory setting (`--plugin-dir`) at the folder holding it"
    )]
    BuiltinMissing {
        /// `drafter` or `policy`.
        kind: &'static str,
        /// The built-in name.
        name: String,
        /// The directories searched, in order, comma-separated.
        searched: String,
    },
    /// The plugin file does not exist.
    #[error("plugin file {} does not exist; check the path (relative paths start from the current directory)", path.display())]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The plugin file exists but could not be read.
    #[error("cannot read plugin file {}: {source}; check its permissions", path.display())]
    Unreadable {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not WebAssembly at all (wrong file, or cut short before its header).
    #[error("{} is not a WebAssembly file ({len} bytes, no `\\0asm` header); give the .wasm built by `cargo build --target wasm32-wasip2`", path.display())]
    NotWasm {
        /// The path given.
        path: PathBuf,
        /// The file size.
        len: usize,
    },
    /// The file is a core WebAssembly module, not a component.
    #[error("{} is a core WebAssembly module, not a component; build it with `cargo build --target wasm32-wasip2` (not wasm32-unknown-unknown or wasm32-wasip1)", path.display())]
    NotAComponent {
        /// The path given.
        path: PathBuf,
    },
    /// The component did not compile: truncated, corrupt, or using unsupported features.
    #[error("{} is not a valid component: {reason}; the file may be truncated or corrupt, rebuild it with `cargo build --release --target wasm32-wasip2`", path.display())]
    InvalidComponent {
        /// The path given.
        path: PathBuf,
        /// What wasmtime said.
        reason: String,
    },
    /// The component does not export the interface this host speaks for its kind.
    #[error(
        "{plugin} does not export `{expected}` (it exports {found}); rebuild it against spechost-sdk {sdk_version}, or check that it is used as the right kind of plugin (a drafter in `--cascade`, a policy in `--policy`)"
    )]
    MissingExport {
        /// The plugin name.
        plugin: String,
        /// The export the host needs.
        expected: String,
        /// What the component exports instead, comma-separated.
        found: String,
        /// The SDK version to rebuild against.
        sdk_version: &'static str,
    },
    /// The component imports something the sandbox does not provide, or its exports have the
    /// wrong types.
    #[error(
        "{plugin} does not fit the drafter sandbox: {reason}; plugins may import only WASI 0.2 (cli, clocks, random, io) and the `spechost:drafter` host interfaces (`host`, `state`, `draft-model`), rebuild it against spechost-sdk {sdk_version}"
    )]
    Incompatible {
        /// The plugin name.
        plugin: String,
        /// What wasmtime said.
        reason: String,
        /// The SDK version to rebuild against.
        sdk_version: &'static str,
    },
    /// The component loaded but could not be instantiated under the sandbox limits.
    #[error(
        "cannot start plugin {plugin}: {reason}; an instance must start within the sandbox's memory and time limits, so the plugin must need less memory or less start-up work"
    )]
    Instantiate {
        /// The plugin name.
        plugin: String,
        /// What went wrong.
        reason: String,
    },
    /// The plugin's `open` rejected its configuration string.
    #[error("plugin `{plugin}` {detail}")]
    Config {
        /// The plugin name.
        plugin: String,
        /// What the plugin rejected and how to fix it.
        detail: String,
    },
}
