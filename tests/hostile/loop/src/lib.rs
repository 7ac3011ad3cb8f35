//! Hostile drafter: never returns from `propose` (an infinite loop the optimizer cannot remove).

use std::hint::black_box;

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Opens and feeds normally, then spins forever in `propose`.
pub struct InfiniteLoop;

impl Drafter for InfiniteLoop {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self)
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        // `black_box` makes every iteration an observable use of the counter, so the loop is
        // compiled as written; only the host's time limit (epoch interruption) can end it.
        let mut spins: u64 = 0;
        loop {
            spins = black_box(spins.wrapping_add(1));
        }
    }
}

export_drafter!(InfiniteLoop);
