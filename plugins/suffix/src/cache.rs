//! The cross-request cache: a [`Trie`] over the responses of recent requests, shared by every
//! session of the plugin instance.
//!
//! # Where it lives
//!
//! Sessions end with their request, so the cache lives at plugin level, in the `thread_local!`
//! [`CACHE`]: a plugin instance is single-threaded, so that is a plain global. It lasts as long
//! as the host keeps the plugin loaded, and starts empty again if the plugin traps and the host
//! re-creates it. It is built by the first session that uses it, with that session's settings,
//! from the blob the host keeps if there is a valid one (see [`ResponseCache::from_saved`]); a
//! session with different `max_depth`, `max_nodes`, `max_cached_requests` or vocabulary
//! replaces it with an empty one (in practice every session of an instance has the same config).
//!
//! # What it holds
//!
//! Each finished request contributes its response: the tokens generated after the prompt,
//! followed by [`END_OF_TEXT`], so that "the response ended here" is one of the outcomes the
//! counts weigh. Every start position of the response is indexed, each path cut at `max_depth`
//! tokens. Responses are kept in arrival order and evicted oldest first (FIFO), by removing
//! their paths again ([`Trie::remove`]), when:
//!
//! * there are more than `max_cached_requests` of them;
//! * indexing the next path could take the trie past `max_nodes` nodes (a response too big for
//!   an otherwise empty trie is indexed only in part: its first start positions);
//! * their tokens, kept for eviction, total more than `max_nodes` (a response is cut to that
//!   many tokens when it arrives).
//!
//! # Work in slices
//!
//! Indexing and evicting cost `max_depth` steps per token, which for a long response is more
//! than a guest call may take. So [`ResponseCache::push`] only queues a response, and
//! [`ResponseCache::work`] does at most a given number of steps of the queued work, oldest
//! first. Sessions call it when they end and on each `feed`, so a response is usually indexed by
//! the time the next request starts, and always within a few rounds of it. Every change bumps
//! [`ResponseCache::version`], telling sessions to look up their suffix nodes again.
//!
//! # Saving
//!
//! What a blob holds is the list of responses ([`ResponseCache::saved_responses`]), not the
//! trie: loading queues them like responses of ended sessions, so the trie is rebuilt in slices
//! over the next calls, under the loading session's caps. [`ResponseCache::has_unsaved_changes`]
//! tells whether that list changed since it was last saved or loaded.

use std::cell::RefCell;
use std::collections::VecDeque;

use spechost_sdk::Token;

use crate::blob::{Saved, Vocabulary};
use crate::trie::{END_OF_TEXT, Trie};

thread_local! {
    /// The responses of recent requests, indexed; `None` until the first session that uses it.
    pub(crate) static CACHE: RefCell<Option<ResponseCache>> = const { RefCell::new(None) };
}

/// The settings a [`ResponseCache`] was built with; a session uses the cache only if its own
/// settings are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheSettings {
    /// Longest path indexed.
    pub(crate) max_depth: usize,
    /// Most nodes in the trie, the root included.
    pub(crate) max_nodes: usize,
    /// Most responses kept.
    pub(crate) max_cached_requests: usize,
    /// Vocabulary the tokens come from; another model's tokens would mean nothing.
    pub(crate) vocabulary: Vocabulary,
}

/// The indexed responses of recent requests.
pub(crate) struct ResponseCache {
    settings: CacheSettings,
    trie: Trie,
    /// Oldest first. Fully indexed (or truncated) responses come first, then at most one being
    /// indexed, then queued ones.
    responses: VecDeque<Response>,
    /// How many responses at the front index nothing more.
    n_complete: usize,
    /// Tokens of all responses, end markers included.
    cached_tokens: usize,
    version: u64,
    /// Bumped whenever the list of responses to save changes: one is queued, or one starts
    /// being evicted.
    revision: u64,
    /// The `revision` last saved or loaded.
    saved_revision: Option<u64>,
}

/// One response and how much of it the trie holds.
struct Response {
    /// The generated tokens followed by [`END_OF_TEXT`].
    tokens: Vec<Token>,
    /// Start positions `0..indexed` are in the trie.
    indexed: usize,
    /// No further start positions will be indexed: all are, the trie had no room for the rest,
    /// or the response is being evicted.
    complete: bool,
    /// Its paths are being removed, last start position first; it is dropped once none is left.
    evicting: bool,
}

impl Response {
    /// Start positions: every token but the end marker.
    fn starts(&self) -> usize {
        self.tokens.len() - 1
    }

