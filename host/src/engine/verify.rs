//! [`Session`]: one llama.cpp context of the target, the [`Verifier`] of real requests.
//!
//! Each round decodes `[last, d1..dK]` at positions `n_past..=n_past+K` with logits at every
//! position, samples the target at position 0, and keeps going while the sample equals the next
//! draft token. The first differing sample (or the sample after the last draft token) is the
//! round's target token. KV entries past the accepted prefix are removed with `seq_rm`, so the
//! cache always holds exactly the committed context. Because a token is committed only when the
//! target itself produced it at that position, the output is token-identical to plain decoding
//! (greedy) or drawn from exactly the target's distribution (sampling). The protocol around it
//! is `rounds.rs`.

mod cost;

pub use self::cost::{DEFAULT_COST_REPETITIONS, VerifyCurve};

use std::time::Duration;

use super::context::{ModelContext, Outputs};
use super::error::EngineError;
use super::model::Target;
use super::rounds::{
    Outcome, Prefill, Request, RoundControl, RoundDecision, RoundDraft, Verifier, generate,
};
use super::sample::TokenSampler;
use crate::cascade::{Cascade, ModelFacts, Token};

/// Default maximum draft length per round.
pub const DEFAULT_MAX_DRAFT_LEN: usize = 24;
/// The largest draft length any command or request may ask for. A verify batch this long
/// already costs many single-token steps on a CPU, and a server measures its verify cost curve
/// once, at start-up, up to its `--draft-max`: the bound keeps that measurement (and the
/// `draft_max + 1` of a batch) small.
pub const MAX_DRAFT_LEN_LIMIT: usize = 256;
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

/// A llama.cpp context of the target, reused across requests, and what verifying costs in it.
pub struct Session<'a> {
    target: &'a Target,
    context: ModelContext<'a>,
    batch_size: usize,
    /// The verify cost curve measured in this context (empty until measured), which every
    /// request's policy gets for its prompt's length.
    verify_curve: VerifyCurve,
    /// The request's sampler, from its prefill on.
    sampler: Option<TokenSampler>,
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
            sampler: None,
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
    /// which cascade (see [`generate`]). On return `cascade` is the one the last round used.
    pub fn generate_controlled(
        &mut self,
        request: &Request,
        cascade: &mut Cascade,
        on_text: &mut dyn FnMut(&str),
        control: &mut dyn RoundControl,
    ) -> Result<Outcome, EngineError> {
        self.check_request(request)?;
        generate(self, request, cascade, on_text, control)
    }

    /// Decodes the prompt in batches, asking `stop` before every batch after the first.
    fn decode_prompt(
        &mut self,
        prompt: &[Token],
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<PromptRead, EngineError> {
        let chunks = prompt.chunks(self.batch_size);
        let n_chunks = chunks.len();
        let mut position = 0;
        let mut last_index = 0;
        for (i, chunk) in chunks.enumerate() {
            if i > 0 && stop() {
                return Ok(PromptRead::Stopped { read: position });
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
        Ok(PromptRead::Done { last_index })
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

impl Verifier for Session<'_> {
    fn facts(&self) -> ModelFacts {
        self.target.facts(self.ctx_size())
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn can_verify_drafts(&self) -> bool {
        self.target.can_roll_back()
    }

    fn is_eog(&self, token: Token) -> bool {
        self.target.is_eog(token)
    }

    fn token_bytes(&self, token: Token, out: &mut Vec<u8>) {
        self.target.token_bytes(token, out);
    }

    fn verify_costs(&self, context_len: usize) -> Vec<Duration> {
        self.verify_curve.at(context_len)
    }

    fn prefill(
        &mut self,
        request: &Request,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Prefill, EngineError> {
        self.context.clear();
        let mut sampler = TokenSampler::new(&request.sampling);
        let prefill = match self.decode_prompt(&request.prompt, stop)? {
            PromptRead::Done { last_index } => Prefill::Done {
                first: sampler.sample(self.context.logits(last_index)),
            },
            PromptRead::Stopped { read } => Prefill::Stopped { read },
        };
        self.sampler = Some(sampler);
        Ok(prefill)
    }

    fn verify(&mut self, round: &RoundDraft) -> Result<Vec<Token>, EngineError> {
        let draft = &round.tokens;
        self.decode_round(round.last, draft, round.n_past)?;
        let sampler = self.sampler.as_mut().ok_or(EngineError::NoRequest)?;
        let mut target = Vec::with_capacity(draft.len() + 1);
        for position in 0..=draft.len() {
            let token = sampler.sample(self.context.logits(position));
            target.push(token);
            if draft.get(position) != Some(&token) {
                break;
            }
        }
        let n_accepted = target.len() - 1;
        if n_accepted < draft.len() {
            let first_rejected = round.n_past + n_accepted + 1;
            self.context
                .remove_from(first_rejected)
                .map_err(|e| decode_error(draft.len() + 1, e))?;
        }
        Ok(target)
    }
}

/// How reading a prompt ended, inside the session.
enum PromptRead {
    /// Every token was decoded; the last one's logits are at this batch index.
    Done { last_index: usize },
    /// Stopped before the end, after decoding this many tokens.
    Stopped { read: usize },
}

fn decode_error(n_tokens: usize, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Decode {
        n_tokens,
        reason: reason.to_string(),
    }
}
