//! `POST /v1/completions`: text completion of a raw prompt (no chat template).

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use super::connections::ClientConnection;
use super::error::ApiError;
use super::extract::ApiJson;
use super::generation::{
    self, AnswerReports, Piece, Plan, count_invalid, finish_reason, speculative_report,
    whole_response,
};
use super::logprobs::CompletionLogprobs;
use super::metrics::Endpoint;
use super::state::AppState;
use super::wire::{
    Completion, CompletionChoice, CompletionRequest, Prompt, Timings, Usage, system_fingerprint,
};
use crate::cascade::Token;
use crate::engine::TokenLogprob;

const ENDPOINT: Endpoint = Endpoint::Completions;
/// `object` of completions and their stream chunks.
const OBJECT: &str = "text_completion";

/// `POST /v1/completions`.
pub async fn create(
    State(state): State<AppState>,
    client: Option<Extension<ClientConnection>>,
    body: Result<ApiJson<CompletionRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let invalid = |error| count_invalid(&state, ENDPOINT, error);
    let ApiJson(body) = body.map_err(invalid)?;
    refuse_unsupported(&body).map_err(invalid)?;
    let max_tokens = body.common.max_tokens;
    let plan = Plan::from_params(&state, ENDPOINT, body.common, max_tokens)
        .await
        .map_err(invalid)?;
    let client = client.map(|Extension(client)| client);
    let prompt = tokenize(&state, body.prompt).await.map_err(invalid)?;
    let submitted = plan.submit(&state, "cmpl", prompt)?;

    let id = submitted.id;
    let created = submitted.created;
    let model = state.model_id.clone();
    let fingerprint = system_fingerprint();
    let reports_logprobs = plan.reports_logprobs();
    let tokenizer = std::sync::Arc::clone(&state.tokenizer);
    let choices = submitted.choices;
    // Per choice: its text offsets continue from chunk to chunk.
    let mut logprobs: Vec<CompletionLogprobs> = (0..choices)
        .map(|_| CompletionLogprobs::default())
        .collect();
    let mut logprobs_of = move |choice: usize, generated: &[TokenLogprob]| {
        let logprobs = logprobs.get_mut(choice).filter(|_| reports_logprobs)?;
        Some(logprobs.next(tokenizer.as_ref(), generated))
    };
    let completion = move |index: usize, text: String, finish_reason: Option<String>| Completion {
        id: id.clone(),
        system_fingerprint: fingerprint.clone(),
        object: OBJECT.to_owned(),
        created,
        model: model.clone(),
        choices: vec![CompletionChoice {
            text,
            index,
            logprobs: None,
            finish_reason,
        }],
        usage: None,
        timings: None,
        speculative: None,
    };
    if plan.stream {
        let include_usage = plan.include_usage;
        let mut usage: Option<Usage> = None;
        return Ok(generation::event_stream(
            submitted.events,
            choices,
            client,
            move |piece| {
                let chunks = match piece {
                    Piece::Text {
                        choice,
                        text,
                        logprobs,
                    } => {
                        let mut chunk = completion(choice, text, None);
                        chunk.choices[0].logprobs = logprobs_of(choice, &logprobs);
                        vec![chunk]
                    }
                    Piece::Done { finished, last } => {
                        let stats = &finished.outcome.stats;
                        Usage::count(&mut usage, stats);
                        let mut chunks = vec![Completion {
                            timings: Some(Timings::of(stats)),
                            speculative: Some(speculative_report(&finished)),
                            ..completion(
                                finished.choice,
                                String::new(),
                                Some(finish_reason(finished.outcome.stop_reason)),
                            )
                        }];
                        if include_usage && last {
                            chunks.push(Completion {
                                choices: Vec::new(),
                                usage,
                                ..completion(0, String::new(), None)
                            });
                        }
                        chunks
                    }
                };
                chunks.iter().map(to_json).collect()
            },
        ));
    }
    whole_response(submitted.events, choices, client, move |finished| {
        let reports = AnswerReports::of(&finished);
        let answer = Completion {
            choices: finished
                .iter()
                .map(|done| CompletionChoice {
                    text: done.outcome.text.clone(),
                    index: done.choice,
                    logprobs: logprobs_of(done.choice, &done.outcome.logprobs),
                    finish_reason: Some(finish_reason(done.outcome.stop_reason)),
                })
                .collect(),
            usage: Some(reports.usage),
            timings: Some(reports.timings),
            speculative: Some(reports.speculative),
            ..completion(0, String::new(), None)
        };
        to_json(&answer)
    })
    .await
}

fn to_json(completion: &Completion) -> serde_json::Value {
    serde_json::to_value(completion).unwrap_or_default()
}

/// Refuses completion parameters the server cannot honour.
fn refuse_unsupported(body: &CompletionRequest) -> Result<(), ApiError> {
    if body.echo {
        return Err(ApiError::invalid_param(
            "echo",
            "echo is not supported; leave it out",
        ));
    }
    if body.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "suffix (insertion) is not supported; leave it out",
        ));
    }
    if body.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid_param(
            "best_of",
            "best_of other than 1 is not supported; leave it out",
        ));
    }
    Ok(())
}

/// The prompt's tokens: text tokenized as-is (off the async threads: a long prompt takes a
/// while), or token ids checked against the vocabulary.
async fn tokenize(state: &AppState, prompt: Prompt) -> Result<Vec<Token>, ApiError> {
    let text = match prompt {
        Prompt::Text(text) => text,
        Prompt::Texts(mut texts) if texts.len() == 1 => texts.remove(0),
        Prompt::Texts(texts) => {
            return Err(ApiError::invalid_param(
                "prompt",
                format!("got {} prompts; send one prompt per request", texts.len()),
            ));
        }
        Prompt::Tokens(tokens) => {
            let vocab_size = state.tokenizer.vocab_size();
            if let Some(token) = tokens.iter().find(|&&token| token >= vocab_size) {
                return Err(ApiError::invalid_param(
                    "prompt",
                    format!("token {token} is outside the vocabulary of {vocab_size} tokens"),
                ));
            }
            return Ok(tokens);
        }
    };
    let tokenizer = std::sync::Arc::clone(&state.tokenizer);
    tokio::task::spawn_blocking(move || tokenizer.tokenize_raw(&text))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))
}
