//! `POST /v1/chat/completions`: the conversation goes through the model's chat template (from
//! the GGUF), then generation continues the assistant's turn.

use axum::extract::State;
use axum::response::Response;
use axum::{Extension, Json};

use super::connections::ClientConnection;
use super::error::ApiError;
use super::extract::ApiJson;
use super::generation::{
    self, AnswerReports, Piece, Plan, count_invalid, finish_reason, speculative_report,
    whole_response,
};
use super::logprobs;
use super::metrics::Endpoint;
use super::state::{AppState, PromptTokenizer};
use super::wire::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatMessage, ChatRequest, MessageContent,
    Timings, Usage, system_fingerprint,
};
use crate::cascade::Token;
use crate::engine::{EngineError, MessageContents, TokenLogprob};

const ENDPOINT: Endpoint = Endpoint::ChatCompletions;
/// `object` of a chat completion.
const OBJECT: &str = "chat.completion";
/// `object` of a chunk of a streamed chat completion.
const CHUNK_OBJECT: &str = "chat.completion.chunk";
/// The role of generated messages.
const ASSISTANT: &str = "assistant";

/// `POST /v1/chat/completions`.
pub async fn create(
    State(state): State<AppState>,
    client: Option<Extension<ClientConnection>>,
    body: Result<ApiJson<ChatRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let invalid = |error| count_invalid(&state, ENDPOINT, error);
    let ApiJson(body) = body.map_err(invalid)?;
    refuse_unsupported(&body).map_err(invalid)?;
    let messages = conversation(&body.messages).map_err(invalid)?;
    let prefill = assistant_prefill(&messages, body.continue_final_message).map_err(invalid)?;
    let max_tokens = body.max_completion_tokens.or(body.common.max_tokens);
    let plan = Plan::from_params(&state, ENDPOINT, body.common, max_tokens)
        .await
        .map_err(invalid)?;
    let client = client.map(|Extension(client)| client);
    let prompt = tokenize(&state, messages, prefill).await.map_err(invalid)?;
    let submitted = plan.submit(&state, "chatcmpl", prompt)?;

    let id = submitted.id;
    let created = submitted.created;
    let model = state.model_id.clone();
    let fingerprint = system_fingerprint();
    let reports_logprobs = plan.reports_logprobs();
    let tokenizer = std::sync::Arc::clone(&state.tokenizer);
    let logprobs_of = move |logprobs: &[TokenLogprob]| {
        reports_logprobs.then(|| logprobs::chat_content(tokenizer.as_ref(), logprobs))
    };
    let chunk = move |index: usize, delta: AssistantMessage, finish_reason: Option<String>| {
        ChatCompletion {
            id: id.clone(),
            system_fingerprint: fingerprint.clone(),
            object: CHUNK_OBJECT.to_owned(),
            created,
            model: model.clone(),
            choices: vec![ChatChoice {
                index,
                message: None,
                delta: Some(delta),
                logprobs: None,
                finish_reason,
            }],
            usage: None,
            timings: None,
            speculative: None,
        }
    };
    let choices = submitted.choices;
    if plan.stream {
        let include_usage = plan.include_usage;
        let mut role_sent = vec![false; choices];
        let mut usage: Option<Usage> = None;
        return Ok(generation::event_stream(
            submitted.events,
            choices,
            client,
            move |piece| {
                let mut chunks = Vec::new();
                let choice = match &piece {
                    Piece::Text { choice, .. } => *choice,
                    Piece::Done { finished, .. } => finished.choice,
                };
                if let Some(sent) = role_sent.get_mut(choice)
                    && !std::mem::replace(sent, true)
                {
                    chunks.push(chunk(
                        choice,
                        AssistantMessage {
                            role: Some(ASSISTANT.to_owned()),
                            content: Some(String::new()),
                        },
                        None,
                    ));
                }
                match piece {
                    Piece::Text { text, logprobs, .. } => {
                        let mut text_chunk = chunk(
                            choice,
                            AssistantMessage {
                                role: None,
                                content: Some(text),
                            },
                            None,
                        );
                        text_chunk.choices[0].logprobs = logprobs_of(&logprobs);
                        chunks.push(text_chunk);
                    }
                    Piece::Done { finished, last } => {
                        let stats = &finished.outcome.stats;
                        Usage::count(&mut usage, stats);
                        chunks.push(ChatCompletion {
                            timings: Some(Timings::of(stats)),
                            speculative: Some(speculative_report(&finished)),
                            ..chunk(
                                choice,
                                AssistantMessage::default(),
                                Some(finish_reason(finished.outcome.stop_reason)),
                            )
                        });
                        if include_usage && last {
                            chunks.push(ChatCompletion {
                                choices: Vec::new(),
                                usage,
                                ..chunk(0, AssistantMessage::default(), None)
                            });
                        }
                    }
                }
                chunks
                    .iter()
                    .map(|chunk| serde_json::to_value(chunk).unwrap_or_default())
                    .collect()
            },
        ));
    }
    let template = chunk(0, AssistantMessage::default(), None);
    whole_response(submitted.events, choices, client, move |finished| {
        let reports = AnswerReports::of(&finished);
        let response = ChatCompletion {
            object: OBJECT.to_owned(),
            choices: finished
                .iter()
                .map(|done| ChatChoice {
                    index: done.choice,
                    message: Some(AssistantMessage {
                        role: Some(ASSISTANT.to_owned()),
                        content: Some(done.outcome.text.clone()),
                    }),
                    delta: None,
                    logprobs: logprobs_of(&done.outcome.logprobs),
                    finish_reason: Some(finish_reason(done.outcome.stop_reason)),
                })
                .collect(),
            usage: Some(reports.usage),
            timings: Some(reports.timings),
            speculative: Some(reports.speculative),
            ..template
        };
        serde_json::to_value(response).unwrap_or_default()
    })
    .await
}

