//! Glue between the generated `drafter` world and [`Drafter`], [`crate::state`],
//! [`crate::draft_model`] and [`crate::tree`].
//!
//! Proposals pass through unchanged, even invalid ones: checking them is the host's job (it must
//! distrust every plugin anyway), and hostile test plugins rely on reaching it unfiltered.

use std::cell::RefCell;

use crate::drafter::Drafter;
use crate::records::{Feedback, ModelFacts, Proposal, Token};

use super::drafter_world::exports::spechost::drafter::drafter_api as api;
use super::forward_panics_to_host_log;

pub use super::drafter_world::{export, exports};

/// A drafter as the generated bindings see it: one per session resource.
///
/// wit-bindgen hands exported resource methods `&self`, while [`Drafter`] methods take
/// `&mut self`; the `RefCell` bridges the two. Calls into one instance never overlap, so a borrow
/// can never fail.
pub struct SessionCell<D>(RefCell<D>);

impl<D: Drafter> api::Guest for SessionCell<D> {
    type Session = Self;

    fn checkpoint() {
        forward_panics_to_host_log();
        D::checkpoint();
    }

    fn observe_response(response: Vec<Token>) {
        forward_panics_to_host_log();
        D::observe_response(&response);
    }
}

impl<D: Drafter> api::GuestSession for SessionCell<D> {
    fn open(config: String, facts: ModelFacts) -> Result<api::Session, String> {
        forward_panics_to_host_log();
        let drafter = D::new(&config, &facts)?;
        Ok(api::Session::new(SessionCell(RefCell::new(drafter))))
    }

    fn feed(&self, tokens: Vec<Token>) {
        self.0.borrow_mut().feed(&tokens);
    }

    fn propose(&self, max_draft_len: u32) -> Proposal {
        self.0.borrow_mut().propose(usize_from(max_draft_len))
    }

    fn feedback(&self, outcome: Feedback) {
        self.0.borrow_mut().feedback(outcome);
    }
}

/// Fails to compile unless `D` implements [`Drafter`]; lets [`crate::export_drafter!`] report a
/// readable error, and check the type natively, where nothing is exported.
pub const fn assert_drafter<D: Drafter>() {}

/// `usize` has at least 32 bits on every target spechost plugins build for.
fn usize_from(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// The host's `state` import.
#[cfg(target_arch = "wasm32")]
pub(crate) mod state {
    use crate::bindings::drafter_world::spechost::drafter::state as wit;

    pub(crate) fn load() -> Option<Vec<u8>> {
        wit::load()
    }

    pub(crate) fn save(blob: &[u8]) -> Result<(), String> {
        wit::save(blob)
    }
}

/// The host's `draft-model` import.
#[cfg(target_arch = "wasm32")]
pub(crate) mod draft_model {
    use crate::bindings::drafter_world::spechost::drafter::draft_model as wit;
    use crate::records::{DraftedPosition, DraftedToken, Token};

    pub(crate) fn available() -> bool {
        wit::available()
    }

    pub(crate) fn reset() {
        wit::reset();
    }

    pub(crate) fn feed(tokens: &[Token]) {
        wit::feed(tokens);
    }

    pub(crate) fn propose(max_draft_len: usize, p_min: f32) -> Vec<DraftedToken> {
        let max_draft_len = u32::try_from(max_draft_len).unwrap_or(u32::MAX);
        wit::propose(max_draft_len, p_min)
    }

    pub(crate) fn propose_with_runners_up(
        max_draft_len: usize,
        p_min: f32,
        split_below: f32,
    ) -> Vec<DraftedPosition> {
        let max_draft_len = u32::try_from(max_draft_len).unwrap_or(u32::MAX);
        wit::propose_with_runners_up(max_draft_len, p_min, split_below)
    }
}

/// The host's `tree` import.
#[cfg(target_arch = "wasm32")]
pub(crate) mod tree {
    use crate::bindings::drafter_world::spechost::drafter::tree as wit;

    pub(crate) fn max_paths() -> u32 {
        wit::max_paths()
    }

    pub(crate) fn shape_proposal(parents: &[u32]) {
        wit::shape_proposal(parents);
    }
}
