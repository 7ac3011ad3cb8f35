//! What completions and chat completions share: checking a request's parameters into an engine
//! request, queueing it, and reading its result back, whole or as server-sent events.
//!
//! Order for one request: [`Plan::from_params`] validates everything that does not depend on
//! the prompt (and refuses parameters the server cannot honour, naming them); a policy's
//! settings are tried in a throw-away instance on a blocking thread, once per distinct
//! settings; [`Plan::submit`] checks that prompt plus `max_tokens` fit the context and queues
//! the job; the handler then answers with [`whole_response`] or streams with [`event_stream`].
//!
//! Both answers watch the client ([`ClientConnection`]): once it closes its sending side they
//! write to it every [`PROBE_INTERVAL`] (whitespace before a JSON answer, an SSE comment in a
//! stream) while the request waits or generates. A client that only half-closed reads its
//! answer; a client that went away makes a write fail, which drops the answer and cancels the
//! request.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt as _};
use tokio::sync::mpsc::UnboundedReceiver;

use super::connections::ClientConnection;
use super::constraint::ConstraintFields;
use super::error::ApiError;
use super::fields;
use super::logprobs;
use super::metrics::{Endpoint, RequestOutcome};
use super::registry::{CascadeChoice, ResolvedPolicy};
use super::scheduler::{Event, Finished, Job};
use super::state::AppState;
use super::wire::{CommonParams, SourceReport, SpeculativeReport, Timings, Usage};
use crate::cascade::CascadeMode;
use crate::cascade::Token;
use crate::engine::{
    Grammar, Request, SamplingParams, StopReason, StopStrings, TokenLogprob, check_max_draft_len,
};
use crate::plugins::parse_cascade;

/// How often a client that closed its sending side is written to while its answer is not
/// ready: a client that went away is noticed (and its request cancelled) within about this.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// A checked request, waiting for its prompt.
#[derive(Debug)]
pub struct Plan {
    endpoint: Endpoint,
    max_tokens: usize,
    /// Whether the client gave `max_tokens`; without it a request generates at most to the
    /// end of the context, as OpenAI's and llama-server's do.
    max_tokens_given: bool,
    sampling: SamplingParams,
    stop: StopStrings,
    cascade: CascadeChoice,
    max_draft_len: usize,
    mode: CascadeMode,
    grammar_drafts: bool,
    policy: Option<ResolvedPolicy>,
    /// Completions generated for the prompt (`n`).
    pub choices: usize,
    /// Stream the answer.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
}

/// A queued request: its id and where its events arrive.
#[derive(Debug)]
pub struct Submitted {
    /// The request id.
    pub id: String,
    /// Unix seconds when it was queued (the `created` of its answer).
    pub created: u64,
    /// Text pieces, then the result, of every choice.
    pub events: UnboundedReceiver<Event>,
    /// Choices queued (`n`).
    pub choices: usize,
}

