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

use common::server::{Server, chat_body, chat_text, post};
use common::*;
use serde_json::json;
use spechost::cascade::{
    Cascade, CascadeSettings, DraftSource, ModelFacts, Proposal, SourceFault, Token,
};
use spechost::engine::{SamplingParams, Target, TargetParams};

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
    let info = spechost(&["info", "--model", arg(&path)]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("architecture  mamba"), "{text}");
    assert!(text.contains("state is saved before each batch"), "{text}");
}
