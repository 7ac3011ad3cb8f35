//! `markov_drafter`: an example spechost drafter that learns across requests.
//!
//! It counts, for every pair of consecutive tokens (a *bigram*), which token came next, over
//! everything it is fed: prompts and generated text of every request since the plugin was
//! loaded. To propose, it follows the most frequent next token from the context's last two
//! tokens, again and again, while each step's frequency ratio (`count of that next token /
//! count of the bigram`) stays at or above `min_prob`. The confidence of each proposed token is
//! the product of the ratios up to it.
//!
//! # Where state lives
//!
//! The host opens one session per request, and the SDK makes one [`MarkovDrafter`] value per
//! session, dropped when the request ends. Anything that must outlive a request, here the
//! bigram counts, lives at plugin level instead: in the `thread_local!` [`MODEL`]. A plugin
//! instance is single-threaded, so that is a plain global; it lives as long as the host keeps
//! the plugin loaded, and starts empty again if the plugin traps and is re-created.
//!
//! In a server, the model also learns from the responses of requests that other instances
//! served (other slots, other replicas), which the host hands to the type between requests
//! ([`MarkovDrafter::observe_response`]). That costs one count per token of the response, as
//! feeding it would.
//!
//! # Config
//!
//! | key        | default | meaning                                                     |
//! |------------|---------|-------------------------------------------------------------|
//! | `min_prob` | 0.5     | stop the chain at a step whose ratio is below this, in [0, 1] |

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

use spechost_sdk::config::Config;
use spechost_sdk::{Drafter, Feedback, Level, ModelFacts, Proposal, Token, export_drafter, log};

/// Default `min_prob`: propose a token only if it followed the bigram at least half the time.
const DEFAULT_MIN_PROB: f32 = 0.5;
/// A session logs a summary of its acceptance once per this many rounds.
const SUMMARY_EVERY_ROUNDS: u64 = 100;
/// Most bigrams the model keeps. Counts persist across requests, so without a bound they would
/// grow until the host's memory cap killed the plugin; past it, new bigrams are ignored.
const MAX_BIGRAMS: usize = 1 << 16;
/// Most distinct next tokens counted per bigram; rarer ones still count toward the total.
const MAX_FOLLOWERS: usize = 16;

thread_local! {
    /// Bigram counts learned from every request since the plugin was loaded.
    static MODEL: RefCell<BigramModel> = RefCell::new(BigramModel::default());
}

/// Counts of next tokens, per bigram.
#[derive(Default)]
struct BigramModel {
    // A fixed-key hasher: deterministic, and needs no random seed from the host.
    followers: HashMap<(Token, Token), Followers, BuildHasherDefault<DefaultHasher>>,
}

/// What followed one bigram.
#[derive(Default)]
struct Followers {
    /// Times the bigram was followed by any token.
    total: u32,
    /// The most frequent next token so far and its count.
    best: (Token, u32),
    /// Count per next token, for up to [`MAX_FOLLOWERS`] distinct tokens.
    counts: Vec<(Token, u32)>,
}

impl BigramModel {
    /// Records that `bigram` was followed by `next`.
    fn learn(&mut self, bigram: (Token, Token), next: Token) {
        let full = self.followers.len() >= MAX_BIGRAMS;
        let followers = match self.followers.get_mut(&bigram) {
            Some(followers) => followers,
            None if full => return,
            None => self.followers.entry(bigram).or_default(),
        };
        followers.total = followers.total.saturating_add(1);
        let counts = &mut followers.counts;
        let count = match counts.iter().position(|&(token, _)| token == next) {
            Some(index) => {
                let count = &mut counts[index].1;
                *count = count.saturating_add(1);
                *count
            }
            None if counts.len() < MAX_FOLLOWERS => {
                counts.push((next, 1));
                1
            }
            None => return,
        };
        // Counts only grow, so the best one can only be overtaken by the one just raised.
        if count > followers.best.1 {
            followers.best = (next, count);
        }
    }

