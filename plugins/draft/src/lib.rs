//! `draft`: the draft-model bridge drafter.
//!
//! The host runs a small draft model natively (`--draft-model`); this plugin decides how to use
//! it, as llama.cpp's speculative example does: keep the draft model's context equal to the
//! request's (reset at open, feed every committed token), and each round draft greedily up to
//! the round's length, stopping at the first token the draft model gives less than `p_min`
//! probability (that token is dropped: a draft it doubts is unlikely to be accepted, and every
//! drafted token costs a draft-model decode plus a verify position). Drafts shorter than
//! `min_len` are dropped too.
//!
//! Confidence of token `i` = the product of the draft probabilities of tokens `0..=i`: the
//! chance the draft survives to `i` if the target agreed with the draft model as often as the
//! draft model is sure of itself. The scored cascade compares it with other sources'.
//!
//! Where the host verifies trees (`--cascade-mode tree`: `tree::max_paths() > 1`), the draft
//! model also gives its second choice at each position whose greedy token is less likely than
//! `split_below` (WIT 0.8.2 `draft-model.propose-with-runners-up`). The proposal is the greedy
//! draft as without trees, then, in the room it leaves (it stopped before a token below
//! `p_min`), the likeliest of the second choices beside its tokens, each a one-token branch
//! with confidence the path's times its own probability, within the host's paths. The host
//! weighs the tree against the greedy draft alone each round.
//!
//! # Config
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `p_min` | 0.5 | stop drafting at a token with draft probability below this (0 = never) |
//! | `min_len` | 1 | drop drafts shorter than this |
//! | `max_len` | 0 | draft at most this many tokens per round (0 = as many as the host asks) |
//! | `split_below` | 0.8 | where the host takes trees, branch to the second choice at positions whose greedy token is less likely than this (0 = never) |
//!
//! Without a draft model loaded the plugin proposes nothing and warns once, at its first ask (the
//! host refuses a cascade with `draft` and no `--draft-model` at start-up, so this only happens
//! when driven by hand; instances the host makes only to check a config stay quiet).

use spechost_sdk::config::Config;
use spechost_sdk::tree::{self, Branch};
use spechost_sdk::{
    DraftedToken, Drafter, Level, ModelFacts, Proposal, Token, draft_model, export_drafter, log,
};

/// Default `p_min`: llama.cpp's speculative example stops at the same draft probability.
const DEFAULT_P_MIN: f32 = 0.5;
/// Default `min_len`.
const DEFAULT_MIN_LEN: usize = 1;
/// Default `max_len` (0: no cap of our own).
const DEFAULT_MAX_LEN: usize = 0;
/// Default `split_below`: a greedy token the draft model gives less than 0.8 leaves a second
/// choice worth a row of the tree often enough.
const DEFAULT_SPLIT_BELOW: f32 = 0.8;

/// Drafts with the host's draft model.
pub struct Draft {
    p_min: f32,
    min_len: usize,
    max_len: Option<usize>,
    split_below: f32,
    /// Whether this instance has logged that it has no draft model to draft with (once, at
    /// the first ask: instances the host makes only to check a config never draft).
    warned_unavailable: bool,
}

impl Drafter for Draft {
    fn new(config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let p_min = config.get_fraction("p_min", DEFAULT_P_MIN)?;
        let min_len = config.get_usize("min_len", DEFAULT_MIN_LEN)?;
        let max_len = config.get_usize("max_len", DEFAULT_MAX_LEN)?;
        let split_below = config.get_fraction("split_below", DEFAULT_SPLIT_BELOW)?;
        config.finish()?;
        draft_model::reset();
        Ok(Self {
            p_min,
            min_len: min_len.max(1),
            max_len: (max_len > 0).then_some(max_len),
            split_below,
            warned_unavailable: false,
        })
    }

