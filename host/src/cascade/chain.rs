//! [`Cascade`]: the sources of a request, the policy that sizes each round's draft, and the
//! rule that picks the draft.
//!
//! Three modes choose among sources ([`CascadeMode`]):
//! - **first** (default): sources are asked in order; the first whose proposal has at least
//!   `min_len` tokens wins and later sources are not asked (llama.cpp's speculative chain).
//! - **scored**: every cheap source proposes; the proposal with the highest expected accepted
//!   length wins (its confidences calibrated against what the source achieved and summed, or
//!   its measured acceptance by position when it gives none: [`AcceptanceHistory`], learnt
//!   across requests). Expensive sources (those that run a draft model) are asked only when the
//!   best cheap proposal is expected to accept fewer than `expensive_threshold` tokens.
//! - **tree**: as scored, and when the verifier takes trees
//!   ([`Cascade::allow_tree_leaves`]) the other proposals join the best one as further paths
//!   of a tree of at most the draft length in tokens, keeping the likeliest ([`TreeBuilder`]);
//!   the target follows whichever path it agrees with.
//!
//! Before each round the policy's [`Decision`] sets the draft length; 0 skips speculation, and
//! cheap sources may then be asked for *shadow* proposals that are never verified, only compared
//! with the tokens the target commits, so the policy can see whether speculating would pay.

use std::time::Duration;

use super::estimate::AcceptanceHistory;
use super::mode::{CascadeMode, CascadeSettings, MAX_SHADOW_LEN};
use super::policy::{
    Decision, DraftModelSetup, FixedLength, PolicySetup, RoundPolicy, RoundRecord, SourceRound,
};
use super::sampled::{DraftSampling, TokenDistribution};
use super::scored::best_scored;
use super::slot::Slot;
use super::source::{DraftSource, Feedback, ModelFacts, Proposal, Token};
use super::stats::SourceStats;
use super::tree::{TreeBuilder, TreeShape, tree_size};

/// This round's draft: the winning proposal, cut to the round's length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    /// Tokens to verify.
    pub tokens: Vec<Token>,
    /// Empty for a chain; for a tree of several continuations, the row each token continues
    /// (see [`TreeShape`]).
    pub parents: Vec<usize>,
    /// `survival[i]`: the cascade's estimate of the probability that the target accepts the
    /// draft through token `i` (what the winning source achieved so far, see
    /// [`AcceptanceHistory::survival`]); one per token.
    pub survival: Vec<f64>,
    /// Index of the winning source, or `None` when no source proposed.
    pub source: Option<usize>,
    /// The draft length the policy chose for this round (at most the round's limit).
    pub max_draft_len: usize,
    /// When the draft was drawn at the request's temperature, the distribution of each token
    /// (one per token): the verifier accepts them by rejection sampling, and nothing may cut
    /// the draft. Empty for a deterministic draft.
    pub distributions: Vec<TokenDistribution>,
}

impl Draft {
    /// The same draft verified only through its first `len` tokens (a verify step found the
    /// rest not worth its cost; a tree keeps the parents of its first tokens, which come before
    /// them); cut to nothing, no source won the round.
    pub fn cut(&self, len: usize) -> Self {
        let len = len.min(self.tokens.len());
        Self {
            tokens: self.tokens[..len].to_vec(),
            parents: self.parents[..len.min(self.parents.len())].to_vec(),
            survival: self.survival[..len.min(self.survival.len())].to_vec(),
            source: self.source.filter(|_| len > 0),
            max_draft_len: self.max_draft_len,
            distributions: self.distributions[..len.min(self.distributions.len())].to_vec(),
        }
    }
}

/// What a round cost, measured by the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundTiming {
    /// Time spent in [`Cascade::propose`].
    pub draft_time: Duration,
    /// Time the target spent on the verify batch that held the round.
    pub verify_time: Duration,
    /// Tokens that batch decoded, every request's together (0: the round was alone).
    pub batch_rows: usize,
    /// Tokens that batch committed, every request's together (0: the round was alone).
    pub batch_committed: usize,
}

/// Draft sources in priority order, the policy, and their statistics.
pub struct Cascade {
    slots: Vec<Slot>,
    settings: CascadeSettings,
    policy: Box<dyn RoundPolicy>,
    /// Slot indices in the order sources are asked this round.
    order: Vec<usize>,
    /// Slots past this many hold sources joined for the current request only
    /// ([`Self::join`]).
    own_sources: usize,
    /// How sources with a draft model draw their drafts for the next request.
    draft_sampling: Option<DraftSampling>,
    /// Most paths a tree draft may hold (what the verifier takes); 1: chains only.
    max_tree_leaves: usize,
    /// The target's measured verify costs for the current request (index `n - 1`: `n` tokens),
    /// which size tree drafts; empty when not measured.
    verify_costs: Vec<Duration>,
}

