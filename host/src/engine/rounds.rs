//! The round protocol, written once: every request, decoded or replayed from a trace, goes
//! through a [`Generation`], and what a round's draft is checked against comes from a
//! [`Verifier`].
//!
//! One request, in order ([`generate`] drives it for one sequence):
//! 1. the verifier reads the prompt ([`Verifier::prefill`]; the caller's [`RoundControl`] may
//!    stop it between chunks) and gives the target's first token, which is committed;
//! 2. the cascade begins with the prompt and that token, its policy with the verify costs after
//!    the prompt ([`Verifier::verify_costs`], cut to the request's `max_draft_len + 1`);
//! 3. each round ([`Generation::next_round`]): the control may stop the request or replace the
//!    cascade (begun again with the whole context so far); the cascade proposes a draft of at
//!    most the round's limit ([`RoundLimits`]); the verifier returns the target's tokens for
//!    `[last, draft..]`, equal to the draft as far as it matches, then one of its own
//!    ([`Verifier::verify`]); [`Generation::settle`] commits them (text streamed, stop strings,
//!    end of generation, `max_tokens`) and tells the cascade how its draft fared;
//! 4. [`Generation::finish`] ends the cascade and returns the output with its stats.
//!
//! Every committed token is the verifier's, so the output is the target's whatever the cascade
//! drafts. A verifier of several sequences (a batch of requests) drives one [`Generation`] per
//! sequence and verifies their rounds together; a tree of drafts is a verifier that returns the
//! path the target agreed with. Neither needs another copy of this protocol.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::budget::RoundLimits;
use super::error::EngineError;
use super::grammar::GrammarSource;
use super::sample::{SamplingParams, TokenLogprob};
use super::stats::GenerationStats;
use super::text::{StopStrings, TextStream};
use super::verify::DEFAULT_MAX_DRAFT_LEN;
use crate::cascade::{
    Cascade, Draft, ModelFacts, RoundTiming, SourceStats, Token, TokenDistribution, TreeShape,
};

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
    /// Most draft tokens verified per round (the policy chooses up to this many); 0 decodes
    /// without speculation.
    pub max_draft_len: usize,
}

impl Request {
    /// A request with no stop strings and the default draft length.
    pub fn new(prompt: Vec<Token>, max_tokens: usize, sampling: SamplingParams) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling,
            stop: StopStrings::default(),
            max_draft_len: DEFAULT_MAX_DRAFT_LEN,
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

/// What the caller decides before a round.
pub enum RoundDecision {
    /// Run the round with the current cascade.
    Continue,
    /// End generation now, with [`StopReason::Cancelled`].
    Stop,
    /// Run this and later rounds with another cascade. The current cascade ends (its counters
    /// are kept in the outcome's per-source stats) and the new one begins with the whole context
    /// so far, so the new sources draft from exactly where the old ones stopped.
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

/// A piece of output that is final, as it is streamed: its text and, when the request asked
/// for them, the log-probabilities of the tokens it completes.
#[derive(Debug, Clone, Copy)]
pub struct OutputPiece<'a> {
    /// The text.
    pub text: &'a str,
    /// The generated tokens whose text this piece completes, with their log-probabilities
    /// (empty unless the request asked for them).
    pub logprobs: &'a [TokenLogprob],
}

/// The result of a request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Generated tokens, in order (an end-of-generation token is included).
    pub tokens: Vec<Token>,
    /// Generated text, as streamed.
    pub text: String,
    /// The log-probabilities of the tokens whose text was streamed, as streamed (empty unless
    /// the request asked for them; a stop string's tokens and an end-of-generation token are
    /// not among them).
    pub logprobs: Vec<TokenLogprob>,
    /// Why generation ended.
    pub stop_reason: StopReason,
    /// What it cost and how speculation did.
    pub stats: GenerationStats,
}

/// How reading a prompt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Prefill {
    /// Every token was read; the target's first token follows it.
    Done {
        /// The target's token after the prompt.
        first: Token,
        /// Prompt tokens not read again: the prefix the sequence's cache kept from its
        /// previous request.
        cached: usize,
        /// `first`'s log-probability, if the request asked for it.
        logprobs: Vec<TokenLogprob>,
    },
    /// Stopped before the end, after reading this many tokens.
    Stopped {
        /// Prompt tokens read.
        read: usize,
    },
}

