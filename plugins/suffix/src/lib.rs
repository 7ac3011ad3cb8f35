//! `suffix`: suffix decoding (SuffixDecoding, NeurIPS 2025). Proposes the most frequent
//! continuation of the context's suffixes, counted in a suffix trie over this request's context
//! and in another over the responses of recent requests.
//!
//! It shines where text repeats with regular continuations: agentic loops and tool calls that
//! send similar requests again and again (the cross-request cache learns their responses), code
//! edits and summaries that copy their prompt, and outputs that repeat themselves. Unlike
//! `lookup`, it weighs every earlier continuation by how often it occurred and says how sure it
//! is, so a cascade can compare it with other sources; it needs no model.
//!
//! # How it works
//!
//! Two tries count every string of up to `max_depth` tokens (see the `trie` module):
//!
//! * the **request trie** indexes this request's context, prompt and generated tokens alike,
//!   and grows with every fed token;
//! * the **response cache** indexes the responses (generated tokens only, as in the paper) of
//!   the last `max_cached_requests` requests, those still being generated included. It lives at
//!   plugin level, outside any session, shared by the sessions open at once (see the `cache`
//!   module). A request's response enters it as it is generated, with the tokens of each feed,
//!   and is closed with an end marker when the session is dropped; bulk work is sliced so that
//!   no call runs long. In a server, the responses of requests other instances served (other
//!   slots, other replicas) enter it too, as the host hands them over
//!   ([`Suffix::observe_response`]): each as the closed response of an ended session.
//!
//! A session's first feed is its prompt; every token fed after it is its response. The host
//! feeds the prompt alone, then the token decoded with it, then each round's tokens, so every
//! generated token, the first included, reaches the response cache.
//!
//! The session's own response is in both tries. That counts nothing twice: each trie's counts
//! are exact for its own texts, and the tries' best paths are compared, never added (see the
//! `view` module).
//!
//! For every suffix of the context that a trie holds, the session keeps the suffix's node,
//! updated as tokens are fed. To propose, it walks from each of them along the most frequent
//! continuation and keeps the best-scoring path (see the `speculate` module): each token's
//! *path probability* is the product of `count(child) / count(node)` along the way, where
//! `count(s)` is how often string `s` occurs, its occurrence at the context's own end (and at the
//! ends of responses still being generated) included though nothing follows it yet, as the
//! reference implementation counts (`docs/suffix.md`); the walk stops below `min_token_prob`, after
//! `floor(alpha * m + beta)` tokens for a match of `m` tokens, or after an end-of-generation
//! token. A path's score is the sum of its path probabilities; the higher score wins, on a tie
//! the longer match, between suffixes and between the two tries, and on a full tie the request
//! trie.
//!
//! Where the host verifies trees (`--cascade-mode tree`: `tree::max_paths() > 1`), the proposal
//! is instead the speculation tree below the winning suffix: the likeliest nodes by path
//! probability within `max_draft_len` tokens, the same depth cap and `min_token_prob`, and the
//! host's paths, the greedy path first (see the `speculate` module).
//!
//! # Keeping the cache across restarts
//!
//! The response cache dies with the plugin instance, so it is kept in the blob the host holds
//! for the plugin (the WIT `state` interface; the plugin has no files):
//!
//! * **Loading.** The first session of an instance that uses the cache reads the blob and
//!   queues its responses as if their sessions had just ended: the newest ones that fit in
//!   `max_cached_requests` and `max_nodes`, so the caps hold whatever the blob holds. After
//!   them it queues the responses observed since the instance started, newer than the blob's
//!   (until a session builds the cache they wait in a list of at most 256 responses and 2M
//!   tokens, the oldest dropped first), evicting the oldest as any response does. The trie is
//!   rebuilt from them in slices over the following calls, like any response (see Cost). A
//!   restarted host, or an instance the host re-created, loads it again the same way. A blob
//!   that is another program's, in another format version, corrupt or truncated, or saved for
//!   another vocabulary is ignored with a warning in the host's log, and the cache starts
//!   empty. The config does not invalidate a blob: it holds responses, not the trie.
//! * **Saving.** [`Suffix::checkpoint`], which the host calls at the end of a run,
//!   periodically and at shutdown, saves the cached responses of ended sessions and observed
//!   ones (not those still being generated), oldest first, unless they are unchanged since the
//!   last save or load (or there are none). Responses observed before any session built the
//!   cache wait for one: a blob names the model's vocabulary, which only a session's facts give.
//!
//! The format (magic, version, vocabulary fingerprint, responses, checksum) is described in
//! the `blob` module. A full cache at the default caps holds at most 2M tokens: a blob of at
//! most 8 MiB.
//!
//! # Warming the cache from a corpus
//!
//! A session's response is everything fed after its first feed, the prompt. So a session fed
//! an empty or one-token prompt, then any text (in one feed or many), then dropped, adds that
//! text to the cache as a response, and the next checkpoint saves it. An empty prompt must
//! still be fed, as `feed([])`: otherwise the text's first feed is taken for the prompt and
//! left out. This is how
//! `spechost suffix warm` turns a corpus into a cache file. The caps apply as to any response:
//! a text is cut to `max_nodes - 1` tokens, and of a corpus larger than the cache the newest
//! texts are kept, so warm with the caps the cache will be served with (or larger ones: a
//! loading session keeps what fits in its own).
//!
//! # Config
//!
//! | key                   | default   | meaning                                                   |
//! |-----------------------|-----------|-----------------------------------------------------------|
//! | `max_depth`           | 64        | longest string counted; a match plus its proposal fit in it |
//! | `min_token_prob`      | 0.1       | stop before a token whose path probability is below this   |
//! | `alpha`               | 1.0       | tokens proposed per token of match                          |
//! | `beta`                | 0.0       | tokens proposed on top of `alpha * m` (may be negative)     |
//! | `use_global`          | true      | use and feed the cross-request response cache               |
//! | `max_cached_requests` | 256       | responses kept in the cache, oldest evicted first           |
//! | `max_nodes`           | 2,000,000 | nodes in the cache's trie (38 MiB), oldest evicted first    |
//! | `max_request_nodes`   | 4,000,000 | nodes in one request's trie (76 MiB)                        |
//!
//! with `1 <= max_depth <= 256`, `0 <= min_token_prob <= 1`, `alpha >= 0`,
//! `max_cached_requests >= 1` and `max_depth < max_nodes, max_request_nodes <= 2^30`. Every
//! session of a plugin instance should use the same config: a session whose `max_depth`,
//! `max_nodes`, `max_cached_requests` or vocabulary differs from the cache's starts an empty
//! cache.
//!
//! # Cost
//!
//! [`Suffix::feed`] advances each of the up to `max_depth` suffix nodes by the new token in the
//! request trie (creating missing children) and, with `use_global`, does the same for the
//! generated tokens in the cache's trie (its response's paths) and moves the context's suffix
//! nodes there (following existing children only): `O(max_depth)` steps per token and trie,
//! whatever the context length. A step is a hash lookup for the two shallowest levels and a
//! scan of a few siblings below. [`Suffix::propose`] first completes the suffix nodes in the
//! cache's trie if other sessions changed it (typically `O(max_depth)` steps; `O(max_depth^2)`
//! after an eviction), then walks at most `max_draft_len` steps from each suffix node, longest
//! match first, and stops early once no shorter match can win; in the cache's trie each step
//! also checks the ends of the responses being generated, one per session open at once.
//!
//! One guest call must finish within the host's deadline, so bulk work is sliced: of a feed
//! longer than about 2^16 / `max_depth` tokens (a long prompt; 1024 at the default depth), only
//! the last ones are indexed at once, and the older start positions, newest first, in later
//! feeds, about 2^16 steps per call; cache indexing and eviction run in slices of the same size.
//! Natively a slice takes a few milliseconds.
//!
//! [`Suffix::observe_response`] copies the response and does one slice of the cache's queued
//! work, so the response enters the trie over this and later calls, like an ended session's.
//!
//! Loading a saved cache costs one pass over the blob (checksum, checks and a copy of the kept
//! tokens) in the first session's constructor; rebuilding the trie then costs `max_depth` steps
//! per token, in the slices above, so a full cache is rebuilt over many calls. A checkpoint
//! encodes the whole blob in one call. The `cache/restore` and `cache/checkpoint` benchmarks
//! (`benches/suffix.rs`) time both for a full cache.
//!
//! # Memory
//!
//! A trie node is 20 bytes, plus about 20 bytes of hash map for the few nodes of depth 1 and 2.
//! Text that never repeats costs up to `max_depth` nodes per token, so both tries are capped:
//!
//! * the cache evicts its oldest responses, running ones too, rather than grow past
//!   `max_nodes`;
//! * a request trie stops growing at `max_request_nodes`: from then on it still counts every
//!   occurrence of the strings it holds, but learns no new ones (and a path cut short there
//!   makes later probabilities err low). Older prompt tokens that are indexed late (see Cost)
//!   may only fill it to 3/4, so the generated text keeps room; the rest of them are then left
//!   out of the counts. At the default depth, text that rarely repeats fills the default cap
//!   after about 64K tokens.
//!
//! With the defaults and both tries full, a native build peaks at about 120 MiB, inside the
//! host's default 256 MiB per plugin. Loading or saving the cache briefly adds the blob itself,
//! at most 8 MiB at the defaults. Responses observed before a session builds the cache take at
//! most 8 MiB (2M tokens) until it does.
//!
//! # Confidence
//!
//! Each proposed token's confidence is its path probability: the fraction of the matched
//! suffix's occurrences that went on exactly as proposed up to that token, as far as the greedy
//! path's counts tell. The occurrence at the context's end counts, so a suffix seen `n` times
//! before, always followed the same way, has `n / (n + 1)`: little evidence is discounted. It
//! never increases along a proposal.

