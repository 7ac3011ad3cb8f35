//! The draft-model bridge on real models: the tokenizer check, the default draft made by
//! `spechost models quantize`, a draft context's proposals against the draft model's own
//! plain greedy decoding, and sampling with drawn drafts accepted by rejection sampling against
//! plain sampling (chi-square tests). Needs the default models (`spechost models fetch`); makes the
//! SmolLM2 default draft in the model cache if it is not there.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rand::RngExt;
use spechost::cascade::{
    Cascade, CascadeMode, CascadeSettings, Decision, DraftModel, DraftModelCosts, DraftModelSetup,
    DraftSampling, DraftSource, Drafted, DraftedToken, ModelFacts, PolicySetup, Proposal,
    ProposalSettings, RoundPolicy, RoundRecord, SampledDraft, SourceFault, SourceRound, Token,
    TokenDistribution,
};
use spechost::config::cache_dir;
use spechost::engine::{
    DEFAULT_TREE_LEAVES, DraftAcceptance, DraftModelConfig, DraftModelContext, DraftModelHost,
    EngineError, ModelOverrides, Request, SamplingParams, SessionParams, Target, TargetParams,
    check_vocab_compatible, measure_agreement, measure_draft_model,
};
use spechost::models::{DefaultDraft, DefaultModel, QuantType, QuantizeRequest, quantize};
use spechost::plugins::SourceSpec;

/// Tokens each proposal asks for in the tests that compare proposals.
const DRAFT_LEN: usize = 12;

/// The SmolLM2 default draft (made on first use), as the CLI makes it.
fn smollm2_draft_path() -> PathBuf {
    default_draft_path(DefaultModel::SmolLm2)
}

/// `model`'s default draft (made on first use), as the CLI makes it.
fn default_draft_path(model: DefaultModel) -> PathBuf {
    let base = model.path(&cache_dir());
    assert!(
        base.exists(),
        "{model:?} is missing at {}; fetch it with `spechost models fetch`",
        base.display()
    );
    DefaultDraft::of(model)
        .make(&cache_dir(), session_params().threads)
        .expect("the default draft is made from the cached default model")
}

fn draft_config(path: &Path) -> DraftModelConfig {
    let session = session_params();
    DraftModelConfig {
        path: path.to_owned(),
        ctx_size: session.ctx_size,
        threads: session.threads,
        overrides: ModelOverrides::default(),
    }
}

/// The SmolLM2 default draft with contexts of `ctx_size` tokens.
fn small_draft(ctx_size: u32) -> DraftModelHost {
    DraftModelHost::load(
        &DraftModelConfig {
            ctx_size,
            ..draft_config(&smollm2_draft_path())
        },
        &TargetParams::default(),
    )
    .expect("draft loads")
}

/// SmolLM2 and its default draft, checked against it.
fn smollm2_with_its_default_draft() -> (Target, DraftModelHost) {
    with_its_default_draft(DefaultModel::SmolLm2)
}

/// `model` and its default draft, checked against it.
fn with_its_default_draft(model: DefaultModel) -> (Target, DraftModelHost) {
    let target = load(model);
    let draft = DraftModelHost::load_for(
        &target,
        &draft_config(&default_draft_path(model)),
        &TargetParams::default(),
    )
    .expect("the default draft loads");
    (target, draft)
}

fn load_draft(path: &Path) -> DraftModelHost {
    DraftModelHost::load(&draft_config(path), &TargetParams::default()).expect("draft loads")
}

fn prompt(target: &Target, index: usize) -> Vec<Token> {
    let fixtures = fixtures();
    target
        .tokenize_chat(&fixtures[index % fixtures.len()].user_message)
        .expect("chat template")
}

fn tokens(drafted: &[DraftedToken]) -> Vec<Token> {
    drafted.iter().map(|d| d.token).collect()
}

fn fresh(draft: &DraftModelHost, context: &[Token]) -> DraftModelContext {
    let mut fresh = draft.open_context().expect("draft context");
    fresh.feed(context);
    fresh
}

#[test]
fn vocab_check_rejects_gemma_for_smollm2_naming_both_sizes() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let gemma = load_draft(&DefaultModel::Gemma3.path(&cache_dir()));
    let err = check_vocab_compatible(&target, &gemma).expect_err("different tokenizers");
    assert!(
        matches!(err, EngineError::VocabMismatch { .. }),
        "wrong error: {err}"
    );
    let message = err.to_string();
    for needle in [
        "vocabulary size: target 49152, draft 262144",
        "spechost models quantize",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        assert!(message.contains(needle), "`{needle}` not in: {message}");
    }
}

