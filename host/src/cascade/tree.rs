//! Drafts shaped as trees: several continuations of the context, verified in one batch.
//!
//! A tree draft is a list of tokens in which every token comes after the one it continues, its
//! *parent*, named by a *row*: row 0 is the round's last committed token (the one the target
//! has not read yet), row `i + 1` is draft token `i`. So `parents[i] <= i`, and a chain (each
//! token continuing the one before) has `parents[i] == i`; an empty `parents` means a chain.
//! The target accepts the longest path from row 0 that it agrees with ([`TreeShape::follow`]).
//!
//! [`TreeBuilder`] merges the proposals of several sources into one tree under a token budget,
//! keeping the tokens most likely to be accepted, with the best proposal first: its leading
//! tokens are the tree's first rows (the *spine*), which a verifier keeps in its cache in
//! place when the target follows them.

use std::time::Duration;

use spechost_sdk::check_tree;
use spechost_sdk::tree::{Branch, likeliest_first};

use super::policy::curve_cost;
use super::source::Token;

/// The shape of a draft: its tokens and which row each continues (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct TreeShape<'d> {
    tokens: &'d [Token],
    parents: &'d [usize],
}

impl<'d> TreeShape<'d> {
    /// The shape of `tokens` hanging from `parents` (empty: a chain).
    pub fn new(tokens: &'d [Token], parents: &'d [usize]) -> Self {
        Self { tokens, parents }
    }

    /// Errors unless the shape is well formed: `parents` empty or one per token, each naming
    /// an earlier row, and no two children of a row with the same token (the second could
    /// never be reached).
    ///
    /// These are the rules a plugin's tree proposal is held to ([`check_tree`]), with no limit
    /// on its paths.
    pub fn check(&self) -> Result<(), String> {
        if self.parents.is_empty() {
            return Ok(());
        }
        let parents: Vec<u32> = self
            .parents
            .iter()
            .map(|&row| u32::try_from(row).unwrap_or(u32::MAX))
            .collect();
        check_tree(self.tokens, &parents, usize::MAX).map_err(|broken| broken.to_string())
    }

    /// Draft tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the shape has no draft tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Draft token `index`.
    pub fn token(&self, index: usize) -> Token {
        self.tokens[index]
    }

    /// Whether every token continues the one before it.
    pub fn is_chain(&self) -> bool {
        self.spine_len() == self.tokens.len()
    }

    /// The row draft token `index` continues.
    pub fn parent(&self, index: usize) -> usize {
        self.parents.get(index).copied().unwrap_or(index)
    }

    /// Leading tokens that form a chain from row 0 (each continuing the one before).
    pub fn spine_len(&self) -> usize {
        (0..self.tokens.len())
            .take_while(|&index| self.parent(index) == index)
            .count()
    }

    /// The row of the first child of `row` whose token is `token`.
    pub fn child(&self, row: usize, token: Token) -> Option<usize> {
        (0..self.tokens.len())
            .find(|&index| self.parent(index) == row && self.tokens[index] == token)
            .map(|index| index + 1)
    }

    /// The rows of the path the target's tokens `target` take from row 0, as far as the tree
    /// holds them: `target[d]` is the token of the path's row at depth `d + 1`. Its length is
    /// how many draft tokens the target accepted.
    pub fn follow(&self, target: &[Token]) -> Vec<usize> {
        let mut path = Vec::new();
        let mut row = 0;
        for &token in target {
            match self.child(row, token) {
                Some(child) => {
                    path.push(child);
                    row = child;
                }
                None => break,
            }
        }
        path
    }

    /// Depth of every row: 0 for row 0, its parent's plus one for a token's.
    pub fn depths(&self) -> Vec<usize> {
        let mut depths = Vec::with_capacity(self.tokens.len() + 1);
        depths.push(0);
        for index in 0..self.tokens.len() {
            let depth = depths[self.parent(index)] + 1;
            depths.push(depth);
        }
        depths
    }

