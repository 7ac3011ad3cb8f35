//! `lookup`: prompt-lookup drafting. Proposes what followed the most recent earlier occurrence of
//! the context's last `n` tokens, trying the longest `n` first.
//!
//! It shines when the output repeats its input: code edits, summaries quoting the source,
//! retrieval answers, and the output's own repetitions. It needs no model and learns nothing
//! across requests.
//!
//! # Config
//!
//! | key         | default | meaning                                             |
//! |-------------|---------|-----------------------------------------------------|
//! | `min_ngram` | 2       | shortest suffix to look up; shorter matches are noise |
//! | `max_ngram` | 4       | longest suffix to look up, tried first               |
//!
//! with `1 <= min_ngram <= max_ngram <= 16`.
//!
//! # Cost
//!
//! [`Lookup::feed`] indexes each new token once: for every `n` in `min_ngram..=max_ngram` it
//! records, in one hash map per `n`, that the `n`-gram ending just before the token was last seen
//! followed by it, and where it was seen before that. [`Lookup::propose`] then does at most
//! `max_ngram - min_ngram + 1` lookups and copies at most `max_draft_len` tokens (a tree: at
//! most that many per occurrence). Neither depends on the context length.
//!
//! # Trees
//!
//! Where the host verifies trees (`--cascade-mode tree`: `tree::max_paths() > 1`), the proposal
//! is instead the distinct continuations of up to 8 earlier occurrences of the longest suffix
//! that matches, merged where they agree: each token weighted by the share of occurrences
//! whose continuation passes through it (each occurrence counting [`TREE_RECENCY`] times the
//! next more recent one), times [`TREE_DEPTH_DECAY`] per token of depth (the farther from the
//! match, the less a continuation holds), the likeliest within `max_draft_len` tokens and the
//! host's paths (`spechost_sdk::tree::likeliest`). Where they all agree the proposal is the
//! chain a suffix seen once proposes, as without trees.
//!
//! # Confidence
//!
//! Chains carry no confidence: how often a repeated n-gram continues the same way depends on
//! the text, and an uncalibrated number would mislead a cascade that compares sources by it
//! (the host learns their acceptance by position instead). A tree's tokens carry their
//! weights, which the host calibrates against what it accepts.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use spechost_sdk::config::Config;
use spechost_sdk::tree::{self, Branch};
use spechost_sdk::{Drafter, ModelFacts, Proposal, Token, export_drafter};

/// Default shortest n-gram looked up.
const DEFAULT_MIN_NGRAM: usize = 2;
/// Default longest n-gram looked up.
const DEFAULT_MAX_NGRAM: usize = 4;
/// Largest accepted `max_ngram`: longer suffixes almost never match where shorter ones did not,
/// and each extra length costs one map per session.
const NGRAM_LIMIT: usize = 16;
/// Most earlier occurrences of a suffix whose continuations a tree proposal merges.
const TREE_OCCURRENCES: usize = 8;
/// Most entries of an n-gram's occurrence list a tree proposal visits, hash collisions
/// included, so that a proposal's cost stays bounded.
const TREE_VISITS: usize = 32;
/// Weight of a tree token per token of depth, on top of its share of the occurrences.
pub const TREE_DEPTH_DECAY: f64 = 0.9;
/// Weight of an occurrence against the next more recent one: text goes on as it did lately.
pub const TREE_RECENCY: f64 = 0.7;
/// No earlier occurrence.
const NONE: usize = usize::MAX;

/// The prompt-lookup drafter; one per request.
pub struct Lookup {
    /// Everything fed so far: the prompt, then the committed tokens.
    context: Vec<Token>,
    min_ngram: usize,
    max_ngram: usize,
    /// `latest[n - min_ngram]` maps the hash of an `n`-gram to the index right after its most
    /// recent occurrence that is followed by at least one token: where its continuation starts.
    latest: Vec<NgramIndex>,
    /// `earlier[n - min_ngram][start]`: for the `n`-gram whose continuation starts at `start`,
    /// where the continuation of its previous occurrence starts ([`NONE`]: none, or the `n`-gram
    /// does not fit before `start`), so that the occurrences of an `n`-gram form a list.
    earlier: Vec<Vec<usize>>,
    facts: ModelFacts,
}

