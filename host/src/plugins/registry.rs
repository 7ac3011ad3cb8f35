//! Built-in plugins and how a cascade or policy entry becomes a `.wasm` path.
//!
//! A cascade entry ([`SourceSpec`](super::SourceSpec), parsed by `spec`) is either a
//! path or the name of a built-in; so is a `--policy`. A built-in drafter `name` is the file
//! `<name>.wasm`, a built-in policy `name` the file `policy_<name>.wasm`, searched for in
//! order in:
//!
//! 1. the directories the caller gives (from the config file or command line);
//! 2. `<exe_dir>/plugins/` (an installed binary ships its built-ins beside it);
//! 3. `<exe_dir>/../wasm32-wasip2/release/` (the binary run from `target/release/`);
//! 4. `<exe_dir>/../../wasm32-wasip2/release/` (tests and benches in `target/release/deps/`).
//!
//! Not here: reading environment variables or config (the caller passes the directories).

use std::path::{Path, PathBuf};

use super::error::LoadError;

/// Names of the drafters that ship with spechost, in the order they are documented.
pub const BUILTINS: &[&str] = &["lookup", "suffix", "draft"];

/// Names of the draft-length policies that ship with spechost, in the order they are documented.
pub const BUILTIN_POLICIES: &[&str] = &["cost", "window", "fixed", "heuristic", "content"];

/// What a plugin is: a draft source or a draft-length policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// Exports `drafter-api`; a cascade source.
    Drafter,
    /// Exports `policy-api`; chooses each round's draft length.
    Policy,
}

impl PluginKind {
    /// `drafter` or `policy`, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Drafter => "drafter",
            PluginKind::Policy => "policy",
        }
    }

    fn builtins(self) -> &'static [&'static str] {
        match self {
            PluginKind::Drafter => BUILTINS,
            PluginKind::Policy => BUILTIN_POLICIES,
        }
    }

    /// The file a built-in of this kind called `name` is shipped as.
    fn file_name(self, name: &str) -> String {
        match self {
            PluginKind::Drafter => format!("{name}.wasm"),
            PluginKind::Policy => format!("policy_{name}.wasm"),
        }
    }
}

/// Where the `.wasm` files of built-ins are looked for, relative to the running executable.
const EXE_RELATIVE_DIRS: &[&str] = &[
    "plugins",
    "../wasm32-wasip2/release",
    "../../wasm32-wasip2/release",
];

/// The directories searched for built-ins, in order: `explicit` first, then those relative to
/// `exe_dir` (when known).
pub(super) fn search_dirs(explicit: &[PathBuf], exe_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = explicit.to_vec();
    if let Some(exe_dir) = exe_dir {
        dirs.extend(
            EXE_RELATIVE_DIRS
                .iter()
                .map(|relative| exe_dir.join(relative)),
        );
    }
    dirs
}

/// The directory of the running executable, if the OS tells us.
pub(super) fn current_exe_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.parent().map(Path::to_path_buf)
}

/// Finds the file of the built-in `name` of `kind` in `dirs`, the first directory where
/// `exists` says the file is.
pub(super) fn resolve_builtin(
    kind: PluginKind,
    name: &str,
    dirs: &[PathBuf],
    exists: impl Fn(&Path) -> bool,
) -> Result<PathBuf, LoadError> {
    if !kind.builtins().contains(&name) {
        return Err(LoadError::UnknownBuiltin {
            kind: kind.as_str(),
            name: name.to_owned(),
            known: kind.builtins().join(", "),
        });
    }
    let file = kind.file_name(name);
    dirs.iter()
        .map(|dir| dir.join(&file))
        .find(|candidate| exists(candidate))
        .ok_or_else(|| LoadError::BuiltinMissing {
            kind: kind.as_str(),
            name: name.to_owned(),
            searched: dirs
                .iter()
                .map(|dir| dir.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_dirs_come_before_exe_relative_ones() {
        let dirs = search_dirs(
            &[PathBuf::from("/opt/p")],
            Some(Path::new("/t/release/deps")),
        );
        let expected: Vec<PathBuf> = [
            "/opt/p",
            "/t/release/deps/plugins",
            "/t/release/deps/../wasm32-wasip2/release",
            "/t/release/deps/../../wasm32-wasip2/release",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, expected);
    }

    #[test]
    fn builtin_resolves_to_first_dir_holding_the_file() {
        let dirs = [
            PathBuf::from("/a"),
            PathBuf::from("/b"),
            PathBuf::from("/c"),
        ];
        let found = resolve_builtin(PluginKind::Drafter, "lookup", &dirs, |p| {
            p.starts_with("/b") || p.starts_with("/c")
        });
        assert_eq!(found.ok(), Some(PathBuf::from("/b/lookup.wasm")));
    }

    #[test]
    fn builtin_policy_is_a_prefixed_file() {
        let found = resolve_builtin(PluginKind::Policy, "window", &[PathBuf::from("/p")], |_| {
            true
        });
        assert_eq!(found.ok(), Some(PathBuf::from("/p/policy_window.wasm")));
        let err = resolve_builtin(PluginKind::Policy, "lookup", &[], |_| true)
            .expect_err("lookup is a drafter, not a policy");
        assert!(
            err.to_string().contains("no built-in policy `lookup`"),
            "message: {err}"
        );
    }

    #[test]
    fn unknown_builtin_lists_known_names() {
        let err = resolve_builtin(PluginKind::Drafter, "nope", &[], |_| true)
            .expect_err("`nope` is not a built-in");
        let message = err.to_string();
        assert!(
            message.contains("`nope`") && message.contains("lookup") && message.contains(".wasm"),
            "message: {message}"
        );
    }

    #[test]
    fn missing_builtin_names_the_searched_dirs_and_the_fix() {
        let dirs = [PathBuf::from("/a"), PathBuf::from("/b")];
        let err = resolve_builtin(PluginKind::Drafter, "lookup", &dirs, |_| false)
            .expect_err("no file exists");
        let message = err.to_string();
        assert!(
            message.contains("/a, /b") && message.contains("build-plugins.sh"),
            "message: {message}"
        );
    }
}