impl Plan {
    /// Checks the parameters shared by both endpoints against the server's limits, defaults
    /// and loaded plugins.
    pub async fn from_params(
        state: &AppState,
        endpoint: Endpoint,
        params: CommonParams,
        max_tokens: Option<usize>,
    ) -> Result<Self, ApiError> {
        if let Some(model) = &params.model
            && !state.accept_any_model
            && !state.model_aliases.contains(model)
        {
            return Err(ApiError::not_found(
                "model_not_found",
                format!(
                    "model `{model}` does not exist; this server serves `{}` (see GET /v1/models; --accept-any-model serves any name)",
                    state.model_aliases.join("`, `")
                ),
            ));
        }
        refuse_unsupported(&params)?;
        fields::refuse_unknown(&params.other)?;
        let choices = choices(state, params.n)?;
        let max_tokens = match (max_tokens, params.n_predict) {
            (Some(max_tokens), _) => Some(max_tokens),
            (None, None | Some(-1)) => None,
            (None, Some(n_predict)) => Some(usize::try_from(n_predict).map_err(|_| {
                ApiError::invalid_param(
                    "n_predict",
                    format!("n_predict must be -1 (as many as the server allows) or a count of tokens, got {n_predict}"),
                )
            })?),
        };
        let limit = state.limits.max_tokens_limit;
        let max_tokens_given = max_tokens.is_some();
        let max_tokens = max_tokens.unwrap_or(state.limits.default_max_tokens);
        if max_tokens == 0 || max_tokens > limit {
            return Err(ApiError::invalid_param(
                "max_tokens",
                format!(
                    "max_tokens must be between 1 and {limit} (the server's --max-tokens-limit), got {max_tokens}"
                ),
            ));
        }
        let mut sampling = sampling(&state.sampling, &params)?;
        sampling.top_logprobs = match endpoint {
            Endpoint::ChatCompletions => {
                logprobs::chat_request(params.logprobs.as_ref(), params.top_logprobs.as_ref())
            }
            _ => {
                logprobs::completion_request(params.logprobs.as_ref(), params.top_logprobs.as_ref())
            }
        }?;
        sampling.grammar = grammar(state, &params).await?;
        let stop = StopStrings::new(params.stop.map(|stop| stop.into_vec()).unwrap_or_default())
            .map_err(|error| ApiError::invalid_param("stop", error.to_string()))?;

        let speculative = params.speculative.unwrap_or_default();
        let snapshot = state.registry.snapshot();
        let cascade = match &speculative.cascade {
            None => CascadeChoice::Default,
            Some(spec) => CascadeChoice::Named(cascade_names(spec)?),
        };
        let cascade_error = |error| ApiError::from(error).about_param("speculative.cascade");
        let sources = snapshot.resolve(&cascade).map_err(cascade_error)?;
        state
            .registry
            .check_draft_model(&sources)
            .map_err(cascade_error)?;
        let limit = state.limits.max_draft_len;
        let max_draft_len = speculative
            .max_draft_len
            .unwrap_or(snapshot.defaults.max_draft_len);
        if check_max_draft_len(max_draft_len, limit).is_err() {
            return Err(ApiError::invalid_param(
                "speculative.draft_max",
                format!(
                    "speculative.draft_max must be between 1 and {limit} (the server's --draft-max), got {max_draft_len}; use speculative.cascade `none` to decode without speculation"
                ),
            ));
        }
        let policy = match speculative
            .policy
            .or_else(|| snapshot.defaults.policy.clone())
        {
            // Plain decoding has no rounds to choose a draft length for.
            Some(spec) if !sources.is_empty() => {
                let names: Vec<String> =
                    sources.iter().map(|s| s.plugin.name().to_owned()).collect();
                let registry = Arc::clone(&state.registry);
                let policy_error = |error| ApiError::from(error).about_param("speculative.policy");
                let resolved = snapshot.policy(&spec).map_err(policy_error)?;
                if registry.policy_checked(&resolved, &names, max_draft_len) {
                    Some(resolved)
                } else {
                    // Opening the policy runs its code: never on the async threads.
                    let checked = tokio::task::spawn_blocking(move || {
                        registry.check_policy(resolved, names, max_draft_len)
                    })
                    .await
                    .map_err(|e| ApiError::internal(format!("checking the policy failed: {e}")))?;
                    Some(checked.map_err(policy_error)?)
                }
            }
            _ => None,
        };
        Ok(Self {
            endpoint,
            max_tokens,
            max_tokens_given,
            sampling,
            stop,
            cascade,
            max_draft_len,
            mode: speculative.mode.unwrap_or(snapshot.defaults.mode),
            grammar_drafts: speculative
                .grammar_drafts
                .unwrap_or(snapshot.defaults.grammar_drafts),
            policy,
            choices,
            stream: params.stream,
            include_usage: params
                .stream_options
                .is_some_and(|options| options.include_usage),
        })
    }

