//! [`Harness`]: drives a [`Drafter`] the way the host does, checking every proposal.

use std::any::type_name;
use std::fmt;

use crate::check::{check_proposal, check_tree};
use crate::drafter::Drafter;
use crate::records::{Feedback, ModelFacts, Proposal, Token};

/// Model facts for tests: a vocabulary of `vocab_size` tokens, no special tokens, and a context
/// of 4096 tokens.
pub fn facts(vocab_size: u32) -> ModelFacts {
    const TEST_CONTEXT_SIZE: u32 = 4096;
    ModelFacts {
        vocab_size,
        context_size: TEST_CONTEXT_SIZE,
        ..ModelFacts::default()
    }
}

/// One drafter session, driven natively the way the host drives it.
///
/// Calls are passed straight to the drafter, except that [`Harness::propose`] checks the
/// proposal with [`check_proposal`], as the host does, and [`Harness::feed`] and
/// [`Harness::observe_response`] check that the test passes only what the host would: tokens of
/// the vocabulary, and responses that fit in the context. The call order is up to the test; the
/// host's order is described on [`Drafter`].
pub struct Harness<D: Drafter> {
    drafter: D,
    facts: ModelFacts,
    /// The tree shape the last proposal declared ([`crate::tree::shape_proposal`]).
    shape: Option<Vec<u32>>,
}

// By hand, so that `Harness::new(..).unwrap_err()` works for drafters without `Debug`.
impl<D: Drafter> fmt::Debug for Harness<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("drafter", &type_name::<D>())
            .field("facts", &self.facts)
            .finish()
    }
}

impl<D: Drafter> Harness<D> {
    /// Opens a session with `config` and `facts`, as the host does for each request.
    ///
    /// Returns the drafter's own error when [`Drafter::new`] rejects the config.
    pub fn new(config: &str, facts: ModelFacts) -> Result<Self, String> {
        let drafter = D::new(config, &facts)?;
        Ok(Self {
            drafter,
            facts,
            shape: None,
        })
    }

    /// The model facts the session was opened with.
    pub fn facts(&self) -> &ModelFacts {
        &self.facts
    }

    /// The drafter, to inspect its state in assertions.
    pub fn drafter(&self) -> &D {
        &self.drafter
    }

    /// The drafter, mutably.
    pub fn drafter_mut(&mut self) -> &mut D {
        &mut self.drafter
    }

    /// Feeds `tokens` to the drafter ([`Drafter::feed`]).
    ///
    /// # Panics
    ///
    /// If a token is outside the vocabulary: the host never feeds one, so the test is wrong.
    pub fn feed(&mut self, tokens: &[Token]) {
        self.assert_in_vocabulary("fed", tokens);
        self.drafter.feed(tokens);
    }

    /// Asks the drafter for up to `max_draft_len` tokens ([`Drafter::propose`]).
    ///
    /// # Panics
    ///
    /// If the proposal breaks a rule the host enforces (see [`check_proposal`], and
    /// [`check_tree`] for the shape of a tree proposal).
    pub fn propose(&mut self, max_draft_len: usize) -> Proposal {
        crate::tree::take_declared_shape();
        let proposal = self.drafter.propose(max_draft_len);
        self.shape = crate::tree::take_declared_shape();
        let vocab_size = self.facts.vocab_size;
        let checked = check_proposal(
            &proposal.tokens,
            &proposal.confidence,
            max_draft_len,
            vocab_size,
        )
        .and_then(|()| match &self.shape {
            Some(parents) => check_tree(&proposal.tokens, parents, crate::tree::max_paths()),
            None => Ok(()),
        });
        if let Err(error) = checked {
            panic!(
                "{} broke the proposal contract: it {error}; {} (proposal: {proposal:?})",
                type_name::<D>(),
                error.rule()
            );
        }
        proposal
    }

    /// The tree shape the last [`Self::propose`] declared, if it declared one (`parents[i]`:
    /// the row token `i` continues).
    pub fn shape(&self) -> Option<&[u32]> {
        self.shape.as_deref()
    }

    /// Tells the drafter how its last proposal fared ([`Drafter::feedback`]).
    pub fn feedback(&mut self, outcome: Feedback) {
        self.drafter.feedback(outcome);
    }