    /// Rows without children, the row the first-child path from row 0 ends on first, then
    /// the others in row order. A chain (or an empty draft) has one.
    pub fn leaves(&self) -> Vec<usize> {
        let rows = self.tokens.len() + 1;
        let mut first_child = vec![None; rows];
        for index in (0..self.tokens.len()).rev() {
            first_child[self.parent(index)] = Some(index + 1);
        }
        let mut first_leaf = 0;
        while let Some(child) = first_child[first_leaf] {
            first_leaf = child;
        }
        std::iter::once(first_leaf)
            .chain((0..rows).filter(|&row| row != first_leaf && first_child[row].is_none()))
            .collect()
    }
}

/// A tree merged from several sources' proposals, before it is cut to a budget.
#[derive(Debug, Clone, Default)]
pub(super) struct TreeBuilder {
    tokens: Vec<Token>,
    /// Row each token continues.
    parents: Vec<usize>,
    /// Estimated probability that the target accepts the path through each token.
    survival: Vec<f64>,
}

impl TreeBuilder {
    /// Adds a proposal of `tokens` hanging from `parents` (empty: a chain; see the module docs)
    /// with the estimated probability `survival[i]` that the target accepts it through token
    /// `i` (one per token), sharing the rows of the paths already in the tree. A token already
    /// there keeps the higher estimate of the two; an estimate never exceeds its parent's.
    pub(super) fn add(&mut self, tokens: &[Token], parents: &[usize], survival: &[f64]) {
        let shape = TreeShape::new(tokens, parents);
        // The builder's row of each of the proposal's rows.
        let mut rows = Vec::with_capacity(tokens.len() + 1);
        rows.push(0);
        for (index, (&token, &estimate)) in tokens.iter().zip(survival).enumerate() {
            let Some(&row) = rows.get(shape.parent(index)) else {
                break;
            };
            let existing = TreeShape::new(&self.tokens, &self.parents).child(row, token);
            let parent_estimate = row.checked_sub(1).map_or(1.0, |i| self.survival[i]);
            let estimate = estimate.clamp(0.0, parent_estimate);
            rows.push(match existing {
                Some(child) => {
                    let kept = &mut self.survival[child - 1];
                    *kept = kept.max(estimate);
                    child
                }
                None => {
                    self.tokens.push(token);
                    self.parents.push(row);
                    self.survival.push(estimate);
                    self.tokens.len()
                }
            });
        }
    }

    /// The tokens a tree of at most `budget` tokens and `max_leaves` paths keeps, by index in
    /// the order taken: the likeliest first (the first added on a tie), each after its parent
    /// (`spechost_sdk::tree::likeliest_first`). Every prefix is the likeliest tree of its
    /// size.
    pub(super) fn likeliest_first(&self, budget: usize, max_leaves: usize) -> Vec<usize> {
        let branches: Vec<Branch> = (0..self.tokens.len())
            .map(|index| Branch {
                parent: self.parents[index].checked_sub(1),
                token: self.tokens[index],
                probability: self.survival[index],
            })
            .collect();
        likeliest_first(&branches, budget, max_leaves)
    }

    /// How many of `taken` (a prefix of [`Self::likeliest_first`]) form a chain and the next
    /// one: the size from which a prefix branches; more than `taken` holds when none does.
    pub(super) fn branched(&self, taken: &[usize]) -> usize {
        let mut has_child = vec![false; self.tokens.len() + 1];
        for (position, &index) in taken.iter().enumerate() {
            let parent = self.parents[index];
            if has_child[parent] {
                return position + 1;
            }
            has_child[parent] = true;
        }
        taken.len() + 1
    }

    /// The estimated probability that the target accepts the path through token `index`.
    pub(super) fn survival(&self, index: usize) -> f64 {
        self.survival[index]
    }