    fn path(&self, start: usize, max_depth: usize) -> &[Token] {
        &self.tokens[start..(start + max_depth).min(self.tokens.len())]
    }
}

impl ResponseCache {
    /// An empty cache. `settings` were validated by the session's config.
    pub(crate) fn new(settings: CacheSettings) -> Self {
        Self {
            settings,
            trie: Trie::new(settings.max_nodes),
            responses: VecDeque::new(),
            n_complete: 0,
            cached_tokens: 0,
            version: 0,
            revision: 0,
            saved_revision: None,
        }
    }

    /// A cache of the responses of `saved`, queued for indexing, within the caps of `settings`:
    /// the newest responses that fit in `max_cached_requests` and, cut to `max_nodes` tokens
    /// each, in `max_nodes` tokens together. Older ones are skipped, as if evicted.
    ///
    /// Costs a copy of the kept tokens; the trie is built by later [`ResponseCache::work`].
    pub(crate) fn from_saved(settings: CacheSettings, saved: &Saved<'_>) -> Self {
        let mut kept = 0;
        let mut tokens = 0;
        for index in (0..saved.len()).rev() {
            // What `push` keeps: the response cut to `max_nodes - 1`, then the end marker.
            let len = saved.response_len(index).min(settings.max_nodes - 1) + 1;
            if kept == settings.max_cached_requests || tokens + len > settings.max_nodes {
                break;
            }
            kept += 1;
            tokens += len;
        }
        let mut cache = Self::new(settings);
        for index in saved.len() - kept..saved.len() {
            cache.push(&saved.response(index));
        }
        cache.saved_revision = Some(cache.revision);
        cache
    }

    /// The cache in `slot` if it has `settings`; otherwise a new, empty one put there.
    pub(crate) fn configure(
        slot: &mut Option<ResponseCache>,
        settings: CacheSettings,
    ) -> &mut ResponseCache {
        if slot
            .as_ref()
            .is_some_and(|cache| cache.settings != settings)
        {
            // Keep versions increasing, so that no session mistakes the new trie for the old.
            let version = slot.as_ref().map_or(0, |cache| cache.version + 1);
            *slot = Some(ResponseCache {
                version,
                ..ResponseCache::new(settings)
            });
        }
        slot.get_or_insert_with(|| ResponseCache::new(settings))
    }

    /// The settings the cache was built with.
    pub(crate) fn settings(&self) -> &CacheSettings {
        &self.settings
    }

    /// The trie of the indexed responses.
    pub(crate) fn trie(&self) -> &Trie {
        &self.trie
    }

    /// Changes whenever the trie does.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The responses a blob should hold, oldest first, without end markers: all but those being
    /// evicted, whether indexed yet or not.
    pub(crate) fn saved_responses(&self) -> impl Iterator<Item = &[Token]> + Clone {
        self.responses
            .iter()
            .filter(|response| !response.evicting)
            .map(|response| &response.tokens[..response.starts()])
    }

    /// Whether [`ResponseCache::saved_responses`] changed since they were last saved or loaded
    /// and are not empty. An empty cache is never worth saving: it would only overwrite a blob
    /// with something no better (a cache is empty only before its first response, or after a
    /// session with other settings replaced it).
    pub(crate) fn has_unsaved_changes(&self) -> bool {
        self.saved_revision != Some(self.revision) && self.saved_responses().next().is_some()
    }

    /// Records that [`ResponseCache::saved_responses`] were saved as they are now.
    pub(crate) fn mark_saved(&mut self) {
        self.saved_revision = Some(self.revision);
    }

    /// Queues `response` (the tokens one request generated) for indexing. It is cut to
    /// `max_nodes` tokens; an empty one is ignored.
    pub(crate) fn push(&mut self, response: &[Token]) {
        if response.is_empty() {
            return;
        }
        let kept = response.len().min(self.settings.max_nodes - 1);
        let mut tokens = Vec::with_capacity(kept + 1);
        tokens.extend_from_slice(&response[..kept]);
        tokens.push(END_OF_TEXT);
        self.cached_tokens += tokens.len();
        self.revision += 1;
        self.responses.push_back(Response {
            tokens,
            indexed: 0,
            complete: false,
            evicting: false,
        });
    }