    fn feed(&mut self, tokens: &[Token]) {
        draft_model::feed(tokens);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        let max_draft_len = self
            .max_len
            .map_or(max_draft_len, |cap| cap.min(max_draft_len));
        if max_draft_len == 0 {
            return Proposal::empty();
        }
        if !draft_model::available() {
            if !self.warned_unavailable {
                self.warned_unavailable = true;
                log(
                    Level::Warn,
                    "no draft model is loaded (start spechost with --draft-model); proposing nothing",
                );
            }
            return Proposal::empty();
        }
        let max_paths = tree::max_paths();
        if max_paths > 1 && self.split_below > 0.0 {
            return self.propose_tree(max_draft_len, max_paths);
        }
        let drafted = draft_model::propose(max_draft_len, self.p_min);
        let mut tokens = Vec::with_capacity(drafted.len());
        let mut confidence = Vec::with_capacity(drafted.len());
        let mut survive = 1.0f32;
        for token in drafted {
            if token.prob < self.p_min {
                break;
            }
            survive *= token.prob.clamp(0.0, 1.0);
            tokens.push(token.token);
            confidence.push(survive);
        }
        if tokens.len() < self.min_len {
            return Proposal::empty();
        }
        Proposal::with_confidence(tokens, confidence)
    }
}

impl Draft {
    /// The greedy draft with the draft model's second choices where it is unsure, as a tree of
    /// at most `max_draft_len` tokens and `max_paths` paths (see the module docs).
    fn propose_tree(&self, max_draft_len: usize, max_paths: usize) -> Proposal {
        let drafted =
            draft_model::propose_with_runners_up(max_draft_len, self.p_min, self.split_below);
        let mut branches: Vec<Branch> = Vec::with_capacity(2 * drafted.len());
        // The greedy draft's tokens, and the second choices beside them: each a path of its own.
        let mut greedy: Vec<usize> = Vec::with_capacity(drafted.len());
        let mut second_choices: Vec<usize> = Vec::new();
        // The last greedy token, and the probability the greedy path reaches this position.
        let mut parent: Option<usize> = None;
        let mut survive = 1.0f64;
        for position in drafted {
            // The greedy draft ends before a token below `p_min`, as without trees.
            if position.chosen.prob < self.p_min {
                break;
            }
            let before = survive;
            let prob = |drafted: DraftedToken| before * f64::from(drafted.prob.clamp(0.0, 1.0));
            // The greedy token first, so that it leads where a second choice ties with it.
            branches.push(Branch {
                parent,
                token: position.chosen.token,
                probability: prob(position.chosen),
            });
            let chosen = branches.len() - 1;
            if let Some(runner_up) = position.runner_up {
                branches.push(Branch {
                    parent,
                    token: runner_up.token,
                    probability: prob(runner_up),
                });
                second_choices.push(branches.len() - 1);
            }
            survive = prob(position.chosen);
            greedy.push(chosen);
            parent = Some(chosen);
        }
        if greedy.len() < self.min_len {
            return Proposal::empty();
        }
        // The greedy draft as without trees, then the likeliest second choices in the room it
        // leaves, within the host's paths.
        second_choices.sort_by(|&a, &b| {
            branches[b]
                .probability
                .total_cmp(&branches[a].probability)
                .then(a.cmp(&b))
        });
        let room = max_draft_len
            .saturating_sub(greedy.len())
            .min(max_paths - 1);
        let mut kept = greedy;
        kept.extend(second_choices.into_iter().take(room));
        let (proposal, parents) = tree::lay_out(&branches, &kept);
        if !parents.is_empty() {
            tree::shape_proposal(&parents);
        }
        proposal
    }
}

export_drafter!(Draft);

#[cfg(test)]
mod tests {
    use super::*;
    use spechost_sdk::DraftedToken;
    use spechost_sdk::testing::{
        Harness, draft_model_context, install_draft_model, install_runner_up, remove_draft_model,
    };

    fn facts() -> ModelFacts {
        spechost_sdk::testing::facts(1000)
    }

    /// A fake draft model that counts up from the last token, with probability `probs[i]` for
    /// the `i`-th token after the committed context.
    fn counting(probs: Vec<f32>) {
        install_draft_model(move |context| {
            let &last = context.last()?;
            let step = (last % 100) as usize;
            Some(DraftedToken {
                token: last + 1,
                prob: probs.get(step).copied().unwrap_or(0.0),
            })
        });
    }

    #[test]
    fn drafts_until_probability_drops_below_p_min() {
        counting(vec![0.9; 100]);
        let mut draft = Draft::new("p_min=0.5", &facts()).expect("valid config");
        draft.feed(&[1, 2, 3]);
        let proposal = draft.propose(4);
        assert_eq!(proposal.tokens, vec![4, 5, 6, 7], "proposal {proposal:?}");
        let expected = [0.9, 0.81, 0.729, 0.6561];
        for (got, want) in proposal.confidence.iter().zip(expected) {
            assert!(
                (got - want).abs() < 1e-5,
                "confidence {:?}",
                proposal.confidence
            );
        }
        let mut probs = vec![0.9; 100];
        probs[5] = 0.2;
        counting(probs);
        let mut draft = Draft::new("", &facts()).expect("defaults");
        draft.feed(&[1, 2, 3]);
        assert_eq!(
            draft.propose(8).tokens,
            vec![4, 5],
            "stops before the unsure token"
        );
        remove_draft_model();
    }

