//! Hostile drafter: asks the host's draft model for the longest draft it allows, again and
//! again, forever, in `propose`. Almost all of the time goes to native work the host does on the
//! plugin's behalf (and credits back to the call's deadline), almost none to the plugin's own
//! code: the deadline alone cannot end such a call, so the host must bound that work too.

use std::hint::black_box;

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, draft_model, export_drafter};

/// Longer than the host's cap per bridge call, so every call does the most it can.
const ASK: usize = 1 << 16;

/// Never returns from `propose` while a draft model is attached.
pub struct BridgeLoop;

impl Drafter for BridgeLoop {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self)
    }

    fn feed(&mut self, tokens: &[Token]) {
        draft_model::feed(tokens);
    }

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        while draft_model::available() {
            black_box(draft_model::propose(ASK, 0.0));
        }
        Proposal::empty()
    }
}

export_drafter!(BridgeLoop);
