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
//! Several sessions may be open at once (a server's requests): each adds its own response.
//!
//! # What it holds
//!
//! Each request contributes its response, the tokens generated after the prompt, *while it is
//! generated*: a session opens its response with its first generated tokens
//! ([`ResponseCache::open`]), appends the next ones as they are fed ([`ResponseCache::append`]),
//! and closes it when it ends ([`ResponseCache::close`]), which appends [`END_OF_TEXT`] so that
//! "the response ended here" is one of the outcomes the counts weigh. Tokens enter the trie one
//! at a time, each extending the paths of the last `max_depth` start positions by one token, as
//! the request trie grows ([`Trie::extend_suffixes`]); the end marker extends them but starts no
//! path. So at any time the trie holds, for each response, every start position of the tokens
//! that entered it (its *consumed* tokens), each path cut at `max_depth` tokens or at the last
//! consumed token; once a closed response is consumed, exactly the paths of the finished text.
//!
//! The end of a response that may still grow has no continuation in the trie yet: its suffix
//! nodes are kept ([`ResponseCache::open_ends`]) and proposals leave those occurrences out of
//! the probabilities, as the request trie does with the context's end.
//!
//! Responses are kept in the order they were opened and evicted oldest first (FIFO), running or
//! not, by removing their paths again, first start position first ([`Trie::remove`]), when:
//!
//! * there are more than `max_cached_requests` of them;
//! * the next token could take the trie past `max_nodes` nodes (a response too big for an
//!   otherwise empty trie *stalls*: the rest of its tokens stay out of the trie);
//! * their tokens, kept for eviction, total more than `max_nodes` (a response keeps at most
//!   `max_nodes - 1` tokens and its end marker).
//!
//! A running response that is evicted is gone: its session's later tokens are ignored.
//!
//! In a server the host also hands the plugin the finished responses of requests other
//! instances served (`observe_response`). Each is queued as a closed response
//! ([`ResponseCache::push`]), as if a session of this instance had generated it and ended, so
//! it is counted, saved and evicted like one. One observed before any session built the cache
//! waits in [`OBSERVED`], within bounds, and is queued when the cache is built, after the
//! responses of a loaded blob ([`Observed::drain_into`]).
//!
//! The trie stays *suffix-closed*: if a string is in it, so is every suffix of it (every start
//! position of a consumed token is indexed, and eviction removes from the first). Sessions rely
//! on it to update their matches cheaply while nothing is removed (see [`ResponseCache::removals`]).
//!
//! # Work in slices
//!
//! Indexing and evicting cost `max_depth` steps per token, which for a long response is more
//! than a guest call may take. So appending only queues tokens, and [`ResponseCache::work`] does
//! at most a given number of steps of the queued work, oldest response first. Sessions call it
//! on each `feed` and when they end, so a running response's tokens usually enter the trie in the
//! call that feeds them. Every change bumps [`ResponseCache::version`], telling sessions to look
//! up their suffix nodes again.
//!
//! # Saving
//!
//! What a blob holds is the list of closed responses ([`ResponseCache::saved_responses`]), not
//! the trie, nor responses still being generated: loading queues them like responses of ended
//! sessions, so the trie is rebuilt in slices over the next calls, under the loading session's
//! caps. [`ResponseCache::has_unsaved_changes`] tells whether that list changed since it was last
//! saved or loaded.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use spechost_sdk::Token;

use crate::blob::{Saved, Vocabulary};
use crate::trie::{END_OF_TEXT, NO_NODE, NodeId, ROOT, Trie};

thread_local! {
    /// The responses of recent requests, indexed; `None` until the first session that uses it.
    pub(crate) static CACHE: RefCell<Option<ResponseCache>> = const { RefCell::new(None) };

    /// Responses observed while [`CACHE`] is `None`, waiting for the first session to build it.
    pub(crate) static OBSERVED: RefCell<Observed> = const { RefCell::new(Observed::new()) };
}

