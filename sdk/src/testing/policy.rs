//! [`PolicyHarness`]: drives a [`Policy`] with scripted round records, and helpers to write them.
//!
//! ```
//! use spechost_sdk::testing::{PolicyHarness, drafted_round, facts, policy_setup};
//! use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord};
//!
//! /// Drafts one token more after a fully accepted round, else one token.
//! struct Greedy {
//!     next: u32,
//! }
//!
//! impl Policy for Greedy {
//!     fn new(_config: &str, _facts: &ModelFacts, _setup: &PolicySetup) -> Result<Self, String> {
//!         Ok(Greedy { next: 1 })
//!     }
//!     fn observe(&mut self, round: &RoundRecord) {
//!         let all_accepted = round.n_drafted() > 0 && round.n_accepted == round.n_drafted();
//!         self.next = if all_accepted { self.next + 1 } else { 1 };
//!     }
//!     fn decide(&mut self) -> Decision {
//!         Decision::draft(self.next)
//!     }
//! }
//!
//! let mut harness = PolicyHarness::<Greedy>::new("", facts(100), policy_setup(3)).unwrap();
//! // A target that accepts every drafted token: the policy climbs past the host's cap of 3,
//! // which the host (and the harness) cut.
//! let decisions = harness.run(4, |decision| {
//!     drafted_round(decision.max_draft_len, decision.max_draft_len)
//! });
//! let asked: Vec<u32> = decisions.iter().map(|decision| decision.max_draft_len).collect();
//! assert_eq!(asked, [1, 2, 3, 4]);
//! ```

use std::any::type_name;
use std::fmt;

use crate::policy::Policy;
use crate::records::{Decision, ModelFacts, PolicySetup, RoundRecord, SourceRound};

/// The name of the one source in [`policy_setup`] and in the records the helpers build.
pub const TEST_SOURCE: &str = "test";

/// A setup for tests: one source, [`TEST_SOURCE`], a draft length cap of `max_draft_len`, and no
/// measured verify times.
pub fn policy_setup(max_draft_len: u32) -> PolicySetup {
    PolicySetup {
        sources: vec![TEST_SOURCE.to_owned()],
        max_draft_len,
        ..PolicySetup::default()
    }
}

/// A round in which [`TEST_SOURCE`] drafted `drafted` tokens (what the policy asked for) and the
/// target accepted the first `accepted`; no time measured.
///
/// With `drafted` 0 the source had nothing and the round decoded one token plainly. Change other
/// fields with struct update syntax: `RoundRecord { verify_us: 900, ..drafted_round(4, 2) }`.
///
/// # Panics
///
/// If `accepted > drafted`.
pub fn drafted_round(drafted: u32, accepted: u32) -> RoundRecord {
    assert!(
        accepted <= drafted,
        "a round cannot accept {accepted} of {drafted} drafted tokens; pass accepted <= drafted"
    );
    RoundRecord {
        max_draft_len: drafted,
        sources: vec![SourceRound {
            source: TEST_SOURCE.to_owned(),
            drafted,
            accepted,
            won: drafted > 0,
            ..SourceRound::default()
        }],
        n_verified: drafted + 1,
        n_accepted: accepted,
        ..RoundRecord::default()
    }
}

