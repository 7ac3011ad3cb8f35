//! [`router`]: every route of the API over one [`AppState`], apart from sockets and the runtime
//! so that it can be driven in tests.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::routing::{get, post};

use super::error::ApiError;
use super::state::AppState;
use super::{admin, chat, completions, hosts, metrics, models};

/// The API: OpenAI-compatible generation, models, health, metrics (which need the admin token
/// unless the state says they are public), and the admin endpoints (which answer 404 unless
/// the state has an admin token). Requests addressing a host name the server does not answer
/// to get 403; bodies larger than the state's `max_body_bytes` get 413.
pub fn router(state: AppState) -> Router {
    let max_body_bytes = state.limits.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(completions::create))
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/models", get(models::list))
        .route("/health", get(models::health))
        .route("/metrics", get(metrics::page))
        .route("/admin/cascade", get(admin::show).put(admin::update))
        .route("/admin/plugins/reload", post(admin::reload))
        .fallback(unknown_route)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            hosts::check,
        ))
        .with_state(state)
}

async fn unknown_route(uri: Uri) -> ApiError {
    ApiError::not_found(
        "unknown_route",
        format!(
            "no route {}; the API has /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics and /admin/...",
            uri.path()
        ),
    )
}