mod blob;
mod cache;
mod speculate;
mod trie;
mod view;

#[cfg(test)]
mod reference;

use std::ops::Range;

use spechost_sdk::config::Config;
use spechost_sdk::{Drafter, Level, ModelFacts, Proposal, Token, export_drafter, log, state, tree};

use crate::blob::Vocabulary;
use crate::cache::{CACHE, CacheSettings, OBSERVED, ResponseCache};
use crate::speculate::Limits;
use crate::trie::{MAX_TRIE_NODES, NO_NODE, NodeId, ROOT, Trie};
use crate::view::CacheView;

/// Default longest string counted, as in the paper's implementation.
const DEFAULT_MAX_DEPTH: usize = 64;
/// Largest accepted `max_depth`: each fed token costs `max_depth` steps per trie.
const MAX_DEPTH_LIMIT: usize = 256;
/// Default responses kept in the cross-request cache.
const DEFAULT_MAX_CACHED_REQUESTS: usize = 256;
/// Default cap on the cache's trie: 2M nodes of 20 bytes, 38 MiB.
const DEFAULT_MAX_NODES: usize = 2_000_000;
/// Default cap on one request's trie: 4M nodes of 20 bytes, 76 MiB; 64K tokens of text that
/// never repeats at the default depth, far more of text that does.
const DEFAULT_MAX_REQUEST_NODES: usize = 4_000_000;
/// Default lowest path probability of a proposed token, as in the paper.
const DEFAULT_MIN_TOKEN_PROB: f64 = 0.1;
/// Default tokens proposed per token of match, as in the paper.
const DEFAULT_ALPHA: f64 = 1.0;
/// Default tokens proposed on top of `alpha * m`.
const DEFAULT_BETA: f64 = 0.0;
/// Trie steps a call spends on bulk work: indexing a long prompt, then its older start
/// positions, and separately the cache's queued work. Each takes a few milliseconds natively
/// (steps of bulk work miss the CPU cache), well inside the host's default 50 ms per call.
const STEPS_PER_CALL: usize = 1 << 16;
/// Share of `max_request_nodes` that late-indexed prompt start positions may fill, in quarters.
const BACKLOG_QUARTERS: usize = 3;

/// Settings parsed from the config string.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Settings {
    max_depth: usize,
    max_cached_requests: usize,
    max_nodes: usize,
    max_request_nodes: usize,
    min_token_prob: f64,
    alpha: f64,
    beta: f64,
    use_global: bool,
}

impl Settings {
    fn parse(config: &str) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let settings = Self {
            max_depth: config.get_usize("max_depth", DEFAULT_MAX_DEPTH)?,
            min_token_prob: get_f64(&config, "min_token_prob", DEFAULT_MIN_TOKEN_PROB)?,
            alpha: get_f64(&config, "alpha", DEFAULT_ALPHA)?,
            beta: get_f64(&config, "beta", DEFAULT_BETA)?,
            use_global: config.get_bool("use_global", true)?,
            max_cached_requests: config
                .get_usize("max_cached_requests", DEFAULT_MAX_CACHED_REQUESTS)?,
            max_nodes: config.get_usize("max_nodes", DEFAULT_MAX_NODES)?,
            max_request_nodes: config.get_usize("max_request_nodes", DEFAULT_MAX_REQUEST_NODES)?,
        };
        config.finish()?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), String> {
        let Self {
            max_depth,
            max_cached_requests,
            max_nodes,
            max_request_nodes,
            min_token_prob,
            alpha,
            ..
        } = *self;
        if !(1..=MAX_DEPTH_LIMIT).contains(&max_depth) {
            return Err(format!(
                "max_depth is {max_depth}; it must be between 1 and {MAX_DEPTH_LIMIT}"
            ));
        }
        if !(0.0..=1.0).contains(&min_token_prob) {
            return Err(format!(
                "min_token_prob is {min_token_prob}; it is a probability, between 0 and 1"
            ));
        }
        if alpha < 0.0 {
            return Err(format!(
                "alpha is {alpha}; it must be at least 0 (tokens proposed per token of match)"
            ));
        }
        if max_cached_requests == 0 {
            return Err(
                "max_cached_requests is 0; it must be at least 1 (to turn the cache off, \
                 set use_global=false)"
                    .to_owned(),
            );
        }
        for (key, value) in [
            ("max_nodes", max_nodes),
            ("max_request_nodes", max_request_nodes),
        ] {
            if !(max_depth + 1..=MAX_TRIE_NODES).contains(&value) {
                return Err(format!(
                    "{key} is {value} and max_depth is {max_depth}; {key} must be between \
                     max_depth + 1 (the root and one path) and {MAX_TRIE_NODES}"
                ));
            }
        }
        Ok(())
    }

    fn cache_settings(&self, facts: &ModelFacts) -> CacheSettings {
        CacheSettings {
            max_depth: self.max_depth,
            max_nodes: self.max_nodes,
            max_cached_requests: self.max_cached_requests,
            vocabulary: Vocabulary::of(facts),
        }
    }

    /// Tokens of one feed indexed at once; older ones wait in the backlog.
    fn feed_window(&self) -> usize {
        (STEPS_PER_CALL / self.max_depth).max(self.max_depth)
    }
}