/// A round a server's verify step cut: [`TEST_SOURCE`] proposed `proposed` tokens, all of them
/// the target's, but the step verified only the first `verified` beside the `others` tokens
/// of other requests' rounds (each committing one), so the round committed `verified + 1`. As
/// the host reports it: the proposal's tokens past the cut are compared with the committed ones
/// (the next one matched, the rest never compared: censored), and a proposal cut to nothing did
/// not win.
///
/// # Panics
///
/// If `verified >= proposed` (nothing was cut) or `others` is 0 (a round alone is never cut).
pub fn cut_round(proposed: u32, verified: u32, others: u32) -> RoundRecord {
    assert!(
        verified < proposed,
        "a cut verifies fewer than the {proposed} tokens proposed; pass verified < proposed"
    );
    assert!(
        others > 0,
        "a round verified alone is never cut; pass others > 0"
    );
    let matched = verified + 1;
    RoundRecord {
        max_draft_len: proposed,
        sources: vec![SourceRound {
            source: TEST_SOURCE.to_owned(),
            drafted: proposed,
            accepted: matched,
            won: verified > 0,
            censored: matched < proposed,
            ..SourceRound::default()
        }],
        n_verified: verified + 1,
        n_accepted: verified,
        batch_verified: verified + 1 + others,
        batch_committed: verified + 1 + others,
        ..RoundRecord::default()
    }
}

/// A round decoded without speculation (the policy asked for 0 tokens), settling nothing.
pub fn plain_round() -> RoundRecord {
    drafted_round(0, 0)
}

/// A round decoded without speculation in which a shadow proposal of [`TEST_SOURCE`] was
/// settled: `drafted` tokens, of which the first `accepted` matched the committed tokens.
///
/// The result is exact (not [`SourceRound::censored`]); set
/// `record.sources[0].censored = true` for a lower bound.
///
/// # Panics
///
/// If `accepted > drafted`.
pub fn shadow_round(drafted: u32, accepted: u32) -> RoundRecord {
    assert!(
        accepted <= drafted,
        "a shadow proposal cannot match {accepted} of {drafted} tokens; pass accepted <= drafted"
    );
    RoundRecord {
        sources: vec![SourceRound {
            source: TEST_SOURCE.to_owned(),
            drafted,
            accepted,
            shadow: true,
            ..SourceRound::default()
        }],
        n_verified: 1,
        ..RoundRecord::default()
    }
}

/// Checks that `round` is a record the host could send, naming the first rule it breaks.
fn check_record(round: &RoundRecord) -> Result<(), String> {
    if round.n_verified == 0 {
        return Err(
            "n_verified is 0, but every round verifies at least the target's own \
                    token; set n_verified = drafted + 1"
                .to_owned(),
        );
    }
    if round.batch_verified != 0 && round.batch_verified < round.n_verified {
        return Err(format!(
            "batch_verified is {} but the round alone verified {} tokens; set it to 0 (alone) or \
                    to n_verified plus the other requests' tokens",
            round.batch_verified, round.n_verified
        ));
    }
    if round.n_accepted > round.n_drafted() {
        return Err(format!(
            "n_accepted is {} but only {} tokens were drafted (n_verified {} - 1)",
            round.n_accepted,
            round.n_drafted(),
            round.n_verified
        ));
    }
    for source in &round.sources {
        if source.accepted > source.drafted {
            return Err(format!(
                "source `{}` accepted {} of {} drafted tokens",
                source.source, source.accepted, source.drafted
            ));
        }
        if source.won && source.shadow {
            return Err(format!(
                "source `{}` is both the winner and a shadow proposal; shadow proposals are \
                 never verified",
                source.source
            ));
        }
        if source.won && source.censored && source.drafted <= round.n_drafted() {
            return Err(format!(
                "source `{}` won but is censored; only unverified proposals (or the tokens a \
                 server's step cut off the winner's) are censored",
                source.source
            ));
        }
    }
    let winners: Vec<&SourceRound> = round.sources.iter().filter(|source| source.won).collect();
    match winners[..] {
        [] if round.n_drafted() > 0 => Err(format!(
            "{} tokens were drafted but no source won; mark the drafting source `won`",
            round.n_drafted()
        )),
        // A server's step may verify only the winner's first tokens beside other requests'
        // rounds; the rest are compared with the committed tokens.
        [winner]
            if winner.drafted > round.n_drafted()
                && round.others_verified() > 0
                && winner.accepted >= round.n_accepted =>
        {
            Ok(())
        }
        [winner] if winner.drafted != round.n_drafted() || winner.accepted != round.n_accepted => {
            Err(format!(
                "the winner `{}` drafted {} and got {} accepted, but the round verified {} \
                 drafted tokens and accepted {}; they must agree",
                winner.source,
                winner.drafted,
                winner.accepted,
                round.n_drafted(),
                round.n_accepted
            ))
        }
        [_, _, ..] => Err(format!(
            "{} sources won; at most one proposal is verified per round",
            winners.len()
        )),
        _ => Ok(()),
    }
}

