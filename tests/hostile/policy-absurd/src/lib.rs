//! Hostile policy: every decision is nonsense the host must bound: a draft length of
//! `u32::MAX`, shadow drafts of `u32::MAX` tokens on alternate rounds, and a source order full of
//! names the cascade does not have. The output must not change and nothing may fault.

use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// Returns absurd decisions.
pub struct Absurd {
    rounds: u64,
}

impl Policy for Absurd {
    fn new(_config: &str, _facts: &ModelFacts, _setup: &PolicySetup) -> Result<Self, String> {
        Ok(Self { rounds: 0 })
    }

    fn wants_text(&self) -> bool {
        true
    }

    fn observe(&mut self, _round: &RoundRecord) {}

    fn decide(&mut self) -> Decision {
        self.rounds += 1;
        let order = vec!["nobody".to_owned(), String::new(), "x".repeat(10_000)];
        let decision = if self.rounds.is_multiple_of(2) {
            Decision::skip(u32::MAX)
        } else {
            Decision::draft(u32::MAX)
        };
        decision.with_order(order)
    }
}

export_policy!(Absurd);
