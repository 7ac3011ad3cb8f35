//! `spechost plugin new NAME`: a ready plugin project, a drafter or a policy, in Rust (on
//! `spechost-sdk`) or Python (componentize-py): working code with a test, a `build.sh` that
//! tests, builds the component and runs `spechost plugin check` on it, and a README. The
//! project loads in `spechost run` unchanged.
//!
//! The templates are in `templates/`, built into the binary; `{{name}}`-style placeholders are
//! filled from [`NewPlugin`].

use std::path::{Path, PathBuf};

use crate::plugins::PluginKind;

/// The WIT the host speaks, written into Python projects (componentize-py reads it).
const WIT: &str = include_str!("../../../sdk/wit/drafter.wit");

/// The languages a project can be made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// A Rust crate on `spechost-sdk`, built for `wasm32-wasip2`.
    Rust,
    /// A Python module built into a component by componentize-py.
    Python,
}

impl Lang {
    /// `Rust` or `Python`, for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
        }
    }
}

/// What `plugin new` is asked to make.
#[derive(Debug, Clone)]
pub struct NewPlugin {
    /// The project's name: lowercase letters, digits, `-` and `_`, starting with a letter.
    pub name: String,
    /// Drafter or policy.
    pub kind: PluginKind,
    /// The language.
    pub lang: Lang,
    /// The directory the project is created in (as `<dir>/<name>`).
    pub dir: PathBuf,
    /// The `spechost-sdk` crate a Rust project depends on (a directory with its Cargo.toml).
    pub sdk: PathBuf,
}

/// Why a project cannot be made. Every message names the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScaffoldError {
    /// The name cannot name a crate, a file and a plugin.
    #[error(
        "plugin name `{0}` is not usable; use 1 to 64 lowercase letters, digits, `-` or `_`, starting with a letter (e.g. `my-drafter`)"
    )]
    BadName(String),
    /// The project directory exists.
    #[error("{} already exists; choose another name or --dir, or remove it", .0.display())]
    Exists(PathBuf),
    /// `--sdk` is not the SDK crate.
    #[error(
        "{} is not the spechost-sdk crate (no Cargo.toml naming `spechost-sdk`); pass --sdk with the `sdk/` folder of a spechost checkout or an unpacked `cargo package -p spechost-sdk`",
        .0.display()
    )]
    NotTheSdk(PathBuf),
    /// Writing failed.
    #[error("cannot write {}: {source}; check the directory's permissions", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// One file of a project: its path inside the project, its template, whether it runs.
struct File {
    path: &'static str,
    template: &'static str,
    executable: bool,
}

impl File {
    const fn new(path: &'static str, template: &'static str) -> Self {
        Self {
            path,
            template,
            executable: false,
        }
    }

    const fn script(path: &'static str, template: &'static str) -> Self {
        Self {
            path,
            template,
            executable: true,
        }
    }
}

/// The files of a project of `kind` in `lang`.
fn files(kind: PluginKind, lang: Lang) -> Vec<File> {
    let gitignore = File::new(".gitignore", "target/\n*.wasm\n__pycache__/\n");
    match lang {
        Lang::Rust => vec![
            File::new("Cargo.toml", include_str!("templates/rust-Cargo.toml")),
            File::new(
                "src/lib.rs",
                match kind {
                    PluginKind::Drafter => include_str!("templates/rust-drafter.rs"),
                    PluginKind::Policy => include_str!("templates/rust-policy.rs"),
                },
            ),
            File::script("build.sh", include_str!("templates/rust-build.sh")),
            File::new("README.md", include_str!("templates/rust-README.md")),
            gitignore,
        ],
        Lang::Python => vec![
            File::new(
                "app.py",
                match kind {
                    PluginKind::Drafter => include_str!("templates/python-drafter.py"),
                    PluginKind::Policy => include_str!("templates/python-policy.py"),
                },
            ),
            File::new("wit/spechost/drafter.wit", WIT),
            File::new(
                "wit/plugin/world.wit",
                include_str!("templates/python-world.wit"),
            ),
            File::script("build.sh", include_str!("templates/python-build.sh")),
            File::new("README.md", include_str!("templates/python-README.md")),
            gitignore,
        ],
    }
}

/// Checks `name` (see [`NewPlugin::name`]).
pub fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let mut chars = name.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok =
        chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if starts_with_letter && rest_ok && name.len() <= 64 {
        Ok(())
    } else {
        Err(ScaffoldError::BadName(name.to_owned()))
    }
}

/// The SDK this binary was built from, when its source is still where it was built.
pub fn built_sdk() -> Option<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    is_sdk(&sdk).then(|| sdk.canonicalize().unwrap_or(sdk))
}

