//! Hostile drafter: panics in `propose` on every third call of a session (a panic mid-stream);
//! otherwise proposes the last token again.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// `propose` panics on every call whose number is a multiple of this.
const PANIC_EVERY_CALLS: u64 = 3;

/// Proposes the last token, except that every third `propose` panics.
pub struct PanicMidStream {
    last: Option<Token>,
    calls: u64,
}

impl Drafter for PanicMidStream {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self {
            last: None,
            calls: 0,
        })
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.last = tokens.last().copied().or(self.last);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        self.calls += 1;
        if self.calls.is_multiple_of(PANIC_EVERY_CALLS) {
            panic!(
                "hostile-panic: deliberate panic in propose (call {})",
                self.calls
            );
        }
        match self.last {
            Some(last) if max_draft_len > 0 => Proposal::tokens([last]),
            _ => Proposal::empty(),
        }
    }
}

export_drafter!(PanicMidStream);
