//! {{name}}: a spechost draft-length policy.
//!
//! Additive increase, multiplicative decrease: the draft grows by one token after a round whose
//! draft was accepted whole and halves after a rejection, within the host's `max-draft-len`.
//! Replace `observe` and `decide` with your own idea; the tests below drive it natively.

use spechost_sdk::config::Config;
use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// The draft length of a request's first round.
const DEFAULT_START: u32 = 4;

/// One request's policy: the host opens one per generation request.
pub struct Aimd {
    len: u32,
    max: u32,
}

impl Policy for Aimd {
    fn new(config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let start = config.get_u32("start", DEFAULT_START)?;
        config.finish()?;
        let max = setup.max_draft_len;
        Ok(Self {
            len: start.clamp(1, max.max(1)),
            max,
        })
    }

    fn observe(&mut self, round: &RoundRecord) {
        let drafted = round.n_verified.saturating_sub(1);
        if drafted == 0 {
            return;
        }
        self.len = if round.n_accepted == drafted {
            (self.len + 1).min(self.max)
        } else {
            (self.len / 2).max(1)
        };
    }

    fn decide(&mut self) -> Decision {
        Decision::draft(self.len.min(self.max))
    }
}

export_policy!(Aimd);

#[cfg(test)]
mod tests {
    use super::*;
    use spechost_sdk::testing::{PolicyHarness, drafted_round, facts, policy_setup};

    #[test]
    fn grows_on_full_acceptance_and_halves_on_rejection() {
        let mut harness =
            PolicyHarness::<Aimd>::new("start=4", facts(100), policy_setup(6)).expect("config");
        assert_eq!(harness.decide().max_draft_len, 4);
        for _ in 0..5 {
            harness.observe(&drafted_round(4, 4));
        }
        assert_eq!(harness.decide().max_draft_len, 6, "never above max-draft-len");
        harness.observe(&drafted_round(6, 1));
        assert_eq!(harness.decide().max_draft_len, 3);
    }

    #[test]
    fn a_misspelt_setting_is_an_error_naming_it() {
        let error = PolicyHarness::<Aimd>::new("strat=2", facts(100), policy_setup(6)).err();
        assert!(error.is_some_and(|e| e.contains("strat")));
    }
}
