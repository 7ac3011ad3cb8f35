//! Tree proposals: several continuations of the context in one proposal, which the host
//! verifies together in one batch where it can (`spechost run` and `bench` with
//! `--cascade-mode tree`; WIT interface `tree`, since 0.8.1).
//!
//! A tree proposal lists its tokens so that each comes after the one it continues, named by a
//! row: row 0 is the last token of the context, row `i + 1` the proposal's token `i`. Inside
//! [`Drafter::propose`](crate::Drafter::propose), a drafter that has several candidates asks
//! [`max_paths`]; above 1, it may return them as a tree within `max_draft_len` tokens over
//! all paths, declaring its shape with [`shape_proposal`], and give as each token's confidence
//! the probability that the target accepts the path through it. Without a call the proposal is
//! a chain, as before 0.8.1.
//!
//! A drafter with its candidates in hand lists them as [`Branch`]es and lets [`likeliest`]
//! keep the best within the budget and lay them out; [`likeliest_first`] and [`lay_out`] are
//! its two halves, for a drafter that chooses its own way.
//!
//! Built natively, for tests, [`max_paths`] answers what
//! [`crate::testing::set_tree_paths`] set on the current thread (1 by default), and the shape
//! is kept for the test harness, which checks it with [`crate::check_tree`] as the host does.
//!
//! ```
//! use spechost_sdk::testing::{set_tree_paths, take_tree_shape};
//! use spechost_sdk::tree;
//!
//! set_tree_paths(4);
//! assert_eq!(tree::max_paths(), 4);
//! // 5 6, and 5 7: two paths after a shared first token.
//! tree::shape_proposal(&[0, 1, 1]);
//! assert_eq!(take_tree_shape(), Some(vec![0, 1, 1]));
//! ```

use crate::{Proposal, Token};

/// A candidate token of a tree proposal, for [`likeliest`] and [`lay_out`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Branch {
    /// The candidate this one continues, by index in the same list (always an earlier one);
    /// `None`: it continues the context.
    pub parent: Option<usize>,
    /// The token.
    pub token: Token,
    /// Estimated probability that the target accepts the path through this token; taken as at
    /// most its parent's.
    pub probability: f64,
}

/// The branches a tree of at most `max_tokens` tokens and `max_paths` paths keeps, by index in
/// the order taken: the likeliest first, the earlier listed on a tie, each after its parent.
/// `branches` lists parents before their children, no two children of one parent with the
/// same token. Every prefix of the order is itself a tree, the likeliest of its size.
pub fn likeliest_first(branches: &[Branch], max_tokens: usize, max_paths: usize) -> Vec<usize> {
    // A child is never likelier than its parent, so in this order parents come first.
    let capped = capped_probabilities(branches);
    let mut order: Vec<usize> = (0..branches.len()).collect();
    order.sort_by(|&a, &b| capped[b].total_cmp(&capped[a]).then(a.cmp(&b)));
    let mut kept = vec![false; branches.len()];
    // Per branch, then the context last: whether it has a kept child.
    let mut has_child = vec![false; branches.len() + 1];
    let mut paths = 1;
    let mut taken = Vec::with_capacity(max_tokens.min(branches.len()));
    for index in order {
        if taken.len() == max_tokens {
            break;
        }
        let parent = branches[index].parent;
        if parent.is_some_and(|parent| parent >= index || !kept[parent]) {
            continue;
        }
        // A child of a leaf extends its path; any other child starts a new one.
        let slot = parent.unwrap_or(branches.len());
        if has_child[slot] && paths >= max_paths.max(1) {
            continue;
        }
        paths += usize::from(has_child[slot]);
        has_child[slot] = true;
        kept[index] = true;
        taken.push(index);
    }
    taken
}

