//! Tree drafts in a session of one sequence: [`Session::verify_tree`] decodes a tree's rows in
//! one batch (`engine/context/tree.rs` says how each row attends to its own path only), walks
//! it with the target's samples, and keeps exactly the accepted path in the cache.
//!
//! The cache keeps a row in place only while the accepted path is the tree's leading chain (its
//! rows right after the context); accepted rows elsewhere in the tree are *unsettled*:
//! committed, but decoded again at the start of the next round's batch, after the kept cells,
//! so that the sequence's cells stay in position order and every later row sums attention in
//! the same order as plain decoding.

use std::time::Instant;

use super::{Sampled, Session, decode_error};
use crate::cascade::TreeShape;
use crate::engine::context::{SeqId, TreeRow, tree_rows};
use crate::engine::error::EngineError;
use crate::engine::rounds::{RoundDraft, Verified, VerifyBatch};

impl Session<'_> {
    /// Whether `round` goes through [`Self::verify_tree`]: it is a tree, or the last tree left
    /// accepted tokens to decode again.
    pub(super) fn needs_tree_verify(&self, round: &RoundDraft) -> bool {
        !round.parents.is_empty() || !self.unsettled.is_empty()
    }

    /// Verifies `round`, a tree (or a chain after a tree), in the first sequence: decodes the
    /// unsettled tokens of the last tree, `last` and the tree's rows in one batch, follows the
    /// tree from row 0 with the target's tokens (sampled as [`Self::settle_round`] does a
    /// chain, a drawn chain's by rejection sampling), and keeps in the cache the context plus
    /// the accepted path's leading chain.
    pub(super) fn verify_tree(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
        let started = Instant::now();
        let shape = TreeShape::new(&round.tokens, &round.parents);
        shape.check().map_err(|reason| tree_error(&shape, reason))?;
        let paths = shape.leaves().len();
        if paths > self.context.tree_leaves() {
            return Err(tree_error(
                &shape,
                format!(
                    "it has {paths} paths and this session verifies at most {}",
                    self.context.tree_leaves()
                ),
            ));
        }
        let held = self.context.sequence_len(SeqId::FIRST);
        if held + self.unsettled.len() != round.n_past {
            return Err(tree_error(
                &shape,
                format!(
                    "the round starts at position {} but the cache holds {held} positions and {} more to decode",
                    round.n_past,
                    self.unsettled.len()
                ),
            ));
        }
        let all_paths: Vec<SeqId> = (0..paths as u32).map(SeqId).collect();
        let mut rows: Vec<TreeRow> = self
            .unsettled
            .iter()
            .enumerate()
            .map(|(offset, &token)| TreeRow {
                token,
                position: held + offset,
                paths: all_paths.clone(),
                logits: false,
            })
            .collect();
        let first_output = rows.len();
        rows.extend(tree_rows(&shape, round.last, round.n_past));
        self.check_fits(held, rows.len())?;
        self.context
            .branch(paths)
            .map_err(|e| decode_error(rows.len(), e))?;
        let decoded = self.context.decode_tree(&rows);
        let settled = decoded
            .map_err(|e| decode_error(rows.len(), e))
            .and_then(|()| self.follow_tree(&shape, round, first_output));
        // Whatever happened, only the first sequence's cells up to its kept rows remain (the
        // context alone after a failure).
        let (kept, keep_to) = match &settled {
            Ok((_, path)) => (leading_chain(path), round.n_past + 1 + leading_chain(path)),
            Err(_) => (0, held),
        };
        let cleaned = self
            .context
            .unbranch(paths)
            .and_then(|()| self.context.remove_positions(SeqId::FIRST, keep_to))
            .map_err(|e| decode_error(rows.len(), e));
        let ((target, logprobs, _), path) = settled?;
        cleaned?;
        self.unsettled = path[kept..]
            .iter()
            .map(|&row| round.tokens[row - 1])
            .collect();
        let batch = VerifyBatch {
            sequences: 1,
            rows: rows.len(),
            committed: target.len(),
            time: started.elapsed(),
        };
        Ok(Verified {
            drafted: round.tokens.len(),
            tokens: target,
            logprobs,
            batch,
            replayed: self.unsettled.len(),
        })
    }

    /// Samples the target along `shape` from row 0 (its logits at batch index `first_output`,
    /// each row's after it): the target's tokens and the rows of the accepted path.
    fn follow_tree(
        &mut self,
        shape: &TreeShape<'_>,
        round: &RoundDraft,
        first_output: usize,
    ) -> Result<(Sampled, Vec<usize>), EngineError> {
        let sampler = self
            .samplers
            .first_mut()
            .and_then(Option::as_mut)
            .ok_or(EngineError::NoRequest)?;
        let mut target = Vec::with_capacity(round.tokens.len() + 1);
        let mut path = Vec::new();
        let mut row = 0;
        loop {
            let logits = self.context.logits(first_output + row);
            // Drawn drafts are chains: the token drawn after row `row` is row `row + 1`'s.
            let drawn = round
                .distributions
                .get(row)
                .filter(|_| shape.is_chain() && row < shape.len());
            let token = match drawn {
                Some(distribution) => {
                    sampler.settle_drawn(logits, shape.token(row), distribution)?
                }
                None => sampler.sample(logits)?,
            };
            target.push(token);
            match shape.child(row, token) {
                Some(child) => {
                    path.push(child);
                    row = child;
                }
                None => break,
            }
        }
        Ok(((target, sampler.take_logprobs(), 0), path))
    }
}

/// Accepted rows that continue the tree's leading chain: row `d` at depth `d`, from the start.
fn leading_chain(path: &[usize]) -> usize {
    path.iter()
        .enumerate()
        .take_while(|&(depth, &row)| row == depth + 1)
        .count()
}

fn tree_error(shape: &TreeShape<'_>, reason: String) -> EngineError {
    decode_error(shape.len() + 1, format!("a tree draft: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::leading_chain;

    #[test]
    fn only_the_accepted_rows_right_after_the_context_stay_in_place() {
        assert_eq!(leading_chain(&[1, 2, 3]), 3);
        assert_eq!(leading_chain(&[1, 4, 5]), 1);
        assert_eq!(leading_chain(&[6]), 0);
        assert_eq!(leading_chain(&[]), 0);
    }
}