    /// Queues the request with its `prompt`, after checking that prompt and `max_tokens` fit
    /// the context. A request that did not give `max_tokens` generates at most what the
    /// context leaves after its prompt, and ends with `length` there.
    pub fn submit(
        &self,
        state: &AppState,
        id_prefix: &str,
        prompt: Vec<Token>,
    ) -> Result<Submitted, ApiError> {
        if prompt.is_empty() {
            return Err(count_invalid(
                state,
                self.endpoint,
                ApiError::invalid_param("prompt", "the prompt is empty; send some text"),
            ));
        }
        let ctx_size = state.limits.ctx_size as usize;
        let room = ctx_size.saturating_sub(prompt.len());
        let max_tokens = if self.max_tokens_given {
            self.max_tokens
        } else {
            self.max_tokens.min(room)
        };
        if max_tokens == 0 || prompt.len() + max_tokens > ctx_size {
            let message = if self.max_tokens_given {
                format!(
                    "the prompt ({} tokens) plus max_tokens ({max_tokens}) exceed the context of {ctx_size} tokens; shorten the prompt or lower max_tokens",
                    prompt.len()
                )
            } else {
                format!(
                    "the prompt ({} tokens) leaves no room to generate in the context of {ctx_size} tokens; shorten the prompt",
                    prompt.len()
                )
            };
            return Err(count_invalid(
                state,
                self.endpoint,
                ApiError::context_length_exceeded(message),
            ));
        }
        let id = state.request_id(id_prefix);
        let span = tracing::info_span!(
            "request",
            id = %id,
            model = %state.model_id,
            cascade = %self.cascade_label(state),
        );
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let request = Request {
            prompt,
            max_tokens,
            sampling: self.sampling.clone(),
            stop: self.stop.clone(),
            max_draft_len: self.max_draft_len,
        };
        let jobs = (0..self.choices)
            .map(|choice| {
                let mut request = request.clone();
                // Each choice draws with its own seed: `seed`, `seed + 1`, ...
                request.sampling.seed = request.sampling.seed.wrapping_add(choice as u32);
                Job {
                    endpoint: self.endpoint,
                    request,
                    cascade: self.cascade.clone(),
                    mode: self.mode,
                    grammar_drafts: self.grammar_drafts,
                    policy: self.policy.clone(),
                    choice,
                    events: events.clone(),
                    span: span.clone(),
                    queued_at: Instant::now(),
                }
            })
            .collect();
        if let Err(rejected) = state
            .queue
            .submit(jobs, state.metrics.recent_request_time())
        {
            state
                .metrics
                .request(self.endpoint, RequestOutcome::Rejected);
            return Err(rejected.into());
        }
        Ok(Submitted {
            id,
            created: super::state::unix_now(),
            events: receiver,
            choices: self.choices,
        })
    }

    /// Whether the answer reports log-probabilities.
    pub fn reports_logprobs(&self) -> bool {
        self.sampling.top_logprobs.is_some()
    }

    fn cascade_label(&self, state: &AppState) -> String {
        match &self.cascade {
            CascadeChoice::Default => {
                format!(
                    "default({})",
                    state.registry.snapshot().defaults.cascade.join(",")
                )
            }
            CascadeChoice::Named(names) if names.is_empty() => "none".to_owned(),
            CascadeChoice::Named(names) => names.join(","),
        }
    }
}

/// Counts and logs a request refused as invalid, and passes the error on.
pub fn count_invalid(state: &AppState, endpoint: Endpoint, error: ApiError) -> ApiError {
    state.metrics.request(endpoint, RequestOutcome::Invalid);
    tracing::debug!(
        ?endpoint,
        message = error.message(),
        "refused an invalid request"
    );
    error
}

/// Plugin names of a request's `speculative.cascade`: `none`, or loaded plugins by name; paths
/// are for admins (`PUT /admin/cascade`).
fn cascade_names(spec: &str) -> Result<Vec<String>, ApiError> {
    let param = "speculative.cascade";
    let entries = parse_cascade(spec).map_err(|e| ApiError::invalid_param(param, e.to_string()))?;
    entries
        .into_iter()
        .map(|entry| match entry {
            crate::plugins::SourceSpec::Builtin(name) => Ok(name),
            crate::plugins::SourceSpec::Path(path) => Err(ApiError::invalid_param(
                param,
                format!(
                    "requests may name loaded plugins only, not files ({}); an admin loads a new plugin with PUT /admin/cascade",
                    path.display()
                ),
            )),
        })
        .collect()
}

