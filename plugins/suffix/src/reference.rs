//! A brute-force reference for the drafter, for tests: the counts and the paper's proposal rule
//! computed straight from the texts, with no trie, no live suffix nodes and no early exits, and
//! randomized comparisons of the plugin against it.
//!
//! The rule, as the crate docs state it: for each suffix of the context of length `m` that a
//! trie holds, follow the most frequent continuation, each token's path probability being the
//! product of `count(child) / count(node)` along the way; stop below `min_token_prob`, after
//! `min(max_draft_len, floor(alpha * m + beta))` tokens, after an end-of-generation token, or at
//! the end of a text. The path with the highest sum of path probabilities wins, on a tie the longer
//! match; the cache's best path replaces the request's only if it wins that comparison.

use std::collections::BTreeMap;

use spechost_sdk::{ModelFacts, Proposal, Token};

use crate::trie::{END_OF_TEXT, Trie};

/// How often one string occurs in a set of texts, and where last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Occurrences {
    count: u32,
    /// (text, start) of the latest occurrence, in indexing order.
    latest: (usize, usize),
}

/// A node as [`Reference::check_trie`] compares it: its count, and its best child's token and
/// count.
type NodeSummary = (u32, Option<(Token, u32)>);

/// Every string of up to `max_depth` tokens of some texts, counted by brute force: what one of
/// the plugin's tries must hold.
pub(crate) struct Reference {
    max_depth: usize,
    strings: BTreeMap<Vec<Token>, Occurrences>,
}

/// A path the rule chose in one [`Reference`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Walk {
    /// Length of the matched suffix, `m`.
    pub(crate) match_len: usize,
    /// Sum of the path probabilities.
    pub(crate) score: f64,
    /// The proposed tokens and their path probabilities.
    pub(crate) tokens: Vec<(Token, f64)>,
}

/// The proposal settings the rule needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rule {
    pub(crate) max_draft_len: usize,
    pub(crate) min_token_prob: f64,
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
}

impl Rule {
    /// `min(max_draft_len, floor(alpha * m + beta))`, at least 0.
    fn cap(&self, match_len: usize) -> usize {
        let cap = (self.alpha * match_len as f64 + self.beta).floor();
        if cap <= 0.0 {
            0
        } else {
            (cap as usize).min(self.max_draft_len)
        }
    }
}

impl Reference {
    /// The request trie's strings: every substring of `context`.
    pub(crate) fn request(context: &[Token], max_depth: usize) -> Self {
        Self::new([context.to_vec()], max_depth)
    }

    /// The cache trie's strings: every substring of each finished response followed by
    /// [`END_OF_TEXT`], except the end marker on its own (no path starts there), then of the
    /// response still being generated, `running`, as it is so far.
    pub(crate) fn cache(responses: &[Vec<Token>], running: &[Token], max_depth: usize) -> Self {
        let finished = responses.iter().map(|response| {
            let mut text = response.clone();
            text.push(END_OF_TEXT);
            text
        });
        Self::new(finished.chain([running.to_vec()]), max_depth)
    }

    fn new(texts: impl IntoIterator<Item = Vec<Token>>, max_depth: usize) -> Self {
        let mut strings = BTreeMap::new();
        for (index, text) in texts.into_iter().enumerate() {
            for start in 0..text.len() {
                if text[start] == END_OF_TEXT {
                    continue;
                }
                for end in start + 1..=(start + max_depth).min(text.len()) {
                    let entry = strings
                        .entry(text[start..end].to_vec())
                        .or_insert(Occurrences {
                            count: 0,
                            latest: (index, start),
                        });
                    entry.count += 1;
                    entry.latest = entry.latest.max((index, start));
                }
            }
        }
        Self { max_depth, strings }
    }

    /// Occurrences of `string`.
    pub(crate) fn count(&self, string: &[Token]) -> u32 {
        self.strings.get(string).map_or(0, |entry| entry.count)
    }

