//! [`ApiError`]: every failure of the HTTP API, rendered as OpenAI-style error JSON
//! (`{"error": {"message", "type", "param", "code"}}`) with the right status code.
//!
//! Handlers return `Result<_, ApiError>` and use `?`; domain errors convert with `From`.

use std::borrow::Cow;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::registry::UpdateError;
use super::scheduler::Rejected;

/// An error answer of the API. Build it with the constructors; each names the fix in its
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    param: Option<Cow<'static, str>>,
    message: String,
    retry_after_secs: Option<u64>,
    bearer_challenge: bool,
}

/// The JSON body of an error.
#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            code: None,
            param: None,
            message: message.into(),
            retry_after_secs: None,
            bearer_challenge: false,
        }
    }

    /// 400: the request is malformed or asks for something invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 about one request parameter.
    pub fn invalid_param(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(Cow::Borrowed(param)),
            ..Self::invalid(message)
        }
    }

    /// 400 about a request field named by the client (one the server does not read).
    pub fn invalid_field(name: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(Cow::Owned(name.to_owned())),
            ..Self::invalid(message)
        }
    }

    /// The same error, about the request parameter `param` when it is a 400 (a refusal of
    /// another kind is not the parameter's fault).
    pub fn about_param(self, param: &'static str) -> Self {
        if self.status == StatusCode::BAD_REQUEST {
            Self {
                param: Some(Cow::Borrowed(param)),
                ..self
            }
        } else {
            self
        }
    }

    /// 400: prompt and `max_tokens` do not fit in the context.
    pub fn context_length_exceeded(message: impl Into<String>) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            param: Some(Cow::Borrowed("max_tokens")),
            ..Self::invalid(message)
        }
    }

    /// 401: the admin bearer token is missing or wrong.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            code: Some("invalid_api_key"),
            bearer_challenge: true,
            ..Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
        }
    }

    /// 403: the request may not be served here (a host name the server does not answer to).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            ..Self::new(StatusCode::FORBIDDEN, "invalid_request_error", message)
        }
    }

    /// 404: no such route or model.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    /// 413: the body is larger than the server accepts.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
    }

    /// 422: a plugin update was refused (it did not load or failed its smoke test).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            message,
        )
    }

    /// 429: the queue is full; retry after `retry_after_secs`.
    pub fn queue_full(message: impl Into<String>, retry_after_secs: u64) -> Self {
        Self {
            code: Some("queue_full"),
            retry_after_secs: Some(retry_after_secs),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    /// 429: a client sent too many wrong admin tokens; retry after `retry_after_secs`.
    pub fn rate_limited(message: impl Into<String>, retry_after_secs: u64) -> Self {
        Self {
            code: Some("rate_limited"),
            retry_after_secs: Some(retry_after_secs),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    /// 408: the client did not send its request body in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            message,
        )
    }

    /// 503: the server is shutting down, or has all the connections it keeps.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            retry_after_secs: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 500: generation failed inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The message shown to the client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The `{"error": ...}` JSON value, also sent as an SSE event when a stream fails.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self.body()).unwrap_or_default()
    }

    fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after_secs {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.bearer_challenge {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"spechost\""),
            );
        }
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let text = rejection.body_text();
        match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => Self::payload_too_large(format!(
                "{text}; send a smaller body (the server's --max-body-bytes)"
            )),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!("{text}; send the body as JSON with `Content-Type: application/json`"),
            ),
            _ => Self::invalid(format!("{text}; check the request body against the API")),
        }
    }
}

impl From<UpdateError> for ApiError {
    fn from(error: UpdateError) -> Self {
        let message = error.to_string();
        match error {
            UpdateError::Load { .. }
            | UpdateError::SmokeTest { .. }
            | UpdateError::NameClash { .. } => Self::unprocessable(message),
            _ => Self::invalid(message),
        }
    }
}

impl From<Rejected> for ApiError {
    fn from(rejected: Rejected) -> Self {
        let message = rejected.to_string();
        match rejected {
            Rejected::Full {
                retry_after_secs, ..
            } => Self::queue_full(message, retry_after_secs),
            Rejected::ShuttingDown => Self::unavailable(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openai_error_json_with_retry_after() {
        let error = ApiError::queue_full("queue is full", 3);
        assert_eq!(
            error.to_json(),
            serde_json::json!({"error": {"message": "queue is full", "type": "rate_limit_error", "param": null, "code": "queue_full"}})
        );
        let response = error.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from(3u64))
        );
    }

    #[test]
    fn unauthorized_carries_a_bearer_challenge() {
        let response = ApiError::unauthorized("no token").into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert!(
            response.headers().contains_key(header::WWW_AUTHENTICATE),
            "headers: {:?}",
            response.headers()
        );
    }
}
