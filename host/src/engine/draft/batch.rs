//! [`DraftBatch`]: a draft-model context of one or several sequences, drafting for every
//! sequence asked at once.
//!
//! One call of [`DraftBatch::propose`], in order:
//! 1. each ask's sequence drops what its cache holds past the common prefix with the ask's
//!    context (the last context token is decoded again, for its logits);
//! 2. what each cache lacks is decoded (prompt catch-up), several sequences per decode as far
//!    as the batch holds them; the draft model's first token of each ask is taken from its
//!    logits as soon as its catch-up is complete;
//! 3. while any ask wants more, one decode holds the last drafted token of every such ask, and
//!    gives each its next token (the greedy one, or a draw at the ask's temperature); an ask is
//!    done, and answered, at its length, after its first greedy token below its `p_min` (which
//!    is included), or before a position to draw whose most likely token is below it.

use std::time::{Duration, Instant};

use rand::rngs::Xoshiro256PlusPlus;

use super::host::OwnedContext;
use crate::cascade::{
    DraftSampling, Drafted, DraftedToken, ProposalSettings, Token, TokenDistribution,
};
use crate::engine::context::{Outputs, Rows, SeqId};
use crate::engine::sample::{argmax_with_probability, second_choice};

/// What one sequence asks of a [`DraftBatch`].
#[derive(Debug, Clone, Copy)]
pub struct DraftAsk<'a> {
    /// The sequence of the batch that drafts.
    pub seq: SeqId,
    /// The committed context to draft after (not empty).
    pub context: &'a [Token],
    /// How many tokens, where to stop, greedy or drawn.
    pub settings: ProposalSettings,
}

impl DraftAsk<'_> {
    /// The same ask, holding a copy of its context (to send to the thread that drafts).
    pub fn to_owned_ask(&self) -> OwnedDraftAsk {
        OwnedDraftAsk {
            seq: self.seq,
            context: self.context.to_vec(),
            settings: self.settings,
        }
    }
}

/// A [`DraftAsk`] that owns its context: what a plugin instance sends to a server's batcher,
/// or a pinned draft thread receives.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedDraftAsk {
    /// The sequence of the batch that drafts.
    pub seq: SeqId,
    /// The committed context to draft after (not empty).
    pub context: Vec<Token>,
    /// How many tokens, where to stop, greedy or drawn.
    pub settings: ProposalSettings,
}

impl OwnedDraftAsk {
    /// The ask, borrowing its context.
    pub fn as_ask(&self) -> DraftAsk<'_> {
        DraftAsk {
            seq: self.seq,
            context: &self.context,
            settings: self.settings,
        }
    }
}

/// Drafts for several sequences of one draft context at once: a [`DraftBatch`] on the calling
/// thread, or one that computes elsewhere (`placement::PinnedDraftBatch`, on `--draft-cpus`).
pub trait BatchDrafter {
    /// Sequences of the context.
    fn sequences(&self) -> usize;

    /// Context size of each sequence, in tokens.
    fn ctx_size(&self) -> u32;