/// What one round verifies: the last committed token and the draft after it, at `n_past`
/// (the committed context's length before `last`).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundDraft {
    /// The last committed token, not yet in the target's cache.
    pub last: Token,
    /// The draft to verify after it (empty: plain decoding).
    pub tokens: Vec<Token>,
    /// Empty for a chain; for a tree, the row each token continues (see [`TreeShape`]), for a
    /// verifier whose [`Verifier::max_tree_leaves`] allows it.
    pub parents: Vec<usize>,
    /// The cascade's estimate of the probability that the target accepts the draft through
    /// each of its tokens (as [`Draft::survival`]); empty when unknown. A batch of several
    /// requests' rounds weighs a draft's rows by it ([`Session::cut_drafts`]).
    ///
    /// [`Session::cut_drafts`]: super::verify::Session::cut_drafts
    pub survival: Vec<f64>,
    /// Position of `last`.
    pub n_past: usize,
    /// The most draft tokens the round could verify (the request's, cut to the tokens, batch
    /// and context left).
    pub max_draft_len: usize,
    /// When the draft was drawn at the request's temperature, the distribution of each token
    /// (as [`Draft::distributions`]): verified by rejection sampling, and never cut. Empty for
    /// a deterministic draft.
    pub distributions: Vec<TokenDistribution>,
}

/// What the target returned for one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// Draft tokens verified: the round's whole draft, or its first ones when the verify step
    /// cut it ([`Session::cut_drafts`](super::verify::Session::cut_drafts)).
    pub drafted: usize,
    /// The target's tokens for `[last, draft[..drafted]..]`: equal to the draft as far as it
    /// matches, then one of its own.
    pub tokens: Vec<Token>,
    /// The log-probabilities of `tokens`, if the request asked for them (empty otherwise).
    pub logprobs: Vec<TokenLogprob>,
    /// The verify batch the round was decoded in (with other requests' rounds, in a server).
    pub batch: VerifyBatch,
    /// Tokens the target decodes again for this round: a recurrent target's kept tokens after
    /// its draft was cut short (`engine/recurrent.rs`), or a tree's accepted tokens off its
    /// leading chain, decoded again in the next round's batch (`engine/verify/tree.rs`); 0
    /// otherwise.
    pub replayed: usize,
}

/// One verify batch as a whole: every round decoded in it, of one request or of several.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyBatch {
    /// Rounds in it: requests verified together.
    pub sequences: usize,
    /// Tokens it decoded: `1 + draft length` of each round in it.
    pub rows: usize,
    /// Tokens its rounds committed, together.
    pub committed: usize,
    /// What decoding and sampling it took.
    pub time: Duration,
}

impl VerifyBatch {
    /// The batch of one round verified alone, which committed `committed` tokens in `time`.
    pub fn alone(round: &RoundDraft, committed: usize, time: Duration) -> Self {
        Self {
            sequences: 1,
            rows: round.tokens.len() + 1,
            committed,
            time,
        }
    }
}

/// What a round's draft is checked against: the target (a llama.cpp context) or a recording of
/// it. The protocol ([`Generation`]) calls it; it never sees the cascade.
pub trait Verifier {
    /// What draft sources are told about the target.
    fn facts(&self) -> ModelFacts;

    /// Most tokens one verify batch holds.
    fn batch_size(&self) -> usize;

    /// Whether `token` ends generation.
    fn is_eog(&self, token: Token) -> bool;

    /// The bytes `token` stands for in generated text (nothing for special tokens), into `out`.
    fn token_bytes(&self, token: Token, out: &mut Vec<u8>);

    /// What verifying `n` tokens costs after a context of `context_len` tokens (`[n - 1]`), for
    /// policies; empty when unknown.
    fn verify_costs(&self, context_len: usize) -> Vec<Duration>;