#[test]
fn vocab_check_accepts_the_requantized_target() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let path = smollm2_draft_path();
    let draft = DraftModelHost::load_for(&target, &draft_config(&path), &TargetParams::default())
        .expect("the requantized target shares its tokenizer");
    assert_eq!(draft.vocab_size(), target.vocab_size());
}

#[test]
fn missing_draft_file_is_a_draft_model_error() {
    let config = draft_config(Path::new("/nonexistent/draft.gguf"));
    let err = DraftModelHost::load(&config, &TargetParams::default())
        .err()
        .expect("missing file");
    assert!(
        err.to_string()
            .contains("draft model file /nonexistent/draft.gguf not found"),
        "got {err}"
    );
}

#[test]
fn greedy_proposals_equal_the_draft_models_plain_decoding() {
    let _guard = exclusive();
    let path = smollm2_draft_path();
    let draft = load_draft(&path);
    // The reference: the same file as a target, decoded token by token by the verify loop.
    let reference = Target::load(&path, &TargetParams::default()).expect("draft as a target");
    for index in 0..fixtures().len() {
        let prompt = prompt(&reference, index);
        let plain = generate_tokens(&reference, &prompt, DRAFT_LEN);
        let mut context = fresh(&draft, &prompt);
        let checked = context.host_batch_products();
        let proposed = context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens;
        // The Q4_0 default draft's prompt catch-up is a batch whose products the host computes
        // on such a CPU (unless llama.cpp's AMX buffers hold the weights): the proposals below
        // then compare them with llama.cpp's.
        assert_eq!(
            context.host_batch_products() > checked,
            avx2() && !amx(),
            "fixture {index}: the host computes the draft's Q4_0 products exactly when the CPU has AVX2 and no AMX"
        );
        assert_eq!(
            tokens(&proposed[..plain.len()]),
            plain,
            "fixture {index}: proposals differ from plain decoding at {:?}",
            first_difference(&tokens(&proposed), &plain)
        );
        assert_eq!(proposed.len(), DRAFT_LEN, "p_min 0 never stops early");
        for drafted in &proposed {
            assert!(
                (0.0..=1.0).contains(&drafted.prob) && drafted.prob > 0.0,
                "fixture {index}: probability {} out of range",
                drafted.prob
            );
        }
    }
}

/// The draft model's own greedy continuation of `prompt`, by plain decoding.
fn generate_tokens(target: &Target, prompt: &[Token], max_tokens: usize) -> Vec<Token> {
    let mut session = target.session(&session_params()).expect("session");
    let request =
        spechost::engine::Request::new(prompt.to_vec(), max_tokens, SamplingParams::greedy());
    session
        .generate(&request, &mut Cascade::empty(), &mut |_| {})
        .expect("plain decoding")
        .tokens
}

#[test]
fn proposals_stop_after_the_first_token_below_p_min() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let draft = load_draft(&smollm2_draft_path());
    let mut stopped_early = 0;
    for index in 0..fixtures().len() {
        let prompt = prompt(&target, index);
        let full = fresh(&draft, &prompt)
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens;
        for p_min in [0.3, 0.5, 0.9] {
            let cut = fresh(&draft, &prompt)
                .propose(ProposalSettings::greedy(DRAFT_LEN, p_min))
                .tokens;
            let expected = full
                .iter()
                .position(|d| d.prob < p_min)
                .map_or(full.len(), |first_low| first_low + 1);
            assert_eq!(
                tokens(&cut),
                tokens(&full[..expected]),
                "fixture {index}, p_min {p_min}: {cut:?}"
            );
            assert!(
                cut[..cut.len() - 1].iter().all(|d| d.prob >= p_min),
                "fixture {index}, p_min {p_min}: a token below p_min before the last: {cut:?}"
            );
            stopped_early += usize::from(cut.len() < DRAFT_LEN);
        }
    }
    assert!(
        stopped_early > 0,
        "no proposal ever stopped early; the stop rule was not exercised"
    );
}

#[test]
fn accepted_drafts_fed_back_propose_as_a_fresh_context_would() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let draft = load_draft(&smollm2_draft_path());
    let prompt = prompt(&target, 1);
    let mut reused = fresh(&draft, &prompt);
    let first = tokens(
        &reused
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens,
    );
    // Rounds as the engine plays them: some drafted tokens accepted, then the target's token
    // (here a token the draft did not propose, or the next proposal when all were accepted).
    let mut context = prompt.clone();
    let mut previous = first;
    for n_accepted in [3, 0, DRAFT_LEN, 5] {
        let mut committed = previous[..n_accepted].to_vec();
        let target_token = match previous.get(n_accepted) {
            Some(&rejected) => (rejected + 1) % target.vocab_size(),
            None => previous[0],
        };
        committed.push(target_token);
        reused.feed(&committed);
        context.extend_from_slice(&committed);
        let proposed = reused
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens;
        let expected = fresh(&draft, &context)
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens;
        assert_eq!(
            tokens(&proposed),
            tokens(&expected),
            "after {n_accepted} accepted: the reused cache proposes differently"
        );
        for (reused, fresh) in proposed.iter().zip(&expected) {
            assert!(
                (reused.prob - fresh.prob).abs() < 1e-4,
                "after {n_accepted} accepted: probabilities {} vs {}",
                reused.prob,
                fresh.prob
            );
        }
        previous = tokens(&proposed);
    }
    assert_eq!(reused.context_tokens(), context.as_slice());
}

