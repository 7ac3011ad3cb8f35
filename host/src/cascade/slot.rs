//! One source inside the cascade: its statistics, what it proposed this round, and its pending
//! shadow proposal. Every call to a source goes through [`Slot::call`], which times it and turns
//! a fault into an empty answer.

use std::time::{Duration, Instant};

use super::estimate::{AcceptanceHistory, matching_prefix};
use super::policy::SourceRound;
use super::sampled::TokenDistribution;
use super::source::{DraftSource, Proposal, SourceFault, Token};
use super::stats::SourceStats;

/// An unverified proposal being compared with the target's tokens as they are committed.
#[derive(Debug, Clone, Default)]
struct Shadow {
    proposal: Proposal,
    matched: usize,
    /// Time the `propose` call that made it took.
    draft_time: Duration,
    /// The part of `draft_time` a draft model spent catching up with the context.
    catch_up_time: Duration,
}

/// A source and what the cascade knows of it.
pub(super) struct Slot {
    pub(super) source: Box<dyn DraftSource>,
    pub(super) stats: SourceStats,
    /// What the source's checked proposals say about its acceptance, kept across requests.
    pub(super) history: AcceptanceHistory,
    /// This round's proposal, after truncation, if the source was asked (it gets feedback).
    pub(super) proposal: Option<Proposal>,
    /// When this round's proposal was drawn from the source's draft model at the request's
    /// temperature: the distribution of each of its tokens. Such a proposal wins the round
    /// and is verified whole (see `sampled.rs`).
    pub(super) draw: Option<Vec<TokenDistribution>>,
    /// Time the `propose` call for this round's proposal took.
    pub(super) proposal_time: Duration,
    /// The part of `proposal_time` a draft model spent catching up with the context.
    pub(super) proposal_catch_up_time: Duration,
    /// Time the last call to the source took.
    last_call_time: Duration,
    /// Left out of this round by the policy: not asked for a draft or a shadow draft.
    pub(super) excluded: bool,
    /// Tokens committed in rounds that left the source out, not fed to it yet: it gets them
    /// in one call before it is next asked, or before its request ends, rather than one call
    /// a round (a call into an instance idle since the last decode finds its caches cold).
    held_back: Vec<Token>,
    shadow: Option<Shadow>,
    /// Asked for a shadow proposal this round (it gets feedback).
    pub(super) shadow_asked: bool,
}

impl Slot {
    /// A slot for `source`, with nothing learnt yet.
    pub(super) fn new(source: Box<dyn DraftSource>) -> Self {
        Self {
            stats: SourceStats::named(source.name()),
            source,
            history: AcceptanceHistory::default(),
            proposal: None,
            draw: None,
            proposal_time: Duration::ZERO,
            proposal_catch_up_time: Duration::ZERO,
            last_call_time: Duration::ZERO,
            excluded: false,
            held_back: Vec::new(),
            shadow: None,
            shadow_asked: false,
        }
    }

    /// Runs `call` on the source, timing it and counting a fault instead of propagating it.
    pub(super) fn call<T>(
        &mut self,
        method: &'static str,
        call: impl FnOnce(&mut dyn DraftSource) -> Result<T, SourceFault>,
    ) -> Option<T> {
        let _plugin = tracing::trace_span!("plugin", name = %self.stats.name, method).entered();
        let started = Instant::now();
        let result = call(self.source.as_mut());
        self.last_call_time = started.elapsed();
        self.stats.time += self.last_call_time;
        match result {
            Ok(value) => Some(value),
            Err(fault) => {
                self.stats.faults += 1;
                tracing::debug!(source = %self.stats.name, method, %fault, "source fault");
                None
            }
        }
    }

    /// Feeds the source the tokens held back from it, then `tokens`, in one call.
    pub(super) fn feed(&mut self, tokens: &[Token]) {
        if self.held_back.is_empty() {
            self.call("feed", |s| s.feed(tokens));
        } else {
            let mut all = std::mem::take(&mut self.held_back);
            all.extend_from_slice(tokens);
            self.call("feed", |s| s.feed(&all));
        }
    }

    /// Keeps `tokens` committed in a round that left the source out, for its next feed.
    pub(super) fn hold_back(&mut self, tokens: &[Token]) {
        self.held_back.extend_from_slice(tokens);
    }

