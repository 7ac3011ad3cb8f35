//! The admin endpoints, on only when the server has an admin token, and then only for requests
//! that carry it as `Authorization: Bearer <token>`:
//!
//! - `GET /admin/cascade`: the published defaults and every loaded plugin (path, sha256,
//!   config);
//! - `PUT /admin/cascade`: new defaults (`cascade`, `draft_max`, `mode`, `policy`) and plugin
//!   configs; new `.wasm` paths in `cascade` and `policy` are loaded, from the plugin
//!   directories only (`plugin_dirs.rs`: relative to them, no `..`, no symlink out; 400
//!   otherwise);
//! - `POST /admin/plugins/reload`: loads plugins again from their files (`{"plugins": [...]}`,
//!   or all).
//!
//! Updates compile and smoke-test plugins on a blocking thread, then publish atomically
//! (`hotswap.rs`); a refused update answers 422 and changes nothing.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, State};
use axum::http::header;
use axum::http::request::Parts;
use serde::{Deserialize, Deserializer, Serialize};

use super::error::ApiError;
use super::extract::ApiJson;
use super::hotswap::{
    DefaultsUpdate, PluginInfo, PolicyInfo, ReloadReport, Snapshot, Speculation, UpdateError,
};
use super::metrics::ReloadOutcome;
use super::plugin_dirs::PluginDirs;
use super::state::AppState;
use crate::config::{CascadeMode, SourceSpec, parse_cascade};

/// Proof that a request carries the admin token. Extracting it fails with 401 otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(expected) = &state.admin_token else {
            return Err(ApiError::not_found(
                "unknown_route",
                "the admin endpoints are off; start the server with --admin-token",
            ));
        };
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match given {
            Some(token) if same_secret(token.as_bytes(), expected.as_bytes()) => Ok(Admin),
            Some(_) => Err(ApiError::unauthorized(
                "wrong admin token; send the server's --admin-token as `Authorization: Bearer <token>`",
            )),
            None => Err(ApiError::unauthorized(
                "missing admin token; send the server's --admin-token as `Authorization: Bearer <token>`",
            )),
        }
    }
}

/// Compares two secrets in time that depends only on their lengths.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |differences, (a, b)| differences | (a ^ b))
            == 0
}

/// What `GET` and `PUT /admin/cascade` answer.
#[derive(Debug, Serialize)]
pub struct RegistryView {
    generation: u64,
    defaults: Speculation,
    plugins: Vec<PluginInfo>,
    policies: Vec<PolicyInfo>,
}

impl From<&Snapshot> for RegistryView {
    fn from(snapshot: &Snapshot) -> Self {
        Self {
            generation: snapshot.generation,
            defaults: snapshot.defaults.clone(),
            plugins: snapshot.plugins(),
            policies: snapshot.policies(),
        }
    }
}

/// A plugin config: the plugin's own `key=value,...` string, or a JSON object of settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PluginConfig {
    /// `key=value,key=value`.
    Text(String),
    /// `{"key": value, ...}`.
    Settings(serde_json::Map<String, serde_json::Value>),
}