/// The grammar a request's output must follow (`grammar`, `json_schema` or
/// `response_format`), converted and checked on the model off the async threads.
async fn grammar(state: &AppState, params: &CommonParams) -> Result<Option<Grammar>, ApiError> {
    if params.grammar.as_deref().is_none_or(str::is_empty)
        && params
            .json_schema
            .as_ref()
            .is_none_or(serde_json::Value::is_null)
        && params.response_format.is_none()
    {
        return Ok(None);
    }
    let tokenizer = Arc::clone(&state.tokenizer);
    let (text, schema, format) = (
        params.grammar.clone(),
        params.json_schema.clone(),
        params.response_format.clone(),
    );
    tokio::task::spawn_blocking(move || {
        let fields = ConstraintFields {
            grammar: text.as_deref(),
            json_schema: schema.as_ref(),
            response_format: format.as_ref(),
        };
        let Some((param, grammar)) = fields.grammar()? else {
            return Ok(None);
        };
        tokenizer
            .check_grammar(&grammar)
            .map_err(|error| ApiError::invalid_param(param, error.to_string()))?;
        Ok(Some(grammar))
    })
    .await
    .map_err(|e| ApiError::internal(format!("checking the grammar failed: {e}")))?
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// How many completions a request asks for: `n`, from 1 to [`MAX_CHOICES`] and at most what
/// the server holds at once (`--parallel` plus `--max-queue`), since every choice is a request
/// in the queue.
fn choices(state: &AppState, n: Option<u32>) -> Result<usize, ApiError> {
    let gauges = state.queue.gauges();
    let limit = MAX_CHOICES.min((gauges.slots + gauges.max_queue).max(1));
    let n = n.map_or(1, |n| n as usize);
    if n == 0 || n > limit {
        return Err(ApiError::invalid_param(
            "n",
            format!(
                "n must be between 1 and {limit} (at most {MAX_CHOICES}, and at most --parallel plus --max-queue: each choice is a request in the queue), got {n}"
            ),
        ));
    }
    Ok(n)
}

/// Refuses parameters the server cannot honour, rather than ignore them.
fn refuse_unsupported(params: &CommonParams) -> Result<(), ApiError> {
    let refuse = |param: &'static str, what: &str| {
        Err(ApiError::invalid_param(
            param,
            format!("{param} {what} is not supported; leave it out"),
        ))
    };
    if params.presence_penalty.is_some_and(|p| p != 0.0) {
        return refuse("presence_penalty", "other than 0");
    }
    if params.frequency_penalty.is_some_and(|p| p != 0.0) {
        return refuse("frequency_penalty", "other than 0");
    }
    if params
        .logit_bias
        .as_ref()
        .is_some_and(|bias| !bias.is_empty())
    {
        return refuse("logit_bias", "(token biases)");
    }
    Ok(())
}

/// The request's sampling: its own values over the server's defaults, checked; a fresh seed
/// unless it gives one.
fn sampling(defaults: &SamplingParams, params: &CommonParams) -> Result<SamplingParams, ApiError> {
    let mut sampling = defaults.clone();
    if let Some(temperature) = params.temperature {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("temperature must be 0 (greedy) or positive, got {temperature}"),
            ));
        }
        sampling.temperature = temperature;
    }
    if let Some(top_p) = params.top_p {
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid_param(
                "top_p",
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        sampling.top_p = top_p;
    }
    if let Some(top_k) = params.top_k {
        if top_k < 0 {
            return Err(ApiError::invalid_param(
                "top_k",
                format!("top_k must be 0 (off) or positive, got {top_k}"),
            ));
        }
        sampling.top_k = top_k;
    }
    if let Some(min_p) = params.min_p {
        if !(0.0..1.0).contains(&min_p) {
            return Err(ApiError::invalid_param(
                "min_p",
                format!("min_p must be in [0, 1), got {min_p}"),
            ));
        }
        sampling.min_p = min_p;
    }
    if let Some(acceptance) = params
        .speculative
        .as_ref()
        .and_then(|speculative| speculative.draft_acceptance)
    {
        sampling.draft_acceptance = acceptance;
    }
    sampling.seed = params.seed.unwrap_or_else(crate::config::fresh_seed);
    Ok(sampling)
}