    /// Asks the plugin to save its cross-request state ([`Drafter::checkpoint`]), as the host
    /// does before writing its state files. Natively the blob lands in the in-memory slot that
    /// [`crate::state::load`] reads back.
    pub fn checkpoint(&self) {
        D::checkpoint();
    }

    /// Hands the plugin the finished `response` of a request another instance served
    /// ([`Drafter::observe_response`]), as a server does between requests.
    ///
    /// Like [`Harness::checkpoint`] it goes to the type, not to this session; the harness only
    /// lends its facts to check the response. To observe one before any session is open, as the
    /// host may on a fresh instance, call the drafter type's `observe_response` directly.
    ///
    /// # Panics
    ///
    /// If a token is outside the vocabulary, or the response is longer than the context: the
    /// host never hands such a response, so the test is wrong.
    pub fn observe_response(&self, response: &[Token]) {
        self.assert_in_vocabulary("observed", response);
        let context_size = self.facts.context_size;
        if usize::try_from(context_size).is_ok_and(|size| response.len() > size) {
            panic!(
                "the test observed a response of {} tokens, longer than the context of \
                 {context_size} tokens; raise context_size in the harness's ModelFacts",
                response.len()
            );
        }
        D::observe_response(response);
    }

    /// Panics, naming what the test did (`action`), if `tokens` holds a token outside the
    /// vocabulary.
    fn assert_in_vocabulary(&self, action: &str, tokens: &[Token]) {
        let vocab_size = self.facts.vocab_size;
        if let Some(token) = tokens.iter().find(|&&token| token >= vocab_size) {
            panic!(
                "the test {action} token {token}, outside the vocabulary of {vocab_size} tokens; \
                 raise vocab_size in the harness's ModelFacts"
            );
        }
    }

    /// Simulates greedy speculative decoding of `output` after `prompt`, with this drafter as
    /// the only source, and counts what the target would have accepted.
    ///
    /// Feeds `prompt`, then runs rounds until `output` is used up. Each round:
    ///
    /// 1. asks for a proposal of up to `max_draft_len` tokens, capped so that at least one output
    ///    token is left for the target to commit after the draft (no proposal when only one is
    ///    left);
    /// 2. accepts the longest prefix of the proposal that matches `output`;
    /// 3. sends feedback: `won` if the proposal was not empty, `n_accepted`, and as
    ///    `target_token` the output token right after the accepted prefix;
    /// 4. feeds the accepted prefix followed by that token.
    ///
    /// # Panics
    ///
    /// If a proposal breaks the contract (see [`Harness::propose`]).
    pub fn replay(
        &mut self,
        prompt: &[Token],
        output: &[Token],
        max_draft_len: usize,
    ) -> ReplayStats {
        let mut stats = ReplayStats::default();
        self.feed(prompt);
        let mut position = 0;
        while position < output.len() {
            let rest = &output[position..];
            // The round ends with a token from the target, so the draft may cover at most all
            // but the last remaining output token.
            let budget = max_draft_len.min(rest.len() - 1);
            let mut n_accepted = 0;
            if budget > 0 {
                let proposal = self.propose(budget);
                n_accepted = proposal
                    .tokens
                    .iter()
                    .zip(rest)
                    .take_while(|(proposed, actual)| proposed == actual)
                    .count();
                stats.drafted += proposal.len();
                stats.accepted += n_accepted;
                stats.proposals += usize::from(!proposal.is_empty());
                self.feedback(Feedback {
                    won: !proposal.is_empty(),
                    n_accepted: u32::try_from(n_accepted).unwrap_or(u32::MAX),
                    target_token: rest[n_accepted],
                });
            }
            self.feed(&rest[..=n_accepted]);
            position += n_accepted + 1;
            stats.rounds += 1;
        }
        stats
    }
}

/// What [`Harness::replay`] counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayStats {
    /// Rounds run; each commits the accepted draft tokens plus one token from the target.
    pub rounds: usize,
    /// Rounds in which the drafter proposed at least one token.
    pub proposals: usize,
    /// Tokens proposed, over all rounds.
    pub drafted: usize,
    /// Proposed tokens the target accepted, over all rounds.
    pub accepted: usize,
}

