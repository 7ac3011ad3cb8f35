//! The OpenAI wire format, as serde types: request bodies, responses, stream chunks.
//!
//! Requests accept what OpenAI clients send; fields this server cannot honour (`n > 1`,
//! `echo`, penalties, tools, ...) are read so that they can be refused with a
//! message instead of being silently ignored (see `generation.rs`); so are fields it does not
//! know, unless they are harmless (`fields.rs`). The extension is `speculative`: per-request speculation settings in the
//! request, and what speculation did in the response.

use serde::{Deserialize, Serialize};

use crate::cascade::CascadeMode;
use crate::cascade::{SourceStats, Token, ratio};
use crate::engine::{DraftAcceptance, GenerationStats};

/// `prompt` of a completion request.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt.
    Text(String),
    /// Pre-tokenized prompt.
    Tokens(Vec<Token>),
    /// Several prompts (only one is supported).
    Texts(Vec<String>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(stop) => vec![stop],
            Self::Many(stops) => stops,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `speculative` in a request: overrides the server's defaults for this request.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeParams {
    /// Sources in order, comma-separated loaded plugin names, or `none`.
    pub cascade: Option<String>,
    /// Policy plugin choosing the draft length.
    pub policy: Option<String>,
    /// Most draft tokens per round.
    #[serde(rename = "draft_max")]
    pub max_draft_len: Option<usize>,
    /// How the cascade picks a draft.
    pub mode: Option<CascadeMode>,
    /// Whether a request with a grammar also drafts with the host's grammar source.
    pub grammar_drafts: Option<bool>,
    /// How a draft model's drafts are verified at a temperature (`rejection` or `compare`).
    pub draft_acceptance: Option<DraftAcceptance>,
}

/// Parameters shared by completion and chat completion requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    /// The model to use; must be the served model when given.
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
    /// Sampling temperature; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k sampling (extension, as in vLLM and llama.cpp).
    pub top_k: Option<i32>,
    /// Min-p sampling (extension).
    pub min_p: Option<f32>,
    /// Seed of the sampler.
    pub seed: Option<u32>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Completions to generate; only 1.
    pub n: Option<u32>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Log-probabilities: `true` in a chat completion, the number of alternatives in a
    /// (legacy) completion.
    pub logprobs: Option<serde_json::Value>,
    /// Chat: how many of the most likely tokens to report at each position.
    pub top_logprobs: Option<serde_json::Value>,
    /// Output format: `text`, `json_object` or `json_schema` (OpenAI).
    pub response_format: Option<serde_json::Value>,
    /// A GBNF grammar the output must follow (llama-server).
    pub grammar: Option<String>,
    /// A JSON schema the output must follow (llama-server).
    pub json_schema: Option<serde_json::Value>,
    /// Presence penalty (only 0).
    pub presence_penalty: Option<f32>,
    /// Frequency penalty (only 0).
    pub frequency_penalty: Option<f32>,
    /// Logit bias (not supported).
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// llama-server's name of `max_tokens` (-1: as many as the server allows).
    pub n_predict: Option<i64>,
    /// Speculation settings of this request.
    pub speculative: Option<SpeculativeParams>,
    /// Every field this server does not read: refused unless harmless (`fields.rs`).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt, sent as-is (no chat template).
    pub prompt: Prompt,
    /// Echo the prompt (not supported).
    #[serde(default)]
    pub echo: bool,
    /// Text after the completion (not supported).
    pub suffix: Option<String>,
    /// Server-side candidates (only 1).
    pub best_of: Option<u32>,
    /// Everything else.
    #[serde(flatten)]
    pub common: CommonParams,
}

/// Content of a chat message: a string, or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts; only `text` parts are supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text`, `image_url`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One message of a conversation.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The message; `null` for an assistant message that only called tools.
    pub content: Option<MessageContent>,
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Tools (not supported).
    pub tools: Option<Vec<serde_json::Value>>,
    /// Continue the last message, an assistant's, rather than start a new turn after it
    /// (vLLM's field; default: continue when the last message is the assistant's, as
    /// llama-server does).
    pub continue_final_message: Option<bool>,
    /// Everything else.
    #[serde(flatten)]
    pub common: CommonParams,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Where the prompt tokens came from.
    #[serde(default)]
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of a request's prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose keys and values the slot's cache kept from its previous request
    /// (not read again).
    pub cached_tokens: usize,
}