/// The value of `key` as a finite `f64`, or `default`.
///
/// The SDK parses numbers as `f32`, whose `0.7` is `0.699999988..`; parsing the same text as
/// `f64` keeps `alpha * m + beta` from falling just short of the whole number the user meant.
fn get_f64(config: &Config, key: &str, default: f64) -> Result<f64, String> {
    // Checks syntax and finiteness, with the SDK's messages; `f64` accepts the same syntax.
    config.get_f32(key, default as f32)?;
    Ok(config
        .get(key)
        .and_then(|value| value.parse().ok())
        .unwrap_or(default))
}

/// The suffix-decoding drafter; one per request.
pub struct Suffix {
    settings: Settings,
    facts: ModelFacts,
    /// Everything fed so far: the prompt, then the committed tokens.
    context: Vec<Token>,
    /// Whether the first feed, the prompt, came; what follows it is the response.
    prompt_fed: bool,
    /// The request trie, over `context`.
    trie: Trie,
    /// `live[d]`: the request trie's node for the context's last `d` tokens; `live[0]` is the
    /// root. Always present unless the trie is full.
    live: Vec<NodeId>,
    /// Start positions not indexed yet (the older part of a long feed), indexed from the end of
    /// the last range. Their paths lie wholly inside `context`.
    backlog: Vec<Range<usize>>,
    /// The session's link to the cross-request cache; `None` without `use_global`.
    cache: Option<CacheView>,
}

impl Drafter for Suffix {
    fn new(config: &str, facts: &ModelFacts) -> Result<Self, String> {
        let settings = Settings::parse(config)?;
        let cache_settings = settings.cache_settings(facts);
        if settings.use_global {
            CACHE.with_borrow_mut(|slot| {
                if slot.is_none() {
                    // The first session of this instance that uses the cache: the loaded
                    // responses, then the newer ones observed since the instance started.
                    let mut cache = load_cache(cache_settings);
                    OBSERVED.with_borrow_mut(|observed| observed.drain_into(&mut cache));
                    *slot = Some(cache);
                }
                ResponseCache::configure(slot, cache_settings);
            });
        }
        let mut live = vec![NO_NODE; settings.max_depth + 1];
        live[0] = ROOT;
        Ok(Self {
            settings,
            facts: facts.clone(),
            context: Vec::new(),
            prompt_fed: false,
            trie: Trie::new(settings.max_request_nodes),
            live,
            backlog: Vec::new(),
            cache: settings.use_global.then(|| CacheView::new(cache_settings)),
        })
    }

    /// The first feed is the prompt; every later one is generated tokens, the response.
    fn feed(&mut self, tokens: &[Token]) {
        let generated = std::mem::replace(&mut self.prompt_fed, true);
        let old_len = self.context.len();
        self.context.extend_from_slice(tokens);
        let steps = self.index_fed(old_len);
        self.index_backlog(STEPS_PER_CALL.saturating_sub(steps));
        if let Some(cache) = &mut self.cache {
            cache.feed(&self.context, tokens, generated);
        }
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        if max_draft_len == 0 {
            return Proposal::empty();
        }
        let Settings {
            min_token_prob,
            alpha,
            beta,
            ..
        } = self.settings;
        let limits = Limits {
            max_draft_len,
            min_token_prob,
            alpha,
            beta,
            max_paths: tree::max_paths(),
        };
        let own = speculate::best_path(&self.trie, &self.live, &limits, &self.facts);
        let from_cache = self
            .cache
            .as_mut()
            .and_then(|cache| cache.propose(&self.context, own.as_ref(), &limits, &self.facts));
        let (proposal, parents) = match (from_cache, own) {
            (Some(speculation), _) => speculation,
            (None, Some(choice)) => speculate::proposal(&self.trie, &choice, &limits, &self.facts),
            (None, None) => return Proposal::empty(),
        };
        if !parents.is_empty() {
            tree::shape_proposal(&parents);
        }
        proposal
    }

    /// Saves the cross-request cache's responses through the host's `state`, unless they are
    /// unchanged since the last save or load, or there is no cache (no session of this instance
    /// used one). A refused save is logged; the cache carries on in memory.
    fn checkpoint() {
        // `try_with`: a thread being torn down (only in native tests) has no cache to save.
        let _ = CACHE.try_with(|slot| {
            let mut slot = slot.borrow_mut();
            let Some(cache) = slot.as_mut().filter(|cache| cache.has_unsaved_changes()) else {
                return;
            };
            let bytes = blob::encode(cache.settings().vocabulary, cache.saved_responses());
            match state::save(&bytes) {
                Ok(()) => cache.mark_saved(),
                Err(error) => log(
                    Level::Warn,
                    &format!(
                        "suffix: the response cache was not saved ({error}); lower \
                         max_nodes or max_cached_requests to make it smaller"
                    ),
                ),
            }
        });
    }

    /// Adds `response`, which another instance served, to the cross-request cache as the
    /// closed response of an ended session, and does a slice of the cache's queued work. Before
    /// any session built the cache, keeps it (within bounds) for the cache to come.
    fn observe_response(response: &[Token]) {
        CACHE.with_borrow_mut(|slot| match slot {
            Some(cache) => {
                cache.push(response);
                cache.work(STEPS_PER_CALL);
            }
            None => OBSERVED.with_borrow_mut(|observed| observed.keep(response)),
        });
    }
}

/// The cache the first session of an instance starts with: the one saved in the host's
/// `state` blob if it is valid for this model, else an empty one (with a warning saying why).
///
/// Only checks and copies the blob; its responses are indexed over the following calls.
fn load_cache(settings: CacheSettings) -> ResponseCache {
    let Some(bytes) = state::load() else {
        return ResponseCache::new(settings);
    };
    match blob::decode(&bytes, settings.vocabulary) {
        Ok(saved) => {
            let cache = ResponseCache::from_saved(settings, &saved);
            log(
                Level::Info,
                &format!(
                    "suffix: loaded {} of {} saved responses into the response cache",
                    cache.saved_responses().count(),
                    saved.len()
                ),
            );
            cache
        }
        Err(error) => {
            log(
                Level::Warn,
                &format!(
                    "suffix: ignoring the saved response cache ({} bytes): {error}; starting \
                     with an empty one",
                    bytes.len()
                ),
            );
            ResponseCache::new(settings)
        }
    }
}

/// Closes the session's response in the cross-request cache: the request ended, so the
/// response is complete and becomes one the cache saves.
impl Drop for Suffix {
    fn drop(&mut self) {
        if let Some(cache) = &mut self.cache {
            cache.close();
        }
    }
}

export_drafter!(Suffix);

impl Suffix {
    /// Whether this plugin instance's response cache has nothing left to index or evict: every
    /// response of an ended session, and of a loaded blob, is in its trie. `true` when no
    /// session has used the cache yet.
    ///
    /// The cache works in slices during later calls (see Cost), so after a blob is loaded this
    /// turns `true` only after enough of them; native drivers such as the benchmarks use it to
    /// tell when a loaded cache is rebuilt. The host has no use for it.
    pub fn cache_is_idle() -> bool {
        CACHE.with_borrow(|slot| slot.as_ref().is_none_or(ResponseCache::is_idle))
    }

