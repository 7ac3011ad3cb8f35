//! [`Session`]: one llama.cpp context of the target, the [`Verifier`] of real requests.
//!
//! Each round decodes `[last, d1..dK]` at positions `n_past..=n_past+K` with logits at every
//! position, samples the target at position 0, and keeps going while the sample equals the next
//! draft token. The first differing sample (or the sample after the last draft token) is the
//! round's target token. KV entries past the accepted prefix are removed with `seq_rm`, so the
//! cache always holds exactly the committed context. Because a token is committed only when the
//! target itself produced it at that position, the output is token-identical to plain decoding
//! (greedy) or drawn from exactly the target's distribution (sampling). A session of one
//! sequence also verifies tree drafts (`tree.rs`). The protocol around it is `rounds.rs`.

mod cost;
mod cut;
mod layout;
mod observed;
mod pass_costs;
mod tree;

pub use self::cost::{DEFAULT_COST_REPETITIONS, VerifyCurve};
pub use self::cut::DraftCut;
pub use self::layout::BatchLayout;
pub use self::observed::ObservedRatio;

use std::time::{Duration, Instant};

use self::observed::ObservedCosts;
use self::pass_costs::PassCosts;
use super::context::{ModelContext, Outputs, Rows, SeqId};
use super::error::EngineError;
use super::grammar::GrammarSource;
use super::model::Target;
use super::rounds::{
    Outcome, OutputPiece, Prefill, Request, RoundControl, RoundDecision, RoundDraft, Verified,
    Verifier, VerifyBatch, generate,
};
use super::sample::{SamplingParams, TokenLogprob, TokenSampler, argmax};
use crate::cascade::{Cascade, ModelFacts, Token};

/// Default maximum draft length per round.
pub const DEFAULT_MAX_DRAFT_LEN: usize = 24;
/// The largest draft length any command or request may ask for. A verify batch this long
/// already costs many single-token steps on a CPU, and a server measures its verify cost curve
/// once, at start-up, up to its `--draft-max`: the bound keeps that measurement (and the
/// `draft_max + 1` of a batch) small.
pub const MAX_DRAFT_LEN_LIMIT: usize = 256;
/// Most paths of a tree draft a session of one sequence verifies, when it takes trees.
pub const DEFAULT_TREE_LEAVES: usize = 8;
/// Default context size, in tokens.
pub const DEFAULT_CTX_SIZE: u32 = 4096;
/// Default llama.cpp batch size (also the largest verify batch).
pub const DEFAULT_BATCH_SIZE: u32 = 512;

/// Settings of a llama.cpp context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    /// Context size of each sequence in tokens (prompt + output of one request).
    pub ctx_size: u32,
    /// Tokens per `llama_decode` call when processing the prompt, and the most tokens one
    /// decode holds (every sequence's verify rows together).
    pub batch_size: u32,
    /// Compute threads of the target.
    pub threads: usize,
    /// Requests the context decodes together, each in a sequence of its own with `ctx_size`
    /// tokens of KV cache (a server's `--parallel`; 1 for `run` and `bench`).
    pub sequences: usize,
    /// The largest draft a round verifies: the start-up check decodes a batch of this many
    /// tokens plus one, beside other sequences' rows when there are several.
    pub max_draft_len: usize,
    /// How verify batches of several sequences are laid out (see [`BatchLayout`]).
    pub layout: BatchLayout,
    /// Whether a step of several sequences' rounds cuts drafts not worth their rows (see
    /// [`DraftCut`]).
    pub draft_cut: DraftCut,
    /// Most paths of a tree draft a session of one sequence verifies; 1: chains only. A
    /// session of several sequences, or of a recurrent target, verifies chains only.
    pub tree_leaves: usize,
}

impl Default for SessionParams {
    fn default() -> Self {
        Self {
            ctx_size: DEFAULT_CTX_SIZE,
            batch_size: DEFAULT_BATCH_SIZE,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            sequences: 1,
            max_draft_len: DEFAULT_MAX_DRAFT_LEN,
            layout: BatchLayout::default(),
            draft_cut: DraftCut::default(),
            tree_leaves: 1,
        }
    }
}