/// One policy session, driven natively the way the host drives it.
///
/// Calls are passed straight to the policy, except that [`PolicyHarness::observe`] checks that
/// the test's record is one the host could send, and [`PolicyHarness::run`] cuts decisions to
/// the setup's cap as the host does.
pub struct PolicyHarness<P: Policy> {
    policy: P,
    facts: ModelFacts,
    setup: PolicySetup,
}

// By hand, so that `PolicyHarness::new(..).unwrap_err()` works for policies without `Debug`.
impl<P: Policy> fmt::Debug for PolicyHarness<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyHarness")
            .field("policy", &type_name::<P>())
            .field("facts", &self.facts)
            .field("setup", &self.setup)
            .finish()
    }
}

impl<P: Policy> PolicyHarness<P> {
    /// Opens a policy with `config`, `facts` and `setup`, as the host does for each request.
    ///
    /// Returns the policy's own error when [`Policy::new`] rejects the config.
    pub fn new(config: &str, facts: ModelFacts, setup: PolicySetup) -> Result<Self, String> {
        let policy = P::new(config, &facts, &setup)?;
        Ok(Self {
            policy,
            facts,
            setup,
        })
    }

    /// The model facts the policy was opened with.
    pub fn facts(&self) -> &ModelFacts {
        &self.facts
    }

    /// The setup the policy was opened with.
    pub fn setup(&self) -> &PolicySetup {
        &self.setup
    }

    /// The policy, to inspect its state in assertions.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The policy, mutably.
    pub fn policy_mut(&mut self) -> &mut P {
        &mut self.policy
    }

    /// Whether the policy wants committed text ([`Policy::wants_text`]).
    pub fn wants_text(&self) -> bool {
        self.policy.wants_text()
    }

    /// Asks the policy for the next round's decision ([`Policy::decide`]), as it returned it
    /// (not cut to the setup's cap).
    pub fn decide(&mut self) -> Decision {
        self.policy.decide()
    }

    /// Records a finished round ([`Policy::observe`]).
    ///
    /// # Panics
    ///
    /// If `round` is not a record the host could send (more accepted than drafted tokens, two
    /// winners, a winner that disagrees with the round's counts, ...): the test is wrong.
    pub fn observe(&mut self, round: &RoundRecord) {
        if let Err(error) = check_record(round) {
            panic!("the test's round record is inconsistent: {error} (record: {round:?})");
        }
        self.policy.observe(round);
    }

