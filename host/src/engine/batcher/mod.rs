//! The batcher: one thread decodes for every request a server generates at once, in one
//! shared [`Session`] with a sequence per request, so a step reads the weights once for all of
//! them.
//!
//! Each request runs the round protocol (`rounds.rs`, [`generate`]) on its own thread, as one
//! request does in `spechost run`, over a [`BatchedSequence`]: a [`Verifier`] whose prefill and
//! verify calls go to the batcher and wait for its answer. The batcher, on the thread that owns
//! the session (a server's main thread, where llama.cpp's OpenMP team runs best), repeats one
//! step:
//! 1. wait for a call, then give the sequences still working on their next call (proposing a
//!    draft, streaming text) a moment to make it too ([`MAX_GATHER_WAIT`] at most, less when
//!    steps are quick), so their rounds share the step;
//! 2. cut the drafts not worth their rows beside the others' ([`Session::cut_drafts`]: a
//!    request's policy sized its draft without knowing this step's other rounds), then verify
//!    every waiting round in one decode ([`Session::verify_batch`]): each sequence's
//!    `[last, draft..]` rows, sampled with its own sampler and rolled back on its own;
//! 3. decode one chunk of the oldest waiting prompt, in a decode of its own, so running
//!    requests keep streaming while a long prompt is read (a prompt's chunks are at most
//!    `prefill_chunk` tokens; a cancelled request stops between chunks).
//!
//! A request's output does not depend on what else is in a step: every row of a batch is
//! computed as it would be alone (batch-invariant kernels, a KV stream per sequence; the
//! session's start-up check proves it for batches of several sequences), and every committed
//! token is sampled from its own sequence's logits with its own sampler.
//!
//! Not here: which request a sequence serves (the server's slots and queue), drafting (the
//! sequence's thread runs its cascade), and the round protocol (`rounds.rs`).

mod calls;
mod draft;
mod sequence;
mod steps;

pub use self::draft::{BatchedDraftFactory, DRAFT_SEQUENCES_PER_SLOT};
pub use self::sequence::{BatchedSequence, shared_prefix};
pub use self::steps::{Batcher, BatcherSettings, MAX_GATHER_WAIT};
