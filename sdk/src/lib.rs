//! Write draft-token sources ("drafters") and draft-length policies for spechost as sandboxed
//! WebAssembly components.
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
//!   and told how the proposal fared ([`Drafter::feedback`]). [`Drafter::checkpoint`], on the
//!   type rather than a session, saves state that outlives requests.
//! * [`export_drafter!`] exports that type as the plugin's implementation of the
//!   `spechost:drafter` WIT world `drafter`.
//!
//! A drafter may use two host services besides logging: [`state`] keeps one blob per plugin
//! across host restarts, and [`draft_model`] asks the host's draft model (a second, smaller LLM
//! the host runs natively) for tokens.
//!
//! A *policy* chooses how many tokens to draft each round: implement [`Policy`] (it observes a
//! [`RoundRecord`] per round and returns a [`Decision`]) and export it with [`export_policy!`].
//! [`adaptive`] has the pieces most policies share: a rolling acceptance rate and a back-off
//! that turns speculation off while it does not pay.
//!
//! Around them: [`config::Config`] parses the plugin's `key=value` settings, [`log`] writes to
//! the host's log, and [`testing`] runs drafters ([`testing::Harness`]) and policies
//! ([`testing::PolicyHarness`]) natively, checking them as the host would and standing in for
//! the host's state and draft model, so plugins are unit-tested without WebAssembly.
//!
//! # Versions
//!
//! This SDK builds plugins for version [`WIT_VERSION`] of the [`WIT_PACKAGE`] package, whose
//! file `wit/drafter.wit` ships inside the crate. While the major version is 0, the minor
//! version is the compatibility line: a host loads plugins built with any SDK of its WIT's
//! major.minor (the SDK's own version shares it) and asks for a rebuild otherwise.
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
//!     fn propose(&mut self, max_draft_len: usize) -> Proposal {
//!         let Some((&last, earlier)) = self.context.split_last() else {
//!             return Proposal::empty();
//!         };
//!         // A linear scan keeps the example short; a real drafter indexes its context in
//!         // `feed` so that `propose` does not slow down as the context grows.
//!         match earlier.iter().rposition(|&token| token == last) {
//!             Some(i) => {
//!                 let end = (i + 1 + max_draft_len.min(self.max_len)).min(self.context.len());
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

pub mod adaptive;
mod bindings;
pub mod config;
pub mod draft_model;
mod drafter;
mod export;
mod log;
mod policy;
mod policy_types;
pub mod state;
pub mod testing;
mod types;
mod version;

pub use crate::drafter::Drafter;
pub use crate::log::{Level, log};
pub use crate::policy::Policy;
pub use crate::policy_types::{Decision, PolicySetup, RoundRecord, SourceRound};
pub use crate::types::{DraftedToken, Feedback, ModelFacts, Proposal, Token};
pub use crate::version::{WIT_PACKAGE, WIT_VERSION};

/// What [`export_drafter!`] and [`export_policy!`] expand to refers to; not part of the API.
#[doc(hidden)]
pub mod __private {
    /// The `drafter` world.
    pub mod drafter {
        pub use crate::bindings::drafter::{SessionCell, assert_drafter, export, exports};
    }
    /// The `policy` world.
    pub mod policy {
        pub use crate::bindings::policy::{PolicyCell, assert_policy, export, exports};
    }
}

#[cfg(test)]
mod tests {
    use super::WIT_VERSION;

    #[test]
    fn crate_version_follows_the_wit_minor_version() {
        let line =
            |version: &str| -> String { version.split('.').take(2).collect::<Vec<_>>().join(".") };
        let crate_version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            line(crate_version),
            line(WIT_VERSION),
            "spechost-sdk {crate_version} must share the WIT's major.minor ({WIT_VERSION}); \
             bump the workspace `version` in the root Cargo.toml"
        );
    }
}