/// Refuses chat parameters the server cannot honour.
fn refuse_unsupported(body: &ChatRequest) -> Result<(), ApiError> {
    if body.tools.as_ref().is_some_and(|tools| !tools.is_empty()) {
        return Err(ApiError::invalid_param(
            "tools",
            "tools (function calling) are not supported; leave them out",
        ));
    }
    Ok(())
}

/// `(role, content)` pairs for the chat template. `developer` is the newer name of `system`;
/// text parts of a message are joined with newlines.
fn conversation(messages: &[ChatMessage]) -> Result<Vec<(String, String)>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages is empty; send at least one user message",
        ));
    }
    messages
        .iter()
        .map(|message| {
            let role = match message.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => ASSISTANT,
                other => {
                    return Err(ApiError::invalid_param(
                        "messages",
                        format!(
                            "role `{other}` is not supported; use system, developer, user or assistant"
                        ),
                    ));
                }
            };
            let content = match &message.content {
                None => String::new(),
                Some(MessageContent::Text(text)) => text.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for part in parts {
                        match (part.kind.as_str(), &part.text) {
                            ("text", Some(text)) => texts.push(text.as_str()),
                            (kind, _) => {
                                return Err(ApiError::invalid_param(
                                    "messages",
                                    format!(
                                        "content parts of type `{kind}` are not supported; send text"
                                    ),
                                ));
                            }
                        }
                    }
                    texts.join("\n")
                }
            };
            Ok((role.to_owned(), content))
        })
        .collect()
}

/// Whether generation continues the last message (an assistant's) rather than starting a new
/// turn: as `continue_final_message` says, else when the last message is the assistant's (as
/// llama-server prefills it).
fn assistant_prefill(
    messages: &[(String, String)],
    continue_final_message: Option<bool>,
) -> Result<bool, ApiError> {
    let last_is_assistant = messages.last().is_some_and(|(role, _)| role == ASSISTANT);
    match continue_final_message {
        Some(true) if !last_is_assistant => Err(ApiError::invalid_param(
            "continue_final_message",
            "continue_final_message needs the last message to be the assistant's; add it, or leave the field out",
        )),
        Some(continue_it) => Ok(continue_it),
        None => Ok(last_is_assistant),
    }
}

