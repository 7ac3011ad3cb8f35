//! Speculation on a recurrent target (issue 30): a generated Mamba model (llama.cpp's `mamba`
//! architecture, random weights, SmolLM2's tokenizer; scripts/make-test-model.py), whose state
//! cannot be rolled back with `seq_rm`. The context saves each sequence's state before a verify
//! batch, and a draft cut short restores it and decodes the accepted tokens again
//! (`engine/recurrent.rs`). Drafts accepted whole, cut short at every position and rejected
//! outright must all leave the output exactly that of plain decoding, greedy and seeded; a
//! server with several sequences answers as plain decoding does. Several sequences' rounds cut
//! short in one batch are tests/batching.rs's `recurrent_*` tests.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::server::{Server, chat_body, chat_text, metrics, plain_answers, post};
use common::*;
use serde_json::json;
use spechost::cascade::{
    Cascade, CascadeSettings, DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token,
};
use spechost::engine::{SamplingParams, Target, TargetParams};
use spechost::plugins::SourceSpec;

const PROMPT: &str = "Tell me about the sea.";
const MAX_TOKENS: usize = 64;

fn mamba() -> PathBuf {
    generated_model("mamba", &[], "mamba.gguf")
}

/// Proposes the known output from where the context stands, wrong from a position that moves
/// each round: round `r` keeps `r % 6` tokens right (so some drafts are accepted whole, some cut
/// at each position, some rejected at once), then one wrong token, then the truth again.
struct Oracle {
    truth: Vec<Token>,
    prompt_len: usize,
    fed: usize,
    round: usize,
    vocab_size: u32,
}

impl DraftSource for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }

    fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        self.prompt_len = prompt.len();
        self.fed = prompt.len();
        self.vocab_size = facts.vocab_size;
        Ok(())
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        let at = self.fed - self.prompt_len;
        let mut tokens: Vec<Token> = self
            .truth
            .iter()
            .skip(at)
            .take(max_draft_len)
            .copied()
            .collect();
        let right = self.round % 6;
        if let Some(token) = tokens.get_mut(right) {
            *token = (*token + 1) % self.vocab_size;
        }
        self.round += 1;
        Ok(Proposal::from_tokens(tokens))
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        self.fed += tokens.len();
        Ok(())
    }
}

/// The output, and the draft tokens drafted, accepted and replayed.
fn generate(
    target: &Target,
    sampling: SamplingParams,
    truth: Option<&[Token]>,
) -> (Vec<Token>, usize, usize, usize) {
    let mut cascade = match truth {
        Some(truth) => Cascade::new(
            vec![Box::new(Oracle {
                truth: truth.to_vec(),
                prompt_len: 0,
                fed: 0,
                round: 0,
                vocab_size: 0,
            })],
            CascadeSettings::default(),
        ),
        None => Cascade::empty(),
    };
    let outcome = common::generate(target, PROMPT, MAX_TOKENS, sampling, 6, &mut cascade);
    (
        outcome.tokens,
        outcome.stats.drafted as usize,
        outcome.stats.accepted as usize,
        outcome.stats.replayed_tokens as usize,
    )
}

#[test]
fn drafts_on_a_recurrent_target_keep_plain_decodings_output() {
    let path = mamba();
    let _guard = exclusive();
    let target = Target::load(&path, &TargetParams::default()).expect("the Mamba model loads");
    assert!(
        target.is_recurrent(),
        "llama.cpp runs the test model as recurrent"
    );

    let (plain, _, _, replayed) = generate(&target, SamplingParams::greedy(), None);
    assert_eq!(plain.len(), MAX_TOKENS);
    assert_eq!(replayed, 0, "plain decoding replays nothing");
    let (drafted_output, drafted, accepted, replayed) =
        generate(&target, SamplingParams::greedy(), Some(&plain));
    assert_eq!(
        first_difference(&drafted_output, &plain),
        None,
        "greedy output changed by drafts on a recurrent target"
    );
    assert!(
        accepted > 0 && accepted < drafted,
        "drafted {drafted}, accepted {accepted}"
    );
    // Every cut round decodes its kept tokens (the accepted ones and the round's `last`) again.
    assert!(
        replayed > accepted,
        "replayed {replayed} tokens for {accepted} accepted in cut rounds"
    );

    let seeded = SamplingParams {
        temperature: 0.8,
        seed: 42,
        ..SamplingParams::greedy()
    };
    let (plain_seeded, ..) = generate(&target, seeded.clone(), None);
    let (drafted_seeded, _, accepted, _) = generate(&target, seeded, Some(&plain_seeded));
    assert_eq!(
        first_difference(&drafted_seeded, &plain_seeded),
        None,
        "seeded sampling changed by drafts on a recurrent target"
    );
    assert!(accepted > 0, "the seeded oracle had nothing accepted");
}

