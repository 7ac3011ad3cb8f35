//! Hostile drafter: allocates memory without bound in `propose`, 1 MiB at a time, writing every
//! byte and keeping every block.

use std::hint::black_box;

use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Size of each block `propose` allocates.
const BLOCK_BYTES: usize = 1 << 20;
/// Non-zero fill, so every page is written rather than left to a lazily zeroed allocation.
const FILL_BYTE: u8 = 0xA5;

/// Hoards memory in `propose` until the host's memory cap stops it.
pub struct UnboundedAlloc {
    hoard: Vec<Vec<u8>>,
}

impl Drafter for UnboundedAlloc {
    fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
        Ok(Self { hoard: Vec::new() })
    }

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _max_draft_len: usize) -> Proposal {
        loop {
            let block = vec![FILL_BYTE; BLOCK_BYTES];
            self.hoard.push(black_box(block));
        }
    }
}

export_drafter!(UnboundedAlloc);