#[test]
fn reset_forgets_the_context_and_invalid_tokens() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let draft = load_draft(&smollm2_draft_path());
    let (first, second) = (prompt(&target, 0), prompt(&target, 2));
    let mut context = fresh(&draft, &first);
    context.propose(ProposalSettings::greedy(DRAFT_LEN, 0.0));
    context.reset();
    assert!(context.context_tokens().is_empty());
    assert!(
        context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens
            .is_empty(),
        "an empty context drafts nothing"
    );
    context.feed(&second);
    let after_reset = tokens(
        &context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens,
    );
    let expected = tokens(
        &fresh(&draft, &second)
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens,
    );
    assert_eq!(after_reset, expected);

    context.feed(&[target.vocab_size()]);
    assert!(
        context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens
            .is_empty(),
        "a token outside the vocabulary stops proposals"
    );
    context.reset();
    context.feed(&second);
    assert_eq!(
        tokens(
            &context
                .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
                .tokens
        ),
        expected
    );
}

#[test]
fn a_full_context_proposes_nothing_and_a_nearly_full_one_stops_at_its_end() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let draft = small_draft(256);
    let mut context = draft.open_context().expect("context");
    let ctx_size = context.ctx_size() as usize;
    let text: Vec<Token> = prompt(&target, 0)
        .into_iter()
        .cycle()
        .take(ctx_size)
        .collect();
    context.feed(&text[..ctx_size - 2]);
    let near_end = context
        .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
        .tokens;
    assert_eq!(near_end.len(), 2, "two positions left: {near_end:?}");
    context.feed(&text[ctx_size - 2..]);
    assert!(
        context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens
            .is_empty(),
        "the context is full"
    );
    context.feed(&text[..1]);
    assert!(
        context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens
            .is_empty(),
        "past full"
    );
}

#[test]
fn feeding_past_the_context_keeps_no_more_than_a_context_until_reset() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let draft = small_draft(128);
    let mut context = draft.open_context().expect("context");
    let ctx_size = context.ctx_size() as usize;
    let text = prompt(&target, 0);
    // A plugin that feeds request after request without resetting.
    for _ in 0..200 {
        context.feed(&text);
    }
    assert_eq!(
        context.context_tokens().len(),
        ctx_size,
        "the host kept more than a context's worth of fed tokens"
    );
    assert!(
        context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens
            .is_empty(),
        "overflowed"
    );
    context.reset();
    context.feed(&text[..ctx_size / 2]);
    assert!(
        !context
            .propose(ProposalSettings::greedy(DRAFT_LEN, 0.0))
            .tokens
            .is_empty(),
        "a reset starts over"
    );
}

#[test]
fn the_draft_plugin_over_the_default_draft_keeps_greedy_output_identical() {
    let _guard = exclusive();
    let (target, draft) = smollm2_with_its_default_draft();
    let host = plugin_host();
    assert!(
        host.attach_draft_model(Arc::new(draft), None),
        "a fresh host takes a draft model"
    );
    let mut accepted = 0;
    for fixture in fixtures() {
        let plain = generate(
            &target,
            &fixture.user_message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut Cascade::empty(),
        );
        let mut cascade = cascade(&host, &[SourceSpec::Builtin("draft".into())]);
        let spec = generate(
            &target,
            &fixture.user_message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut cascade,
        );
        assert_eq!(
            spec.tokens,
            plain.tokens,
            "{}: the draft cascade changed the output at token {:?}",
            fixture.id,
            first_difference(&spec.tokens, &plain.tokens)
        );
        accepted += spec.stats.accepted;
    }
    assert!(
        accepted > 0,
        "no drafted token was ever accepted: the bridge proposed nothing useful"
    );
}