/// The `kept` branches (indices into `branches`) as a proposal: laid out depth first, each
/// row's children likeliest first (the earlier listed on a tie), so that the likeliest path
/// leads; each token's confidence is its probability. A kept branch whose parent is not kept
/// is left out. Returns the proposal and the shape to declare with [`shape_proposal`], empty
/// when the proposal is a chain.
pub fn lay_out(branches: &[Branch], kept: &[usize]) -> (Proposal, Vec<u32>) {
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); branches.len() + 1];
    let mut sorted = kept.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for index in sorted {
        let Some(branch) = branches.get(index) else {
            continue;
        };
        if branch.parent.is_none_or(|parent| parent < index) {
            children[branch.parent.unwrap_or(branches.len())].push(index);
        }
    }
    let probability = capped_probabilities(branches);
    let mut proposal = Proposal::empty();
    let mut parents = Vec::new();
    // (branch, row of its parent), the likeliest child on top.
    let mut stack: Vec<(usize, u32)> = Vec::new();
    let push_children = |stack: &mut Vec<(usize, u32)>, of: &[usize], row: u32| {
        let mut ordered = of.to_vec();
        ordered.sort_by(|&a, &b| probability[b].total_cmp(&probability[a]).then(a.cmp(&b)));
        stack.extend(ordered.into_iter().rev().map(|index| (index, row)));
    };
    push_children(&mut stack, &children[branches.len()], 0);
    while let Some((index, parent_row)) = stack.pop() {
        proposal.tokens.push(branches[index].token);
        // Rounding to `f32` keeps a probability in [0, 1].
        proposal.confidence.push(probability[index] as f32);
        parents.push(parent_row);
        push_children(&mut stack, &children[index], proposal.tokens.len() as u32);
    }
    let chain = parents
        .iter()
        .enumerate()
        .all(|(index, &parent)| parent as usize == index);
    if chain {
        parents.clear();
    }
    (proposal, parents)
}

/// Each branch's probability clamped to [0, 1] (0 when it is not a number) and to its parent's.
fn capped_probabilities(branches: &[Branch]) -> Vec<f64> {
    let mut capped: Vec<f64> = Vec::with_capacity(branches.len());
    for branch in branches {
        // A parent listed later (against the rules) gives 0: such a branch is never kept.
        let parent = branch
            .parent
            .map_or(1.0, |parent| capped.get(parent).copied().unwrap_or(0.0));
        let own = if branch.probability.is_nan() {
            0.0
        } else {
            branch.probability
        };
        capped.push(own.clamp(0.0, parent));
    }
    capped
}

/// The likeliest tree of `branches` within `max_tokens` tokens and `max_paths` paths
/// ([`likeliest_first`]), laid out as a proposal ([`lay_out`]).
pub fn likeliest(branches: &[Branch], max_tokens: usize, max_paths: usize) -> (Proposal, Vec<u32>) {
    lay_out(branches, &likeliest_first(branches, max_tokens, max_paths))
}

/// Most paths (leaves) a tree proposal may have in this session: 1 when the host verifies only
/// chains, so propose the single best continuation, with all of `max_draft_len` for it.
pub fn max_paths() -> usize {
    backend::max_paths() as usize
}

/// Declares that the proposal the current `propose` returns is a tree: `parents[i]` is the row
/// token `i` continues (`parents[i] <= i`). The last call in a `propose` counts; a shape that
/// does not fit the proposal ([`crate::check_tree`]) is a fault.
pub fn shape_proposal(parents: &[u32]) {
    backend::shape_proposal(parents);
}

/// The shape declared on this thread since the last call, for the test harness: natively what
/// [`shape_proposal`] kept; in a component, where the host keeps it, nothing.
pub(crate) fn take_declared_shape() -> Option<Vec<u32>> {
    #[cfg(not(target_arch = "wasm32"))]
    return native::take_shape();
    #[cfg(target_arch = "wasm32")]
    return None;
}