impl Cascade {
    /// A cascade over `sources`, asked in the given order, drafting the round's whole limit each
    /// round until [`Self::with_policy`] sets a policy.
    pub fn new(sources: Vec<Box<dyn DraftSource>>, settings: CascadeSettings) -> Self {
        let slots: Vec<Slot> = sources.into_iter().map(Slot::new).collect();
        Self {
            order: (0..slots.len()).collect(),
            own_sources: slots.len(),
            slots,
            settings,
            policy: Box::new(FixedLength::default()),
            draft_sampling: None,
            max_tree_leaves: 1,
            verify_costs: Vec::new(),
        }
    }

    /// Sources with a draft model draw their drafts at `sampling` from the next
    /// [`Self::begin`] on (rejection sampling); `None`: they draft greedily.
    pub fn sample_drafts(&mut self, sampling: Option<DraftSampling>) {
        self.draft_sampling = sampling;
    }

    /// Lets the tree mode merge proposals into trees of at most `leaves` paths (what the
    /// verifier of the next requests takes); 1, the default, keeps every draft a chain.
    pub fn allow_tree_leaves(&mut self, leaves: usize) {
        self.max_tree_leaves = leaves.max(1);
    }

    /// The same cascade with `policy` choosing each round's draft length.
    pub fn with_policy(mut self, policy: Box<dyn RoundPolicy>) -> Self {
        self.policy = policy;
        self
    }

    /// A cascade without sources: every round is plain decoding.
    pub fn empty() -> Self {
        Self::new(Vec::new(), CascadeSettings::default())
    }

