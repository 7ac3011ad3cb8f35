//! [`AllowedHosts`]: which host names a request may address, checked on every request.
//!
//! A server on loopback is reachable from the browser of anyone on the machine, and a web page
//! can make a browser send requests to it under another name: DNS rebinding points a name the
//! page controls at 127.0.0.1, and the browser then treats the server as the page's own origin.
//! Such requests carry the attacker's name in `Host` (and in `Origin`), so answering only the
//! names the server is known by stops them. The check runs before routing ([`check`]); a
//! refused request gets 403 and never reaches a handler.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::cors;
use super::error::ApiError;
use super::state::AppState;

/// Names a loopback server answers to by default.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The host names requests may address (`--allowed-hosts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any name: a server on a public address, behind a proxy, or told `*`.
    Any,
    /// Only these names (lower case, without port).
    Only(Vec<String>),
}

impl AllowedHosts {
    /// Parses `--allowed-hosts`: `*`, or comma-separated names (ports are ignored).
    pub fn parse(list: &str) -> Result<Self, String> {
        if list.trim() == "*" {
            return Ok(Self::Any);
        }
        let mut names = Vec::new();
        for entry in list.split(',') {
            let entry = entry.trim();
            if entry.contains(['/', ' ', '@']) {
                return Err(format!(
                    "`{entry}` is not a host name; give names like `localhost` or `10.0.0.7`"
                ));
            }
            let name = normalize(host_of_authority(entry));
            if name.is_empty() {
                return Err(
                    "it has an empty entry; list host names separated by commas, e.g. `localhost,spechost.internal`, or `*` for any".into(),
                );
            }
            if name == "*" {
                return Err("`*` must stand alone; it allows any host".into());
            }
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(Self::Only(names))
    }

    /// The default for a server listening on `addresses`: the loopback names (and the
    /// addresses themselves) when every address is a loopback one, any name otherwise.
    pub fn for_listen_addresses(addresses: &[String]) -> Self {
        let mut names = Vec::new();
        for address in addresses {
            match Self::for_listen_address(address) {
                Self::Any => return Self::Any,
                Self::Only(more) => {
                    for name in more {
                        if !names.contains(&name) {
                            names.push(name);
                        }
                    }
                }
            }
        }
        Self::Only(names)
    }

    /// The default for a server listening on `address`: the loopback names (and `address`
    /// itself) for a loopback address, any name otherwise.
    fn for_listen_address(address: &str) -> Self {
        let address = normalize(address.trim_start_matches('[').trim_end_matches(']'));
        let loopback = LOOPBACK_NAMES.contains(&address.as_str())
            || address
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Self::Any;
        }
        let mut names: Vec<String> = LOOPBACK_NAMES.iter().map(|n| (*n).to_owned()).collect();
        if !names.contains(&address) {
            names.push(address);
        }
        Self::Only(names)
    }

    /// Whether a request may address `host` (a `Host` header's value, port allowed).
    pub fn allows(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(names) => {
                let host = normalize(host_of_authority(host));
                names.contains(&host)
            }
        }
    }

    /// Whether a browser page of `origin` (an `Origin` header's value) may call the server.
    fn allows_origin(&self, origin: &str) -> bool {
        match self {
            Self::Any => true,
            // `null` (sandboxed frames, local files) names no host the server is known by.
            Self::Only(_) => origin
                .split_once("://")
                .map(|(_, rest)| rest.split('/').next().unwrap_or_default())
                .is_some_and(|authority| self.allows(authority)),
        }
    }
}

/// The host of `authority` (`host`, `host:port`, `[v6]` or `[v6]:port`), without the port.
fn host_of_authority(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match authority.rsplit_once(':') {
        // One colon: `host:port`. More: a bare IPv6 address.
        Some((host, _)) if !host.contains(':') => host,
        _ => authority,
    }
}

/// Lower case, without a trailing dot (`localhost.` is `localhost`).
fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Refuses requests that address a host name the server does not answer to, or that come from
/// a browser page of another origin.
pub async fn check(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    // A page of an origin `--cors-origins` lists may call the server from a browser.
    let cors_origin = headers
        .get(header::ORIGIN)
        .filter(|origin| {
            state
                .cors_origins
                .allows(origin.to_str().unwrap_or_default())
        })
        .cloned();
    let refused = match host {
        None => Some("the request has no Host header; send one (HTTP/1.1 requires it)".to_owned()),
        Some(host) if !state.allowed_hosts.allows(host) => Some(format!(
            "this server does not answer to the host name `{host}`; address it by a name it is known by, or start it with --allowed-hosts naming `{}`",
            host_of_authority(host)
        )),
        Some(_) if cors_origin.is_some() => None,
        Some(_) => headers
            .get(header::ORIGIN)
            .map(|value| value.to_str().unwrap_or_default())
            .filter(|origin| !state.allowed_hosts.allows_origin(origin))
            .map(|origin| {
                format!(
                    "requests from web pages of origin `{origin}` are refused; this server answers pages served from the hosts in --allowed-hosts, and pages of the origins in --cors-origins"
                )
            }),
    };
    if let Some(message) = refused {
        return ApiError::forbidden("host_not_allowed", message).into_response();
    }
    let Some(origin) = cors_origin else {
        return next.run(request).await;
    };
    let preflight = cors::is_preflight(
        request.method(),
        headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD),
    );
    if preflight {
        return cors::preflight(&origin);
    }
    let mut response = next.run(request).await;
    cors::allow(&mut response, &origin);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_servers_answer_loopback_names_only() {
        let hosts = AllowedHosts::for_listen_address("127.0.0.1");
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:8080",
            "LOCALHOST.",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2",
            "",
            "localhost.evil",
        ] {
            assert!(!hosts.allows(host), "{host}");
        }
        assert_eq!(
            AllowedHosts::for_listen_address("0.0.0.0"),
            AllowedHosts::Any
        );
        assert!(AllowedHosts::for_listen_address("[::1]").allows("[::1]"));
        let both = AllowedHosts::for_listen_addresses(&["127.0.0.1".into(), "::1".into()]);
        assert!(
            both.allows("[::1]:80") && both.allows("127.0.0.1") && !both.allows("evil.example")
        );
        assert_eq!(
            AllowedHosts::for_listen_addresses(&["::1".into(), "0.0.0.0".into()]),
            AllowedHosts::Any
        );
    }

    #[test]
    fn origins_must_be_pages_of_allowed_hosts() {
        let hosts = AllowedHosts::parse("localhost, Spechost.Internal:9000").expect("valid");
        assert!(hosts.allows("spechost.internal:8080"));
        assert!(hosts.allows_origin("http://localhost:3000"));
        assert!(hosts.allows_origin("https://spechost.internal/app"));
        for origin in ["http://evil.example", "null", "localhost"] {
            assert!(!hosts.allows_origin(origin), "{origin}");
        }
        assert!(AllowedHosts::Any.allows_origin("null"));
    }

    #[test]
    fn bad_lists_name_the_problem() {
        assert_eq!(AllowedHosts::parse(" * "), Ok(AllowedHosts::Any));
        for (list, needle) in [
            ("a,,b", "empty entry"),
            ("a,*", "stand alone"),
            ("http://a/b", "not a host name"),
        ] {
            let problem = AllowedHosts::parse(list).expect_err(list);
            assert!(problem.contains(needle), "{list}: {problem}");
        }
    }
}
