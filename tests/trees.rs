//! Tree drafts on the default models: the target verifies several continuations in one batch,
//! and the output is plain decoding's, token for token, greedy and sampled.
//!
//! First with sources that know plain decoding's answer and propose it with a wrong token at a
//! different depth each (one proposes tokens that are never right), so the cascade's trees hold
//! the right continuation sometimes on their leading chain, sometimes on another path and
//! sometimes nowhere; long answers accept and drop many branches, and the cache holds and frees
//! their cells round after round. Then with the built-in plugins, `suffix` proposing its
//! speculation trees through the WIT's `tree` import, and beside it a plugin built against WIT
//! 0.8.0, before that import.

mod common;

use spechost::cascade::{
    Cascade, CascadeMode, CascadeSettings, DraftSource, ModelFacts, Proposal, SourceFault, Token,
};
use spechost::engine::{
    DEFAULT_TREE_LEAVES, Outcome, Request, SamplingParams, Session, SessionParams, Target,
};
use spechost::models::DefaultModel;

use common::{
    cascade_with_settings, exclusive, first_difference, fixtures, load, plugin_host,
    session_params, wasm,
};
use spechost::plugins::SourceSpec;

/// Tokens generated per fixture prompt.
const MAX_TOKENS: usize = 128;
/// Tokens a round drafts, over every path of its tree.
const DRAFT_LEN: usize = 10;

/// Proposes plain decoding's continuation of its context, with the token at a depth that
/// changes from round to round replaced by another (never, every `period`-th round).
struct Misspelling {
    name: &'static str,
    /// The prompt and plain decoding's output, as the target would continue it.
    truth: Vec<Token>,
    /// Context length fed so far.
    fed: usize,
    /// Rounds proposed so far.
    rounds: usize,
    /// Depth of the wrong token in the first round, and how it moves.
    offset: usize,
    /// Every this many rounds, the proposal has no wrong token.
    period: usize,
}

impl DraftSource for Misspelling {
    fn name(&self) -> &str {
        self.name
    }

    fn begin(&mut self, _facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        self.fed = prompt.len();
        self.rounds = 0;
        Ok(())
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        self.rounds += 1;
        let end = (self.fed + max_draft_len).min(self.truth.len());
        let mut tokens = self.truth[self.fed.min(end)..end].to_vec();
        if !self.rounds.is_multiple_of(self.period) && !tokens.is_empty() {
            let wrong = (self.rounds * 3 + self.offset) % tokens.len();
            tokens[wrong] = tokens[wrong].wrapping_add(1) % 1000;
        }
        Ok(Proposal::from_tokens(tokens))
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        self.fed += tokens.len();
        Ok(())
    }
}

/// Proposes tokens the target never produces here (control characters of the vocabulary).
struct Wrong;

impl DraftSource for Wrong {
    fn name(&self) -> &str {
        "wrong"
    }

    fn begin(&mut self, _facts: &ModelFacts, _prompt: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        Ok(Proposal::from_tokens(
            (3..3 + max_draft_len.min(3) as Token).collect(),
        ))
    }

    fn feed(&mut self, _tokens: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
}

/// A tree-mode cascade over two [`Misspelling`]s of `truth` and [`Wrong`].
fn tree_cascade(truth: &[Token]) -> Cascade {
    let misspelling = |name, offset, period| {
        Box::new(Misspelling {
            name,
            truth: truth.to_vec(),
            fed: 0,
            rounds: 0,
            offset,
            period,
        }) as Box<dyn DraftSource>
    };
    Cascade::new(
        vec![
            misspelling("early", 0, 5),
            misspelling("late", 4, 3),
            Box::new(Wrong),
        ],
        CascadeSettings {
            mode: CascadeMode::Tree,
            ..CascadeSettings::default()
        },
    )
}

fn tree_session(target: &Target) -> Session<'_> {
    target
        .session(&SessionParams {
            tree_leaves: DEFAULT_TREE_LEAVES,
            ..session_params()
        })
        .expect("session")
}

fn request(prompt: Vec<Token>, sampling: SamplingParams, max_draft_len: usize) -> Request {
    let mut request = Request::new(prompt, MAX_TOKENS, sampling);
    request.max_draft_len = max_draft_len;
    request
}

/// Counters of the tree-drafted requests of a run, summed.
#[derive(Debug, Default)]
struct TreeCounts {
    tree_rounds: u64,
    replayed: u64,
    accepted: u64,
    /// Rounds the cascade's first source proposed something.
    first_source_proposed: u64,
    /// Faults of every source.
    faults: u64,
}