    /// Whether the cascade has no sources.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Names of the sources, in order.
    pub fn source_names(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.stats.name.clone()).collect()
    }

    /// The draft model as the policy's setup tells it: the sources that draft with it and what
    /// it costs (every such source drafts with the process's one draft model).
    fn draft_model_setup(&self) -> Option<DraftModelSetup> {
        let mut costs = None;
        let mut sources = Vec::new();
        for slot in &self.slots {
            if let Some(measured) = slot.source.draft_model_costs() {
                costs.get_or_insert(measured);
                sources.push(slot.stats.name.clone());
            }
        }
        Some(DraftModelSetup {
            sources,
            costs: costs?,
        })
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// The settings the cascade was built with.
    pub fn settings(&self) -> &CascadeSettings {
        &self.settings
    }

    /// Adds `source` for the next request only (a source made for it, such as the host's
    /// grammar source): asked before the cascade's own sources, in stats and in the policy's
    /// setup under its name, and dropped by [`Self::end`]. Call before [`Self::begin`].
    pub fn join(&mut self, source: Box<dyn DraftSource>) {
        self.slots.push(Slot::new(source));
    }

    /// Starts a request: resets statistics, gives every source the prompt and opens the policy
    /// with a draft length of at most `max_draft_len`, the request's `max_tokens` and the
    /// target's measured `verify_costs`.
    pub fn begin(
        &mut self,
        facts: &ModelFacts,
        prompt: &[Token],
        max_draft_len: usize,
        max_tokens: usize,
        verify_costs: &[Duration],
    ) {
        let max_paths = if self.settings.mode == CascadeMode::Tree {
            self.max_tree_leaves
        } else {
            1
        };
        for slot in &mut self.slots {
            slot.reset();
            slot.source.sample_drafts(self.draft_sampling);
            slot.source.set_max_paths(max_paths);
            slot.call("begin", |s| s.begin(facts, prompt));
        }
        self.order = self.usual_order().collect();
        self.verify_costs = verify_costs.to_vec();
        let setup = PolicySetup {
            sources: self.source_names(),
            max_draft_len,
            verify_costs: verify_costs.to_vec(),
            draft_model: self.draft_model_setup(),
            prompt_len: prompt.len(),
            max_tokens,
        };
        let _plugin = policy_span(self.policy.as_ref(), "open");
        if let Err(fault) = self.policy.begin(facts, &setup) {
            tracing::debug!(policy = self.policy.name(), %fault, "policy fault in begin");
        }
    }

    /// Feeds every source `tokens` committed outside a round: those generated before
    /// [`Self::begin`] (the token decoded with the prompt, or the output before a swap).
    pub fn feed(&mut self, tokens: &[Token]) {
        if tokens.is_empty() {
            return;
        }
        for slot in &mut self.slots {
            slot.feed(tokens);
        }
    }

    /// Whether the policy wants the text of each round's committed tokens in [`Self::accept`].
    pub fn wants_text(&self) -> bool {
        self.policy.wants_text()
    }

    /// Plans a round of at most `round_limit` draft tokens (the request's `max_draft_len` cut to
    /// the room the round has): asks the policy for the draft length,
    /// then the sources (as the mode says) for the draft.
    pub fn propose(&mut self, round_limit: usize) -> Draft {
        let decision = {
            let _plugin = policy_span(self.policy.as_ref(), "decide");
            self.policy.decide()
        }
        .unwrap_or_else(|fault| {
            tracing::debug!(policy = self.policy.name(), %fault, "policy fault in decide");
            Decision::default()
        });
        for slot in &mut self.slots {
            slot.proposal = None;
            slot.draw = None;
            slot.shadow_asked = false;
            slot.excluded = decision.exclude.contains(&slot.stats.name);
            if !slot.excluded {
                slot.feed_held_back();
            }
        }
        if let Some(names) = &decision.order {
            self.reorder(names);
        }
        let max_draft_len = decision.max_draft_len.min(round_limit);
        if max_draft_len == 0 {
            if round_limit > 0 {
                self.ask_shadows(decision.shadow_len.min(MAX_SHADOW_LEN));
            }
            return Draft::default();
        }
        let winner = match self.settings.mode {
            CascadeMode::First => self.first_long_enough(max_draft_len),
            CascadeMode::Scored | CascadeMode::Tree => {
                best_scored(&mut self.slots, &self.order, &self.settings, max_draft_len)
            }
        };
        let proposal = winner.and_then(|index| {
            let slot = &self.slots[index];
            slot.proposal
                .as_ref()
                .map(|proposal| (proposal, &slot.history))
        });
        let distributions = winner
            .and_then(|index| self.slots[index].draw.clone())
            .unwrap_or_default();
        let draft = Draft {
            tokens: proposal
                .map(|(proposal, _)| proposal.tokens.clone())
                .unwrap_or_default(),
            parents: proposal
                .map(|(proposal, _)| proposal.parents.clone())
                .unwrap_or_default(),
            survival: proposal
                .map(|(proposal, history)| history.survival(proposal))
                .unwrap_or_default(),
            source: winner,
            max_draft_len,
            distributions,
        };
        if self.settings.mode == CascadeMode::Tree
            && self.max_tree_leaves > 1
            && draft.distributions.is_empty()
        {
            self.grow_tree(draft)
        } else {
            draft
        }
    }

    /// Tree mode: `draft`, the best proposal (a chain or a tree), with every other source's
    /// proposal of the round merged in as further paths, cut to the draft length in tokens and
    /// to the verifier's paths, keeping the tokens most likely to be accepted
    /// ([`TreeBuilder`]), and to the size that commits the most tokens per second of
    /// verification by the measured verify costs; the leading chain of `draft` alone where
    /// that does better ([`tree_size`]).
    fn grow_tree(&self, draft: Draft) -> Draft {
        let Some(winner) = draft.source else {
            return draft;
        };
        let mut builder = TreeBuilder::default();
        builder.add(&draft.tokens, &draft.parents, &draft.survival);
        for &index in &self.order {
            let slot = &self.slots[index];
            if index == winner || slot.draw.is_some() {
                continue;
            }
            if let Some(proposal) = &slot.proposal {
                builder.add(
                    &proposal.tokens,
                    &proposal.parents,
                    &slot.history.survival(proposal),
                );
            }
        }
        let mut taken = builder.likeliest_first(draft.max_draft_len, self.max_tree_leaves);
        let estimates: Vec<f64> = taken.iter().map(|&index| builder.survival(index)).collect();
        let branched = builder.branched(&taken);
        // The linear alternative: the best proposal's leading chain, as the policy sized it.
        let spine = TreeShape::new(&draft.tokens, &draft.parents).spine_len();
        let mut chain = draft.cut(spine);
        chain.parents.clear();
        let Some(size) = tree_size(&self.verify_costs, &chain.survival, &estimates, branched)
        else {
            return chain;
        };
        taken.truncate(size);
        let (tokens, mut parents, survival) = builder.build(&taken);
        if TreeShape::new(&tokens, &parents).is_chain() {
            parents.clear();
        }
        Draft {
            tokens,
            parents,
            survival,
            ..draft
        }
    }

    /// Ordered mode: asks sources in order until one proposes at least `min_len` tokens.
    fn first_long_enough(&mut self, max_len: usize) -> Option<usize> {
        let min_len = self.settings.min_len.max(1);
        for &index in &self.order {
            let slot = &mut self.slots[index];
            if slot.excluded {
                continue;
            }
            let len = slot.ask(max_len);
            if len >= min_len || (slot.drew() && len > 0) {
                return Some(index);
            }
        }
        None
    }

    /// Asks cheap sources without a pending shadow proposal for `len` unverified tokens.
    fn ask_shadows(&mut self, len: usize) {
        if len == 0 {
            return;
        }
        for &index in &self.order {
            let slot = &mut self.slots[index];
            if slot.wants_shadow() {
                slot.ask_shadow(len);
            }
        }
    }

    /// Joined sources first (they were made for this request), then the cascade's in order.
    fn usual_order(&self) -> impl Iterator<Item = usize> + use<> {
        (self.own_sources..self.slots.len()).chain(0..self.own_sources)
    }

    /// Puts the sources named in `names` first, in that order (a name given twice counts
    /// once, where it first appears); the rest keep their usual order (joined sources, then
    /// the cascade's).
    fn reorder(&mut self, names: &[String]) {
        let mut order: Vec<usize> = Vec::with_capacity(self.slots.len());
        for index in names
            .iter()
            .filter_map(|name| self.slots.iter().position(|s| &s.stats.name == name))
        {
            if !order.contains(&index) {
                order.push(index);
            }
        }
        for index in self.usual_order() {
            if !order.contains(&index) {
                order.push(index);
            }
        }
        self.order = order;
    }

    /// Records the outcome of a round: `n_accepted` leading draft tokens were accepted and
    /// `committed` (the accepted prefix plus the target's token) was appended to the output.
    /// Tells every asked source how its proposal fared, settles shadow proposals, feeds the
    /// committed tokens to every source, credits the winner, and shows the round to the policy
    /// (with `committed_text` when it [wants text](Self::wants_text)).
    ///
    /// `draft` is what was verified: [`Self::propose`]'s draft, or a [cut](Draft::cut) of it.
    /// The winner's tokens past the cut count as compared with the committed tokens only, as
    /// a losing proposal's do. Of a tree, the winner is the source whose proposal the target
    /// followed furthest, and every proposal is compared with the committed tokens.
    pub fn accept(
        &mut self,
        draft: &Draft,
        n_accepted: usize,
        committed: &[Token],
        timing: RoundTiming,
        committed_text: &str,
    ) {
        let Some(&target_token) = committed.last() else {
            return;
        };
        let winner = if draft.parents.is_empty() {
            draft.source
        } else {
            self.tree_winner(draft, committed)
        };
        let mut sources = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if let Some(proposal) = slot.proposal.take() {
                let won = winner == Some(index);
                // Positions drafted: of a tree, its depth, as a chain verified along the
                // target's path would have been; the policy learns acceptance by position.
                let drafted = if proposal.parents.is_empty() {
                    proposal.tokens.len()
                } else {
                    let shape = TreeShape::new(&proposal.tokens, &proposal.parents);
                    shape.depths().into_iter().max().unwrap_or(0)
                };
                let (matched, known) =
                    if won && draft.parents.is_empty() && draft.tokens.len() == drafted {
                        // Verification checked every drafted position up to the first mismatch.
                        (n_accepted, drafted)
                    } else {
                        (followed(&proposal, committed), committed.len())
                    };
                if proposal.parents.is_empty() {
                    slot.history.record(&proposal, matched, known);
                } else {
                    slot.history.record_tree(&proposal, committed);
                }
                if won && draft.parents.is_empty() {
                    slot.stats.record_win(draft.tokens.len(), n_accepted);
                } else if won {
                    slot.stats
                        .record_win(drafted.min(draft.tokens.len()), matched.min(n_accepted));
                }
                let feedback = Feedback {
                    won,
                    n_accepted: match (won, draft.parents.is_empty()) {
                        (false, _) => 0,
                        (true, true) => n_accepted as u32,
                        (true, false) => matched.min(n_accepted) as u32,
                    },
                    target_token,
                };
                slot.call("feedback", |s| s.feedback(feedback));
                sources.push(SourceRound {
                    source: slot.stats.name.clone(),
                    drafted,
                    accepted: matched,
                    won,
                    shadow: false,
                    censored: matched == known && drafted > known,
                    draft_time: slot.proposal_time,
                    catch_up_time: slot.proposal_catch_up_time,
                });
            }
            if std::mem::take(&mut slot.shadow_asked) {
                let feedback = Feedback {
                    won: false,
                    n_accepted: 0,
                    target_token,
                };
                slot.call("feedback", |s| s.feedback(feedback));
            }
            if let Some(settled) = slot.settle_shadow(committed) {
                sources.push(settled);
            }
            if slot.excluded {
                slot.hold_back(committed);
            } else {
                slot.feed(committed);
            }
        }
        let record = RoundRecord {
            max_draft_len: draft.max_draft_len,
            sources,
            draft_time: timing.draft_time,
            verify_time: timing.verify_time,
            n_verified: draft.tokens.len() + 1,
            n_accepted,
            batch_verified: timing.batch_rows.max(draft.tokens.len() + 1),
            batch_committed: timing.batch_committed.max(committed.len()),
            committed_text: committed_text.to_owned(),
        };
        let _plugin = policy_span(self.policy.as_ref(), "observe");
        if let Err(fault) = self.policy.observe(&record) {
            tracing::debug!(policy = self.policy.name(), %fault, "policy fault in observe");
        }
    }

    /// The source whose proposal the target followed furthest through a tree draft (the one
    /// that led the tree on a tie, or when the target followed none).
    fn tree_winner(&self, draft: &Draft, committed: &[Token]) -> Option<usize> {
        let length_of = |index: usize| {
            self.slots[index]
                .proposal
                .as_ref()
                .map_or(0, |proposal| followed(proposal, committed))
        };
        let lead = draft.source?;
        let mut winner = (lead, length_of(lead));
        for index in 0..self.slots.len() {
            let length = length_of(index);
            if length > winner.1 {
                winner = (index, length);
            }
        }
        Some(winner.0)
    }

    /// Ends the request for every source (fed first what was held back from it while it was
    /// left out) and the policy, and drops the sources joined for it.
    pub fn end(&mut self) {
        for slot in &mut self.slots {
            slot.feed_held_back();
            slot.source.end();
        }
        self.slots.truncate(self.own_sources);
        self.order = (0..self.own_sources).collect();
        self.policy.end();
    }

    /// Asks every source to hand its cross-request state to the host (between requests).
    pub fn checkpoint(&mut self) {
        for slot in &mut self.slots {
            slot.call("checkpoint", |s| s.checkpoint());
        }
    }

    /// Statistics of every source, in cascade order.
    pub fn stats(&self) -> Vec<SourceStats> {
        self.slots.iter().map(|s| s.stats.clone()).collect()
    }

    /// What the cascade learnt of each source's acceptance (the scored mode's calibration), in
    /// cascade order, to be handed to the next cascade over the same sources with
    /// [`Self::with_calibration`]: a server that builds a cascade per request keeps it as a
    /// benchmark pass that reuses one cascade does.
    pub fn calibration(&self) -> Vec<AcceptanceHistory> {
        self.slots.iter().map(|s| s.history.clone()).collect()
    }

    /// The same cascade starting from `calibration` (as [`Self::calibration`] returned it, one
    /// entry per source in cascade order; missing entries start from scratch).
    pub fn with_calibration(mut self, calibration: Vec<AcceptanceHistory>) -> Self {
        for (slot, history) in self.slots.iter_mut().zip(calibration) {
            slot.history = history;
        }
        self
    }
}

