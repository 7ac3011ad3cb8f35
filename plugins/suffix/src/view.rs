//! [`CacheView`]: one session's side of the cross-request cache. It adds the session's response
//! to the cache as it is generated, and keeps the context's suffix nodes in the cache's trie for
//! proposing.
//!
//! # The session's own response, in both tries
//!
//! The response a session generates enters its request trie and, as it goes, the cache's trie.
//! Nothing is counted twice: each trie's counts are exact occurrence counts of its own texts,
//! and a proposal compares the two tries' best paths by score, never adds their counts. In the
//! cache's trie the session's response is pooled with the other responses, so a continuation
//! seen both in this response and in earlier ones weighs as much as all those occurrences
//! together, where the request trie sees only this request's. Where both tries propose the same
//! from the response alone, they score the same and the request trie wins the tie.
//!
//! In both tries the occurrence at the very end of the context counts in the probabilities,
//! though nothing follows it yet (see the `speculate` module): in the cache's trie that is the
//! end of this session's response, and of every other response being generated.
//!
//! # Keeping the suffix nodes current
//!
//! `matches[d]` is the node of the context's last `d` tokens in the cache's trie. Fed tokens
//! move them on ([`Trie::follow_suffixes`]) after the session's own tokens entered the trie.
//! Other changes to the trie (other sessions' tokens, loaded responses) only add paths while the
//! cache's [`ResponseCache::removals`] stays the same, so the nodes found stay right and only
//! longer suffixes may have appeared: before proposing, those are looked up
//! ([`Trie::find_longer_suffixes`]), typically `O(max_depth)` steps. After a removal, or a feed
//! longer than `max_depth`, every suffix is looked up again ([`Trie::find_suffixes`],
//! `O(max_depth^2)`).

use spechost_sdk::{ModelFacts, Token};

use crate::STEPS_PER_CALL;
use crate::cache::{CACHE, CacheSettings, ResponseCache, ResponseId};
use crate::speculate::{self, Choice, Limits, Speculation};
use crate::trie::{NO_NODE, NodeId, ROOT};

/// A session's link to the cross-request cache.
pub(crate) struct CacheView {
    /// What the cache must have been built with for this session to use it.
    settings: CacheSettings,
    /// This session's response in the cache, once it generated a token.
    response: Option<ResponseId>,
    /// `matches[d]`: the cache trie's node for the context's last `d` tokens, or [`NO_NODE`];
    /// `matches[0]` is the root.
    pub(crate) matches: Vec<NodeId>,
    /// The cache's [`ResponseCache::removals`] the nodes in `matches` are valid for; `None`
    /// when they must all be looked up again.
    removals: Option<u64>,
    /// The cache's [`ResponseCache::version`] `matches` are complete for.
    version: Option<u64>,
}

impl CacheView {
    /// A view for a session whose cache settings are `settings`, with nothing fed yet.
    pub(crate) fn new(settings: CacheSettings) -> Self {
        let mut matches = vec![NO_NODE; settings.max_depth + 1];
        matches[0] = ROOT;
        Self {
            settings,
            response: None,
            matches,
            removals: None,
            version: None,
        }
    }

    /// Records that `tokens` were fed and that the context is now `context`: adds them to the
    /// session's response if `generated` (the prompt is not a response), does a slice of the
    /// cache's queued work, then moves the suffix nodes on.
    pub(crate) fn feed(&mut self, context: &[Token], tokens: &[Token], generated: bool) {
        debug_assert!(
            context.ends_with(tokens),
            "the context ends with the fed tokens"
        );
        CACHE.with_borrow_mut(|slot| {
            let Some(cache) = slot
                .as_mut()
                .filter(|cache| *cache.settings() == self.settings)
            else {
                self.removals = None;
                return;
            };
            if generated {
                match self.response {
                    Some(id) => cache.append(id, tokens),
                    None => self.response = cache.open(tokens),
                }
            }
            cache.work(STEPS_PER_CALL);
            if self.removals == Some(cache.removals()) && tokens.len() <= self.settings.max_depth {
                for &token in tokens {
                    cache.trie().follow_suffixes(&mut self.matches, token);
                }
                // Complete again at the next proposal.
                self.version = None;
            } else {
                self.removals = None;
            }
        });
    }

    /// The cache's proposal after `context`, if its best path beats the request trie's `own`
    /// (a higher score, or an equal score from a longer match).
    pub(crate) fn propose(
        &mut self,
        context: &[Token],
        own: Option<&Choice>,
        limits: &Limits,
        facts: &ModelFacts,
    ) -> Option<Speculation> {
        CACHE.with_borrow(|slot| {
            let cache = slot
                .as_ref()
                .filter(|cache| *cache.settings() == self.settings)?;
            self.refresh(cache, context);
            let trie = cache.trie();
            let choice = speculate::best_path(trie, &self.matches, limits, facts)?;
            let wins = own.is_none_or(|own| choice.beats(own));
            wins.then(|| speculate::proposal(trie, &choice, limits, facts))
        })
    }

    /// Ends the session's response: it is closed in the cache (to be saved), and the cache does
    /// a slice of its queued work.
    pub(crate) fn close(&mut self) {
        let Some(id) = self.response.take() else {
            return;
        };
        // `try_with`: a thread being torn down (only in native tests) has no cache to feed.
        let _ = CACHE.try_with(|slot| {
            let mut slot = slot.borrow_mut();
            // A session with other settings replaced the cache; this response went with it.
            if let Some(cache) = slot
                .as_mut()
                .filter(|cache| *cache.settings() == self.settings)
            {
                cache.close(id);
                cache.work(STEPS_PER_CALL);
            }
        });
    }

    /// Makes `matches` exact for `cache`'s trie as it is now (see the module docs).
    fn refresh(&mut self, cache: &ResponseCache, context: &[Token]) {
        if self.removals != Some(cache.removals()) {
            cache.trie().find_suffixes(context, &mut self.matches);
            self.removals = Some(cache.removals());
        } else if self.version != Some(cache.version()) {
            cache
                .trie()
                .find_longer_suffixes(context, &mut self.matches);
        }
        self.version = Some(cache.version());
    }
}
