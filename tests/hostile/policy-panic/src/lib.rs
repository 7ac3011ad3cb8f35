//! Hostile policy: decides the largest draft length for one round, then panics in every
//! `decide`. The host must restart it, then quarantine it and turn speculation off, and the
//! output must not change.

use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// Rounds decided normally before every `decide` panics.
const HEALTHY_ROUNDS: u32 = 1;

/// Panics in `decide` after [`HEALTHY_ROUNDS`] rounds.
pub struct PanicInDecide {
    max_draft_len: u32,
    rounds: u32,
}

impl Policy for PanicInDecide {
    fn new(_config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
        Ok(Self {
            max_draft_len: setup.max_draft_len,
            rounds: 0,
        })
    }

    fn observe(&mut self, _round: &RoundRecord) {}

    fn decide(&mut self) -> Decision {
        self.rounds += 1;
        if self.rounds > HEALTHY_ROUNDS {
            panic!("hostile policy panics in decide on round {}", self.rounds);
        }
        Decision::draft(self.max_draft_len)
    }
}

export_policy!(PanicInDecide);
