//! `policy-fixed`: drafts the same number of tokens every round.
//!
//! The baseline the adaptive policies are measured against, and the host's behaviour without a
//! policy when `k` is left at its default. It never skips speculation and never asks for shadow
//! drafts; `k=0` makes every round plain decoding.
//!
//! # Config
//!
//! | key | default                 | meaning                                          |
//! |-----|-------------------------|--------------------------------------------------|
//! | `k` | the host's `--draft-max` | tokens to draft each round, cut to `--draft-max` |

use spechost_sdk::config::Config;
use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// Drafts `max_draft_len` tokens every round.
#[derive(Debug)]
pub struct Fixed {
    max_draft_len: u32,
}

impl Policy for Fixed {
    fn new(config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let k = config.get_u32("k", setup.max_draft_len)?;
        config.finish()?;
        Ok(Fixed {
            max_draft_len: k.min(setup.max_draft_len),
        })
    }

    fn observe(&mut self, _round: &RoundRecord) {}

    fn decide(&mut self) -> Decision {
        Decision::draft(self.max_draft_len)
    }
}

export_policy!(Fixed);

#[cfg(test)]
mod tests {
    use spechost_sdk::testing::{PolicyHarness, drafted_round, facts, policy_setup};

    use super::*;

    fn fixed(config: &str, max_draft_len: u32) -> PolicyHarness<Fixed> {
        PolicyHarness::new(config, facts(100), policy_setup(max_draft_len)).expect("valid config")
    }

    /// The draft lengths of `rounds` rounds against a target accepting `accepted` per round.
    fn lengths(harness: &mut PolicyHarness<Fixed>, rounds: usize, accepted: u32) -> Vec<u32> {
        harness
            .run(rounds, |decision| {
                let drafted = decision.max_draft_len;
                drafted_round(drafted, accepted.min(drafted))
            })
            .iter()
            .map(|decision| decision.max_draft_len)
            .collect()
    }

    #[test]
    fn defaults_to_the_hosts_maximum() {
        let mut harness = fixed("", 12);
        assert_eq!(lengths(&mut harness, 3, 12), [12, 12, 12]);
    }

    #[test]
    fn drafts_k_whatever_the_acceptance() {
        let mut harness = fixed("k=5", 16);
        assert_eq!(lengths(&mut harness, 4, 0), [5, 5, 5, 5]);
        assert_eq!(lengths(&mut harness, 4, 5), [5, 5, 5, 5]);
    }

    #[test]
    fn caps_k_at_the_hosts_maximum() {
        let mut harness = fixed("k=40", 16);
        assert_eq!(harness.decide(), Decision::draft(16));
    }

    #[test]
    fn k_zero_is_plain_decoding_without_shadow_drafts() {
        let mut harness = fixed("k=0", 16);
        assert_eq!(harness.decide(), Decision::skip(0));
    }

    #[test]
    fn never_asks_for_text_or_reorders() {
        let mut harness = fixed("k=3", 8);
        assert!(!harness.wants_text());
        assert_eq!(harness.decide().order, None);
    }

    #[test]
    fn rejects_bad_and_unknown_settings() {
        let error = PolicyHarness::<Fixed>::new("k=-1", facts(100), policy_setup(8)).unwrap_err();
        assert!(
            error.contains("`k`") && error.contains("non-negative integer"),
            "{error}"
        );
        let error = PolicyHarness::<Fixed>::new("kk=3", facts(100), policy_setup(8)).unwrap_err();
        assert!(
            error.contains("unknown setting `kk`") && error.contains("`k`"),
            "{error}"
        );
    }
}
