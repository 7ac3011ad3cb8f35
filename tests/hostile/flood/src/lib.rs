//! Hostile drafter: proposes 10 000 valid tokens whatever `max_draft_len` the host asked for.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Length of every proposal, far above any sensible `max_draft_len`.
const FLOOD_LEN: usize = 10_000;
/// The proposal cycles through the first this-many token ids (fewer if the vocabulary is smaller).
const FLOOD_DISTINCT: u32 = 100;

/// Ignores `max_draft_len`.
pub struct Flood {
    tokens: Vec<Token>,
}

impl Drafter for Flood {
    fn new(_config: &str, facts: &ModelFacts) -> Result<Self, String> {
        let distinct = FLOOD_DISTINCT.min(facts.vocab_size).max(1);
        let tokens = (0..distinct).cycle().take(FLOOD_LEN).collect();
        Ok(Self { tokens })
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        Proposal::tokens(self.tokens.as_slice())
    }
}

export_drafter!(Flood);
