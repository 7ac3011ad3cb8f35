//! Hostile drafter: panics inside `new`, so opening a session traps instead of returning an
//! error.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Never constructed: its constructor panics.
pub struct PanicInNew;

impl Drafter for PanicInNew {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        panic!("hostile-panic-open: deliberate panic in new");
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        Proposal::empty()
    }
}

export_drafter!(PanicInNew);