/// N-gram hash -> start of the continuation of its latest occurrence.
type NgramIndex = HashMap<u64, usize, BuildHasherDefault<PreHashed>>;

impl Drafter for Lookup {
    fn new(config: &str, facts: &ModelFacts) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let min_ngram = config.get_usize("min_ngram", DEFAULT_MIN_NGRAM)?;
        let max_ngram = config.get_usize("max_ngram", DEFAULT_MAX_NGRAM)?;
        config.finish()?;
        if !(1..=NGRAM_LIMIT).contains(&max_ngram) {
            return Err(format!(
                "max_ngram is {max_ngram}; it must be between 1 and {NGRAM_LIMIT}"
            ));
        }
        if !(1..=max_ngram).contains(&min_ngram) {
            return Err(format!(
                "min_ngram is {min_ngram} and max_ngram is {max_ngram}; \
                 min_ngram must be between 1 and max_ngram"
            ));
        }
        Ok(Self {
            context: Vec::new(),
            min_ngram,
            max_ngram,
            latest: vec![NgramIndex::default(); max_ngram - min_ngram + 1],
            earlier: vec![Vec::new(); max_ngram - min_ngram + 1],
            facts: facts.clone(),
        })
    }

    fn feed(&mut self, tokens: &[Token]) {
        self.context.reserve(tokens.len());
        for &token in tokens {
            // The n-grams ending just before `token` are now followed by a token, so they can be
            // looked up. The current suffix is never indexed before its continuation arrives,
            // which keeps `propose` from matching the suffix with itself.
            let position = self.context.len();
            for list in &mut self.earlier {
                list.push(NONE);
            }
            let (min_ngram, latest, earlier) =
                (self.min_ngram, &mut self.latest, &mut self.earlier);
            for_each_suffix_hash(&self.context, self.max_ngram, |n, hash| {
                if n >= min_ngram {
                    let previous = latest[n - min_ngram].insert(hash, position);
                    earlier[n - min_ngram][position] = previous.unwrap_or(NONE);
                }
            });
            self.context.push(token);
        }
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        if max_draft_len == 0 {
            return Proposal::empty();
        }
        let mut suffix_hashes = [0; NGRAM_LIMIT];
        for_each_suffix_hash(&self.context, self.max_ngram, |n, hash| {
            suffix_hashes[n - 1] = hash;
        });
        let max_paths = tree::max_paths();
        let len = self.context.len();
        for n in (self.min_ngram..=self.max_ngram.min(len)).rev() {
            let Some(&start) = self.latest[n - self.min_ngram].get(&suffix_hashes[n - 1]) else {
                continue;
            };
            if max_paths > 1 {
                let starts = self.occurrences(n, start);
                if starts.is_empty() {
                    continue;
                }
                let (proposal, parents) = tree::likeliest(
                    &self.continuations(&starts, max_draft_len),
                    max_draft_len,
                    max_paths,
                );
                if parents.is_empty() {
                    // A chain, as without trees: no confidence (see the module docs).
                    return Proposal::tokens(proposal.tokens);
                }
                tree::shape_proposal(&parents);
                return proposal;
            }
            // Equal hashes of different n-grams are possible, if unlikely: check the tokens.
            if !self.matches_suffix(n, start) {
                continue;
            }
            return Proposal::tokens(self.continuation(start, max_draft_len));
        }
        Proposal::empty()
    }
}

impl Lookup {
    /// Whether the `n` tokens before `start` are the context's last `n`.
    fn matches_suffix(&self, n: usize, start: usize) -> bool {
        self.context[start - n..start] == self.context[self.context.len() - n..]
    }

    /// What follows `start`: at most `max_len` tokens, up to the end of the context or an
    /// end-of-generation token (included: generation stops there, drafting past it is wasted).
    fn continuation(&self, start: usize, max_len: usize) -> &[Token] {
        let continuation = &self.context[start..(start + max_len).min(self.context.len())];
        let end = continuation
            .iter()
            .position(|&token| self.facts.is_eog(token))
            .map_or(continuation.len(), |eog| eog + 1);
        &continuation[..end]
    }