    /// The tree of the `kept` tokens (a prefix of [`Self::likeliest_first`]), laid out depth
    /// first, each row's children in the order they were added: `(tokens, parents, survival)`.
    /// The first proposal's kept tokens lead, as a chain.
    pub(super) fn build(self, kept: &[usize]) -> (Vec<Token>, Vec<usize>, Vec<f64>) {
        let mut is_kept = vec![false; self.tokens.len()];
        for &index in kept {
            is_kept[index] = true;
        }
        let mut tokens = Vec::with_capacity(kept.len());
        let mut parents = Vec::with_capacity(kept.len());
        let mut survival = Vec::with_capacity(kept.len());
        // Depth first from row 0: (row in the builder, row of its parent in the tree built),
        // children pushed in reverse so that the first added is visited first.
        let mut stack = vec![(0, 0)];
        while let Some((old_row, new_parent)) = stack.pop() {
            let new_row = if old_row == 0 {
                0
            } else {
                tokens.push(self.tokens[old_row - 1]);
                parents.push(new_parent);
                survival.push(self.survival[old_row - 1]);
                tokens.len()
            };
            for index in (0..self.tokens.len()).rev() {
                if is_kept[index] && self.parents[index] == old_row {
                    stack.push((index + 1, new_row));
                }
            }
        }
        (tokens, parents, survival)
    }
}