    /// The one-token continuations of `string` that occur, with their occurrences.
    fn children<'a>(
        &'a self,
        string: &'a [Token],
    ) -> impl Iterator<Item = (Token, Occurrences)> + 'a {
        self.strings
            .range(string.to_vec()..)
            .take_while(move |(key, _)| key.starts_with(string))
            .filter(move |(key, _)| key.len() == string.len() + 1)
            .map(|(key, entry)| (key[string.len()], *entry))
    }

    /// The most frequent continuation of `string` and its count; among equal counts, the one
    /// that occurred last.
    pub(crate) fn best_child(&self, string: &[Token]) -> Option<(Token, u32)> {
        self.children(string)
            .max_by_key(|&(_, entry)| (entry.count, entry.latest))
            .map(|(token, entry)| (token, entry.count))
    }

    /// The path the rule chooses after `context`, if any proposes a token.
    pub(crate) fn best_walk(
        &self,
        context: &[Token],
        rule: &Rule,
        facts: &ModelFacts,
    ) -> Option<Walk> {
        let mut best: Option<Walk> = None;
        for match_len in 1..=context.len().min(self.max_depth) {
            let suffix = &context[context.len() - match_len..];
            if self.count(suffix) == 0 {
                continue;
            }
            let walk = self.walk(suffix, rule.cap(match_len), rule, facts);
            if !walk.tokens.is_empty()
                && best
                    .as_ref()
                    .is_none_or(|best| (walk.score, match_len) > (best.score, best.match_len))
            {
                best = Some(walk);
            }
        }
        best
    }

    fn walk(&self, suffix: &[Token], cap: usize, rule: &Rule, facts: &ModelFacts) -> Walk {
        let mut path = suffix.to_vec();
        let mut walk = Walk {
            match_len: suffix.len(),
            score: 0.0,
            tokens: Vec::new(),
        };
        let mut probability = 1.0;
        while walk.tokens.len() < cap {
            let Some((token, count)) = self.best_child(&path) else {
                break;
            };
            if token == END_OF_TEXT {
                break;
            }
            probability *= (f64::from(count) / f64::from(self.count(&path))).min(1.0);
            if probability < rule.min_token_prob {
                break;
            }
            walk.tokens.push((token, probability));
            walk.score += probability;
            if facts.is_eog(token) {
                break;
            }
            path.push(token);
        }
        walk
    }

    /// Asserts that `trie` holds exactly these strings, with these counts and best children.
    pub(crate) fn check_trie(&self, trie: &Trie, what: &str) {
        let mut seen: BTreeMap<Vec<Token>, NodeSummary> = BTreeMap::new();
        trie.for_each_node(|path, count, best_child| {
            seen.insert(path.to_vec(), (count, best_child));
        });
        let expected: BTreeMap<Vec<Token>, NodeSummary> = self
            .strings
            .iter()
            .map(|(string, entry)| (string.clone(), (entry.count, self.best_child(string))))
            .collect();
        assert_eq!(seen, expected, "{what}: (count, best child) by path");
    }
}

/// Whether the cache's best path replaces the request's: a higher score, or an equal score
/// from a longer match.
pub(crate) fn cache_wins(own: Option<&Walk>, cached: Option<&Walk>) -> bool {
    cached.is_some_and(|cached| {
        own.is_none_or(|own| (cached.score, cached.match_len) > (own.score, own.match_len))
    })
}