#[test]
fn a_server_on_a_recurrent_target_answers_as_plain_decoding() {
    let path = mamba();
    let _guard = exclusive();
    let server = Server::start_with_model(arg(&path), &["--parallel", "2", "--accept-any-model"]);
    // `suffix` learns each answer and proposes it again (accepted whole); two clients at once
    // share verify batches. Rounds cut short on several sequences are tests/batching.rs's.
    let serve = |prompt: &str| {
        let ask = |cascade: &str| {
            let body = chat_body(prompt, 48, json!({"speculative": {"cascade": cascade}}));
            let answer = post(&server, "/v1/chat/completions", &body);
            let drafted = answer.body["speculative"]["drafted"].as_u64().unwrap_or(0);
            assert!(
                answer.body["speculative"]["replayed_tokens"].is_u64(),
                "{}",
                answer.body
            );
            (chat_text(&answer), drafted)
        };
        let (plain, _) = ask("none");
        assert_eq!(ask("suffix").0, plain, "prompt {prompt:?}");
        let (again, drafted) = ask("lookup,suffix");
        assert_eq!(again, plain, "prompt {prompt:?}");
        drafted
    };
    let drafted = std::thread::scope(|scope| {
        let first = scope.spawn(|| serve(PROMPT));
        let second = scope.spawn(|| serve("Write a list of colours."));
        first.join().expect("client") + second.join().expect("client")
    });
    assert!(
        drafted > 0,
        "suffix drafted nothing from the answers it saw"
    );
    let page = metrics(&server);
    assert!(page.contains("spechost_replayed_tokens_total"), "{page}");
    let info = spechost(&["info", "--model", arg(&path)]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("architecture  mamba"), "{text}");
    assert!(text.contains("state is saved before each batch"), "{text}");
}

/// Prompts that end alike and start differently: the generated model's answer depends most on
/// the last tokens, so answers to later prompts start as earlier ones did and then part, and
/// `suffix` (which learns every answer) drafts them, accepted up to where they part.
fn prompts() -> Vec<String> {
    let openings = [
        "",
        "Please answer. ",
        "Briefly: ",
        "One more question. ",
        "In a few words, ",
        "Thanks! ",
    ];
    let questions = [
        PROMPT,
        "Write a list of colours.",
        "What is the capital of France?",
    ];
    openings
        .iter()
        .flat_map(|opening| questions.iter().map(move |q| format!("{opening}{q}")))
        .collect()
}

/// A source that counts the rounds in which the target accepted part of its draft, not all.
struct CountingPartial {
    inner: Box<dyn DraftSource>,
    proposed: usize,
    partial: Arc<AtomicUsize>,
}

impl DraftSource for CountingPartial {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        self.inner.begin(facts, prompt)
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        let proposal = self.inner.propose(max_draft_len)?;
        self.proposed = proposal.tokens.len();
        Ok(proposal)
    }

    fn feedback(&mut self, feedback: Feedback) -> Result<(), SourceFault> {
        if feedback.won && feedback.n_accepted > 0 && (feedback.n_accepted as usize) < self.proposed
        {
            self.partial.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.feedback(feedback)
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        self.inner.feed(tokens)
    }

    fn end(&mut self) {
        self.inner.end();
    }
}

