//! Write draft-token sources ("drafters") for spechost as sandboxed WebAssembly components.
//!
//! # Brief overview
//!
//! spechost speeds up generation with speculative decoding: each round, drafters propose the
//! next few tokens cheaply, the target model verifies them in one batch, and the accepted prefix
//! plus one token from the target are committed. A drafter is a plugin: a `cdylib` crate built
//! for `wasm32-wasip2`, which the host loads into a sandbox with no files, environment or
//! network, a memory cap and a time limit per call.
//!
//! A plugin author writes one type and one macro call:
//!
//! * [`Drafter`] is the trait to implement. The host opens one session per request, which
//!   becomes one value of your type ([`Drafter::new`]); it is fed the prompt, then the tokens
//!   committed each round ([`Drafter::feed`]), asked for a [`Proposal`] ([`Drafter::propose`])
//!   and told how the proposal fared ([`Drafter::feedback`]).
//! * [`export_drafter!`] exports that type as the plugin's implementation of the
//!   `spechost:drafter` WIT world.
//!
//! Around them: [`config::Config`] parses the plugin's `key=value` settings, [`log`] writes to
//! the host's log, and [`testing::Harness`] runs a drafter natively, checking every proposal as
//! the host would, so plugins are unit-tested without WebAssembly.
//!
//! # Example
//!
//! A drafter that proposes what followed the previous occurrence of the last token:
//!
//! ```
//! use spechost_sdk::config::Config;
//! use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};
//!
//! struct Repeat {
//!     context: Vec<Token>,
//!     max_len: usize,
//! }
//!
//! impl Drafter for Repeat {
//!     fn new(config: &str, _facts: &ModelFacts) -> Result<Self, String> {
//!         let config = Config::parse(config)?;
//!         let max_len = config.get_usize("max_len", 8)?;
//!         config.finish()?;
//!         Ok(Repeat { context: Vec::new(), max_len })
//!     }
//!
//!     fn feed(&mut self, tokens: &[Token]) {
//!         self.context.extend_from_slice(tokens);
//!     }
//!
//!     fn propose(&mut self, max_len: usize) -> Proposal {
//!         let Some((&last, earlier)) = self.context.split_last() else {
//!             return Proposal::empty();
//!         };
//!         // A linear scan keeps the example short; a real drafter indexes its context in
//!         // `feed` so that `propose` does not slow down as the context grows.
//!         match earlier.iter().rposition(|&token| token == last) {
//!             Some(i) => {
//!                 let end = (i + 1 + max_len.min(self.max_len)).min(self.context.len());
//!                 Proposal::tokens(&self.context[i + 1..end])
//!             }
//!             None => Proposal::empty(),
//!         }
//!     }
//! }
//!
//! export_drafter!(Repeat);
//!
//! # use spechost_sdk::testing::{Harness, facts};
//! # let mut harness = Harness::<Repeat>::new("", facts(100)).unwrap();
//! # harness.feed(&[1, 2, 3, 1]);
//! # assert_eq!(harness.propose(4).tokens, [2, 3, 1]);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`; the `.wasm` file in
//! `target/wasm32-wasip2/release/` is the plugin.

#![deny(missing_docs)]

mod bindings;
pub mod config;
mod drafter;
mod export;
mod log;
pub mod testing;
mod types;

pub use crate::drafter::Drafter;
pub use crate::log::{Level, log};
pub use crate::types::{Feedback, ModelFacts, Proposal, Token};

/// What [`export_drafter!`] expands to refers to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::{SessionCell, assert_drafter, export, exports};
}
