//! Tree proposals: several continuations of the context in one proposal, which the host
//! verifies together in one batch where it can (`spechost run` and `bench` with
//! `--cascade-mode tree`; WIT interface `tree`, since 0.8.1).
//!
//! A tree proposal lists its tokens so that each comes after the one it continues, named by a
//! row: row 0 is the last token of the context, row `i + 1` the proposal's token `i`. Inside
//! [`Drafter::propose`](crate::Drafter::propose), a drafter that has several candidates asks
//! [`max_paths`]; above 1, it may return them as a tree within `max_draft_len` tokens over
//! all paths, declaring its shape with [`shape_proposal`], and give as each token's confidence
//! the probability that the target accepts the path through it. Without a call the proposal is
//! a chain, as before 0.8.1.
//!
//! Built natively, for tests, [`max_paths`] answers what
//! [`crate::testing::set_tree_paths`] set on the current thread (1 by default), and the shape
//! is kept for the test harness, which checks it with [`crate::check_tree`] as the host does.
//!
//! ```
//! use spechost_sdk::testing::{set_tree_paths, take_tree_shape};
//! use spechost_sdk::tree;
//!
//! set_tree_paths(4);
//! assert_eq!(tree::max_paths(), 4);
//! // 5 6, and 5 7: two paths after a shared first token.
//! tree::shape_proposal(&[0, 1, 1]);
//! assert_eq!(take_tree_shape(), Some(vec![0, 1, 1]));
//! ```

/// Most paths (leaves) a tree proposal may have in this session: 1 when the host verifies only
/// chains, so propose the single best continuation, with all of `max_draft_len` for it.
pub fn max_paths() -> usize {
    backend::max_paths() as usize
}

/// Declares that the proposal the current `propose` returns is a tree: `parents[i]` is the row
/// token `i` continues (`parents[i] <= i`). The last call in a `propose` counts; a shape that
/// does not fit the proposal ([`crate::check_tree`]) is a fault.
pub fn shape_proposal(parents: &[u32]) {
    backend::shape_proposal(parents);
}

/// The shape declared on this thread since the last call, for the test harness: natively what
/// [`shape_proposal`] kept; in a component, where the host keeps it, nothing.
pub(crate) fn take_declared_shape() -> Option<Vec<u32>> {
    #[cfg(not(target_arch = "wasm32"))]
    return native::take_shape();
    #[cfg(target_arch = "wasm32")]
    return None;
}

#[cfg(target_arch = "wasm32")]
use crate::bindings::drafter::tree as backend;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use self::native as backend;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod native {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static MAX_PATHS: Cell<u32> = const { Cell::new(1) };
        static SHAPE: RefCell<Option<Vec<u32>>> = const { RefCell::new(None) };
    }

    pub(crate) fn max_paths() -> u32 {
        MAX_PATHS.get()
    }

    pub(crate) fn set_max_paths(paths: u32) {
        MAX_PATHS.set(paths.max(1));
    }

    pub(crate) fn shape_proposal(parents: &[u32]) {
        SHAPE.set(Some(parents.to_vec()));
    }

    pub(crate) fn take_shape() -> Option<Vec<u32>> {
        SHAPE.take()
    }
}
