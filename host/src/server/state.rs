//! [`AppState`]: what every handler shares, behind one `Arc`.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use super::admin::AuthFailures;
use super::cors::CorsOrigins;
use super::hosts::AllowedHosts;
use super::metrics::Metrics;
use super::plugin_dirs::PluginDirs;
use super::registry::Registry;
use super::scheduler::Queue;
use super::share::Sharing;
use crate::cascade::Token;
use crate::engine::{EngineError, Grammar, GrammarError, MessageContents, SamplingParams, Target};

/// Limits and defaults of requests.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// `max_tokens` of requests that give none.
    pub default_max_tokens: usize,
    /// The most `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Context size of every slot, in tokens: prompt plus `max_tokens` must fit.
    pub ctx_size: u32,
    /// The most `speculative.draft_max` a request may ask for (`--draft-max`).
    pub max_draft_len: usize,
    /// Time to send a request's body once its headers arrived.
    pub body_timeout: Duration,
}

/// What handlers need of the target: a request's prompt as tokens. Tokenizing runs off the
/// async threads (a long conversation takes a while). The target implements it; the router's
/// tests use one without a model.
pub trait PromptTokenizer: Send + Sync {
    /// Number of tokens in the vocabulary: a prompt given as token ids must stay below it.
    fn vocab_size(&self) -> u32;
    /// `messages` (role, content) through the chat template, ready for the assistant's turn.
    fn tokenize_messages(
        &self,
        messages: &[(&str, &str)],
        contents: MessageContents,
    ) -> Result<Vec<Token>, EngineError>;
    /// A completion prompt's text, special tokens parsed.
    fn tokenize_raw(&self, text: &str) -> Vec<Token> {
        self.tokenize(text, true, true)
    }
    /// `text` as tokens, BOS added when `add_special` (and the model has one), special-token
    /// markup parsed when `parse_special` (`POST /tokenize`).
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token>;
    /// The bytes of `token`: a special token's markup when `special`, else nothing for it.
    fn piece(&self, token: Token, special: bool) -> Vec<u8>;
    /// `messages` (role, content) through the chat template as text, ready for the
    /// assistant's turn (`POST /apply-template`).
    fn template(&self, messages: &[(&str, &str)]) -> Result<String, EngineError>;
    /// Whether `grammar` parses and can be followed on this vocabulary.
    fn check_grammar(&self, grammar: &Grammar) -> Result<(), GrammarError>;
}

impl PromptTokenizer for Target {
    fn vocab_size(&self) -> u32 {
        Target::vocab_size(self)
    }

    fn tokenize_messages(
        &self,
        messages: &[(&str, &str)],
        contents: MessageContents,
    ) -> Result<Vec<Token>, EngineError> {
        Target::tokenize_messages(self, messages, contents)
    }

    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<Token> {
        Target::tokenize_with(self, text, add_special, parse_special)
    }

    fn template(&self, messages: &[(&str, &str)]) -> Result<String, EngineError> {
        Target::template_messages(self, messages)
    }

    fn check_grammar(&self, grammar: &Grammar) -> Result<(), GrammarError> {
        Target::check_grammar(self, grammar)
    }

    fn piece(&self, token: Token, special: bool) -> Vec<u8> {
        let mut bytes = Vec::new();
        Target::token_piece(self, token, special, &mut bytes);
        bytes
    }
}

/// Everything handlers share.
pub struct Shared {
    /// The model's name in the API: the first of `model_aliases`.
    pub model_id: String,
    /// Every name requests may use for the model.
    pub model_aliases: Vec<String>,
    /// Whether requests naming another model are served too.
    pub accept_any_model: bool,
    /// The GGUF served (`GET /props`).
    pub model_path: String,
    /// The chat template chat requests go through (`GET /props`).
    pub chat_template: String,
    /// The target's tokenizer, for prompts in handlers (slots generate with the target).
    pub tokenizer: Arc<dyn PromptTokenizer>,
    /// Limits and defaults of requests.
    pub limits: RequestLimits,
    /// Sampling of requests that give none (the seed is drawn per request).
    pub sampling: SamplingParams,
    /// The queue to the slots.
    pub queue: Arc<Queue>,
    /// The published plugins and defaults.
    pub registry: Arc<Registry>,
    /// The server's counters.
    pub metrics: Arc<Metrics>,
    /// Bearer token of the admin endpoints; `None` turns them off.
    pub admin_token: Option<String>,
    /// Keys of the inference endpoints; empty: open to every client.
    pub api_keys: Vec<String>,
    /// Wrong admin tokens and API keys by client address, for rate-limiting them.
    pub auth_failures: AuthFailures,
    /// Whether `/metrics` is open to anyone (else it needs the admin token).
    pub public_metrics: bool,
    /// The host names requests may address.
    pub allowed_hosts: AllowedHosts,
    /// The origins whose browser pages may call the server.
    pub cors_origins: CorsOrigins,
    /// How special-token text inside chat messages is read.
    pub message_contents: MessageContents,
    /// Where plugin files named over the admin API must be.
    pub plugin_dirs: PluginDirs,
    /// Finished responses shared between slots and, with `--share`, replicas.
    pub sharing: Arc<Sharing>,
}

struct Inner {
    shared: Shared,
    started_at: u64,
    next_request: AtomicU64,
}

/// The handlers' state: cheap to clone; dereferences to [`Shared`].
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl AppState {
    /// State over `shared`, started now; request ids start at 1.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(Inner {
            shared,
            started_at: unix_now(),
            next_request: AtomicU64::new(1),
        }))
    }

    /// When the server started, in seconds since the Unix epoch.
    pub fn started_at(&self) -> u64 {
        self.0.started_at
    }

    /// A fresh request id: `prefix-<server start, hex>-<counter>`, unique across restarts.
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.0.next_request.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}-{n}", self.0.started_at)
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0.shared
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