    /// Follows the most frequent next token from `bigram` for up to `max_draft_len` steps, while
    /// each step's ratio is at least `min_prob`, stopping after an end-of-generation token.
    fn chain(
        &self,
        mut bigram: (Token, Token),
        max_draft_len: usize,
        min_prob: f32,
        facts: &ModelFacts,
    ) -> Proposal {
        let mut proposal = Proposal::empty();
        let mut probability = 1.0;
        while proposal.len() < max_draft_len {
            let Some(followers) = self.followers.get(&bigram) else {
                break;
            };
            let (next, count) = followers.best;
            let ratio = count as f32 / followers.total as f32;
            if ratio < min_prob {
                break;
            }
            probability *= ratio;
            proposal.tokens.push(next);
            proposal.confidence.push(probability);
            if facts.is_eog(next) {
                break;
            }
            bigram = (bigram.1, next);
        }
        proposal
    }
}

/// One request's view: the last two tokens of its context and its own acceptance statistics.
pub struct MarkovDrafter {
    min_prob: f32,
    facts: ModelFacts,
    /// The end of the context: the bigram the next proposal starts from.
    tail: Tail,
    /// Length of the last proposal, credited to `verified` if it wins.
    last_proposal_len: usize,
    stats: SessionStats,
}

/// The last (up to) two tokens of a session's context.
#[derive(Debug, Clone, Copy)]
enum Tail {
    Empty,
    One(Token),
    Two(Token, Token),
}

/// How this session's proposals fared, from [`Drafter::feedback`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct SessionStats {
    /// Rounds in which the host asked this drafter for a proposal.
    rounds: u64,
    /// Rounds in which its proposal was the draft the target verified.
    wins: u64,
    /// Tokens of winning proposals, all of which the target checked.
    verified: u64,
    /// Tokens the target accepted.
    accepted: u64,
}

impl MarkovDrafter {
    fn summary(&self) -> String {
        let SessionStats {
            rounds,
            wins,
            verified,
            accepted,
        } = self.stats;
        let acceptance = if verified == 0 {
            0.0
        } else {
            100.0 * accepted as f64 / verified as f64
        };
        let bigrams = MODEL.with_borrow(|model| model.followers.len());
        format!(
            "markov_drafter: {rounds} rounds proposed, {wins} won, {accepted}/{verified} \
             verified tokens accepted ({acceptance:.1}%), {bigrams} bigrams known"
        )
    }
}

impl Drafter for MarkovDrafter {
    fn new(config: &str, facts: &ModelFacts) -> Result<Self, String> {
        let config = Config::parse(config)?;
        let min_prob = config.get_f32("min_prob", DEFAULT_MIN_PROB)?;
        config.finish()?;
        if !(0.0..=1.0).contains(&min_prob) {
            return Err(format!(
                "min_prob is {min_prob}; it is a probability, between 0 and 1"
            ));
        }
        Ok(Self {
            min_prob,
            facts: facts.clone(),
            tail: Tail::Empty,
            last_proposal_len: 0,
            stats: SessionStats::default(),
        })
    }

    /// Learns from every new token, prompt and output alike, into the shared [`MODEL`].
    fn feed(&mut self, tokens: &[Token]) {
        MODEL.with_borrow_mut(|model| {
            for &token in tokens {
                self.tail = match self.tail {
                    Tail::Empty => Tail::One(token),
                    Tail::One(first) => Tail::Two(first, token),
                    Tail::Two(first, second) => {
                        model.learn((first, second), token);
                        Tail::Two(second, token)
                    }
                };
            }
        });
    }

    fn propose(&mut self, max_draft_len: usize) -> Proposal {
        let proposal = match self.tail {
            Tail::Two(first, second) => MODEL.with_borrow(|model| {
                model.chain((first, second), max_draft_len, self.min_prob, &self.facts)
            }),
            Tail::Empty | Tail::One(_) => Proposal::empty(),
        };
        self.last_proposal_len = proposal.len();
        proposal
    }

