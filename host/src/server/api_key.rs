//! API keys of the inference endpoints (`--api-key`, `--api-key-file`), as llama-server's:
//! with keys set, a request to generate or tokenize must send one as `Authorization: Bearer
//! <key>` or `X-Api-Key: <key>`, else it gets 401; `/health` and the model list stay open.
//! Wrong keys count against the client's address as wrong admin tokens do (`admin.rs`): past
//! the allowance its requests get 429 without their key being looked at.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::admin::{bearer, check_secret};
use super::error::ApiError;
use super::state::AppState;

/// The header llama-server also takes a key from.
const X_API_KEY: &str = "x-api-key";

/// Lets a request through when the server has no API keys or the request sends one of them.
pub async fn require(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.api_keys.is_empty() {
        return next.run(request).await;
    }
    match check(&state, &request) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

fn check(state: &AppState, request: &Request) -> Result<(), ApiError> {
    check_secret(
        state,
        request.extensions(),
        given_key(request.headers()),
        &state.api_keys,
        "API key",
    )
}

/// The key a request sends: its bearer token, else its `X-Api-Key` header.
fn given_key(headers: &HeaderMap) -> Option<&str> {
    bearer(headers).or_else(|| headers.get(X_API_KEY).and_then(|value| value.to_str().ok()))
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, header};

    use super::*;

    #[test]
    fn a_key_comes_from_the_bearer_token_or_x_api_key() {
        let mut headers = HeaderMap::new();
        assert_eq!(given_key(&headers), None);
        headers.insert(X_API_KEY, HeaderValue::from_static("from-header"));
        assert_eq!(given_key(&headers), Some("from-header"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer from-bearer"),
        );
        assert_eq!(given_key(&headers), Some("from-bearer"));
    }
}