impl PluginConfig {
    fn into_config_string(self) -> String {
        match self {
            Self::Text(text) => text,
            Self::Settings(settings) => settings
                .into_iter()
                .map(|(key, value)| match value {
                    serde_json::Value::String(text) => format!("{key}={text}"),
                    other => format!("{key}={other}"),
                })
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// `PUT /admin/cascade` body; every field is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CascadeUpdateBody {
    /// New default cascade, as `--cascade` (names, or `.wasm` paths inside the plugin
    /// directories, or `none`).
    pub cascade: Option<String>,
    /// New default draft length.
    pub draft_max: Option<usize>,
    /// New default cascade mode.
    pub mode: Option<CascadeMode>,
    /// New default policy (a name, or a `.wasm` path inside the plugin directories, then
    /// settings); `null` removes it.
    #[serde(default, deserialize_with = "present")]
    pub policy: Option<Option<String>>,
    /// New plugin configs, by plugin name.
    #[serde(default)]
    pub plugin_configs: BTreeMap<String, PluginConfig>,
}

/// Tells a field given as `null` (`Some(None)`) from a missing one (`None`, by `default`).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}

/// `POST /admin/plugins/reload` body; an empty body reloads every plugin.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReloadBody {
    /// Plugins to reload, by name.
    pub plugins: Option<Vec<String>>,
}

/// `GET /admin/cascade`.
pub async fn show(_: Admin, State(state): State<AppState>) -> Json<RegistryView> {
    Json(RegistryView::from(&*state.registry.snapshot()))
}

/// `PUT /admin/cascade`.
pub async fn update(
    _: Admin,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CascadeUpdateBody>,
) -> Result<Json<RegistryView>, ApiError> {
    let cascade = body
        .cascade
        .as_deref()
        .map(|spec| confined_cascade(&state.plugin_dirs, spec))
        .transpose()
        .map_err(|error| refused(&state, error))?;
    let policy = body
        .policy
        .map(|policy| {
            policy
                .map(|spec| state.plugin_dirs.confine_policy(spec))
                .transpose()
        })
        .transpose()
        .map_err(|e| refused(&state, ApiError::invalid_param("policy", e.to_string())))?;
    let update = DefaultsUpdate {
        cascade,
        draft_max: body.draft_max,
        mode: body.mode,
        policy,
        plugin_configs: body
            .plugin_configs
            .into_iter()
            .map(|(name, config)| (name, config.into_config_string()))
            .collect(),
    };
    let registry = std::sync::Arc::clone(&state.registry);
    let result = run_update(&state, move || registry.update_defaults(update)).await?;
    Ok(Json(RegistryView::from(&*result)))
}

/// The entries of a `cascade` given over the API, each path confined to the plugin directories.
fn confined_cascade(dirs: &PluginDirs, spec: &str) -> Result<Vec<SourceSpec>, ApiError> {
    let invalid = |message: String| ApiError::invalid_param("cascade", message);
    parse_cascade(spec)
        .map_err(|e| invalid(e.to_string()))?
        .into_iter()
        .map(|entry| {
            dirs.confine_source(entry)
                .map_err(|e| invalid(e.to_string()))
        })
        .collect()
}

/// Logs and counts an update refused before it reached the registry, and passes it on.
fn refused(state: &AppState, error: ApiError) -> ApiError {
    tracing::warn!(message = error.message(), "plugin update refused");
    state.metrics.reload(ReloadOutcome::Rejected);
    error
}

/// `POST /admin/plugins/reload`.
pub async fn reload(
    _: Admin,
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<ReloadReport>, ApiError> {
    let body: ReloadBody = if body.iter().all(u8::is_ascii_whitespace) {
        ReloadBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::invalid(format!(
                "{e}; send {{\"plugins\": [\"name\", ...]}} or an empty body to reload every plugin"
            ))
        })?
    };
    let registry = std::sync::Arc::clone(&state.registry);
    let report = run_update(&state, move || registry.reload(body.plugins.as_deref())).await?;
    Ok(Json(report))
}

/// Runs a registry update on a blocking thread and counts its outcome.
async fn run_update<T: Send + 'static>(
    state: &AppState,
    update: impl FnOnce() -> Result<T, UpdateError> + Send + 'static,
) -> Result<T, ApiError> {
    let result = tokio::task::spawn_blocking(update)
        .await
        .map_err(|e| ApiError::internal(format!("the plugin update panicked: {e}")))?;
    match result {
        Ok(value) => {
            state.metrics.reload(ReloadOutcome::Published);
            Ok(value)
        }
        Err(error) => {
            tracing::warn!(%error, "plugin update refused");
            state.metrics.reload(ReloadOutcome::Rejected);
            Err(error.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3creT"));
        assert!(!same_secret(b"s3cre", b"s3cret"));
        assert!(!same_secret(b"", b"x"));
    }

    #[test]
    fn update_body_tells_null_policy_from_missing_and_takes_object_configs() {
        let body: CascadeUpdateBody = serde_json::from_value(serde_json::json!({
            "policy": null,
            "plugin_configs": {"suffix": {"max_depth": 32, "use_global": true}, "lookup": "max_ngram=3"}
        }))
        .expect("valid body");
        assert_eq!(body.policy, Some(None));
        let configs: BTreeMap<String, String> = body
            .plugin_configs
            .into_iter()
            .map(|(name, config)| (name, config.into_config_string()))
            .collect();
        assert_eq!(configs["suffix"], "max_depth=32,use_global=true");
        assert_eq!(configs["lookup"], "max_ngram=3");
        let missing: CascadeUpdateBody =
            serde_json::from_value(serde_json::json!({})).expect("empty body");
        assert_eq!(missing.policy, None);
        assert!(
            serde_json::from_value::<CascadeUpdateBody>(serde_json::json!({"casade": "x"}))
                .is_err(),
            "typos are refused"
        );
    }
}
