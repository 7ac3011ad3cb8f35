//! `policy-heuristic`: the draft-length rule of Hugging Face transformers' assisted generation,
//! plus a back-off to plain decoding.
//!
//! After a round in which the target accepted every drafted token, K grows by `up` (2); after
//! a round in which it rejected one, K shrinks by `down` (1), never below 1 nor above the host's
//! `--draft-max`. A round that drafted nothing (no source had a proposal) leaves K alone. It
//! reacts within a round, where `policy-window` waits for a window of evidence.
//!
//! Alone, that rule keeps drafting at least one token a round however little is accepted, which
//! is slower than plain decoding. So, as in `policy-window`, the SDK's [`Backoff`] watches the
//! acceptance of the last `evidence` drafted tokens: below `off`, every round is plain decoding
//! with shadow drafts of `shadow_len` tokens from cheap sources; when the shadow acceptance over
//! `evidence` tokens reaches `resume` (or, with no shadow results at all, after `probe_after`
//! rounds, twice as long after each failed probe), speculation resumes at K = 1 and grows again
//! from there.
//!
//! # Config
//!
//! | key           | default | meaning                                                     |
//! |---------------|---------|-------------------------------------------------------------|
//! | `k`           | 8       | first K, at least 1                                         |
//! | `up`          | 2       | K grows by this after a fully accepted draft                |
//! | `down`        | 1       | K shrinks by this after a draft with a rejected token       |
//! | `off`         | 0.3     | switch speculation off below this acceptance; 0 never does  |
//! | `resume`      | 0.6     | switch back on at this shadow acceptance or more            |
//! | `evidence`    | 64      | tokens measured before switching off or on                  |
//! | `shadow_len`  | 8       | shadow tokens asked for each round while off                |
//! | `probe_after` | 64      | rounds off without shadow results before a probe            |
//!
//! with `off <= resume`. Every K is capped at the host's `--draft-max`.

use spechost_sdk::adaptive::{Backoff, BackoffSettings, Transition};
use spechost_sdk::config::Config;
use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// Default first K.
const DEFAULT_K: u32 = 8;
/// Default growth after a fully accepted draft.
const DEFAULT_UP: u32 = 2;
/// Default shrink after a draft with a rejected token.
const DEFAULT_DOWN: u32 = 1;
/// Smallest K while speculation is on; 0 is the back-off's business.
const MIN_K: u32 = 1;
/// Back-off defaults: off below 30% acceptance, back on at 60%, over 64 tokens.
const DEFAULT_BACKOFF: BackoffSettings = BackoffSettings {
    off: 0.3,
    resume: 0.6,
    evidence: 64,
    shadow_len: 8,
    probe_after: 64,
};

/// The heuristic for one request.
#[derive(Debug)]
pub struct Heuristic {
    /// Current K while speculation is on.
    max_draft_len: u32,
    /// The host's `--draft-max`.
    cap: u32,
    up: u32,
    down: u32,
    backoff: Backoff,
}

impl Policy for Heuristic {
    fn new(config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let k = config.get_u32("k", DEFAULT_K)?;
        let up = config.get_u32("up", DEFAULT_UP)?;
        let down = config.get_u32("down", DEFAULT_DOWN)?;
        let backoff = BackoffSettings::from_config(&config, DEFAULT_BACKOFF)?;
        config.finish()?;
        if k < MIN_K {
            return Err(format!(
                "setting `k` is 0; give at least {MIN_K} (speculation switches off through `off`)"
            ));
        }
        let cap = setup.max_draft_len;
        Ok(Heuristic {
            max_draft_len: k.min(cap),
            cap,
            up,
            down,
            backoff: Backoff::new(backoff),
        })
    }

    fn observe(&mut self, round: &RoundRecord) {
        match self.backoff.observe(round) {
            Transition::On => self.max_draft_len = MIN_K.min(self.cap),
            Transition::Stay if !self.backoff.is_off() => self.adjust(round),
            Transition::Stay | Transition::Off => {}
        }
    }

    fn decide(&mut self) -> Decision {
        if self.backoff.is_off() {
            self.backoff.decision_while_off()
        } else {
            Decision::draft(self.max_draft_len)
        }
    }
}

impl Heuristic {
    /// Grows K after a fully accepted draft and shrinks it after a rejection.
    fn adjust(&mut self, round: &RoundRecord) {
        let drafted = round.n_drafted();
        if drafted == 0 {
            return;
        }
        self.max_draft_len = if round.n_accepted >= drafted {
            self.max_draft_len.saturating_add(self.up).min(self.cap)
        } else {
            self.max_draft_len
                .saturating_sub(self.down)
                .max(MIN_K)
                .min(self.cap)
        };
    }
}

export_policy!(Heuristic);

