//! Hostile drafter: sleeps two seconds in every `propose` through WASI's timers, to stall the
//! host from inside a host call, where epoch deadlines cannot interrupt it. The host makes
//! timers fire at once, so the sleep returns immediately and nothing faults.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// How long each `propose` tries to sleep.
const NAP: std::time::Duration = std::time::Duration::from_secs(2);

/// Sleeps, then proposes nothing.
pub struct Sleep;

impl Drafter for Sleep {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self)
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        std::thread::sleep(NAP);
        Proposal::empty()
    }
}

export_drafter!(Sleep);