    /// Reads `request`'s prompt, asking `stop` before each chunk after the first, and gives the
    /// target's first token (sampled as `request.sampling` says; later tokens use the same
    /// sampler).
    fn prefill(
        &mut self,
        request: &Request,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Prefill, EngineError>;

    /// A draft source for what `request`'s grammar makes certain or likely; `None` without a
    /// grammar, or when this verifier cannot make one (a recording). Default: `None`.
    fn grammar_source(&self, _request: &Request) -> Option<GrammarSource> {
        None
    }

    /// Verifies `round`: returns the target's tokens at its positions, in order, while they
    /// equal the draft, then the first one that does not (or the one after the verified
    /// draft), each sampled exactly once; afterwards the verifier holds the context plus the
    /// accepted draft tokens, nothing of the rejected ones. A verifier may verify only the
    /// draft's first tokens ([`Verified::drafted`]). A tree draft's tokens are followed from
    /// row 0: each target token continues the path while a child of the path's last row holds
    /// it ([`TreeShape::follow`]).
    fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError>;

    /// Most paths a tree draft of this verifier may hold; 1 (the default): chains only.
    fn max_tree_leaves(&self) -> usize {
        1
    }
}

/// Generates `request` on `verifier`, drafting with `cascade` and asking `control` between
/// rounds; `on_text` gets each piece of output as soon as it is final. On return `cascade` is
/// the one the last round used.
pub fn generate(
    verifier: &mut dyn Verifier,
    request: &Request,
    cascade: &mut Cascade,
    on_text: &mut dyn FnMut(OutputPiece<'_>),
    control: &mut dyn RoundControl,
) -> Result<Outcome, EngineError> {
    let started = Instant::now();
    let (first, cached, logprobs) =
        match verifier.prefill(request, &mut || control.stop_prefill())? {
            Prefill::Done {
                first,
                cached,
                logprobs,
            } => (first, cached, logprobs),
            Prefill::Stopped { read } => {
                tracing::debug!(
                    read,
                    prompt = request.prompt.len(),
                    "request stopped while reading its prompt"
                );
                return Ok(Outcome {
                    tokens: Vec::new(),
                    text: String::new(),
                    logprobs: Vec::new(),
                    stop_reason: StopReason::Cancelled,
                    stats: GenerationStats {
                        prompt_tokens: read,
                        prompt_time: started.elapsed(),
                        ..GenerationStats::default()
                    },
                });
            }
        };
    let prompt_time = started.elapsed();
    let mut generation =
        Generation::start(&*verifier, request, cascade, (first, logprobs), on_text);
    generation.stats.prompt_time = prompt_time;
    generation.stats.cached_prompt_tokens = cached;
    while let Some(round) = generation.next_round(control) {
        let _round = tracing::debug_span!(
            "round",
            n = generation.stats.rounds + 1,
            max_draft_len = round.max_draft_len
        )
        .entered();
        let verify_started = Instant::now();
        let verified = verifier.verify(&round)?;
        generation.settle(&*verifier, &round, &verified, verify_started.elapsed());
    }
    Ok(generation.finish())
}

/// One request's progress through the protocol, between rounds.
pub struct Generation<'g> {
    request: &'g Request,
    cascade: &'g mut Cascade,
    output: Output<'g>,
    stats: GenerationStats,
    facts: ModelFacts,
    batch_size: usize,
    verify_costs: Vec<Duration>,
    /// Most paths of a tree draft the verifier takes.
    max_tree_leaves: usize,
    /// Whether drafts can be verified for this request at all.
    can_speculate: bool,
    /// Whether the current cascade drafts.
    speculate: bool,
    /// The last committed token, not yet verified into the cache.
    last: Token,
    /// Committed context length before `last`.
    n_past: usize,
    stop: Option<StopReason>,
    started: Instant,
    /// The draft of the round in flight and the time it took to make.
    pending: Option<(Draft, Duration)>,
    /// The grammar source joined to every cascade whose settings ask for it, as it stands at
    /// the start of generation (requests with a grammar only).
    grammar_source: Option<GrammarSource>,
}

impl<'g> Generation<'g> {
    /// Starts `request` after its prompt was read and the target gave `first` (with its
    /// log-probability, if asked): commits it and begins the cascade.
    pub fn start(
        verifier: &dyn Verifier,
        request: &'g Request,
        cascade: &'g mut Cascade,
        (first, first_logprobs): (Token, Vec<TokenLogprob>),
        on_text: &'g mut dyn FnMut(OutputPiece<'_>),
    ) -> Self {
        let can_speculate = request.max_draft_len > 0;
        let mut verify_costs = verifier.verify_costs(request.prompt.len());
        verify_costs.truncate(request.max_draft_len + 1);
        let mut generation = Self {
            request,
            output: Output::new(request, on_text),
            stats: GenerationStats {
                prompt_tokens: request.prompt.len(),
                ..GenerationStats::default()
            },
            facts: verifier.facts(),
            batch_size: verifier.batch_size(),
            verify_costs,
            max_tree_leaves: verifier.max_tree_leaves(),
            can_speculate,
            speculate: false,
            last: first,
            n_past: request.prompt.len(),
            stop: None,
            started: Instant::now(),
            pending: None,
            grammar_source: request
                .sampling
                .grammar
                .as_ref()
                .filter(|_| can_speculate)
                .and_then(|_| verifier.grammar_source(request)),
            cascade,
        };
        generation.stop =
            generation
                .output
                .commit(verifier, first, first_logprobs.into_iter().next());
        generation.begin_cascade();
        generation
    }

