//! [`PluginDirs`]: the only places a plugin file named over the admin API may come from.
//!
//! A plugin file is compiled into native code (and kept in the compile cache), so the admin
//! token must not be a way to load any file the server can read. A `.wasm` path in
//! `PUT /admin/cascade` (a `cascade` entry or the `policy`) is resolved here, before anything
//! reads it:
//! - a path with a `..` component is refused;
//! - a relative path is looked up in each plugin directory in order, never in the server's
//!   working directory;
//! - an absolute path must point into one of the plugin directories;
//! - either way the file's canonical path (every symlink resolved) must lie inside a plugin
//!   directory's canonical path, so a symlink that points out is refused.
//!
//! The plugin directories are `--plugin-dir`, `$SPECHOST_PLUGIN_DIR` and `--watch`. Paths on
//! the command line (`--cascade ./x.wasm`, `--policy ./p.wasm`) are the operator's own choice
//! and are not checked here.

use std::path::{Component, Path, PathBuf};

use crate::plugins::{SourceSpec, parse_policy};

/// The directories plugin files named over the API must be in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginDirs {
    dirs: Vec<PathBuf>,
}

/// Why a plugin path given over the API was refused. Every message says where to put the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PluginPathError {
    /// The server has no plugin directory at all.
    #[error(
        "cannot load `{path}` over the API: this server has no plugin directory; start it with --plugin-dir DIR (or $SPECHOST_PLUGIN_DIR, or --watch DIR), put the .wasm file there and name it by its path inside DIR"
    )]
    NoPluginDir {
        /// The path given.
        path: PathBuf,
    },
    /// The path climbs with `..`.
    #[error(
        "`{path}` contains `..`; name the .wasm file by its path inside a plugin directory ({dirs}), or start the server with --plugin-dir naming the file's directory"
    )]
    ParentDir {
        /// The path given.
        path: PathBuf,
        /// The plugin directories, comma-separated.
        dirs: String,
    },
    /// No such file in any plugin directory.
    #[error(
        "no file `{path}` in the plugin directories ({dirs}); copy the .wasm file into one of them, or start the server with --plugin-dir naming its directory"
    )]
    Missing {
        /// The path given.
        path: PathBuf,
        /// The plugin directories, comma-separated.
        dirs: String,
    },
    /// The file exists but, once symlinks are resolved, lies outside every plugin directory.
    #[error(
        "`{path}` is {resolved}, outside the plugin directories ({dirs}); plugin files named over the API must be inside one (a symlink pointing out is refused): copy the .wasm file there, or start the server with --plugin-dir naming its directory"
    )]
    Outside {
        /// The path given.
        path: PathBuf,
        /// Where it leads.
        resolved: PathBuf,
        /// The plugin directories, comma-separated.
        dirs: String,
    },
}

impl PluginDirs {
    /// The plugin directories `dirs`, in the order relative paths are looked up; repeats are
    /// dropped.
    pub fn new(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut unique: Vec<PathBuf> = Vec::new();
        for dir in dirs {
            if !unique.contains(&dir) {
                unique.push(dir);
            }
        }
        Self { dirs: unique }
    }

    /// The file `path` names inside the plugin directories, as a path to load it from (not
    /// canonicalized, so its file stem still names the plugin).
    pub fn confine(&self, path: &Path) -> Result<PathBuf, PluginPathError> {
        if self.dirs.is_empty() {
            return Err(PluginPathError::NoPluginDir {
                path: path.to_owned(),
            });
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(PluginPathError::ParentDir {
                path: path.to_owned(),
                dirs: self.list(),
            });
        }
        let candidates: Vec<PathBuf> = if path.is_absolute() {
            vec![path.to_owned()]
        } else {
            self.dirs.iter().map(|dir| dir.join(path)).collect()
        };
        let mut outside = None;
        for candidate in candidates {
            let Some(resolved) = candidate.canonicalize().ok().filter(|p| p.is_file()) else {
                continue;
            };
            if self.holds(&resolved) {
                return Ok(candidate);
            }
            outside.get_or_insert(resolved);
        }
        Err(match outside {
            Some(resolved) => PluginPathError::Outside {
                path: path.to_owned(),
                resolved,
                dirs: self.list(),
            },
            None => PluginPathError::Missing {
                path: path.to_owned(),
                dirs: self.list(),
            },
        })
    }

    /// `spec` with its path, if it has one, confined ([`Self::confine`]).
    pub fn confine_source(&self, spec: SourceSpec) -> Result<SourceSpec, PluginPathError> {
        match spec {
            SourceSpec::Path(path) => self.confine(&path).map(SourceSpec::Path),
            builtin @ SourceSpec::Builtin(_) => Ok(builtin),
        }
    }