/// Tree mode's choice each round: how many of a merged tree's tokens to verify, taken likeliest
/// first with estimated survivals `taken` ([`TreeBuilder::likeliest_first`]) and branching
/// from the first `branched` tokens on, or `None` to verify the best proposal alone (survivals
/// `draft`, sized by the policy). Each is worth its expected committed tokens (the accepted
/// ones, the sum of the survivals, plus the target's own) per second of verifying them by the
/// measured `verify_costs` (index `n - 1`: `n` tokens); the best wins, the proposal alone on a
/// tie, and a tree only at a size where it branches. Without a measured curve, the whole tree.
pub(super) fn tree_size(
    verify_costs: &[Duration],
    draft: &[f64],
    taken: &[f64],
    branched: usize,
) -> Option<usize> {
    if branched > taken.len() {
        return None;
    }
    if verify_costs.is_empty() {
        return Some(taken.len());
    }
    let rate =
        |expected: f64, tokens: usize| (expected + 1.0) / curve_cost(verify_costs, tokens + 1);
    let alone = rate(draft.iter().sum(), draft.len());
    let mut best: Option<(usize, f64)> = None;
    let mut expected: f64 = taken[..branched.saturating_sub(1)].iter().sum();
    for size in branched.max(1)..=taken.len() {
        expected += taken[size - 1];
        let tree = rate(expected, size);
        if tree > alone && best.is_none_or(|(_, best)| tree > best) {
            best = Some((size, tree));
        }
    }
    best.map(|(size, _)| size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows 1-3 a chain, row 4 a second child of row 1, row 5 a second child of row 0.
    const TOKENS: [Token; 5] = [10, 11, 12, 21, 30];
    const PARENTS: [usize; 5] = [0, 1, 2, 1, 0];

    #[test]
    fn a_tree_is_followed_along_the_targets_tokens() {
        let shape = TreeShape::new(&TOKENS, &PARENTS);
        shape.check().expect("well formed");
        assert_eq!(shape.follow(&[10, 11, 12, 99]), vec![1, 2, 3]);
        assert_eq!(shape.follow(&[10, 21, 5]), vec![1, 4]);
        assert_eq!(shape.follow(&[30, 10]), vec![5]);
        assert_eq!(shape.follow(&[7]), Vec::<usize>::new());
        assert_eq!(shape.depths(), vec![0, 1, 2, 3, 2, 1]);
        assert_eq!(shape.leaves(), vec![3, 4, 5]);
        assert_eq!(shape.spine_len(), 3);
        assert!(!shape.is_chain());
    }

    #[test]
    fn a_chain_is_a_tree_with_one_leaf() {
        let tokens = [4, 5, 6];
        for parents in [&[][..], &[0, 1, 2][..]] {
            let shape = TreeShape::new(&tokens, parents);
            shape.check().expect("well formed");
            assert!(shape.is_chain());
            assert_eq!(shape.leaves(), vec![3]);
            assert_eq!(shape.follow(&[4, 5, 9]), vec![1, 2]);
        }
        assert_eq!(TreeShape::new(&[], &[]).leaves(), vec![0]);
    }

    #[test]
    fn the_first_leaf_ends_the_first_child_path() {
        // Row 1's child (row 3) comes after row 0's second child (row 2).
        let shape = TreeShape::new(&[1, 2, 3], &[0, 0, 1]);
        shape.check().expect("well formed");
        assert_eq!(shape.leaves(), vec![3, 2]);
    }

    #[test]
    fn malformed_shapes_are_refused_with_the_reason() {
        let later = TreeShape::new(&[1, 2], &[0, 2])
            .check()
            .expect_err("row 2 is itself");
        assert!(later.contains("not before it"), "{later}");
        let twins = TreeShape::new(&[1, 1], &[0, 0])
            .check()
            .expect_err("same token twice");
        assert!(twins.contains("same token"), "{twins}");
        let short = TreeShape::new(&[1, 2], &[0])
            .check()
            .expect_err("one parent missing");
        assert!(short.contains("one per token"), "{short}");
    }

    #[test]
    fn a_tree_is_verified_where_it_commits_more_per_second_of_verification() {
        let ms = Duration::from_millis;
        // One token costs 10 ms; each more 2 ms.
        let curve: Vec<Duration> = (0..16).map(|n| ms(10 + 2 * n)).collect();
        // The proposal alone: 1.9 expected in 4 tokens, 2.9 per 18 ms. A tree whose third and
        // fourth tokens are likelier (a second path) commits more per ms at 4 tokens; its
        // unlikely fifth does not pay for itself.
        let draft = [0.9, 0.6, 0.3, 0.1];
        let taken = [0.9, 0.6, 0.5, 0.4, 0.01];
        assert_eq!(tree_size(&curve, &draft, &taken, 3), Some(4));
        // Not before it branches: a chain is the policy's to size.
        assert_eq!(tree_size(&curve, &draft, &taken, 6), None);
        assert_eq!(tree_size(&curve, &draft, &draft, 5), None);
        // A tree no better than the proposal: the proposal.
        let weak = [0.9, 0.6, 0.05, 0.05];
        assert_eq!(tree_size(&curve, &draft, &weak, 3), None);
        // Where extra tokens cost nearly nothing, the whole tree.
        let flat: Vec<Duration> = (0..16).map(|_| ms(10)).collect();
        assert_eq!(tree_size(&flat, &draft, &taken, 3), Some(5));
        // Unmeasured: the whole tree.
        assert_eq!(tree_size(&[], &draft, &taken, 3), Some(5));
    }

    #[test]
    fn merged_proposals_keep_the_likeliest_tokens_under_the_budget() {
        let mut builder = TreeBuilder::default();
        builder.add(&[1, 2, 3, 4], &[], &[0.9, 0.8, 0.5, 0.2]);
        // A tree: 1 2 7, and 9 8 from the root.
        builder.add(
            &[1, 2, 7, 9, 8],
            &[0, 1, 2, 0, 4],
            &[0.6, 0.6, 0.6, 0.3, 0.1],
        );
        let build = |budget, max_leaves| {
            let kept = builder.likeliest_first(budget, max_leaves);
            builder.clone().build(&kept)
        };
        let (tokens, parents, survival) = build(8, 8);
        assert_eq!(tokens, vec![1, 2, 3, 4, 7, 9, 8]);
        assert_eq!(parents, vec![0, 1, 2, 3, 2, 0, 6]);
        assert_eq!(survival, vec![0.9, 0.8, 0.5, 0.2, 0.6, 0.3, 0.1]);
        // Four tokens: the shared 1 2, then 7 (0.6) before 3 (0.5); the first proposal's
        // tokens still lead.
        assert_eq!(builder.likeliest_first(4, 8), [0, 1, 4, 2]);
        assert_eq!(
            builder.branched(&[0, 1, 4, 2]),
            4,
            "3 is a second child of 2"
        );
        assert_eq!(builder.branched(&[0, 1, 4]), 4, "a chain");
        let (tokens, parents, _) = build(4, 8);
        assert_eq!(tokens, vec![1, 2, 3, 7]);
        assert_eq!(parents, vec![0, 1, 2, 2]);
        // One path only: the likeliest chain, whatever else fits the budget.
        let (tokens, parents, _) = build(8, 1);
        assert_eq!(tokens, vec![1, 2, 7]);
        assert!(TreeShape::new(&tokens, &parents).is_chain());
    }
}