    /// Begins the current cascade with the context so far, if drafts can be verified.
    fn begin_cascade(&mut self) {
        self.speculate = self.can_speculate && !self.cascade.is_empty();
        if !self.speculate {
            return;
        }
        let started = Instant::now();
        if self.cascade.settings().grammar_drafts
            && let Some(source) = &self.grammar_source
        {
            self.cascade.join(Box::new(source.restart()));
        }
        self.cascade
            .sample_drafts(self.request.sampling.draft_sampling());
        self.cascade.allow_tree_leaves(self.max_tree_leaves);
        self.cascade.begin(
            &self.facts,
            &self.request.prompt,
            self.request.max_draft_len,
            self.request.max_tokens,
            &self.verify_costs,
        );
        // The prompt is fed alone, then what was generated before the cascade began (the token
        // decoded with the prompt, or all output before a swap), so that a source tells the
        // prompt from the response.
        self.cascade.feed(&self.output.tokens);
        self.stats.draft_time += started.elapsed();
    }

    /// Ends the current cascade, keeping its counters.
    fn end_cascade(&mut self) {
        if self.speculate {
            merge_source_stats(&mut self.stats.sources, self.cascade.stats());
            self.cascade.end();
        }
    }

    /// The next round to verify, after asking `control`; `None` once generation has ended.
    pub fn next_round(&mut self, control: &mut dyn RoundControl) -> Option<RoundDraft> {
        if self.stop.is_some() {
            return None;
        }
        match control.before_round() {
            RoundDecision::Continue => {}
            RoundDecision::Stop => {
                self.stop = Some(StopReason::Cancelled);
                return None;
            }
            RoundDecision::Replace(replacement) => {
                let started = Instant::now();
                self.end_cascade();
                *self.cascade = replacement;
                self.stats.draft_time += started.elapsed();
                self.begin_cascade();
            }
        }
        let max_draft_len = if self.speculate {
            RoundLimits {
                remaining_tokens: self.request.max_tokens - self.output.tokens.len(),
                batch_size: self.batch_size,
                free_context: (self.facts.context_size as usize).saturating_sub(self.n_past),
            }
            .max_draft_len(self.request.max_draft_len)
        } else {
            0
        };
        let started = Instant::now();
        let draft = if self.speculate {
            self.cascade.propose(max_draft_len)
        } else {
            Draft::default()
        };
        let draft_time = started.elapsed();
        self.stats.draft_time += draft_time;
        let round = RoundDraft {
            last: self.last,
            tokens: draft.tokens.clone(),
            parents: draft.parents.clone(),
            survival: draft.survival.clone(),
            n_past: self.n_past,
            max_draft_len,
            distributions: draft.distributions.clone(),
        };
        self.pending = Some((draft, draft_time));
        Some(round)
    }

