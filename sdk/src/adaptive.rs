//! Building blocks for adaptive draft-length policies: a rolling acceptance rate and a back-off
//! that turns speculation off when it does not pay.
//!
//! Speculation costs a verify batch larger than one token every round; when little of the draft
//! is accepted, a round commits about one token at a higher cost than plain decoding. A
//! [`Backoff`] keeps a policy from getting stuck there: it watches the acceptance of verified
//! drafts, switches speculation off (K = 0, plain decoding) when it falls below a threshold, asks
//! for shadow drafts while off to see whether speculating would pay again, and switches back on
//! when they say so.
//!
//! # The back-off state machine
//!
//! ```text
//!            acceptance of the last `evidence` drafted tokens < `off`
//!      ┌────┐ ─────────────────────────────────────────────────────────▶ ┌─────┐
//!      │ ON │                                                            │ OFF │
//!      └────┘ ◀───────────────────────────────────────────────────────── └─────┘
//!        shadow acceptance over the last `evidence` shadow tokens ≥ `resume`,
//!        or a probe: `probe_after` rounds off without any shadow result
//! ```
//!
//! * **ON**: the policy chooses K. Every round that verified a draft adds its drafted and
//!   accepted counts to a rolling window of the last `evidence` drafted tokens; once the window
//!   is full and its acceptance is below `off`, the back-off turns OFF.
//! * **OFF**: every decision is [`Decision::skip`] with `shadow_len` shadow tokens. Settled
//!   shadow proposals go into a fresh window of the same size; once it is full and its
//!   acceptance is at least `resume`, the back-off turns ON again ([`Transition::On`]) and the
//!   policy restarts from its smallest K. A censored shadow result counts only its compared,
//!   matched tokens (its tail was never compared).
//! * **Probes**: the host shadow-drafts only with cheap sources, so a cascade of expensive ones
//!   (a draft model) sends no shadow results. After `probe_after` rounds OFF without any, the
//!   back-off turns ON as a probe. A probe that is switched off again before it has filled its
//!   window doubles the wait before the next probe (up to 16 times `probe_after`); a probe that
//!   survives a full window, or a resume through shadow results, resets it.
//!
//! The worst case is bounded: while OFF the rounds are plain decoding, and each ON period that
//! does not pay lasts about `evidence` drafted tokens.

use std::collections::VecDeque;

use crate::config::Config;
use crate::records::{Decision, RoundRecord, SourceRound};

/// The acceptance rate of the most recent drafted tokens.
///
/// Holds whole rounds: the fewest most recent ones that together drafted at least `capacity`
/// tokens (all of them while fewer were drafted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollingAcceptance {
    capacity: u64,
    rounds: VecDeque<(u32, u32)>,
    drafted: u64,
    accepted: u64,
}

impl RollingAcceptance {
    /// An empty window over the last `capacity` drafted tokens (at least 1).
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: u64::from(capacity.max(1)),
            rounds: VecDeque::new(),
            drafted: 0,
            accepted: 0,
        }
    }

    /// Adds a round that drafted `drafted` tokens, of which `accepted` were accepted (cut to
    /// `drafted`), dropping the oldest rounds no longer needed to cover the capacity. A round
    /// that drafted nothing is ignored.
    pub fn push(&mut self, drafted: u32, accepted: u32) {
        if drafted == 0 {
            return;
        }
        let accepted = accepted.min(drafted);
        self.rounds.push_back((drafted, accepted));
        self.drafted += u64::from(drafted);
        self.accepted += u64::from(accepted);
        while let Some(&(oldest_drafted, oldest_accepted)) = self.rounds.front() {
            if self.drafted - u64::from(oldest_drafted) < self.capacity {
                break;
            }
            self.rounds.pop_front();
            self.drafted -= u64::from(oldest_drafted);
            self.accepted -= u64::from(oldest_accepted);
        }
    }

    /// Empties the window.
    pub fn clear(&mut self) {
        self.rounds.clear();
        self.drafted = 0;
        self.accepted = 0;
    }

    /// Drafted tokens in the window.
    pub fn drafted(&self) -> u64 {
        self.drafted
    }

    /// Accepted tokens in the window.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Whether the window holds at least `capacity` drafted tokens.
    pub fn is_full(&self) -> bool {
        self.drafted >= self.capacity
    }

    /// Accepted over drafted tokens, or `None` when nothing was drafted.
    pub fn rate(&self) -> Option<f32> {
        // Counts stay far below 2^24, where f32 would lose integer precision; a rate is all
        // that is needed anyway.
        (self.drafted > 0).then(|| self.accepted as f32 / self.drafted as f32)
    }
}