#[cfg(target_arch = "wasm32")]
use crate::bindings::drafter::tree as backend;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use self::native as backend;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod native {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static MAX_PATHS: Cell<u32> = const { Cell::new(1) };
        static SHAPE: RefCell<Option<Vec<u32>>> = const { RefCell::new(None) };
    }

    pub(crate) fn max_paths() -> u32 {
        MAX_PATHS.get()
    }

    pub(crate) fn set_max_paths(paths: u32) {
        MAX_PATHS.set(paths.max(1));
    }

    pub(crate) fn shape_proposal(parents: &[u32]) {
        SHAPE.set(Some(parents.to_vec()));
    }

    pub(crate) fn take_shape() -> Option<Vec<u32>> {
        SHAPE.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn branch(parent: Option<usize>, token: Token, probability: f64) -> Branch {
        Branch {
            parent,
            token,
            probability,
        }
    }

    /// 5 6 7 and 5 8 after the context, and 9 after it.
    fn candidates() -> Vec<Branch> {
        vec![
            branch(None, 5, 0.9),
            branch(Some(0), 6, 0.6),
            branch(Some(1), 7, 0.5),
            branch(Some(0), 8, 0.3),
            branch(None, 9, 0.05),
        ]
    }

    #[test]
    fn the_likeliest_tokens_are_kept_and_the_likeliest_path_leads() {
        let (proposal, parents) = likeliest(&candidates(), 4, 4);
        assert_eq!(proposal.tokens, [5, 6, 7, 8]);
        assert_eq!(parents, [0, 1, 2, 1]);
        assert_eq!(proposal.confidence, [0.9, 0.6, 0.5, 0.3]);
        crate::check_tree(&proposal.tokens, &parents, 4).expect("well formed");
    }

    #[test]
    fn one_path_gives_a_chain_without_a_shape() {
        let (proposal, parents) = likeliest(&candidates(), 8, 1);
        assert_eq!(proposal.tokens, [5, 6, 7]);
        assert!(parents.is_empty());
    }

    #[test]
    fn a_likelier_sibling_listed_later_is_laid_out_first() {
        let branches = [branch(None, 1, 0.2), branch(None, 2, 0.7)];
        let (proposal, parents) = likeliest(&branches, 2, 2);
        assert_eq!(proposal.tokens, [2, 1]);
        assert_eq!(parents, [0, 0]);
    }

    #[test]
    fn a_child_is_never_likelier_than_its_parent() {
        // 6 claims more than 5; capped, it ties and comes after its parent, before 9.
        let branches = [
            branch(None, 5, 0.5),
            branch(Some(0), 6, 0.95),
            branch(None, 9, 0.4),
            branch(Some(2), 3, f64::NAN),
        ];
        let (proposal, parents) = likeliest(&branches, 2, 2);
        assert_eq!(proposal.tokens, [5, 6]);
        assert_eq!(proposal.confidence, [0.5, 0.5]);
        assert!(parents.is_empty());
        let kept = likeliest_first(&branches, 4, 2);
        assert_eq!(kept, [0, 1, 2, 3]);
        assert_eq!(lay_out(&branches, &kept).0.confidence, [0.5, 0.5, 0.4, 0.0]);
    }

    #[test]
    fn every_prefix_of_the_order_taken_is_a_tree() {
        let branches = candidates();
        let order = likeliest_first(&branches, 5, 2);
        // 9 would start a third path.
        assert_eq!(order, [0, 1, 2, 3]);
        for len in 0..=order.len() {
            let (proposal, parents) = lay_out(&branches, &order[..len]);
            assert_eq!(proposal.tokens.len(), len);
            if !parents.is_empty() {
                crate::check_tree(&proposal.tokens, &parents, 2).expect("well formed");
            }
        }
    }

    #[test]
    fn a_branch_listed_before_its_parent_is_never_kept() {
        let branches = [branch(Some(1), 5, 0.9), branch(None, 6, 0.9)];
        assert_eq!(likeliest_first(&branches, 2, 2), [1]);
        assert_eq!(lay_out(&branches, &[0, 1, 7]).0.tokens, [6]);
    }
}