    #[test]
    fn context_follows_what_is_fed_and_resets_per_session() {
        counting(vec![0.9; 100]);
        let mut harness = Harness::<Draft>::new("", facts()).expect("open");
        harness.feed(&[10, 11]);
        harness.feed(&[12]);
        assert_eq!(draft_model_context(), Some(vec![10, 11, 12]));
        let _second = Draft::new("", &facts()).expect("open");
        assert_eq!(
            draft_model_context(),
            Some(Vec::new()),
            "a new session resets"
        );
        remove_draft_model();
    }

    #[test]
    fn short_drafts_caps_and_no_model_give_nothing() {
        counting(vec![0.9; 100]);
        let mut draft = Draft::new("min_len=3,max_len=2", &facts()).expect("valid");
        draft.feed(&[1]);
        assert!(draft.propose(8).tokens.is_empty(), "2 < min_len 3");
        let mut draft = Draft::new("max_len=2", &facts()).expect("valid");
        draft.feed(&[1]);
        assert_eq!(draft.propose(8).tokens, vec![2, 3]);
        remove_draft_model();
        let mut draft = Draft::new("", &facts()).expect("valid without a model");
        draft.feed(&[1]);
        assert!(draft.propose(8).tokens.is_empty());
    }

    #[test]
    fn where_the_host_takes_trees_unsure_positions_branch_to_the_second_choice() {
        // After 4: 5 (0.7), 6 (0.6), 7 (0.3, below p_min 0.5); each second choice is 100
        // more, at 0.25.
        let mut probs = vec![0.9; 100];
        probs[4] = 0.7;
        probs[5] = 0.6;
        probs[6] = 0.3;
        counting(probs);
        assert!(install_runner_up(|context| {
            let &last = context.last()?;
            Some(DraftedToken {
                token: last + 101,
                prob: 0.25,
            })
        }));
        spechost_sdk::testing::set_tree_paths(4);
        let mut harness = Harness::<Draft>::new("", facts()).expect("defaults");
        harness.feed(&[1, 2, 3, 4]);
        // The greedy draft 5 6 leaves 3 of 5 tokens: 105 beside 5 (0.25) and 106 beside 6
        // (0.7 * 0.25 = 0.175) take two; 7 and its second choice stay out, as without trees.
        let proposal = harness.propose(5);
        assert_eq!(proposal.tokens, [5, 6, 106, 105]);
        assert_eq!(harness.shape(), Some(&[0, 1, 1, 0][..]));
        let expected = [0.7, 0.42, 0.175, 0.25];
        for (got, want) in proposal.confidence.iter().zip(expected) {
            assert!((got - want).abs() < 1e-5, "{:?}", proposal.confidence);
        }
        // Room for one: the likelier, 105; two paths at most: the same.
        assert_eq!(harness.propose(3).tokens, [5, 6, 105]);
        spechost_sdk::testing::set_tree_paths(2);
        assert_eq!(harness.propose(5).tokens, [5, 6, 105]);
        // A greedy draft that fills the round stays a chain.
        spechost_sdk::testing::set_tree_paths(4);
        assert_eq!(harness.propose(2).tokens, [5, 6]);
        assert_eq!(harness.shape(), None);
        // No greedy token below split_below: a chain, as without trees.
        let mut harness = Harness::<Draft>::new("split_below=0.5", facts()).expect("valid");
        harness.feed(&[1, 2, 3, 4]);
        assert_eq!(harness.propose(5).tokens, [5, 6]);
        assert_eq!(harness.shape(), None);
        spechost_sdk::testing::set_tree_paths(1);
        remove_draft_model();
    }

    #[test]
    fn bad_settings_name_the_key() {
        for (config, needle) in [("p_min=2", "p_min"), ("colour=red", "colour")] {
            let error = Draft::new(config, &facts()).err().expect("rejected");
            assert!(error.contains(needle), "{config}: {error}");
        }
    }
}