/// Waits for the end of every one of a request's `choices`; the text comes with the results,
/// in choice order.
async fn collect(
    events: &mut UnboundedReceiver<Event>,
    choices: usize,
) -> Result<Vec<Box<Finished>>, ApiError> {
    let mut finished = Vec::with_capacity(choices);
    while let Some(event) = events.recv().await {
        match event {
            Event::Text { .. } => {}
            Event::Done(done) => {
                finished.push(done);
                if finished.len() == choices {
                    finished.sort_by_key(|done| done.choice);
                    return Ok(finished);
                }
            }
            Event::Failed(error) => return Err(error),
        }
    }
    Err(ApiError::internal(
        "the request ended without a result; see the server log",
    ))
}

/// The whole answer of a request, `answer` made from its results (one per choice, in order),
/// once every choice is done. If the client closes its sending side first, the answer turns into a probing one: status 200 at
/// once, whitespace every [`PROBE_INTERVAL`], then the JSON (an error's JSON if generation
/// fails after that, since the status is already sent).
pub async fn whole_response<A>(
    mut events: UnboundedReceiver<Event>,
    choices: usize,
    client: Option<ClientConnection>,
    answer: A,
) -> Result<Response, ApiError>
where
    A: FnOnce(Vec<Box<Finished>>) -> serde_json::Value + Send + 'static,
{
    let Some(mut client) = client else {
        return collect(&mut events, choices)
            .await
            .map(|finished| Json(answer(finished)).into_response());
    };
    let finished = tokio::select! {
        finished = collect(&mut events, choices) => Some(finished),
        () = client.stopped_sending() => None,
    };
    if let Some(finished) = finished {
        return finished.map(|finished| Json(answer(finished)).into_response());
    }
    let body = futures_util::stream::unfold(
        (
            Some((events, answer)),
            tokio::time::interval(PROBE_INTERVAL),
        ),
        move |(state, mut probes)| async move {
            let (mut events, answer) = state?;
            tokio::select! {
                finished = collect(&mut events, choices) => {
                    let json = match finished {
                        Ok(finished) => answer(finished),
                        Err(error) => error.to_json(),
                    };
                    Some((Ok::<_, Infallible>(Bytes::from(json.to_string())), (None, probes)))
                }
                _ = probes.tick() => {
                    Some((Ok(Bytes::from_static(b" ")), (Some((events, answer)), probes)))
                }
            }
        },
    );
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    Ok(response)
}

/// What a whole answer reports beside its choices.
pub struct AnswerReports {
    /// Every choice's tokens, the prompt once.
    pub usage: Usage,
    /// The first choice's timings.
    pub timings: Timings,
    /// What speculation did for the first choice.
    pub speculative: SpeculativeReport,
}

impl AnswerReports {
    /// The reports of a request's finished choices (at least one, in order).
    pub fn of(finished: &[Box<Finished>]) -> Self {
        let first = &finished[0];
        Self {
            usage: Usage::of_choices(finished.iter().map(|done| &done.outcome.stats)),
            timings: Timings::of(&first.outcome.stats),
            speculative: speculative_report(first),
        }
    }
}

/// `finish_reason` of a stop reason.
pub fn finish_reason(stop_reason: StopReason) -> String {
    match stop_reason {
        StopReason::MaxTokens => "length",
        StopReason::EndOfGeneration | StopReason::StopString | StopReason::Cancelled => "stop",
    }
    .to_owned()
}

