//! The verify loop: one llama.cpp context generating tokens, drafts verified in batches.
//!
//! Each round decodes `[last, d1..dK]` at positions `n_past..=n_past+K` with logits at every
//! position, samples the target at position 0, and keeps going while the sample equals the next
//! draft token. The first differing sample (or the sample after the last draft token) is the
//! round's target token. KV entries past the accepted prefix are removed with `seq_rm`, so the
//! cache always holds exactly the committed context. Because a token is committed only when the
//! target itself produced it at that position, the output is token-identical to plain decoding
//! (greedy) or drawn from exactly the target's distribution (sampling).

mod cost;

pub use self::cost::{DEFAULT_COST_REPETITIONS, VerifyCurve};

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::budget::RoundLimits;
use super::context::{ModelContext, Outputs};
use super::error::EngineError;
use super::model::Target;
use super::sample::{SamplingParams, TokenSampler};
use super::stats::GenerationStats;
use super::text::{StopStrings, TextStream};
use crate::cascade::{Cascade, Draft, RoundTiming, SourceStats, Token};

/// Default maximum draft length per round.
pub const DEFAULT_DRAFT_MAX: usize = 24;
/// The largest draft length any command or request may ask for. A verify batch this long
/// already costs many single-token steps on a CPU, and a server measures its verify cost curve
/// once, at start-up, up to its `--draft-max`: the bound keeps that measurement (and the
/// `draft_max + 1` of a batch) small.
pub const DRAFT_MAX_LIMIT: usize = 256;
/// Default context size, in tokens.
pub const DEFAULT_CTX_SIZE: u32 = 4096;
/// Default llama.cpp batch size (also the largest verify batch).
pub const DEFAULT_BATCH_SIZE: u32 = 512;

/// Settings of a llama.cpp context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// Context size in tokens (prompt + output).
    pub ctx_size: u32,
    /// Tokens per `llama_decode` call when processing the prompt.
    pub batch_size: u32,
    /// Compute threads of the target.
    pub threads: usize,
}

