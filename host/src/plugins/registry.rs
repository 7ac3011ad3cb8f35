//! Built-in drafters and how a cascade entry becomes a `.wasm` path.
//!
//! A cascade entry ([`SourceSpec`](crate::config::SourceSpec), parsed by `config`) is either a
//! path or the name of a built-in. A built-in `name` is the file `<name>.wasm`, searched for in
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
pub const BUILTINS: &[&str] = &["lookup", "suffix"];

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

/// Finds `<name>.wasm` for a built-in `name` in `dirs`, the first directory where `exists`
/// says the file is.
pub(super) fn resolve_builtin(
    name: &str,
    dirs: &[PathBuf],
    exists: impl Fn(&Path) -> bool,
) -> Result<PathBuf, LoadError> {
    if !BUILTINS.contains(&name) {
        return Err(LoadError::UnknownBuiltin {
            name: name.to_owned(),
            known: BUILTINS.join(", "),
        });
    }
    let file = format!("{name}.wasm");
    dirs.iter()
        .map(|dir| dir.join(&file))
        .find(|candidate| exists(candidate))
        .ok_or_else(|| LoadError::BuiltinMissing {
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
        let found = resolve_builtin("lookup", &dirs, |p| {
            p.starts_with("/b") || p.starts_with("/c")
        });
        assert_eq!(found.ok(), Some(PathBuf::from("/b/lookup.wasm")));
    }

    #[test]
    fn unknown_builtin_lists_known_names() {
        let err = resolve_builtin("nope", &[], |_| true).expect_err("`nope` is not a built-in");
        let message = err.to_string();
        assert!(
            message.contains("`nope`") && message.contains("lookup") && message.contains(".wasm"),
            "message: {message}"
        );
    }

    #[test]
    fn missing_builtin_names_the_searched_dirs_and_the_fix() {
        let dirs = [PathBuf::from("/a"), PathBuf::from("/b")];
        let err = resolve_builtin("lookup", &dirs, |_| false).expect_err("no file exists");
        let message = err.to_string();
        assert!(
            message.contains("/a, /b") && message.contains("build-plugins.sh"),
            "message: {message}"
        );
    }
}