/// The `speculative` block of a finished request.
pub fn speculative_report(finished: &Finished) -> SpeculativeReport {
    let stats = &finished.outcome.stats;
    SpeculativeReport {
        cascade: finished.cascade.clone(),
        max_draft_len: finished.max_draft_len,
        mode: finished.mode,
        policy: finished.policy.clone(),
        rounds: stats.rounds,
        draft_rounds: stats.draft_rounds,
        drafted: stats.drafted,
        accepted: stats.accepted,
        drawn_rounds: stats.drawn_rounds,
        cut_draft_tokens: stats.cut_draft_tokens,
        replayed_tokens: stats.replayed_tokens,
        acceptance_percent: 100.0 * stats.acceptance(),
        mean_accepted_length: stats.mean_accepted_per_draft_round(),
        tokens_per_second: stats.generation_tokens_per_second(),
        mean_batch_requests: stats.mean_batch_requests(),
        mean_batch_tokens: stats.mean_batch_tokens(),
        swaps: finished.swaps,
        queue_ms: finished.queue_time.as_millis() as u64,
        sources: stats.sources.iter().map(SourceReport::from).collect(),
    }
}

/// What an SSE stream is made of, for the endpoint to format.
pub enum Piece {
    /// Text that is final, with the log-probabilities of the tokens it completes (empty
    /// unless the request asked for them).
    Text {
        /// The choice it belongs to.
        choice: usize,
        /// The text.
        text: String,
        /// The tokens' log-probabilities.
        logprobs: Vec<TokenLogprob>,
    },
    /// The end of a choice: its last chunk (finish reason, `speculative`) and, after the last
    /// choice, if asked, a usage chunk.
    Done {
        /// The choice's result.
        finished: Box<Finished>,
        /// Whether every choice has finished now.
        last: bool,
    },
}