    /// Feeds the source the tokens held back from it, if any.
    pub(super) fn feed_held_back(&mut self) {
        if !self.held_back.is_empty() {
            self.feed(&[]);
        }
    }

    /// Asks for up to `max_len` tokens; the proposal is cut to `max_len` and kept for feedback.
    /// Returns its length. A source already asked this round is not asked again (its
    /// proposal's length is returned), whatever order the policy gave.
    pub(super) fn ask(&mut self, max_len: usize) -> usize {
        if let Some(proposal) = &self.proposal {
            return proposal.tokens.len();
        }
        self.stats.asked += 1;
        let mut proposal = self
            .call("propose", |s| s.propose(max_len))
            .unwrap_or_default();
        self.proposal_time = self.last_call_time;
        self.proposal_catch_up_time = self.source.take_catch_up_time();
        if let Some(draw) = self.source.take_draw() {
            // The draw is the proposal, a chain, even if the source returned something else
            // or failed.
            proposal = Proposal::from_tokens(draw.tokens);
            let mut distributions = draw.distributions;
            distributions.truncate(max_len);
            self.draw = Some(distributions);
        }
        proposal.truncate(max_len);
        if !proposal.tokens.is_empty() {
            self.stats.proposed += 1;
        }
        let len = proposal.tokens.len();
        self.proposal = Some(proposal);
        len
    }

    /// Whether the source may be asked for a shadow proposal this round: a cheap source the
    /// policy did not exclude, without one pending.
    pub(super) fn wants_shadow(&self) -> bool {
        !self.excluded && !self.source.is_expensive() && self.shadow.is_none()
    }

    /// Whether this round's proposal was drawn at the request's temperature: it wins the
    /// round, whatever its length or score, since choosing among draws after seeing them
    /// would bias the output.
    pub(super) fn drew(&self) -> bool {
        self.draw.is_some()
    }

    /// Forgets the previous request's proposals, keeping what was learnt.
    pub(super) fn reset(&mut self) {
        self.stats = SourceStats::named(&self.stats.name);
        self.held_back.clear();
        self.proposal = None;
        self.draw = None;
        self.shadow = None;
        self.shadow_asked = false;
    }

    /// Asks for a shadow proposal of `len` unverified tokens, kept until it is settled.
    pub(super) fn ask_shadow(&mut self, len: usize) {
        self.shadow_asked = true;
        let mut proposal = self.call("propose", |s| s.propose(len)).unwrap_or_default();
        let catch_up_time = self.source.take_catch_up_time();
        // Shadow proposals are never verified: a draw made for one has no use.
        self.source.take_draw();
        proposal.truncate(len);
        // Compared with the committed tokens one after another: a chain.
        proposal.keep_spine();
        if !proposal.tokens.is_empty() {
            self.stats.shadow_proposed += 1;
            self.shadow = Some(Shadow {
                proposal,
                matched: 0,
                draft_time: self.last_call_time,
                catch_up_time,
            });
        }
    }

    /// Compares the shadow proposal with the newly `committed` tokens; once it mismatches or
    /// is fully matched, clears it, learns from it, and returns its record.
    pub(super) fn settle_shadow(&mut self, committed: &[Token]) -> Option<SourceRound> {
        let shadow = self.shadow.as_mut()?;
        let drafted = shadow.proposal.tokens.len();
        let matched_now = matching_prefix(&shadow.proposal.tokens[shadow.matched..], committed);
        shadow.matched += matched_now;
        let mismatched = matched_now < committed.len() && shadow.matched < drafted;
        if !mismatched && shadow.matched < drafted {
            return None;
        }
        let shadow = self.shadow.take()?;
        self.history
            .record(&shadow.proposal, shadow.matched, drafted);
        self.stats.shadow_drafted += drafted as u64;
        self.stats.shadow_matched += shadow.matched as u64;
        Some(SourceRound {
            source: self.stats.name.clone(),
            drafted,
            accepted: shadow.matched,
            won: false,
            shadow: true,
            censored: false,
            draft_time: shadow.draft_time,
            catch_up_time: shadow.catch_up_time,
        })
    }
}