/// Second choices come with the greedy tokens unchanged, at exactly the positions whose greedy
/// token is less likely than `split_below`, each a different token no likelier than the chosen.
#[test]
fn second_choices_come_where_the_draft_model_is_unsure() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let draft = load_draft(&smollm2_draft_path());
    let split_below = 0.9;
    let mut branched = 0;
    for index in 0..fixtures().len() {
        let prompt = prompt(&target, index);
        let greedy = fresh(&draft, &prompt).propose(ProposalSettings::greedy(DRAFT_LEN, 0.0));
        let with_runners_up = fresh(&draft, &prompt).propose(ProposalSettings {
            split_below,
            ..ProposalSettings::greedy(DRAFT_LEN, 0.0)
        });
        assert_eq!(with_runners_up.tokens, greedy.tokens, "fixture {index}");
        assert!(greedy.runners_up.is_empty(), "none asked, none given");
        assert_eq!(with_runners_up.runners_up.len(), greedy.tokens.len());
        for (chosen, runner_up) in greedy.tokens.iter().zip(&with_runners_up.runners_up) {
            assert_eq!(
                runner_up.is_some(),
                chosen.prob < split_below,
                "fixture {index}: {chosen:?} and {runner_up:?}"
            );
            if let Some(runner_up) = runner_up {
                assert_ne!(runner_up.token, chosen.token);
                assert!(runner_up.prob > 0.0 && runner_up.prob <= chosen.prob);
                assert!(runner_up.prob + chosen.prob <= 1.0 + 1e-5);
                branched += 1;
            }
        }
    }
    assert!(
        branched > 0,
        "the draft model was never unsure below {split_below}"
    );
}

/// The `draft` plugin where the host takes trees: the draft model's second choices branch its
/// proposals, and greedy output stays plain decoding's.
fn draft_plugin_trees_keep_greedy_output_identical(model: DefaultModel) {
    let _guard = exclusive();
    let (target, draft) = with_its_default_draft(model);
    let host = plugin_host();
    assert!(host.attach_draft_model(Arc::new(draft), None));
    let mut plain_session = target.session(&session_params()).expect("session");
    let mut tree_session = target
        .session(&SessionParams {
            tree_leaves: DEFAULT_TREE_LEAVES,
            ..session_params()
        })
        .expect("a session that takes trees");
    let (mut tree_rounds, mut accepted) = (0, 0);
    for fixture in fixtures() {
        let prompt = target.tokenize_chat(&fixture.user_message).expect("chat");
        let mut request = Request::new(prompt, MAX_TOKENS, SamplingParams::greedy());
        let plain = plain_session
            .generate(&request, &mut Cascade::empty(), &mut |_| {})
            .expect("plain decoding");
        request.max_draft_len = 8;
        let mut cascade = cascade_with_settings(
            &host,
            &[SourceSpec::Builtin("draft".into())],
            CascadeSettings {
                mode: CascadeMode::Tree,
                ..CascadeSettings::default()
            },
        );
        let treed = tree_session
            .generate(&request, &mut cascade, &mut |_| {})
            .expect("tree drafts");
        assert_eq!(
            treed.tokens,
            plain.tokens,
            "{}: first difference at {:?}",
            fixture.id,
            first_difference(&treed.tokens, &plain.tokens)
        );
        tree_rounds += treed.stats.tree_rounds;
        accepted += treed.stats.accepted;
    }
    assert!(
        tree_rounds > 0,
        "{model:?}: the draft model's proposals never branched"
    );
    assert!(
        accepted > 0,
        "{model:?}: no drafted token was ever accepted"
    );
}

#[test]
fn the_draft_plugins_trees_keep_greedy_output_identical_on_smollm2() {
    draft_plugin_trees_keep_greedy_output_identical(DefaultModel::SmolLm2);
}

#[test]
fn the_draft_plugins_trees_keep_greedy_output_identical_on_gemma3() {
    draft_plugin_trees_keep_greedy_output_identical(DefaultModel::Gemma3);
}

/// Tokens generated per request in the end-to-end test.
const MAX_TOKENS: usize = 48;

/// A policy that drafts [`RECORDED_DRAFT_LEN`] tokens every round and keeps what it is told.
struct Recorder {
    told: Arc<Mutex<(Vec<PolicySetup>, Vec<RoundRecord>)>>,
}

/// Draft length of every round under [`Recorder`].
const RECORDED_DRAFT_LEN: usize = 4;

impl RoundPolicy for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn begin(&mut self, _facts: &ModelFacts, setup: &PolicySetup) -> Result<(), SourceFault> {
        self.told
            .lock()
            .expect("not poisoned")
            .0
            .push(setup.clone());
        Ok(())
    }

    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault> {
        self.told
            .lock()
            .expect("not poisoned")
            .1
            .push(round.clone());
        Ok(())
    }

    fn decide(&mut self) -> Result<Decision, SourceFault> {
        Ok(Decision {
            max_draft_len: RECORDED_DRAFT_LEN,
            shadow_len: 0,
            order: None,
            exclude: Vec::new(),
        })
    }
}

/// A drafter that always proposes the same token, whatever the context.
struct Constant;

