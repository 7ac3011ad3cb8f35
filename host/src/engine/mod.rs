//! The target model and the verify loop.
//!
//! Order of operations for one request:
//! 1. [`Target::load`] checks and loads the GGUF (once per process);
//! 2. [`Target::tokenize_chat`] (or [`Target::tokenize_raw`]) builds the prompt tokens;
//! 3. [`Target::session`] creates the target's llama.cpp context (`context`), reused across
//!    requests; in its batches the Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrix products (Gemma 3's,
//!    SmolLM2's) go to the host's batched kernels (`kernels`: the ggml backend and the x86
//!    products), bit for bit as llama.cpp would compute them;
//! 4. [`Session::generate`] runs the round protocol of `rounds` ([`generate`] over a
//!    [`Verifier`]; the session is the verifier that decodes, the benchmark's trace replayer
//!    another): decode the prompt, then rounds of draft from the cascade, verify
//!    `[last, d1..dK]` in one batch, accept, roll the KV cache back, stream the text.
//!    [`Session::generate_controlled`] also asks a [`RoundControl`] before each round whether
//!    to stop (a client went away) or to go on with another cascade (a hot swap).
//!
//! The draft model (`--draft-model`) is a second GGUF loaded with [`DraftModelHost::load`] and
//! checked against the target with [`check_vocab_compatible`]; it hands each drafter plugin that
//! asks for it a [`DraftModelContext`].
//!
//! The session owns its [`VerifyCurve`]: what a verify batch of each size costs (the ceiling of
//! any speculation), measured once and handed to every request's policy. [`RoundLimits`] is the
//! one rule for a round's draft length, [`check_max_draft_len`] the one check of a
//! `--draft-max` or a request's `draft_max`.
//!
//! Not here: where drafts come from (`cascade`, `plugins`) and how requests arrive
//! (`commands`, `server`).

mod batcher;
mod budget;
mod build_info;
mod chat_template;
mod context;
mod draft;
mod error;
mod grammar;
#[cfg(target_arch = "x86_64")]
mod kernels;
mod model;
mod overrides;
mod recurrent;
mod rounds;
mod sample;
mod stats;
mod text;
mod verify;
mod vocab;

pub use self::batcher::{
    BatchedDraftFactory, BatchedSequence, Batcher, BatcherSettings, DRAFT_SEQUENCES_PER_SLOT,
    MAX_GATHER_WAIT, shared_prefix,
};
pub use self::budget::{MaxDraftLenError, RoundLimits, check_max_draft_len};
pub use self::build_info::{BackendDevice, BuildInfo};
pub use self::chat_template::ChatTemplateChoice;
pub use self::context::SeqId;
pub use self::draft::{
    BatchDrafter, DraftAsk, DraftBatch, DraftModelConfig, DraftModelContext, DraftModelHost,
    OwnedDraftAsk, check_vocab_compatible, measure_agreement, measure_draft_model,
};
pub use self::error::EngineError;
pub use self::grammar::{GRAMMAR_SOURCE, Grammar, GrammarError, GrammarSource};
pub(crate) use self::model::started_backend;
pub use self::model::{MessageContents, ModelDescription, Target, TargetParams};
pub use self::overrides::{ArchitectureFacts, KvOverride, KvValue, ModelOverrides, OverrideError};
pub use self::rounds::{
    Generation, Outcome, OutputPiece, Prefill, Request, RoundControl, RoundDecision, RoundDraft,
    StopReason, Verified, Verifier, VerifyBatch, generate,
};
pub use self::sample::{
    DraftAcceptance, MAX_TOP_LOGPROBS, MIN_TEMPERATURE, SamplingParams, TokenLogprob,
};
pub use self::stats::GenerationStats;
pub use self::text::{MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS, StopStrings, StopStringsError};
pub use self::verify::{
    BatchLayout, DEFAULT_COST_REPETITIONS, DEFAULT_MAX_DRAFT_LEN, DEFAULT_TREE_LEAVES, DraftCut,
    MAX_DRAFT_LEN_LIMIT, ObservedRatio, Session, SessionParams, VerifyCurve,
};
