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

pub use self::cost::DEFAULT_COST_REPETITIONS;

use std::time::Instant;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use serde::{Deserialize, Serialize};

use super::budget::RoundLimits;
use super::error::EngineError;
use super::model::{Target, to_llama};
use super::sample::{SamplingParams, TokenSampler};
use super::stats::GenerationStats;
use super::text::{StopStrings, TextStream};
use crate::cascade::{Cascade, Draft, Token};

/// Default maximum draft length per round.
pub const DEFAULT_DRAFT_MAX: usize = 8;
/// Default context size, in tokens.
pub const DEFAULT_CTX_SIZE: u32 = 4096;
/// Default llama.cpp batch size (also the largest verify batch).
pub const DEFAULT_BATCH_SIZE: u32 = 512;
/// The one sequence a session decodes.
const SEQ: i32 = 0;

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
    /// Most draft tokens verified per round.
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

/// A llama.cpp context of the target, reused across requests.
pub struct Session<'a> {
    target: &'a Target,
    context: LlamaContext<'a>,
    batch: LlamaBatch<'static>,
    batch_size: usize,
}

impl<'a> Session<'a> {
    pub(super) fn new(target: &'a Target, context: LlamaContext<'a>) -> Self {
        // llama.cpp may adjust the requested sizes (it caps the batch at the context size).
        let batch_size = context.n_batch().max(1) as usize;
        Self {
            target,
            context,
            batch: LlamaBatch::new(batch_size, 1),
            batch_size,
        }
    }

    /// Context size in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.context.n_ctx()
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
        let speculate = !cascade.is_empty() && request.draft_max > 0 && self.roll_back_check();
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            ..GenerationStats::default()
        };
        let mut sampler = TokenSampler::new(&request.sampling);
        let mut output = Output::new(self.target, request, on_text);

        let started = Instant::now();
        self.context.clear_kv_cache();
        let last_index = self.decode_prompt(prompt)?;
        let mut last = sampler.sample(&self.context, last_index);
        stats.prompt_time = started.elapsed();

        let started = Instant::now();
        let mut stop = output.commit(last);
        if speculate {
            let draft_started = Instant::now();
            let context = [prompt.as_slice(), &[last]].concat();
            cascade.begin(&self.target.facts(ctx_size), &context);
            stats.draft_time += draft_started.elapsed();
        }
        let mut n_past = prompt.len();
        while stop.is_none() {
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
            let draft = if budget > 0 {
                cascade.propose(budget)
            } else {
                Draft::default()
            };
            stats.draft_time += draft_started.elapsed();

            let verify_started = Instant::now();
            self.decode_round(last, &draft.tokens, n_past)?;
            stats.verify_time += verify_started.elapsed();
            stats.rounds += 1;
            stats.count_verify_batch(draft.tokens.len() + 1);
            if !draft.tokens.is_empty() {
                stats.draft_rounds += 1;
                stats.drafted += draft.tokens.len() as u64;
            }

            let mut committed = Vec::with_capacity(draft.tokens.len() + 1);
            let mut n_accepted = 0;
            for position in 0..=draft.tokens.len() {
                let token = sampler.sample(&self.context, position as i32);
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
                let first_rejected = (n_past + n_accepted + 1) as u32;
                self.context
                    .kv_cache_seq_rm(SEQ, Some(first_rejected), None)
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
                cascade.accept(&draft, n_accepted, &committed);
                stats.draft_time += draft_started.elapsed();
            }
        }
        stats.generation_time = started.elapsed();
        if speculate {
            cascade.end();
            stats.sources = cascade.stats();
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

    /// Decodes the prompt in batches; returns the batch index of the last prompt token.
    fn decode_prompt(&mut self, prompt: &[Token]) -> Result<i32, EngineError> {
        let mut position = 0;
        for chunk in prompt.chunks(self.batch_size) {
            self.batch.clear();
            for (i, &token) in chunk.iter().enumerate() {
                let is_last = position + i + 1 == prompt.len();
                self.batch
                    .add(to_llama(token), (position + i) as i32, &[SEQ], is_last)
                    .map_err(|e| decode_error(chunk.len(), e))?;
            }
            self.context
                .decode(&mut self.batch)
                .map_err(|e| decode_error(chunk.len(), e))?;
            position += chunk.len();
        }
        Ok(self.batch.n_tokens() - 1)
    }

    /// Decodes `[last, draft..]` at `n_past..` with logits at every position.
    fn decode_round(
        &mut self,
        last: Token,
        draft: &[Token],
        n_past: usize,
    ) -> Result<(), EngineError> {
        self.batch.clear();
        for (i, &token) in std::iter::once(&last).chain(draft).enumerate() {
            self.batch
                .add(to_llama(token), (n_past + i) as i32, &[SEQ], true)
                .map_err(|e| decode_error(draft.len() + 1, e))?;
        }
        self.context
            .decode(&mut self.batch)
            .map_err(|e| decode_error(draft.len() + 1, e))
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
