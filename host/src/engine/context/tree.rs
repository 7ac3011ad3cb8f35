//! Tree drafts in a context of one sequence: a tree's rows decoded in one batch, each attending
//! to the context and its own ancestors only, and the start-up check that they decode as their
//! paths one by one.
//!
//! llama.cpp masks a row's attention to the cells of the sequences it belongs to. During a
//! tree's decode every path of the tree is a sequence: [`SeqId::FIRST`] (the context's own)
//! for the path the session keeps in place, `1..` for the others, each first given the
//! context's cells ([`ModelContext::branch`]); a row belongs to the sequences of the paths
//! through it. Afterwards only the first sequence remains ([`ModelContext::unbranch`]), cut
//! back to the rows it keeps. Flash attention skips masked cells, so a row sums over the same
//! cells in the same order as its path decoded one token at a time, provided the kept path's
//! cells stay in position order: the caller keeps only a leading chain of the tree's rows (the
//! cells right after the context) and decodes any other accepted row again, after them.

use super::{ModelContext, Outputs, Rows, SeqId};
use crate::cascade::{Token, TreeShape};
use crate::engine::model::to_llama;

/// One row of a tree's decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) struct TreeRow {
    /// Its token.
    pub(in crate::engine) token: Token,
    /// Its position: the context's length plus its depth in the tree.
    pub(in crate::engine) position: usize,
    /// The sequences of the paths through it (at least one; the first may be any of them).
    pub(in crate::engine) paths: Vec<SeqId>,
    /// Whether it gets logits.
    pub(in crate::engine) logits: bool,
}

/// The start-up check's context, before its tree.
const CHECK_CONTEXT: [Token; 5] = [7, 8, 9, 10, 11];
/// The check's tree after the token at row 0: a chain of three, a second path leaving it after
/// its first token, and a third from row 0.
const CHECK_TREE: [Token; 6] = [30, 31, 32, 40, 41, 50];
/// The row each token of [`CHECK_TREE`] continues.
const CHECK_PARENTS: [usize; 6] = [0, 1, 2, 1, 4, 0];
/// Row 0's token in the check.
const CHECK_LAST: Token = 20;
/// The path through the check's tree the target is taken to follow: rows 1, 4, 5.
const CHECK_PATH: [usize; 3] = [1, 4, 5];
/// Tokens the check decodes after the tree, as the next round would.
const CHECK_AFTER: [Token; 2] = [60, 61];

