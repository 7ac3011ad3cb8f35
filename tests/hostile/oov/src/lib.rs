//! Hostile drafter: proposes token ids outside the vocabulary (`vocab_size`, `vocab_size + 7`,
//! `u32::MAX`), within `max_draft_len`.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Proposes ids `>= vocab_size`.
pub struct OutOfVocabulary {
    invalid: [Token; 3],
}

impl Drafter for OutOfVocabulary {
    fn new(_config: &str, facts: &ModelFacts) -> Result<Self, String> {
        let vocab_size = facts.vocab_size;
        Ok(Self {
            invalid: [vocab_size, vocab_size.saturating_add(7), u32::MAX],
        })
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        Proposal::tokens(&self.invalid[..max_draft_len.min(self.invalid.len())])
    }
}

export_drafter!(OutOfVocabulary);
