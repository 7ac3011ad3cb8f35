//! `policy-window`: the rolling-acceptance controller from the research spechost grew from.
//!
//! K (the draft length) moves in steps, driven by the acceptance rate of the last `window`
//! drafted tokens, and speculation switches off entirely when it does not pay, so a request is
//! never much slower than plain decoding.
//!
//! # State machine
//!
//! ```text
//!                 ┌──────────────────────── ON ─────────────────────────┐
//!                 │ window full and acceptance ≥ raise: K += step (≤ max_k) │
//!   start: K = k  │ window full and acceptance < lower: K -= step (≥ min_k) │
//!                 │ otherwise K stays; a change empties the window           │
//!                 └──────────────────────────────────────────────────────┘
//!                    │ acceptance of the last `evidence`       ▲ shadow acceptance ≥ resume,
//!                    │ drafted tokens < off                     │ or a probe: K = min_k,
//!                    ▼                                          │ empty window
//!                 ┌──────── OFF: K = 0, shadow drafts of `shadow_len` ───────┐
//!                 └────────────────────────────────────────────────────────┘
//! ```
//!
//! * **ON**: every round that verified a draft adds its drafted and accepted tokens to a rolling
//!   window of the fewest recent rounds covering `window` drafted tokens. Once the window is
//!   full, acceptance of at least `raise` raises K by `step`, acceptance below `lower` lowers it
//!   by `step`, within `[min_k, max_k]`. A change empties the window: acceptance depends on K
//!   (the later positions of a longer draft are accepted less often), so the next change is
//!   decided on tokens drafted at the new K only.
//! * **OFF** (the SDK's [`Backoff`]): when the acceptance of the last `evidence` drafted tokens
//!   (by default the same window) falls below `off`, every round is plain decoding and cheap
//!   sources are asked for shadow drafts of `shadow_len` tokens, compared with what the target
//!   commits. When the shadow acceptance over `evidence` tokens reaches `resume` (by default
//!   `lower`: the acceptance at which K stops falling), speculation resumes at `min_k`. With no
//!   shadow results at all (only expensive sources) it probes after `probe_after` rounds, waiting
//!   twice as long after each probe that fails.
//!
//! All draft lengths are capped at the host's `--draft-max` ([`PolicySetup::max_draft_len`]).
//!
//! # Config
//!
//! | key           | default  | meaning                                                      |
//! |---------------|----------|--------------------------------------------------------------|
//! | `k`           | 8        | first K, in `[min_k, max_k]`                                 |
//! | `step`        | 4        | how much K moves at a time, at least 1                       |
//! | `min_k`       | 4        | smallest K while on, at least 1                              |
//! | `max_k`       | 24       | largest K                                                    |
//! | `window`      | 96       | drafted tokens the acceptance is measured over (64-128 suit) |
//! | `raise`       | 0.8      | raise K at this acceptance or more                           |
//! | `lower`       | 0.6      | lower K below this acceptance                                |
//! | `off`         | 0.3      | switch speculation off below this acceptance; 0 never does   |
//! | `resume`      | `lower`  | switch back on at this shadow acceptance or more             |
//! | `evidence`    | `window` | tokens measured before switching off or on                   |
//! | `shadow_len`  | 8        | shadow tokens asked for each round while off                 |
//! | `probe_after` | 64       | rounds off without shadow results before a probe             |
//!
//! with `lower <= raise` and `off <= resume`.

use spechost_sdk::adaptive::{Backoff, BackoffSettings, RollingAcceptance, Transition};
use spechost_sdk::config::Config;
use spechost_sdk::{Decision, ModelFacts, Policy, PolicySetup, RoundRecord, export_policy};

