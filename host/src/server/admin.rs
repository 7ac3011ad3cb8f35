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
//! (`registry/`); a refused update answers 422 and changes nothing. With `--share`, an update
//! that succeeded is also published to the other replicas (`share/`), which apply it through
//! the same checks.
//!
//! Wrong tokens are rate-limited per client address ([`AuthFailures`]): an address may fail
//! [`AUTH_FAILURE_BURST`] times, then once per [`AUTH_FAILURE_REFILL`]; past that its attempts
//! are answered 429 without looking at the token. `GET /metrics` needs the same token unless
//! the server runs with `--public-metrics` ([`MetricsReader`]).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap, header};
use serde::{Deserialize, Deserializer, Serialize};

use super::error::ApiError;
use super::extract::{ApiBytes, ApiJson};
use super::metrics::ReloadOutcome;
use super::plugin_dirs::PluginDirs;
use super::registry::{
    DefaultsUpdate, PluginInfo, PolicyInfo, ReloadReport, Snapshot, Speculation, UpdateError,
};
use super::state::AppState;
use crate::cascade::CascadeMode;
use crate::plugins::{SourceSpec, parse_cascade};

/// Wrong admin tokens an address may send in a burst.
pub const AUTH_FAILURE_BURST: f64 = 10.0;
/// Time after which an address may send one more wrong token.
pub const AUTH_FAILURE_REFILL: Duration = Duration::from_secs(6);
/// Addresses whose failures are remembered; past it, fully forgiven ones are forgotten first.
const MAX_TRACKED_ADDRESSES: usize = 4096;

/// Wrong admin tokens by client address, as token buckets.
#[derive(Debug, Default)]
pub struct AuthFailures {
    buckets: Mutex<HashMap<IpAddr, Allowance>>,
}

/// How many more wrong tokens an address may send, as of `updated`.
#[derive(Debug, Clone, Copy)]
struct Allowance {
    left: f64,
    updated: Instant,
}

impl Allowance {
    fn refilled(self, now: Instant) -> f64 {
        let earned = now.saturating_duration_since(self.updated).as_secs_f64()
            / AUTH_FAILURE_REFILL.as_secs_f64();
        (self.left + earned).min(AUTH_FAILURE_BURST)
    }
}