/// A llama.cpp context of the target, reused across requests, and what verifying costs in it.
///
/// It holds one sequence per request decoded at once ([`SessionParams::sequences`]). `run` and
/// `bench` decode one request at a time in [`SeqId::FIRST`] through the session's
/// [`Verifier`]; a server's batcher (`engine::batcher`) drives every sequence through the same
/// steps: [`Self::begin`], [`Self::prefill_chunk`], [`Self::verify_batch`] (the rounds of every
/// sequence in one decode) and [`Self::end`].
pub struct Session<'a> {
    target: &'a Target,
    context: ModelContext<'a>,
    batch_size: usize,
    /// The verify cost curve measured in this context (empty until measured), which every
    /// request's policy gets for its prompt's length.
    verify_curve: VerifyCurve,
    /// What this session's verify decodes of one sequence really took, against the curve.
    observed: ObservedCosts,
    /// Per sequence: the sampler of the request it holds, from its prefill on.
    samplers: Vec<Option<TokenSampler>>,
    /// How batches of several sequences are laid out.
    layout: BatchLayout,
    /// Whether [`Self::cut_drafts`] cuts.
    draft_cut: DraftCut,
    /// What passes over several sequences cost, learned from the verify steps.
    pass_costs: PassCosts,
    /// Tokens of the first sequence's request committed by its last tree round but not kept
    /// in the cache, decoded again at the start of its next round (`tree.rs`).
    unsettled: Vec<Token>,
}

impl<'a> Session<'a> {
    pub(super) fn new(
        target: &'a Target,
        context: ModelContext<'a>,
        layout: BatchLayout,
        draft_cut: DraftCut,
    ) -> Self {
        // llama.cpp may adjust the requested sizes (it caps the batch at the context size).
        let batch_size = context.batch_capacity();
        let samplers = (0..context.sequences()).map(|_| None).collect();
        Self {
            target,
            context,
            batch_size,
            verify_curve: VerifyCurve::default(),
            observed: ObservedCosts::default(),
            samplers,
            layout,
            draft_cut,
            pass_costs: PassCosts::default(),
            unsettled: Vec::new(),
        }
    }