/// The knobs of a [`Backoff`] (see the module docs for what each does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffSettings {
    /// Turn OFF when the acceptance of the last `evidence` drafted tokens is below this; 0
    /// never turns off.
    pub off: f32,
    /// Turn back ON when the acceptance of the last `evidence` shadow tokens is at least this.
    pub resume: f32,
    /// Drafted (or shadow) tokens that must be measured before switching either way.
    pub evidence: u32,
    /// Shadow tokens asked for each round while OFF; 0 asks for none, leaving only probes.
    pub shadow_len: u32,
    /// Rounds OFF without any shadow result before a probe turns speculation back ON.
    pub probe_after: u32,
}

/// Largest factor by which failed probes stretch the wait before the next one.
const MAX_PROBE_BACKOFF: u32 = 16;

impl BackoffSettings {
    /// Reads the settings from a policy's config: keys `off`, `resume` (fractions in `[0, 1]`),
    /// `evidence`, `shadow_len` and `probe_after` (integers), each defaulting to the field of
    /// `defaults`. It reads them through the getters, so [`Config::finish`] then knows them.
    ///
    /// Fails, naming the key and the fix, on a bad value, on `resume` below `off` (the
    /// back-off would switch back on at an acceptance it switches off at), on `evidence` or
    /// `probe_after` of 0.
    pub fn from_config(config: &Config, defaults: BackoffSettings) -> Result<Self, String> {
        let settings = BackoffSettings {
            off: config.get_fraction("off", defaults.off)?,
            resume: config.get_fraction("resume", defaults.resume)?,
            evidence: config.get_u32("evidence", defaults.evidence)?,
            shadow_len: config.get_u32("shadow_len", defaults.shadow_len)?,
            probe_after: config.get_u32("probe_after", defaults.probe_after)?,
        };
        if settings.resume < settings.off {
            return Err(format!(
                "setting `resume` ({}) is below `off` ({}); speculation would switch back on at \
                 an acceptance it switches off at: raise `resume` or lower `off`",
                settings.resume, settings.off
            ));
        }
        for (key, value) in [
            ("evidence", settings.evidence),
            ("probe_after", settings.probe_after),
        ] {
            if value == 0 {
                return Err(format!("setting `{key}` is 0; give at least 1"));
            }
        }
        Ok(settings)
    }
}

/// What a [`Backoff`] did with a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changed.
    Stay,
    /// Speculation was just turned off: decide [`Backoff::decision_while_off`] until it is on.
    Off,
    /// Speculation was just turned back on (shadow drafts recovered, or a probe): restart from
    /// the policy's smallest draft length, with fresh measurements.
    On,
}

/// Whether speculation is on or off, and the measurements that decide when to switch.
#[derive(Debug, Clone, PartialEq)]
enum State {
    On {
        drafted: RollingAcceptance,
        probing: bool,
    },
    Off {
        shadows: RollingAcceptance,
        rounds_without_shadows: u32,
    },
}

/// Turns speculation off when it does not pay and back on when shadow drafts say it would.
///
/// Feed it every round with [`Backoff::observe`]; while [`Backoff::is_off`], decide
/// [`Backoff::decision_while_off`].
///
/// ```
/// use spechost_sdk::adaptive::{Backoff, BackoffSettings, Transition};
/// use spechost_sdk::testing::{drafted_round, shadow_round};
///
/// let settings = BackoffSettings { off: 0.3, resume: 0.6, evidence: 8, shadow_len: 4, probe_after: 50 };
/// let mut backoff = Backoff::new(settings);
/// assert_eq!(backoff.observe(&drafted_round(4, 1)), Transition::Stay); // 4 tokens: too few
/// assert_eq!(backoff.observe(&drafted_round(4, 0)), Transition::Off); // 1 of 8 < 0.3
/// assert_eq!(backoff.decision_while_off().shadow_len, 4);
/// assert_eq!(backoff.observe(&shadow_round(4, 4)), Transition::Stay);
/// assert_eq!(backoff.observe(&shadow_round(4, 3)), Transition::On); // 7 of 8 >= 0.6
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    settings: BackoffSettings,
    state: State,
    /// Rounds OFF without shadow results before the next probe: `probe_after`, doubled by each
    /// failed probe.
    probe_wait: u32,
}