/// How many of `proposal`'s tokens the `committed` tokens follow from its start (along a path,
/// for a tree).
fn followed(proposal: &Proposal, committed: &[Token]) -> usize {
    TreeShape::new(&proposal.tokens, &proposal.parents)
        .follow(committed)
        .len()
}

/// The `plugin{name, method}` span of a call to the policy.
fn policy_span(policy: &dyn RoundPolicy, method: &'static str) -> tracing::span::EnteredSpan {
    tracing::trace_span!("plugin", name = policy.name(), method).entered()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    use super::super::doubles::{Drawing, ScriptedPolicy, Slow, constant, facts, scored, scripted};
    use super::super::mode::CascadeMode;
    use super::super::source::Proposal;

    #[test]
    fn a_joined_source_is_asked_first_for_one_request_and_then_dropped() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![scripted("own", Ok(vec![1, 2]), &log)],
            CascadeSettings::default(),
        );
        cascade.join(scripted("joined", Ok(vec![5, 6, 7]), &log));
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        assert_eq!(cascade.source_names(), ["own", "joined"]);
        let draft = cascade.propose(8);
        assert_eq!(
            (draft.tokens.clone(), draft.source),
            (vec![5, 6, 7], Some(1))
        );
        cascade.accept(&draft, 3, &[5, 6, 7, 8], RoundTiming::default(), "");
        let stats = cascade.stats();
        assert_eq!((stats[1].won, stats[1].accepted), (1, 3), "{stats:?}");
        assert_eq!(
            stats[0].asked, 0,
            "the joined source's draft was long enough"
        );
        cascade.end();
        assert_eq!(cascade.source_names(), ["own"]);
        assert_eq!(cascade.calibration().len(), 1);
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        assert_eq!(
            cascade.propose(8).tokens,
            vec![1, 2],
            "the next request has its own"
        );
    }

    #[test]
    fn a_drawn_draft_wins_whole_whatever_the_source_returned_or_the_minimum_length() {
        let sampling = Arc::new(Mutex::new(None));
        let drawing = || {
            Box::new(Drawing {
                drawn: vec![5, 6],
                reply: vec![9],
                sampling: Arc::clone(&sampling),
                pending: None,
            })
        };
        let settings = DraftSampling {
            temperature: 0.7,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
        };
        for mode in [CascadeMode::First, CascadeMode::Scored] {
            let log = Arc::default();
            let mut cascade = Cascade::new(
                vec![scripted("cheap", Ok(vec![]), &log), drawing()],
                CascadeSettings {
                    mode,
                    min_len: 3,
                    ..CascadeSettings::default()
                },
            );
            cascade.begin(&facts(), &[1], 8, 64, &[]);
            let greedy = cascade.propose(8);
            assert_eq!(greedy.source, None, "{mode:?}: too short, nothing drawn");
            assert!(greedy.distributions.is_empty());

            cascade.sample_drafts(Some(settings));
            cascade.begin(&facts(), &[1], 8, 64, &[]);
            assert_eq!(*sampling.lock().expect("settings"), Some(settings));
            let drawn = cascade.propose(8);
            assert_eq!(drawn.source, Some(1), "{mode:?}");
            assert_eq!(drawn.tokens, [5, 6], "{mode:?}: the draw, not the reply");
            assert_eq!(drawn.distributions.len(), 2);
            assert_eq!(drawn.distributions[1].probability(7), 0.5);
            cascade.sample_drafts(None);
        }
    }

    #[test]
    fn first_long_enough_source_wins_and_draft_is_truncated() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![
                scripted("short", Ok(vec![7]), &log),
                scripted("long", Ok(vec![1, 2, 3, 4, 5]), &log),
                scripted("never", Ok(vec![9]), &log),
            ],
            CascadeSettings {
                min_len: 2,
                ..CascadeSettings::default()
            },
        );
        cascade.begin(&facts(), &[1, 2], 8, 64, &[]);
        let draft = cascade.propose(3);
        assert_eq!(draft.tokens, vec![1, 2, 3], "draft {draft:?}");
        assert_eq!(draft.source, Some(1));
        cascade.accept(&draft, 2, &[1, 2, 8], RoundTiming::default(), "");
        let stats = cascade.stats();
        assert_eq!(stats[0].asked, 1);
        assert_eq!(stats[0].won, 0);
        assert_eq!(
            (stats[1].won, stats[1].drafted, stats[1].accepted),
            (1, 3, 2)
        );
        assert_eq!(stats[2].asked, 0, "sources after the winner are not asked");
        let log = log.lock().expect("test log").join("\n");
        let expected = "short begin [1, 2]\nlong begin [1, 2]\nnever begin [1, 2]\n\
                        short feedback won=false n=0\nshort feed [1, 2, 8]\n\
                        long feedback won=true n=2\nlong feed [1, 2, 8]\nnever feed [1, 2, 8]";
        assert_eq!(
            log, expected,
            "only asked sources get feedback; all are fed"
        );
    }

    #[test]
    fn a_cut_draft_is_learnt_from_as_far_as_the_committed_tokens_show() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![scripted("long", Ok(vec![1, 2, 3, 4]), &log)],
            CascadeSettings::default(),
        );
        cascade.begin(&facts(), &[9], 8, 64, &[]);
        let draft = cascade.propose(4);
        assert_eq!(draft.survival.len(), 4, "one estimate per token");
        let cut = draft.cut(2);
        assert_eq!((cut.tokens.as_slice(), cut.source), (&[1, 2][..], Some(0)));
        // Both verified tokens accepted; the target's token after them is the proposal's third.
        cascade.accept(&cut, 2, &[1, 2, 3], RoundTiming::default(), "");
        let stats = &cascade.stats()[0];
        assert_eq!((stats.won, stats.drafted, stats.accepted), (1, 2, 2));
        let mut expected = AcceptanceHistory::default();
        let proposal = crate::cascade::Proposal::from_tokens(vec![1, 2, 3, 4]);
        expected.record(&proposal, 3, 3);
        assert_eq!(
            cascade.calibration()[0],
            expected,
            "three positions matched, none missed"
        );
        let nothing = cascade.propose(4).cut(0);
        assert_eq!(nothing.source, None, "a draft cut to nothing has no winner");
    }

    #[test]
    fn fault_counts_as_empty_proposal() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![
                scripted("broken", Err(()), &log),
                scripted("fine", Ok(vec![4]), &log),
            ],
            CascadeSettings::default(),
        );
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let draft = cascade.propose(4);
        assert_eq!(draft.source, Some(1), "draft {draft:?}");
        assert_eq!(cascade.stats()[0].faults, 1);
    }

    #[test]
    fn a_zero_round_limit_asks_nobody() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![scripted("a", Ok(vec![1]), &log)],
            CascadeSettings::default(),
        );
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        assert_eq!(cascade.propose(0), Draft::default());
        assert_eq!(cascade.stats()[0].asked, 0);
    }

    #[test]
    fn zero_length_rounds_draft_nothing_and_settle_shadow_proposals() {
        let (lookup, asked) = constant("lookup", &[5, 6, 9], &[], false);
        let (model, model_asked) = constant("model", &[5, 6, 7], &[], true);
        let observed = Arc::default();
        let shadow = Decision {
            max_draft_len: 0,
            shadow_len: 3,
            ..Decision::default()
        };
        let policy = ScriptedPolicy {
            decisions: vec![shadow.clone(), shadow.clone(), shadow],
            observed: Arc::clone(&observed),
        };
        let mut cascade = Cascade::new(vec![lookup, model], CascadeSettings::default())
            .with_policy(Box::new(policy));
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        for committed in [5, 6, 7] {
            let draft = cascade.propose(8);
            assert!(draft.tokens.is_empty(), "no draft at K=0: {draft:?}");
            cascade.accept(&draft, 0, &[committed], RoundTiming::default(), "");
        }
        assert_eq!(
            *asked.lock().expect("counter"),
            1,
            "one shadow pending at a time"
        );
        assert_eq!(
            *model_asked.lock().expect("counter"),
            0,
            "expensive never shadows"
        );
        let observed = observed.lock().expect("observed");
        let settled: Vec<&SourceRound> = observed.iter().flat_map(|r| &r.sources).collect();
        assert_eq!(
            settled.len(),
            1,
            "settled once, at the mismatch: {observed:?}"
        );
        assert_eq!(
            (settled[0].drafted, settled[0].accepted, settled[0].shadow),
            (3, 2, true)
        );
        assert_eq!(cascade.stats()[0].shadow_matched, 2);
        // The policy ran out of decisions: a faulty policy means plain decoding.
        assert_eq!(cascade.propose(8), Draft::default());
    }

    #[test]
    fn policy_length_and_order_apply_to_the_round() {
        let (a, _) = constant("a", &[1, 2, 3, 4], &[], false);
        let (b, _) = constant("b", &[5, 6, 7, 8], &[], false);
        let policy = ScriptedPolicy {
            decisions: vec![Decision {
                max_draft_len: 2,
                order: Some(vec!["b".into(), "nobody".into()]),
                ..Decision::default()
            }],
            observed: Arc::default(),
        };
        let mut cascade =
            Cascade::new(vec![a, b], CascadeSettings::default()).with_policy(Box::new(policy));
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let draft = cascade.propose(8);
        assert_eq!(
            (draft.tokens.clone(), draft.source, draft.max_draft_len),
            (vec![5, 6], Some(1), 2),
            "draft {draft:?}"
        );
    }

    #[test]
    fn a_source_is_asked_at_most_once_per_round_whatever_the_order() {
        let (a, a_asked) = constant("a", &[], &[], false);
        let (b, b_asked) = constant("b", &[], &[], false);
        let names = ["a", "b", "a", "b", "a"];
        let policy = ScriptedPolicy {
            decisions: vec![Decision {
                max_draft_len: 4,
                order: Some(names.iter().map(|n| n.to_string()).collect()),
                ..Decision::default()
            }],
            observed: Arc::default(),
        };
        let mut cascade =
            Cascade::new(vec![a, b], CascadeSettings::default()).with_policy(Box::new(policy));
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        assert_eq!(
            cascade.propose(8),
            Draft {
                max_draft_len: 4,
                ..Draft::default()
            }
        );
        assert_eq!(
            (
                *a_asked.lock().expect("counter"),
                *b_asked.lock().expect("counter")
            ),
            (1, 1),
            "each source once, though the order named them {names:?}"
        );
        assert_eq!(cascade.stats()[0].asked, 1);
    }

    #[test]
    fn calibration_carries_over_to_the_next_cascade() {
        let build = || {
            let (source, _) = constant("a", &[1, 2, 3, 4], &[], false);
            Cascade::new(vec![source], scored())
        };
        let mut cascade = build();
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        for _ in 0..20 {
            let draft = cascade.propose(8);
            // The target never agrees.
            cascade.accept(&draft, 0, &[9], RoundTiming::default(), "");
        }
        let learnt = cascade.calibration();
        let proposal = Proposal {
            tokens: vec![1, 2, 3, 4],
            confidence: Vec::new(),
            parents: Vec::new(),
        };
        let fresh = build().calibration()[0].expected_accepted(&proposal);
        let kept =
            build().with_calibration(learnt.clone()).calibration()[0].expected_accepted(&proposal);
        assert_eq!(kept, learnt[0].expected_accepted(&proposal));
        assert!(
            kept < fresh,
            "20 rounds accepting none of four tokens should lower the estimate: {kept} vs {fresh}"
        );
    }

    #[test]
    fn each_source_round_reports_the_time_its_proposal_took() {
        let (quick, _) = constant("quick", &[], &[], false);
        let slow = Box::new(Slow {
            tokens: vec![5, 6],
            delay: Duration::from_millis(20),
        });
        let observed = Arc::default();
        let policy = ScriptedPolicy {
            decisions: vec![Decision {
                max_draft_len: 2,
                ..Decision::default()
            }],
            observed: Arc::clone(&observed),
        };
        let mut cascade = Cascade::new(vec![quick, slow], CascadeSettings::default())
            .with_policy(Box::new(policy));
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let draft = cascade.propose(8);
        assert_eq!(draft.source, Some(1), "draft {draft:?}");
        cascade.accept(&draft, 2, &[5, 6, 7], RoundTiming::default(), "");
        let observed = observed.lock().expect("observed");
        let sources = &observed[0].sources;
        let names: Vec<&str> = sources.iter().map(|s| s.source.as_str()).collect();
        assert_eq!(names, ["quick", "slow"], "both were asked: {sources:?}");
        assert_eq!(sources[0].drafted, 0, "quick proposed nothing");
        assert!(
            sources[0].draft_time < Duration::from_millis(20),
            "{sources:?}"
        );
        assert!(
            sources[1].draft_time >= Duration::from_millis(20),
            "{sources:?}"
        );
    }

    #[test]
    fn excluded_sources_are_not_asked_in_either_mode_nor_for_shadows() {
        for mode in [CascadeMode::First, CascadeMode::Scored] {
            let (cheap, cheap_asked) = constant("cheap", &[1, 2], &[0.2, 0.1], false);
            let (model, model_asked) = constant("model", &[1, 2, 3], &[0.9, 0.9, 0.9], true);
            let (other, other_asked) = constant("other", &[7, 8], &[], false);
            let exclude = vec!["model".to_owned(), "cheap".to_owned()];
            let policy = ScriptedPolicy {
                decisions: vec![
                    Decision {
                        max_draft_len: 4,
                        exclude: exclude.clone(),
                        ..Decision::default()
                    },
                    Decision {
                        shadow_len: 4,
                        exclude,
                        ..Decision::default()
                    },
                    Decision {
                        max_draft_len: 4,
                        ..Decision::default()
                    },
                ],
                observed: Arc::default(),
            };
            let settings = CascadeSettings {
                mode,
                ..CascadeSettings::default()
            };
            let mut cascade =
                Cascade::new(vec![cheap, model, other], settings).with_policy(Box::new(policy));
            cascade.begin(&facts(), &[1], 8, 64, &[]);
            let draft = cascade.propose(8);
            assert_eq!(draft.source, Some(2), "{mode:?}: draft {draft:?}");
            cascade.accept(&draft, 0, &[9], RoundTiming::default(), "");
            let draft = cascade.propose(8);
            assert!(draft.tokens.is_empty(), "{mode:?}: K=0 round {draft:?}");
            cascade.accept(&draft, 0, &[9], RoundTiming::default(), "");
            let asked = |counter: &Arc<Mutex<u32>>| *counter.lock().expect("counter");
            assert_eq!(
                (
                    asked(&cheap_asked),
                    asked(&model_asked),
                    asked(&other_asked)
                ),
                (0, 0, 2),
                "{mode:?}: only `other` was asked, for a draft and a shadow draft"
            );
            // The exclusion lasts one round: the next decision names nobody.
            cascade.propose(8);
            assert_eq!(asked(&cheap_asked), 1, "{mode:?}: `cheap` is asked again");
        }
    }

    #[test]
    fn a_source_left_out_is_fed_the_rounds_it_missed_in_one_call_before_it_is_asked() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let left_out = |max_draft_len| Decision {
            max_draft_len,
            exclude: vec!["model".to_owned()],
            ..Decision::default()
        };
        let policy = ScriptedPolicy {
            decisions: vec![
                left_out(4),
                left_out(0),
                Decision {
                    max_draft_len: 4,
                    ..Decision::default()
                },
                left_out(4),
            ],
            observed: Arc::default(),
        };
        let mut cascade = Cascade::new(
            vec![
                scripted("lookup", Ok(vec![]), &log),
                scripted("model", Ok(vec![7]), &log),
            ],
            CascadeSettings::default(),
        )
        .with_policy(Box::new(policy));
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let model_lines = || -> Vec<String> {
            let lines = log.lock().expect("test log");
            lines
                .iter()
                .filter(|line| line.starts_with("model"))
                .cloned()
                .collect()
        };
        for committed in [[3], [4]] {
            let draft = cascade.propose(8);
            cascade.accept(&draft, 0, &committed, RoundTiming::default(), "");
        }
        assert_eq!(
            model_lines(),
            ["model begin [1]"],
            "nothing fed while left out"
        );
        let draft = cascade.propose(8);
        assert_eq!(draft.tokens, [7], "asked, with its context complete");
        assert_eq!(model_lines(), ["model begin [1]", "model feed [3, 4]"]);
        cascade.accept(&draft, 1, &[7, 5], RoundTiming::default(), "");
        let draft = cascade.propose(8);
        cascade.accept(&draft, 0, &[6], RoundTiming::default(), "");
        cascade.end();
        assert_eq!(
            model_lines(),
            [
                "model begin [1]",
                "model feed [3, 4]",
                "model feedback won=true n=1",
                "model feed [7, 5]",
                "model feed [6]",
            ],
            "fed every round it was asked in, and what it missed when the request ends"
        );
        assert_eq!(
            log.lock()
                .expect("test log")
                .iter()
                .filter(|line| line.starts_with("lookup feed ["))
                .count(),
            4,
            "a source asked every round is fed every round"
        );
    }

    /// A tree-mode cascade of two sources whose proposals share their first token, for a
    /// verifier that takes trees of `leaves` paths.
    fn two_proposals_in_tree_mode(leaves: usize) -> Cascade {
        let (first, _) = constant("first", &[1, 2, 3], &[0.9, 0.8, 0.7], false);
        let (second, _) = constant("second", &[1, 5, 6], &[0.6, 0.5, 0.4], false);
        let settings = CascadeSettings {
            mode: CascadeMode::Tree,
            ..CascadeSettings::default()
        };
        let mut cascade = Cascade::new(vec![first, second], settings);
        cascade.allow_tree_leaves(leaves);
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        cascade
    }

    #[test]
    fn tree_mode_merges_every_proposal_when_the_verifier_takes_trees() {
        // A verifier of chains only: the best proposal alone.
        let draft = two_proposals_in_tree_mode(1).propose(8);
        assert_eq!((draft.tokens, draft.parents), (vec![1, 2, 3], vec![]));
        let mut cascade = two_proposals_in_tree_mode(8);
        let draft = cascade.propose(8);
        assert_eq!(draft.source, Some(0));
        assert_eq!(draft.tokens, vec![1, 2, 3, 5, 6]);
        assert_eq!(draft.parents, vec![0, 1, 2, 1, 4]);
        assert_eq!(draft.survival.len(), 5);
        // The target follows the second source's path: it wins, with both its tokens.
        cascade.accept(&draft, 2, &[1, 5, 9], RoundTiming::default(), "");
        let stats = cascade.stats();
        assert_eq!((stats[0].won, stats[1].won), (0, 1));
        assert_eq!(stats[1].accepted, 2);
        // Four tokens: the likeliest of both paths (the first's 3 before the second's 5).
        let draft = two_proposals_in_tree_mode(8).propose(4);
        assert_eq!(draft.tokens, vec![1, 2, 3, 5]);
        assert_eq!(draft.parents, vec![0, 1, 2, 1]);
    }
}
