//! Native stand-ins for the host's `state` and `draft-model` imports, per test thread.

use crate::records::{DraftedToken, Token};
use crate::{draft_model, state, tree};

/// Empties this thread's state slot, as if the host had never loaded or been given a blob.
///
/// Native only, for tests. Each test runs on its own thread with its own slot, so only a test
/// that simulates several host processes needs it.
pub fn clear_state() {
    state::native::clear();
}

/// Makes [`crate::state::save`] on this thread refuse blobs larger than `max_bytes` bytes, as a
/// host with that limit would; `None` (the default) accepts any size.
///
/// Native only, for tests of a plugin's handling of a refused save.
pub fn set_state_limit(max_bytes: Option<usize>) {
    state::native::set_limit(max_bytes);
}

/// Installs a fake draft model on this thread, with an empty context:
/// [`crate::draft_model::available`] becomes true and the other functions use it.
///
/// `next_token` gives the draft model's greedy next token after a context (the tokens fed since
/// the last reset, followed by those drafted so far in the current call), or `None` to stop
/// drafting. The SDK keeps the context and applies `max_draft_len` and `p_min` the way the host
/// does. Installing again replaces the fake.
///
/// Native only, for tests.
pub fn install_draft_model(next_token: impl FnMut(&[Token]) -> Option<DraftedToken> + 'static) {
    draft_model::native::install(Box::new(next_token));
}

/// Gives this thread's fake draft model second choices for
/// [`crate::draft_model::propose_with_runners_up`]: `runner_up` answers the draft model's
/// second most likely token after a context, asked where the greedy token's probability is
/// below the call's `split_below`. Without it the fake has none. Returns `false`, doing
/// nothing, when no fake is installed ([`install_draft_model`] first; installing again removes
/// the runner-up).
///
/// Native only, for tests.
pub fn install_runner_up(
    runner_up: impl FnMut(&[Token]) -> Option<DraftedToken> + 'static,
) -> bool {
    draft_model::native::install_runner_up(Box::new(runner_up))
}

/// Removes this thread's fake draft model: [`crate::draft_model::available`] becomes false.
///
/// Native only, for tests.
pub fn remove_draft_model() {
    draft_model::native::remove();
}

/// The context the fake draft model holds (the tokens fed since the last reset), or `None` when
/// none is installed; lets a test check what a drafter fed it.
///
/// Native only, for tests.
pub fn draft_model_context() -> Option<Vec<Token>> {
    draft_model::native::context()
}

/// Makes [`crate::tree::max_paths`] on this thread answer `paths` (at least 1; 1, a host that
/// verifies chains only, is the default).
///
/// Native only, for tests.
pub fn set_tree_paths(paths: usize) {
    tree::native::set_max_paths(u32::try_from(paths).unwrap_or(u32::MAX));
}

/// The shape the last [`crate::tree::shape_proposal`] on this thread declared, taken (the next
/// call answers `None` until another is declared). [`crate::testing::Harness::propose`] takes
/// it itself and keeps it ([`crate::testing::Harness::shape`]).
///
/// Native only, for tests.
pub fn take_tree_shape() -> Option<Vec<u32>> {
    tree::native::take_shape()
}