    /// Drafts for every ask at once, calling `answer(i, drafted)` for ask `i` as soon as its
    /// draft is complete; see [`DraftBatch::propose`].
    fn propose(&mut self, asks: &[DraftAsk<'_>], answer: &mut dyn FnMut(usize, Drafted));

    /// Forgets what `seq` holds (its user is gone).
    fn clear(&mut self, seq: SeqId);
}

/// A draft-model context holding a sequence per user, and what each sequence's cache holds.
pub struct DraftBatch {
    context: OwnedContext,
    batch_size: usize,
    /// Per sequence: the tokens its KV cache holds, at positions `0..len`.
    cached: Vec<Vec<Token>>,
}

/// One ask's progress through a [`DraftBatch::propose`] call.
struct Drafting {
    seq: SeqId,
    max_draft_len: usize,
    p_min: f32,
    /// Context tokens still to decode, from `next_position` on.
    catch_up: Vec<Token>,
    /// Time of the decodes that held some of `catch_up`.
    catch_up_time: Duration,
    drafted: Vec<DraftedToken>,
    /// Greedy: where a chosen token is less likely than this, the second choice is kept.
    split_below: f32,
    /// Greedy with `split_below` above 0: each position's second choice, if kept.
    runners_up: Vec<Option<DraftedToken>>,
    /// How the ask draws its tokens, with the generator of its draws; `None`: greedily.
    sampling: Option<(DraftSampling, Xoshiro256PlusPlus)>,
    /// The distribution of each drawn token.
    distributions: Vec<TokenDistribution>,
    done: bool,
}

impl Drafting {
    /// The answer so far, leaving the state empty.
    fn take_answer(&mut self) -> Drafted {
        Drafted {
            tokens: std::mem::take(&mut self.drafted),
            runners_up: std::mem::take(&mut self.runners_up),
            distributions: std::mem::take(&mut self.distributions),
            catch_up_time: self.catch_up_time,
        }
    }
}

impl DraftBatch {
    pub(super) fn new(context: OwnedContext) -> Self {
        let dependent = context.borrow_dependent();
        let (batch_size, sequences) = (dependent.batch_capacity(), dependent.sequences());
        Self {
            context,
            batch_size,
            cached: vec![Vec::new(); sequences as usize],
        }
    }

    /// Context size of each sequence, in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.context.borrow_dependent().n_ctx()
    }

    /// Sequences of the context.
    pub fn sequences(&self) -> usize {
        self.cached.len()
    }

    /// How many matrix products of this context's batches the host's batched kernel computed,
    /// as `Session::host_batch_products` for the target.
    pub fn host_batch_products(&self) -> u64 {
        self.context.borrow_dependent().host_products()
    }

    /// Forgets what `seq` holds (its user is gone).
    pub fn clear(&mut self, seq: SeqId) {
        if let Some(cached) = self.cached.get_mut(seq.0 as usize) {
            cached.clear();
            let cleared = self
                .context
                .with_dependent_mut(|_, context| context.clear_sequence(seq));
            if let Err(reason) = cleared {
                tracing::warn!(%seq, %reason, "cannot empty a draft sequence's cache");
            }
        }
    }

    /// Drafts for every ask at once (at most one per sequence), calling `answer(i, drafted)`
    /// for ask `i` as soon as its draft is complete; every ask is answered. A llama.cpp failure
    /// answers the asks it touched with nothing and empties their caches, so their next
    /// proposals start over.
    pub fn propose(&mut self, asks: &[DraftAsk<'_>], mut answer: impl FnMut(usize, Drafted)) {
        let mut drafting: Vec<Drafting> = asks.iter().map(|ask| self.start(ask)).collect();
        for (index, state) in drafting.iter_mut().enumerate() {
            if state.done {
                answer(index, Drafted::default());
            }
        }
        self.catch_up(&mut drafting, &mut answer);
        self.draft(&mut drafting, &mut answer);
    }

    /// An ask's starting point: its sequence's cache cut to the common prefix with its
    /// context, and what it lacks.
    fn start(&mut self, ask: &DraftAsk<'_>) -> Drafting {
        let n_ctx = self.ctx_size() as usize;
        // Drafted token i is decoded at `context.len() + i - 1`, inside the context.
        let settings = ask.settings;
        let max_draft_len = settings
            .max_draft_len
            .min(n_ctx.saturating_sub(ask.context.len()));
        let mut state = Drafting {
            seq: ask.seq,
            max_draft_len,
            p_min: settings.p_min,
            catch_up: Vec::new(),
            catch_up_time: Duration::ZERO,
            drafted: Vec::new(),
            split_below: settings.split_below,
            runners_up: Vec::new(),
            sampling: settings
                .sampling
                .map(|sampling| (sampling, sampling.generator(ask.context.len()))),
            distributions: Vec::new(),
            done: true,
        };
        let Some(cached) = self.cached.get(ask.seq.0 as usize) else {
            tracing::warn!(seq = %ask.seq, sequences = self.cached.len(), "draft ask for a sequence the draft context lacks");
            return state;
        };
        if max_draft_len == 0 || ask.context.is_empty() {
            return state;
        }
        // The last context token is decoded again even when cached, for its logits.
        let mut keep = common_prefix(cached, ask.context).min(ask.context.len() - 1);
        if keep < cached.len() {
            let removed = self
                .context
                .with_dependent_mut(|_, context| context.remove_positions(ask.seq, keep));
            if let Err(reason) = removed {
                // A recurrent draft model goes back only to where its last drafting started
                // (a new request sharing part of the last one's context cannot keep it).
                tracing::debug!(seq = %ask.seq, %reason, "the draft cache starts over");
                self.clear(ask.seq);
                keep = 0;
            }
            self.cached[ask.seq.0 as usize].truncate(keep);
        }
        state.catch_up = ask.context[keep..].to_vec();
        state.done = false;
        state
    }

    /// Decodes what each ask's cache lacks, as many sequences per decode as the batch holds,
    /// and takes each ask's first drafted token once its catch-up is complete.
    fn catch_up(&mut self, drafting: &mut [Drafting], answer: &mut impl FnMut(usize, Drafted)) {
        loop {
            let mut room = self.batch_size;
            let mut taken = Vec::new();
            for (index, state) in drafting.iter().enumerate() {
                if state.done || state.catch_up.is_empty() || room == 0 {
                    continue;
                }
                let n = state.catch_up.len().min(room);
                room -= n;
                taken.push((index, n));
            }
            if taken.is_empty() {
                return;
            }
            let rows: Vec<Rows<'_>> = taken
                .iter()
                .map(|&(index, n)| {
                    let state = &drafting[index];
                    Rows {
                        seq: state.seq,
                        tokens: &state.catch_up[..n],
                        position: self.cached[state.seq.0 as usize].len(),
                        outputs: if n == state.catch_up.len() {
                            Outputs::Last
                        } else {
                            Outputs::None
                        },
                    }
                })
                .collect();
            let started = Instant::now();
            let decoded = self
                .context
                .with_dependent_mut(|_, context| context.decode_rows(&rows));
            let decode_time = started.elapsed();
            drop(rows);
            if let Err(reason) = decoded {
                self.fail(drafting, &taken, &reason, answer);
                continue;
            }
            let mut index_in_batch = 0;
            for &(index, n) in &taken {
                let state = &mut drafting[index];
                let decoded: Vec<Token> = state.catch_up.drain(..n).collect();
                self.cached[state.seq.0 as usize].extend_from_slice(&decoded);
                state.catch_up_time += decode_time;
                index_in_batch += n;
                if state.catch_up.is_empty() {
                    self.take_next(state, index_in_batch - 1);
                    if state.done {
                        answer(index, state.take_answer());
                    }
                }
            }
        }
    }

    /// Decodes the last drafted token of every ask that wants more, one decode per drafted
    /// position, until every ask is done. A recurrent draft model saves each sequence's state
    /// before the first of these decodes only, so the next ask goes back to it whatever the
    /// target accepted (an ask that waits for a later step, past the batch size, goes back to
    /// before its catch-up's last decode: more to replay, as exact).
    fn draft(&mut self, drafting: &mut [Drafting], answer: &mut impl FnMut(usize, Drafted)) {
        for step in 0.. {
            let active: Vec<usize> = (0..drafting.len())
                .filter(|&index| !drafting[index].done)
                .take(self.batch_size)
                .collect();
            if active.is_empty() {
                return;
            }
            let tokens: Vec<[Token; 1]> = active
                .iter()
                .map(|&index| {
                    let last = drafting[index].drafted.last();
                    [last.map_or(0, |drafted| drafted.token)]
                })
                .collect();
            let rows: Vec<Rows<'_>> = active
                .iter()
                .zip(&tokens)
                .map(|(&index, token)| {
                    let seq = drafting[index].seq;
                    Rows {
                        seq,
                        tokens: token,
                        position: self.cached[seq.0 as usize].len(),
                        outputs: Outputs::Last,
                    }
                })
                .collect();
            let decoded = self.context.with_dependent_mut(|_, context| {
                if step == 0 {
                    context.decode_rows(&rows)
                } else {
                    context.decode_rows_continuing(&rows)
                }
            });
            let taken: Vec<(usize, usize)> = active.iter().map(|&index| (index, 1)).collect();
            if let Err(reason) = decoded {
                self.fail(drafting, &taken, &reason, answer);
                continue;
            }
            for (index_in_batch, (&index, token)) in active.iter().zip(&tokens).enumerate() {
                let state = &mut drafting[index];
                self.cached[state.seq.0 as usize].push(token[0]);
                self.take_next(state, index_in_batch);
                if state.done {
                    answer(index, state.take_answer());
                }
            }
        }
    }

    /// Appends the draft model's token at batch index `index` to `state`'s draft (greedy, or
    /// drawn as the ask says), and marks it done at its length or below its `p_min`. A greedy
    /// draft stops after its first token below `p_min` (that token included); a drawn one
    /// stops *before* a position whose most likely token is below `p_min`, without drawing
    /// there: whether a drawn token is verified must not depend on the token itself.
    fn take_next(&self, state: &mut Drafting, index: usize) {
        let (token, prob, stops) = match &mut state.sampling {
            None => {
                let (token, prob) = self
                    .context
                    .with_dependent(|_, context| argmax_with_probability(context.logits(index)));
                if state.split_below > 0.0 {
                    // Looked for only where the greedy token is unsure: a pass over the vocabulary.
                    let runner_up = (prob < state.split_below)
                        .then(|| {
                            self.context.with_dependent(|_, context| {
                                second_choice(context.logits(index), token, prob)
                            })
                        })
                        .flatten()
                        .map(|(token, prob)| DraftedToken { token, prob });
                    state.runners_up.push(runner_up);
                }
                (token, prob, prob < state.p_min)
            }
            Some((sampling, generator)) => {
                let drawn = self
                    .context
                    .with_dependent(|_, context| sampling.draw(context.logits(index), generator));
                let Some((token, distribution)) = drawn else {
                    // Logits without a finite value: nothing to draw from.
                    state.done = true;
                    return;
                };
                let most_likely = distribution.probabilities.first().map_or(0.0, |&(_, p)| p);
                if most_likely < state.p_min {
                    state.done = true;
                    return;
                }
                let prob = distribution.probability(token);
                state.distributions.push(distribution);
                (token, prob, false)
            }
        };
        state.drafted.push(DraftedToken { token, prob });
        state.done = stops || state.drafted.len() >= state.max_draft_len;
    }

    /// A decode of `taken` failed: answers those asks with nothing and empties their caches.
    fn fail(
        &mut self,
        drafting: &mut [Drafting],
        taken: &[(usize, usize)],
        reason: &str,
        answer: &mut impl FnMut(usize, Drafted),
    ) {
        tracing::warn!(%reason, asks = taken.len(), "the draft model failed to propose; its caches start over");
        for &(index, _) in taken {
            let state = &mut drafting[index];
            state.done = true;
            state.catch_up.clear();
            state.drafted.clear();
            state.runners_up.clear();
            state.distributions.clear();
            self.clear(state.seq);
            answer(index, Drafted::default());
        }
    }
}

impl BatchDrafter for DraftBatch {
    fn sequences(&self) -> usize {
        DraftBatch::sequences(self)
    }

    fn ctx_size(&self) -> u32 {
        DraftBatch::ctx_size(self)
    }

    fn propose(&mut self, asks: &[DraftAsk<'_>], answer: &mut dyn FnMut(usize, Drafted)) {
        DraftBatch::propose(self, asks, answer);
    }

    fn clear(&mut self, seq: SeqId) {
        DraftBatch::clear(self, seq);
    }
}

/// How many leading tokens of `context` `cached` holds.
fn common_prefix(cached: &[Token], context: &[Token]) -> usize {
    cached
        .iter()
        .zip(context)
        .take_while(|(cached, fed)| cached == fed)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_drafts_are_reused_up_to_the_first_difference() {
        // Context 1 2 3, drafted 4 5 (6 was drafted last, so never decoded).
        let cache = [1, 2, 3, 4, 5];
        assert_eq!(
            common_prefix(&cache, &[1, 2, 3, 4, 9]),
            4,
            "one accepted, target said 9"
        );
        assert_eq!(
            common_prefix(&cache, &[1, 2, 3, 4, 5, 6, 7]),
            5,
            "all accepted"
        );
        assert_eq!(
            common_prefix(&cache, &[1, 2]),
            2,
            "a shorter context after a reset"
        );
        assert_eq!(common_prefix(&cache, &[7, 2, 3]), 0, "a new request");
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