/// Most responses [`Observed`] keeps: as many as a cache holds at the default
/// `max_cached_requests`.
pub(crate) const MAX_OBSERVED_RESPONSES: usize = crate::DEFAULT_MAX_CACHED_REQUESTS;
/// Most tokens [`Observed`] keeps, 8 MiB of them: as many as a cache holds at the default
/// `max_nodes`.
pub(crate) const MAX_OBSERVED_TOKENS: usize = crate::DEFAULT_MAX_NODES;

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

/// Names one response of a [`ResponseCache`] while it is there: its number in opening order,
/// never reused, not even by a cache that replaces this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResponseId(u64);

/// The indexed responses of recent requests.
pub(crate) struct ResponseCache {
    settings: CacheSettings,
    trie: Trie,
    /// Oldest first; only the first may be [`State::Evicting`].
    responses: VecDeque<Response>,
    /// The id of `responses[0]` (of the next response to open, when there is none).
    first_id: u64,
    /// Ids of the responses with tokens waiting to enter the trie; not stalled nor evicting.
    pending: BTreeSet<u64>,
    /// Suffix nodes of the consumed end of each response whose paths end there without a
    /// continuation (see [`ResponseCache::open_ends`]), by id.
    open: BTreeMap<u64, Vec<NodeId>>,
    /// Tokens of all responses, end markers included.
    cached_tokens: usize,
    version: u64,
    /// Bumped whenever paths are removed from the trie.
    removals: u64,
    /// Bumped whenever the list of responses to save changes: one is closed, or a closed one
    /// starts being evicted.
    revision: u64,
    /// The `revision` last saved or loaded.
    saved_revision: Option<u64>,
}

/// One response and how much of it the trie holds.
struct Response {
    /// The generated tokens, followed by [`END_OF_TEXT`] once closed.
    tokens: Vec<Token>,
    /// `tokens[..consumed]` are in the trie (see the module docs).
    consumed: usize,
    state: State,
    /// The trie has no room for more of it, even with every older response evicted: the rest
    /// of its tokens stay out.
    stalled: bool,
}

/// Where a response is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Its session goes on: tokens may be appended.
    Running,
    /// Its session ended; its tokens end with [`END_OF_TEXT`].
    Closed,
    /// Its paths are being removed, first start position first; `removed` are gone. It is
    /// dropped once none is left.
    Evicting { removed: usize },
}

impl Response {
    /// Start positions in the trie: the consumed tokens, but a consumed end marker.
    fn indexed_starts(&self) -> usize {
        match self.tokens[..self.consumed].last() {
            Some(&END_OF_TEXT) => self.consumed - 1,
            _ => self.consumed,
        }
    }

    /// The path of `start` as the trie holds it: at most `max_depth` tokens, up to the last
    /// consumed one.
    fn path(&self, start: usize, max_depth: usize) -> &[Token] {
        &self.tokens[start..(start + max_depth).min(self.consumed)]
    }
}

