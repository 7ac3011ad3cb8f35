//! [`SharedResponses`]: the finished responses of the last requests, from this server's slots
//! and from other replicas, which every slot hands to its drafter instances that did not serve
//! them (`drafter-api.observe-response`).
//!
//! Each slot keeps its own plugin instances (`pool.rs`), so without this a cross-request cache
//! (the `suffix` plugin's) would learn only from the requests its own slot served. A slot
//! that finishes a request records its output here; before a request, a slot hands each
//! drafter instance the responses recorded since it last looked, except those the instance
//! served itself. A new instance starts with every response still kept. Bounded: the last
//! [`RESPONSES_KEPT`] responses; an instance that looks less often misses the older ones.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::super::registry::SourceKey;
use crate::cascade::Token;

/// Most responses kept for instances that have not seen them yet.
pub const RESPONSES_KEPT: usize = 256;

/// Where a response came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A request this server generated, on slot `slot`, with the drafter instances `served_by`
    /// (they were fed it as it was generated).
    Slot {
        /// The slot's number.
        slot: usize,
        /// The sources of the request's cascade when it ended.
        served_by: Vec<SourceKey>,
    },
    /// Another replica's request, read from the shared stream (`serve --share`).
    Replica,
}

/// One finished response.
#[derive(Debug, Clone)]
pub struct SharedResponse {
    /// Its number, in recording order, from 1.
    pub number: u64,
    /// The output tokens.
    pub tokens: Arc<[Token]>,
    /// Who generated it.
    pub origin: Origin,
}

impl SharedResponse {
    /// Whether the drafter instance `key` of slot `slot` was fed this response as it was
    /// generated.
    pub fn was_served_by(&self, slot: usize, key: &SourceKey) -> bool {
        matches!(&self.origin, Origin::Slot { slot: origin, served_by } if *origin == slot && served_by.contains(key))
    }
}

/// The last [`RESPONSES_KEPT`] finished responses.
#[derive(Debug, Default)]
pub struct SharedResponses {
    kept: Mutex<VecDeque<SharedResponse>>,
}

impl SharedResponses {
    fn kept(&self) -> MutexGuard<'_, VecDeque<SharedResponse>> {
        // Entries are pushed and popped whole: a panic elsewhere leaves none half-written.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a finished response (an empty one is not worth recording) and returns its
    /// number, 0 when not recorded.
    pub fn record(&self, tokens: Arc<[Token]>, origin: Origin) -> u64 {
        if tokens.is_empty() {
            return 0;
        }
        let mut kept = self.kept();
        let number = kept.back().map_or(1, |last| last.number + 1);
        if kept.len() == RESPONSES_KEPT {
            kept.pop_front();
        }
        kept.push_back(SharedResponse {
            number,
            tokens,
            origin,
        });
        number
    }

    /// The responses recorded after number `seen`, oldest first (those still kept).
    pub fn since(&self, seen: u64) -> Vec<SharedResponse> {
        let kept = self.kept();
        let first = kept.partition_point(|response| response.number <= seen);
        kept.range(first..).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> SourceKey {
        SourceKey {
            name: name.to_owned(),
            sha256: "00".to_owned(),
            config: String::new(),
            incarnation: 0,
        }
    }

    #[test]
    fn keeps_the_last_responses_in_order_and_numbers_them_for_ever() {
        let shared = SharedResponses::default();
        assert_eq!(shared.record(Arc::from(Vec::new()), Origin::Replica), 0);
        for i in 0..(RESPONSES_KEPT as u32 + 10) {
            shared.record(Arc::from(vec![i]), Origin::Replica);
        }
        let all = shared.since(0);
        assert_eq!(
            all.last().map(|r| r.number),
            Some(RESPONSES_KEPT as u64 + 10)
        );
        assert_eq!(all.len(), RESPONSES_KEPT);
        assert_eq!(all[0].number, 11, "the oldest ten were dropped");
        assert_eq!(&*all[0].tokens, &[10]);
        let recent = shared.since(RESPONSES_KEPT as u64 + 8);
        assert_eq!(
            recent.iter().map(|r| r.number).collect::<Vec<_>>(),
            [RESPONSES_KEPT as u64 + 9, RESPONSES_KEPT as u64 + 10]
        );
        assert!(shared.since(RESPONSES_KEPT as u64 + 10).is_empty());
    }

    #[test]
    fn a_response_was_served_only_by_its_slots_instances() {
        let shared = SharedResponses::default();
        shared.record(
            Arc::from(vec![1, 2]),
            Origin::Slot {
                slot: 1,
                served_by: vec![key("suffix")],
            },
        );
        shared.record(Arc::from(vec![3]), Origin::Replica);
        let [local, remote] = &shared.since(0)[..] else {
            panic!("two responses")
        };
        assert!(local.was_served_by(1, &key("suffix")));
        assert!(!local.was_served_by(0, &key("suffix")), "another slot");
        assert!(!local.was_served_by(1, &key("lookup")), "another source");
        assert!(!remote.was_served_by(1, &key("suffix")));
    }
}