#[test]
fn lookup_and_suffix_on_a_recurrent_target_keep_plain_decodings_output() {
    let path = mamba();
    let _guard = exclusive();
    let target = Target::load(&path, &TargetParams::default()).expect("the Mamba model loads");
    let host = plugin_host();
    let builtin = |name: &str| SourceSpec::Builtin(name.into());
    // One cascade for every prompt: `suffix` keeps what it learned across requests.
    let partial = Arc::new(AtomicUsize::new(0));
    let sources = ["lookup", "suffix"].map(|name| {
        let plugin = host.load(&builtin(name)).expect("built-in plugin loads");
        Box::new(CountingPartial {
            inner: Box::new(plugin.source(String::new())),
            proposed: 0,
            partial: Arc::clone(&partial),
        }) as Box<dyn DraftSource>
    });
    let mut speculating = Cascade::new(sources.into(), CascadeSettings::default());
    let (mut drafted, mut accepted, mut replayed) = (0, 0, 0);
    for prompt in prompts() {
        let plain = common::generate(
            &target,
            &prompt,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut Cascade::empty(),
        );
        let outcome = common::generate(
            &target,
            &prompt,
            MAX_TOKENS,
            SamplingParams::greedy(),
            8,
            &mut speculating,
        );
        assert_eq!(
            first_difference(&outcome.tokens, &plain.tokens),
            None,
            "lookup,suffix changed the greedy output of {prompt:?}"
        );
        drafted += outcome.stats.drafted;
        accepted += outcome.stats.accepted;
        replayed += outcome.stats.replayed_tokens;
    }
    assert!(
        accepted > 0 && accepted < drafted,
        "drafted {drafted}, accepted {accepted}"
    );
    let partial = partial.load(Ordering::Relaxed);
    assert!(
        partial > 0 && replayed > 0,
        "{partial} rounds accepted part of their draft, {replayed} tokens replayed"
    );
}

#[test]
fn a_recurrent_draft_model_keeps_plain_decodings_output() {
    let target = mamba();
    let draft = scratch_file("generated", "mamba-q4_0.gguf");
    if !draft.exists() {
        let out = spechost(&[
            "models",
            "quantize",
            "--model",
            arg(&target),
            "--type",
            "Q4_0",
            "--out",
            arg(&draft),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _guard = exclusive();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            arg(&target),
            "--max-tokens",
            "64",
            "--prompt",
            PROMPT,
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = spechost(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "spechost run failed: {stderr}");
        let report: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("last stderr line is the JSON report ({e}): {stderr}"));
        (String::from_utf8_lossy(&out.stdout).into_owned(), report)
    };
    let (plain, _) = run(&["--cascade", "none"]);
    // The Q4_0 copy agrees with its original on some tokens only: drafts are cut at every
    // place, and the draft model's own state goes back to before its drafting each round.
    let (drafted, report) = run(&[
        "--draft-model",
        arg(&draft),
        "--cascade",
        "draft",
        "--plugin-config",
        "draft.p_min=0",
        "--policy",
        "fixed",
        "--draft-max",
        "4",
    ]);
    assert_eq!(drafted, plain, "a recurrent draft model changed the output");
    let stats = &report["stats"];
    let (n_drafted, n_accepted) = (
        stats["drafted"].as_u64().unwrap_or(0),
        stats["accepted"].as_u64().unwrap_or(0),
    );
    assert!(
        n_accepted > 0 && n_accepted < n_drafted,
        "drafted {n_drafted}, accepted {n_accepted}: {report}"
    );
    assert!(
        stats["replayed_tokens"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );

    // A server drafts for both slots in one draft context (a sequence each, drafted together).
    let server = Server::start_with_model(
        arg(&target),
        &[
            "--parallel",
            "2",
            "--accept-any-model",
            "--draft-model",
            arg(&draft),
            "--plugin-config",
            "draft.p_min=0",
        ],
    );
    let prompts: Vec<String> = prompts().into_iter().take(4).collect();
    let plain = plain_answers(&server, &prompts, 48);
    let speculative =
        json!({"speculative": {"cascade": "draft", "policy": "fixed", "draft_max": 4}});
    let drafted: u64 = std::thread::scope(|scope| {
        let clients: Vec<_> = [0, 1]
            .into_iter()
            .map(|client| {
                let (server, prompts, plain, speculative) =
                    (&server, &prompts, &plain, &speculative);
                scope.spawn(move || {
                    let mut drafted = 0;
                    for index in (client..prompts.len()).step_by(2) {
                        let body = chat_body(&prompts[index], 48, speculative.clone());
                        let answer = post(server, "/v1/chat/completions", &body);
                        assert_eq!(chat_text(&answer), plain[index], "prompt {index}");
                        drafted += answer.body["speculative"]["drafted"].as_u64().unwrap_or(0);
                    }
                    drafted
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|client| client.join().expect("client"))
            .sum()
    });
    assert!(drafted > 0, "the draft model drafted nothing in the server");
}