impl Backoff {
    /// A back-off that starts ON.
    pub fn new(settings: BackoffSettings) -> Self {
        Self {
            state: State::On {
                drafted: RollingAcceptance::new(settings.evidence),
                probing: false,
            },
            probe_wait: settings.probe_after.max(1),
            settings,
        }
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &BackoffSettings {
        &self.settings
    }

    /// Whether speculation is off.
    pub fn is_off(&self) -> bool {
        matches!(self.state, State::Off { .. })
    }

    /// The decision for every round while off: no draft, `shadow_len` shadow tokens.
    pub fn decision_while_off(&self) -> Decision {
        Decision::skip(self.settings.shadow_len)
    }

    /// Learns from a finished round and says whether speculation was switched.
    pub fn observe(&mut self, round: &RoundRecord) -> Transition {
        match &mut self.state {
            State::On { drafted, probing } => {
                drafted.push(round.n_drafted(), round.n_accepted);
                if !drafted.is_full() {
                    return Transition::Stay;
                }
                let rate = drafted.rate().unwrap_or(0.0);
                if rate >= self.settings.off {
                    if std::mem::take(probing) {
                        self.probe_wait = self.settings.probe_after.max(1);
                    }
                    return Transition::Stay;
                }
                if *probing {
                    let longest = self.settings.probe_after.saturating_mul(MAX_PROBE_BACKOFF);
                    self.probe_wait = self.probe_wait.saturating_mul(2).min(longest.max(1));
                }
                self.state = State::Off {
                    shadows: RollingAcceptance::new(self.settings.evidence),
                    rounds_without_shadows: 0,
                };
                Transition::Off
            }
            State::Off {
                shadows,
                rounds_without_shadows,
            } => {
                let mut settled = false;
                for shadow in round.shadows() {
                    let (drafted, accepted) = compared(shadow);
                    shadows.push(drafted, accepted);
                    settled = true;
                }
                let recovered =
                    shadows.is_full() && shadows.rate().unwrap_or(0.0) >= self.settings.resume;
                *rounds_without_shadows = if settled {
                    0
                } else {
                    rounds_without_shadows.saturating_add(1)
                };
                let probe = *rounds_without_shadows >= self.probe_wait;
                if !recovered && !probe {
                    return Transition::Stay;
                }
                if recovered {
                    self.probe_wait = self.settings.probe_after.max(1);
                }
                self.state = State::On {
                    drafted: RollingAcceptance::new(self.settings.evidence),
                    probing: !recovered,
                };
                Transition::On
            }
        }
    }
}

/// The tokens of an unverified proposal that were compared with the target's, and how many of
/// them matched: all of it when exact, only the matched prefix when censored (its tail was
/// never compared).
fn compared(source: &SourceRound) -> (u32, u32) {
    if source.censored {
        (source.accepted, source.accepted)
    } else {
        (source.drafted, source.accepted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{drafted_round, plain_round, shadow_round};

    const SETTINGS: BackoffSettings = BackoffSettings {
        off: 0.3,
        resume: 0.6,
        evidence: 16,
        shadow_len: 8,
        probe_after: 10,
    };

    #[test]
    fn rolling_window_keeps_the_fewest_recent_rounds_covering_its_capacity() {
        let mut window = RollingAcceptance::new(10);
        assert_eq!(window.rate(), None);
        window.push(6, 6);
        window.push(0, 0);
        assert!(!window.is_full(), "6 of 10 tokens");
        window.push(6, 0);
        assert!(window.is_full());
        assert_eq!((window.drafted(), window.accepted()), (12, 6));
        window.push(4, 4);
        // The first round is no longer needed: 6 + 4 = 10 covers the capacity.
        assert_eq!((window.drafted(), window.accepted()), (10, 4));
        assert_eq!(window.rate(), Some(0.4));
        window.push(3, 9);
        assert_eq!(window.accepted(), 7, "accepted is cut to drafted");
        window.clear();
        assert_eq!((window.drafted(), window.rate()), (0, None));
    }

    #[test]
    fn stays_on_until_enough_tokens_are_measured() {
        let mut backoff = Backoff::new(SETTINGS);
        for _ in 0..3 {
            assert_eq!(backoff.observe(&drafted_round(4, 0)), Transition::Stay);
        }
        assert_eq!(backoff.observe(&plain_round()), Transition::Stay);
        assert!(!backoff.is_off(), "12 of 16 tokens measured");
        assert_eq!(backoff.observe(&drafted_round(4, 0)), Transition::Off);
        assert!(backoff.is_off());
        assert_eq!(backoff.decision_while_off(), Decision::skip(8));
    }

    #[test]
    fn stays_on_at_acceptance_at_or_above_off() {
        let mut backoff = Backoff::new(SETTINGS);
        // 5 of 16 = 0.3125, then windows of 0.3 or more.
        for round in [
            drafted_round(8, 2),
            drafted_round(8, 3),
            drafted_round(8, 3),
        ] {
            assert_eq!(backoff.observe(&round), Transition::Stay, "{round:?}");
        }
        assert!(!backoff.is_off());
    }

    #[test]
    fn off_zero_never_turns_off() {
        let mut backoff = Backoff::new(BackoffSettings {
            off: 0.0,
            ..SETTINGS
        });
        for _ in 0..20 {
            assert_eq!(backoff.observe(&drafted_round(8, 0)), Transition::Stay);
        }
    }

    fn switched_off() -> Backoff {
        let mut backoff = Backoff::new(SETTINGS);
        backoff.observe(&drafted_round(16, 0));
        assert!(backoff.is_off(), "{backoff:?}");
        backoff
    }

    #[test]
    fn resumes_when_shadow_acceptance_recovers() {
        let mut backoff = switched_off();
        assert_eq!(backoff.observe(&shadow_round(8, 1)), Transition::Stay);
        assert_eq!(
            backoff.observe(&shadow_round(8, 8)),
            Transition::Stay,
            "9/16"
        );
        assert_eq!(
            backoff.observe(&shadow_round(8, 8)),
            Transition::On,
            "16/16"
        );
        assert!(!backoff.is_off());
    }

    #[test]
    fn stays_off_while_shadows_say_speculation_would_not_pay() {
        let mut backoff = switched_off();
        for _ in 0..100 {
            assert_eq!(backoff.observe(&shadow_round(8, 2)), Transition::Stay);
        }
        assert!(backoff.is_off(), "shadow results keep coming, so no probe");
    }

    #[test]
    fn censored_shadows_count_only_their_compared_tokens() {
        let mut backoff = switched_off();
        let mut censored = shadow_round(8, 3);
        censored.sources[0].censored = true;
        assert_eq!(compared(&censored.sources[0]), (3, 3));
        for _ in 0..5 {
            backoff.observe(&censored);
        }
        // 15 compared tokens, all matched: not yet enough evidence.
        assert!(backoff.is_off());
        assert_eq!(backoff.observe(&censored), Transition::On);
    }

    #[test]
    fn probes_after_rounds_without_shadow_results_and_backs_off_longer_each_time() {
        let mut backoff = switched_off();
        let rounds_until_on = |backoff: &mut Backoff| {
            (1..=1000)
                .find(|_| backoff.observe(&plain_round()) == Transition::On)
                .expect("a probe within 1000 rounds")
        };
        assert_eq!(rounds_until_on(&mut backoff), 10);
        // The probe fails: the wait doubles.
        assert_eq!(backoff.observe(&drafted_round(16, 1)), Transition::Off);
        assert_eq!(rounds_until_on(&mut backoff), 20);
        assert_eq!(backoff.observe(&drafted_round(16, 1)), Transition::Off);
        assert_eq!(rounds_until_on(&mut backoff), 40);
        // This probe pays: the wait is reset.
        assert_eq!(backoff.observe(&drafted_round(16, 12)), Transition::Stay);
        assert_eq!(backoff.observe(&drafted_round(16, 0)), Transition::Off);
        assert_eq!(rounds_until_on(&mut backoff), 10);
    }

    #[test]
    fn probe_wait_stops_growing_at_sixteen_times() {
        let mut backoff = switched_off();
        for _ in 0..10 {
            while backoff.observe(&plain_round()) != Transition::On {}
            backoff.observe(&drafted_round(16, 0));
        }
        assert_eq!(backoff.probe_wait, 160);
    }

    #[test]
    fn settings_read_from_config_with_defaults() {
        let config = Config::parse("off=0.2,shadow_len=4").expect("valid syntax");
        let settings = BackoffSettings::from_config(&config, SETTINGS).expect("valid settings");
        assert_eq!(
            settings,
            BackoffSettings {
                off: 0.2,
                shadow_len: 4,
                ..SETTINGS
            }
        );
        assert_eq!(config.finish(), Ok(()), "every key was read");
    }

    #[test]
    fn settings_reject_bad_values() {
        for (text, expected) in [
            ("off=1.2", "`off`"),
            ("resume=0.2", "`resume` (0.2) is below `off` (0.3)"),
            ("evidence=0", "`evidence` is 0"),
            ("probe_after=0", "`probe_after` is 0"),
            ("shadow_len=-1", "`shadow_len`"),
        ] {
            let config = Config::parse(text).expect("valid syntax");
            let error = BackoffSettings::from_config(&config, SETTINGS).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
