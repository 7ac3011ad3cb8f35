//! Native test harnesses: drive a [`Drafter`](crate::Drafter) or a [`Policy`](crate::Policy)
//! the way the host does, and stand in for the host's imports, with no WebAssembly.
//!
//! * [`Harness`] owns one drafter value (one session, in host terms) and checks every proposal
//!   with the host's own [`check_proposal`](crate::check_proposal), panicking with a message
//!   that names the broken rule, so that contract bugs fail a unit test instead of becoming
//!   faults in production.
//!   [`Harness::replay`] simulates a whole greedy generation over a known output and reports how
//!   many draft tokens the target would have accepted. [`Harness::checkpoint`] and
//!   [`Harness::observe_response`] call the drafter type's cross-request functions, the latter
//!   with the host's checks on the response.
//! * [`PolicyHarness`] owns one policy value and feeds it scripted [`RoundRecord`]s
//!   ([`drafted_round`], [`shadow_round`], [`plain_round`]), or runs it against a simulated
//!   target with [`PolicyHarness::run`].
//! * Natively, [`crate::state`] keeps its blob in a per-thread slot ([`clear_state`],
//!   [`set_state_limit`]) and [`crate::draft_model`] calls a fake installed with
//!   [`install_draft_model`]. Each test runs on its own thread, so tests do not share either.
//!
//! ```
//! use spechost_sdk::testing::{Harness, facts};
//! use spechost_sdk::{Drafter, ModelFacts, Proposal, Token};
//!
//! /// Proposes the last token again.
//! struct Stutter(Vec<Token>);
//!
//! impl Drafter for Stutter {
//!     fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
//!         Ok(Stutter(Vec::new()))
//!     }
//!     fn feed(&mut self, tokens: &[Token]) {
//!         self.0.extend_from_slice(tokens);
//!     }
//!     fn propose(&mut self, max_draft_len: usize) -> Proposal {
//!         match self.0.last() {
//!             Some(&last) if max_draft_len > 0 => Proposal::tokens([last]),
//!             _ => Proposal::empty(),
//!         }
//!     }
//! }
//!
//! let mut harness = Harness::<Stutter>::new("", facts(100)).unwrap();
//! let stats = harness.replay(&[1, 2], &[2, 2, 2, 3], 4);
//! assert_eq!(stats.accepted, 2);
//! ```
//!
//! [`RoundRecord`]: crate::RoundRecord

mod drafter;
#[cfg(not(target_arch = "wasm32"))]
mod host;
mod policy;

pub use self::drafter::{Harness, ReplayStats, facts};
#[cfg(not(target_arch = "wasm32"))]
pub use self::host::{
    clear_state, draft_model_context, install_draft_model, install_runner_up, remove_draft_model,
    set_state_limit, set_tree_paths, take_tree_shape,
};
pub use self::policy::{
    PolicyHarness, TEST_SOURCE, cut_round, drafted_round, plain_round, policy_setup, shadow_round,
};