    /// Indexes the tokens fed since `old_len`; returns the steps taken.
    ///
    /// A feed of up to [`Settings::feed_window`] tokens (plus `max_depth`) is indexed token by
    /// token. Of a longer one, the paths of the old live suffixes are finished, the last
    /// `feed_window` tokens are indexed as the new live end, and the start positions in between
    /// go to the backlog, whole paths that no longer touch the end.
    fn index_fed(&mut self, old_len: usize) -> usize {
        let max_depth = self.settings.max_depth;
        let window = self.settings.feed_window();
        let len = self.context.len();
        let mut steps = 0;
        if len - old_len <= window + max_depth {
            for &token in &self.context[old_len..] {
                steps += self.trie.extend_suffixes(&mut self.live, token, true);
            }
            return steps;
        }
        // Finish the paths that started before this feed, starting no new ones.
        for &token in &self.context[old_len..old_len + max_depth - 1] {
            steps += self.trie.extend_suffixes(&mut self.live, token, false);
        }
        let window_start = len - window;
        self.backlog.push(old_len..window_start);
        self.live.fill(NO_NODE);
        self.live[0] = ROOT;
        for &token in &self.context[window_start..] {
            steps += self.trie.extend_suffixes(&mut self.live, token, true);
        }
        steps
    }

