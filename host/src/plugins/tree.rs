//! The `tree` import (WIT 0.8.1): how many paths a drafter's proposal may have this session,
//! and the shape a drafter declares for the proposal it is about to return.
//!
//! [`PluginSource`](super::PluginSource) opens a round before each `propose` with the paths
//! its cascade takes, and takes the declared shape after it; the shape is checked against the
//! proposal there ([`spechost_sdk::check_tree`]), where an invalid one is a fault. A plugin
//! built against 0.8.0 never calls it: its proposals stay chains.

use super::bindings::TreeHost;
use super::sandbox::HostState;

/// Most parents kept from one `shape-proposal` call: more than any proposal may have tokens
/// (`engine::MAX_DRAFT_LEN_LIMIT`), so a longer list still fails the check, without the host
/// holding an unbounded copy of it.
const MAX_KEPT_PARENTS: usize = 1024;

/// One instance's `tree` state.
#[derive(Debug, Clone)]
pub(super) struct TreeRound {
    /// What `max-paths` answers.
    max_paths: u32,
    /// The shape declared since the round opened.
    shape: Option<Vec<u32>>,
}

impl Default for TreeRound {
    fn default() -> Self {
        Self {
            max_paths: 1,
            shape: None,
        }
    }
}

impl TreeRound {
    /// Starts a `propose` call in which proposals may have `max_paths` paths.
    pub(super) fn open_round(&mut self, max_paths: usize) {
        self.max_paths = u32::try_from(max_paths.max(1)).unwrap_or(u32::MAX);
        self.shape = None;
    }

    /// The shape declared during the call, if any.
    pub(super) fn close_round(&mut self) -> Option<Vec<u32>> {
        self.shape.take()
    }
}

impl TreeHost for HostState {
    fn max_paths(&mut self) -> u32 {
        self.tree.max_paths
    }

    fn shape_proposal(&mut self, mut parents: Vec<u32>) {
        parents.truncate(MAX_KEPT_PARENTS);
        self.tree.shape = Some(parents);
    }
}
