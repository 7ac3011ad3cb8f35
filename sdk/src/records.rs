//! The records a plugin exchanges with the host, as `wit/drafter.wit` defines them, with the
//! helpers plugin code reads best with.
//!
//! Every record here is the type `wit_bindgen` generates from the WIT (the private `bindings`
//! module), re-exported by name: there is no second, hand-written copy to keep in step, and a
//! field's docs are the WIT's own. They are plain Rust values all the same (`Clone`, `Debug`,
//! `PartialEq`, `Default`), so plugins build and test them natively. This module adds methods
//! only:
//!
//! * [`ModelFacts::is_eog`];
//! * [`Proposal::empty`], [`Proposal::tokens`], [`Proposal::with_confidence`],
//!   [`Proposal::len`], [`Proposal::is_empty`];
//! * [`RoundRecord::winner`], [`RoundRecord::shadows`], [`RoundRecord::n_drafted`];
//! * [`Decision::draft`], [`Decision::skip`], [`Decision::with_order`],
//!   [`Decision::excluding`].

pub use crate::bindings::drafter_world::spechost::drafter::draft_model::{
    DraftedPosition, DraftedToken,
};
pub use crate::bindings::drafter_world::spechost::drafter::types::{
    Feedback, ModelFacts, Proposal, Token,
};
pub use crate::bindings::policy_world::exports::spechost::drafter::policy_api::{
    Decision, DraftModelCosts, PolicySetup, RoundRecord, SourceRound,
};

impl ModelFacts {
    /// Whether generation stops at `token`: it is the EOS token or one of the `eog` tokens.
    ///
    /// A drafter can end its proposal right after such a token, since the target never
    /// continues past it.
    pub fn is_eog(&self, token: Token) -> bool {
        self.eos == Some(token) || self.eog.contains(&token)
    }
}

impl Proposal {
    /// No proposal this round ("no idea"). The cascade moves on to its next source.
    pub fn empty() -> Self {
        Self::default()
    }

    /// A proposal of `tokens` with no confidence estimate.
    ///
    /// Takes anything that converts into a `Vec<Token>`: a slice of the context, a `Vec` or an
    /// array.
    pub fn tokens(tokens: impl Into<Vec<Token>>) -> Self {
        Self {
            tokens: tokens.into(),
            confidence: Vec::new(),
        }
    }

    /// A proposal of `tokens` with one confidence value per token (see [`Proposal::confidence`]).
    ///
    /// The lengths are not checked here; the host (and the test harness) treat a mismatch as a
    /// fault.
    pub fn with_confidence(tokens: impl Into<Vec<Token>>, confidence: impl Into<Vec<f32>>) -> Self {
        Self {
            tokens: tokens.into(),
            confidence: confidence.into(),
        }
    }

    /// Number of proposed tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether this is the empty ("no idea") proposal.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

impl RoundRecord {
    /// The source whose proposal was verified this round, if one was.
    pub fn winner(&self) -> Option<&SourceRound> {
        self.sources.iter().find(|source| source.won)
    }

    /// The shadow proposals settled this round.
    pub fn shadows(&self) -> impl Iterator<Item = &SourceRound> {
        self.sources.iter().filter(|source| source.shadow)
    }

    /// Tokens drafted and verified this round: the draft batch minus the target's own token.
    pub fn n_drafted(&self) -> u32 {
        self.n_verified.saturating_sub(1)
    }

    /// Tokens of other requests' rounds in this round's verify batch (0 when it was verified
    /// alone, or by a host that does not say).
    pub fn others_verified(&self) -> u32 {
        self.batch_verified.saturating_sub(self.n_verified)
    }

    /// Tokens other requests' rounds committed in this round's verify batch (0 when alone).
    pub fn others_committed(&self) -> u32 {
        self.batch_committed
            .saturating_sub(self.n_accepted.saturating_add(1))
    }
}

impl Decision {
    /// Draft up to `max_draft_len` tokens this round, in the current source order.
    pub fn draft(max_draft_len: u32) -> Self {
        Self {
            max_draft_len,
            ..Self::default()
        }
    }

