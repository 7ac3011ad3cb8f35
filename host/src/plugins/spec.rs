//! Cascade entries and policies as the command line, the TOML file, the admin API and
//! requests write them: [`SourceSpec`] (`lookup`, `./my_drafter.wasm`) and [`PolicySpec`]
//! (`window,raise=0.85`), parsed once by [`parse_cascade`] and [`parse_policy`].

use std::path::PathBuf;

/// Why a cascade or a policy spec was refused; every message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Bad `--cascade` (or `speculative.cascade`, or an admin `cascade`).
    #[error("invalid --cascade `{spec}`: {problem}")]
    Cascade {
        /// The whole spec.
        spec: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Bad `--policy` (or `speculative.policy`, or an admin `policy`).
    #[error("invalid --policy `{spec}`: {problem}")]
    Policy {
        /// The whole spec.
        spec: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// One entry of a cascade: a built-in plugin by name, or a component file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSpec {
    /// A built-in plugin (`lookup`, ...).
    Builtin(String),
    /// A `.wasm` component file.
    Path(PathBuf),
}

impl SourceSpec {
    /// The name used in stats and for `--plugin-config NAME.key=value`: the built-in name, or the
    /// file stem of a path.
    pub fn name(&self) -> String {
        match self {
            Self::Builtin(name) => name.clone(),
            Self::Path(path) => path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            ),
        }
    }
}

/// Parses a cascade spec: `none`, or comma-separated built-in names and `.wasm` paths.
pub fn parse_cascade(spec: &str) -> Result<Vec<SourceSpec>, SpecError> {
    let problem = |problem: &str| SpecError::Cascade {
        spec: spec.to_owned(),
        problem: problem.to_owned(),
    };
    let trimmed = spec.trim();
    if trimmed.is_empty() {
        return Err(problem(
            "it is empty; use `none` for plain decoding or e.g. `lookup`",
        ));
    }
    if trimmed == "none" {
        return Ok(Vec::new());
    }
    let mut sources = Vec::new();
    for entry in trimmed.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(problem(
                "it has an empty entry; separate sources with single commas",
            ));
        }
        if entry == "none" {
            return Err(problem("`none` cannot be combined with other sources"));
        }
        let source = if entry.contains('/') || entry.ends_with(".wasm") {
            SourceSpec::Path(PathBuf::from(entry))
        } else {
            SourceSpec::Builtin(entry.to_owned())
        };
        if sources
            .iter()
            .any(|s: &SourceSpec| s.name() == source.name())
        {
            return Err(problem(&format!("`{}` appears twice", source.name())));
        }
        sources.push(source);
    }
    Ok(sources)
}

/// A `--policy`: which policy plugin, and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// A built-in policy name or a component path.
    pub plugin: SourceSpec,
    /// The policy's own settings, `key=value,key=value` (may be empty).
    pub config: String,
}

impl PolicySpec {
    /// The name shown in stats: the built-in name or the file stem.
    pub fn name(&self) -> String {
        self.plugin.name()
    }
}

/// Parses a policy spec: a built-in name or `.wasm` path, then `,key=value` settings.
pub fn parse_policy(spec: &str) -> Result<PolicySpec, SpecError> {
    let problem = |problem: &str| SpecError::Policy {
        spec: spec.to_owned(),
        problem: problem.to_owned(),
    };
    let mut parts = spec.trim().split(',').map(str::trim);
    let name = parts.next().unwrap_or_default();
    if name.is_empty() {
        return Err(problem(
            "it has no policy name; write e.g. `window` or `fixed,k=8`",
        ));
    }
    if name.contains('=') {
        return Err(problem(
            "it starts with a setting; put the policy name first, e.g. `window,raise=0.85`",
        ));
    }
    let settings: Vec<&str> = parts.collect();
    if let Some(bad) = settings.iter().find(|setting| {
        setting
            .split_once('=')
            .is_none_or(|(k, _)| k.trim().is_empty())
    }) {
        return Err(problem(&format!(
            "setting `{bad}` is not key=value; write e.g. `window,raise=0.85`"
        )));
    }
    let plugin = if name.contains('/') || name.ends_with(".wasm") {
        SourceSpec::Path(PathBuf::from(name))
    } else {
        SourceSpec::Builtin(name.to_owned())
    };
    Ok(PolicySpec {
        plugin,
        config: settings.join(","),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_cascade_names_and_paths() {
        let parsed = parse_cascade("lookup, ./x/my_drafter.wasm").expect("valid");
        assert_eq!(
            parsed,
            vec![
                SourceSpec::Builtin("lookup".into()),
                SourceSpec::Path("./x/my_drafter.wasm".into())
            ]
        );
        assert_eq!(parsed[1].name(), "my_drafter");
        assert!(parse_cascade("none").expect("none").is_empty());
    }
    #[test]
    fn rejects_bad_cascades_with_reason() {
        for (spec, needle) in [
            ("", "empty"),
            ("lookup,,x", "empty entry"),
            ("none,lookup", "cannot be combined"),
            ("lookup,lookup", "twice"),
        ] {
            let err = parse_cascade(spec).expect_err(spec).to_string();
            assert!(err.contains(needle), "{spec:?} gave {err}");
        }
    }
    #[test]
    fn policy_spec_is_a_name_then_settings() {
        let policy = parse_policy("window, raise=0.85,window=64").expect("valid");
        assert_eq!(policy.plugin, SourceSpec::Builtin("window".into()));
        assert_eq!(policy.config, "raise=0.85,window=64");
        let path = parse_policy("./my_policy.wasm").expect("valid");
        assert_eq!(path.plugin, SourceSpec::Path("./my_policy.wasm".into()));
        assert_eq!(path.name(), "my_policy");
        for (bad, needle) in [
            ("", "no policy name"),
            ("k=8", "policy name first"),
            ("fixed,k", "not key=value"),
            ("fixed,=3", "not key=value"),
        ] {
            let message = parse_policy(bad).expect_err(bad).to_string();
            assert!(message.contains(needle), "{bad:?} gave: {message}");
        }
    }
}
