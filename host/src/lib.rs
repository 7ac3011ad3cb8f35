//! spechost: speculative decoding on CPU servers, with draft sources as sandboxed WebAssembly
//! components.
//!
//! # How a token flows
//!
//! 1. [`config`] turns the command line (and a TOML file) into typed settings, once;
//!    [`commands`] runs the command, and [`stack::Stack`] loads what every command needs
//!    (plugins, target, draft model) in one order.
//! 2. [`engine::Target`] loads the target GGUF through llama.cpp and tokenizes the prompt with the
//!    model's chat template; [`engine::Session`] owns one llama.cpp context (KV cache).
//! 3. Each round of [`engine::generate`] (the one round protocol, over an
//!    [`engine::Verifier`]: the session decodes, the benchmark's simulator replays a trace)
//!    asks the [`cascade::Cascade`] for a draft of at most `max_draft_len` tokens; the cascade's [`cascade::RoundPolicy`] (a policy plugin) picks
//!    this round's draft length (0 = plain decoding), and the cascade asks its sources: in order,
//!    the first that proposes enough tokens winning, or all cheap ones, the best expected
//!    acceptance winning (scored mode).
//! 4. A source is a [`cascade::DraftSource`]: a WebAssembly component run by [`plugins`] in a
//!    sandbox (which may drive a native draft model through the host), or a native test double.
//! 5. The engine decodes `[last, d1..dK]` in one batch, samples the target at every position,
//!    accepts the draft while it equals the samples, keeps one target token, and rolls the KV cache
//!    back past the accepted prefix. The output is exactly what plain decoding would produce.
//! 6. The committed tokens are fed back to every source, streamed as text, and counted in
//!    [`engine::GenerationStats`].
//!
//! [`server`] puts this behind an OpenAI-compatible HTTP API (`spechost serve`): requests queue
//! for slots (one context each), and the plugin registry can swap the cascade between rounds
//! while they run. [`authoring`] is what plugin authors run (`spechost plugin new`, `check`,
//! `bench`). `docs/architecture.md` draws the whole path.
//!
//! ```no_run
//! use spechost::engine::{Request, Target, TargetParams, SessionParams, SamplingParams};
//! use spechost::cascade::Cascade;
//!
//! # fn main() -> anyhow::Result<()> {
//! let target = Target::load("model.gguf".as_ref(), &TargetParams::default())?;
//! let mut session = target.session(&SessionParams::default())?;
//! let prompt = target.tokenize_chat("Write a haiku about caches.")?;
//! let request = Request::new(prompt, 64, SamplingParams::greedy());
//! let mut cascade = Cascade::empty();
//! let outcome = session.generate(&request, &mut cascade, &mut |piece| print!("{}", piece.text))?;
//! eprintln!("{}", outcome.stats.render());
//! # Ok(()) }
//! ```

pub mod authoring;
pub mod bench;
pub mod cascade;
pub mod commands;
pub mod config;
pub mod engine;
pub mod info;
pub mod models;
pub mod placement;
pub mod plugins;
pub mod server;
pub mod stack;
pub mod telemetry;
pub mod warm;