    /// Commits the target's tokens of `round` (what the verifier returned for it, after
    /// waiting `verify_time`) and tells the cascade how its draft fared and what its batch cost.
    pub fn settle(
        &mut self,
        verifier: &dyn Verifier,
        round: &RoundDraft,
        verified: &Verified,
        verify_time: Duration,
    ) {
        let target = &verified.tokens;
        let (proposed, draft_time) = self.pending.take().unwrap_or_default();
        let drafted = verified.drafted.min(round.tokens.len());
        let draft = if drafted < proposed.tokens.len() {
            self.stats.cut_draft_tokens += (proposed.tokens.len() - drafted) as u64;
            proposed.cut(drafted)
        } else {
            proposed
        };
        self.stats.replayed_tokens += verified.replayed as u64;
        self.stats.verify_time += verify_time;
        self.stats.rounds += 1;
        self.stats.count_verify_batch(drafted + 1);
        self.stats.batch_requests += verified.batch.sequences as u64;
        self.stats.batch_tokens += verified.batch.rows as u64;
        if drafted > 0 {
            self.stats.draft_rounds += 1;
            self.stats.drafted += drafted as u64;
            if !round.distributions.is_empty() {
                self.stats.drawn_rounds += 1;
            }
            if !round.parents.is_empty() {
                self.stats.tree_rounds += 1;
            }
        }
        let mut committed = Vec::with_capacity(target.len());
        let mut n_accepted = 0;
        let mut logprobs = verified.logprobs.iter().cloned();
        let parents = &round.parents[..drafted.min(round.parents.len())];
        let followed = TreeShape::new(&round.tokens[..drafted], parents)
            .follow(target)
            .len();
        for (position, &token) in target.iter().enumerate() {
            let matches = position < followed;
            n_accepted += usize::from(matches);
            committed.push(token);
            self.stop = self.output.commit(verifier, token, logprobs.next());
            if self.stop.is_some() || !matches {
                break;
            }
        }
        self.stats.accepted += n_accepted as u64;
        self.n_past += n_accepted + 1;
        if let Some(&last) = committed.last() {
            self.last = last;
        }
        tracing::debug!(drafted, accepted = n_accepted, "round");
        if self.speculate {
            let started = Instant::now();
            let committed_text = if self.cascade.wants_text() {
                text_of(verifier, &committed)
            } else {
                String::new()
            };
            let timing = RoundTiming {
                draft_time,
                verify_time: verified.batch.time,
                batch_rows: verified.batch.rows,
                batch_committed: verified.batch.committed,
            };
            self.cascade
                .accept(&draft, n_accepted, &committed, timing, &committed_text);
            self.stats.draft_time += started.elapsed();
        }
    }

    /// Ends the request: the output, why it ended, and its stats.
    pub fn finish(mut self) -> Outcome {
        self.stats.generation_time = self.started.elapsed();
        self.end_cascade();
        let stop_reason = self.stop.unwrap_or(StopReason::Cancelled);
        let (tokens, text, logprobs) = self.output.finish(stop_reason);
        self.stats.generated_tokens = tokens.len();
        Outcome {
            tokens,
            text,
            logprobs,
            stop_reason,
            stats: self.stats,
        }
    }
}