    /// Runs `rounds` rounds against a simulated target and returns the policy's decisions.
    ///
    /// Each round asks [`PolicyHarness::decide`], cuts the decision's `max_draft_len` to the
    /// setup's cap as the host does, hands that to `target`, which returns the round's record,
    /// and passes the record to [`PolicyHarness::observe`]. The decisions come back uncut.
    pub fn run(
        &mut self,
        rounds: usize,
        mut target: impl FnMut(&Decision) -> RoundRecord,
    ) -> Vec<Decision> {
        (0..rounds)
            .map(|_| {
                let decision = self.decide();
                let applied = Decision {
                    max_draft_len: decision.max_draft_len.min(self.setup.max_draft_len),
                    ..decision.clone()
                };
                let round = target(&applied);
                self.observe(&round);
                decision
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::testing::facts;

    /// Drafts a configured length and remembers what it observed.
    struct Recorder {
        max_draft_len: u32,
        seen: Vec<RoundRecord>,
    }

    impl Policy for Recorder {
        fn new(config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
            let config = Config::parse(config)?;
            let max_draft_len = config.get_u32("k", setup.max_draft_len)?;
            config.finish()?;
            Ok(Recorder {
                max_draft_len,
                seen: Vec::new(),
            })
        }

        fn observe(&mut self, round: &RoundRecord) {
            self.seen.push(round.clone());
        }

        fn decide(&mut self) -> Decision {
            Decision::draft(self.max_draft_len)
        }
    }

    fn recorder(config: &str, max_draft_len: u32) -> PolicyHarness<Recorder> {
        PolicyHarness::new(config, facts(100), policy_setup(max_draft_len)).expect("valid config")
    }

    #[test]
    fn new_returns_the_policys_config_error() {
        let error = PolicyHarness::<Recorder>::new("k=x", facts(100), policy_setup(4)).unwrap_err();
        assert!(error.contains("`k`"), "{error}");
    }

    #[test]
    fn wants_text_defaults_to_false() {
        assert!(!recorder("", 4).wants_text());
    }

    #[test]
    fn run_cuts_decisions_to_the_cap_but_returns_them_uncut() {
        let mut harness = recorder("k=9", 4);
        let mut applied = Vec::new();
        let decisions = harness.run(2, |decision| {
            applied.push(decision.max_draft_len);
            drafted_round(decision.max_draft_len, 1)
        });
        assert_eq!(applied, [4, 4]);
        assert_eq!(decisions, [Decision::draft(9), Decision::draft(9)]);
        assert_eq!(harness.policy().seen.len(), 2);
        assert_eq!(harness.policy().seen[0], drafted_round(4, 1));
    }

    #[test]
    fn record_helpers_build_consistent_records() {
        for round in [
            drafted_round(5, 3),
            drafted_round(0, 0),
            plain_round(),
            shadow_round(8, 2),
        ] {
            assert_eq!(check_record(&round), Ok(()), "{round:?}");
        }
        let round = drafted_round(5, 3);
        assert_eq!((round.n_verified, round.n_accepted), (6, 3));
        assert_eq!(round.winner().map(|source| source.accepted), Some(3));
        let shadow = shadow_round(8, 2);
        assert_eq!(shadow.shadows().count(), 1);
        assert_eq!((shadow.max_draft_len, shadow.n_verified), (0, 1));
    }

    #[test]
    fn rejects_inconsistent_records() {
        let mut two_winners = drafted_round(3, 1);
        two_winners.sources.push(two_winners.sources[0].clone());
        let mut shadow_winner = drafted_round(3, 1);
        shadow_winner.sources[0].shadow = true;
        let cases = [
            (
                RoundRecord {
                    n_verified: 0,
                    ..plain_round()
                },
                "n_verified is 0",
            ),
            (
                RoundRecord {
                    n_accepted: 4,
                    ..drafted_round(3, 1)
                },
                "n_accepted is 4",
            ),
            (
                RoundRecord {
                    n_verified: 3,
                    ..drafted_round(3, 1)
                },
                "must agree",
            ),
            (
                RoundRecord {
                    sources: Vec::new(),
                    ..drafted_round(3, 1)
                },
                "no source won",
            ),
            (two_winners, "2 sources won"),
            (shadow_winner, "both the winner and a shadow"),
        ];
        for (round, expected) in cases {
            let error = check_record(&round).unwrap_err();
            assert!(error.contains(expected), "{error} for {round:?}");
        }
    }

    #[test]
    #[should_panic(expected = "the test's round record is inconsistent")]
    fn observe_panics_on_an_inconsistent_record() {
        recorder("", 4).observe(&RoundRecord::default());
    }

    #[test]
    #[should_panic(expected = "cannot accept 3 of 2")]
    fn drafted_round_panics_when_accepting_more_than_drafted() {
        drafted_round(2, 3);
    }
}
