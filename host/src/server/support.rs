//! What the server's API can ask of the engine that this build cannot do yet, in one place.
//!
//! The API already carries every speculation setting (`speculative.policy` and `.mode` in
//! requests, `policy` and `mode` in `PUT /admin/cascade`, `--policy`, `--cascade-mode`,
//! `--draft-model` and `--state-dir` on the command line); they are parsed and validated where
//! they arrive, then checked here. Each function below is the one place where an engine feature
//! plugs in once it exists:
//!
//! - [`cascade_settings`]: the cascade mode becomes the cascade's settings (both modes run);
//! - [`check_speculation`]: policies (adaptive draft length) per request and as defaults;
//! - [`check_draft_model`]: a draft model beside the target;
//! - [`check_state_dir`]: persisting plugins' cross-request state.

use std::path::Path;

use super::hotswap::Speculation;
use crate::cascade::CascadeSettings;
use crate::config::CascadeMode;

/// A setting the API accepts but this build's engine cannot honour yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} is not supported by this build yet; {instead}")]
pub struct Unsupported {
    /// The setting, as the user wrote it (`speculative.mode "scored"`, `--draft-model`, ...).
    pub setting: String,
    /// What to do instead.
    pub instead: &'static str,
}

/// The settings of a cascade running in `mode`.
pub fn cascade_settings(mode: CascadeMode) -> Result<CascadeSettings, Unsupported> {
    match mode {
        CascadeMode::First => Ok(CascadeSettings::default()),
        CascadeMode::Scored => Ok(CascadeSettings {
            mode: CascadeMode::Scored,
            ..CascadeSettings::default()
        }),
    }
}

/// Checks that speculation settings (a request's, or the defaults) can run.
pub fn check_speculation(speculation: &Speculation) -> Result<(), Unsupported> {
    cascade_settings(speculation.mode)?;
    match &speculation.policy {
        None => Ok(()),
        Some(policy) => Err(Unsupported {
            setting: format!("policy `{policy}`"),
            instead: "leave the policy out; draft_max sets a fixed draft length",
        }),
    }
}

/// Checks that the server can run with the draft model at `draft_model`, if any.
pub fn check_draft_model(draft_model: Option<&Path>) -> Result<(), Unsupported> {
    match draft_model {
        None => Ok(()),
        Some(path) => Err(Unsupported {
            setting: format!("--draft-model {}", path.display()),
            instead: "leave --draft-model out and draft with plugins (--cascade)",
        }),
    }
}

/// Checks that plugins' cross-request state can persist to `state_dir`, if any.
pub fn check_state_dir(state_dir: Option<&Path>) -> Result<(), Unsupported> {
    match state_dir {
        None => Ok(()),
        Some(dir) => Err(Unsupported {
            setting: format!("--state-dir {}", dir.display()),
            instead: "leave --state-dir out; plugin caches then live as long as the server",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn speculation(mode: CascadeMode, policy: Option<&str>) -> Speculation {
        Speculation {
            cascade: vec!["lookup".into()],
            draft_max: 8,
            mode,
            policy: policy.map(str::to_owned),
        }
    }

    #[test]
    fn both_modes_without_policy_run_and_a_policy_says_not_yet() {
        assert!(check_speculation(&speculation(CascadeMode::First, None)).is_ok());
        assert!(check_speculation(&speculation(CascadeMode::Scored, None)).is_ok());
        let err = check_speculation(&speculation(CascadeMode::First, Some("adaptive")))
            .expect_err("policies are not served yet")
            .to_string();
        assert!(
            err.contains("`adaptive`") && err.contains("not supported by this build yet"),
            "message: {err}"
        );
        assert!(check_draft_model(Some(Path::new("d.gguf"))).is_err());
        assert!(check_state_dir(None).is_ok());
    }
}