    /// Does up to `budget` steps (nodes visited) of queued indexing and eviction, oldest first;
    /// returns the steps done.
    pub(crate) fn work(&mut self, budget: usize) -> usize {
        let max_depth = self.settings.max_depth;
        let mut done = 0;
        while done < budget {
            if let Some(front) = self.responses.front_mut()
                && front.evicting
            {
                if front.indexed == 0 {
                    self.cached_tokens -= front.tokens.len();
                    self.responses.pop_front();
                    self.n_complete -= 1;
                } else {
                    front.indexed -= 1;
                    done += self.trie.remove(front.path(front.indexed, max_depth));
                }
                self.version += 1;
                continue;
            }
            if self.responses.len() > self.settings.max_cached_requests
                || self.cached_tokens > self.settings.max_nodes
            {
                self.start_evicting_oldest();
                continue;
            }
            let Some(target) = self.responses.get_mut(self.n_complete) else {
                break;
            };
            let path = target.path(target.indexed, max_depth);
            if self.trie.room() < path.len() {
                if self.n_complete == 0 {
                    // Nothing older to evict: this response alone fills the trie.
                    target.complete = true;
                    self.n_complete += 1;
                } else {
                    self.start_evicting_oldest();
                }
                continue;
            }
            done += self
                .trie
                .insert(path)
                .expect("room for the whole path was checked");
            target.indexed += 1;
            if target.indexed == target.starts() {
                target.complete = true;
                self.n_complete += 1;
            }
            self.version += 1;
        }
        done
    }

    /// Whether [`ResponseCache::work`] has anything left to do.
    pub(crate) fn is_idle(&self) -> bool {
        self.n_complete == self.responses.len()
            && self.responses.len() <= self.settings.max_cached_requests
            && self.cached_tokens <= self.settings.max_nodes
            && self.responses.front().is_none_or(|front| !front.evicting)
    }

    /// Marks the oldest response for eviction; [`ResponseCache::work`] then removes it.
    fn start_evicting_oldest(&mut self) {
        let front = self
            .responses
            .front_mut()
            .expect("only called with responses over a limit, so at least one");
        front.evicting = true;
        self.revision += 1;
        if !front.complete {
            front.complete = true;
            self.n_complete += 1;
        }
    }

    /// The responses, oldest first, each cut to the start positions indexed: what the trie's
    /// counts must match.
    #[cfg(test)]
    pub(crate) fn indexed_texts(&self) -> Vec<(Vec<Token>, usize)> {
        self.responses
            .iter()
            .map(|response| (response.tokens.clone(), response.indexed))
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.responses.len()
    }