/// Default first K.
const DEFAULT_K: u32 = 8;
/// Default step by which K moves.
const DEFAULT_STEP: u32 = 4;
/// Default smallest K while speculation is on.
const DEFAULT_MIN_K: u32 = 4;
/// Default largest K.
const DEFAULT_MAX_K: u32 = 24;
/// Default window, in drafted tokens.
const DEFAULT_WINDOW: u32 = 96;
/// Default acceptance at or above which K rises.
const DEFAULT_RAISE: f32 = 0.8;
/// Default acceptance below which K falls.
const DEFAULT_LOWER: f32 = 0.6;
/// Default acceptance below which speculation switches off.
const DEFAULT_OFF: f32 = 0.3;
/// Default shadow draft length while off.
const DEFAULT_SHADOW_LEN: u32 = 8;
/// Default rounds off without shadow results before a probe.
const DEFAULT_PROBE_AFTER: u32 = 64;

/// The rolling-acceptance controller for one request.
#[derive(Debug)]
pub struct Window {
    /// Current K while speculation is on.
    max_draft_len: u32,
    step: u32,
    min_k: u32,
    max_k: u32,
    raise: f32,
    lower: f32,
    window: RollingAcceptance,
    backoff: Backoff,
}

impl Policy for Window {
    fn new(config: &str, _facts: &ModelFacts, setup: &PolicySetup) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let k = config.get_u32("k", DEFAULT_K)?;
        let step = config.get_u32("step", DEFAULT_STEP)?;
        let min_k = config.get_u32("min_k", DEFAULT_MIN_K)?;
        let max_k = config.get_u32("max_k", DEFAULT_MAX_K)?;
        let window = config.get_u32("window", DEFAULT_WINDOW)?;
        let raise = config.get_fraction("raise", DEFAULT_RAISE)?;
        let lower = config.get_fraction("lower", DEFAULT_LOWER)?;
        // Before the back-off's settings, whose defaults `window` and `lower` are.
        check_settings(k, step, min_k, max_k, window, raise, lower)?;
        let backoff = BackoffSettings::from_config(
            &config,
            BackoffSettings {
                off: DEFAULT_OFF,
                resume: lower,
                evidence: window,
                shadow_len: DEFAULT_SHADOW_LEN,
                probe_after: DEFAULT_PROBE_AFTER,
            },
        )?;
        config.finish()?;
        let cap = setup.max_draft_len;
        Ok(Window {
            max_draft_len: k.min(cap),
            step,
            min_k: min_k.min(cap),
            max_k: max_k.min(cap),
            raise,
            lower,
            window: RollingAcceptance::new(window),
            backoff: Backoff::new(backoff),
        })
    }

    fn observe(&mut self, round: &RoundRecord) {
        match self.backoff.observe(round) {
            Transition::Off => self.window.clear(),
            Transition::On => {
                self.max_draft_len = self.min_k;
                self.window.clear();
            }
            Transition::Stay if !self.backoff.is_off() => self.adjust(round),
            Transition::Stay => {}
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

impl Window {
    /// Adds a round to the window and moves K when the full window says so.
    fn adjust(&mut self, round: &RoundRecord) {
        self.window.push(round.n_drafted(), round.n_accepted);
        if !self.window.is_full() {
            return;
        }
        let rate = self.window.rate().unwrap_or(0.0);
        let next = if rate >= self.raise {
            self.max_draft_len.saturating_add(self.step).min(self.max_k)
        } else if rate < self.lower {
            self.max_draft_len.saturating_sub(self.step).max(self.min_k)
        } else {
            self.max_draft_len
        };
        if next != self.max_draft_len {
            self.max_draft_len = next;
            self.window.clear();
        }
    }
}

/// Checks the settings that depend on each other; every message names the key and the fix.
fn check_settings(
    k: u32,
    step: u32,
    min_k: u32,
    max_k: u32,
    window: u32,
    raise: f32,
    lower: f32,
) -> Result<(), String> {
    if min_k == 0 {
        return Err(
            "setting `min_k` is 0; give at least 1 (speculation switches off through `off`)"
                .to_owned(),
        );
    }
    if min_k > max_k {
        return Err(format!(
            "setting `min_k` ({min_k}) is above `max_k` ({max_k}); give min_k <= max_k"
        ));
    }
    if !(min_k..=max_k).contains(&k) {
        return Err(format!(
            "setting `k` ({k}) is outside [min_k, max_k] = [{min_k}, {max_k}]; give a first K \
             in that range"
        ));
    }
    if step == 0 {
        return Err("setting `step` is 0; give at least 1".to_owned());
    }
    if window == 0 {
        return Err("setting `window` is 0; give at least 1 token (64 to 128 suit)".to_owned());
    }
    if lower > raise {
        return Err(format!(
            "setting `lower` ({lower}) is above `raise` ({raise}); give lower <= raise"
        ));
    }
    Ok(())
}

export_policy!(Window);

#[cfg(test)]
mod tests {
    use spechost_sdk::testing::{
        PolicyHarness, drafted_round, facts, plain_round, policy_setup, shadow_round,
    };

    use super::*;

    /// The host's `--draft-max` in most tests.
    const CAP: u32 = 32;

    fn window(config: &str, cap: u32) -> PolicyHarness<Window> {
        PolicyHarness::new(config, facts(100), policy_setup(cap)).expect("valid config")
    }

    /// A target that accepts `rate` of every draft (rounded down), and whose shadow drafts
    /// would be accepted at `shadow_rate`.
    fn target(rate: f32, shadow_rate: f32) -> impl FnMut(&Decision) -> RoundRecord {
        move |decision| {
            let share = |len: u32, rate: f32| (len as f32 * rate).floor() as u32;
            if decision.max_draft_len > 0 {
                drafted_round(decision.max_draft_len, share(decision.max_draft_len, rate))
            } else if decision.shadow_len > 0 {
                shadow_round(decision.shadow_len, share(decision.shadow_len, shadow_rate))
            } else {
                plain_round()
            }
        }
    }

    /// The draft lengths of `rounds` rounds against `target`.
    fn lengths(
        harness: &mut PolicyHarness<Window>,
        rounds: usize,
        target: impl FnMut(&Decision) -> RoundRecord,
    ) -> Vec<u32> {
        harness
            .run(rounds, target)
            .iter()
            .map(|decision| decision.max_draft_len)
            .collect()
    }

    /// `lengths` as (K, rounds at that K) runs.
    fn runs(lengths: &[u32]) -> Vec<(u32, usize)> {
        let mut runs: Vec<(u32, usize)> = Vec::new();
        for &k in lengths {
            match runs.last_mut() {
                Some((last, count)) if *last == k => *count += 1,
                _ => runs.push((k, 1)),
            }
        }
        runs
    }

    #[test]
    fn high_acceptance_raises_k_a_step_per_full_window_up_to_max_k() {
        let mut harness = window("", CAP);
        let lengths = lengths(&mut harness, 40, target(1.0, 1.0));
        // A full window of 96 tokens takes 12 rounds at K=8, 8 at 12, 6 at 16, 5 at 20.
        assert_eq!(
            runs(&lengths),
            [(8, 12), (12, 8), (16, 6), (20, 5), (24, 9)],
            "{lengths:?}"
        );
    }

    #[test]
    fn acceptance_between_lower_and_raise_holds_k() {
        let mut harness = window("", CAP);
        let lengths = lengths(&mut harness, 50, target(0.75, 0.75));
        assert!(lengths.iter().all(|&k| k == 8), "{lengths:?}");
    }

    #[test]
    fn low_acceptance_lowers_k_to_min_k_but_stays_on_above_off() {
        let mut harness = window("", CAP);
        let lengths = lengths(&mut harness, 60, target(0.5, 0.5));
        assert_eq!(runs(&lengths), [(8, 12), (4, 48)], "{lengths:?}");
    }

    #[test]
    fn very_low_acceptance_switches_off_with_shadow_drafts() {
        let mut harness = window("", CAP);
        let decisions = harness.run(20, target(0.1, 0.1));
        // 12 rounds fill the window at K=8 with 0 accepted (0.1 * 8 rounds down to 0).
        assert!(
            decisions[..12].iter().all(|d| *d == Decision::draft(8)),
            "{decisions:?}"
        );
        assert!(
            decisions[12..].iter().all(|d| *d == Decision::skip(8)),
            "{decisions:?}"
        );
    }

    #[test]
    fn resumes_at_min_k_when_shadow_acceptance_recovers() {
        let mut harness = window("", CAP);
        harness.run(12, target(0.0, 0.0));
        assert_eq!(harness.decide(), Decision::skip(8));
        // Shadow drafts of 8 now match fully: 12 of them fill the 96-token evidence window.
        let lengths = lengths(&mut harness, 14, target(1.0, 1.0));
        assert_eq!(runs(&lengths), [(0, 12), (4, 2)], "{lengths:?}");
    }

    #[test]
    fn stays_off_while_shadow_drafts_keep_failing() {
        let mut harness = window("", CAP);
        harness.run(12, target(0.0, 0.0));
        let lengths = lengths(&mut harness, 300, target(1.0, 0.25));
        assert!(lengths.iter().all(|&k| k == 0), "{lengths:?}");
    }

    #[test]
    fn probes_at_min_k_when_no_shadow_results_arrive() {
        let mut harness = window("shadow_len=0", CAP);
        harness.run(12, target(0.0, 0.0));
        let lengths = lengths(&mut harness, 70, target(0.0, 0.0));
        assert_eq!(runs(&lengths), [(0, 64), (4, 6)], "{lengths:?}");
    }

    #[test]
    fn every_k_is_capped_at_the_hosts_maximum() {
        let mut harness = window("", 6);
        let capped = lengths(&mut harness, 30, target(1.0, 1.0));
        assert!(capped.iter().all(|&k| k == 6), "{capped:?}");
        let mut harness = window("", 2);
        harness.run(48, target(0.0, 0.0));
        let resumed = lengths(&mut harness, 60, target(1.0, 1.0));
        assert_eq!(
            runs(&resumed),
            [(0, 12), (2, 48)],
            "resume at min_k cut to 2"
        );
    }

    #[test]
    fn custom_settings_shape_the_steps() {
        let mut harness = window("k=4,step=2,min_k=2,max_k=8,window=16,raise=0.9", CAP);
        let lengths = lengths(&mut harness, 12, target(1.0, 1.0));
        // Windows of 16 tokens: 4 rounds at 4, 3 at 6, then 8.
        assert_eq!(runs(&lengths), [(4, 4), (6, 3), (8, 5)], "{lengths:?}");
    }

    #[test]
    fn off_zero_never_switches_off() {
        let mut harness = window("off=0", CAP);
        let lengths = lengths(&mut harness, 100, target(0.0, 0.0));
        assert!(lengths.iter().all(|&k| k >= 4), "{lengths:?}");
    }

    #[test]
    fn never_asks_for_text_or_reorders() {
        let mut harness = window("", CAP);
        assert!(!harness.wants_text());
        let decisions = harness.run(30, target(0.0, 0.0));
        assert!(decisions.iter().all(|d| d.order.is_none()), "{decisions:?}");
    }

    #[test]
    fn rejects_bad_settings_naming_the_key() {
        for (config, expected) in [
            ("kk=3", "unknown setting `kk`"),
            ("k=2", "`k` (2) is outside [min_k, max_k] = [4, 24]"),
            ("min_k=0", "`min_k` is 0"),
            ("min_k=10,max_k=6,k=8", "`min_k` (10) is above `max_k` (6)"),
            ("step=0", "`step` is 0"),
            ("window=0", "`window` is 0"),
            (
                "raise=0.5,lower=0.7",
                "`lower` (0.7) is above `raise` (0.5)",
            ),
            ("raise=2", "`raise`"),
            ("off=0.7", "`resume` (0.6) is below `off` (0.7)"),
            ("shadow_len=x", "`shadow_len`"),
        ] {
            let error =
                PolicyHarness::<Window>::new(config, facts(100), policy_setup(CAP)).unwrap_err();
            assert!(error.contains(expected), "{config}: {error}");
        }
    }
}