impl ResponseCache {
    /// An empty cache. `settings` were validated by the session's config.
    pub(crate) fn new(settings: CacheSettings) -> Self {
        Self {
            settings,
            trie: Trie::new(settings.max_nodes),
            responses: VecDeque::new(),
            first_id: 0,
            pending: BTreeSet::new(),
            open: BTreeMap::new(),
            cached_tokens: 0,
            version: 0,
            removals: 0,
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
        if let Some(old) = slot.as_ref().filter(|cache| cache.settings != settings) {
            // Keep versions and ids increasing, so that no session mistakes the new trie for
            // the old, nor a new response for its own.
            *slot = Some(ResponseCache {
                version: old.version + 1,
                removals: old.removals + 1,
                first_id: old.first_id + old.responses.len() as u64,
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

    /// Changes whenever paths are removed from the trie (nodes may be freed, and their ids
    /// reused). While it stays the same, the trie only gains counts and nodes: a node found
    /// earlier still stands for the same string.
    pub(crate) fn removals(&self) -> u64 {
        self.removals
    }

    /// The suffix nodes of the end of each response whose paths end there with nothing after
    /// them in the trie: running ones, closed ones whose end marker has not entered the trie
    /// yet (stalled ones included), and ones being evicted from such a state, for the paths not
    /// removed yet.
    #[cfg(test)]
    pub(crate) fn open_ends(&self) -> Vec<&[NodeId]> {
        self.open.values().map(Vec::as_slice).collect()
    }

    /// The responses a blob should hold, oldest first, without end markers: the closed ones,
    /// whether indexed yet or not, but those being evicted.
    pub(crate) fn saved_responses(&self) -> impl Iterator<Item = &[Token]> + Clone {
        self.responses
            .iter()
            .filter(|response| response.state == State::Closed)
            .map(|response| &response.tokens[..response.tokens.len() - 1])
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

    /// Opens a running response with its first `tokens` (see [`ResponseCache::append`]);
    /// `None` if there are none.
    pub(crate) fn open(&mut self, tokens: &[Token]) -> Option<ResponseId> {
        if tokens.is_empty() {
            return None;
        }
        let id = ResponseId(self.first_id + self.responses.len() as u64);
        self.responses.push_back(Response {
            tokens: Vec::with_capacity(tokens.len()),
            consumed: 0,
            state: State::Running,
            stalled: false,
        });
        self.append(id, tokens);
        Some(id)
    }

    /// Queues `tokens` for the end of the running response `id`, which keeps at most
    /// `max_nodes - 1` tokens. Does nothing if it was evicted.
    pub(crate) fn append(&mut self, id: ResponseId, tokens: &[Token]) {
        let max_tokens = self.settings.max_nodes - 1;
        let Some(response) = self.running_mut(id) else {
            return;
        };
        let kept = tokens.len().min(max_tokens - response.tokens.len());
        response.tokens.extend_from_slice(&tokens[..kept]);
        let stalled = response.stalled;
        self.cached_tokens += kept;
        if kept > 0 && !stalled {
            self.pending.insert(id.0);
        }
    }

    /// Ends the running response `id`: it gets its end marker and will be saved. Does nothing
    /// if it was evicted.
    pub(crate) fn close(&mut self, id: ResponseId) {
        let Some(response) = self.running_mut(id) else {
            return;
        };
        response.tokens.push(END_OF_TEXT);
        response.state = State::Closed;
        let stalled = response.stalled;
        self.cached_tokens += 1;
        self.revision += 1;
        if !stalled {
            self.pending.insert(id.0);
        }
    }

    /// Queues a finished `response` (the tokens one request generated), as if its session had
    /// opened and closed it. It is cut to `max_nodes - 1` tokens; an empty one is ignored.
    pub(crate) fn push(&mut self, response: &[Token]) {
        if let Some(id) = self.open(response) {
            self.close(id);
        }
    }

    /// Does up to `budget` steps (nodes visited) of queued indexing and eviction, oldest first;
    /// returns the steps done.
    pub(crate) fn work(&mut self, budget: usize) -> usize {
        let mut done = 0;
        while done < budget {
            if self
                .responses
                .front()
                .is_some_and(|front| matches!(front.state, State::Evicting { .. }))
            {
                done += self.remove_oldest_path();
            } else if self.over_caps() {
                self.start_evicting_oldest();
            } else if let Some(&id) = self.pending.first() {
                if self.trie.room() >= self.nodes_needed(id) {
                    done += self.consume(id);
                } else if id == self.first_id {
                    // Nothing older to evict: this response alone fills the trie.
                    self.pending.remove(&id);
                    self.responses[0].stalled = true;
                } else {
                    self.start_evicting_oldest();
                }
            } else {
                break;
            }
        }
        done
    }

    /// Whether [`ResponseCache::work`] has anything left to do.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty()
            && !self.over_caps()
            && self
                .responses
                .front()
                .is_none_or(|front| !matches!(front.state, State::Evicting { .. }))
    }

    /// The response `id` if it is there and running.
    fn running_mut(&mut self, id: ResponseId) -> Option<&mut Response> {
        let index = usize::try_from(id.0.checked_sub(self.first_id)?).ok()?;
        self.responses
            .get_mut(index)
            .filter(|response| response.state == State::Running)
    }

    fn over_caps(&self) -> bool {
        self.responses.len() > self.settings.max_cached_requests
            || self.cached_tokens > self.settings.max_nodes
    }

    /// The most nodes the next token of response `id` can add: one per path it extends (those
    /// shorter than `max_depth`), and one for the path it starts.
    fn nodes_needed(&self, id: u64) -> usize {
        let max_depth = self.settings.max_depth;
        self.open.get(&id).map_or(1, |ends| {
            1 + ends[1..max_depth]
                .iter()
                .filter(|&&node| node != NO_NODE)
                .count()
        })
    }

    /// Moves the next pending token of response `id` into the trie; returns the steps taken.
    ///
    /// The trie must have room for [`ResponseCache::nodes_needed`] more nodes.
    fn consume(&mut self, id: u64) -> usize {
        let max_depth = self.settings.max_depth;
        let response = &mut self.responses[(id - self.first_id) as usize];
        let token = response.tokens[response.consumed];
        let ends = self.open.entry(id).or_insert_with(|| {
            let mut ends = vec![NO_NODE; max_depth + 1];
            ends[0] = ROOT;
            ends
        });
        let steps = self.trie.extend_suffixes(ends, token, token != END_OF_TEXT);
        response.consumed += 1;
        if response.consumed == response.tokens.len() {
            self.pending.remove(&id);
            if response.state == State::Closed {
                // Its end marker ended every path.
                self.open.remove(&id);
            }
        }
        self.version += 1;
        steps
    }

    /// Marks the oldest response for eviction; [`ResponseCache::work`] then removes it.
    fn start_evicting_oldest(&mut self) {
        let front = self
            .responses
            .front_mut()
            .expect("only called with responses over a limit, so at least one");
        if front.state == State::Closed {
            self.revision += 1;
        }
        front.state = State::Evicting { removed: 0 };
        self.pending.remove(&self.first_id);
    }

    /// Removes the next path of the oldest response, which is being evicted, or drops it when
    /// none is left; returns the steps taken.
    fn remove_oldest_path(&mut self) -> usize {
        let max_depth = self.settings.max_depth;
        let front = self.responses.front_mut().expect("an evicting response");
        let State::Evicting { removed } = front.state else {
            unreachable!("only called while the oldest response is being evicted");
        };
        if removed == front.indexed_starts() {
            self.cached_tokens -= front.tokens.len();
            self.responses.pop_front();
            self.open.remove(&self.first_id);
            self.first_id += 1;
            return 0;
        }
        front.state = State::Evicting {
            removed: removed + 1,
        };
        // A path that ended at the consumed end no longer does: its last node may be freed.
        if let Some(ends) = self.open.get_mut(&self.first_id)
            && let Some(end) = ends.get_mut(front.consumed - removed)
        {
            *end = NO_NODE;
        }
        self.version += 1;
        self.removals += 1;
        self.trie.remove(front.path(removed, max_depth))
    }

    /// The responses, oldest first, each as the trie holds it: its consumed tokens, and the
    /// start positions indexed. What the trie's counts must match.
    #[cfg(test)]
    pub(crate) fn indexed_texts(&self) -> Vec<(Vec<Token>, std::ops::Range<usize>)> {
        self.responses
            .iter()
            .map(|response| {
                let first = match response.state {
                    State::Evicting { removed } => removed,
                    State::Running | State::Closed => 0,
                };
                let tokens = response.tokens[..response.consumed].to_vec();
                (tokens, first..response.indexed_starts())
            })
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

/// Responses of requests other instances served, observed before any session built the cache
/// (the cache's settings come from a session's config): the newest that fit in
/// [`MAX_OBSERVED_RESPONSES`] and [`MAX_OBSERVED_TOKENS`], until [`Observed::drain_into`] hands
/// them to the new cache.
pub(crate) struct Observed {
    /// Oldest first.
    responses: VecDeque<Vec<Token>>,
    /// Tokens of all `responses`.
    tokens: usize,
}

impl Observed {
    /// None observed yet.
    pub(crate) const fn new() -> Self {
        Self {
            responses: VecDeque::new(),
            tokens: 0,
        }
    }

    /// Keeps `response`, cut to [`MAX_OBSERVED_TOKENS`] tokens, dropping the oldest ones kept
    /// until both bounds hold. An empty one is ignored, as the cache ignores it.
    pub(crate) fn keep(&mut self, response: &[Token]) {
        if response.is_empty() {
            return;
        }
        let response = &response[..response.len().min(MAX_OBSERVED_TOKENS)];
        while self.responses.len() == MAX_OBSERVED_RESPONSES
            || self.tokens + response.len() > MAX_OBSERVED_TOKENS
        {
            let oldest = self
                .responses
                .pop_front()
                .expect("a response within the bounds fits once all are dropped");
            self.tokens -= oldest.len();
        }
        self.tokens += response.len();
        self.responses.push_back(response.to_vec());
    }

    /// Queues the kept responses in `cache`, oldest first, as finished responses
    /// ([`ResponseCache::push`]), and forgets them.
    pub(crate) fn drain_into(&mut self, cache: &mut ResponseCache) {
        for response in self.responses.drain(..) {
            cache.push(&response);
        }
        self.tokens = 0;
    }

    /// The kept responses, oldest first.
    #[cfg(test)]
    pub(crate) fn responses(&self) -> impl Iterator<Item = &[Token]> {
        self.responses.iter().map(Vec::as_slice)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use spechost_sdk::testing::facts;

    use super::*;
    use crate::blob;
    use crate::trie::tests::{Lcg, substring_counts, trie_counts};

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
        for (tokens, starts) in cache.indexed_texts() {
            for start in starts {
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
            0..8,
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
        let mut most_kept = 0;
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
            most_kept = most_kept.max(cache.len());
        }
        assert!(most_kept > 1, "several small responses fit at once");
    }

    #[test]
    fn a_response_larger_than_the_trie_is_indexed_in_part() {
        let mut cache = ResponseCache::new(settings(4, 40, 8));
        let text: Vec<Token> = (0..30).collect();
        cache.push(&text);
        cache.work(usize::MAX);
        assert!(cache.is_idle());
        let indexed = cache.indexed_texts()[0].1.end;
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
        assert_eq!(saved(&cache), [[1; 9]]);
        cache.work(usize::MAX);
        assert!(cache.is_idle());
        assert_eq!(
            cache.indexed_texts()[0].0.len(),
            10,
            "9 tokens and the end marker"
        );
    }

    /// Asserts that every suffix of every string in `trie` is in it too.
    fn assert_suffix_closed(trie: &Trie) {
        let counts = trie_counts(trie);
        for string in counts.keys() {
            if string.len() > 1 && string[1] != END_OF_TEXT {
                assert!(
                    counts.contains_key(&string[1..]),
                    "{string:?} is held but not {:?}",
                    &string[1..]
                );
            }
        }
    }

    #[test]
    fn running_responses_enter_the_trie_as_they_grow() {
        let mut cache = ResponseCache::new(settings(3, 1000, 8));
        let id = cache.open(&[1, 2]).expect("tokens");
        cache.work(usize::MAX);
        // Every start position so far, cut at the last token: nothing follows [1, 2] yet.
        assert_eq!(
            trie_counts(cache.trie()),
            substring_counts([&[1, 2][..]], 3)
        );
        assert_eq!(
            cache.open_ends(),
            [&[
                ROOT,
                cache.trie().find(&[2]),
                cache.trie().find(&[1, 2]),
                NO_NODE
            ][..]]
        );
        assert!(saved(&cache).is_empty(), "a running response is not saved");
        cache.append(id, &[1, 3]);
        cache.work(usize::MAX);
        assert_eq!(trie_counts(cache.trie()), expected_counts(&cache));
        cache.close(id);
        cache.work(usize::MAX);
        // Closed and consumed: the same trie as a finished response pushed at once.
        let mut pushed = ResponseCache::new(settings(3, 1000, 8));
        pushed.push(&[1, 2, 1, 3]);
        pushed.work(usize::MAX);
        assert_eq!(trie_counts(cache.trie()), trie_counts(pushed.trie()));
        assert!(cache.open_ends().is_empty());
        assert_eq!(saved(&cache), [[1, 2, 1, 3]]);
    }

    #[test]
    fn a_long_append_enters_the_trie_in_slices() {
        let mut cache = ResponseCache::new(settings(4, 10_000, 8));
        let id = cache.open(&[7]).expect("tokens");
        cache.append(id, &(0..100).collect::<Vec<Token>>());
        let done = cache.work(40);
        assert!((40..44).contains(&done), "{done} steps for a budget of 40");
        assert!(!cache.is_idle());
        assert_eq!(trie_counts(cache.trie()), expected_counts(&cache));
        cache.work(usize::MAX);
        assert!(cache.is_idle());
        assert_eq!(cache.indexed_texts()[0].1, 0..101);
    }

    #[test]
    fn a_running_response_can_be_evicted_and_its_session_goes_on() {
        let mut cache = ResponseCache::new(settings(3, 1000, 1));
        let first = cache.open(&[1, 2, 3]).expect("tokens");
        cache.work(usize::MAX);
        let second = cache.open(&[4, 5]).expect("tokens");
        cache.work(usize::MAX);
        assert_eq!(cache.len(), 1, "the running first response was evicted");
        assert_eq!(cache.trie().find(&[1]), NO_NODE);
        assert_eq!(cache.open_ends().len(), 1, "only the second one's end");
        // Its session's later calls change nothing.
        cache.append(first, &[6]);
        cache.close(first);
        cache.work(usize::MAX);
        assert_eq!(
            trie_counts(cache.trie()),
            substring_counts([&[4, 5][..]], 3)
        );
        cache.close(second);
        cache.work(usize::MAX);
        assert_eq!(saved(&cache), [[4, 5]]);
    }

    #[test]
    fn interleaved_sessions_keep_counts_exact_caps_and_the_trie_suffix_closed() {
        let mut random = Lcg(27);
        let (max_depth, max_nodes) = (5, 400);
        let mut cache = ResponseCache::new(settings(max_depth, max_nodes, 6));
        let mut running: Vec<ResponseId> = Vec::new();
        let (mut opened, mut closed) = (0, 0);
        for step in 0..400 {
            let len = random.below(6) as usize;
            let tokens = random.text(len, 4);
            match random.below(8) {
                0 => {
                    running.extend(cache.open(&tokens));
                    opened += usize::from(!tokens.is_empty());
                }
                1 if !running.is_empty() => {
                    let id = running.swap_remove(random.below(running.len() as u32) as usize);
                    cache.close(id);
                    closed += 1;
                }
                _ if !running.is_empty() => {
                    let id = running[random.below(running.len() as u32) as usize];
                    cache.append(id, &tokens);
                }
                _ => {}
            }
            cache.work(1 + random.below(40) as usize);
            assert!(cache.trie().live_nodes() <= max_nodes, "step {step}");
            assert_eq!(
                trie_counts(cache.trie()),
                expected_counts(&cache),
                "step {step}"
            );
            assert_suffix_closed(cache.trie());
        }
        assert!(closed > 10, "{closed} responses closed");
        assert!(opened > cache.len() + 10, "{opened} opened, some evicted");
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
