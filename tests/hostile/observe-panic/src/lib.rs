//! Hostile drafter: proposes the last token again, like a well-behaved one, but panics in
//! `observe-response`, whenever the host hands it a response another request produced.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Proposes the last token; panics when handed another request's response.
pub struct PanicOnObserve {
    last: Option<Token>,
}

impl Drafter for PanicOnObserve {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self { last: None })
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.last = tokens.last().copied().or(self.last);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        match self.last {
            Some(last) if max_draft_len > 0 => Proposal::tokens([last]),
            _ => Proposal::empty(),
        }
    }

    fn observe_response(response: &[Token]) {
        panic!(
            "hostile-observe-panic: deliberate panic in observe-response ({} tokens)",
            response.len()
        );
    }
}

export_drafter!(PanicOnObserve);
