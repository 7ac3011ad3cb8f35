//! The draft model: a second GGUF that proposes tokens for drafter plugins to use.
//!
//! Order of operations:
//! 1. [`DraftModelHost::load`] loads the GGUF (once per process, after the target) and
//!    [`check_vocab_compatible`] makes sure it shares the target's tokenizer;
//! 2. a plugin instance that asks for the model gets a context of its own: in `run` and
//!    `bench`, [`DraftModelHost::open`](crate::cascade::DraftModelFactory::open) gives it a
//!    [`DraftModelContext`], one llama.cpp context; in a server, the batcher's draft factory
//!    gives it a sequence of one context shared by every instance (`engine::batcher`), so the
//!    instances drafting in the same step are drafted together, one decode per drafted position;
//! 3. the plugin feeds it the committed tokens ([`FedTokens`]) and asks it to propose; the
//!    plugin decides how many tokens to ask for and the probability below which to stop. Both
//!    kinds of context draft with [`DraftBatch`], one sequence or several.
//!
//! At start-up, before any request, [`measure_draft_model`] times drafting and catching up on
//! such a context, and [`measure_agreement`] measures how often its greedy token is the
//! target's, for the policies' setup.
//!
//! # Ownership
//!
//! A llama.cpp context borrows its model (`ModelContext<'model>`), but a context handed to a
//! plugin lives in a wasmtime store, so it must be `'static`. Each context therefore owns an
//! `Arc` of the model next to the context that borrows it (a `self_cell`): the weights are
//! loaded once, shared by every context, and freed when the last context and the host are
//! dropped. The alternatives were worse: leaking the model needs a process-wide registry so that
//! tests loading it repeatedly do not leak repeatedly (hidden global state), and a thread owning
//! model and contexts would serialise the drafting of concurrent requests and add a channel
//! round trip to every call.
//!
//! # Cache reuse
//!
//! A context remembers which tokens each sequence's KV cache holds. Fed tokens are only
//! appended to a list; a proposal evaluates what is missing. Tokens it drafted stay in the
//! cache, so when the target accepts them and they come back through `feed`, only the target's
//! own token is new and only it is decoded (the idea of llama.cpp's
//! `common_speculative_gen_draft`, which reuses the draft cache's longest common prefix with the
//! new context). Cache entries past the common prefix are removed with `seq_rm`.
//!
//! Exactness is not needed here (the target verifies every drafted token), but the context is
//! the target's kind (`ModelContext`: flash attention, Q8_0 KV cache, full sliding-window
//! cache, a KV stream per sequence) so both models run the same kernels, the draft's cache can
//! be rolled back on any architecture, and a sequence drafts the same tokens whatever the
//! others in its batch.

mod agreement;
mod batch;
mod context;
mod cost;
mod fed;
mod host;

pub use self::agreement::measure_agreement;
pub use self::batch::{BatchDrafter, DraftAsk, DraftBatch, OwnedDraftAsk};
pub use self::context::DraftModelContext;
pub use self::cost::measure_draft_model;
pub use self::fed::FedTokens;
pub use self::host::{DraftModelConfig, DraftModelHost, check_vocab_compatible};