/// The conversation through the model's chat template: ready for the assistant's turn, or,
/// with `prefill`, the turns before the last with the last (the assistant's) message as the
/// start of the answer. As text, or as tokens; the message contents are plain text unless the
/// server lets them hold markup.
struct Templated<'m> {
    turns: Vec<(&'m str, &'m str)>,
    prefill: Option<&'m str>,
}

impl<'m> Templated<'m> {
    fn new(messages: &'m [(String, String)], prefill: bool) -> Self {
        let mut turns: Vec<(&str, &str)> = messages
            .iter()
            .map(|(role, content)| (role.as_str(), content.as_str()))
            .collect();
        let prefill = if prefill {
            turns.pop().map(|(_, content)| content)
        } else {
            None
        };
        Self { turns, prefill }
    }

    fn text(&self, tokenizer: &dyn PromptTokenizer) -> Result<String, EngineError> {
        let mut text = tokenizer.template(&self.turns)?;
        text.push_str(self.prefill.unwrap_or(""));
        Ok(text)
    }

    fn tokens(
        &self,
        tokenizer: &dyn PromptTokenizer,
        contents: MessageContents,
    ) -> Result<Vec<Token>, EngineError> {
        let mut tokens = tokenizer.tokenize_messages(&self.turns, contents)?;
        if let Some(answer) = self.prefill {
            let markup = contents == MessageContents::Markup;
            tokens.extend(tokenizer.tokenize(answer, false, markup));
        }
        Ok(tokens)
    }
}

/// The conversation's tokens through the model's chat template (off the async threads: a
/// long conversation takes a while).
async fn tokenize(
    state: &AppState,
    messages: Vec<(String, String)>,
    prefill: bool,
) -> Result<Vec<Token>, ApiError> {
    let tokenizer = std::sync::Arc::clone(&state.tokenizer);
    let contents = state.message_contents;
    let tokenized = tokio::task::spawn_blocking(move || {
        Templated::new(&messages, prefill).tokens(tokenizer.as_ref(), contents)
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing the conversation failed: {e}")))?;
    tokenized.map_err(|e| ApiError::invalid_param("messages", e.to_string()))
}

/// `POST /apply-template`: a chat request's conversation through the chat template, as the
/// text a completion would be given (`{"prompt": ...}`), as llama-server answers it.
pub async fn apply_template(
    State(state): State<AppState>,
    body: Result<ApiJson<ChatRequest>, ApiError>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let ApiJson(body) = body?;
    let messages = conversation(&body.messages)?;
    let prefill = assistant_prefill(&messages, body.continue_final_message)?;
    let tokenizer = std::sync::Arc::clone(&state.tokenizer);
    let text = tokio::task::spawn_blocking(move || {
        Templated::new(&messages, prefill).text(tokenizer.as_ref())
    })
    .await
    .map_err(|e| ApiError::internal(format!("applying the chat template failed: {e}")))?;
    let prompt = text.map_err(|e| ApiError::invalid_param("messages", e.to_string()))?;
    Ok(Json(serde_json::json!({ "prompt": prompt })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: serde_json::Value) -> ChatMessage {
        serde_json::from_value(serde_json::json!({"role": role, "content": content}))
            .expect("valid message")
    }

    #[test]
    fn conversation_maps_roles_and_joins_text_parts() {
        let messages = [
            message("developer", serde_json::json!("Be brief.")),
            message(
                "user",
                serde_json::json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
            ),
            message("assistant", serde_json::Value::Null),
        ];
        let pairs = conversation(&messages).expect("valid conversation");
        let expected = [("system", "Be brief."), ("user", "a\nb"), ("assistant", "")];
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(r, c)| (r.as_str(), c.as_str()))
            .collect();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn conversation_refuses_images_unknown_roles_and_emptiness() {
        let image = message(
            "user",
            serde_json::json!([{"type": "image_url", "image_url": {"url": "x"}}]),
        );
        for (messages, needle) in [
            (vec![image], "image_url"),
            (vec![message("tool", serde_json::json!("x"))], "`tool`"),
            (Vec::new(), "empty"),
        ] {
            let error = conversation(&messages).expect_err(needle);
            assert!(error.message().contains(needle), "{}", error.message());
        }
    }
}