    fn feedback(&mut self, outcome: Feedback) {
        self.stats.rounds += 1;
        if outcome.won {
            self.stats.wins += 1;
            self.stats.verified += self.last_proposal_len as u64;
            self.stats.accepted += u64::from(outcome.n_accepted);
        }
        if self.stats.rounds.is_multiple_of(SUMMARY_EVERY_ROUNDS) {
            log(Level::Debug, &self.summary());
        }
    }

    /// Learns from a response another instance served, as from a session fed it: what followed
    /// each of its bigrams.
    fn observe_response(response: &[Token]) {
        MODEL.with_borrow_mut(|model| {
            for window in response.windows(3) {
                model.learn((window[0], window[1]), window[2]);
            }
        });
    }
}

export_drafter!(MarkovDrafter);

#[cfg(test)]
mod tests {
    use super::*;
    use spechost_sdk::testing::{Harness, facts};

    const VOCAB_SIZE: u32 = 100;

    /// A session on an empty model. Tests run on their own threads, so each starts with its
    /// own `MODEL`; resetting makes that explicit.
    fn fresh(config: &str) -> Harness<MarkovDrafter> {
        MODEL.with_borrow_mut(|model| *model = BigramModel::default());
        session(config)
    }

    /// A session on the model as previous sessions of this test left it.
    fn session(config: &str) -> Harness<MarkovDrafter> {
        Harness::new(config, facts(VOCAB_SIZE)).expect("valid markov config")
    }

    #[test]
    fn proposes_the_most_frequent_chain_with_ratio_products() {
        let mut harness = fresh("");
        // After (1, 2): 3 twice, 4 once. After (2, 3): 5 always. After (3, 5): 1 always.
        harness.feed(&[1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 4, 0, 1, 2]);
        let proposal = harness.propose(3);
        assert_eq!(proposal.tokens, [3, 5, 1]);
        let expected = [2.0 / 3.0, 2.0 / 3.0, 2.0 / 3.0];
        for (actual, expected) in proposal.confidence.iter().zip(expected) {
            assert!(
                (actual - expected).abs() < 1e-6,
                "confidence {:?}",
                proposal.confidence
            );
        }
    }

    #[test]
    fn stops_when_the_ratio_drops_below_min_prob() {
        let mut harness = fresh("min_prob=0.7");
        // After (1, 2): 3 always. After (2, 3): 5 twice, 6 once, so 2/3 < 0.7.
        harness.feed(&[1, 2, 3, 5, 9, 1, 2, 3, 5, 9, 2, 3, 6, 9, 1, 2]);
        assert_eq!(harness.propose(4).tokens, [3]);
    }

    #[test]
    fn proposes_nothing_without_two_tokens_or_a_known_bigram() {
        let mut harness = fresh("");
        assert!(harness.propose(4).is_empty());
        harness.feed(&[7]);
        assert!(harness.propose(4).is_empty());
        harness.feed(&[8]);
        assert!(
            harness.propose(4).is_empty(),
            "(7, 8) was never followed by anything"
        );
    }

    #[test]
    fn respects_max_draft_len_and_stops_after_end_of_generation() {
        let mut harness = fresh("");
        harness.feed(&[1, 2, 1, 2, 1, 2]);
        assert_eq!(harness.propose(0).tokens, [] as [Token; 0]);
        assert_eq!(harness.propose(3).tokens, [1, 2, 1]);

        MODEL.with_borrow_mut(|model| *model = BigramModel::default());
        let facts = ModelFacts {
            eos: Some(2),
            ..facts(VOCAB_SIZE)
        };
        let mut harness = Harness::<MarkovDrafter>::new("", facts).expect("default config");
        harness.feed(&[1, 2, 1, 2, 1, 2]);
        assert_eq!(harness.propose(3).tokens, [1, 2]);
    }

    #[test]
    fn learning_persists_across_sessions() {
        let mut first = fresh("");
        first.feed(&[10, 11, 12, 13]);
        drop(first);
        let mut second = session("");
        second.feed(&[10, 11]);
        assert_eq!(second.propose(4).tokens, [12, 13]);
    }

