//! Request bodies as [`ApiError`]-speaking extractors, each read within the server's body
//! timeout (`--body-timeout`): a client that sends its headers and then trickles (or never
//! sends) the body gets 408 instead of holding its connection.
//!
//! - [`ApiJson`]: axum's JSON extractor, its rejections rendered as OpenAI-style errors;
//! - [`ApiBytes`]: the raw body, for endpoints that accept an empty one.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::state::AppState;

/// A JSON request body; a bad body (not JSON, wrong fields, too large, too slow) is an
/// OpenAI-style error, not axum's plain-text one.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let read = Json::<T>::from_request(request, state);
        let Json(value) = within_body_timeout(state, read).await??;
        Ok(Self(value))
    }
}

/// A request body as bytes, read within the body timeout and the body size limit.
#[derive(Debug, Clone)]
pub struct ApiBytes(pub Bytes);

impl FromRequest<AppState> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let read = Bytes::from_request(request, state);
        let bytes = within_body_timeout(state, read)
            .await?
            .map_err(|rejection| {
                let text = rejection.body_text();
                if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::payload_too_large(format!(
                        "{text}; send a smaller body (the server's --max-body-bytes)"
                    ))
                } else {
                    ApiError::invalid(format!("{text}; send the body again"))
                }
            })?;
        Ok(Self(bytes))
    }
}

/// `read` (which reads the body), or 408 once the body timeout has passed.
async fn within_body_timeout<T>(
    state: &AppState,
    read: impl Future<Output = T>,
) -> Result<T, ApiError> {
    let timeout = state.limits.body_timeout;
    tokio::time::timeout(timeout, read).await.map_err(|_| {
        ApiError::request_timeout(format!(
            "the request body did not arrive within {} s (the server's --body-timeout); send it whole and at once",
            timeout.as_secs()
        ))
    })
}