    /// Skip speculation this round (plain decoding), asking cheap sources for shadow proposals
    /// of `shadow_len` tokens (0 for none).
    pub fn skip(shadow_len: u32) -> Self {
        Self {
            shadow_len,
            ..Self::default()
        }
    }

    /// This decision, with the sources reordered to `order` (names, first asked first).
    pub fn with_order(self, order: Vec<String>) -> Self {
        Self {
            order: Some(order),
            ..self
        }
    }

    /// This decision, with the sources named in `exclude` left out of the round.
    pub fn excluding(self, exclude: Vec<String>) -> Self {
        Self { exclude, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eog_includes_eos_and_the_eog_list() {
        let facts = ModelFacts {
            vocab_size: 10,
            bos: Some(1),
            eos: Some(2),
            eog: vec![7],
            context_size: 64,
        };
        let stops: Vec<Token> = (0..10).filter(|&token| facts.is_eog(token)).collect();
        assert_eq!(stops, [2, 7], "eog tokens of {facts:?}");
    }

    #[test]
    fn proposal_constructors_accept_slices_vecs_and_arrays() {
        let context: Vec<Token> = vec![4, 5, 6];
        assert_eq!(Proposal::tokens(&context[1..]).tokens, [5, 6]);
        assert_eq!(Proposal::tokens(vec![1]).tokens, [1]);
        let proposal = Proposal::with_confidence([1, 2], [0.9, 0.5]);
        assert_eq!(proposal.confidence, [0.9, 0.5]);
        assert!(Proposal::empty().is_empty());
    }

    fn source(name: &str, won: bool, shadow: bool) -> SourceRound {
        SourceRound {
            source: name.to_owned(),
            drafted: 4,
            accepted: 2,
            won,
            shadow,
            ..SourceRound::default()
        }
    }

    #[test]
    fn record_finds_winner_and_shadows() {
        let record = RoundRecord {
            sources: vec![
                source("a", false, true),
                source("b", true, false),
                source("c", false, true),
            ],
            n_verified: 5,
            ..RoundRecord::default()
        };
        let winner = record.winner().map(|source| source.source.as_str());
        assert_eq!(winner, Some("b"), "{record:?}");
        let shadows: Vec<&str> = record
            .shadows()
            .map(|source| source.source.as_str())
            .collect();
        assert_eq!(shadows, ["a", "c"], "{record:?}");
        assert_eq!(record.n_drafted(), 4, "{record:?}");
        assert_eq!(
            (record.others_verified(), record.others_committed()),
            (0, 0),
            "a host that does not say verified the round alone"
        );
        let batched = RoundRecord {
            n_accepted: 2,
            batch_verified: 12,
            batch_committed: 7,
            ..record
        };
        assert_eq!(
            (batched.others_verified(), batched.others_committed()),
            (7, 4),
            "{batched:?}"
        );
        assert_eq!(RoundRecord::default().n_drafted(), 0);
    }

    #[test]
    fn decision_constructors_set_only_what_they_name() {
        assert_eq!(
            Decision::draft(6),
            Decision {
                max_draft_len: 6,
                shadow_len: 0,
                order: None,
                exclude: Vec::new(),
            }
        );
        assert_eq!(
            Decision::skip(8),
            Decision {
                max_draft_len: 0,
                shadow_len: 8,
                order: None,
                exclude: Vec::new(),
            }
        );
        let order = vec!["b".to_owned(), "a".to_owned()];
        assert_eq!(
            Decision::draft(2).with_order(order.clone()).order,
            Some(order)
        );
        let exclude = vec!["draft".to_owned()];
        assert_eq!(
            Decision::draft(4).excluding(exclude.clone()),
            Decision {
                max_draft_len: 4,
                exclude,
                ..Decision::default()
            }
        );
    }
}
