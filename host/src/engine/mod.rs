//! The target model and the verify loop.
//!
//! Order of operations for one request:
//! 1. [`Target::load`] checks and loads the GGUF (once per process);
//! 2. [`Target::tokenize_chat`] (or [`Target::tokenize_raw`]) builds the prompt tokens;
//! 3. [`Target::session`] creates the target's llama.cpp context (`context`), reused across
//!    requests; in its batches the Q8_0/Q5_0/Q4_0 matrix products (Gemma 3's output layer and
//!    most of its layers) go to the host's batched kernel (`batch_backend`, `quant_matmul`), bit for
//!    bit as llama.cpp would compute them;
//! 4. [`Session::generate`] decodes the prompt, then runs rounds: draft from the cascade,
//!    verify `[last, d1..dK]` in one batch, accept, roll the KV cache back, stream the text.
//!    [`Session::generate_controlled`] also asks a [`RoundControl`] before each round whether
//!    to stop (a client went away) or to go on with another cascade (a hot swap).
//!
//! The draft model (`--draft-model`) is a second GGUF loaded with [`DraftModelHost::load`] and
//! checked against the target with [`check_vocab_compatible`]; it hands each drafter plugin that
//! asks for it a [`DraftModelContext`].
//!
//! [`Session::measure_verify_costs`] measures what a verify batch of each size costs (the
//! ceiling of any speculation), and [`RoundLimits`] is the one rule for a round's draft length.
//!
//! Not here: where drafts come from (`cascade`, `plugins`) and how requests arrive (`main`,
//! `server`).

#[cfg(target_arch = "x86_64")]
mod batch_backend;
mod budget;
mod build_info;
mod context;
mod draft;
mod error;
mod model;
#[cfg(target_arch = "x86_64")]
mod quant_matmul;
mod sample;
mod stats;
mod text;
mod verify;
mod vocab;

pub use self::budget::RoundLimits;
pub use self::build_info::{BackendDevice, BuildInfo};
pub use self::draft::{
    DraftModelConfig, DraftModelContext, DraftModelHost, check_vocab_compatible,
};
pub use self::error::EngineError;
pub(crate) use self::model::started_backend;
pub use self::model::{MessageContents, Target, TargetParams};
pub use self::sample::{MIN_TEMPERATURE, SamplingParams};
pub use self::stats::GenerationStats;
pub use self::text::{MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS, StopStrings, StopStringsError};
pub use self::verify::{
    DEFAULT_COST_REPETITIONS, DEFAULT_DRAFT_MAX, DRAFT_MAX_LIMIT, Outcome, Request, RoundControl,
    RoundDecision, Session, SessionParams, StopReason, VerifyCurve,
};
