//! [`router`]: every route of the API over one [`AppState`], apart from sockets and the runtime
//! so that it can be driven in tests.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::routing::{get, post};

use super::error::ApiError;
use super::state::AppState;
use super::{admin, api_key, chat, completions, hosts, metrics, models, tokens};

/// The API: OpenAI-compatible generation and llama-server's tokenizer and properties endpoints
/// (which need an API key when the state has keys, as llama-server's do), models, health, metrics (which need the admin token
/// unless the state says they are public), and the admin endpoints (which answer 404 unless
/// the state has an admin token). Every OpenAI route answers with and without its `/v1`
/// prefix, as llama-server's do. Requests addressing a host name the server does not answer
/// to get 403; bodies larger than the state's `max_body_bytes` get 413.
pub fn router(state: AppState) -> Router {
    let max_body_bytes = state.limits.max_body_bytes;
    let inference = Router::new()
        .route("/v1/completions", post(completions::create))
        .route("/completions", post(completions::create))
        .route("/v1/chat/completions", post(chat::create))
        .route("/chat/completions", post(chat::create))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/apply-template", post(chat::apply_template))
        .route("/props", get(models::props))
        .route("/slots", get(models::slots))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            api_key::require,
        ));
    Router::new()
        .merge(inference)
        .route("/v1/models", get(models::list))
        .route("/models", get(models::list))
        .route("/health", get(models::health))
        .route("/v1/health", get(models::health))
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
            "no route {}; the API has /v1/completions, /v1/chat/completions, /v1/models (each also without /v1), /tokenize, /detokenize, /props, /health, /metrics and /admin/...",
            uri.path()
        ),
    )
}

#[cfg(test)]
mod tests {
    //! The router without a model or sockets: every refusal answers its status and OpenAI-style
    //! error JSON before a request reaches a slot.

    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{Request, StatusCode, header};
    use serde_json::{Value, json};
    use tower::ServiceExt;

    use super::router;
    use crate::cascade::{CascadeMode, ModelFacts, Token};
    use crate::engine::{EngineError, Grammar, GrammarError, MessageContents, SamplingParams};
    use crate::plugins::{PluginHost, PluginHostConfig, SandboxLimits};
    use crate::server::admin::AuthFailures;
    use crate::server::hosts::AllowedHosts;
    use crate::server::plugin_dirs::PluginDirs;
    use crate::server::registry::{Registry, Speculation};
    use crate::server::scheduler::Queue;
    use crate::server::state::{AppState, PromptTokenizer, RequestLimits, Shared};

    const VOCAB_SIZE: u32 = 256;
    const CTX_SIZE: u32 = 128;
    const MAX_BODY_BYTES: usize = 1024;
    const ADMIN_TOKEN: &str = "router-test-admin-token";

    /// One token per byte: enough to tell prompt lengths apart.
    struct ByteTokenizer;

    impl PromptTokenizer for ByteTokenizer {
        fn vocab_size(&self) -> u32 {
            VOCAB_SIZE
        }

        fn tokenize_messages(
            &self,
            messages: &[(&str, &str)],
            _contents: MessageContents,
        ) -> Result<Vec<Token>, EngineError> {
            let text: String = messages.iter().map(|(_, content)| *content).collect();
            Ok(self.tokenize_raw(&text))
        }

        fn tokenize(&self, text: &str, _add_special: bool, _parse_special: bool) -> Vec<Token> {
            text.bytes().map(u32::from).collect()
        }

        fn piece(&self, token: Token, _special: bool) -> Vec<u8> {
            vec![token as u8]
        }

        fn template(&self, messages: &[(&str, &str)]) -> Result<String, EngineError> {
            Ok(messages.iter().map(|(_, content)| *content).collect())
        }

        /// No grammar is followed on this vocabulary: the router's tests send none.
        fn check_grammar(&self, _grammar: &Grammar) -> Result<(), GrammarError> {
            Err(GrammarError::Invalid(
                ": the test tokenizer has no model".into(),
            ))
        }
    }