    /// Continuation starts of the context's last `n` tokens, most recent first, from `start`
    /// along the `n`-gram's occurrence list: at most [`TREE_OCCURRENCES`] of them, checked
    /// token by token, within [`TREE_VISITS`] entries.
    fn occurrences(&self, n: usize, mut start: usize) -> Vec<usize> {
        let earlier = &self.earlier[n - self.min_ngram];
        let mut starts = Vec::new();
        for _ in 0..TREE_VISITS {
            if start == NONE || starts.len() == TREE_OCCURRENCES {
                break;
            }
            if self.matches_suffix(n, start) {
                starts.push(start);
            }
            start = earlier[start];
        }
        starts
    }

    /// The continuations after `starts` (most recent first), at most `max_len` tokens each,
    /// merged where they agree, as weighted tree candidates (see the module docs).
    fn continuations(&self, starts: &[usize], max_len: usize) -> Vec<Branch> {
        let mut branches: Vec<Branch> = Vec::new();
        // Per branch: the weight of the occurrences through it, and its children.
        let mut votes: Vec<f64> = Vec::new();
        let mut children: Vec<Vec<usize>> = Vec::new();
        let mut roots: Vec<usize> = Vec::new();
        let mut total = 0.0;
        for (recency, &start) in starts.iter().enumerate() {
            let weight = TREE_RECENCY.powi(recency as i32);
            total += weight;
            let mut parent: Option<usize> = None;
            for &token in self.continuation(start, max_len) {
                let siblings = parent.map_or(&roots, |parent| &children[parent]);
                let existing = siblings
                    .iter()
                    .copied()
                    .find(|&index| branches[index].token == token);
                let index = existing.unwrap_or_else(|| {
                    branches.push(Branch {
                        parent,
                        token,
                        probability: 0.0,
                    });
                    votes.push(0.0);
                    children.push(Vec::new());
                    let index = branches.len() - 1;
                    match parent {
                        Some(parent) => children[parent].push(index),
                        None => roots.push(index),
                    }
                    index
                });
                votes[index] += weight;
                parent = Some(index);
            }
        }
        let mut depths = vec![0_usize; branches.len()];
        for index in 0..branches.len() {
            let depth = branches[index]
                .parent
                .map_or(1, |parent| depths[parent] + 1);
            depths[index] = depth;
            let share = votes[index] / total;
            branches[index].probability = share * TREE_DEPTH_DECAY.powi(depth as i32);
        }
        branches
    }
}

export_drafter!(Lookup);

/// Calls `visit(n, hash)` with the hash of the last `n` tokens of `tokens`, for `n` from 1 to
/// `max_ngram` (or the length of `tokens`, if shorter).
///
/// The hash folds tokens from the last one backwards, so a single pass yields every length.
fn for_each_suffix_hash(tokens: &[Token], max_ngram: usize, mut visit: impl FnMut(usize, u64)) {
    // FxHash's multiplier: an odd constant with well-spread bits.
    const MULTIPLIER: u64 = 0x517c_c1b7_2722_0a95;
    let mut state: u64 = 0;
    for (index, &token) in tokens.iter().rev().take(max_ngram).enumerate() {
        state = (state.rotate_left(5) ^ u64::from(token)).wrapping_mul(MULTIPLIER);
        visit(index + 1, finalize(state));
    }
}