/// The proposal of `walk`: its tokens, with their path probabilities as confidence.
pub(crate) fn proposal(walk: Option<Walk>) -> Proposal {
    let tokens = walk.map_or_else(Vec::new, |walk| walk.tokens);
    Proposal::with_confidence(
        tokens.iter().map(|&(token, _)| token).collect::<Vec<_>>(),
        tokens
            .iter()
            .map(|&(_, probability)| probability as f32)
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use spechost_sdk::testing::{Harness, facts};

    use super::*;
    use crate::Suffix;
    use crate::cache::CACHE;
    use crate::speculate::{self, Limits};
    use crate::trie::tests::Lcg;

    const VOCAB_SIZE: u32 = 16;

    /// One random setting: small depths and alphabets, so that matches and ties are frequent.
    struct Case {
        config: String,
        facts: ModelFacts,
        max_depth: usize,
        /// The rule's settings; `max_draft_len` is drawn for each proposal.
        rule: Rule,
        use_global: bool,
        alphabet: u32,
    }

    impl Case {
        fn draw(random: &mut Lcg) -> Self {
            let pick = |random: &mut Lcg, values: &[f64]| {
                values[random.below(values.len() as u32) as usize]
            };
            let max_depth = 1 + random.below(8) as usize;
            let alpha = pick(random, &[0.0, 0.5, 1.0, 2.0, 4.0]);
            let beta = pick(random, &[-1.0, 0.0, 1.0, 2.5]);
            let min_token_prob = pick(random, &[0.0, 0.1, 0.25, 0.5, 0.75, 1.0]);
            let use_global = random.below(4) != 0;
            let mut facts = facts(VOCAB_SIZE);
            if random.below(3) == 0 {
                facts.eog = vec![0];
            }
            Self {
                config: format!(
                    "max_depth={max_depth},alpha={alpha},beta={beta},\
                     min_token_prob={min_token_prob},use_global={use_global}"
                ),
                facts,
                max_depth,
                rule: Rule {
                    max_draft_len: 0,
                    min_token_prob,
                    alpha,
                    beta,
                },
                use_global,
                alphabet: 2 + random.below(3),
            }
        }

        fn session(&self) -> Harness<Suffix> {
            Harness::new(&self.config, self.facts.clone()).expect("valid config")
        }

        /// Feeds `text` to `harness` in random pieces, calling `after` after each.
        fn feed_in_pieces(
            random: &mut Lcg,
            harness: &mut Harness<Suffix>,
            text: &[Token],
            mut after: impl FnMut(&mut Harness<Suffix>, &[Token], &mut Lcg),
        ) {
            let mut fed = 0;
            while fed < text.len() {
                let piece = (1 + random.below(6) as usize).min(text.len() - fed);
                harness.feed(&text[fed..fed + piece]);
                fed += piece;
                after(harness, &text[..fed], random);
            }
        }
    }

    /// Runs `cases` random cases: earlier responses into the cache, then a request fed in
    /// pieces, comparing each proposal, match length, score and every count with the reference.
    fn compare_with_reference(seed: u64, cases: usize) {
        let mut random = Lcg(seed);
        let mut proposals = 0;
        let mut from_cache = 0;
        for case_index in 0..cases {
            let case = Case::draw(&mut random);
            CACHE.with_borrow_mut(|slot| *slot = None);
            let mut responses = Vec::new();
            if case.use_global {
                for _ in 0..random.below(5) {
                    let prompt_len = random.below(4) as usize;
                    let prompt = random.text(prompt_len, case.alphabet);
                    let response_len = random.below(30) as usize;
                    let response = random.text(response_len, case.alphabet);
                    let mut earlier = case.session();
                    earlier.feed(&prompt);
                    Case::feed_in_pieces(&mut random, &mut earlier, &response, |_, _, _| {});
                    if !response.is_empty() {
                        responses.push(response);
                    }
                }
            }
            let context_len = 1 + random.below(50) as usize;
            let context = random.text(context_len, case.alphabet);
            let mut current = case.session();
            if case.use_global {
                check_cache(
                    &Reference::cache(&responses, &[], case.max_depth),
                    case_index,
                );
            }
            // The first piece is the prompt; the rest is the response, which the cache counts
            // as it goes.
            let mut prompt_len = None;
            Case::feed_in_pieces(
                &mut random,
                &mut current,
                &context,
                |harness, fed, random| {
                    let prompt_len = *prompt_len.get_or_insert(fed.len());
                    let cache = Reference::cache(&responses, &fed[prompt_len..], case.max_depth);
                    if case.use_global {
                        check_cache(&cache, case_index);
                    }
                    let rule = Rule {
                        max_draft_len: random.below(10) as usize,
                        ..case.rule
                    };
                    let request = Reference::request(fed, case.max_depth);
                    let own = request.best_walk(fed, &rule, &case.facts);
                    let cached = case
                        .use_global
                        .then(|| cache.best_walk(fed, &rule, &case.facts))
                        .flatten();
                    let what = format!(
                        "case {case_index} ({}), context {fed:?}, max_draft_len {}, \
                         responses {responses:?}",
                        case.config, rule.max_draft_len
                    );
                    let proposal = harness.propose(rule.max_draft_len);
                    check_best_paths(harness, &rule, own.as_ref(), cached.as_ref(), &what);
                    let wins = cache_wins(own.as_ref(), cached.as_ref());
                    let expected = super::proposal(if wins { cached } else { own });
                    from_cache += usize::from(wins);
                    proposals += usize::from(!proposal.is_empty());
                    assert_eq!(proposal, expected, "{what}");
                },
            );
            Reference::request(&context, case.max_depth).check_trie(
                &current.drafter().trie,
                &format!("case {case_index}: request trie"),
            );
        }
        // The cases must exercise both tries, or the comparison proves little.
        assert!(
            proposals > cases,
            "{proposals} non-empty proposals in {cases} cases"
        );
        assert!(
            from_cache > cases / 10,
            "{from_cache} proposals from the cache in {cases} cases"
        );
    }

    /// Checks the cache's trie against `cache`, once every response entered it.
    fn check_cache(cache: &Reference, case_index: usize) {
        CACHE.with_borrow(|slot| {
            let indexed = slot.as_ref().expect("built by the first session");
            assert!(indexed.is_idle(), "small responses are indexed at once");
            cache.check_trie(indexed.trie(), &format!("case {case_index}: cache"));
        });
    }

    /// Compares the plugin's best path in each trie (match length and score) with the
    /// reference's, after a `propose` with `rule.max_draft_len`.
    fn check_best_paths(
        harness: &Harness<Suffix>,
        rule: &Rule,
        own: Option<&Walk>,
        cached: Option<&Walk>,
        what: &str,
    ) {
        if rule.max_draft_len == 0 {
            // `propose` returned at once, without looking up its suffixes in the cache.
            return;
        }
        let drafter = harness.drafter();
        let limits = Limits {
            max_draft_len: rule.max_draft_len,
            min_token_prob: rule.min_token_prob,
            alpha: rule.alpha,
            beta: rule.beta,
            max_paths: 1,
        };
        let summary = |walk: Option<&Walk>| walk.map(|walk| (walk.match_len, walk.score));
        let plugin_own =
            speculate::best_path(&drafter.trie, &drafter.live, &limits, &drafter.facts);
        assert_eq!(
            plugin_own.map(|choice| (choice.match_len, choice.score)),
            summary(own),
            "{what}: request trie's best path"
        );
        if let Some(view) = &drafter.cache {
            CACHE.with_borrow(|slot| {
                let cache = slot.as_ref().expect("built by the first session");
                let choice =
                    speculate::best_path(cache.trie(), &view.matches, &limits, &drafter.facts);
                assert_eq!(
                    choice.map(|choice| (choice.match_len, choice.score)),
                    summary(cached),
                    "{what}: cache's best path"
                );
            });
        }
    }

    #[test]
    fn proposals_match_the_reference_on_random_texts() {
        compare_with_reference(31, 400);
    }

    #[test]
    fn reference_follows_the_documented_rule_on_a_known_text() {
        // The worked example of `a_shorter_match_wins_with_a_higher_score`, by the reference.
        let context = [
            1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 9, 1, 7, 9, 1,
        ];
        let reference = Reference::request(&context, 64);
        let rule = Rule {
            max_draft_len: 8,
            min_token_prob: 0.1,
            alpha: 4.0,
            beta: 0.0,
        };
        let walk = reference
            .best_walk(&context, &rule, &facts(VOCAB_SIZE))
            .expect("a match");
        assert_eq!(walk.match_len, 1);
        assert_eq!(
            walk.tokens
                .iter()
                .map(|&(token, _)| token)
                .collect::<Vec<_>>(),
            [2, 3, 4, 5]
        );
        assert!(
            (walk.score - 8.0 / 3.0).abs() < 1e-12,
            "score {}",
            walk.score
        );
        assert_eq!(reference.count(&[1]), 6, "the 1 at the end counts too");
        assert_eq!(reference.best_child(&[1]), Some((2, 4)));
    }
}