impl DraftModel for Constant {
    fn reset(&mut self) {}

    fn feed(&mut self, _tokens: &[Token]) {}

    fn propose(&mut self, _settings: ProposalSettings) -> Drafted {
        Drafted {
            tokens: vec![DraftedToken {
                token: 0,
                prob: 1.0,
            }],
            ..Drafted::default()
        }
    }
}

/// The draft model's agreement with the target, measured at start-up for the policies: the
/// target's own file drafting for it agrees (nearly) everywhere, its default Q4_0 draft
/// mostly, and a drafter that always proposes one token almost nowhere.
#[test]
fn the_draft_models_agreement_with_the_target_is_measured_on_the_models() {
    let _guard = exclusive();
    let (target, draft) = smollm2_with_its_default_draft();
    let threads = session_params().threads;
    let mut context = draft.open_context().expect("draft context");
    let default_draft = measure_agreement(&target, threads, &mut context).expect("measured");
    assert!(
        context.context_tokens().is_empty(),
        "the measurement leaves the context empty"
    );
    drop((context, draft));
    let itself = load_draft(target.path());
    let mut context = itself.open_context().expect("draft context");
    let same = measure_agreement(&target, threads, &mut context).expect("measured");
    let constant = measure_agreement(&target, threads, &mut Constant).expect("measured");
    assert!(same >= 0.95, "the target drafting for itself: {same}");
    assert!(
        (0.5..=same).contains(&default_draft),
        "the Q4_0 draft: {default_draft}, the target itself: {same}"
    );
    assert!(constant < 0.1, "one token always: {constant}");
}

/// The host measures the draft model on a context like the plugins', and the policy is told
/// the measurement at the start of a request and, each round, how much of the draft source's
/// time went to catching up with the context: the whole prompt at the first ask, no more than
/// the round's committed tokens after it.
#[test]
fn the_policy_is_told_what_the_draft_model_costs_and_how_long_it_caught_up() {
    let _guard = exclusive();
    let (target, draft) = smollm2_with_its_default_draft();
    let mut context = draft.open_context().expect("draft context");
    let costs = measure_draft_model(&mut context, draft.vocab_size(), draft.ctx_size() as usize)
        .expect("the default draft is measured");
    let costs = DraftModelCosts {
        agreement: measure_agreement(&target, session_params().threads, &mut context),
        ..costs
    };
    drop(context);
    assert!(costs.agreement.is_some(), "{costs:?}");
    assert!(
        costs.per_token > Duration::ZERO && costs.catch_up_per_token > Duration::ZERO,
        "{costs:?}"
    );
    assert!(
        costs.catch_up_per_token < costs.per_token,
        "a batch of context tokens costs less per token than drafting one at a time: {costs:?}"
    );
    let host = plugin_host();
    host.attach_draft_model(Arc::new(draft), Some(costs));
    let told = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let mut cascade = cascade(
        &host,
        &[
            SourceSpec::Builtin("lookup".into()),
            SourceSpec::Builtin("draft".into()),
        ],
    )
    .with_policy(Box::new(Recorder {
        told: Arc::clone(&told),
    }));
    let fixture = &fixtures()[0];
    generate(
        &target,
        &fixture.user_message,
        MAX_TOKENS,
        SamplingParams::greedy(),
        RECORDED_DRAFT_LEN,
        &mut cascade,
    );
    let (setups, rounds) = &*told.lock().expect("not poisoned");
    assert_eq!(
        setups[0].draft_model,
        Some(DraftModelSetup {
            sources: vec!["draft".to_owned()],
            costs,
        }),
        "only the source that drafts with the draft model is named"
    );
    assert_eq!(setups[0].max_tokens, MAX_TOKENS, "the request's max_tokens");
    let asks: Vec<&SourceRound> = rounds
        .iter()
        .flat_map(|round| &round.sources)
        .filter(|source| source.source == "draft" && !source.shadow)
        .collect();
    assert!(asks.len() > 1, "the draft model was asked: {rounds:?}");
    let prompt_catch_up = asks[0].catch_up_time;
    assert!(
        prompt_catch_up > Duration::ZERO && prompt_catch_up <= asks[0].draft_time,
        "the first ask caught up with the prompt, within its time: {:?}",
        asks[0]
    );
    for ask in &asks[1..] {
        assert!(
            ask.catch_up_time <= ask.draft_time && ask.catch_up_time < prompt_catch_up,
            "later asks catch up with a round's tokens, not a prompt: {ask:?}"
        );
    }
    assert!(
        rounds
            .iter()
            .flat_map(|round| &round.sources)
            .filter(|source| source.source == "lookup")
            .all(|source| source.catch_up_time == Duration::ZERO),
        "lookup has no draft model to catch up"
    );
}

