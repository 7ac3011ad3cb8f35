//! The draft model in a server: one draft context with a sequence per plugin instance that
//! drafts with it, drafted by the batcher for every instance asking in the same step at once.
//!
//! A plugin instance's [`DraftModel`] is a [`BatchedDraftModel`]: it keeps the fed context
//! itself ([`FedTokens`]) and sends each proposal to the batcher, which holds the
//! [`DraftBatch`]. The batcher answers the proposals of every sequence waiting on one in a
//! step together ([`DraftBatch::propose`]: the prompt catch-ups several sequences per decode,
//! then one decode per drafted position for all of them), before it verifies the step's rounds.
//!
//! Sequences are handed out as instances open them, the lowest free first, at most
//! [`DRAFT_SEQUENCES_PER_SLOT`] per slot; an instance beyond that gets no draft model (its
//! plugin is told, and drafts without it), and a sequence is freed when its instance is.
//! Opening does not wait for the batcher (plugins are configured before it runs).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::calls::Call;
use crate::cascade::{DraftModel, DraftModelFactory, Drafted, ProposalSettings, Token};
use crate::engine::context::SeqId;
use crate::engine::draft::{BatchDrafter, DraftAsk, FedTokens, OwnedDraftAsk};

/// Draft-model sequences a server keeps per slot: one for each slot's drafting plugin
/// instance, and as many again for instances of other versions or settings that requests
/// choose.
pub const DRAFT_SEQUENCES_PER_SLOT: usize = 2;

/// The batcher's draft context and the proposals waiting.
pub(super) struct DraftSide<'t> {
    batch: Box<dyn BatchDrafter + 't>,
    waiting: Vec<Waiting>,
}

/// Which draft sequences plugin instances hold, shared by the factory and its handles.
type Taken = Arc<Mutex<Vec<bool>>>;

/// A proposal waiting for the next draft step.
struct Waiting {
    ask: OwnedDraftAsk,
    reply: Sender<Drafted>,
}

impl<'t> DraftSide<'t> {
    pub(super) fn new(batch: Box<dyn BatchDrafter + 't>) -> Self {
        Self {
            batch,
            waiting: Vec::new(),
        }
    }

    /// Sequences of the draft context.
    pub(super) fn sequences(&self) -> usize {
        self.batch.sequences()
    }

    /// Forgets the cache of `seq`, whose instance is gone.
    pub(super) fn close(&mut self, seq: SeqId) {
        self.batch.clear(seq);
        self.waiting.retain(|waiting| waiting.ask.seq != seq);
    }

    /// Queues a proposal for the next draft step.
    pub(super) fn ask(&mut self, ask: OwnedDraftAsk, reply: Sender<Drafted>) {
        self.waiting.push(Waiting { ask, reply });
    }

    /// Context size of each draft sequence, in tokens.
    pub(super) fn ctx_size(&self) -> usize {
        self.batch.ctx_size() as usize
    }

    /// Proposals waiting.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Drafts every waiting proposal together, answering each as soon as it is complete.
    pub(super) fn step(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        let asks: Vec<DraftAsk<'_>> = waiting.iter().map(|waiting| waiting.ask.as_ask()).collect();
        self.batch.propose(&asks, &mut |index, drafted| {
            // An instance that is gone has closed its sequence, or will.
            let _ = waiting[index].reply.send(drafted);
        });
    }
}

/// Opens a [`BatchedDraftModel`] per plugin instance that asks: a sequence of the batcher's
/// draft context.
pub struct BatchedDraftFactory {
    calls: Sender<Call>,
    taken: Taken,
    vocab_size: u32,
    ctx_size: usize,
}

impl BatchedDraftFactory {
    pub(super) fn new(
        calls: Sender<Call>,
        sequences: usize,
        vocab_size: u32,
        ctx_size: usize,
    ) -> Self {
        Self {
            calls,
            taken: Arc::new(Mutex::new(vec![false; sequences])),
            vocab_size,
            ctx_size,
        }
    }
}

impl DraftModelFactory for BatchedDraftFactory {
    fn open(&self) -> Result<Box<dyn DraftModel>, String> {
        let seq = {
            let mut taken = lock(&self.taken);
            let free = taken.iter().position(|taken| !taken).ok_or_else(|| {
                format!(
                    "all {} draft-model sequences are held by other plugin instances (the server keeps {DRAFT_SEQUENCES_PER_SLOT} per slot); this instance drafts without the draft model",
                    taken.len()
                )
            })?;
            taken[free] = true;
            SeqId(free as u32)
        };
        let (reply, answers) = mpsc::channel();
        Ok(Box::new(BatchedDraftModel {
            seq,
            fed: FedTokens::new(self.vocab_size, self.ctx_size),
            calls: self.calls.clone(),
            taken: Arc::clone(&self.taken),
            reply,
            answers,
        }))
    }
}

fn lock(taken: &Mutex<Vec<bool>>) -> std::sync::MutexGuard<'_, Vec<bool>> {
    // Every change under the lock is one flag: a poisoned lock still holds a usable table.
    taken.lock().unwrap_or_else(|e| e.into_inner())
}

/// A plugin instance's sequence of the batcher's draft context.
struct BatchedDraftModel {
    seq: SeqId,
    fed: FedTokens,
    calls: Sender<Call>,
    taken: Taken,
    reply: Sender<Drafted>,
    answers: Receiver<Drafted>,
}

impl DraftModel for BatchedDraftModel {
    fn reset(&mut self) {
        // The sequence's cache is kept: the next request may share a prefix with the last.
        self.fed.reset();
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.fed.feed(tokens);
    }

    fn propose(&mut self, settings: ProposalSettings) -> Drafted {
        let Some(context) = self.fed.draftable() else {
            return Drafted::default();
        };
        if context.is_empty() || settings.max_draft_len == 0 {
            return Drafted::default();
        }
        let ask = OwnedDraftAsk {
            seq: self.seq,
            context: context.to_vec(),
            settings,
        };
        let asked = self.calls.send(Call::Draft {
            ask,
            reply: self.reply.clone(),
        });
        if asked.is_err() {
            return Drafted::default();
        }
        self.answers.recv().unwrap_or_default()
    }
}

impl Drop for BatchedDraftModel {
    fn drop(&mut self) {
        // Queued before the sequence is free, so the batcher forgets this instance's cache
        // before the next instance holding the sequence can ask it anything.
        let _ = self.calls.send(Call::CloseDraft { seq: self.seq });
        if let Some(taken) = lock(&self.taken).get_mut(self.seq.0 as usize) {
            *taken = false;
        }
    }
}