/// The text of `tokens`, lossily decoded (a character split across tokens at either end becomes
/// U+FFFD): for content-aware policies, not for output.
fn text_of(verifier: &dyn Verifier, tokens: &[Token]) -> String {
    let mut bytes = Vec::new();
    let mut piece = Vec::new();
    for &token in tokens {
        if !verifier.is_eog(token) {
            verifier.token_bytes(token, &mut piece);
            bytes.extend_from_slice(&piece);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
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

/// Committed tokens, their text, and the checks that end generation.
struct Output<'r> {
    max_tokens: usize,
    tokens: Vec<Token>,
    text: String,
    stream: TextStream,
    piece: Vec<u8>,
    /// Log-probabilities of tokens whose text is not streamed yet.
    held_logprobs: Vec<TokenLogprob>,
    /// Log-probabilities streamed.
    logprobs: Vec<TokenLogprob>,
    on_text: &'r mut dyn FnMut(OutputPiece<'_>),
}

impl<'r> Output<'r> {
    fn new(request: &Request, on_text: &'r mut dyn FnMut(OutputPiece<'_>)) -> Self {
        Self {
            max_tokens: request.max_tokens,
            tokens: Vec::new(),
            text: String::new(),
            stream: TextStream::new(request.stop.clone()),
            piece: Vec::new(),
            held_logprobs: Vec::new(),
            logprobs: Vec::new(),
            on_text,
        }
    }

    /// Appends `token` (with its log-probability, if asked) to the output and streams its
    /// text; says whether generation must end. A token's log-probability is streamed with the
    /// first text released after it.
    fn commit(
        &mut self,
        verifier: &dyn Verifier,
        token: Token,
        logprob: Option<TokenLogprob>,
    ) -> Option<StopReason> {
        self.tokens.push(token);
        if verifier.is_eog(token) {
            return Some(StopReason::EndOfGeneration);
        }
        self.held_logprobs.extend(logprob);
        verifier.token_bytes(token, &mut self.piece);
        let released = self.stream.push(&self.piece);
        if !released.text.is_empty() {
            self.emit(&released.text);
        }
        if released.stopped {
            return Some(StopReason::StopString);
        }
        (self.tokens.len() >= self.max_tokens).then_some(StopReason::MaxTokens)
    }

    /// Streams `text` with the log-probabilities held so far.
    fn emit(&mut self, text: &str) {
        (self.on_text)(OutputPiece {
            text,
            logprobs: &self.held_logprobs,
        });
        self.text.push_str(text);
        self.logprobs.append(&mut self.held_logprobs);
    }

    /// Streams what is held back (unless a stop string ended generation: then what is held
    /// back is the stop string, never output) and returns the tokens, the text and the
    /// log-probabilities streamed.
    fn finish(mut self, stop_reason: StopReason) -> (Vec<Token>, String, Vec<TokenLogprob>) {
        if stop_reason != StopReason::StopString {
            let rest = self.stream.finish();
            if !rest.is_empty() || !self.held_logprobs.is_empty() {
                self.emit(&rest);
            }
        }
        (self.tokens, self.text, self.logprobs)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::cascade::{CascadeSettings, DraftSource, Proposal, SourceFault};

    /// A target that continues any context with `100 + position`, and verifies without a model.
    struct Counting;

    impl Verifier for Counting {
        fn facts(&self) -> ModelFacts {
            ModelFacts {
                vocab_size: 1000,
                bos: None,
                eos: None,
                eog: Vec::new(),
                context_size: 4096,
            }
        }
        fn batch_size(&self) -> usize {
            64
        }
        fn is_eog(&self, _token: Token) -> bool {
            false
        }
        fn token_bytes(&self, _token: Token, out: &mut Vec<u8>) {
            out.push(b'x');
        }
        fn verify_costs(&self, _context_len: usize) -> Vec<Duration> {
            Vec::new()
        }
        fn prefill(
            &mut self,
            request: &Request,
            _stop: &mut dyn FnMut() -> bool,
        ) -> Result<Prefill, EngineError> {
            Ok(Prefill::Done {
                first: 100 + request.prompt.len() as Token,
                cached: 0,
                logprobs: Vec::new(),
            })
        }
        fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
            let target = |offset: usize| 101 + (round.n_past + offset) as Token;
            let n_accepted = (0..round.tokens.len())
                .take_while(|&offset| round.tokens[offset] == target(offset))
                .count();
            let tokens: Vec<Token> = (0..=n_accepted).map(target).collect();
            let batch = VerifyBatch::alone(round, tokens.len(), Duration::ZERO);
            Ok(Verified {
                drafted: round.tokens.len(),
                tokens,
                logprobs: Vec::new(),
                batch,
                replayed: 0,
            })
        }
    }

    /// [`Counting`]'s target, verifying only the first `cut` tokens of each draft (as a
    /// server's step cuts drafts), and checking each round starts where its cache ends.
    struct Cutting {
        cut: usize,
        cache: usize,
    }

    impl Verifier for Cutting {
        fn facts(&self) -> ModelFacts {
            Counting.facts()
        }
        fn batch_size(&self) -> usize {
            Counting.batch_size()
        }
        fn is_eog(&self, _token: Token) -> bool {
            false
        }
        fn token_bytes(&self, token: Token, out: &mut Vec<u8>) {
            Counting.token_bytes(token, out);
        }
        fn verify_costs(&self, _context_len: usize) -> Vec<Duration> {
            Vec::new()
        }
        fn prefill(
            &mut self,
            request: &Request,
            stop: &mut dyn FnMut() -> bool,
        ) -> Result<Prefill, EngineError> {
            self.cache = request.prompt.len();
            Counting.prefill(request, stop)
        }
        fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
            assert_eq!(
                round.n_past, self.cache,
                "the round starts where the cache ends"
            );
            let cut = RoundDraft {
                tokens: round.tokens[..self.cut.min(round.tokens.len())].to_vec(),
                ..round.clone()
            };
            let verified = Counting.verify(&cut)?;
            self.cache += verified.tokens.len();
            Ok(verified)
        }
    }

    /// Proposes [`Counting`]'s continuation of the context it was fed: every draft is right.
    struct Oracle {
        context_len: usize,
    }

    impl DraftSource for Oracle {
        fn name(&self) -> &str {
            "oracle"
        }
        fn begin(&mut self, _facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
            self.context_len = prompt.len();
            Ok(())
        }
        fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
            let next = 100 + self.context_len as Token;
            Ok(Proposal::from_tokens(
                (next..next + max_draft_len as Token).collect(),
            ))
        }
        fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
            self.context_len += tokens.len();
            Ok(())
        }
    }

    #[test]
    fn a_draft_verified_only_in_part_commits_what_was_verified() {
        let source = Box::new(Oracle { context_len: 0 });
        let mut cascade = Cascade::new(vec![source], CascadeSettings::default());
        let mut request = Request::new(vec![1, 2, 3], 12, SamplingParams::greedy());
        request.max_draft_len = 5;
        let mut verifier = Cutting { cut: 2, cache: 0 };
        let outcome = generate(
            &mut verifier,
            &request,
            &mut cascade,
            &mut |_| {},
            &mut || RoundDecision::Continue,
        )
        .expect("generate");
        assert_eq!(outcome.tokens, (103..115).collect::<Vec<Token>>());
        let stats = &outcome.stats;
        assert_eq!(
            stats.drafted, stats.accepted,
            "every verified token was right"
        );
        assert_eq!(
            stats.verify_batches.len(),
            3,
            "no more than 2 drafted: {stats:?}"
        );
        assert!(stats.cut_draft_tokens > 0, "{stats:?}");
        let source = &stats.sources[0];
        assert_eq!(
            (source.drafted, source.accepted),
            (stats.drafted, stats.accepted)
        );
    }

    /// Proposes nothing and logs every feed.
    struct FeedLog(Arc<Mutex<Vec<Vec<Token>>>>);

    impl DraftSource for FeedLog {
        fn name(&self) -> &str {
            "feed-log"
        }
        fn begin(&mut self, _facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
            self.0.lock().expect("feed log").push(prompt.to_vec());
            Ok(())
        }
        fn propose(&mut self, _max_draft_len: usize) -> Result<Proposal, SourceFault> {
            Ok(Proposal::empty())
        }
        fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
            self.0.lock().expect("feed log").push(tokens.to_vec());
            Ok(())
        }
    }

    #[test]
    fn sources_get_the_prompt_alone_then_the_first_token() {
        let feeds = Arc::new(Mutex::new(Vec::new()));
        let source = Box::new(FeedLog(Arc::clone(&feeds)));
        let mut cascade = Cascade::new(vec![source], CascadeSettings::default());
        let request = Request::new(vec![1, 2, 3], 3, SamplingParams::greedy());
        let outcome = generate(
            &mut Counting,
            &request,
            &mut cascade,
            &mut |_| {},
            &mut || RoundDecision::Continue,
        )
        .expect("generate");
        assert_eq!(outcome.tokens, [103, 104, 105]);
        // The token decoded with the prompt belongs to the response: a source that keeps
        // responses (suffix's cross-request cache) must not take it for part of the prompt.
        assert_eq!(
            *feeds.lock().expect("feed log"),
            [vec![1, 2, 3], vec![103], vec![104], vec![105]]
        );
    }
}
