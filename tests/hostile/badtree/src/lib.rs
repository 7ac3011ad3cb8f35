//! Hostile drafter: proposes two valid tokens and declares them two paths from the root, whether
//! or not the host takes trees (`tree::max_paths`), and a shape that names a later row as a
//! parent when it does.

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter, tree};

/// Proposes the last token and the one after it, as a tree the host did not ask for.
pub struct BadTree {
    last: Token,
}

impl Drafter for BadTree {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self { last: 0 })
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.last = tokens.last().copied().unwrap_or(self.last);
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        if max_draft_len < 2 {
            return Proposal::empty();
        }
        if tree::max_paths() > 1 {
            // Token 0 under row 2, which comes after it.
            tree::shape_proposal(&[2, 0]);
        } else {
            tree::shape_proposal(&[0, 0]);
        }
        Proposal::tokens([self.last, self.last.wrapping_add(1) % 1000])
    }
}

export_drafter!(BadTree);