/// Plain decoding's output of every fixture prompt, then the same prompts through tree drafts
/// of the cascade `cascade_for` makes from plain decoding's prompt and output, in one session
/// that keeps its context across requests: the outputs must be equal.
fn trees_keep_output_identical(
    model: DefaultModel,
    sampling: SamplingParams,
    cascade_for: &mut dyn FnMut(&[Token]) -> Cascade,
) -> TreeCounts {
    let _guard = exclusive();
    let target = load(model);
    let mut plain_session = target.session(&session_params()).expect("session");
    let mut session = tree_session(&target);
    let mut counts = TreeCounts::default();
    for fixture in fixtures() {
        let prompt = target.tokenize_chat(&fixture.user_message).expect("chat");
        let plain: Outcome = plain_session
            .generate(
                &request(prompt.clone(), sampling.clone(), 0),
                &mut Cascade::empty(),
                &mut |_| {},
            )
            .expect("plain decoding");
        let truth: Vec<Token> = prompt.iter().chain(&plain.tokens).copied().collect();
        let mut cascade = cascade_for(&truth);
        let treed = session
            .generate(
                &request(prompt, sampling.clone(), DRAFT_LEN),
                &mut cascade,
                &mut |_| {},
            )
            .expect("tree drafts");
        assert_eq!(
            treed.tokens,
            plain.tokens,
            "{} on {model:?}: first difference at {:?}",
            fixture.id,
            first_difference(&treed.tokens, &plain.tokens)
        );
        counts.tree_rounds += treed.stats.tree_rounds;
        counts.replayed += treed.stats.replayed_tokens;
        counts.accepted += treed.stats.accepted;
        counts.first_source_proposed += treed.stats.sources.first().map_or(0, |s| s.proposed);
        counts.faults += treed.stats.sources.iter().map(|s| s.faults).sum::<u64>();
    }
    counts
}

/// [`trees_keep_output_identical`] with [`tree_cascade`]: trees must have been taken off their
/// leading chain and dropped often.
fn misspelt_trees_keep_output_identical(model: DefaultModel, sampling: SamplingParams) {
    let counts = trees_keep_output_identical(model, sampling, &mut |truth| tree_cascade(truth));
    // About 80 tree rounds, 70 accepted tokens off a tree's leading chain and 540 accepted
    // draft tokens in all, on either model.
    assert!(counts.tree_rounds >= 60, "{counts:?}");
    assert!(counts.replayed >= 40, "{counts:?}");
    assert!(counts.accepted >= 400, "{counts:?}");
}

#[test]
fn greedy_tree_drafts_give_plain_decodings_output_on_smollm2() {
    misspelt_trees_keep_output_identical(DefaultModel::SmolLm2, SamplingParams::greedy());
}

#[test]
fn greedy_tree_drafts_give_plain_decodings_output_on_gemma3() {
    misspelt_trees_keep_output_identical(DefaultModel::Gemma3, SamplingParams::greedy());
}

/// At a temperature the target draws each committed token once, in order, as plain decoding
/// does: with the same seed, the same output.
#[test]
fn sampled_tree_drafts_give_plain_decodings_draw_for_the_seed() {
    misspelt_trees_keep_output_identical(
        DefaultModel::SmolLm2,
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            seed: 11,
            ..SamplingParams::greedy()
        },
    );
}

/// `specs` in tree mode, on `model`'s fixture prompts.
fn plugins_in_tree_mode(model: DefaultModel, specs: &[SourceSpec]) -> TreeCounts {
    let host = plugin_host();
    trees_keep_output_identical(model, SamplingParams::greedy(), &mut |_| {
        cascade_with_settings(
            &host,
            specs,
            CascadeSettings {
                mode: CascadeMode::Tree,
                ..CascadeSettings::default()
            },
        )
    })
}

/// The built-in `lookup` and `suffix` in tree mode: `suffix` proposes its speculation trees and
/// the cascade merges both sources' proposals.
fn plugin_trees_keep_output_identical(model: DefaultModel) {
    let specs = [
        SourceSpec::Builtin("lookup".into()),
        SourceSpec::Builtin("suffix".into()),
    ];
    let counts = plugins_in_tree_mode(model, &specs);
    assert!(counts.tree_rounds >= 5, "{counts:?}");
    assert_eq!(counts.faults, 0, "{counts:?}");
}

/// A plugin built against WIT 0.8.0, before the `tree` import, loads in this host (0.8.2) and
/// drafts chains that join `suffix`'s trees, without a fault.
#[test]
fn a_plugin_built_against_wit_0_8_0_drafts_beside_trees() {
    let specs = [
        wasm("compat_wit_0_8_0"),
        SourceSpec::Builtin("suffix".into()),
    ];
    let counts = plugins_in_tree_mode(DefaultModel::SmolLm2, &specs);
    assert!(counts.first_source_proposed >= 20, "{counts:?}");
    assert_eq!(counts.faults, 0, "{counts:?}");
}

/// The built-in `lookup` alone in tree mode: the distinct continuations of its matches branch.
fn lookup_trees_keep_output_identical(model: DefaultModel) {
    let counts = plugins_in_tree_mode(model, &[SourceSpec::Builtin("lookup".into())]);
    assert!(counts.tree_rounds >= 1, "{model:?}: {counts:?}");
    assert_eq!(counts.faults, 0, "{counts:?}");
}

#[test]
fn lookup_trees_give_plain_decodings_output_on_smollm2() {
    lookup_trees_keep_output_identical(DefaultModel::SmolLm2);
}

#[test]
fn lookup_trees_give_plain_decodings_output_on_gemma3() {
    lookup_trees_keep_output_identical(DefaultModel::Gemma3);
}

#[test]
fn suffix_trees_give_plain_decodings_output_on_smollm2() {
    plugin_trees_keep_output_identical(DefaultModel::SmolLm2);
}

#[test]
fn suffix_trees_give_plain_decodings_output_on_gemma3() {
    plugin_trees_keep_output_identical(DefaultModel::Gemma3);
}