#[cfg(test)]
mod tests {
    use spechost_sdk::testing::{
        PolicyHarness, drafted_round, facts, plain_round, policy_setup, shadow_round,
    };

    use super::*;

    /// The host's `--draft-max` in most tests.
    const CAP: u32 = 16;

    fn heuristic(config: &str, cap: u32) -> PolicyHarness<Heuristic> {
        PolicyHarness::new(config, facts(100), policy_setup(cap)).expect("valid config")
    }

    /// Feeds `rounds` and returns the decision after each.
    fn after_each(harness: &mut PolicyHarness<Heuristic>, rounds: &[RoundRecord]) -> Vec<u32> {
        rounds
            .iter()
            .map(|round| {
                harness.observe(round);
                harness.decide().max_draft_len
            })
            .collect()
    }

    #[test]
    fn starts_at_k() {
        assert_eq!(heuristic("", CAP).decide(), Decision::draft(8));
        assert_eq!(heuristic("k=3", CAP).decide(), Decision::draft(3));
    }

    #[test]
    fn full_acceptance_adds_two_up_to_the_cap() {
        let mut harness = heuristic("", CAP);
        let lengths = harness
            .run(6, |decision| {
                drafted_round(decision.max_draft_len, decision.max_draft_len)
            })
            .iter()
            .map(|decision| decision.max_draft_len)
            .collect::<Vec<_>>();
        assert_eq!(lengths, [8, 10, 12, 14, 16, 16]);
    }

    #[test]
    fn a_rejection_takes_one_off_down_to_one() {
        let mut harness = heuristic("k=3,off=0", CAP);
        let lengths = after_each(
            &mut harness,
            &[
                drafted_round(3, 2),
                drafted_round(2, 0),
                drafted_round(1, 0),
            ],
        );
        assert_eq!(lengths, [2, 1, 1]);
    }

    #[test]
    fn rounds_without_a_draft_leave_k_alone() {
        let mut harness = heuristic("", CAP);
        assert_eq!(
            after_each(&mut harness, &[plain_round(), plain_round()]),
            [8, 8]
        );
    }

    #[test]
    fn custom_steps() {
        let mut harness = heuristic("k=4,up=3,down=2", CAP);
        let lengths = after_each(
            &mut harness,
            &[
                drafted_round(4, 4),
                drafted_round(7, 6),
                drafted_round(5, 5),
            ],
        );
        assert_eq!(lengths, [7, 5, 8]);
    }

    #[test]
    fn sustained_low_acceptance_switches_off_then_shadows_bring_it_back_at_one() {
        let mut harness = heuristic("", CAP);
        // 8 rejected drafts of 8, 7, .., 1 tokens: 36 tokens, then more ones up to 64.
        let mut decisions = Vec::new();
        for _ in 0..40 {
            let decision = harness.decide();
            decisions.push(decision.max_draft_len);
            if decision.max_draft_len == 0 {
                break;
            }
            harness.observe(&drafted_round(decision.max_draft_len, 0));
        }
        assert_eq!(decisions[..9], [8, 7, 6, 5, 4, 3, 2, 1, 1]);
        // 36 tokens in the first 8 rounds, then 28 rounds of 1: 64 tokens after 36 rounds.
        assert_eq!(decisions.len(), 37, "{decisions:?}");
        assert_eq!(harness.decide(), Decision::skip(8));
        for _ in 0..7 {
            harness.observe(&shadow_round(8, 8));
            assert_eq!(harness.decide(), Decision::skip(8), "evidence not full yet");
        }
        harness.observe(&shadow_round(8, 8));
        assert_eq!(harness.decide(), Decision::draft(1), "resumed at K = 1");
    }

    #[test]
    fn every_k_is_capped_at_the_hosts_maximum() {
        let mut harness = heuristic("k=12", 5);
        assert_eq!(harness.decide(), Decision::draft(5));
        assert_eq!(after_each(&mut harness, &[drafted_round(5, 5)]), [5]);
        let mut harness = heuristic("", 0);
        assert_eq!(harness.decide(), Decision::skip(0));
        assert_eq!(after_each(&mut harness, &[plain_round()]), [0]);
    }

    #[test]
    fn never_asks_for_text_or_reorders() {
        let mut harness = heuristic("", CAP);
        assert!(!harness.wants_text());
        assert_eq!(harness.decide().order, None);
    }

    #[test]
    fn rejects_bad_settings_naming_the_key() {
        for (config, expected) in [
            ("k=0", "`k` is 0"),
            ("up=-1", "`up`"),
            ("down=x", "`down`"),
            ("off=0.9", "`resume` (0.6) is below `off` (0.9)"),
            ("window=96", "unknown setting `window`"),
        ] {
            let error =
                PolicyHarness::<Heuristic>::new(config, facts(100), policy_setup(CAP)).unwrap_err();
            assert!(error.contains(expected), "{config}: {error}");
        }
    }
}
