//! The plain Rust values a policy sees: its setup, the record of each round and its decision.
//!
//! They mirror the records of `spechost:drafter/policy-api` one for one, as ordinary Rust types
//! that build and test natively; the private `bindings` module converts them from and to the
//! generated ones.

/// What the host tells a policy when it opens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicySetup {
    /// Names of the cascade's sources, in cascade order.
    pub sources: Vec<String>,
    /// The largest draft length the host allows (`--draft-max`); larger decisions are cut to it.
    pub max_draft_len: u32,
    /// Measured time for the target to verify `n` tokens in one batch (logits at every
    /// position), in microseconds, at index `n - 1`, for `n = 1..=max_draft_len + 1`: index `k`
    /// is the cost of a round that drafted `k` tokens. Empty when the host did not measure it.
    pub verify_us: Vec<f32>,
}

/// What one source did in one round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceRound {
    /// The source's name in the cascade.
    pub source: String,
    /// Tokens it proposed (0 if it was not asked or had nothing).
    pub drafted: u32,
    /// Leading tokens of its proposal that match what the target produced. For the winning
    /// proposal this is what the target accepted; for a proposal that was not verified (a losing
    /// or shadow proposal) it is the match against the tokens the target committed, so it can be
    /// lower than what verifying it would have accepted (see [`SourceRound::censored`]).
    pub accepted: u32,
    /// Whether this source's proposal was the one verified this round.
    pub won: bool,
    /// Whether this was a shadow proposal: asked for with [`Decision::shadow_len`] while
    /// speculation was off, compared with the target's tokens as they were committed, never
    /// verified. Shadow results arrive in the round in which they were settled.
    pub shadow: bool,
    /// Whether `accepted` is only a lower bound: the proposal matched every committed token it
    /// was compared with, but was longer than them.
    pub censored: bool,
    /// Time the host spent in this source's `propose` call for this proposal, in microseconds
    /// (a draft model's time to catch up with the context included). A source asked that
    /// proposed nothing also appears, with `drafted` 0 and its time here.
    pub draft_us: u64,
}

/// A finished round, as the policy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundRecord {
    /// The draft length the policy asked for (after the host cut it to
    /// [`PolicySetup::max_draft_len`]).
    pub max_draft_len: u32,
    /// Per-source outcome, in cascade order; shadow results are among them, marked
    /// [`SourceRound::shadow`].
    pub sources: Vec<SourceRound>,
    /// Time spent asking sources for proposals, in microseconds.
    pub draft_us: u64,
    /// Time the target spent verifying, in microseconds.
    pub verify_us: u64,
    /// Tokens the target evaluated in the verify batch (1 + draft length).
    pub n_verified: u32,
    /// Draft tokens the target accepted this round (0 when nothing was drafted). The round
    /// committed `n_accepted + 1` tokens.
    pub n_accepted: u32,
    /// Text of the tokens committed this round, for content-aware policies. Empty unless the
    /// policy asked for text with [`crate::Policy::wants_text`].
    pub committed_text: String,
}

impl RoundRecord {
    /// The source whose proposal was verified this round, if one was.
    pub fn winner(&self) -> Option<&SourceRound> {
        self.sources.iter().find(|source| source.won)
    }

    /// The shadow proposals settled this round.
    pub fn shadows(&self) -> impl Iterator<Item = &SourceRound> {
        self.sources.iter().filter(|source| source.shadow)
    }

    /// Tokens drafted and verified this round: the draft batch minus the target's own token.
    pub fn n_drafted(&self) -> u32 {
        self.n_verified.saturating_sub(1)
    }
}

/// A policy's choice for the next round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Tokens to draft this round; 0 skips speculation for this round. The host cuts it to
    /// [`PolicySetup::max_draft_len`].
    pub max_draft_len: u32,
    /// When `max_draft_len` is 0: how many tokens cheap sources should draft anyway, without
    /// verification, so the policy can see whether speculating would pay (results come back as
    /// [`SourceRound::shadow`]). The host asks only sources it knows to be cheap (not the draft
    /// model) and only when no earlier shadow proposal is still being compared. Ignored when
    /// `max_draft_len` is above 0.
    pub shadow_len: u32,
    /// Optional new order of sources by name; names the cascade does not have are ignored.
    pub order: Option<Vec<String>>,
    /// Sources not to ask this round, by name, for drafts or shadow drafts (for example one
    /// whose drafts cost more than they save); names the cascade does not have are ignored. A
    /// excluded source is still fed the committed tokens.
    pub exclude: Vec<String>,
}

impl Decision {
    /// Draft up to `max_draft_len` tokens this round, in the current source order.
    pub fn draft(max_draft_len: u32) -> Self {
        Self {
            max_draft_len,
            ..Self::default()
        }
    }

    /// Skip speculation this round (plain decoding), asking cheap sources for shadow proposals
    /// of `shadow_len` tokens (0 for none).
    pub fn skip(shadow_len: u32) -> Self {
        Self {
            shadow_len,
            ..Self::default()
        }
    }

    /// This decision, with the sources reordered to `order` (names, first asked first).
    pub fn with_order(self, order: Vec<String>) -> Self {
        Self {
            order: Some(order),
            ..self
        }
    }

    /// This decision, with the sources named in `exclude` left out of the round.
    pub fn excluding(self, exclude: Vec<String>) -> Self {
        Self { exclude, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(name: &str, won: bool, shadow: bool) -> SourceRound {
        SourceRound {
            source: name.to_owned(),
            drafted: 4,
            accepted: 2,
            won,
            shadow,
            censored: false,
            draft_us: 0,
        }
    }

    #[test]
    fn record_finds_winner_and_shadows() {
        let record = RoundRecord {
            sources: vec![
                source("a", false, true),
                source("b", true, false),
                source("c", false, true),
            ],
            n_verified: 5,
            ..RoundRecord::default()
        };
        let winner = record.winner().map(|source| source.source.as_str());
        assert_eq!(winner, Some("b"), "{record:?}");
        let shadows: Vec<&str> = record
            .shadows()
            .map(|source| source.source.as_str())
            .collect();
        assert_eq!(shadows, ["a", "c"], "{record:?}");
        assert_eq!(record.n_drafted(), 4);
        assert_eq!(RoundRecord::default().n_drafted(), 0);
    }

    #[test]
    fn decision_constructors() {
        assert_eq!(
            Decision::draft(6),
            Decision {
                max_draft_len: 6,
                shadow_len: 0,
                order: None,
                exclude: Vec::new(),
            }
        );
        assert_eq!(
            Decision::skip(8),
            Decision {
                max_draft_len: 0,
                shadow_len: 8,
                order: None,
                exclude: Vec::new(),
            }
        );
        let order = vec!["b".to_owned(), "a".to_owned()];
        assert_eq!(
            Decision::draft(2).with_order(order.clone()).order,
            Some(order)
        );
        let exclude = vec!["draft".to_owned()];
        assert_eq!(
            Decision::draft(4).excluding(exclude.clone()),
            Decision {
                max_draft_len: 4,
                exclude,
                ..Decision::default()
            }
        );
    }
}