/// An SSE response over a request's events (of its `choices`, interleaved): each [`Piece`]
/// becomes the chunks `format` makes, a failure becomes an `{"error": ...}` event, and the
/// stream ends with `data: [DONE]` once every choice is done.
/// Dropping the response (the client went away) drops the receiver, which cancels the request;
/// once the client closes its sending side, an SSE comment every [`PROBE_INTERVAL`] finds out
/// whether it is still reading.
pub fn event_stream<F>(
    events: UnboundedReceiver<Event>,
    choices: usize,
    client: Option<ClientConnection>,
    format: F,
) -> Response
where
    F: FnMut(Piece) -> Vec<serde_json::Value> + Send + 'static,
{
    Sse::new(sse_events(events, choices, client, format))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The stream's state between two events.
struct SseState<F> {
    events: UnboundedReceiver<Event>,
    /// Choices not finished yet.
    running: usize,
    format: F,
    client: Option<ClientConnection>,
    /// Probes of a client that stopped sending; `None` while it has not.
    probes: Option<tokio::time::Interval>,
}

/// What the stream does next.
enum Next {
    Event(Option<Event>),
    ClientStoppedSending,
    Probe,
}

fn sse_events<F>(
    events: UnboundedReceiver<Event>,
    choices: usize,
    client: Option<ClientConnection>,
    format: F,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static
where
    F: FnMut(Piece) -> Vec<serde_json::Value> + Send + 'static,
{
    let start = SseState {
        events,
        running: choices,
        format,
        client,
        probes: None,
    };
    futures_util::stream::unfold(Some(start), |state: Option<SseState<F>>| async move {
        let mut state = state?;
        let next = match (&mut state.client, &mut state.probes) {
            (_, Some(probes)) => tokio::select! {
                event = state.events.recv() => Next::Event(event),
                _ = probes.tick() => Next::Probe,
            },
            (Some(client), None) => tokio::select! {
                event = state.events.recv() => Next::Event(event),
                () = client.stopped_sending() => Next::ClientStoppedSending,
            },
            (None, None) => Next::Event(state.events.recv().await),
        };
        let (values, ended) = match next {
            Next::ClientStoppedSending => {
                state.probes = Some(tokio::time::interval(PROBE_INTERVAL));
                return Some((Vec::new(), Some(state)));
            }
            Next::Probe => {
                return Some((vec![SseEvent::default().comment("")], Some(state)));
            }
            Next::Event(Some(Event::Text {
                choice,
                text,
                logprobs,
            })) => (
                (state.format)(Piece::Text {
                    choice,
                    text,
                    logprobs,
                }),
                false,
            ),
            Next::Event(Some(Event::Done(finished))) => {
                state.running = state.running.saturating_sub(1);
                let last = state.running == 0;
                ((state.format)(Piece::Done { finished, last }), last)
            }
            Next::Event(Some(Event::Failed(error))) => (vec![error.to_json()], true),
            Next::Event(None) => (
                vec![
                    ApiError::internal("the request ended without a result; see the server log")
                        .to_json(),
                ],
                true,
            ),
        };
        let mut out: Vec<SseEvent> = values.into_iter().map(json_event).collect();
        if ended {
            out.push(SseEvent::default().data("[DONE]"));
            Some((out, None))
        } else {
            Some((out, Some(state)))
        }
    })
    .flat_map(|events| futures_util::stream::iter(events.into_iter().map(Ok)))
}

fn json_event(value: serde_json::Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DraftAcceptance;

    #[test]
    fn request_cascades_name_loaded_plugins_not_files() {
        assert_eq!(
            cascade_names("suffix, lookup").expect("names"),
            vec!["suffix".to_owned(), "lookup".to_owned()]
        );
        assert!(cascade_names("none").expect("none").is_empty());
        let error = cascade_names("./evil.wasm").expect_err("a path");
        assert!(
            error.message().contains("PUT /admin/cascade"),
            "{}",
            error.message()
        );
    }

    #[test]
    fn unsupported_parameters_are_refused_by_name() {
        let params = |json: serde_json::Value| -> CommonParams {
            serde_json::from_value(json).expect("valid params")
        };
        assert!(
            refuse_unsupported(&params(
                serde_json::json!({"n": 3, "logprobs": null, "presence_penalty": 0})
            ))
            .is_ok()
        );
        for (json, name) in [
            (
                serde_json::json!({"frequency_penalty": 0.5}),
                "frequency_penalty",
            ),
            (
                serde_json::json!({"logit_bias": {"50256": -100}}),
                "logit_bias",
            ),
        ] {
            let error = refuse_unsupported(&params(json)).expect_err(name);
            assert!(error.message().starts_with(name), "{}", error.message());
        }
    }

    #[test]
    fn request_sampling_overrides_defaults_within_range() {
        let defaults = SamplingParams::greedy();
        let params: CommonParams =
            serde_json::from_value(serde_json::json!({"temperature": 0.7, "top_k": 40, "seed": 9}))
                .expect("valid");
        let sampling = sampling(&defaults, &params).expect("in range");
        assert_eq!(
            (sampling.temperature, sampling.top_k, sampling.seed),
            (0.7, 40, 9)
        );
        assert_eq!(sampling.draft_acceptance, DraftAcceptance::Rejection);
        let compare: CommonParams = serde_json::from_value(
            serde_json::json!({"speculative": {"draft_acceptance": "compare"}}),
        )
        .expect("valid");
        assert_eq!(
            super::sampling(&defaults, &compare)
                .expect("in range")
                .draft_acceptance,
            DraftAcceptance::Compare
        );
        assert!(
            serde_json::from_value::<CommonParams>(
                serde_json::json!({"speculative": {"draft_acceptance": "maybe"}})
            )
            .is_err()
        );
        let bad: CommonParams =
            serde_json::from_value(serde_json::json!({"top_p": 0})).expect("valid json");
        assert!(sampling_err(&defaults, &bad).contains("top_p"));
    }

    fn sampling_err(defaults: &SamplingParams, params: &CommonParams) -> String {
        sampling(defaults, params)
            .expect_err("out of range")
            .message()
            .to_owned()
    }
}