    /// A server state without plugins whose queue refuses every request (no slot, no room), so
    /// a request that passes every check answers 429.
    fn state(admin_token: Option<&str>) -> AppState {
        let facts = ModelFacts {
            vocab_size: VOCAB_SIZE,
            bos: None,
            eos: Some(0),
            eog: vec![0],
            context_size: CTX_SIZE,
        };
        let host = PluginHost::new(PluginHostConfig {
            cache_dir: None,
            plugin_dirs: Vec::new(),
            limits: SandboxLimits::default(),
            state_dir: None,
        })
        .expect("a plugin host");
        let defaults = Speculation {
            cascade: Vec::new(),
            max_draft_len: 8,
            mode: CascadeMode::First,
            grammar_drafts: true,
            policy: None,
        };
        let registry = Registry::start(
            host,
            facts,
            Vec::new(),
            Vec::new(),
            BTreeMap::new(),
            defaults,
        )
        .expect("a registry without plugins");
        AppState::new(Shared {
            model_id: "router-test".to_owned(),
            model_aliases: vec!["router-test".to_owned()],
            accept_any_model: false,
            model_path: "router-test.gguf".to_owned(),
            chat_template: "chatml".to_owned(),
            tokenizer: Arc::new(ByteTokenizer),
            limits: RequestLimits {
                default_max_tokens: 16,
                max_tokens_limit: 32,
                max_body_bytes: MAX_BODY_BYTES,
                ctx_size: CTX_SIZE,
                max_draft_len: 8,
                body_timeout: Duration::from_secs(5),
            },
            sampling: SamplingParams::greedy(),
            queue: Arc::new(Queue::new(0, 0)),
            registry: Arc::new(registry),
            metrics: Arc::default(),
            admin_token: admin_token.map(str::to_owned),
            api_keys: Vec::new(),
            auth_failures: AuthFailures::default(),
            public_metrics: false,
            allowed_hosts: AllowedHosts::for_listen_addresses(&["127.0.0.1".to_owned()]),
            cors_origins: crate::server::cors::CorsOrigins::None,
            message_contents: MessageContents::Plain,
            plugin_dirs: PluginDirs::new(Vec::new()),
            sharing: Arc::default(),
        })
    }

    /// A status, the `Retry-After` header if any, and the body as JSON (`Null` when not JSON).
    struct Answer {
        status: StatusCode,
        retry_after: Option<String>,
        body: Value,
    }

    impl Answer {
        /// Checks an OpenAI-style error: `status`, and `error.type`, `error.param` and
        /// `error.code` as given; the message says something.
        fn assert_error(&self, status: StatusCode, kind: &str, param: Value, code: Value) {
            assert_eq!(self.status, status, "{}", self.body);
            let error = &self.body["error"];
            assert_eq!(error["type"], kind, "{}", self.body);
            assert_eq!(error["param"], param, "{}", self.body);
            assert_eq!(error["code"], code, "{}", self.body);
            let message = error["message"].as_str().unwrap_or_default();
            assert!(
                message.len() > 20,
                "a message naming the fix: {}",
                self.body
            );
        }
    }

