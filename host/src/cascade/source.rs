//! The interface every draft source implements, native or WebAssembly.

use std::fmt;
use std::time::Duration;

use super::draft_model::DraftModelCosts;
use super::sampled::{DraftSampling, SampledDraft};
use super::tree::TreeShape;

/// A token id in the target model's vocabulary.
pub type Token = u32;

/// Facts about the target model that draft sources may need; fixed for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// Number of tokens in the vocabulary; every drafted token must be below it.
    pub vocab_size: u32,
    /// Beginning-of-sequence token, if any.
    pub bos: Option<Token>,
    /// End-of-sequence token, if any.
    pub eos: Option<Token>,
    /// Every end-of-generation token.
    pub eog: Vec<Token>,
    /// Context size of the target, in tokens.
    pub context_size: u32,
}

/// What a source proposes: tokens and, optionally, one confidence in [0, 1] per token; a chain,
/// or a tree of continuations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    /// Proposed continuation, most likely first.
    pub tokens: Vec<Token>,
    /// Empty, or one probability per token that the draft is accepted up to that token.
    pub confidence: Vec<f32>,
    /// Empty for a chain; for a tree, the row each token continues (see
    /// [`TreeShape`](super::TreeShape)), for a source told it may propose trees
    /// ([`DraftSource::set_max_paths`]).
    pub parents: Vec<usize>,
}

impl Proposal {
    /// A proposal with no tokens ("no idea this round").
    pub fn empty() -> Self {
        Self::default()
    }

    /// A proposal of `tokens` without confidence estimates.
    pub fn from_tokens(tokens: Vec<Token>) -> Self {
        Self {
            tokens,
            confidence: Vec::new(),
            parents: Vec::new(),
        }
    }

    /// Shapes the proposal as a tree of `parents` (one per token, checked by the caller); a
    /// chain's are dropped, so that a chain is always a proposal without parents.
    pub fn set_parents(&mut self, parents: Vec<usize>) {
        self.parents = parents;
        if TreeShape::new(&self.tokens, &self.parents).is_chain() {
            self.parents.clear();
        }
    }

    /// Cuts the proposal, and its confidences, to at most `len` tokens (of a tree, its first
    /// ones, which hold their parents).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.confidence.truncate(len);
        self.parents.truncate(len);
    }

    /// Keeps only the leading chain of a tree: its first tokens, each continuing the one
    /// before (what a chain-only use of the proposal can verify).
    pub fn keep_spine(&mut self) {
        let spine = TreeShape::new(&self.tokens, &self.parents).spine_len();
        self.truncate(spine);
        self.parents.clear();
    }
}

/// How a source's last proposal fared in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feedback {
    /// Whether this source's proposal was the verified draft.
    pub won: bool,
    /// Leading tokens of the proposal the target accepted (0 unless `won`).
    pub n_accepted: u32,
    /// The token the target chose after the accepted prefix.
    pub target_token: Token,
}

/// A source failed to answer: the cascade treats the call as an empty proposal and goes on.
///
/// Raised by sandboxed plugins (traps, time-outs, invalid proposals); native sources do not fail.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFault {
    /// The source that failed.
    pub source: String,
    /// What it did, in words fit for a warning ("trapped: unreachable executed", ...).
    pub what: String,
}

impl fmt::Display for SourceFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "draft source `{}` {}", self.source, self.what)
    }
}

impl std::error::Error for SourceFault {}

/// A source of draft tokens: one slot of a cascade.
///
/// Call order for one request: [`begin`](Self::begin), then per round at most one
/// [`propose`](Self::propose), then [`feedback`](Self::feedback) if it proposed, then
/// [`feed`](Self::feed) with the tokens committed that round; [`end`](Self::end) when the
/// request finishes. A `SourceFault` never stops generation: the cascade counts it and the
/// round continues without this source.
pub trait DraftSource: Send {
    /// The name shown in stats and warnings (`lookup`, `./my_drafter.wasm`, ...).
    fn name(&self) -> &str;

    /// Starts a request: the source resets its per-request state and takes `prompt` as context.
    fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault>;

    /// Proposes up to `max_draft_len` tokens continuing the context. May return fewer, or none;
    /// a tree of at most the paths [`Self::set_max_paths`] allowed.
    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault>;

    /// Sets the most paths a proposal of the next requests may have: 1, chains, unless the
    /// cascade merges trees for a verifier that takes them. Called before
    /// [`begin`](Self::begin). Default: ignored (a source that proposes chains only).
    fn set_max_paths(&mut self, _paths: usize) {}

    /// Tells the source how its last proposal fared. Default: ignored.
    fn feedback(&mut self, _feedback: Feedback) -> Result<(), SourceFault> {
        Ok(())
    }

    /// Appends the tokens committed this round to the context.
    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault>;

    /// Ends the request; per-request state may be dropped. Default: nothing.
    fn end(&mut self) {}

    /// Whether proposing is expensive (it runs a model): the scored cascade asks such sources
    /// only when the cheap ones fall short, and shadow drafts never ask them. Default: cheap.
    fn is_expensive(&self) -> bool {
        false
    }

    /// What drafting with the source's draft model costs, for a source that drafts with one
    /// and whose host measured it. Default: none.
    fn draft_model_costs(&self) -> Option<DraftModelCosts> {
        None
    }

    /// How the source's draft model draws its drafts for the current request (its temperature
    /// and seed, for rejection sampling); `None`: greedily. Called before
    /// [`begin`](Self::begin). Default: ignored (a source without a draft model).
    fn sample_drafts(&mut self, _sampling: Option<DraftSampling>) {}

    /// The draft its draft model drew during the last [`propose`](Self::propose), if it drew
    /// one: the source's proposal for the round, whatever `propose` returned. Default: none.
    fn take_draw(&mut self) -> Option<SampledDraft> {
        None
    }

    /// Time the source's draft model spent catching up with the context during its calls since
    /// this was last asked (part of those calls' time), and starts counting again. Default:
    /// zero.
    fn take_catch_up_time(&mut self) -> Duration {
        Duration::ZERO
    }

    /// Asks the source to hand its cross-request state to the host for persisting (between
    /// requests only). Default: nothing to save.
    fn checkpoint(&mut self) -> Result<(), SourceFault> {
        Ok(())
    }
}
