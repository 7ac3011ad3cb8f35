//! [`CorsOrigins`]: the browser pages of other origins that may call the server
//! (`--cors-origins`), as llama-server's web UIs and browser clients need.
//!
//! Without the flag a page of another origin is refused (`hosts.rs`: a page could otherwise
//! reach a loopback server through its user's browser). With it, a page of a listed origin
//! (or any, with `*`) gets its preflight (`OPTIONS`) answered and `Access-Control-Allow-Origin`
//! on every answer; the `Host` check still applies, so DNS rebinding stays refused. API keys
//! still apply to the inference endpoints: a listed origin only lets the browser read answers.

use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Methods a preflight allows.
const ALLOW_METHODS: &str = "GET, POST, PUT, OPTIONS";
/// Request headers a preflight allows.
const ALLOW_HEADERS: &str = "Authorization, Content-Type, X-Api-Key";
/// How long a browser may cache a preflight's answer, in seconds.
const MAX_AGE_SECS: &str = "86400";

/// Origins whose pages may call the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsOrigins {
    /// None: pages of other origins are refused.
    #[default]
    None,
    /// Any origin (`*`).
    Any,
    /// These origins (`scheme://host[:port]`, lower case, no trailing slash).
    Only(Vec<String>),
}

impl CorsOrigins {
    /// Parses `--cors-origins`: `*`, or comma-separated origins such as
    /// `https://ui.example.com,http://localhost:5173`.
    pub fn parse(list: &str) -> Result<Self, String> {
        if list.trim() == "*" {
            return Ok(Self::Any);
        }
        let mut origins = Vec::new();
        for origin in list.split(',').map(str::trim) {
            let valid = origin.split_once("://").is_some_and(|(scheme, rest)| {
                matches!(scheme, "http" | "https") && !rest.is_empty() && !rest.contains('/')
            });
            if !valid {
                return Err(format!(
                    "`{origin}` is not an origin; give scheme://host[:port] (no path), comma-separated, or *"
                ));
            }
            origins.push(origin.to_ascii_lowercase());
        }
        Ok(Self::Only(origins))
    }

    /// Whether a page of `origin` (an `Origin` header's value) may call the server.
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            Self::None => false,
            Self::Any => true,
            Self::Only(origins) => {
                let origin = origin.trim_end_matches('/').to_ascii_lowercase();
                origins.contains(&origin)
            }
        }
    }
}

/// Whether `method` with these headers is a CORS preflight.
pub fn is_preflight(method: &Method, has_request_method: bool) -> bool {
    method == Method::OPTIONS && has_request_method
}

/// The answer to a preflight from an allowed `origin`.
pub fn preflight(origin: &HeaderValue) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    allow(&mut response, origin);
    let headers = response.headers_mut();
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOW_METHODS),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(ALLOW_HEADERS),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(MAX_AGE_SECS),
    );
    response
}

/// Lets the page of `origin` read `response`.
pub fn allow(response: &mut Response, origin: &HeaderValue) {
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_parsed_and_matched_whole() {
        let origins = CorsOrigins::parse("https://UI.example.com, http://localhost:5173")
            .expect("two origins");
        assert!(origins.allows("https://ui.example.com"));
        assert!(origins.allows("http://localhost:5173/"));
        assert!(!origins.allows("http://localhost:5174"));
        assert!(!origins.allows("https://ui.example.com.evil.net"));
        assert!(!origins.allows("null"));
        assert!(CorsOrigins::parse("*").expect("any").allows("null"));
        assert!(!CorsOrigins::None.allows("http://localhost"));
        for bad in [
            "ui.example.com",
            "https://ui.example.com/path",
            "ftp://x",
            "",
        ] {
            assert!(CorsOrigins::parse(bad).is_err(), "{bad}");
        }
    }
}