    async fn send(state: &AppState, request: Request<Body>) -> Answer {
        let response = router(state.clone())
            .oneshot(request)
            .await
            .expect("the router answers");
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|value| value.to_str().expect("ASCII").to_owned());
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            status,
            retry_after,
            body,
        }
    }

    fn request(method: &str, path: &str) -> axum::http::request::Builder {
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "127.0.0.1:8080")
    }

    fn post_json(path: &str, body: &Value) -> Request<Body> {
        request("POST", path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .expect("a request")
    }

    fn get(path: &str, token: Option<&str>) -> Request<Body> {
        let builder = request("GET", path);
        let builder = match token {
            Some(token) => builder.header(header::AUTHORIZATION, format!("Bearer {token}")),
            None => builder,
        };
        builder.body(Body::empty()).expect("a request")
    }

    fn chat(extra: Value) -> Value {
        let mut body = json!({"messages": [{"role": "user", "content": "Say hi."}]});
        body.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        body
    }

    #[tokio::test]
    async fn health_and_models_answer_without_a_model() {
        let state = state(None);
        let health = send(&state, get("/health", None)).await;
        assert_eq!(health.status, StatusCode::OK);
        assert_eq!(health.body["status"], "ok");
        let models = send(&state, get("/v1/models", None)).await;
        assert_eq!(models.body["data"][0]["id"], "router-test");
    }

    #[tokio::test]
    async fn malformed_or_out_of_range_requests_answer_400_naming_the_parameter() {
        let state = state(None);
        let not_json = request("POST", "/v1/chat/completions")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{\"messages\": ["))
            .expect("a request");
        let answer = send(&state, not_json).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        assert_eq!(answer.body["error"]["type"], "invalid_request_error");

        let cases = [
            (chat(json!({"max_tokens": 33})), "max_tokens"),
            (chat(json!({"temperature": -1})), "temperature"),
            (
                chat(json!({"speculative": {"draft_max": 9}})),
                "speculative.draft_max",
            ),
            (
                chat(json!({"speculative": {"cascade": "nowhere"}})),
                "speculative.cascade",
            ),
            (
                chat(json!({"speculative": {"cascade": "./my.wasm"}})),
                "speculative.cascade",
            ),
            (json!({"messages": []}), "messages"),
        ];
        for (body, param) in cases {
            let answer = send(&state, post_json("/v1/chat/completions", &body)).await;
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "{body}: {}",
                answer.body
            );
            assert_eq!(
                answer.body["error"]["param"], param,
                "{body}: {}",
                answer.body
            );
        }
        let out_of_vocabulary = json!({"prompt": [1, 2, VOCAB_SIZE]});
        send(&state, post_json("/v1/completions", &out_of_vocabulary))
            .await
            .assert_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                json!("prompt"),
                Value::Null,
            );
    }

    #[tokio::test]
    async fn a_prompt_longer_than_the_context_answers_400_context_length_exceeded() {
        let state = state(None);
        let long = "x".repeat(CTX_SIZE as usize);
        let answer = send(
            &state,
            post_json("/v1/completions", &json!({"prompt": long, "max_tokens": 1})),
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        assert_eq!(answer.body["error"]["code"], "context_length_exceeded");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_answers_413() {
        let state = state(None);
        let body = chat(json!({"user": "x".repeat(MAX_BODY_BYTES)}));
        let answer = send(&state, post_json("/v1/chat/completions", &body)).await;
        assert_eq!(
            answer.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{}",
            answer.body
        );
        assert!(
            answer.body["error"]["message"].is_string(),
            "{}",
            answer.body
        );
    }

    #[tokio::test]
    async fn unknown_routes_and_hosts_answer_404_and_403() {
        let state = state(None);
        send(&state, get("/v2/everything", None))
            .await
            .assert_error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Value::Null,
                json!("unknown_route"),
            );
        let elsewhere = Request::builder()
            .uri("/health")
            .header(header::HOST, "attacker.example")
            .body(Body::empty())
            .expect("a request");
        let answer = send(&state, elsewhere).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
        assert!(
            answer.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("--allowed-hosts")),
            "{}",
            answer.body
        );
    }

    #[tokio::test]
    async fn admin_and_metrics_are_404_without_a_token_and_401_without_the_right_one() {
        let off = state(None);
        for path in ["/admin/cascade", "/metrics"] {
            let answer = send(&off, get(path, None)).await;
            assert_eq!(
                answer.status,
                StatusCode::NOT_FOUND,
                "{path}: {}",
                answer.body
            );
        }
        let on = state(Some(ADMIN_TOKEN));
        for token in [None, Some("not-the-admin-token")] {
            for path in ["/admin/cascade", "/metrics"] {
                send(&on, get(path, token)).await.assert_error(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    Value::Null,
                    json!("invalid_api_key"),
                );
            }
        }
        let shown = send(&on, get("/admin/cascade", Some(ADMIN_TOKEN))).await;
        assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
        assert_eq!(shown.body["generation"], 0, "{}", shown.body);
    }

    #[tokio::test]
    async fn repeated_wrong_admin_tokens_answer_429_with_retry_after() {
        let state = state(Some(ADMIN_TOKEN));
        let mut last = None;
        for _ in 0..32 {
            let answer = send(&state, get("/admin/cascade", Some("guess-guess-guess"))).await;
            if answer.status == StatusCode::TOO_MANY_REQUESTS {
                last = Some(answer);
                break;
            }
            assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.body);
        }
        let limited = last.expect("wrong tokens are rate-limited");
        assert!(limited.retry_after.is_some(), "{}", limited.body);
        // The right token is refused too while the address is limited.
        let answer = send(&state, get("/admin/cascade", Some(ADMIN_TOKEN))).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            answer.body
        );
    }

    #[tokio::test]
    async fn a_valid_request_to_a_full_queue_answers_429_with_retry_after() {
        let state = state(None);
        let answer = send(&state, post_json("/v1/chat/completions", &chat(json!({})))).await;
        answer.assert_error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Value::Null,
            json!("queue_full"),
        );
        assert!(answer.retry_after.is_some(), "{}", answer.body);
    }
}
