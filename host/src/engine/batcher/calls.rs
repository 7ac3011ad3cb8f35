//! The messages between sequences (and draft-model handles) and the batcher: every call is
//! answered exactly once, on the caller's own channel.

use std::sync::mpsc::Sender;

use crate::cascade::{Drafted, Token};
use crate::engine::context::SeqId;
use crate::engine::draft::OwnedDraftAsk;
use crate::engine::error::EngineError;
use crate::engine::rounds::{RoundDraft, Verified};
use crate::engine::sample::{SamplingParams, TokenLogprob};

/// What a sequence, or a draft-model handle, asks of the batcher.
pub(super) enum Call {
    /// Decode a chunk of `seq`'s prompt; the first chunk starts the request.
    Prefill {
        seq: SeqId,
        chunk: Vec<Token>,
        position: usize,
        start: Option<Start>,
        last: bool,
    },
    /// Verify `seq`'s round.
    Verify { seq: SeqId, round: RoundDraft },
    /// `seq`'s request ended.
    End { seq: SeqId },
    /// A sequence's thread is done: the batcher stops once every sequence's is.
    Close,
    /// Draft after `context` in draft sequence `seq`.
    Draft {
        ask: OwnedDraftAsk,
        reply: Sender<Drafted>,
    },
    /// The plugin instance holding draft sequence `seq` is gone.
    CloseDraft { seq: SeqId },
}

/// How a request starts in its sequence.
pub(super) struct Start {
    /// The request's sampling.
    pub sampling: SamplingParams,
    /// Positions of the sequence's cache to keep: the prompt prefix it already holds.
    pub keep: usize,
}

/// The batcher's answer to a sequence's call.
pub(super) enum Reply {
    /// A prompt chunk was decoded; after the last, the target's first token (with its
    /// log-probability, if the request asked for it).
    Prefilled(Result<Option<(Token, Vec<TokenLogprob>)>, EngineError>),
    /// The round was verified.
    Verified(Result<Verified, EngineError>),
}
