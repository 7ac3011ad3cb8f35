//! Hostile drafter: proposes 1 000 000 valid tokens whatever `max_draft_len` the host asked for, a
//! 4 MB list the host must refuse without letting it reach the draft.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Length of every proposal: a million tokens.
const FLOOD_LEN: usize = 1_000_000;

/// Ignores `max_draft_len`, by five orders of magnitude.
pub struct FloodMillion {
    tokens: Vec<Token>,
}

impl Drafter for FloodMillion {
    fn new(_config: &str, facts: &ModelFacts) -> Result<Self, String> {
        // Valid ids only, so the length is the one thing wrong with the proposal.
        let tokens = (0..facts.vocab_size.max(1))
            .cycle()
            .take(FLOOD_LEN)
            .collect();
        Ok(Self { tokens })
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        Proposal::tokens(self.tokens.as_slice())
    }
}

export_drafter!(FloodMillion);