impl Default for SessionParams {
    fn default() -> Self {
        Self {
            ctx_size: DEFAULT_CTX_SIZE,
            batch_size: DEFAULT_BATCH_SIZE,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct Request {
    /// Prompt tokens (already templated).
    pub prompt: Vec<Token>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How the target's tokens are chosen.
    pub sampling: SamplingParams,
    /// Generation ends before any of these strings.
    pub stop: StopStrings,
    /// Most draft tokens verified per round (the policy chooses up to this many).
    pub draft_max: usize,
}

impl Request {
    /// A request with no stop strings and the default draft length.
    pub fn new(prompt: Vec<Token>, max_tokens: usize, sampling: SamplingParams) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling,
            stop: StopStrings::default(),
            draft_max: DEFAULT_DRAFT_MAX,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` were generated.
    MaxTokens,
    /// A stop string appeared.
    StopString,
    /// The caller's [`RoundControl`] stopped generation (the client went away).
    Cancelled,
}

/// What the caller of [`Session::generate_controlled`] decides before a round.
pub enum RoundDecision {
    /// Run the round with the current cascade.
    Continue,
    /// End generation now, with [`StopReason::Cancelled`].
    Stop,
    /// Run this and later rounds with another cascade. The engine ends the current cascade
    /// (its counters are kept in the outcome's per-source stats) and begins the new one with the
    /// whole context so far, so the new sources draft from exactly where the old ones stopped.
    Replace(Cascade),
}

/// Consulted between rounds: whether generation goes on, and with which cascade.
///
/// Called before every round after the first token, never inside one, so a replaced cascade
/// or a stop always falls between two verified rounds. Greedy output does not depend on the
/// decisions: every committed token is the target's own.
pub trait RoundControl {
    /// Decides the next round; [`RoundDecision::Continue`] keeps going as before.
    fn before_round(&mut self) -> RoundDecision;

    /// Asked before each chunk of the prompt after the first (a long prompt is read in chunks
    /// of the batch size): `true` ends the request now, with [`StopReason::Cancelled`] and no
    /// output. Default: never.
    fn stop_prefill(&mut self) -> bool {
        false
    }
}

impl<F: FnMut() -> RoundDecision> RoundControl for F {
    fn before_round(&mut self) -> RoundDecision {
        self()
    }
}

/// The result of a request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Generated tokens, in order (an end-of-generation token is included).
    pub tokens: Vec<Token>,
    /// Generated text, as streamed.
    pub text: String,
    /// Why generation ended.
    pub stop_reason: StopReason,
    /// What it cost and how speculation did.
    pub stats: GenerationStats,
}

/// A llama.cpp context of the target, reused across requests, and what verifying costs in it.
pub struct Session<'a> {
    target: &'a Target,
    context: ModelContext<'a>,
    batch_size: usize,
    /// The verify cost curve measured in this context (empty until measured), which every
    /// request's policy gets for its prompt's length.
    verify_curve: VerifyCurve,
}

impl<'a> Session<'a> {
    pub(super) fn new(target: &'a Target, context: ModelContext<'a>) -> Self {
        // llama.cpp may adjust the requested sizes (it caps the batch at the context size).
        let batch_size = context.batch_capacity();
        Self {
            target,
            context,
            batch_size,
            verify_curve: VerifyCurve::default(),
        }
    }

    /// Context size in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.context.n_ctx()
    }

    /// The target this session decodes.
    pub fn target(&self) -> &'a Target {
        self.target
    }

    /// How many matrix products of this session's batches the host's batched Q8_0/Q5_0/Q4_0 kernel
    /// computed (see `TargetParams::host_batch_products`); 0 when llama.cpp computed them all.
    pub fn host_batch_products(&self) -> u64 {
        self.context.host_products()
    }

    /// Most tokens one `llama_decode` takes (the largest verify batch).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Generates a completion of `request`, drafting with `cascade`, calling `on_text` with each
    /// piece of text as soon as it is final.
    pub fn generate(
        &mut self,
        request: &Request,
        cascade: &mut Cascade,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Outcome, EngineError> {
        self.generate_controlled(request, cascade, on_text, &mut || RoundDecision::Continue)
    }

    /// Like [`Self::generate`], asking `control` before every round whether to go on and with
    /// which cascade. On return `cascade` is the one the last round used.
    pub fn generate_controlled(
        &mut self,
        request: &Request,
        cascade: &mut Cascade,
        on_text: &mut dyn FnMut(&str),
        control: &mut dyn RoundControl,
    ) -> Result<Outcome, EngineError> {
        self.check_request(request)?;
        let prompt = &request.prompt;
        let ctx_size = self.ctx_size();
        // A cascade swapped in between rounds drafts only if drafts can be verified at all.
        let can_verify_drafts = request.draft_max > 0 && self.target.can_roll_back();
        let mut speculate = !cascade.is_empty() && request.draft_max > 0 && self.roll_back_check();
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            ..GenerationStats::default()
        };
        let mut sampler = TokenSampler::new(&request.sampling);
        let mut output = Output::new(self.target, request, on_text);

        let started = Instant::now();
        self.context.clear();
        let last_index = match self.decode_prompt(prompt, &mut || control.stop_prefill())? {
            Prefill::Done { last_index } => last_index,
            Prefill::Stopped { decoded } => {
                stats.prompt_tokens = decoded;
                stats.prompt_time = started.elapsed();
                tracing::debug!(
                    decoded,
                    prompt = prompt.len(),
                    "request stopped while reading its prompt"
                );
                return Ok(Outcome {
                    tokens: Vec::new(),
                    text: String::new(),
                    stop_reason: StopReason::Cancelled,
                    stats,
                });
            }
        };
        let mut last = sampler.sample(self.context.logits(last_index));
        stats.prompt_time = started.elapsed();

        let started = Instant::now();
        let mut stop = output.commit(last);
        let facts = self.target.facts(ctx_size);
        let mut verify_costs = self.verify_curve.at(prompt.len());
        verify_costs.truncate(request.draft_max + 1);
        if speculate {
            let draft_started = Instant::now();
            let context = [prompt.as_slice(), &[last]].concat();
            cascade.begin(&facts, &context, request.draft_max, &verify_costs);
            stats.draft_time += draft_started.elapsed();
        }
        let mut n_past = prompt.len();
        while stop.is_none() {
            match control.before_round() {
                RoundDecision::Continue => {}
                RoundDecision::Stop => {
                    stop = Some(StopReason::Cancelled);
                    break;
                }
                RoundDecision::Replace(replacement) => {
                    let draft_started = Instant::now();
                    if speculate {
                        cascade.end();
                        merge_source_stats(&mut stats.sources, cascade.stats());
                    }
                    *cascade = replacement;
                    speculate = can_verify_drafts && !cascade.is_empty();
                    if speculate {
                        let context = [prompt.as_slice(), &output.tokens].concat();
                        cascade.begin(&facts, &context, request.draft_max, &verify_costs);
                    }
                    stats.draft_time += draft_started.elapsed();
                }
            }
            let remaining = request.max_tokens - output.tokens.len();
            let budget = if speculate {
                RoundLimits {
                    remaining_tokens: remaining,
                    batch_size: self.batch_size,
                    free_context: ctx_size as usize - n_past,
                }
                .budget(request.draft_max)
            } else {
                0
            };
            let draft_started = Instant::now();
            let draft = if speculate {
                cascade.propose(budget)
            } else {
                Draft::default()
            };
            let draft_time = draft_started.elapsed();
            stats.draft_time += draft_time;

            let verify_started = Instant::now();
            self.decode_round(last, &draft.tokens, n_past)?;
            let verify_time = verify_started.elapsed();
            stats.verify_time += verify_time;
            stats.rounds += 1;
            stats.count_verify_batch(draft.tokens.len() + 1);
            if !draft.tokens.is_empty() {
                stats.draft_rounds += 1;
                stats.drafted += draft.tokens.len() as u64;
            }

            let mut committed = Vec::with_capacity(draft.tokens.len() + 1);
            let mut n_accepted = 0;
            for position in 0..=draft.tokens.len() {
                let token = sampler.sample(self.context.logits(position));
                let matches = draft.tokens.get(position) == Some(&token);
                n_accepted += usize::from(matches);
                committed.push(token);
                stop = output.commit(token);
                if stop.is_some() || !matches {
                    break;
                }
            }
            stats.accepted += n_accepted as u64;
            if n_accepted < draft.tokens.len() {
                let first_rejected = n_past + n_accepted + 1;
                self.context
                    .remove_from(first_rejected)
                    .map_err(|e| decode_error(draft.tokens.len() + 1, e))?;
            }
            n_past += n_accepted + 1;
            last = *committed
                .last()
                .expect("a round commits at least one token");
            tracing::debug!(
                round = stats.rounds,
                drafted = draft.tokens.len(),
                accepted = n_accepted,
                "round"
            );
            if speculate {
                let draft_started = Instant::now();
                let committed_text = if cascade.wants_text() {
                    self.target.text_of(&committed)
                } else {
                    String::new()
                };
                let timing = RoundTiming {
                    draft_time,
                    verify_time,
                };
                cascade.accept(&draft, n_accepted, &committed, timing, &committed_text);
                stats.draft_time += draft_started.elapsed();
            }
        }
        stats.generation_time = started.elapsed();
        if speculate {
            cascade.end();
            merge_source_stats(&mut stats.sources, cascade.stats());
        }
        let stop_reason = stop.expect("the loop ends only with a stop reason");
        let (tokens, text) = output.finish(stop_reason);
        stats.generated_tokens = tokens.len();
        Ok(Outcome {
            tokens,
            text,
            stop_reason,
            stats,
        })
    }

    /// Whether speculation is possible on this target; warns once per request when it is not.
    fn roll_back_check(&self) -> bool {
        let ok = self.target.can_roll_back();
        if !ok {
            tracing::warn!(
                model = %self.target.path().display(),
                "recurrent or hybrid model: its state cannot be rolled back with seq_rm, so drafts cannot be verified; decoding without speculation"
            );
        }
        ok
    }

    /// Decodes the prompt in batches, asking `stop` before every batch after the first.
    fn decode_prompt(
        &mut self,
        prompt: &[Token],
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Prefill, EngineError> {
        let chunks = prompt.chunks(self.batch_size);
        let n_chunks = chunks.len();
        let mut position = 0;
        let mut last_index = 0;
        for (i, chunk) in chunks.enumerate() {
            if i > 0 && stop() {
                return Ok(Prefill::Stopped { decoded: position });
            }
            let outputs = if i + 1 == n_chunks {
                Outputs::Last
            } else {
                Outputs::None
            };
            self.context
                .decode(chunk, position, outputs)
                .map_err(|e| decode_error(chunk.len(), e))?;
            position += chunk.len();
            last_index = chunk.len() - 1;
        }
        Ok(Prefill::Done { last_index })
    }

    /// Checks that this session can run `request`: a non-empty prompt that fits in the context
    /// with `max_tokens` after it. [`Self::generate`] checks it too; call it first to refuse a
    /// request before doing work for it.
    pub fn check_request(&self, request: &Request) -> Result<(), EngineError> {
        let prompt = &request.prompt;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let ctx_size = self.ctx_size();
        let needed = prompt.len() + request.max_tokens;
        if needed > ctx_size as usize {
            return Err(EngineError::ContextOverflow {
                prompt: prompt.len(),
                max_tokens: request.max_tokens,
                ctx_size,
                needed,
            });
        }
        Ok(())
    }

    /// Decodes `[last, draft..]` at `n_past..` with logits at every position.
    fn decode_round(
        &mut self,
        last: Token,
        draft: &[Token],
        n_past: usize,
    ) -> Result<(), EngineError> {
        let tokens: Vec<Token> = std::iter::once(last).chain(draft.iter().copied()).collect();
        self.decode_at(&tokens, n_past, true)
    }

    /// Decodes `tokens` at positions `position..` in one batch (at most the batch size), with
    /// logits at every position when `all_logits`, else at the last only.
    pub(super) fn decode_at(
        &mut self,
        tokens: &[Token],
        position: usize,
        all_logits: bool,
    ) -> Result<(), EngineError> {
        let needed = position + tokens.len();
        if needed > self.ctx_size() as usize || tokens.len() > self.batch_size {
            return Err(EngineError::ContextOverflow {
                prompt: position,
                max_tokens: tokens.len(),
                ctx_size: self.ctx_size(),
                needed,
            });
        }
        let outputs = if all_logits {
            Outputs::All
        } else {
            Outputs::Last
        };
        self.context
            .decode(tokens, position, outputs)
            .map_err(|e| decode_error(tokens.len(), e))
    }
}

/// How reading a prompt ended.
enum Prefill {
    /// Every token was decoded; the last one's logits are at this batch index.
    Done { last_index: usize },
    /// Stopped before the end, after decoding this many tokens.
    Stopped { decoded: usize },
}

/// Adds the counters of a finished cascade to a request's per-source stats: a source already
/// there (the same name, before a cascade was replaced) is summed, a new one is appended.
fn merge_source_stats(sources: &mut Vec<SourceStats>, finished: Vec<SourceStats>) {
    for source in finished {
        match sources.iter_mut().find(|s| s.name == source.name) {
            Some(existing) => existing.add(&source),
            None => sources.push(source),
        }
    }
}

fn decode_error(n_tokens: usize, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Decode {
        n_tokens,
        reason: reason.to_string(),
    }
}

/// Committed tokens, their text, and the checks that end generation.
struct Output<'r> {
    target: &'r Target,
    max_tokens: usize,
    tokens: Vec<Token>,
    text: String,
    stream: TextStream,
    piece: Vec<u8>,
    on_text: &'r mut dyn FnMut(&str),
}

impl<'r> Output<'r> {
    fn new(target: &'r Target, request: &Request, on_text: &'r mut dyn FnMut(&str)) -> Self {
        Self {
            target,
            max_tokens: request.max_tokens,
            tokens: Vec::new(),
            text: String::new(),
            stream: TextStream::new(request.stop.clone()),
            piece: Vec::new(),
            on_text,
        }
    }

    /// Appends `token` to the output and streams its text; says whether generation must end.
    fn commit(&mut self, token: Token) -> Option<StopReason> {
        self.tokens.push(token);
        if self.target.is_eog(token) {
            return Some(StopReason::EndOfGeneration);
        }
        self.target.token_bytes(token, &mut self.piece);
        let released = self.stream.push(&self.piece);
        self.emit(&released.text);
        if released.stopped {
            return Some(StopReason::StopString);
        }
        (self.tokens.len() >= self.max_tokens).then_some(StopReason::MaxTokens)
    }

    fn emit(&mut self, text: &str) {
        if !text.is_empty() {
            (self.on_text)(text);
            self.text.push_str(text);
        }
    }

    fn finish(mut self, stop_reason: StopReason) -> (Vec<Token>, String) {
        if stop_reason != StopReason::StopString {
            let rest = self.stream.finish();
            self.emit(&rest);
        }
        (self.tokens, self.text)
    }
}