impl Usage {
    /// Usage of a request of several choices: the prompt once, every choice's tokens.
    pub fn of_choices<'s>(choices: impl IntoIterator<Item = &'s GenerationStats>) -> Self {
        let mut choices = choices.into_iter();
        let Some(first) = choices.next() else {
            return Self::default();
        };
        let mut usage = Self::of(first);
        for stats in choices {
            usage.add_choice(stats);
        }
        usage
    }

    /// Counts another choice's generated tokens (its prompt is the one already counted).
    fn add_choice(&mut self, stats: &GenerationStats) {
        self.completion_tokens += stats.generated_tokens;
        self.total_tokens += stats.generated_tokens;
    }

    /// Counts a finished choice of a streamed request into `usage` (`None` before the first).
    pub fn count(usage: &mut Option<Self>, stats: &GenerationStats) {
        match usage {
            Some(usage) => usage.add_choice(stats),
            None => *usage = Some(Self::of(stats)),
        }
    }

    /// Usage of a request from its stats.
    pub fn of(stats: &GenerationStats) -> Self {
        Self {
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.generated_tokens,
            total_tokens: stats.prompt_tokens + stats.generated_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: stats.cached_prompt_tokens,
            },
        }
    }
}

/// What one source did in a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceReport {
    /// The source's name.
    pub name: String,
    /// Rounds it was asked to propose.
    pub asked: u64,
    /// Rounds it proposed something.
    pub proposed: u64,
    /// Rounds its proposal was the verified draft.
    pub rounds_won: u64,
    /// Its draft tokens that were verified.
    pub drafted: u64,
    /// Its draft tokens that were accepted.
    pub accepted: u64,
    /// `100 * accepted / drafted`.
    pub acceptance_percent: f64,
    /// Accepted tokens per round won.
    pub mean_accepted_length: f64,
    /// `[i]`: rounds won in which draft position `i` was accepted.
    pub accepted_by_position: Vec<u64>,
    /// Calls that faulted.
    pub faults: u64,
}

impl From<&SourceStats> for SourceReport {
    fn from(stats: &SourceStats) -> Self {
        Self {
            name: stats.name.clone(),
            asked: stats.asked,
            proposed: stats.proposed,
            rounds_won: stats.won,
            drafted: stats.drafted,
            accepted: stats.accepted,
            acceptance_percent: 100.0 * stats.acceptance(),
            mean_accepted_length: ratio(stats.accepted, stats.won),
            accepted_by_position: stats.accepted_by_position.clone(),
            faults: stats.faults,
        }
    }
}

/// `speculative` in a response: what speculation did for this request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculativeReport {
    /// Sources of the cascade the last round used, in order.
    pub cascade: Vec<String>,
    /// Most draft tokens per round.
    #[serde(rename = "draft_max")]
    pub max_draft_len: usize,
    /// How the cascade picked drafts.
    pub mode: CascadeMode,
    /// The policy that chose each round's draft length (`null`: `draft_max` every round).
    pub policy: Option<String>,
    /// Verify rounds after the first token.
    pub rounds: u64,
    /// Rounds that verified a draft.
    pub draft_rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Rounds whose draft was drawn at the request's temperature and verified by rejection
    /// sampling (`--draft-acceptance rejection`): the output follows the target's distribution
    /// but is not plain decoding's draw for the seed.
    pub drawn_rounds: u64,
    /// Draft tokens proposed but cut by the server's verify steps (not worth their rows
    /// beside the other requests' rounds), so never verified.
    pub cut_draft_tokens: u64,
    /// Tokens a recurrent target decoded again after drafts cut short (its state restored to
    /// before the verify batch, the accepted tokens replayed); 0 on an attention model.
    pub replayed_tokens: u64,
    /// `100 * accepted / drafted`.
    pub acceptance_percent: f64,
    /// Accepted tokens per round that verified a draft.
    pub mean_accepted_length: f64,
    /// Generated tokens per second after the first.
    pub tokens_per_second: f64,
    /// Requests verified together per step, on average over this request's rounds: the
    /// server verifies the rounds of every running request in one batch.
    pub mean_batch_requests: f64,
    /// Tokens per verify batch (every request's), on average over this request's rounds.
    pub mean_batch_tokens: f64,
    /// Times the cascade was replaced between rounds (hot swaps).
    pub swaps: u32,
    /// Milliseconds the request waited for a slot.
    pub queue_ms: u64,
    /// Per source, every source the request drafted with.
    pub sources: Vec<SourceReport>,
}