impl AuthFailures {
    fn buckets(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Allowance>> {
        // Each entry is written whole: a panic elsewhere cannot leave one half-updated.
        self.buckets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Err(seconds to wait)` while `client` has used up its wrong tokens.
    pub fn check(&self, client: IpAddr, now: Instant) -> Result<(), u64> {
        match self.buckets().get(&client) {
            Some(allowance) if allowance.refilled(now) < 1.0 => {
                let missing = 1.0 - allowance.refilled(now);
                Err((missing * AUTH_FAILURE_REFILL.as_secs_f64())
                    .ceil()
                    .max(1.0) as u64)
            }
            _ => Ok(()),
        }
    }

    /// Counts a wrong token from `client`.
    pub fn record_failure(&self, client: IpAddr, now: Instant) {
        let mut buckets = self.buckets();
        if buckets.len() >= MAX_TRACKED_ADDRESSES && !buckets.contains_key(&client) {
            buckets.retain(|_, allowance| allowance.refilled(now) < AUTH_FAILURE_BURST);
            if buckets.len() >= MAX_TRACKED_ADDRESSES
                && let Some(&oldest) = buckets
                    .iter()
                    .min_by_key(|(_, allowance)| allowance.updated)
                    .map(|(address, _)| address)
            {
                buckets.remove(&oldest);
            }
        }
        let left = buckets
            .get(&client)
            .map_or(AUTH_FAILURE_BURST, |allowance| allowance.refilled(now));
        buckets.insert(
            client,
            Allowance {
                left: left - 1.0,
                updated: now,
            },
        );
    }
}

/// The client's address, from a request's `extensions`, or the unspecified address for a
/// request without a connection (a router driven in tests).
fn client_address(extensions: &Extensions) -> IpAddr {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |info| info.0.ip())
}

/// Proof that a request carries the admin token. Extracting it fails with 401 otherwise, and
/// with 429 for an address that sent too many wrong tokens.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(expected) = &state.admin_token else {
            return Err(ApiError::not_found(
                "unknown_route",
                "the admin endpoints are off; start the server with --admin-token-file",
            ));
        };
        check_secret(
            state,
            &parts.extensions,
            bearer(&parts.headers),
            std::slice::from_ref(expected),
            "admin token",
        )?;
        Ok(Admin)
    }
}

/// The bearer token of a request's `Authorization` header.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
}

/// Checks the secret a request sends (`given`) against the `expected` ones (compared in
/// constant time), counting wrong ones against the client's address (from the request's
/// `extensions`): 429 while the address has used up its allowance, 401 naming the secret
/// (`name`) when it is wrong or missing.
pub(super) fn check_secret(
    state: &AppState,
    extensions: &Extensions,
    given: Option<&str>,
    expected: &[String],
    name: &str,
) -> Result<(), ApiError> {
    let client = client_address(extensions);
    let now = Instant::now();
    if let Err(retry_after_secs) = state.auth_failures.check(client, now) {
        return Err(ApiError::rate_limited(
            format!("too many wrong {name}s from {client}; retry after {retry_after_secs} s"),
            retry_after_secs,
        ));
    }
    let how = format!("send the server's {name} as `Authorization: Bearer <{name}>`");
    match given {
        Some(secret)
            if expected
                .iter()
                .any(|expected| same_secret(secret.as_bytes(), expected.as_bytes())) =>
        {
            Ok(())
        }
        Some(_) => {
            state.auth_failures.record_failure(client, now);
            Err(ApiError::unauthorized(format!("wrong {name}; {how}")))
        }
        None => Err(ApiError::unauthorized(format!("missing {name}; {how}"))),
    }
}

/// Proof that a request may read `/metrics`: anyone with `--public-metrics`, else holders of
/// the admin token.
#[derive(Debug, Clone, Copy)]
pub struct MetricsReader;

impl FromRequestParts<AppState> for MetricsReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if state.public_metrics {
            return Ok(Self);
        }
        if state.admin_token.is_none() {
            return Err(ApiError::not_found(
                "unknown_route",
                "GET /metrics is off: its per-source statistics say something about every tenant's outputs; start the server with --public-metrics, or with --admin-token-file and send the token",
            ));
        }
        Admin::from_request_parts(parts, state).await.map(|_| Self)
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub(super) fn same_secret(given: &[u8], expected: &[u8]) -> bool {
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
    #[serde(rename = "draft_max")]
    pub max_draft_len: Option<usize>,
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
        max_draft_len: body.max_draft_len,
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
    state.sharing.publish_update(&result);
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
    ApiBytes(body): ApiBytes,
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
    state.sharing.publish_update(&state.registry.snapshot());
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
    fn wrong_tokens_are_limited_per_address_and_forgiven_over_time() {
        let failures = AuthFailures::default();
        let start = Instant::now();
        let attacker = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let operator = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        for attempt in 0..AUTH_FAILURE_BURST as usize {
            assert_eq!(failures.check(attacker, start), Ok(()), "attempt {attempt}");
            failures.record_failure(attacker, start);
        }
        let wait = failures.check(attacker, start).expect_err("burst used up");
        assert_eq!(wait, AUTH_FAILURE_REFILL.as_secs());
        assert_eq!(
            failures.check(operator, start),
            Ok(()),
            "other addresses are not held up"
        );
        let later = start + AUTH_FAILURE_REFILL;
        assert_eq!(
            failures.check(attacker, later),
            Ok(()),
            "one more try per refill"
        );
        failures.record_failure(attacker, later);
        assert!(failures.check(attacker, later).is_err());
    }

    #[test]
    fn remembered_addresses_are_bounded() {
        let failures = AuthFailures::default();
        let now = Instant::now();
        for i in 0..(MAX_TRACKED_ADDRESSES as u32 + 100) {
            failures.record_failure(IpAddr::V4(Ipv4Addr::from(i)), now);
        }
        assert!(failures.buckets().len() <= MAX_TRACKED_ADDRESSES);
    }

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
