//! Hostile drafter: proposes valid tokens with confidence values outside [0, 1] (NaN, -1, 7),
//! within `max_draft_len`.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Confidence values no probability can take, one per proposed token.
const BAD_CONFIDENCE: [f32; 3] = [f32::NAN, -1.0, 7.0];

/// Proposes the last token repeated, with invalid confidence.
pub struct BadConfidence {
    last: Token,
}

impl Drafter for BadConfidence {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self { last: 0 })
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.last = tokens.last().copied().unwrap_or(self.last);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        let len = max_draft_len.min(BAD_CONFIDENCE.len());
        Proposal::with_confidence(vec![self.last; len], &BAD_CONFIDENCE[..len])
    }
}

export_drafter!(BadConfidence);