    /// A policy spec (`name[,key=value...]`) with its path, if it names a file, confined; a
    /// spec that does not parse is returned as it is, for the registry to refuse with its
    /// own message.
    pub fn confine_policy(&self, spec: String) -> Result<String, PluginPathError> {
        let Ok(parsed) = parse_policy(&spec) else {
            return Ok(spec);
        };
        let SourceSpec::Path(path) = &parsed.plugin else {
            return Ok(spec);
        };
        let confined = self.confine(path)?.display().to_string();
        Ok(if parsed.config.is_empty() {
            confined
        } else {
            format!("{confined},{}", parsed.config)
        })
    }

    /// Whether the canonical path `resolved` lies inside one of the directories.
    fn holds(&self, resolved: &Path) -> bool {
        self.dirs
            .iter()
            .filter_map(|dir| dir.canonicalize().ok())
            .any(|dir| resolved.starts_with(dir))
    }

    fn list(&self) -> String {
        self.dirs
            .iter()
            .map(|dir| dir.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `<tmp>/<name>/{plugins/inside.wasm, outside/outside.wasm}`, removed first.
    fn layout(name: &str) -> (PathBuf, PathBuf) {
        let root = std::env::temp_dir().join(format!(
            "spechost-plugin-dirs-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&root);
        let plugins = root.join("plugins");
        let outside = root.join("outside");
        for dir in [&plugins, &outside] {
            std::fs::create_dir_all(dir).expect("scratch dir");
        }
        std::fs::write(plugins.join("inside.wasm"), b"x").expect("write");
        std::fs::write(outside.join("outside.wasm"), b"x").expect("write");
        (plugins, outside)
    }

    #[test]
    fn relative_and_absolute_paths_inside_a_plugin_dir_are_taken() {
        let (plugins, _) = layout("inside");
        let dirs = PluginDirs::new([PathBuf::from("/nonexistent/spechost"), plugins.clone()]);
        assert_eq!(
            dirs.confine(Path::new("inside.wasm")),
            Ok(plugins.join("inside.wasm"))
        );
        assert_eq!(
            dirs.confine(Path::new("./inside.wasm")),
            Ok(plugins.join("./inside.wasm"))
        );
        let absolute = plugins.join("inside.wasm");
        assert_eq!(dirs.confine(&absolute), Ok(absolute.clone()));
        assert_eq!(
            dirs.confine_source(SourceSpec::Path(absolute.clone())),
            Ok(SourceSpec::Path(absolute.clone()))
        );
        assert_eq!(
            dirs.confine_policy("inside.wasm,k=3".to_owned()),
            Ok(format!("{},k=3", plugins.join("inside.wasm").display()))
        );
        assert_eq!(
            dirs.confine_policy("window,raise=0.9".to_owned()),
            Ok("window,raise=0.9".to_owned()),
            "built-ins pass untouched"
        );
    }

    #[cfg(unix)]
    #[test]
    fn absolute_paths_outside_parent_dirs_and_symlinks_out_are_refused() {
        let (plugins, outside) = layout("outside");
        let escape = plugins.join("escape.wasm");
        std::os::unix::fs::symlink(outside.join("outside.wasm"), &escape).expect("symlink");
        let dirs = PluginDirs::new([plugins.clone()]);

        let absolute = dirs.confine(&outside.join("outside.wasm"));
        assert!(
            matches!(absolute, Err(PluginPathError::Outside { .. })),
            "{absolute:?}"
        );
        for climbing in [
            PathBuf::from("../outside/outside.wasm"),
            plugins.join("../outside/outside.wasm"),
        ] {
            let refused = dirs.confine(&climbing);
            assert!(
                matches!(refused, Err(PluginPathError::ParentDir { .. })),
                "{climbing:?}: {refused:?}"
            );
        }
        for symlink in [PathBuf::from("escape.wasm"), escape] {
            let refused = dirs
                .confine(&symlink)
                .expect_err("a symlink out is refused");
            let message = refused.to_string();
            assert!(
                message.contains("outside the plugin directories")
                    && message.contains("--plugin-dir"),
                "{symlink:?}: {message}"
            );
        }
        let missing = dirs.confine(Path::new("nothing.wasm"));
        assert!(
            matches!(missing, Err(PluginPathError::Missing { .. })),
            "{missing:?}"
        );
        let policy = dirs.confine_policy(format!("{},k=2", outside.join("outside.wasm").display()));
        assert!(policy.is_err(), "{policy:?}");
    }

    #[test]
    fn without_a_plugin_dir_every_path_is_refused_naming_the_flag() {
        let refused = PluginDirs::default()
            .confine(Path::new("x.wasm"))
            .expect_err("no plugin dir");
        assert!(
            refused.to_string().contains("--plugin-dir"),
            "message: {refused}"
        );
    }
}