impl ModelContext<'_> {
    /// Most paths of a tree this context decodes (1: chains only).
    pub(in crate::engine) fn tree_leaves(&self) -> usize {
        self.tree_leaves as usize
    }

    /// Gives sequences `1..paths` the first sequence's cells, for a tree of `paths` paths.
    pub(in crate::engine) fn branch(&mut self, paths: usize) -> Result<(), String> {
        self.check_paths(paths)?;
        for path in 1..paths {
            self.copy_sequence(SeqId::FIRST, SeqId(path as u32))?;
        }
        Ok(())
    }

    /// Empties sequences `1..paths`: what a tree of `paths` paths held beyond the first
    /// sequence's cells.
    pub(in crate::engine) fn unbranch(&mut self, paths: usize) -> Result<(), String> {
        for path in 1..paths.min(self.tree_leaves as usize) {
            self.remove_cells(SeqId(path as u32), 0)?;
        }
        Ok(())
    }

    /// Decodes `rows` in one batch, in order; the logits of the `i`-th row are
    /// [`Self::logits`]`(i)`, if it has any.
    pub(in crate::engine) fn decode_tree(&mut self, rows: &[TreeRow]) -> Result<(), String> {
        if rows.is_empty() || rows.len() > self.batch_capacity {
            return Err(format!(
                "a batch holds 1 to {} tokens, not {}",
                self.batch_capacity,
                rows.len()
            ));
        }
        self.batch.clear();
        for row in rows {
            let paths: Vec<i32> = row.paths.iter().map(|seq| seq.llama()).collect();
            if paths.is_empty() || row.paths.iter().any(|seq| seq.0 >= self.tree_leaves) {
                return Err(format!(
                    "a tree row belongs to 1 to {} paths, not to {:?}",
                    self.tree_leaves, row.paths
                ));
            }
            self.batch
                .add(to_llama(row.token), row.position as i32, &paths, row.logits)
                .map_err(|e| e.to_string())?;
        }
        self.decode_filled_batch()
    }

    fn check_paths(&self, paths: usize) -> Result<(), String> {
        if paths == 0 || paths > self.tree_leaves as usize {
            return Err(format!(
                "this context decodes trees of 1 to {} paths, not {paths}",
                self.tree_leaves
            ));
        }
        Ok(())
    }

    /// Checks that a tree decodes as its paths one by one: the rows of a path through the
    /// check's tree that leaves its first chain, decoded in the tree's batch after a context,
    /// give the same logits, bit for bit, as the context and that path decoded one token at a
    /// time; and so do the path's rows decoded again after the tree's chain was cut back to
    /// its first row, with tokens after them (the cells the tree freed, filled again). Leaves
    /// the cache to be emptied by the caller.
    pub(super) fn check_tree(&mut self) -> Result<(), String> {
        let path_tokens: Vec<Token> = CHECK_PATH.iter().map(|&row| CHECK_TREE[row - 1]).collect();
        let one_by_one: Vec<Token> = CHECK_CONTEXT
            .iter()
            .copied()
            .chain([CHECK_LAST])
            .chain(path_tokens.iter().copied())
            .chain(CHECK_AFTER)
            .collect();
        if one_by_one.len() > self.n_ctx() as usize {
            return Ok(());
        }
        let mut expected = Vec::with_capacity(one_by_one.len());
        for (position, &token) in one_by_one.iter().enumerate() {
            self.decode_one(SeqId::FIRST, token, position)?;
            expected.push(self.logits(0).to_vec());
        }
        // Logits after row 0 and each path row: positions `context..`.
        let expected = &expected[CHECK_CONTEXT.len()..];
        self.clear();
        for (position, &token) in CHECK_CONTEXT.iter().enumerate() {
            self.decode_one(SeqId::FIRST, token, position)?;
        }
        let shape = TreeShape::new(&CHECK_TREE, &CHECK_PARENTS);
        let paths = shape.leaves().len();
        let rows = tree_rows(&shape, CHECK_LAST, CHECK_CONTEXT.len());
        self.branch(paths)?;
        self.decode_tree(&rows)?;
        for (depth, &row) in std::iter::once(&0).chain(&CHECK_PATH).enumerate() {
            compare(
                &format!("tree row {row} (depth {depth})"),
                self.logits(row),
                &expected[depth],
            )?;
        }
        // Keep row 0 and row 1 (the chain's first token, on the path), drop the rest, and
        // decode the path's other rows again with the tokens after them.
        self.unbranch(paths)?;
        let kept = CHECK_CONTEXT.len() + 2;
        self.remove_cells(SeqId::FIRST, kept)?;
        let again: Vec<Token> = path_tokens[1..]
            .iter()
            .copied()
            .chain(CHECK_AFTER)
            .collect();
        self.decode_rows(&[Rows {
            seq: SeqId::FIRST,
            tokens: &again,
            position: kept,
            outputs: Outputs::All,
        }])?;
        for (index, expected) in expected[2..].iter().enumerate() {
            compare(
                &format!("row {index} decoded again after the tree"),
                self.logits(index),
                expected,
            )?;
        }
        Ok(())
    }
}

/// The rows of a tree draft of `shape` after `last` (row 0) at `position`, every one with
/// logits: the path ending on the first of [`TreeShape::leaves`] is sequence 0, the others
/// `1..` in order, and a row belongs to the paths through it.
pub(in crate::engine) fn tree_rows(
    shape: &TreeShape<'_>,
    last: Token,
    position: usize,
) -> Vec<TreeRow> {
    let depths = shape.depths();
    let mut rows: Vec<TreeRow> = depths
        .iter()
        .enumerate()
        .map(|(row, depth)| TreeRow {
            token: row.checked_sub(1).map_or(last, |index| shape.token(index)),
            position: position + depth,
            paths: Vec::new(),
            logits: true,
        })
        .collect();
    for (path, leaf) in shape.leaves().into_iter().enumerate() {
        let mut row = leaf;
        loop {
            rows[row].paths.push(SeqId(path as u32));
            if row == 0 {
                break;
            }
            row = shape.parent(row - 1);
        }
    }
    rows
}

/// Errors naming `what` and the first token whose logits differ.
fn compare(what: &str, got: &[f32], expected: &[f32]) -> Result<(), String> {
    match (0..got.len().min(expected.len())).find(|&t| got[t].to_bits() != expected[t].to_bits()) {
        Some(token) => Err(format!(
            "{what}, token {token}: tree {} vs one by one {}",
            got[token], expected[token]
        )),
        None if got.len() != expected.len() => Err(format!("{what}: logits of different sizes")),
        None => Ok(()),
    }
}