/// Spreads every input bit over the whole hash (MurmurHash3's `fmix64`), since the maps use it
/// as is: hashbrown picks buckets from the low bits and tags from the high ones.
fn finalize(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// A `Hasher` for keys that already are well-mixed hashes: passes them through.
///
/// Also keeps `std`'s randomly seeded default hasher out of the plugin, which would need the
/// host's random source at every session start.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used for `u64` keys; fold anything else in all the same.
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spechost_sdk::testing::{Harness, facts};

    const VOCAB_SIZE: u32 = 1000;

    fn lookup(config: &str, context: &[Token]) -> Harness<Lookup> {
        let mut harness = Harness::new(config, facts(VOCAB_SIZE)).expect("valid lookup config");
        harness.feed(context);
        harness
    }

    fn proposed(config: &str, context: &[Token], max_draft_len: usize) -> Vec<Token> {
        lookup(config, context).propose(max_draft_len).tokens
    }

    #[test]
    fn proposes_what_followed_the_suffix() {
        assert_eq!(proposed("", &[1, 2, 3, 4, 1, 2], 3), [3, 4, 1]);
    }

    #[test]
    fn most_recent_occurrence_wins() {
        assert_eq!(proposed("", &[1, 2, 3, 1, 2, 4, 1, 2], 3), [4, 1, 2]);
    }

    #[test]
    fn longest_ngram_is_tried_first() {
        // [1, 2, 3] occurred at the start, followed by 4; the more recent [2, 3] by 7.
        let context = [1, 2, 3, 4, 8, 2, 3, 7, 1, 2, 3];
        assert_eq!(proposed("max_ngram=3", &context, 2), [4, 8]);
        assert_eq!(proposed("max_ngram=2", &context, 2), [7, 1]);
    }

    #[test]
    fn falls_back_to_shorter_ngrams_down_to_min_ngram() {
        let context = [7, 3, 9, 3];
        assert_eq!(proposed("min_ngram=1", &context, 4), [9, 3]);
        assert_eq!(proposed("min_ngram=2", &context, 4), [] as [Token; 0]);
    }

    #[test]
    fn proposal_stops_at_max_draft_len_and_at_the_end_of_the_context() {
        assert_eq!(proposed("", &[5, 6, 7, 8, 9, 5, 6], 2), [7, 8]);
        assert_eq!(proposed("", &[1, 2, 1, 2], 10), [1, 2]);
    }

    #[test]
    fn never_matches_the_suffix_with_itself() {
        assert!(proposed("", &[1, 2], 4).is_empty());
        assert!(proposed("min_ngram=1", &[1], 4).is_empty());
        assert!(proposed("", &[], 4).is_empty());
    }

    #[test]
    fn overlapping_occurrences_count_as_most_recent() {
        // In a run, the latest earlier occurrence of the suffix is one token back, so only one
        // token follows it; in a period-3 cycle, three do.
        assert_eq!(proposed("", &[4, 4, 4, 4, 4], 5), [4]);
        assert_eq!(proposed("", &[1, 2, 3, 1, 2, 3, 1, 2], 5), [3, 1, 2]);
    }

    #[test]
    fn zero_max_draft_len_proposes_nothing() {
        assert!(proposed("", &[1, 2, 3, 1, 2], 0).is_empty());
    }

    #[test]
    fn proposal_ends_after_an_end_of_generation_token() {
        let facts = ModelFacts {
            eog: vec![0],
            ..facts(VOCAB_SIZE)
        };
        let mut harness = Harness::<Lookup>::new("", facts).expect("default config");
        harness.feed(&[1, 2, 0, 5, 1, 2]);
        assert_eq!(harness.propose(4).tokens, [0]);
    }

    #[test]
    fn feeding_in_pieces_equals_feeding_at_once() {
        let context = [1, 2, 3, 1, 2, 3, 4, 1, 2];
        let mut pieces = lookup("", &context[..4]);
        pieces.feed(&context[4..5]);
        pieces.feed(&context[5..]);
        assert_eq!(pieces.propose(3), lookup("", &context).propose(3));
    }

    #[test]
    fn matches_a_brute_force_search_on_random_contexts() {
        let mut random = Lcg(7);
        for config in ["", "min_ngram=1,max_ngram=1", "min_ngram=1,max_ngram=5"] {
            let mut harness = lookup(config, &[]);
            let (min_ngram, max_ngram) = (harness.drafter().min_ngram, harness.drafter().max_ngram);
            let mut context = Vec::new();
            for _ in 0..300 {
                // A 4-token alphabet makes matches of every length common.
                let chunk: Vec<Token> = (0..random.below(3) + 1).map(|_| random.below(4)).collect();
                harness.feed(&chunk);
                context.extend_from_slice(&chunk);
                let max_draft_len = random.below(6) as usize;
                let expected = brute_force(&context, min_ngram, max_ngram, max_draft_len);
                let actual = harness.propose(max_draft_len).tokens;
                assert_eq!(
                    actual, expected,
                    "config {config:?}, max_draft_len {max_draft_len}, context {context:?}"
                );
            }
        }
    }

    #[test]
    fn accepts_most_of_a_lightly_edited_copy() {
        // An "edit" request: the output repeats the prompt with a few tokens changed.
        let mut random = Lcg(42);
        let prompt: Vec<Token> = (0..400).map(|_| random.below(VOCAB_SIZE)).collect();
        let mut output = prompt.clone();
        for position in [50, 120, 121, 260, 333] {
            output[position] = (output[position] + 1) % VOCAB_SIZE;
        }
        let stats = lookup("", &[]).replay(&prompt, &output, 8);
        assert!(
            stats.acceptance() > 0.9,
            "acceptance {:.3} in {stats:?}",
            stats.acceptance()
        );
        assert!(
            stats.mean_accepted_per_round() > 6.0,
            "{:.2} accepted per round in {stats:?}",
            stats.mean_accepted_per_round()
        );
    }

    /// The proposal and shape (row each token continues; a chain: `0, 1, 2, ...`) where the host
    /// takes `max_paths` paths.
    fn proposed_tree(
        config: &str,
        context: &[Token],
        max_draft_len: usize,
        max_paths: usize,
    ) -> (Proposal, Vec<u32>) {
        spechost_sdk::testing::set_tree_paths(max_paths);
        let mut harness = lookup(config, context);
        let proposal = harness.propose(max_draft_len);
        let chain = (0..proposal.tokens.len() as u32).collect();
        let shape = harness.shape().map_or(chain, <[u32]>::to_vec);
        spechost_sdk::testing::set_tree_paths(1);
        (proposal, shape)
    }

    #[test]
    fn where_the_host_takes_trees_distinct_continuations_branch() {
        // [1, 2] was followed by 4 9 most recently and by 3 9 before.
        let context = [1, 2, 3, 9, 1, 2, 4, 9, 1, 2];
        let (proposal, shape) = proposed_tree("max_ngram=2", &context, 5, 4);
        assert_eq!(proposal.tokens, [4, 9, 1, 2, 3]);
        assert_eq!(shape, [0, 1, 2, 3, 0]);
        // Each occurrence's share, the older one counting less, times the decay by depth.
        let recent = 1.0 / (1.0 + TREE_RECENCY);
        let older = TREE_RECENCY / (1.0 + TREE_RECENCY);
        let decay = |share: f64, depth: i32| (share * TREE_DEPTH_DECAY.powi(depth)) as f32;
        assert_eq!(
            proposal.confidence,
            [
                decay(recent, 1),
                decay(recent, 2),
                decay(recent, 3),
                decay(recent, 4),
                decay(older, 1)
            ]
        );
        // One path: the most recent continuation, as without trees.
        let (chain, _) = proposed_tree("max_ngram=2", &context, 5, 1);
        assert_eq!(chain.tokens, proposed("max_ngram=2", &context, 5));
    }

    #[test]
    fn continuations_that_agree_outweigh_a_more_recent_one() {
        // After [1, 2]: 5 7 most recently, 5 6 1 twice before. 1.19 of 2.19 shares times
        // 0.9^3 for 1 beat 1 share times 0.9^2 for 7: the agreed continuation takes a budget
        // of 3.
        let context = [1, 2, 5, 6, 1, 2, 5, 6, 1, 2, 5, 7, 1, 2];
        let (proposal, shape) = proposed_tree("max_ngram=2", &context, 3, 2);
        assert_eq!(proposal.tokens, [5, 6, 1]);
        assert_eq!(shape, [0, 1, 2]);
    }

    #[test]
    fn a_suffix_seen_once_proposes_its_continuation_as_a_chain() {
        let context = [1, 2, 3, 4, 1, 2];
        let (proposal, shape) = proposed_tree("", &context, 3, 4);
        assert_eq!(proposal.tokens, [3, 4, 1]);
        assert_eq!(shape, [0, 1, 2]);
        assert!(proposal.confidence.is_empty(), "a chain, as without trees");
    }

    #[test]
    fn every_path_of_a_tree_continues_an_occurrence_of_the_longest_matching_suffix() {
        let mut random = Lcg(11);
        spechost_sdk::testing::set_tree_paths(3);
        let mut harness = lookup("min_ngram=1,max_ngram=3", &[]);
        let mut context: Vec<Token> = Vec::new();
        for _ in 0..300 {
            let chunk: Vec<Token> = (0..random.below(3) + 1).map(|_| random.below(4)).collect();
            harness.feed(&chunk);
            context.extend_from_slice(&chunk);
            let max_draft_len = random.below(7) as usize;
            let proposal = harness.propose(max_draft_len);
            let chain: Vec<u32> = (0..proposal.tokens.len() as u32).collect();
            let shape = harness.shape().map_or(chain, <[u32]>::to_vec);
            let continuations = occurrence_continuations(&context, 1, 3, max_draft_len);
            if max_draft_len > 0 {
                assert_eq!(proposal.tokens.is_empty(), continuations.is_empty());
            }
            for row in 1..=proposal.tokens.len() {
                // The path from row 0 to `row`.
                let mut path = Vec::new();
                let mut at = row;
                while at > 0 {
                    path.push(proposal.tokens[at - 1]);
                    at = shape[at - 1] as usize;
                }
                path.reverse();
                assert!(
                    continuations.iter().any(|c| c.starts_with(&path)),
                    "path {path:?} continues no occurrence in {context:?}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_ngram_bounds() {
        let error = |config| Harness::<Lookup>::new(config, facts(VOCAB_SIZE)).unwrap_err();
        assert_eq!(
            error("min_ngram=0"),
            "min_ngram is 0 and max_ngram is 4; min_ngram must be between 1 and max_ngram"
        );
        assert_eq!(
            error("min_ngram=5"),
            "min_ngram is 5 and max_ngram is 4; min_ngram must be between 1 and max_ngram"
        );
        assert_eq!(
            error("max_ngram=17"),
            "max_ngram is 17; it must be between 1 and 16"
        );
        assert_eq!(
            error("max_ngram=0"),
            "max_ngram is 0; it must be between 1 and 16"
        );
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        let error = |config| Harness::<Lookup>::new(config, facts(VOCAB_SIZE)).unwrap_err();
        assert_eq!(
            error("max_ngrams=3"),
            "unknown setting `max_ngrams` (value `3`); known settings are `min_ngram`, `max_ngram`"
        );
        let message = error("min_ngram=two");
        assert!(message.contains("`min_ngram` has value `two`"), "{message}");
    }

    /// The reference semantics, by exhaustive search.
    fn brute_force(
        context: &[Token],
        min_ngram: usize,
        max_ngram: usize,
        max_draft_len: usize,
    ) -> Vec<Token> {
        let len = context.len();
        for n in (min_ngram..=max_ngram.min(len)).rev() {
            let suffix = &context[len - n..];
            // Occurrences starting at `i` that are followed by at least one token.
            if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
                let start = i + n;
                return context[start..(start + max_draft_len).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    /// What followed each earlier occurrence of the longest suffix of `context` (from
    /// `max_ngram` down to `min_ngram` tokens) that occurred before, at most `max_len` tokens
    /// each, by exhaustive search.
    fn occurrence_continuations(
        context: &[Token],
        min_ngram: usize,
        max_ngram: usize,
        max_len: usize,
    ) -> Vec<Vec<Token>> {
        let len = context.len();
        for n in (min_ngram..=max_ngram.min(len)).rev() {
            let suffix = &context[len - n..];
            let found: Vec<Vec<Token>> = (0..len - n)
                .filter(|&i| &context[i..i + n] == suffix)
                .map(|i| context[i + n..(i + n + max_len).min(len)].to_vec())
                .collect();
            if !found.is_empty() {
                return found;
            }
        }
        Vec::new()
    }

    /// A tiny deterministic generator, so tests need no `rand`.
    struct Lcg(u64);

    impl Lcg {
        fn below(&mut self, bound: u32) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) % u64::from(bound)) as u32
        }
    }
}
