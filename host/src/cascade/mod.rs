//! The cascade: the draft sources of a request, the policy that sizes each round's draft, and
//! the rule that picks one draft per round.
//!
//! One round, in order:
//! 1. the engine calls [`Cascade::propose`] with this round's limit (what the context and
//!    `max_tokens` leave room for, at most `--draft-max`);
//! 2. the [`RoundPolicy`] decides the draft length (0 = plain decoding this round, possibly with
//!    unverified shadow proposals) and may reorder sources;
//! 3. sources are asked as the [`CascadeMode`] says (first long-enough proposal, best
//!    expected acceptance, or every proposal merged into a tree of the likeliest tokens when
//!    the verifier takes trees); a source that faults counts as an empty proposal; the draft is
//!    cut to the decided length here, never inside a source;
//! 4. after verification, [`Cascade::accept`] tells every asked source how its proposal fared,
//!    settles shadow proposals, feeds the committed tokens to every source, credits the winner
//!    in [`SourceStats`], and shows the round to the policy as a [`RoundRecord`].
//!
//! Not here: WebAssembly (a plugin is just a [`DraftSource`] or a [`RoundPolicy`]), restarts
//! and quarantine (`plugins`), and the model (`engine`). The cascade is one value built from
//! configuration, so it can be replaced between requests.

mod chain;
#[cfg(test)]
mod doubles;
mod draft_model;
mod estimate;
mod mode;
mod policy;
mod sampled;
mod scored;
mod slot;
mod source;
mod stats;
mod tree;

pub use self::chain::{Cascade, Draft, RoundTiming};
pub use self::draft_model::{
    DraftModel, DraftModelCosts, DraftModelFactory, Drafted, DraftedToken, ProposalSettings,
};
pub use self::estimate::{AcceptanceHistory, matching_prefix};
pub use self::mode::{
    CascadeMode, CascadeSettings, DEFAULT_EXPENSIVE_THRESHOLD, DEFAULT_MIN_LEN, MAX_SHADOW_LEN,
};
pub use self::policy::{
    Decision, DraftModelSetup, FixedLength, PolicySetup, RoundPolicy, RoundRecord, SourceRound,
    curve_cost, curve_cost_by,
};
pub use self::sampled::{DraftSampling, MAX_DRAFT_SUPPORT, SampledDraft, TokenDistribution};
pub use self::source::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token};
pub use self::stats::SourceStats;
pub(crate) use self::stats::ratio;
pub use self::tree::TreeShape;