/// `choices[0]` of a completion.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Generated text (a piece of it in a stream chunk).
    pub text: String,
    /// The choice's place among the request's `n`, from 0.
    pub index: usize,
    /// The tokens' log-probabilities (`tokens`, `token_logprobs`, `top_logprobs`,
    /// `text_offset`) when the request asked for them; `null` otherwise.
    pub logprobs: Option<serde_json::Value>,
    /// `stop` or `length` at the end; `null` before.
    pub finish_reason: Option<String>,
}

/// A completion, or one chunk of a streamed one (`object` tells which).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Completion {
    /// Request id.
    pub id: String,
    /// The server's build (OpenAI's backend configuration fingerprint): `spechost-VERSION`.
    #[serde(default)]
    pub system_fingerprint: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model.
    pub model: String,
    /// One choice (none in a stream's usage chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's timings of the request (in the last chunk of a stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// What speculation did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeReport>,
}

/// A chat message in a response, or the change a stream chunk brings to it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `assistant` (in a stream, only in the first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// `choices[0]` of a chat completion or chunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChoice {
    /// The choice's place among the request's `n`, from 0.
    pub index: usize,
    /// The whole message (non-streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<AssistantMessage>,
    /// The change (streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<AssistantMessage>,
    /// The tokens' log-probabilities (`{"content": [...]}`) when the request asked for them;
    /// `null` otherwise.
    pub logprobs: Option<serde_json::Value>,
    /// `stop` or `length` at the end; `null` before.
    pub finish_reason: Option<String>,
}

/// A chat completion (`chat.completion`) or a chunk of one (`chat.completion.chunk`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// Request id.
    pub id: String,
    /// The server's build (OpenAI's backend configuration fingerprint): `spechost-VERSION`.
    #[serde(default)]
    pub system_fingerprint: String,
    /// `chat.completion` or `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model.
    pub model: String,
    /// One choice (none in a stream's usage chunk).
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's timings of the request (in the last chunk of a stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// What speculation did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeReport>,
}

/// One model of `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Model {
    /// The name requests use.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds (server start).
    pub created: u64,
    /// `spechost`.
    pub owned_by: String,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The served model.
    pub data: Vec<Model>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_chat_bodies_with_extensions_and_unknown_fields() {
        let body = serde_json::json!({
            "model": "smollm2",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
            ],
            "temperature": 0,
            "stop": "\n\n",
            "stream": true,
            "stream_options": {"include_usage": true},
            "user": "someone",
            "speculative": {"cascade": "suffix,lookup", "draft_max": 4, "mode": "first"}
        });
        let request: ChatRequest = serde_json::from_value(body).expect("valid chat body");
        assert_eq!(request.messages.len(), 2);
        assert!(request.common.stream);
        let speculative = request.common.speculative.expect("speculative block");
        assert_eq!(speculative.cascade.as_deref(), Some("suffix,lookup"));
        assert_eq!(speculative.mode, Some(CascadeMode::First));
        assert_eq!(
            request.common.stop.map(Stop::into_vec),
            Some(vec!["\n\n".to_owned()])
        );
    }

    #[test]
    fn rejects_typos_in_the_speculative_block() {
        let body = serde_json::json!({"prompt": "x", "speculative": {"cascde": "lookup"}});
        let error = serde_json::from_value::<CompletionRequest>(body)
            .expect_err("unknown field")
            .to_string();
        assert!(error.contains("cascde"), "error: {error}");
    }

    #[test]
    fn completion_prompt_may_be_text_tokens_or_a_list() {
        for (prompt, tokens) in [
            (serde_json::json!("hello"), false),
            (serde_json::json!([1, 2, 3]), true),
            (serde_json::json!(["a"]), false),
        ] {
            let request: CompletionRequest =
                serde_json::from_value(serde_json::json!({"prompt": prompt}))
                    .expect("valid prompt");
            assert_eq!(
                matches!(request.prompt, Prompt::Tokens(_)),
                tokens,
                "{:?}",
                request.prompt
            );
        }
    }
}