impl ReplayStats {
    /// Accepted draft tokens per round (0 when no round ran). Each round also commits one target
    /// token, so a round yields `1 + mean_accepted_per_round()` tokens on average.
    pub fn mean_accepted_per_round(&self) -> f64 {
        ratio(self.accepted, self.rounds)
    }

    /// Fraction of proposed tokens the target accepted (0 when nothing was proposed).
    pub fn acceptance(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }
}

fn ratio(numerator: usize, denominator: usize) -> f64 {
    if denominator == 0 {
        0.0
    } else {
        // Counts stay far below 2^52, where the conversion would lose precision.
        numerator as f64 / denominator as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Prompt then output, as one stream the oracle knows in advance.
    const STREAM: [Token; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    const PROMPT_LEN: usize = 2;

    /// Proposes the true continuation, or, with `wrong_at=i`, a wrong token at position `i` of
    /// each proposal.
    struct Oracle {
        context: Vec<Token>,
        wrong_at: usize,
        feedback: Vec<Feedback>,
    }

    impl Drafter for Oracle {
        fn new(config: &str, _facts: &ModelFacts) -> Result<Self, String> {
            let config = Config::parse(config)?;
            let wrong_at = config.get_usize("wrong_at", usize::MAX)?;
            config.finish()?;
            Ok(Oracle {
                context: Vec::new(),
                wrong_at,
                feedback: Vec::new(),
            })
        }

        fn feed(&mut self, tokens: &[Token]) {
            self.context.extend_from_slice(tokens);
        }

        fn propose(&mut self, max_draft_len: usize) -> Proposal {
            let start = self.context.len();
            let end = (start + max_draft_len).min(STREAM.len());
            let mut tokens = STREAM[start..end].to_vec();
            if let Some(token) = tokens.get_mut(self.wrong_at) {
                *token = 0;
            }
            Proposal::tokens(tokens)
        }

        fn feedback(&mut self, outcome: Feedback) {
            self.feedback.push(outcome);
        }
    }

    /// Proposes one token more than asked for, or with `valid=true` exactly as many.
    struct TooLong {
        valid: bool,
    }

    impl Drafter for TooLong {
        fn new(config: &str, _facts: &ModelFacts) -> Result<Self, String> {
            let config = Config::parse(config)?;
            let valid = config.get_bool("valid", false)?;
            config.finish()?;
            Ok(TooLong { valid })
        }

        fn feed(&mut self, _tokens: &[Token]) {}

        fn propose(&mut self, max_draft_len: usize) -> Proposal {
            let len = if self.valid {
                max_draft_len
            } else {
                max_draft_len + 1
            };
            Proposal::with_confidence(vec![1; len], vec![0.5; len])
        }
    }

    thread_local! {
        /// The responses [`Observer`] was handed, on this test's thread.
        static OBSERVED: std::cell::RefCell<Vec<Vec<Token>>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Records every response it observes in [`OBSERVED`].
    struct Observer;

    impl Drafter for Observer {
        fn new(_config: &str, _facts: &ModelFacts) -> Result<Self, String> {
            Ok(Observer)
        }

        fn feed(&mut self, _tokens: &[Token]) {}

        fn propose(&mut self, _max_draft_len: usize) -> Proposal {
            Proposal::empty()
        }

        fn observe_response(response: &[Token]) {
            OBSERVED.with_borrow_mut(|observed| observed.push(response.to_vec()));
        }
    }

    /// A harness for [`Observer`] with a vocabulary of 100 tokens and a context of 4.
    fn observer() -> Harness<Observer> {
        let facts = ModelFacts {
            context_size: 4,
            ..facts(100)
        };
        Harness::new("", facts).expect("no config to reject")
    }

    fn oracle(config: &str) -> Harness<Oracle> {
        Harness::new(config, facts(100)).expect("valid oracle config")
    }

    #[test]
    fn perfect_drafter_gets_every_token_but_the_targets() {
        let mut harness = oracle("");
        let stats = harness.replay(&STREAM[..PROMPT_LEN], &STREAM[PROMPT_LEN..], 4);
        // 10 output tokens at max_draft_len 4: rounds commit 4 + 1, then 4 + 1.
        let expected = ReplayStats {
            rounds: 2,
            proposals: 2,
            drafted: 8,
            accepted: 8,
        };
        assert_eq!(stats, expected);
        assert_eq!(stats.acceptance(), 1.0);
        assert_eq!(stats.mean_accepted_per_round(), 4.0);
    }

    #[test]
    fn replay_feeds_prompt_then_committed_tokens() {
        let mut harness = oracle("wrong_at=2");
        harness.replay(&STREAM[..PROMPT_LEN], &STREAM[PROMPT_LEN..], 5);
        assert_eq!(harness.drafter().context, STREAM, "context after replay");
    }

    #[test]
    fn replay_reports_accepted_prefix_and_target_token() {
        let mut harness = oracle("wrong_at=2");
        let stats = harness.replay(&STREAM[..PROMPT_LEN], &STREAM[PROMPT_LEN..], 5);
        // Each round accepts 2 tokens and the target corrects the third: 3 tokens per round,
        // except the last, where only 1 output token is left and nothing is proposed.
        let feedback = &harness.drafter().feedback;
        let expected: Vec<Feedback> = [5, 8, 11]
            .into_iter()
            .map(|target_token| Feedback {
                won: true,
                n_accepted: 2,
                target_token,
            })
            .collect();
        assert_eq!(*feedback, expected);
        assert_eq!(stats.rounds, 4, "{stats:?}");
        assert_eq!(stats.accepted, 6, "{stats:?}");
        // Proposals are capped by the remaining output: 5, 5, then 3 when 4 tokens are left.
        assert_eq!(stats.drafted, 13, "{stats:?}");
    }

    #[test]
    fn zero_max_draft_len_asks_for_nothing() {
        let mut harness = oracle("");
        let stats = harness.replay(&[1], &[2, 3, 4], 0);
        assert_eq!(stats.rounds, 3, "{stats:?}");
        assert_eq!(stats.drafted, 0, "{stats:?}");
        assert_eq!(stats.acceptance(), 0.0);
        assert_eq!(stats.mean_accepted_per_round(), 0.0);
    }

    #[test]
    fn new_returns_the_drafters_config_error() {
        let error = Harness::<Oracle>::new("wrong_at=x", facts(100)).unwrap_err();
        assert!(error.contains("`wrong_at`"), "{error}");
    }

    #[test]
    fn valid_proposal_passes() {
        let mut harness = Harness::<TooLong>::new("valid=true", facts(100)).expect("valid config");
        let proposal = harness.propose(2);
        assert_eq!(proposal.tokens, [1, 1], "{proposal:?}");
    }

    /// Each rule is in the one table of `check`; this shows the harness applies it and how it
    /// reports a broken one.
    #[test]
    #[should_panic(
        expected = "TooLong broke the proposal contract: it proposed 4 tokens, at most 3 were \
                    asked for; never return more than max_draft_len tokens"
    )]
    fn panics_on_a_broken_rule_naming_the_drafter_and_the_rule() {
        Harness::<TooLong>::new("", facts(100))
            .expect("valid config")
            .propose(3);
    }

    #[test]
    #[should_panic(expected = "the test fed token 100")]
    fn panics_when_the_test_feeds_out_of_vocabulary() {
        oracle("").feed(&[1, 100]);
    }

    #[test]
    fn observed_responses_reach_the_drafter_type() {
        let harness = observer();
        harness.observe_response(&[1, 2, 3, 99]);
        harness.observe_response(&[]);
        assert_eq!(
            OBSERVED.with_borrow(Clone::clone),
            [vec![1, 2, 3, 99], vec![]]
        );
    }

    #[test]
    #[should_panic(expected = "the test observed token 100, outside the vocabulary of 100 tokens")]
    fn panics_when_the_test_observes_out_of_vocabulary() {
        observer().observe_response(&[1, 100]);
    }

    #[test]
    #[should_panic(
        expected = "the test observed a response of 5 tokens, longer than the context of 4 tokens"
    )]
    fn panics_when_the_test_observes_a_response_longer_than_the_context() {
        observer().observe_response(&[1, 2, 3, 4, 5]);
    }
}