    #[test]
    fn learns_from_observed_responses() {
        // Before any session, as on a fresh instance.
        MODEL.with_borrow_mut(|model| *model = BigramModel::default());
        MarkovDrafter::observe_response(&[10, 11, 12, 13]);
        let mut harness = session("");
        harness.feed(&[10, 11]);
        assert_eq!(harness.propose(4).tokens, [12, 13]);
        // While a session is open, as between requests in a server.
        harness.observe_response(&[20, 21, 22]);
        let mut next = session("");
        next.feed(&[5, 20, 21]);
        assert_eq!(next.propose(4).tokens, [22]);
    }

    #[test]
    fn feeding_in_pieces_equals_feeding_at_once() {
        let tokens = [1, 2, 3, 1, 2, 3, 1, 2];
        let mut at_once = fresh("");
        at_once.feed(&tokens);
        let expected = at_once.propose(4);

        let mut pieces = fresh("");
        for piece in tokens.chunks(1).chain([&[][..]]) {
            pieces.feed(piece);
        }
        assert_eq!(pieces.propose(4), expected);
    }

    #[test]
    fn tracks_its_own_acceptance() {
        let mut harness = fresh("");
        let cycle: Vec<Token> = (0..20).map(|i| [4, 5, 6][i % 3]).collect();
        let stats = harness.replay(&cycle[..6], &cycle[6..], 4);
        let own = harness.drafter().stats;
        // Every proposal here is non-empty, so every round with feedback is one with a proposal.
        assert_eq!(own.rounds, stats.proposals as u64, "{own:?} vs {stats:?}");
        assert_eq!(own.accepted, stats.accepted as u64, "{own:?} vs {stats:?}");
        assert_eq!(own.verified, stats.drafted as u64, "{own:?} vs {stats:?}");
        assert!(own.accepted > 0, "{own:?}");
        let summary = harness.drafter().summary();
        let expected = format!("{}/{} verified tokens accepted", own.accepted, own.verified);
        assert!(summary.contains(&expected), "{summary}");
    }

    #[test]
    fn second_request_on_repeated_text_is_drafted_well() {
        // The same "document" twice: the second request benefits from the first.
        let mut random = 17_u64;
        let text: Vec<Token> = (0..300)
            .map(|_| {
                random = random
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                ((random >> 33) % u64::from(VOCAB_SIZE)) as Token
            })
            .collect();
        let cold = fresh("").replay(&text[..2], &text[2..], 8);
        let warm = session("").replay(&text[..2], &text[2..], 8);
        assert!(
            warm.mean_accepted_per_round() > cold.mean_accepted_per_round() + 1.0,
            "cold {cold:?}, warm {warm:?}"
        );
        assert!(
            warm.acceptance() > 0.6,
            "warm acceptance {:.3} in {warm:?}",
            warm.acceptance()
        );
    }

    #[test]
    fn rejects_bad_min_prob() {
        let error = |config| Harness::<MarkovDrafter>::new(config, facts(VOCAB_SIZE)).unwrap_err();
        assert_eq!(
            error("min_prob=1.5"),
            "min_prob is 1.5; it is a probability, between 0 and 1"
        );
        assert!(error("min_prob=high").contains("`min_prob` has value `high`"));
        assert_eq!(
            error("minprob=0.3"),
            "unknown setting `minprob` (value `0.3`); known settings are `min_prob`"
        );
    }

    #[test]
    fn model_stops_growing_at_max_bigrams() {
        let mut model = BigramModel::default();
        for a in 0..=(MAX_BIGRAMS as Token) {
            model.learn((a, 0), 1);
        }
        assert_eq!(model.followers.len(), MAX_BIGRAMS);
        model.learn((0, 0), 2);
        let followers = &model.followers[&(0, 0)];
        assert_eq!(
            (followers.total, followers.best),
            (2, (1, 1)),
            "known bigrams still learn"
        );
    }
}