    /// Evicts every response at once; for tests that check the trie empties.
    #[cfg(test)]
    pub(crate) fn evict_all(&mut self) {
        let max_cached_requests = self.settings.max_cached_requests;
        self.settings.max_cached_requests = 0;
        while !self.responses.is_empty() {
            self.work(usize::MAX);
        }
        self.settings.max_cached_requests = max_cached_requests;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use spechost_sdk::testing::facts;

    use super::*;
    use crate::blob;
    use crate::trie::tests::{Lcg, substring_counts, trie_counts};
    use crate::trie::{NO_NODE, ROOT};

    fn settings(max_depth: usize, max_nodes: usize, max_cached_requests: usize) -> CacheSettings {
        CacheSettings {
            max_depth,
            max_nodes,
            max_cached_requests,
            vocabulary: Vocabulary::of(&facts(100)),
        }
    }

    /// What the trie of `cache` must count: every indexed start position of every response.
    pub(crate) fn expected_counts(cache: &ResponseCache) -> BTreeMap<Vec<Token>, u32> {
        let max_depth = cache.settings().max_depth;
        let mut counts = BTreeMap::new();
        for (tokens, indexed) in cache.indexed_texts() {
            for start in 0..indexed {
                let path = &tokens[start..(start + max_depth).min(tokens.len())];
                for end in 1..=path.len() {
                    *counts.entry(path[..end].to_vec()).or_default() += 1;
                }
            }
        }
        counts
    }

    fn with_end(text: &[Token]) -> Vec<Token> {
        let mut tokens = text.to_vec();
        tokens.push(END_OF_TEXT);
        tokens
    }

    #[test]
    fn indexes_each_response_with_an_end_marker() {
        let mut cache = ResponseCache::new(settings(3, 1000, 8));
        cache.push(&[1, 2, 1]);
        cache.push(&[2, 1]);
        cache.work(usize::MAX);
        assert!(cache.is_idle());
        let texts = [with_end(&[1, 2, 1]), with_end(&[2, 1])];
        // Paths start at every token but the end marker.
        let mut expected = substring_counts(texts.iter().map(Vec::as_slice), 3);
        expected.remove(&vec![END_OF_TEXT]);
        assert_eq!(trie_counts(cache.trie()), expected);
        // Every occurrence is followed by something, so counts add up down the trie.
        let one = cache.trie().find(&[1]);
        assert_eq!(cache.trie().count(one), 3);
        let one_end = cache.trie().child(one, 1, END_OF_TEXT);
        assert_eq!(cache.trie().count(one_end), 2, "both responses end with 1");
    }

    #[test]
    fn ignores_empty_responses() {
        let mut cache = ResponseCache::new(settings(3, 1000, 8));
        cache.push(&[]);
        assert_eq!(cache.len(), 0);
        assert!(cache.is_idle());
    }

    #[test]
    fn works_in_slices_of_the_budget() {
        let mut cache = ResponseCache::new(settings(4, 1000, 8));
        cache.push(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let version = cache.version();
        let done = cache.work(10);
        assert!(
            (10..10 + 4).contains(&done),
            "{done} steps for a budget of 10"
        );
        assert!(!cache.is_idle());
        assert!(cache.version() > version);
        assert_eq!(trie_counts(cache.trie()), expected_counts(&cache));
        cache.work(usize::MAX);
        assert!(cache.is_idle());
        assert_eq!(
            cache.indexed_texts()[0].1,
            8,
            "every start position indexed"
        );
    }

    #[test]
    fn evicts_the_oldest_beyond_max_cached_requests() {
        let mut cache = ResponseCache::new(settings(4, 10_000, 2));
        for response in [[1, 2, 3], [4, 5, 6], [7, 8, 9]] {
            cache.push(&response);
            cache.work(usize::MAX);
        }
        let kept: Vec<Vec<Token>> = cache.indexed_texts().into_iter().map(|(t, _)| t).collect();
        assert_eq!(kept, [with_end(&[4, 5, 6]), with_end(&[7, 8, 9])]);
        assert_eq!(
            cache.trie().find(&[1]),
            NO_NODE,
            "the first response is forgotten"
        );
        assert_eq!(trie_counts(cache.trie()), expected_counts(&cache));
    }

    #[test]
    fn never_exceeds_max_nodes_and_keeps_counts_exact() {
        let mut random = Lcg(3);
        let max_nodes = 150;
        let mut cache = ResponseCache::new(settings(6, max_nodes, 100));
        for round in 0..60 {
            let len = 1 + random.below(40) as usize;
            cache.push(&random.text(len, 6));
            // Small budgets interleave indexing and eviction.
            while !cache.is_idle() {
                cache.work(1 + random.below(30) as usize);
                let live = cache.trie().live_nodes();
                assert!(live <= max_nodes, "{live} nodes in round {round}");
                assert_eq!(
                    trie_counts(cache.trie()),
                    expected_counts(&cache),
                    "round {round}"
                );
            }
        }
        assert!(cache.len() > 1, "several small responses fit at once");
    }

    #[test]
    fn a_response_larger_than_the_trie_is_indexed_in_part() {
        let mut cache = ResponseCache::new(settings(4, 40, 8));
        let text: Vec<Token> = (0..30).collect();
        cache.push(&text);
        cache.work(usize::MAX);
        assert!(cache.is_idle());
        let indexed = cache.indexed_texts()[0].1;
        assert!(
            (1..30).contains(&indexed),
            "{indexed} start positions indexed"
        );
        assert!(cache.trie().live_nodes() <= 40);
        assert_eq!(trie_counts(cache.trie()), expected_counts(&cache));
    }

    #[test]
    fn evicting_everything_empties_the_trie() {
        let mut random = Lcg(8);
        let mut cache = ResponseCache::new(settings(5, 5000, 50));
        for _ in 0..20 {
            let len = 1 + random.below(60) as usize;
            cache.push(&random.text(len, 5));
        }
        cache.work(usize::MAX);
        assert!(cache.trie().live_nodes() > 100);
        cache.evict_all();
        assert_eq!(cache.len(), 0);
        assert_eq!(cache.trie().live_nodes(), 1, "only the root is left");
        assert_eq!(cache.trie().count(ROOT), 0);
        assert_eq!(cache.trie().indexed_edges(), 0);
        assert!(cache.is_idle());
    }

    #[test]
    fn cuts_responses_to_max_nodes_tokens() {
        let mut cache = ResponseCache::new(settings(2, 10, 8));
        cache.push(&[1; 25]);
        assert_eq!(
            cache.indexed_texts()[0].0.len(),
            10,
            "9 tokens and the end marker"
        );
        cache.work(usize::MAX);
        assert!(cache.is_idle());
    }

    /// `cache`'s saved responses, through a blob and back into a new cache with `settings`.
    fn reloaded(cache: &ResponseCache, settings: CacheSettings) -> ResponseCache {
        let vocabulary = cache.settings().vocabulary;
        let bytes = blob::encode(vocabulary, cache.saved_responses());
        let saved = blob::decode(&bytes, vocabulary).expect("a blob just written");
        ResponseCache::from_saved(settings, &saved)
    }

    fn saved(cache: &ResponseCache) -> Vec<Vec<Token>> {
        cache.saved_responses().map(<[Token]>::to_vec).collect()
    }

    #[test]
    fn reloading_saved_responses_rebuilds_the_same_trie() {
        let mut random = Lcg(12);
        let mut cache = ResponseCache::new(settings(5, 100_000, 50));
        for _ in 0..8 {
            let len = 1 + random.below(40) as usize;
            cache.push(&random.text(len, 4));
            cache.work(60);
        }
        assert!(
            !cache.is_idle(),
            "some responses are still queued when saved"
        );
        let mut restored = reloaded(&cache, *cache.settings());
        assert_eq!(saved(&restored), saved(&cache));
        cache.work(usize::MAX);
        restored.work(usize::MAX);
        assert_eq!(trie_counts(restored.trie()), trie_counts(cache.trie()));
        assert_eq!(trie_counts(restored.trie()), expected_counts(&restored));
    }

    #[test]
    fn reloading_keeps_the_newest_responses_within_the_caps() {
        let mut random = Lcg(14);
        let mut cache = ResponseCache::new(settings(4, 100_000, 100));
        let responses: Vec<Vec<Token>> = (0..10)
            .map(|_| {
                let len = 5 + random.below(20) as usize;
                random.text(len, 6)
            })
            .collect();
        for response in &responses {
            cache.push(response);
        }
        // At most 3 responses.
        let restored = reloaded(&cache, settings(4, 100_000, 3));
        assert_eq!(saved(&restored), responses[7..]);
        // At most 40 tokens, end markers included: the newest that fit, whole.
        let mut restored = reloaded(&cache, settings(4, 40, 100));
        let fitting = responses
            .iter()
            .rev()
            .scan(0, |tokens, response| {
                *tokens += response.len() + 1;
                (*tokens <= 40).then_some(response.clone())
            })
            .count();
        assert!(fitting >= 1, "the newest response fits");
        assert_eq!(saved(&restored), responses[10 - fitting..]);
        // And at most 40 nodes once indexed.
        restored.work(usize::MAX);
        assert!(restored.is_idle());
        assert!(
            restored.trie().live_nodes() <= 40,
            "{} nodes",
            restored.trie().live_nodes()
        );
        assert_eq!(trie_counts(restored.trie()), expected_counts(&restored));
    }

    #[test]
    fn unsaved_changes_follow_pushes_and_evictions() {
        let mut cache = ResponseCache::new(settings(4, 10_000, 2));
        assert!(
            !cache.has_unsaved_changes(),
            "an empty cache is never saved"
        );
        cache.push(&[1, 2, 3]);
        assert!(cache.has_unsaved_changes());
        cache.mark_saved();
        assert!(!cache.has_unsaved_changes());
        cache.work(usize::MAX);
        assert!(
            !cache.has_unsaved_changes(),
            "indexing changes nothing saved"
        );
        cache.push(&[4, 5, 6]);
        cache.push(&[7, 8, 9]);
        cache.mark_saved();
        // Three responses for two places: the oldest starts being evicted.
        cache.work(1);
        assert!(cache.has_unsaved_changes());
        assert_eq!(
            saved(&cache),
            [[4, 5, 6], [7, 8, 9]],
            "evicting responses are left out"
        );
        let restored = reloaded(&cache, *cache.settings());
        assert!(
            !restored.has_unsaved_changes(),
            "a loaded cache is saved as it is"
        );
    }

    #[test]
    fn configure_replaces_a_cache_with_other_settings() {
        let mut slot = None;
        let cache = ResponseCache::configure(&mut slot, settings(4, 1000, 8));
        cache.push(&[1, 2, 3]);
        cache.work(usize::MAX);
        let version = cache.version();
        let same = ResponseCache::configure(&mut slot, settings(4, 1000, 8));
        assert_eq!(same.len(), 1, "same settings keep the cache");
        let other = ResponseCache::configure(&mut slot, settings(5, 1000, 8));
        assert_eq!(other.len(), 0, "other settings start over");
        assert!(other.version() > version, "versions keep increasing");
    }
}