#[test]
fn cli_missing_draft_model_names_the_flag() {
    let out = spechost(&[
        "run",
        "--draft-model",
        "/nonexistent/d.gguf",
        "--cascade",
        "none",
        "-n",
        "1",
        "--prompt",
        "hi",
    ]);
    assert_fails_with(&out, &["/nonexistent/d.gguf", "not found", "--draft-model"]);
}

#[test]
fn cli_draft_plugin_without_a_draft_model_fails_before_loading_models() {
    common::wasm("draft");
    let out = spechost(&["run", "--cascade", "draft", "-n", "1", "--prompt", "hi"]);
    assert_fails_with(&out, &["`draft`", "add --draft-model auto"]);
}

#[test]
fn cli_mismatched_draft_vocab_names_the_difference_and_the_fix() {
    let _guard = exclusive();
    let out = spechost(&[
        "run",
        "--model",
        "smollm2",
        "--draft-model",
        "gemma3",
        "--cascade",
        "none",
        "-n",
        "1",
        "--prompt",
        "hi",
    ]);
    assert_fails_with(
        &out,
        &[
            "does not use the tokenizer",
            "vocabulary size: target 49152, draft 262144",
            "spechost models quantize",
        ],
    );
}

#[test]
fn cli_auto_draft_loads_next_to_the_default_target() {
    let _guard = exclusive();
    smollm2_draft_path();
    let out = spechost(&[
        "run",
        "--draft-model",
        "auto",
        "--cascade",
        "none",
        "-n",
        "2",
        "--prompt",
        "hi",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cli_quantize_writes_once_per_recipe_and_refuses_bad_paths() {
    let out = spechost(&[
        "models",
        "quantize",
        "--model",
        "/nonexistent/m.gguf",
        "--type",
        "Q4_0",
    ]);
    assert_fails_with(&out, &["/nonexistent/m.gguf", "not a GGUF file"]);
    let smollm2 = DefaultModel::SmolLm2.path(&cache_dir());
    let out = spechost(&[
        "models",
        "quantize",
        "--model",
        "smollm2",
        "--type",
        "Q4_0",
        "--out",
        &smollm2.to_string_lossy(),
    ]);
    assert_fails_with(&out, &["is the input model"]);

    let _guard = exclusive();
    let dir = std::env::temp_dir().join(format!("spechost-quantize-cli-{}", std::process::id()));
    let path = dir.join("draft.gguf");
    let quantize = |embeddings: Option<&str>| {
        let mut args = vec![
            "models".to_owned(),
            "quantize".into(),
            "--model".into(),
            "smollm2".into(),
            "--type".into(),
            "q4_0".into(),
            "--out".into(),
            path.to_string_lossy().into_owned(),
        ];
        if let Some(embeddings) = embeddings {
            args.extend(["--embeddings".into(), embeddings.to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = spechost(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "stderr: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            path.to_string_lossy()
        );
        let size = std::fs::metadata(&path).expect("output written").len();
        (stderr.contains("kept"), size)
    };
    let (kept, small) = quantize(Some("Q4_0"));
    assert!(!kept, "a new output was reported as kept");
    assert_eq!(
        quantize(Some("Q4_0")),
        (true, small),
        "the same recipe again is kept"
    );
    let (kept, large) = quantize(None);
    assert!(!kept, "another recipe must rewrite the output");
    assert!(
        large > small,
        "Q8_0 embeddings ({large} bytes) should be larger than Q4_0 ones ({small} bytes)"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_dequantized_target_verifies_its_own_quantized_copy_exactly_and_accepts_most_of_it() {
    let _guard = exclusive();
    // Self-speculation: SmolLM2's Q4_1 file drafts for its own F16 copy.
    let quantized = DefaultModel::SmolLm2.path(&cache_dir());
    let dequantized = scratch_file("self-speculation", "smollm2.F16.gguf");
    quantize(&QuantizeRequest {
        input: quantized.clone(),
        output: dequantized.clone(),
        quant_type: QuantType::F16,
        embeddings: None,
        threads: session_params().threads,
    })
    .expect("smollm2 dequantizes to F16");
    let target = Target::load(&dequantized, &TargetParams::default()).expect("the F16 copy loads");
    let draft =
        DraftModelHost::load_for(&target, &draft_config(&quantized), &TargetParams::default())
            .expect("the quantized file shares the F16 copy's tokenizer");
    let host = plugin_host();
    assert!(host.attach_draft_model(Arc::new(draft), None));
    let (mut drafted, mut accepted) = (0, 0);
    for fixture in fixtures().iter().take(3) {
        let plain = generate(
            &target,
            &fixture.user_message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut Cascade::empty(),
        );
        let spec = generate(
            &target,
            &fixture.user_message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut cascade(&host, &[SourceSpec::Builtin("draft".into())]),
        );
        assert_eq!(
            spec.tokens,
            plain.tokens,
            "{}: differs from plain decoding at token {:?}",
            fixture.id,
            first_difference(&spec.tokens, &plain.tokens)
        );
        drafted += spec.stats.drafted;
        accepted += spec.stats.accepted;
    }
    std::fs::remove_file(&dequantized).ok();
    assert!(
        drafted > 0 && accepted * 2 > drafted,
        "a model's quantized copy should agree with it most of the time: {accepted} of {drafted} drafted tokens accepted"
    );
}

/// Requests of the distribution test: sampled plainly, and verified by rejection sampling of a
/// skewed drafter's draws; of the draft model's drawn drafts; and of its greedy drafts compared.
const PLAIN_REQUESTS: u32 = 300;
const DRAFT_MODEL_REQUESTS: u32 = 150;
const COMPARED_REQUESTS: u32 = 50;

/// Two-sample chi-square test of homogeneity between two sets of outputs: the statistic and its
/// degrees of freedom, over the outputs seen at least 10 times in both sets together (the rarer
/// ones pooled into one more category).
fn homogeneity(a: &[Vec<Token>], b: &[Vec<Token>]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<&[Token], (f64, f64)> = BTreeMap::new();
    for output in a {
        counts.entry(output).or_default().0 += 1.0;
    }
    for output in b {
        counts.entry(output).or_default().1 += 1.0;
    }
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for &(x, y) in counts.values() {
        if x + y >= 10.0 {
            cells.push((x, y));
        } else {
            pooled = (pooled.0 + x, pooled.1 + y);
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        cells.push(pooled);
    }
    let (n_a, n_b) = (a.len() as f64, b.len() as f64);
    let (scale_a, scale_b) = ((n_b / n_a).sqrt(), (n_a / n_b).sqrt());
    let statistic = cells
        .iter()
        .map(|&(x, y)| (x * scale_a - y * scale_b).powi(2) / (x + y))
        .sum();
    (statistic, cells.len().saturating_sub(1))
}

/// The chi-square value a statistic of `df` degrees of freedom exceeds one time in a thousand
/// (Wilson and Hilferty's approximation).
fn chi_square_critical(df: usize) -> f64 {
    let df = df.max(1) as f64;
    let z = 3.09;
    let term = 2.0 / (9.0 * df);
    df * (1.0 - term + z * term.sqrt()).powi(3)
}

/// Asserts that the tokens at `position` of `outputs` and of `plain` (none for an output that
/// ended before it) pass the homogeneity test, with enough categories for the test to mean
/// something.
fn assert_same_distribution(
    what: &str,
    position: usize,
    outputs: &[Vec<Token>],
    plain: &[Vec<Token>],
) {
    let at = |outputs: &[Vec<Token>]| -> Vec<Vec<Token>> {
        outputs
            .iter()
            .map(|output| output.get(position).copied().into_iter().collect())
            .collect()
    };
    let (statistic, df) = homogeneity(&at(plain), &at(outputs));
    let critical = chi_square_critical(df);
    eprintln!(
        "{what}, token {position}: chi-square {statistic:.1}, {df} degrees of freedom (critical {critical:.1})"
    );
    assert!(
        df >= 3,
        "{what}: token {position} varies too little to test anything ({df} degrees of freedom)"
    );
    assert!(
        statistic < critical,
        "{what}: token {position} differs from plain sampling's: chi-square {statistic:.1} with {df} degrees of freedom (critical {critical:.1})"
    );
}

/// A drafter that drafts only the second output token, drawn from a fixed distribution far
/// from the target's: uniform over `candidates`. Its draws test rejection sampling where most of
/// them are rejected and the residual does the work.
struct Skewed {
    candidates: Vec<Token>,
    prompt_len: usize,
    context_len: usize,
    sampling: Option<DraftSampling>,
    draw: Option<SampledDraft>,
}

impl DraftSource for Skewed {
    fn name(&self) -> &str {
        "skewed"
    }
    fn begin(&mut self, _facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        (self.prompt_len, self.context_len) = (prompt.len(), prompt.len());
        Ok(())
    }
    fn propose(&mut self, _max_draft_len: usize) -> Result<Proposal, SourceFault> {
        let Some(sampling) = self.sampling else {
            return Ok(Proposal::empty());
        };
        if self.context_len != self.prompt_len + 1 {
            return Ok(Proposal::empty());
        }
        let share = 1.0 / self.candidates.len() as f32;
        let pick: f32 = sampling.generator(self.context_len).random();
        let token = self.candidates[((pick / share) as usize).min(self.candidates.len() - 1)];
        self.draw = Some(SampledDraft {
            tokens: vec![token],
            distributions: vec![TokenDistribution {
                probabilities: self.candidates.iter().map(|&t| (t, share)).collect(),
            }],
        });
        Ok(Proposal::from_tokens(vec![token]))
    }
    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        self.context_len += tokens.len();
        Ok(())
    }
    fn sample_drafts(&mut self, sampling: Option<DraftSampling>) {
        self.sampling = sampling;
    }
    fn take_draw(&mut self) -> Option<SampledDraft> {
        self.draw.take()
    }
}

#[test]
fn rejection_sampling_draws_what_plain_sampling_draws() {
    let _guard = exclusive();
    let (target, draft) = smollm2_with_its_default_draft();
    let host = plugin_host();
    host.attach_draft_model(Arc::new(draft), None);
    let mut session = target.session(&common::session_params()).expect("session");
    let message = "Write a list of three random words.";
    let mut run = |cascade: &mut Cascade, seed: u32, draft_acceptance, max_tokens| {
        let sampling = SamplingParams {
            temperature: 1.0,
            top_k: 8,
            seed,
            draft_acceptance,
            ..SamplingParams::greedy()
        };
        generate_in(
            &target,
            &mut session,
            message,
            max_tokens,
            sampling,
            2,
            cascade,
        )
    };
    // The first token comes with the prompt; the next ones are verified drafts and a token
    // the target chose itself.
    let plain: Vec<Vec<Token>> = (0..PLAIN_REQUESTS)
        .map(|seed| run(&mut Cascade::empty(), seed, DraftAcceptance::Rejection, 4).tokens)
        .collect();

    // A drafter far from the target: the three most common second tokens, and one the target
    // never chose there.
    let mut seen: std::collections::BTreeMap<Token, usize> = Default::default();
    for output in &plain {
        if let Some(&second) = output.get(1) {
            *seen.entry(second).or_default() += 1;
        }
    }
    let mut by_count: Vec<(usize, Token)> = seen.iter().map(|(&t, &n)| (n, t)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let never = (20_000..)
        .find(|token| !seen.contains_key(token))
        .expect("a token");
    let mut candidates: Vec<Token> = by_count.iter().take(3).map(|&(_, t)| t).collect();
    candidates.push(never);
    let mut skewed = Cascade::new(
        vec![Box::new(Skewed {
            candidates,
            prompt_len: 0,
            context_len: 0,
            sampling: None,
            draw: None,
        })],
        Default::default(),
    );
    let (mut skewed_outputs, mut skewed_accepted) = (Vec::new(), 0);
    for seed in 0..PLAIN_REQUESTS {
        let outcome = run(&mut skewed, seed, DraftAcceptance::Rejection, 4);
        skewed_accepted += outcome.stats.accepted;
        skewed_outputs.push(outcome.tokens);
    }
    assert!(
        skewed_accepted > 0 && skewed_accepted < u64::from(PLAIN_REQUESTS),
        "the skewed draws are accepted sometimes, not always: {skewed_accepted}"
    );
    assert!(
        skewed_outputs
            .iter()
            .all(|output| output.get(1) != Some(&never)),
        "a drawn token the target gives no probability is never accepted, nor drawn again"
    );
    assert_same_distribution("skewed drafter", 1, &skewed_outputs, &plain);

    // The draft model (the target's own Q4_0), through the `draft` plugin; one cascade for
    // every request, so its context keeps the prompt.
    let mut speculative = cascade(&host, &[SourceSpec::Builtin("draft".into())]);
    let (mut drawn, mut compared) = (Vec::new(), Vec::new());
    let (mut accepted_drawn, mut accepted_compared) = (0, 0);
    for seed in 0..DRAFT_MODEL_REQUESTS {
        let outcome = run(&mut speculative, seed, DraftAcceptance::Rejection, 4);
        drawn.push(outcome.tokens);
        if seed < COMPARED_REQUESTS {
            accepted_drawn += outcome.stats.accepted;
            let outcome = run(&mut speculative, seed, DraftAcceptance::Compare, 4);
            accepted_compared += outcome.stats.accepted;
            compared.push(outcome.tokens);
        }
    }
    assert_eq!(
        compared,
        plain[..COMPARED_REQUESTS as usize],
        "compare keeps plain decoding's output seed for seed"
    );
    assert_eq!(
        run(&mut speculative, 7, DraftAcceptance::Rejection, 4).tokens,
        drawn[7],
        "a seeded request draws the same tokens again"
    );
    for position in [1, 2] {
        assert_same_distribution("draft model", position, &drawn, &plain);
    }
    assert!(
        accepted_drawn > accepted_compared,
        "drawn drafts were accepted {accepted_drawn} times, greedy ones compared {accepted_compared} times"
    );
}