/// `GET /props`: what llama-server's clients read of a server (its web UI: the context size,
/// the slots, the chat template), in llama-server's layout.
#[derive(Debug, Clone, Serialize)]
pub struct Props {
    /// What a request gets without settings of its own.
    pub default_generation_settings: GenerationSettings,
    /// Requests generated at once (`--parallel`).
    pub total_slots: usize,
    /// The model's name in the API.
    pub model_alias: String,
    /// The GGUF served.
    pub model_path: String,
    /// The chat template chat requests go through (or the built-in template's name).
    pub chat_template: String,
    /// Input kinds besides text: none.
    pub modalities: Modalities,
    /// `spechost` and its version.
    pub build_info: String,
}

/// `default_generation_settings` of [`Props`].
#[derive(Debug, Clone, Serialize)]
pub struct GenerationSettings {
    /// Context of each slot, in tokens.
    pub n_ctx: u32,
    /// Sampling and length defaults.
    pub params: GenerationParams,
}

/// `default_generation_settings.params` of [`Props`].
#[derive(Debug, Clone, Serialize)]
pub struct GenerationParams {
    /// `max_tokens` of requests that give none (`--max-tokens`).
    pub n_predict: usize,
    /// Default temperature (0: greedy).
    pub temperature: f32,
    /// Default top-k (0: off).
    pub top_k: i32,
    /// Default top-p.
    pub top_p: f32,
    /// Default min-p.
    pub min_p: f32,
}

/// `modalities` of [`Props`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Modalities {
    /// Images: no.
    pub vision: bool,
    /// Audio: no.
    pub audio: bool,
}

/// `system_fingerprint` of every answer: the build that generated it.
pub fn system_fingerprint() -> String {
    format!("spechost-{}", env!("CARGO_PKG_VERSION"))
}

/// llama-server's `timings` block: prompt and generation counts and times, and its
/// speculation counters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Prompt tokens read (those the slot's cache kept are not counted).
    pub prompt_n: usize,
    /// Milliseconds reading them (to the first token).
    pub prompt_ms: f64,
    /// Milliseconds per prompt token read.
    pub prompt_per_token_ms: f64,
    /// Prompt tokens read per second.
    pub prompt_per_second: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Milliseconds from the first token to the last.
    pub predicted_ms: f64,
    /// Milliseconds per generated token after the first.
    pub predicted_per_token_ms: f64,
    /// Generated tokens per second after the first.
    pub predicted_per_second: f64,
    /// Draft tokens verified.
    pub draft_n: u64,
    /// Draft tokens accepted.
    pub draft_n_accepted: u64,
}

impl Timings {
    /// The timings of a request from its stats.
    pub fn of(stats: &GenerationStats) -> Self {
        let prompt_n = stats.prompt_tokens - stats.cached_prompt_tokens.min(stats.prompt_tokens);
        let prompt_ms = stats.prompt_time.as_secs_f64() * 1e3;
        let predicted_ms = stats.generation_time.as_secs_f64() * 1e3;
        let after_first = stats.generated_tokens.saturating_sub(1);
        let per = |ms: f64, n: usize| if n == 0 { 0.0 } else { ms / n as f64 };
        let rate = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        Self {
            prompt_n,
            prompt_ms,
            prompt_per_token_ms: per(prompt_ms, prompt_n),
            prompt_per_second: rate(prompt_ms, prompt_n),
            predicted_n: stats.generated_tokens,
            predicted_ms,
            predicted_per_token_ms: per(predicted_ms, after_first),
            predicted_per_second: rate(predicted_ms, after_first),
            draft_n: stats.drafted,
            draft_n_accepted: stats.accepted,
        }
    }
}