    /// Context size of each sequence, in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.context.n_ctx()
    }

    /// Sequences: requests the session decodes together.
    pub fn sequences(&self) -> usize {
        self.samplers.len()
    }

    /// The target this session decodes.
    pub fn target(&self) -> &'a Target {
        self.target
    }

    /// How many matrix products of this session's decodes the host's kernels computed (batches,
    /// and single rows where it takes them; see `TargetParams::host_batch_products`); 0 when
    /// llama.cpp computed them all.
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
        on_text: &mut dyn FnMut(OutputPiece<'_>),
    ) -> Result<Outcome, EngineError> {
        self.generate_controlled(request, cascade, on_text, &mut || RoundDecision::Continue)
    }

    /// Like [`Self::generate`], asking `control` before every round whether to go on and with
    /// which cascade (see [`generate`]). On return `cascade` is the one the last round used.
    pub fn generate_controlled(
        &mut self,
        request: &Request,
        cascade: &mut Cascade,
        on_text: &mut dyn FnMut(OutputPiece<'_>),
        control: &mut dyn RoundControl,
    ) -> Result<Outcome, EngineError> {
        self.check_request(request)?;
        generate(self, request, cascade, on_text, control)
    }

    /// Decodes the prompt into the first sequence in batches, asking `stop` before every batch
    /// after the first.
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

    /// The target's most likely next token after every prefix of `tokens`
    /// (`[i]`: after `tokens[..=i]`), decoded in the first sequence from position 0 in one
    /// batch (at most the batch size) with logits at every position. Leaves the cache empty.
    pub fn greedy_next_tokens(&mut self, tokens: &[Token]) -> Result<Vec<Token>, EngineError> {
        self.decode_at(tokens, 0, true)?;
        let next = (0..tokens.len())
            .map(|index| argmax(self.context.logits(index)))
            .collect();
        self.context.clear();
        self.unsettled.clear();
        Ok(next)
    }

    /// Checks that this session can run `request`: a non-empty prompt that fits in the context
    /// with `max_tokens` after it. [`Self::generate`] checks it too; call it first to refuse a
    /// request before doing work for it.
    pub fn check_request(&self, request: &Request) -> Result<(), EngineError> {
        check_request_fits(request, self.ctx_size())
    }

    /// Decodes `[last, draft..]` into the first sequence at `n_past..` with logits at every
    /// position.
    fn decode_round(
        &mut self,
        last: Token,
        draft: &[Token],
        n_past: usize,
    ) -> Result<(), EngineError> {
        let tokens: Vec<Token> = std::iter::once(last).chain(draft.iter().copied()).collect();
        self.decode_at(&tokens, n_past, true)
    }

    /// Decodes `tokens` into the first sequence at positions `position..` in one batch (at most
    /// the batch size), with logits at every position when `all_logits`, else at the last only.
    pub(super) fn decode_at(
        &mut self,
        tokens: &[Token],
        position: usize,
        all_logits: bool,
    ) -> Result<(), EngineError> {
        self.check_fits(position, tokens.len())?;
        let outputs = if all_logits {
            Outputs::All
        } else {
            Outputs::Last
        };
        self.context
            .decode(tokens, position, outputs)
            .map_err(|e| decode_error(tokens.len(), e))
    }

    /// Errors unless `n_tokens` decoded at `position` fit in one batch and in a sequence's
    /// context.
    fn check_fits(&self, position: usize, n_tokens: usize) -> Result<(), EngineError> {
        let needed = position + n_tokens;
        if needed > self.ctx_size() as usize || n_tokens > self.batch_size {
            return Err(EngineError::ContextOverflow {
                prompt: position,
                max_tokens: n_tokens,
                ctx_size: self.ctx_size(),
                needed,
            });
        }
        Ok(())
    }

    /// Starts a request in `seq`: makes its sampler and keeps the first `keep` positions of its
    /// part of the KV cache (a prompt prefix it shares with what the sequence held, which
    /// holds the same keys and values as reading it again: every row is computed as it would
    /// be alone), removing the rest. An error, and the sequence emptied, when the cache holds
    /// fewer than `keep` positions.
    pub fn begin(
        &mut self,
        seq: SeqId,
        sampling: &SamplingParams,
        keep: usize,
    ) -> Result<(), EngineError> {
        let sampler = TokenSampler::new(sampling, self.target.llama_model())?;
        *self.sampler_slot(seq)? = Some(sampler);
        if seq == SeqId::FIRST {
            self.unsettled.clear();
        }
        let held = self.context.sequence_len(seq);
        let kept = if keep > held { 0 } else { keep };
        self.context
            .remove_positions(seq, kept)
            .map_err(|e| decode_error(0, e))?;
        if kept < keep {
            return Err(EngineError::Decode {
                n_tokens: 0,
                reason: format!(
                    "sequence {seq} holds {held} positions, not the {keep} of the prompt prefix it was to keep; the cache was emptied, send the request again"
                ),
            });
        }
        Ok(())
    }

    /// Decodes `chunk`, prompt tokens of `seq`'s request at positions `position..`, in one
    /// decode of its own; when it is the prompt's `last` chunk, returns the target's first
    /// token after the prompt, sampled with the request's sampler, with its log-probability if
    /// the request asked for it.
    pub fn prefill_chunk(
        &mut self,
        seq: SeqId,
        chunk: &[Token],
        position: usize,
        last: bool,
    ) -> Result<Option<(Token, Vec<TokenLogprob>)>, EngineError> {
        if chunk.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_fits(position, chunk.len())?;
        let outputs = if last { Outputs::Last } else { Outputs::None };
        self.context
            .decode_rows(&[Rows {
                seq,
                tokens: chunk,
                position,
                outputs,
            }])
            .map_err(|e| decode_error(chunk.len(), e))?;
        if !last {
            return Ok(None);
        }
        let logits = self.context.logits(chunk.len() - 1);
        let sampler = self
            .samplers
            .get_mut(seq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(EngineError::NoRequest)?;
        let first = sampler.sample(logits)?;
        Ok(Some((first, sampler.take_logprobs())))
    }

    /// Verifies the rounds of several sequences (at most one each) together: their rows
    /// (`[last, draft..]` of each) are decoded in as few decodes as the batch size allows
    /// (one, normally), then each sequence's target tokens are sampled with its own sampler
    /// and its rejected rows rolled back. A round that does not fit its context fails alone;
    /// a failed decode fails the rounds it held.
    ///
    /// Exactness: every row is computed as it would be alone (batch-invariant kernels, a KV
    /// stream per sequence), which the start-up check of the context proves for batches of
    /// several sequences.
    pub fn verify_batch(
        &mut self,
        rounds: &[(SeqId, &RoundDraft)],
    ) -> Vec<Result<Verified, EngineError>> {
        let started = Instant::now();
        let constrained: Vec<Option<RoundDraft>> = rounds
            .iter()
            .map(|(seq, round)| self.cut_to_grammar(*seq, round))
            .collect();
        let rounds: Vec<(SeqId, &RoundDraft)> = rounds
            .iter()
            .zip(&constrained)
            .map(|(&(seq, round), cut)| (seq, cut.as_ref().unwrap_or(round)))
            .collect();
        let rounds = rounds.as_slice();
        let mut results: Vec<Option<Result<Sampled, EngineError>>> =
            rounds.iter().map(|_| None).collect();
        let rows: Vec<Vec<Token>> = rounds
            .iter()
            .map(|(_, round)| {
                std::iter::once(round.last)
                    .chain(round.tokens.iter().copied())
                    .collect()
            })
            .collect();
        let mut group = Vec::new();
        let mut group_tokens = 0;
        for (index, ((seq, round), tokens)) in rounds.iter().zip(&rows).enumerate() {
            if let Err(error) = self
                .check_fits(round.n_past, tokens.len())
                .and_then(|()| self.sampler_slot(*seq).map(|_| ()))
            {
                results[index] = Some(Err(error));
                continue;
            }
            if group_tokens + tokens.len() > self.batch_size {
                self.verify_group(&group, rounds, &rows, &mut results);
                group.clear();
                group_tokens = 0;
            }
            group.push(index);
            group_tokens += tokens.len();
        }
        self.verify_group(&group, rounds, &rows, &mut results);
        self.decode_replays(&mut results);
        let batch = VerifyBatch {
            sequences: rounds.len(),
            rows: rows.iter().map(Vec::len).sum(),
            committed: results
                .iter()
                .flatten()
                .filter_map(|result| result.as_ref().ok())
                .map(|(tokens, ..)| tokens.len())
                .sum(),
            time: started.elapsed(),
        };
        results
            .into_iter()
            .zip(rounds)
            .map(|(result, (_, round))| {
                result
                    .unwrap_or(Err(EngineError::NoRequest))
                    .map(|(tokens, logprobs, replayed)| Verified {
                        drafted: round.tokens.len(),
                        tokens,
                        logprobs,
                        batch,
                        replayed,
                    })
            })
            .collect()
    }

    /// Decodes now what a recurrent target replays for the rounds it cut short (see
    /// `engine/recurrent.rs`), so the verify time of their batch includes it; a failure fails
    /// those rounds.
    fn decode_replays(&mut self, results: &mut [Option<Result<Sampled, EngineError>>]) {
        let Err(reason) = self.context.decode_replays() else {
            return;
        };
        for result in results.iter_mut() {
            if let Some(Ok((_, _, replayed))) = result
                && *replayed > 0
            {
                *result = Some(Err(decode_error(*replayed, &reason)));
            }
        }
    }

    /// `round` with its draft cut before the first token the request's grammar forbids there;
    /// `None` when it forbids none (or the request has no grammar): such a token could never
    /// be accepted, so its row would be decoded for nothing.
    fn cut_to_grammar(&mut self, seq: SeqId, round: &RoundDraft) -> Option<RoundDraft> {
        let sampler = self.samplers.get_mut(seq.0 as usize)?.as_mut()?;
        let allowed = sampler.allowed_prefix(&round.tokens);
        (allowed < round.tokens.len()).then(|| RoundDraft {
            tokens: round.tokens[..allowed].to_vec(),
            survival: round.survival[..allowed.min(round.survival.len())].to_vec(),
            // A tree is never cut to a grammar (`verify_tree`): it goes whole or not at all.
            parents: Vec::new(),
            // Never drawn: a request with a grammar drafts deterministically.
            distributions: Vec::new(),
            ..round.clone()
        })
    }

    /// Cuts the drafts of a step's `rounds` (at most one per sequence) to the lengths that
    /// give the most expected committed tokens per unit of the batch's measured cost (see
    /// `cut.rs`): a draft whose rows cost more beside the other rounds than its expected
    /// accepted tokens are worth is verified shorter, or not at all. Nothing is cut for a
    /// round alone (its policy sized it for itself), under [`DraftCut::Off`], or before the
    /// verify costs are measured. Exactness is untouched: the target verifies a prefix of
    /// each draft.
    pub fn cut_drafts(&self, rounds: &mut [(SeqId, RoundDraft)]) {
        if self.draft_cut == DraftCut::Off || rounds.len() < 2 {
            return;
        }
        let context_len =
            rounds.iter().map(|(_, round)| round.n_past).sum::<usize>() / rounds.len();
        let curve = self.verify_curve.at(context_len);
        let offers: Vec<cut::Offer<'_>> = rounds
            .iter()
            .map(|(_, round)| cut::Offer {
                drafted: round.tokens.len(),
                // A drawn draft is verified whole (cutting it after seeing it would bias the
                // output): an unknown survival keeps it so.
                survival: if round.distributions.is_empty() {
                    &round.survival
                } else {
                    &[]
                },
            })
            .collect();
        let lengths = cut::draft_lengths(&offers, |lengths| {
            let mut rows = vec![0; self.samplers.len()];
            for ((seq, _), &length) in rounds.iter().zip(lengths) {
                if let Some(row) = rows.get_mut(seq.0 as usize) {
                    *row = length + 1;
                }
            }
            layout::plan(self.layout, &rows, self.batch_size, |pass| {
                self.pass_costs.cost(pass, &curve)
            })
            .cost
        });
        for ((_, round), length) in rounds.iter_mut().zip(lengths) {
            round.tokens.truncate(length);
            round.survival.truncate(length);
        }
    }

    /// Decodes the rounds at `group` (indices into `rounds` and `rows`) in one decode, laid out
    /// as [`layout`] chooses, and settles each into `results`.
    fn verify_group(
        &mut self,
        group: &[usize],
        rounds: &[(SeqId, &RoundDraft)],
        rows: &[Vec<Token>],
        results: &mut [Option<Result<Sampled, EngineError>>],
    ) {
        if group.is_empty() {
            return;
        }
        let entries = self.lay_out(group, rounds, rows);
        let batch: Vec<Rows<'_>> = entries
            .iter()
            .flat_map(|entry| {
                let (real, padding) = entry.tokens.split_at(entry.outputs);
                let real = Rows {
                    seq: entry.seq,
                    tokens: real,
                    position: entry.position,
                    outputs: Outputs::All,
                };
                let padding = Rows {
                    seq: entry.seq,
                    tokens: padding,
                    position: entry.position + entry.outputs,
                    outputs: Outputs::None,
                };
                [real, padding]
                    .into_iter()
                    .filter(|rows| !rows.tokens.is_empty())
            })
            .collect();
        let started = Instant::now();
        let decoded = self.context.decode_rows(&batch);
        drop(batch);
        if let Err(reason) = decoded {
            let n_tokens = entries.iter().map(|entry| entry.tokens.len()).sum();
            for &index in group {
                results[index] = Some(Err(decode_error(n_tokens, &reason)));
            }
            // Padding rows of sequences outside the group may have been decoded.
            self.drop_padding(&entries);
            return;
        }
        let mut first_row = 0;
        for entry in &entries {
            if let Some(index) = entry.round {
                let round = rounds[index].1;
                results[index] =
                    Some(self.settle_round(entry.seq, round, first_row, entry.tokens.len()));
            }
            first_row += entry.tokens.len();
        }
        self.drop_padding(&entries);
        self.record_pass(&entries, started.elapsed());
    }

    /// Records what a decode of `entries` took, when they made one pass over the weights: a
    /// pass of several sequences by its shape, one of a single sequence against the curve's
    /// price for it at its context.
    fn record_pass(&mut self, entries: &[BatchEntry], took: Duration) {
        let mut by_seq = vec![0; self.samplers.len()];
        for entry in entries {
            if let Some(rows) = by_seq.get_mut(entry.seq.0 as usize) {
                *rows = entry.tokens.len();
            }
        }
        let [pass] = layout::passes(&by_seq, self.batch_size)[..] else {
            return;
        };
        if let ([entry], 1) = (entries, pass.sequences) {
            let priced = self.verify_curve.price(entry.position, pass.rows);
            self.observed.record(pass.rows, took, priced);
        } else {
            self.pass_costs.record(pass, took);
        }
    }

    /// The entries of a verify batch of the rounds at `group`: each round's rows as they are,
    /// or, when [`layout::plan`] pads, every sequence from the first to the last at the
    /// longest round's rows (padding rows repeat the round's last token; sequences without a
    /// round get padding only, after what their cache holds).
    fn lay_out(
        &self,
        group: &[usize],
        rounds: &[(SeqId, &RoundDraft)],
        rows: &[Vec<Token>],
    ) -> Vec<BatchEntry> {
        let as_is = || {
            group
                .iter()
                .map(|&index| BatchEntry {
                    seq: rounds[index].0,
                    tokens: rows[index].clone(),
                    position: rounds[index].1.n_past,
                    outputs: rows[index].len(),
                    round: Some(index),
                })
                .collect()
        };
        let mut by_seq = vec![0; self.samplers.len()];
        let mut round_of = vec![None; self.samplers.len()];
        for &index in group {
            let seq = rounds[index].0.0 as usize;
            by_seq[seq] = rows[index].len();
            round_of[seq] = Some(index);
        }
        let context_len = group.iter().map(|&i| rounds[i].1.n_past).sum::<usize>() / group.len();
        let curve = self.verify_curve.at(context_len);
        if !layout::plan(self.layout, &by_seq, self.batch_size, |pass| {
            self.pass_costs.cost(pass, &curve)
        })
        .padded
        {
            return as_is();
        }
        let Some((span, longest)) = layout::padded(&by_seq) else {
            return as_is();
        };
        let mut entries = Vec::with_capacity(span.clone().count());
        for seq in span {
            let entry = match round_of[seq] {
                Some(index) => {
                    let mut tokens = rows[index].clone();
                    tokens.resize(longest, rounds[index].1.last);
                    BatchEntry {
                        seq: SeqId(seq as u32),
                        tokens,
                        position: rounds[index].1.n_past,
                        outputs: rows[index].len(),
                        round: Some(index),
                    }
                }
                None => BatchEntry {
                    seq: SeqId(seq as u32),
                    tokens: vec![rounds[group[0]].1.last; longest],
                    position: self.context.sequence_len(SeqId(seq as u32)),
                    outputs: 0,
                    round: None,
                },
            };
            if entry.position + longest > self.ctx_size() as usize {
                return as_is();
            }
            entries.push(entry);
        }
        entries
    }

    /// Rolls back the padding rows of sequences that had no round in the batch (those of
    /// rounds go with their rejected rows).
    fn drop_padding(&mut self, entries: &[BatchEntry]) {
        for entry in entries.iter().filter(|entry| entry.round.is_none()) {
            if let Err(reason) = self.context.remove_positions(entry.seq, entry.position) {
                tracing::warn!(seq = %entry.seq, %reason, "cannot roll back a padding row");
            }
        }
    }

    /// Samples `seq`'s target tokens from its rows' logits (from batch index `first_row` on),
    /// as far as they match the draft, then one more, and rolls back its rows past them (the
    /// rejected draft tokens and any padding: `decoded` rows were decoded in all).
    fn settle_round(
        &mut self,
        seq: SeqId,
        round: &RoundDraft,
        first_row: usize,
        decoded: usize,
    ) -> Result<Sampled, EngineError> {
        let draft = &round.tokens;
        let sampler = self
            .samplers
            .get_mut(seq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(EngineError::NoRequest)?;
        let mut target = Vec::with_capacity(draft.len() + 1);
        for position in 0..=draft.len() {
            let logits = self.context.logits(first_row + position);
            let token = match (draft.get(position), round.distributions.get(position)) {
                (Some(&drafted), Some(distribution)) => {
                    sampler.settle_drawn(logits, drafted, distribution)?
                }
                _ => sampler.sample(logits)?,
            };
            target.push(token);
            if draft.get(position) != Some(&token) {
                break;
            }
        }
        let n_accepted = target.len() - 1;
        let mut replayed = 0;
        if n_accepted + 1 < decoded {
            let first_rejected = round.n_past + n_accepted + 1;
            self.context
                .remove_positions(seq, first_rejected)
                .map_err(|e| decode_error(decoded, e))?;
            if self.context.is_recurrent() {
                replayed = n_accepted + 1;
            }
        }
        Ok((target, sampler.take_logprobs(), replayed))
    }

    /// Checks again what was checked when the session was made: the rows of a largest verify
    /// batch of one sequence, beside other sequences' rows of other lengths and contexts,
    /// decode bit for bit as each sequence's tokens one by one. Returns how many matrix
    /// products of the batch the host computed, or where the logits first differ. Empties the
    /// KV cache of every sequence: call it between requests.
    pub fn check_batch_invariance(&mut self) -> Result<u64, String> {
        for sampler in &mut self.samplers {
            *sampler = None;
        }
        self.unsettled.clear();
        self.context.check_batch_invariance()
    }

    /// Ends `seq`'s request: drops its sampler. Its part of the KV cache stays, for a next
    /// request that starts with the same tokens ([`Self::begin`] keeps or empties it).
    pub fn end(&mut self, seq: SeqId) {
        if let Some(slot) = self.samplers.get_mut(seq.0 as usize) {
            *slot = None;
        }
    }

    fn sampler_slot(&mut self, seq: SeqId) -> Result<&mut Option<TokenSampler>, EngineError> {
        let sequences = self.samplers.len();
        self.samplers
            .get_mut(seq.0 as usize)
            .ok_or_else(|| EngineError::Decode {
                n_tokens: 0,
                reason: format!("sequence {seq} is outside the session's {sequences} sequences"),
            })
    }
}

/// Checks that `request` has a prompt and fits a context of `ctx_size` tokens with its
/// `max_tokens`.
pub(crate) fn check_request_fits(request: &Request, ctx_size: u32) -> Result<(), EngineError> {
    let prompt = &request.prompt;
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
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

impl Verifier for Session<'_> {
    fn facts(&self) -> ModelFacts {
        self.target.facts(self.ctx_size())
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn is_eog(&self, token: Token) -> bool {
        self.target.is_eog(token)
    }

    fn token_bytes(&self, token: Token, out: &mut Vec<u8>) {
        self.target.token_bytes(token, out);
    }

    fn grammar_source(&self, request: &Request) -> Option<GrammarSource> {
        self.target
            .grammar_source(request.sampling.grammar.as_ref()?)
    }

    fn verify_costs(&self, context_len: usize) -> Vec<Duration> {
        self.verify_curve.at(context_len)
    }

    fn prefill(
        &mut self,
        request: &Request,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Prefill, EngineError> {
        self.begin(SeqId::FIRST, &request.sampling, 0)?;
        let prefill = match self.decode_prompt(&request.prompt, stop)? {
            PromptRead::Done { last_index } => {
                let logits = self.context.logits(last_index);
                let sampler = self.samplers[0].as_mut().ok_or(EngineError::NoRequest)?;
                Prefill::Done {
                    first: sampler.sample(logits)?,
                    cached: 0,
                    logprobs: sampler.take_logprobs(),
                }
            }
            PromptRead::Stopped { read } => Prefill::Stopped { read },
        };
        Ok(prefill)
    }

    fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
        if self.needs_tree_verify(round) {
            return self.verify_tree(round);
        }
        self.verify_batch(&[(SeqId::FIRST, round)])
            .pop()
            .unwrap_or(Err(EngineError::NoRequest))
    }

    fn max_tree_leaves(&self) -> usize {
        self.context.tree_leaves()
    }
}

/// A round's target tokens, their log-probabilities if its request asked, and the tokens a
/// recurrent target decodes again for it ([`Verified::replayed`]).
type Sampled = (Vec<Token>, Vec<TokenLogprob>, usize);

/// One sequence's rows in a verify batch: its round's (with padding after them, if padded), or
/// only padding.
struct BatchEntry {
    seq: SeqId,
    tokens: Vec<Token>,
    /// Position of the first row.
    position: usize,
    /// Leading rows that get logits (the round's own; the rest is padding).
    outputs: usize,
    /// Index of the round in the batch, if the sequence has one.
    round: Option<usize>,
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
