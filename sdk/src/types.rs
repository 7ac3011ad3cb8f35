//! The plain Rust values a drafter sees: tokens, model facts, proposals, feedback and the draft
//! model's tokens.
//!
//! They mirror the records of `spechost:drafter/types` (and `drafted-token` of
//! `spechost:drafter/draft-model`) one for one, but they are ordinary Rust types: they build and
//! test natively, with no WebAssembly involved. The conversion from and to the generated bindings
//! happens in one place, the private `bindings` module. A policy's records are in
//! [`crate::policy_types`].

/// A token id in the target model's vocabulary, always `< ModelFacts::vocab_size`.
pub type Token = u32;

/// Facts about the target model, fixed for the lifetime of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// Number of tokens in the vocabulary. Every proposed token must be below it.
    pub vocab_size: u32,
    /// Beginning-of-sequence token, if the model has one.
    pub bos: Option<Token>,
    /// End-of-sequence token, if the model has one.
    pub eos: Option<Token>,
    /// Every end-of-generation token (EOS, end-of-turn, ...). Generation stops on any of them,
    /// so proposing tokens past one is wasted work.
    pub eog: Vec<Token>,
    /// Context size of the target, in tokens: prompt plus output never exceed it.
    pub context_size: u32,
}

impl ModelFacts {
    /// Whether generation stops at `token`: it is the EOS token or one of the `eog` tokens.
    ///
    /// A drafter can end its proposal right after such a token, since the target never
    /// continues past it.
    pub fn is_eog(&self, token: Token) -> bool {
        self.eos == Some(token) || self.eog.contains(&token)
    }
}

/// What a drafter proposes as the continuation of the context it has been fed.
///
/// The host checks every proposal: more tokens than the `max_draft_len` it asked for, a token id
/// `>= vocab_size`, or a confidence list of the wrong length or outside `[0, 1]` is a fault
/// (the proposal is dropped and the plugin restarted). [`crate::testing::Harness`] applies the
/// same checks natively, so such bugs show up in unit tests first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    /// The proposed tokens, most likely continuation first. Empty means "no idea".
    pub tokens: Vec<Token>,
    /// Either empty (no estimate) or one value per token in `tokens`: the probability, in
    /// `[0, 1]`, that the target accepts the draft up to and including that token. The host uses
    /// it to compare sources, so it should not increase along the proposal.
    pub confidence: Vec<f32>,
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

/// The outcome of a round, told to a session whose drafter proposed in that round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feedback {
    /// Whether this drafter's proposal was the draft the target verified this round.
    pub won: bool,
    /// How many leading tokens of this drafter's proposal the target accepted. Zero when the
    /// drafter did not win.
    pub n_accepted: u32,
    /// The token the target chose right after the accepted prefix (a correction, or a bonus
    /// token when everything was accepted).
    pub target_token: Token,
}

/// One token the host's draft model proposes (see [`crate::draft_model::propose`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftedToken {
    /// The draft model's greedy choice.
    pub token: Token,
    /// The probability the draft model gave it, in `[0, 1]` (softmax over the whole vocabulary,
    /// temperature 1).
    pub prob: f32,
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
}
