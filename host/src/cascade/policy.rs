//! Draft-length policies: what decides each round's draft length (adaptive K).
//!
//! The cascade asks its [`RoundPolicy`] for a [`Decision`] before every round and tells it what
//! happened after ([`RoundRecord`]). Policies are plugins (`plugins::PluginPolicy`); without
//! one, the cascade drafts the round's whole limit every round ([`FixedLength`]).

use std::time::Duration;

use super::draft_model::DraftModelCosts;
use super::source::{ModelFacts, SourceFault};

/// What a policy is told when a request starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicySetup {
    /// Names of the cascade's sources, in cascade order.
    pub sources: Vec<String>,
    /// The largest draft length allowed (`--draft-max`).
    pub max_draft_len: usize,
    /// Measured time for the target to verify `n` tokens in one batch, at index `n - 1`; empty
    /// when not measured.
    pub verify_costs: Vec<Duration>,
    /// What the draft model costs, when a source drafts with one and the host measured it.
    pub draft_model: Option<DraftModelSetup>,
    /// Tokens of the request's prompt.
    pub prompt_len: usize,
    /// Most tokens the request may generate.
    pub max_tokens: usize,
}

/// What verifying `n` tokens of one sequence costs by `curve` (`curve[n - 1]`, as in
/// [`PolicySetup::verify_costs`]), in seconds, extrapolated along its last step beyond it;
/// NaN when nothing was measured.
pub fn curve_cost(curve: &[Duration], n: usize) -> f64 {
    curve_cost_by(curve.len(), |index| curve[index].as_secs_f64(), n)
}

/// [`curve_cost`] of a curve of `len` sizes whose entry `index` costs `seconds(index)`, for a
/// caller that computes entries on demand rather than holding the curve.
pub fn curve_cost_by(len: usize, seconds: impl Fn(usize) -> f64, n: usize) -> f64 {
    match len {
        0 => f64::NAN,
        len if n <= len => seconds(n.max(1) - 1),
        1 => seconds(0) * n as f64,
        len => seconds(len - 1) + (seconds(len - 1) - seconds(len - 2)) * (n - len) as f64,
    }
}

/// The draft model as a policy sees it when a request starts.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftModelSetup {
    /// Names of the cascade's sources that draft with the draft model.
    pub sources: Vec<String>,
    /// What the host measured of it at start-up.
    pub costs: DraftModelCosts,
}

/// What one source did in one round (see `source-round` in the WIT for each field's meaning).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceRound {
    /// The source's name.
    pub source: String,
    /// Tokens it proposed.
    pub drafted: usize,
    /// Leading tokens of its proposal that matched what the target produced.
    pub accepted: usize,
    /// Whether its proposal was the verified draft.
    pub won: bool,
    /// Whether it was a shadow proposal, settled this round.
    pub shadow: bool,
    /// Whether `accepted` is only a lower bound.
    pub censored: bool,
    /// Time spent in the source's `propose` call for this proposal.
    pub draft_time: Duration,
    /// The part of `draft_time` a draft model spent catching up with the context.
    pub catch_up_time: Duration,
}

/// A finished round, as a policy sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundRecord {
    /// The draft length the policy asked for.
    pub max_draft_len: usize,
    /// Per-source outcomes: sources asked this round, then settled shadow proposals.
    pub sources: Vec<SourceRound>,
    /// Time spent asking sources for proposals.
    pub draft_time: Duration,
    /// Time the target spent on the verify batch that held the round (every request's rows).
    pub verify_time: Duration,
    /// Tokens of this request in the verify batch (1 + draft length).
    pub n_verified: usize,
    /// Draft tokens accepted.
    pub n_accepted: usize,
    /// Tokens the verify batch decoded, every request's together (`n_verified` when alone).
    pub batch_verified: usize,
    /// Tokens the verify batch's rounds committed together (`n_accepted + 1` when alone).
    pub batch_committed: usize,
    /// Text of the committed tokens, when the policy wants it.
    pub committed_text: String,
}

/// A policy's choice for the next round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Tokens to draft; 0 skips speculation this round.
    pub max_draft_len: usize,
    /// Tokens cheap sources should draft without verification while `max_draft_len` is 0.
    pub shadow_len: usize,
    /// A new order of sources by name, if the policy wants one.
    pub order: Option<Vec<String>>,
    /// Sources not to ask this round, by name.
    pub exclude: Vec<String>,
}

/// Chooses each round's draft length.
///
/// Call order for one request: [`begin`](Self::begin), then per round [`decide`](Self::decide)
/// and, after verification, [`observe`](Self::observe); [`end`](Self::end) when the request
/// finishes. A [`SourceFault`] never stops generation: the cascade then drafts nothing that
/// round (plain decoding cannot be slower than plain decoding).
pub trait RoundPolicy: Send {
    /// The name shown in stats and warnings.
    fn name(&self) -> &str;

    /// Starts a request.
    fn begin(&mut self, facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault>;

    /// Whether [`RoundRecord::committed_text`] should be filled (it costs detokenization).
    fn wants_text(&self) -> bool {
        false
    }

    /// Records a finished round.
    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault>;

    /// Chooses the next round's draft length.
    fn decide(&mut self) -> Result<Decision, SourceFault>;

    /// Ends the request. Default: nothing.
    fn end(&mut self) {}
}

/// The policy of a cascade without one: draft the round's whole limit every round.
#[derive(Debug, Clone, Default)]
pub struct FixedLength {
    max_draft_len: usize,
}

impl RoundPolicy for FixedLength {
    fn name(&self) -> &str {
        "fixed-length"
    }

    fn begin(&mut self, _facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault> {
        self.max_draft_len = setup.max_draft_len;
        Ok(())
    }

    fn observe(&mut self, _round: &RoundRecord) -> Result<(), SourceFault> {
        Ok(())
    }

    fn decide(&mut self) -> Result<Decision, SourceFault> {
        Ok(Decision {
            max_draft_len: self.max_draft_len,
            ..Decision::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_curve_is_extrapolated_past_its_end() {
        assert!(curve_cost(&[], 3).is_nan());
        assert!((curve_cost(&[ms(10)], 3) - 0.030).abs() < 1e-9);
        assert!((curve_cost(&[ms(10), ms(12)], 4) - 0.016).abs() < 1e-9);
        assert!((curve_cost(&[ms(10), ms(12)], 2) - 0.012).abs() < 1e-9);
    }
}
