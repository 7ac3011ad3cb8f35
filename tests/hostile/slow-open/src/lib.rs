//! Hostile drafter: its `new` spins for practically ever (2^64 iterations), a very slow
//! constructor.

use std::hint::black_box;

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Would propose nothing, if its constructor ever returned.
pub struct SlowOpen;

impl Drafter for SlowOpen {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        // Counts to u64::MAX: centuries at any speed. `black_box` stops the optimizer from
        // computing the result without running the loop.
        let mut spins: u64 = 0;
        while black_box(spins) < u64::MAX {
            spins += 1;
        }
        Ok(Self)
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        Proposal::empty()
    }
}

export_drafter!(SlowOpen);