/// Whether `dir` holds the `spechost-sdk` crate.
fn is_sdk(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|manifest| {
        manifest
            .lines()
            .any(|line| line.replace(' ', "") == "name=\"spechost-sdk\"")
    })
}

/// Makes the project; returns its directory.
pub fn create(plugin: &NewPlugin) -> Result<PathBuf, ScaffoldError> {
    check_name(&plugin.name)?;
    if plugin.lang == Lang::Rust && !is_sdk(&plugin.sdk) {
        return Err(ScaffoldError::NotTheSdk(plugin.sdk.clone()));
    }
    let root = plugin.dir.join(&plugin.name);
    if root.exists() {
        return Err(ScaffoldError::Exists(root));
    }
    let sdk = plugin
        .sdk
        .canonicalize()
        .unwrap_or_else(|_| plugin.sdk.clone());
    let values = Placeholders::new(plugin, &sdk);
    for file in files(plugin.kind, plugin.lang) {
        let path = root.join(file.path);
        write(&path, &values.fill(file.template), file.executable)?;
    }
    Ok(root)
}

/// The values the templates' placeholders take.
struct Placeholders {
    pairs: Vec<(&'static str, String)>,
}

impl Placeholders {
    fn new(plugin: &NewPlugin, sdk: &Path) -> Self {
        let (flag, world, api) = match plugin.kind {
            PluginKind::Drafter => ("cascade", "drafter", "drafter-api"),
            PluginKind::Policy => ("policy", "policy", "policy-api"),
        };
        let wasm = match plugin.lang {
            Lang::Rust => "PATH.wasm".to_owned(),
            Lang::Python => format!("{}.wasm", plugin.name),
        };
        let bench_line = match plugin.kind {
            PluginKind::Drafter => format!(
                "spechost plugin bench {wasm}  # replays a recorded trace: acceptance, ideal speedup, no model\n"
            ),
            PluginKind::Policy => String::new(),
        };
        Self {
            pairs: vec![
                ("{{name}}", plugin.name.clone()),
                ("{{crate}}", plugin.name.replace('-', "_")),
                ("{{kind}}", plugin.kind.as_str().to_owned()),
                ("{{flag}}", flag.to_owned()),
                ("{{admin_field}}", flag.to_owned()),
                ("{{world}}", world.to_owned()),
                ("{{api}}", api.to_owned()),
                ("{{wit_version}}", spechost_sdk::WIT_VERSION.to_owned()),
                ("{{bench_line}}", bench_line),
                ("{{sdk}}", sdk.display().to_string()),
            ],
        }
    }

    fn fill(&self, template: &str) -> String {
        self.pairs
            .iter()
            .fold(template.to_owned(), |text, (key, value)| {
                text.replace(key, value)
            })
    }
}

fn write(path: &Path, contents: &str, executable: bool) -> Result<(), ScaffoldError> {
    let failed = |source| ScaffoldError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    std::fs::write(path, contents).map_err(failed)?;
    if executable {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(failed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spechost-new-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        dir
    }

    #[test]
    fn names_must_fit_a_crate_and_a_file() {
        for good in ["a", "my-drafter", "ngram_3"] {
            check_name(good).expect(good);
        }
        for bad in ["", "My", "3gram", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_project_is_written_with_no_placeholder_left() {
        let sdk = built_sdk().expect("tests run from a checkout");
        let dir = scratch("all");
        for kind in [PluginKind::Drafter, PluginKind::Policy] {
            for lang in [Lang::Rust, Lang::Python] {
                let name = format!("p-{}-{}", kind.as_str(), lang.as_str().to_lowercase());
                let plugin = NewPlugin {
                    name: name.clone(),
                    kind,
                    lang,
                    dir: dir.clone(),
                    sdk: sdk.clone(),
                };
                let root = create(&plugin).expect("created");
                for file in files(kind, lang) {
                    let text = std::fs::read_to_string(root.join(file.path)).expect(file.path);
                    assert!(!text.contains("{{"), "{name}/{}: {text}", file.path);
                }
                let again = create(&plugin).expect_err("exists");
                assert!(again.to_string().contains("already exists"), "{again}");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_rust_project_needs_the_sdk() {
        let plugin = NewPlugin {
            name: "x".into(),
            kind: PluginKind::Drafter,
            lang: Lang::Rust,
            dir: scratch("nosdk"),
            sdk: "/nonexistent".into(),
        };
        let error = create(&plugin).expect_err("no sdk").to_string();
        assert!(error.contains("--sdk"), "{error}");
    }
}
