//! Draft-length policies and cascade modes on a real model: whatever a policy decides and
//! however the cascade picks drafts, greedy output equals plain decoding token for token.

mod common;

use std::collections::BTreeMap;

use common::*;
use spechost::cascade::{Cascade, CascadeMode, CascadeSettings};
use spechost::config::{SourceSpec, parse_policy};
use spechost::engine::{SamplingParams, Target};
use spechost::models::DefaultModel;
use spechost::plugins::{BUILTIN_POLICIES, PluginHost};
use spechost::run::build_cascade;

const MAX_TOKENS: usize = 64;
const DRAFT_MAX: usize = 16;

/// `lookup,suffix` with `policy` (a `--policy` spec) in `mode`.
fn cascade_with(host: &PluginHost, target: &Target, policy: &str, mode: CascadeMode) -> Cascade {
    let plugins = ["lookup", "suffix"]
        .map(|name| {
            host.load(&SourceSpec::Builtin(name.into()))
                .unwrap_or_else(|e| {
                    panic!("{e:#}; build the plugins with scripts/build-plugins.sh")
                })
        })
        .to_vec();
    let spec = parse_policy(policy).expect("valid policy spec");
    let loaded = host
        .load_policy(&spec.plugin)
        .unwrap_or_else(|e| panic!("{e:#}; build the plugins with scripts/build-plugins.sh"));
    let facts = target.facts(session_params().ctx_size);
    let settings = CascadeSettings {
        mode,
        ..CascadeSettings::default()
    };
    build_cascade(
        &plugins,
        &BTreeMap::new(),
        &facts,
        settings,
        Some((&loaded, spec.config.as_str())),
        DRAFT_MAX,
    )
    .expect("cascade builds")
}

#[test]
fn every_policy_in_both_modes_is_token_identical_to_plain() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let host = plugin_host();
    let fixtures = fixtures();
    let plain: Vec<_> = fixtures
        .iter()
        .map(|fixture| {
            generate(
                &target,
                &fixture.user_message,
                MAX_TOKENS,
                SamplingParams::greedy(),
                DRAFT_MAX,
                &mut Cascade::empty(),
            )
        })
        .collect();
    for policy in BUILTIN_POLICIES {
        for mode in [CascadeMode::First, CascadeMode::Scored] {
            let mut cascade = cascade_with(&host, &target, policy, mode);
            let mut accepted = 0;
            for (fixture, plain) in fixtures.iter().zip(&plain) {
                let spec = generate(
                    &target,
                    &fixture.user_message,
                    MAX_TOKENS,
                    SamplingParams::greedy(),
                    DRAFT_MAX,
                    &mut cascade,
                );
                assert_eq!(
                    spec.tokens,
                    plain.tokens,
                    "policy {policy}, mode {}: {} differs from plain decoding at token {:?}",
                    mode.as_str(),
                    fixture.id,
                    first_difference(&spec.tokens, &plain.tokens)
                );
                accepted += spec.stats.accepted;
            }
            assert!(
                accepted > 0,
                "policy {policy}, mode {}: nothing was ever accepted; the check proved nothing",
                mode.as_str()
            );
        }
    }
}

#[test]
fn fixed_policy_bounds_every_draft() {
    let _guard = exclusive();
    let target = load(DefaultModel::SmolLm2);
    let host = plugin_host();
    let fixture = &fixtures()[0];
    for k in [0, 2] {
        let mut cascade = cascade_with(&host, &target, &format!("fixed,k={k}"), CascadeMode::First);
        let outcome = generate(
            &target,
            &fixture.user_message,
            MAX_TOKENS,
            SamplingParams::greedy(),
            DRAFT_MAX,
            &mut cascade,
        );
        let stats = &outcome.stats;
        assert!(
            stats.drafted <= k * stats.draft_rounds,
            "fixed,k={k}: drafted {} tokens in {} draft rounds",
            stats.drafted,
            stats.draft_rounds
        );
        if k == 0 {
            assert_eq!(stats.draft_rounds, 0, "k=0 is plain decoding");
        } else {
            assert!(stats.draft_rounds > 0, "k={k} drafted nothing: {stats:?}");
        }
    }
}

#[test]
fn a_rejected_policy_setting_is_a_startup_error_naming_the_policy() {
    let target = load(DefaultModel::SmolLm2);
    let host = plugin_host();
    let spec = parse_policy("window,colour=red").expect("well-formed spec");
    let loaded = host.load_policy(&spec.plugin).expect("window loads");
    let facts = target.facts(session_params().ctx_size);
    let error = build_cascade(
        &[],
        &BTreeMap::new(),
        &facts,
        CascadeSettings::default(),
        Some((&loaded, spec.config.as_str())),
        DRAFT_MAX,
    )
    .err()
    .expect("rejected");
    let message = format!("{error:#}");
    assert!(
        message.contains("window") && message.contains("colour"),
        "message: {message}"
    );
}

#[test]
fn a_drafter_in_the_policy_slot_is_refused_with_the_fix() {
    let host = plugin_host();
    let error = host
        .load_policy(&SourceSpec::Path(wasm_dir().join("lookup.wasm")))
        .expect_err("lookup is a drafter");
    let message = error.to_string();
    assert!(
        message.contains("policy-api") && message.contains("--policy"),
        "message: {message}"
    );
}
