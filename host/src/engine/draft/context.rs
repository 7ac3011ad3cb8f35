//! [`DraftModelContext`]: one plugin instance's own draft-model context (`run`, `bench`).

use super::batch::{DraftAsk, DraftBatch};
use super::fed::FedTokens;
use crate::cascade::{DraftModel, Drafted, ProposalSettings, Token};
use crate::engine::context::SeqId;

/// One draft context: the tokens fed since the last reset, and a KV cache that holds a prefix
/// of them (plus, after a proposal, the tokens drafted beyond them).
pub struct DraftModelContext {
    batch: DraftBatch,
    fed: FedTokens,
}

impl DraftModelContext {
    pub(super) fn new(batch: DraftBatch, vocab_size: u32) -> Self {
        let fed = FedTokens::new(vocab_size, batch.ctx_size() as usize);
        Self { batch, fed }
    }

    /// Context size in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.batch.ctx_size()
    }

    /// The tokens fed since the last reset, at most a context's worth.
    pub fn context_tokens(&self) -> &[Token] {
        self.fed.tokens()
    }

    /// How many matrix products of this context's batches (prompt catch-ups) the host's batched
    /// kernel computed, as `Session::host_batch_products` for the target.
    pub fn host_batch_products(&self) -> u64 {
        self.batch.host_batch_products()
    }
}

impl DraftModel for DraftModelContext {
    fn reset(&mut self) {
        // The cache is kept: a new request that starts like the last one (a shared system
        // prompt) reuses it, and `propose` trims what differs.
        self.fed.reset();
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.fed.feed(tokens);
    }

    fn propose(&mut self, settings: ProposalSettings) -> Drafted {
        let Some(context) = self.fed.draftable() else {
            return Drafted::default();
        };
        let mut proposal = Drafted::default();
        self.batch.propose(
            &[DraftAsk {
                seq: SeqId::FIRST,
                context,
                settings,
            }],
            |_, drafted| proposal = drafted,
        );
        proposal
    }
}