    /// Indexes backlog start positions, newest first, for up to `budget` steps.
    ///
    /// Stops for good once the request trie is 3/4 full, leaving the rest to the live end:
    /// the abandoned start positions are simply not counted, so counts stay exact for the ones
    /// that are.
    fn index_backlog(&mut self, budget: usize) {
        let max_depth = self.settings.max_depth;
        let limit = self.settings.max_request_nodes / 4 * BACKLOG_QUARTERS;
        let mut steps = 0;
        while steps < budget {
            let Some(range) = self.backlog.last_mut() else {
                break;
            };
            let Some(start) = range.clone().next_back() else {
                self.backlog.pop();
                continue;
            };
            let path = &self.context[start..start + max_depth];
            if self.trie.live_nodes() + path.len() > limit {
                self.backlog.clear();
                break;
            }
            steps += self
                .trie
                .insert(path)
                .expect("below the backlog limit, so below max_request_nodes");
            range.end = start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{MAX_OBSERVED_RESPONSES, MAX_OBSERVED_TOKENS, Observed};
    use crate::trie::tests::{Lcg, substring_counts, trie_counts};
    use spechost_sdk::testing::{Harness, clear_state, facts, set_state_limit};

    const VOCAB_SIZE: u32 = 1000;

    /// A session with an empty cache. Tests run on their own threads, so each starts with its
    /// own `CACHE`; resetting makes that explicit.
    fn fresh(config: &str) -> Harness<Suffix> {
        CACHE.with_borrow_mut(|slot| *slot = None);
        session(config)
    }

    /// A session on the cache as previous sessions of this test left it.
    fn session(config: &str) -> Harness<Suffix> {
        Harness::new(config, facts(VOCAB_SIZE)).expect("valid suffix config")
    }

    /// The proposal of a fresh session fed `context`, without the cache.
    fn proposal(config: &str, context: &[Token], max_draft_len: usize) -> Proposal {
        let config = if config.is_empty() {
            "use_global=false".to_owned()
        } else {
            format!("use_global=false,{config}")
        };
        let mut harness = fresh(&config);
        harness.feed(context);
        harness.propose(max_draft_len)
    }

    fn proposed(config: &str, context: &[Token], max_draft_len: usize) -> Vec<Token> {
        proposal(config, context, max_draft_len).tokens
    }

    fn assert_confidence(actual: &[f32], expected: &[f64]) {
        assert_eq!(actual.len(), expected.len(), "confidence {actual:?}");
        for (actual, expected) in actual.iter().zip(expected) {
            assert!(
                (f64::from(*actual) - expected).abs() < 1e-6,
                "confidence {actual:?}, expected {expected:?}"
            );
        }
    }

    #[test]
    fn proposes_what_followed_the_suffix() {
        // At the default alpha=1, a match of m tokens proposes at most m.
        assert_eq!(proposed("", &[1, 2, 3, 4, 1, 2], 3), [3, 4]);
        assert_eq!(proposed("alpha=4", &[1, 2, 3, 4, 1, 2], 3), [3, 4, 1]);
        assert_eq!(
            proposed("beta=10", &[5, 6, 7, 8, 9, 5], 10),
            [6, 7, 8, 9, 5]
        );
    }

    #[test]
    fn proposes_nothing_without_an_earlier_occurrence() {
        assert!(proposed("", &[], 4).is_empty());
        assert!(proposed("", &[1], 4).is_empty());
        assert!(proposed("", &[1, 2, 3], 4).is_empty());
    }

    #[test]
    fn where_the_host_takes_trees_the_likeliest_continuations_are_proposed_together() {
        // After 1: 2 twice, 3 once (and the live end): P = 2/4, 1/4. After [1, 2]: 5 both
        // times; after [1, 3]: 0.
        let context = [1, 2, 5, 1, 2, 5, 1, 3, 0, 1];
        spechost_sdk::testing::set_tree_paths(4);
        let mut harness = fresh("use_global=false,alpha=0,beta=2,min_token_prob=0.2");
        harness.feed(&context);
        let proposal = harness.propose(8);
        // The greedy path 2 5 leads; 3 (1/4) and its 0 (1/4) form the second path.
        assert_eq!(proposal.tokens, [2, 5, 3, 0]);
        assert_eq!(harness.shape(), Some(&[0, 1, 0, 3][..]));
        assert_confidence(&proposal.confidence, &[0.5, 0.5, 0.25, 0.25]);
        // Three tokens: the likeliest three.
        assert_eq!(harness.propose(3).tokens, [2, 5, 3]);
        // One path: the greedy chain, and no shape.
        spechost_sdk::testing::set_tree_paths(1);
        assert_eq!(harness.propose(8).tokens, [2, 5]);
        assert_eq!(harness.shape(), None);
    }

    #[test]
    fn confidence_is_the_path_probability() {
        // 1 occurs four times, the live one at the end included: 2 follows twice, so
        // P(2 | 1) = 2/4. After [1, 2]: 5 both times.
        let proposal = proposal("alpha=0,beta=2", &[1, 2, 5, 1, 2, 5, 1, 3, 0, 1], 2);
        assert_eq!(proposal.tokens, [2, 5]);
        assert_confidence(&proposal.confidence, &[0.5, 0.5]);
    }

    #[test]
    fn the_live_end_counts_as_an_occurrence() {
        // 7 occurs three times; the last, at the end, is not followed by anything yet but
        // counts, as in the reference implementation: P(8 | 7) = 2/3, not 2/2.
        let proposal = proposal("", &[7, 8, 0, 7, 8, 1, 7], 1);
        assert_eq!(proposal.tokens, [8]);
        assert_confidence(&proposal.confidence, &[2.0 / 3.0]);
    }

    #[test]
    fn a_shorter_match_wins_with_a_higher_score() {
        // [1..=6] four times, then [9, 1, 7, 9, 1]. The match [9, 1] occurs twice (once at the
        // live end) and was followed by [7, 9, 1] once: 1/2, then 1/2 for each token after.
        // The match [1] occurs six times and is followed by 2 four times (2/3), then by
        // [3, 4, 5] always.
        let context = [
            1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 9, 1, 7, 9, 1,
        ];
        // alpha=1: [9, 1] may propose 2 tokens (score 1), [1] only 1 (score 2/3).
        assert_eq!(proposed("", &context, 8), [7, 9]);
        // alpha=4: [9, 1] proposes [7, 9, 1] (score 1.5), [1] proposes [2, 3, 4, 5] (8/3).
        let proposal = proposal("alpha=4", &context, 8);
        assert_eq!(proposal.tokens, [2, 3, 4, 5]);
        assert_confidence(&proposal.confidence, &[2.0 / 3.0; 4]);
        // Capped at 1 token, [1] scores 2/3 and [9, 1] 1/2.
        assert_eq!(proposed("alpha=4", &context, 1), [2]);
    }

    #[test]
    fn equal_scores_go_to_the_longer_match() {
        // [1, 2] occurs twice (once at the end), followed by 5: 1/2. [2] occurs four times,
        // followed by 5, 3, 3: 3 with 2/4. Both score 0.5 for one token.
        let context = [1, 2, 5, 0, 2, 3, 0, 2, 3, 1, 2];
        let proposal = proposal("alpha=0,beta=1", &context, 4);
        assert_eq!(proposal.tokens, [5], "the match of 2 wins the tie");
        assert_confidence(&proposal.confidence, &[0.5]);
        // Where [1, 2] occurs only at the end, the match of 1 proposes 3.
        let context = [0, 2, 5, 0, 2, 3, 0, 2, 3, 1, 2];
        assert_eq!(proposed("alpha=0,beta=1", &context, 4), [3]);
    }

    #[test]
    fn equal_scores_between_the_tries_go_to_the_request() {
        let config = "alpha=0,beta=1";
        let mut earlier = fresh(config);
        earlier.feed(&[0]);
        earlier.feed(&[1, 2, 3, 4, 1, 2, 5]);
        drop(earlier);
        let mut current = session(config);
        current.feed(&[1, 2, 8, 9, 1, 2]);
        // Both tries match [1, 2] twice and continue it once with the token they propose:
        // 1/2 each, and the request trie wins.
        assert_eq!(current.propose(2).tokens, [8]);
        // The cache's longer match [1, 2, 3] wins outright.
        current.feed(&[3]);
        assert_eq!(current.propose(2).tokens, [4]);
    }

    #[test]
    fn children_tied_on_count_resolve_to_the_latest() {
        // After 1: 2 once, then 3 once (of three occurrences, the live end's included). The
        // most recent continuation wins the tie.
        let proposal = proposal("", &[1, 2, 5, 1, 3, 6, 1], 1);
        assert_eq!(proposal.tokens, [3]);
        assert_confidence(&proposal.confidence, &[1.0 / 3.0]);
    }

    #[test]
    fn alpha_and_beta_cap_the_proposal_by_match_length() {
        let context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2];
        assert_eq!(
            proposed("", &context, 10),
            [3, 4],
            "alpha=1: 2 tokens for m=2"
        );
        assert_eq!(proposed("alpha=2", &context, 10), [3, 4, 5, 6]);
        assert_eq!(proposed("alpha=0.5", &context, 10), [3]);
        assert_eq!(proposed("alpha=0.5,beta=2", &context, 10), [3, 4, 5]);
        assert_eq!(proposed("alpha=0,beta=1", &context, 10), [3]);
        assert!(proposed("alpha=1,beta=-2", &context, 10).is_empty());
        // A match of 10 at alpha=0.7 proposes 7 tokens, though 0.7 as f32 is 0.6999999.
        let twice: Vec<Token> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 9].repeat(2);
        assert_eq!(proposed("alpha=0.7", &twice, 20), [1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn stops_below_min_token_prob() {
        // [1, 2] occurs five times (once at the end), followed by 3 four times: 0.8. After
        // [1, 2, 3]: 4 twice, 5 once, 6 once: 1/2, so 0.4 from there on.
        let context = [
            1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 0, 1, 2, 3, 6, 0, 1, 2,
        ];
        let config = "alpha=0,beta=4";
        assert_eq!(
            proposed(&format!("{config},min_token_prob=0.5"), &context, 4),
            [3]
        );
        let proposal = proposal(&format!("{config},min_token_prob=0.4"), &context, 4);
        assert_eq!(proposal.tokens, [3, 4, 0, 1]);
        assert_confidence(&proposal.confidence, &[0.8, 0.4, 0.4, 0.4]);
        assert!(proposed(&format!("{config},min_token_prob=1"), &[1, 2, 1, 3, 1], 4).is_empty());
    }

    #[test]
    fn respects_max_draft_len() {
        let context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4];
        for max_draft_len in 0..6 {
            assert_eq!(
                proposed("alpha=2", &context, max_draft_len),
                context[4..4 + max_draft_len]
            );
        }
    }

    #[test]
    fn stops_after_an_end_of_generation_token() {
        CACHE.with_borrow_mut(|slot| *slot = None);
        let facts = ModelFacts {
            eog: vec![0],
            ..facts(VOCAB_SIZE)
        };
        let mut harness = Harness::<Suffix>::new("use_global=false", facts).expect("valid");
        harness.feed(&[1, 2, 3, 0, 5, 1, 2, 3]);
        assert_eq!(harness.propose(4).tokens, [0]);
    }

    #[test]
    fn feeding_in_pieces_equals_feeding_at_once() {
        let mut random = Lcg(21);
        let context = random.text(300, 5);
        let mut at_once = fresh("use_global=false,max_depth=8");
        at_once.feed(&context);
        let mut pieces = fresh("use_global=false,max_depth=8");
        let mut fed = 0;
        while fed < context.len() {
            let piece = (1 + random.below(7) as usize).min(context.len() - fed);
            pieces.feed(&context[fed..fed + piece]);
            pieces.feed(&[]);
            fed += piece;
        }
        assert_eq!(
            trie_counts(&pieces.drafter().trie),
            trie_counts(&at_once.drafter().trie)
        );
        for max_draft_len in [1, 4, 8] {
            assert_eq!(
                pieces.propose(max_draft_len),
                at_once.propose(max_draft_len)
            );
        }
    }

    #[test]
    fn request_trie_counts_every_substring_of_the_context() {
        let mut random = Lcg(4);
        for (max_depth, alphabet) in [(1, 3), (3, 2), (4, 5), (7, 3)] {
            let mut harness = fresh(&format!("use_global=false,max_depth={max_depth}"));
            let mut context = Vec::new();
            for _ in 0..40 {
                let len = 1 + random.below(5) as usize;
                let chunk = random.text(len, alphabet);
                harness.feed(&chunk);
                context.extend_from_slice(&chunk);
                assert_eq!(
                    trie_counts(&harness.drafter().trie),
                    substring_counts([&context[..]], max_depth),
                    "max_depth {max_depth}, context {context:?}"
                );
            }
        }
    }

    #[test]
    fn a_long_feed_is_indexed_over_later_calls_to_the_same_counts() {
        let mut random = Lcg(13);
        let max_depth = 64;
        let config = format!("use_global=false,max_depth={max_depth}");
        let window = STEPS_PER_CALL / max_depth;
        // Some text before, so that live paths cross into the long feed.
        let head = random.text(100, 50);
        let prompt = random.text(3 * window, 50);
        let mut harness = fresh(&config);
        harness.feed(&head);
        harness.feed(&prompt);
        assert!(!harness.drafter().backlog.is_empty(), "a backlog is left");
        let mut context = [head, prompt].concat();
        while !harness.drafter().backlog.is_empty() {
            let token = random.below(50);
            harness.feed(&[token]);
            context.push(token);
        }
        assert_eq!(
            trie_counts(&harness.drafter().trie),
            substring_counts([&context[..]], max_depth)
        );
    }

    #[test]
    fn request_trie_stops_growing_at_max_request_nodes_and_keeps_counting() {
        let mut random = Lcg(6);
        let config = "use_global=false,max_depth=6,max_request_nodes=100";
        let mut harness = fresh(config);
        let context = random.text(300, 4);
        harness.feed(&context);
        let trie = &harness.drafter().trie;
        assert_eq!(trie.live_nodes(), 100);
        let expected = substring_counts([&context[..]], 6);
        for (path, count) in trie_counts(trie) {
            assert_eq!(expected[&path], count, "count of {path:?}");
        }
        // Repeating a known piece still proposes its continuation.
        let mut harness = fresh(config);
        harness.feed(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        harness.feed(&random.text(200, 50));
        harness.feed(&[1, 2]);
        assert_eq!(harness.propose(2).tokens, [3, 4]);
    }

    #[test]
    fn cache_helps_a_request_that_repeats_an_earlier_response() {
        let mut random = Lcg(17);
        let prompt = random.text(20, VOCAB_SIZE);
        let response = random.text(300, VOCAB_SIZE);
        let first = fresh("").replay(&prompt, &response, 8);
        let second = session("").replay(&prompt, &response, 8);
        assert!(
            second.mean_accepted_per_round() > first.mean_accepted_per_round() + 3.0,
            "first {first:?}, second {second:?}"
        );
        assert!(
            second.acceptance() > 0.9,
            "second acceptance {:.3} in {second:?}",
            second.acceptance()
        );
        // Without the cache the second request is no better than the first.
        let again = fresh("use_global=false").replay(&prompt, &response, 8);
        let without = session("use_global=false").replay(&prompt, &response, 8);
        assert_eq!(again, without);
    }

    #[test]
    fn cache_counts_the_end_of_a_response_as_an_outcome() {
        CACHE.with_borrow_mut(|slot| *slot = None);
        for response in [&[1, 2, 3][..], &[1, 2, 3], &[1, 2]] {
            let mut earlier = session("");
            earlier.feed(&[9, 9]);
            earlier.feed(response);
        }
        let mut current = session("");
        current.feed(&[5, 1, 2]);
        // After [1, 2]: 3 twice, the end of a response once. The path stops where the
        // responses ended.
        let proposal = current.propose(4);
        assert_eq!(proposal.tokens, [3]);
        assert_confidence(&proposal.confidence, &[2.0 / 3.0]);
    }

    #[test]
    fn cache_forgets_the_oldest_beyond_max_cached_requests() {
        let config = "max_cached_requests=2";
        let responses = [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]];
        CACHE.with_borrow_mut(|slot| *slot = None);
        for response in responses {
            let mut harness = session(config);
            harness.feed(&[1]);
            harness.feed(&response);
        }
        for (response, remembered) in responses.iter().zip([false, true, true]) {
            let mut harness = session(config);
            harness.feed(&response[..2]);
            let proposal = harness.propose(2);
            assert_eq!(
                !proposal.is_empty(),
                remembered,
                "response {response:?}: {proposal:?}"
            );
            // Dropping an empty response adds nothing.
            harness.feed(&[]);
        }
        CACHE.with_borrow(|slot| {
            let cache = slot.as_ref().expect("cache built");
            assert_eq!(cache.len(), 2);
            assert_eq!(
                trie_counts(cache.trie()),
                crate::cache::tests::expected_counts(cache)
            );
        });
    }

    #[test]
    fn cache_stays_within_max_nodes() {
        let mut random = Lcg(23);
        let config = "max_depth=8,max_nodes=500";
        CACHE.with_borrow_mut(|slot| *slot = None);
        for _ in 0..30 {
            let mut harness = session(config);
            harness.feed(&random.text(5, 20));
            for _ in 0..10 {
                let len = 1 + random.below(4) as usize;
                harness.feed(&random.text(len, 20));
                harness.propose(4);
                CACHE.with_borrow(|slot| {
                    let cache = slot.as_ref().expect("cache built");
                    assert!(cache.trie().live_nodes() <= 500);
                });
            }
        }
        CACHE.with_borrow_mut(|slot| {
            let cache = slot.as_mut().expect("cache built");
            cache.work(usize::MAX);
            assert_eq!(
                trie_counts(cache.trie()),
                crate::cache::tests::expected_counts(cache)
            );
            cache.evict_all();
            assert_eq!(cache.trie().live_nodes(), 1, "empty after evicting all");
        });
    }

    #[test]
    fn session_sees_the_responses_of_running_sessions_as_they_grow() {
        let mut earlier = fresh("");
        earlier.feed(&[0]);
        earlier.feed(&[1, 2, 3]);
        let mut current = session("");
        current.feed(&[7, 1, 2]);
        // The earlier response ends at 3 for now: nothing follows it yet.
        assert_eq!(current.propose(2).tokens, [3]);
        earlier.feed(&[4, 5]);
        assert_eq!(current.propose(2).tokens, [3, 4]);
        current.feed(&[3]);
        assert_eq!(current.propose(2).tokens, [4, 5]);
        drop(earlier);
        assert_eq!(current.propose(2).tokens, [4, 5]);
    }

    #[test]
    fn an_answers_first_token_reaches_the_cache() {
        // As the host feeds a request: the prompt alone, then the token decoded with it, then
        // the rest of the answer.
        let mut earlier = fresh("");
        earlier.feed(&[50, 51]);
        earlier.feed(&[60]);
        earlier.feed(&[61, 62, 63]);
        drop(earlier);
        // Only the answer's first token, 60, can match the end of this prompt.
        let mut current = session("alpha=3");
        current.feed(&[9, 60]);
        assert_eq!(current.propose(8).tokens, [61, 62, 63]);
        assert_eq!(saved_responses(), [[60, 61, 62, 63]]);
    }

    #[test]
    fn a_session_with_other_settings_starts_a_new_cache() {
        let mut first = fresh("");
        first.feed(&[0]);
        first.feed(&[1, 2, 3, 4]);
        drop(first);
        let mut other = session("max_depth=32");
        other.feed(&[1, 2]);
        assert!(other.propose(2).is_empty(), "the cache was replaced");
    }

    /// Drops the instance's cache and the responses it observed, as a host restart (or a new
    /// instance) does; the host's state blob stays.
    fn restart() {
        CACHE.with_borrow_mut(|slot| *slot = None);
        OBSERVED.with_borrow_mut(|observed| *observed = Observed::new());
    }

    /// Runs sessions whose responses are `responses`, each after a short prompt.
    fn respond(config: &str, responses: &[Vec<Token>]) {
        for response in responses {
            let mut harness = session(config);
            harness.feed(&[0]);
            harness.feed(response);
        }
    }

    /// What a fresh session (no response of its own) proposes after each of `contexts`, once
    /// the cache is fully indexed.
    fn proposals_after(config: &str, contexts: &[Vec<Token>]) -> Vec<Proposal> {
        contexts
            .iter()
            .map(|context| {
                let mut harness = session(config);
                // The context is the prompt; empty feeds add no response, only indexing work.
                harness.feed(context);
                while !Suffix::cache_is_idle() {
                    harness.feed(&[]);
                }
                harness.propose(8)
            })
            .collect()
    }

    fn saved_responses() -> Vec<Vec<Token>> {
        CACHE.with_borrow(|slot| {
            let cache = slot.as_ref().expect("a session used the cache");
            cache.saved_responses().map(<[Token]>::to_vec).collect()
        })
    }

    /// Random responses over a small alphabet, and contexts that end in pieces of them.
    fn responses_and_contexts(seed: u64) -> (Vec<Vec<Token>>, Vec<Vec<Token>>) {
        let mut random = Lcg(seed);
        let responses: Vec<Vec<Token>> = (0..12)
            .map(|_| {
                let len = 20 + random.below(60) as usize;
                random.text(len, 6)
            })
            .collect();
        let contexts = (0..40)
            .map(|_| {
                let len = 1 + random.below(6) as usize;
                random.text(len, 6)
            })
            .collect();
        (responses, contexts)
    }

    #[test]
    fn a_saved_cache_proposes_the_same_after_a_restart() {
        clear_state();
        restart();
        let (responses, contexts) = responses_and_contexts(41);
        respond("", &responses);
        let before = proposals_after("", &contexts);
        assert!(
            before
                .iter()
                .filter(|proposal| !proposal.is_empty())
                .count()
                > 20,
            "the cache proposes after most contexts: {before:?}"
        );
        Suffix::checkpoint();
        restart();
        assert_eq!(proposals_after("", &contexts), before);
        assert_eq!(saved_responses(), responses);
        // A blob loaded under another depth is rebuilt under that depth.
        restart();
        drop(session("max_depth=3"));
        CACHE.with_borrow_mut(|slot| {
            let cache = slot.as_mut().expect("built by the session");
            cache.work(usize::MAX);
            assert_eq!(cache.settings().max_depth, 3);
            assert_eq!(
                trie_counts(cache.trie()),
                crate::cache::tests::expected_counts(cache)
            );
        });
    }

    #[test]
    fn the_cache_is_loaded_by_the_first_session_that_uses_it() {
        clear_state();
        restart();
        respond("", &[vec![1, 2, 3, 4]]);
        Suffix::checkpoint();
        restart();
        // A session without the cache loads nothing.
        drop(session("use_global=false"));
        assert!(CACHE.with_borrow(Option::is_none));
        let mut harness = session("");
        harness.feed(&[1, 2]);
        assert_eq!(harness.propose(2).tokens, [3, 4]);
    }

    #[test]
    fn unreadable_blobs_are_ignored_and_the_plugin_starts_empty() {
        clear_state();
        restart();
        respond("", &[vec![1, 2, 3, 4]]);
        Suffix::checkpoint();
        let good = state::load().expect("saved");
        let mut truncated = good.clone();
        truncated.truncate(good.len() - 3);
        let mut corrupt = good.clone();
        corrupt[30] ^= 0x10;
        let mut newer = good.clone();
        newer[8..12].copy_from_slice(&(blob::FORMAT_VERSION + 1).to_le_bytes());
        for (what, bytes, vocab_size) in [
            ("truncated", truncated, VOCAB_SIZE),
            ("corrupt", corrupt, VOCAB_SIZE),
            ("newer", newer, VOCAB_SIZE),
            ("foreign", b"not a suffix cache at all".to_vec(), VOCAB_SIZE),
            ("saved for another model", good, VOCAB_SIZE + 1),
        ] {
            state::save(&bytes).expect("no limit");
            restart();
            let mut harness =
                Harness::<Suffix>::new("", facts(vocab_size)).expect("a bad blob is no error");
            harness.feed(&[1, 2]);
            assert!(harness.propose(2).is_empty(), "{what}: nothing loaded");
            drop(harness);
            // The plugin still works, and its next checkpoint replaces the bad blob.
            respond_with(vocab_size, &[5, 6, 7, 8]);
            let mut harness = Harness::<Suffix>::new("", facts(vocab_size)).expect("valid");
            harness.feed(&[5, 6]);
            assert_eq!(harness.propose(2).tokens, [7, 8], "{what}: the cache works");
            drop(harness);
            Suffix::checkpoint();
            assert_ne!(
                state::load(),
                Some(bytes),
                "{what}: the bad blob was replaced"
            );
        }
    }

    fn respond_with(vocab_size: u32, response: &[Token]) {
        let mut harness = Harness::<Suffix>::new("", facts(vocab_size)).expect("valid");
        harness.feed(&[0]);
        harness.feed(response);
    }

    #[test]
    fn caps_hold_when_a_larger_cache_is_loaded() {
        clear_state();
        restart();
        let (responses, _) = responses_and_contexts(43);
        respond("", &responses);
        Suffix::checkpoint();
        restart();
        drop(session("max_cached_requests=3"));
        assert_eq!(saved_responses(), responses[responses.len() - 3..]);
        restart();
        let config = "max_depth=8,max_nodes=300";
        let mut harness = session(config);
        harness.feed(&[1]);
        while !Suffix::cache_is_idle() {
            harness.feed(&[]);
        }
        CACHE.with_borrow(|slot| {
            let cache = slot.as_ref().expect("built by the session");
            let tokens: usize = cache
                .saved_responses()
                .map(|response| response.len() + 1)
                .sum();
            assert!(tokens <= 300, "{tokens} tokens kept");
            assert!(cache.trie().live_nodes() <= 300);
            assert_eq!(
                trie_counts(cache.trie()),
                crate::cache::tests::expected_counts(cache)
            );
        });
        let kept = saved_responses();
        assert!(!kept.is_empty(), "the newest response fits");
        assert_eq!(
            kept,
            responses[responses.len() - kept.len()..],
            "the newest are kept"
        );
    }

    #[test]
    fn checkpoint_saves_only_changes() {
        clear_state();
        restart();
        Suffix::checkpoint();
        assert_eq!(state::load(), None, "no cache, nothing saved");
        respond("", &[vec![1, 2, 3]]);
        Suffix::checkpoint();
        assert!(state::load().is_some());
        clear_state();
        Suffix::checkpoint();
        assert_eq!(state::load(), None, "unchanged since the last save");
        respond("", &[vec![4, 5, 6]]);
        Suffix::checkpoint();
        let saved = state::load().expect("a new response");
        restart();
        drop(session(""));
        clear_state();
        Suffix::checkpoint();
        assert_eq!(state::load(), None, "unchanged since it was loaded");
        // A refused save leaves the change pending for the next checkpoint.
        state::save(&saved).expect("no limit");
        respond("", &[vec![7, 8, 9]]);
        set_state_limit(Some(16));
        Suffix::checkpoint();
        assert_eq!(
            state::load(),
            Some(saved),
            "the host refused the larger blob"
        );
        set_state_limit(None);
        Suffix::checkpoint();
        restart();
        drop(session(""));
        assert_eq!(saved_responses(), [[1, 2, 3], [4, 5, 6], [7, 8, 9]]);
    }

    #[test]
    fn tokens_fed_after_an_empty_or_one_token_prompt_become_a_response() {
        // How `spechost suffix warm` fills a cache from a corpus.
        clear_state();
        restart();
        let texts: [Vec<Token>; 2] = [(10..80).collect(), (200..300).collect()];
        for (prompt, text) in [(&[][..], &texts[0]), (&[1][..], &texts[1])] {
            let mut harness = session("");
            harness.feed(prompt);
            for piece in text.chunks(7) {
                harness.feed(piece);
            }
        }
        assert_eq!(saved_responses(), texts);
        Suffix::checkpoint();
        restart();
        let mut harness = session("");
        harness.feed(&[7, 250, 251]);
        assert_eq!(harness.propose(2).tokens, [252, 253]);
        drop(harness);
        // Without the empty prompt's feed, the text's first feed is taken for the prompt.
        restart();
        clear_state();
        let mut harness = session("");
        harness.feed(&texts[0][..7]);
        harness.feed(&texts[0][7..]);
        drop(harness);
        assert_eq!(saved_responses(), [&texts[0][7..]]);
    }

    /// The trie counts of the cache once its queued work is done.
    fn indexed_counts() -> std::collections::BTreeMap<Vec<Token>, u32> {
        CACHE.with_borrow_mut(|slot| {
            let cache = slot.as_mut().expect("a session used the cache");
            cache.work(usize::MAX);
            trie_counts(cache.trie())
        })
    }

    #[test]
    fn an_observed_response_helps_a_request_that_repeats_it() {
        let mut random = Lcg(31);
        let prompt = random.text(20, VOCAB_SIZE);
        let response = random.text(300, VOCAB_SIZE);
        restart();
        let cold = session("").replay(&prompt, &response, 8);
        // Observed by a fresh instance, before any session built the cache.
        restart();
        Suffix::observe_response(&response);
        let observed_first = session("").replay(&prompt, &response, 8);
        // Observed once a session built the cache, while it is open.
        restart();
        let open = session("");
        open.observe_response(&response);
        drop(open);
        let observed_later = session("").replay(&prompt, &response, 8);
        for warm in [observed_first, observed_later] {
            assert!(
                warm.mean_accepted_per_round() > cold.mean_accepted_per_round() + 3.0,
                "cold {cold:?}, warm {warm:?}"
            );
            assert!(warm.acceptance() > 0.9, "warm {warm:?}");
        }
    }

    #[test]
    fn an_observed_response_enters_the_cache_as_an_ended_sessions_would() {
        let (responses, contexts) = responses_and_contexts(47);
        restart();
        respond("", &responses);
        let served = proposals_after("", &contexts);
        let served_counts = indexed_counts();
        // The first half before any session built the cache, the rest after.
        restart();
        let (first, rest) = responses.split_at(responses.len() / 2);
        for response in first {
            Suffix::observe_response(response);
        }
        drop(session(""));
        for response in rest {
            Suffix::observe_response(response);
        }
        assert_eq!(saved_responses(), responses);
        assert_eq!(proposals_after("", &contexts), served);
        assert_eq!(indexed_counts(), served_counts);
    }

    #[test]
    fn observed_responses_are_evicted_oldest_first() {
        let config = "max_cached_requests=2";
        let responses = [vec![11, 12, 13], vec![21, 22, 23], vec![31, 32, 33]];
        restart();
        for response in &responses {
            Suffix::observe_response(response);
        }
        let mut harness = session(config);
        harness.feed(&[1]);
        assert_eq!(
            saved_responses(),
            responses[1..],
            "evicted when the cache is built"
        );
        // One of its own sessions' responses, then one more observed.
        harness.feed(&[41, 42, 43]);
        drop(harness);
        Suffix::observe_response(&[51, 52, 53]);
        assert_eq!(saved_responses(), [[41, 42, 43], [51, 52, 53]]);
    }

    #[test]
    fn observed_responses_are_saved_by_checkpoint_and_restored() {
        clear_state();
        restart();
        Suffix::observe_response(&[1, 2, 3, 4]);
        Suffix::checkpoint();
        assert_eq!(state::load(), None, "no session built the cache yet");
        respond("", &[vec![5, 6, 7, 8]]);
        Suffix::observe_response(&[9, 10, 11, 12]);
        Suffix::checkpoint();
        restart();
        let mut harness = session("");
        assert_eq!(
            saved_responses(),
            [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
        );
        harness.feed(&[9, 10]);
        assert_eq!(harness.propose(2).tokens, [11, 12]);
        // Observed after a restart, before the first session: queued after the loaded ones.
        drop(harness);
        restart();
        Suffix::observe_response(&[13, 14, 15]);
        drop(session(""));
        assert_eq!(
            saved_responses(),
            [
                vec![1, 2, 3, 4],
                vec![5, 6, 7, 8],
                vec![9, 10, 11, 12],
                vec![13, 14, 15]
            ]
        );
    }

    #[test]
    fn responses_observed_before_the_cache_is_built_are_bounded() {
        restart();
        let responses: Vec<Vec<Token>> = (0..MAX_OBSERVED_RESPONSES as Token + 10)
            .map(|i| vec![i % VOCAB_SIZE, 1, 2])
            .collect();
        for response in &responses {
            Suffix::observe_response(response);
        }
        drop(session("max_cached_requests=1000"));
        assert_eq!(
            saved_responses(),
            responses[responses.len() - MAX_OBSERVED_RESPONSES..],
            "the newest are kept"
        );
        // By tokens: two responses of just over half the bound do not fit together.
        restart();
        let long = MAX_OBSERVED_TOKENS / 2 + 1;
        for token in [1, 2, 3] {
            Suffix::observe_response(&vec![token; long]);
        }
        OBSERVED.with_borrow(|observed| {
            let kept: Vec<&[Token]> = observed.responses().collect();
            assert_eq!(kept, [&vec![3; long][..]]);
        });
        // A response longer than the bound is cut to it.
        Suffix::observe_response(&vec![4; MAX_OBSERVED_TOKENS + 5]);
        OBSERVED.with_borrow(|observed| {
            let lens: Vec<usize> = observed.responses().map(<[Token]>::len).collect();
            assert_eq!(lens, [MAX_OBSERVED_TOKENS]);
        });
    }

    #[test]
    fn a_long_observed_response_is_indexed_over_later_calls() {
        let mut random = Lcg(33);
        let response = random.text(4 * STEPS_PER_CALL / DEFAULT_MAX_DEPTH, VOCAB_SIZE);
        restart();
        let mut harness = session("");
        harness.observe_response(&response);
        assert!(!Suffix::cache_is_idle(), "more than one call's work");
        while !Suffix::cache_is_idle() {
            harness.feed(&[]);
        }
        harness.feed(&response[..20]);
        assert_eq!(harness.propose(8).tokens, response[20..28]);
    }

    #[test]
    fn rejects_bad_settings() {
        let error = |config| Harness::<Suffix>::new(config, facts(VOCAB_SIZE)).unwrap_err();
        assert_eq!(
            error("max_depth=0"),
            "max_depth is 0; it must be between 1 and 256"
        );
        assert_eq!(
            error("max_depth=257"),
            "max_depth is 257; it must be between 1 and 256"
        );
        assert_eq!(
            error("min_token_prob=1.5"),
            "min_token_prob is 1.5; it is a probability, between 0 and 1"
        );
        assert_eq!(
            error("alpha=-1"),
            "alpha is -1; it must be at least 0 (tokens proposed per token of match)"
        );
        assert!(error("max_cached_requests=0").contains("use_global=false"));
        assert_eq!(
            error("max_depth=8,max_nodes=8"),
            "max_nodes is 8 and max_depth is 8; max_nodes must be between max_depth + 1 \
             (the root and one path) and 1073741824"
        );
        assert!(error("max_request_nodes=2000000000").contains("max_request_nodes is"));
        assert!(error("beta=inf").contains("finite"));
        assert!(error("use_global=maybe").contains("`use_global` has value `maybe`"));
    }

    #[test]
    fn rejects_unknown_keys() {
        let error = Harness::<Suffix>::new("max_dpeth=3", facts(VOCAB_SIZE)).unwrap_err();
        assert_eq!(
            error,
            "unknown setting `max_dpeth` (value `3`); known settings are `max_depth`, \
             `min_token_prob`, `alpha`, `beta`, `use_global`, `max_cached_requests`, \
             `max_nodes`, `max_request_nodes`"
        );
    }

    #[test]
    fn defaults_are_documented_values() {
        let settings = Settings::parse("").expect("empty config");
        assert_eq!(
            settings,
            Settings {
                max_depth: 64,
                max_cached_requests: 256,
                max_nodes: 2_000_000,
                max_request_nodes: 4_000_000,
                min_token_prob: 0.1,
                alpha: 1.0,
                beta: 0.0,
                use_global: true,
            }
        );
        let precise = Settings::parse("alpha=0.7").expect("valid");
        assert_eq!(precise.alpha, 0.7, "parsed as f64, not widened from f32");
    }
}
