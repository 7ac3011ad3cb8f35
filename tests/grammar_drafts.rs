//! The grammar source (issue 26): a request with a grammar drafts what the grammar makes
//! certain or likely (a schema's keys and punctuation, the model's own choices where it was
//! before), on both default models, and the output stays the target's: greedy and seeded, with
//! the source and without it, and across a cascade swap that restarts the source mid-answer.

mod common;

use common::*;
use serde_json::Value;
use spechost::cascade::{Cascade, CascadeSettings};
use spechost::engine::{GRAMMAR_SOURCE, Grammar, Outcome, Request, RoundDecision, SamplingParams};
use spechost::models::DefaultModel;
use spechost::plugins::SourceSpec;

/// Requests of the JSON workload decoded per model: enough for the source to learn the model's
/// choices on the first and draft them on the rest.
const REQUESTS: usize = 6;

const MAX_TOKENS: usize = 96;

/// The first [`REQUESTS`] lines of `examples/workloads/extract-json.jsonl`: each user message
/// with its schema's grammar.
fn extract_json() -> Vec<(String, Grammar)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/workloads/extract-json.jsonl");
    let text = std::fs::read_to_string(&path).expect("the JSON workload");
    text.lines()
        .take(REQUESTS)
        .map(|line| {
            let request: Value = serde_json::from_str(line).expect("a JSON line");
            let message = request["messages"][0]["content"]
                .as_str()
                .expect("a user message")
                .to_owned();
            let grammar = Grammar::json_schema(&request["json_schema"]).expect("a schema");
            (message, grammar)
        })
        .collect()
}

fn lookup() -> [SourceSpec; 1] {
    [SourceSpec::Builtin("lookup".into())]
}

/// The grammar source's accepted tokens in `outcome`, if it drafted at all.
fn grammar_accepted(outcome: &Outcome) -> Option<u64> {
    outcome
        .stats
        .sources
        .iter()
        .find(|source| source.name == GRAMMAR_SOURCE)
        .map(|source| source.accepted)
}

fn the_grammar_source_drafts_and_keeps_outputs(model: DefaultModel) {
    let _guard = exclusive();
    let target = load(model);
    let host = plugin_host();
    let mut session = target.session(&session_params()).expect("session");
    let mut with_source = cascade(&host, &lookup());
    let mut without_source = cascade_with_settings(
        &host,
        &lookup(),
        CascadeSettings {
            grammar_drafts: false,
            ..CascadeSettings::default()
        },
    );
    let mut accepted = 0;
    for (index, (message, grammar)) in extract_json().into_iter().enumerate() {
        let sampling = SamplingParams {
            grammar: Some(grammar),
            ..if index % 3 == 2 {
                SamplingParams {
                    temperature: 0.8,
                    seed: index as u32,
                    ..SamplingParams::greedy()
                }
            } else {
                SamplingParams::greedy()
            }
        };
        let mut decode = |cascade: &mut Cascade| {
            generate_in(
                &target,
                &mut session,
                &message,
                MAX_TOKENS,
                sampling.clone(),
                16,
                cascade,
            )
        };
        let plain = decode(&mut Cascade::empty());
        let drafted = decode(&mut with_source);
        let undrafted = decode(&mut without_source);
        for (outcome, what) in [(&drafted, "with"), (&undrafted, "without")] {
            assert_eq!(
                outcome.tokens,
                plain.tokens,
                "{} request {index} {what} the grammar source: differs from plain decoding at token {:?}\nplain: {:?}\nspec:  {:?}",
                model.alias(),
                first_difference(&outcome.tokens, &plain.tokens),
                plain.text,
                outcome.text
            );
        }
        assert_eq!(
            grammar_accepted(&plain),
            None,
            "plain decoding drafts nothing"
        );
        assert_eq!(
            grammar_accepted(&undrafted),
            None,
            "the source was turned off"
        );
        accepted += grammar_accepted(&drafted).expect("the grammar source joined the cascade");
    }
    assert!(
        accepted > 0,
        "{}: the grammar source never had a draft accepted; the identity check proved nothing",
        model.alias()
    );
}

#[test]
fn smollm2_grammar_source_drafts_and_keeps_outputs() {
    the_grammar_source_drafts_and_keeps_outputs(DefaultModel::SmolLm2);
}

#[test]
fn gemma3_grammar_source_drafts_and_keeps_outputs() {
    the_grammar_source_drafts_and_keeps_outputs(DefaultModel::Gemma3);
}

#[test]
fn a_swapped_cascade_restarts_the_grammar_source_where_the_output_stands() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let host = plugin_host();
    let mut session = target.session(&session_params()).expect("session");
    let (message, grammar) = extract_json().swap_remove(0);
    let sampling = SamplingParams {
        grammar: Some(grammar),
        ..SamplingParams::greedy()
    };
    let prompt = target.tokenize_chat(&message).expect("chat template");
    let request = Request::new(prompt, MAX_TOKENS, sampling);
    let plain = session
        .generate(&request, &mut Cascade::empty(), &mut |_| {})
        .expect("plain decoding");
    // Twice: the second time, the source drafts from what it learnt the first time.
    for pass in 0..2 {
        let mut rounds = 0;
        let swapped = session
            .generate_controlled(&request, &mut Cascade::empty(), &mut |_| {}, &mut || {
                rounds += 1;
                if rounds % 4 == 1 {
                    RoundDecision::Replace(cascade(&host, &lookup()))
                } else {
                    RoundDecision::Continue
                }
            })
            .expect("generation succeeds");
        assert_eq!(
            swapped.tokens,
            plain.tokens,
            "pass {pass}: differs at token {:?}",
            first_difference(&swapped.tokens, &plain.tokens)
        );
        if pass == 1 {
            assert!(
                grammar_accepted(&swapped).is_some_and(|accepted| accepted > 0),
                "the restarted grammar sources drafted nothing accepted: {:?}",
                swapped.stats.sources
            );
        }
    }
}
