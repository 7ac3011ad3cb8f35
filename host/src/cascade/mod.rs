//! The cascade: asks draft sources in order and gives the engine one draft per round.
//!
//! One round, in order:
//! 1. the engine calls [`Cascade::propose`] with this round's `max_len`;
//! 2. sources are asked in order until one returns at least `min_len` tokens, and that source
//!    wins; a source that faults counts as an empty proposal;
//! 3. the draft is cut to `max_len` here, never inside a source;
//! 4. after verification, [`Cascade::accept`] tells every asked source how its proposal fared,
//!    feeds the committed tokens to every source, and credits the winner in [`SourceStats`].
//!
//! Not here: WebAssembly (a plugin is just a [`DraftSource`]), restarts and quarantine
//! (`plugins`), and the model (`engine`). The cascade is one value built from configuration, so
//! it can be replaced between rounds.

mod draft_model;
mod ordered;
mod source;
mod stats;

pub use self::draft_model::{DraftModel, DraftModelFactory, DraftedToken};
pub use self::ordered::{Cascade, CascadeSettings, DEFAULT_MIN_LEN, Draft};
pub use self::source::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token};
pub use self::stats::SourceStats;
pub(crate) use self::stats::ratio;
