//! The draft-model bridge as the cascade sees it: a native model a source may drive.
//!
//! The engine implements these traits over a second GGUF (`--draft-model`); `plugins` hands one
//! [`DraftModel`] to each plugin instance through the WIT `draft-model` import, so a drafter
//! plugin decides how to use the model while the tensor work stays native. Nothing here names
//! llama.cpp or wasmtime.

use std::time::Duration;

use super::sampled::{DraftSampling, TokenDistribution};
use super::source::Token;

/// One token a draft model proposes, with the probability it gave it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftedToken {
    /// The draft model's greedy choice, or its draw when it drafts at a temperature.
    pub token: Token,
    /// Its probability under the draft model, in [0, 1]: the softmax over the whole vocabulary
    /// (greedy), or under the distribution it was drawn from.
    pub prob: f32,
}

/// What a draft model answers to one ask.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Drafted {
    /// The drafted tokens, in order.
    pub tokens: Vec<DraftedToken>,
    /// When the ask wanted second choices ([`ProposalSettings::split_below`] above 0) and the
    /// tokens were chosen greedily, one per token: the draft model's second most likely token
    /// at that position where the chosen one's probability is below `split_below`. Empty
    /// otherwise.
    pub runners_up: Vec<Option<DraftedToken>>,
    /// When the tokens were drawn at a temperature, the distribution of each (one per token);
    /// empty when they were chosen greedily.
    pub distributions: Vec<TokenDistribution>,
    /// Time spent decoding context tokens the cache lacked before drafting (a request's prompt
    /// at its first ask; the committed tokens since the last ask), counted whole for each ask
    /// that shared those decodes with others.
    pub catch_up_time: Duration,
}

/// What one proposal asks of a draft model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProposalSettings {
    /// Most tokens to draft.
    pub max_draft_len: usize,
    /// Greedy drafting stops after the first token less likely than this (that token
    /// included); drawing stops before a position whose most likely token is.
    pub p_min: f32,
    /// Draw each token from the draft model's distribution shaped by these settings, instead
    /// of choosing the greedy one.
    pub sampling: Option<DraftSampling>,
    /// Greedy drafting also gives the second choice at each position whose chosen token is
    /// less likely than this ([`Drafted::runners_up`]); 0: none.
    pub split_below: f32,
}

impl ProposalSettings {
    /// Greedy drafting of up to `max_draft_len` tokens, stopping after one below `p_min`.
    pub fn greedy(max_draft_len: usize, p_min: f32) -> Self {
        Self {
            max_draft_len,
            p_min,
            sampling: None,
            split_below: 0.0,
        }
    }
}

/// What the draft model costs, measured on the contexts sources draft with (see
/// `engine::measure_draft_model_costs`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftModelCosts {
    /// Time to draft one token: a one-token decode and the choice of the next token.
    pub per_token: Duration,
    /// Time to catch up with one context token, decoded in batches.
    pub catch_up_per_token: Duration,
    /// Share of the positions of a built-in chat answer at which the draft model's most likely
    /// next token is the target's (teacher-forced), when measured (see
    /// `engine::measure_agreement`).
    pub agreement: Option<f32>,
}

/// A draft model's context for one source: the tokens it has been fed, and its cache.
///
/// Call order: [`reset`](Self::reset) at the start of a request, [`feed`](Self::feed) with the
/// prompt and then with each round's committed tokens, [`propose`](Self::propose) whenever a
/// draft is wanted. Implementations evaluate fed tokens lazily, at the next `propose`, and reuse
/// their cache for tokens they drafted earlier that were then fed (accepted drafts).
pub trait DraftModel: Send {
    /// Empties the context.
    fn reset(&mut self);

    /// Appends committed tokens to the context.
    fn feed(&mut self, tokens: &[Token]);

    /// Drafts after the context as `settings` say: up to `max_draft_len` tokens, greedily or,
    /// with `sampling`, each drawn from the draft model's distribution shaped by it. Greedy
    /// drafting stops after the first token whose probability is below `p_min` (that token is
    /// included); drawing stops before a position whose most likely token is below `p_min`
    /// (whether a drawn token is verified may not depend on the token). The drafted tokens are
    /// not added to the context. Drafts nothing when the model fails (the failure is logged) or
    /// the context is full.
    fn propose(&mut self, settings: ProposalSettings) -> Drafted;
}

/// Makes one [`DraftModel`] context per source that asks for one. Shared by every plugin
/// instance of a process; the model weights are loaded once.
pub trait DraftModelFactory: Send + Sync {
    /// A fresh, empty context. `Err` says why none could be made (out of memory, ...).
    fn open(&self) -> Result<Box<dyn DraftModel>, String>;
}
