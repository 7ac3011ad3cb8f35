//! Several sequences in one context (a server's batch): each sequence's tokens are exactly what
//! it decodes alone, whatever the rest of its batch holds, on both default models, their batched
//! products computed by the host's kernels (on x86 with AVX2). Needs the models (`spechost models fetch smollm2 gemma3`).

mod common;

use common::*;
use spechost::cascade::Token;
use spechost::engine::{
    BatchLayout, Batcher, BatcherSettings, Request, RoundDecision, RoundDraft, SamplingParams,
    SeqId, Session, SessionParams, Target, VerifyCurve,
};
use spechost::models::DefaultModel;
use spechost::plugins::SourceSpec;

/// Tokens each sequence generates.
const MAX_TOKENS: usize = 40;

/// The plain (one token per round) greedy output of `prompt`, decoded alone.
fn alone(target: &Target, prompt: &[Token]) -> Vec<Token> {
    let mut session = target.session(&session_params()).expect("session");
    let mut cascade = spechost::cascade::Cascade::new(Vec::new(), Default::default());
    let request =
        spechost::engine::Request::new(prompt.to_vec(), MAX_TOKENS, SamplingParams::greedy());
    session
        .generate(&request, &mut cascade, &mut |_| {})
        .expect("generation succeeds")
        .tokens
}

/// A draft of `len` tokens after position `at` of `output`, wrong at `wrong` (if inside it), so
/// that rounds accept some tokens and roll the rest back.
fn draft(output: &[Token], at: usize, len: usize, wrong: usize, vocab: u32) -> Vec<Token> {
    output
        .iter()
        .skip(at + 1)
        .take(len)
        .enumerate()
        .map(|(i, &token)| {
            if i == wrong {
                (token + 1) % vocab
            } else {
                token
            }
        })
        .collect()
}

/// Decodes every fixture prompt in its own sequence of one session, all verifying in each
/// batch together with drafts of different lengths that are wrong at different places, laid
/// out as `layout` says, and checks every sequence's tokens against its output alone; then the
/// start-up check again, after the cache held and dropped rejected rows (and padding) of every
/// sequence. With `cut`, each step's drafts are first cut as a server's are
/// ([`Session::cut_drafts`], by a compute-bound cost curve), so the target verifies prefixes of
/// them.
fn batched_sequences_decode_as_alone(target: &Target, model: &str, layout: BatchLayout, cut: bool) {
    let prompts: Vec<Vec<Token>> = fixtures()
        .iter()
        .take(3)
        .map(|fixture| {
            target
                .tokenize_chat(&fixture.user_message)
                .expect("template")
        })
        .collect();
    let expected: Vec<Vec<Token>> = prompts.iter().map(|p| alone(target, p)).collect();
    let mut session: Session<'_> = target
        .session(&SessionParams {
            sequences: prompts.len(),
            layout,
            ..session_params()
        })
        .expect("a session of several sequences");
    if cut {
        // 0.73 ms per pass plus 0.27 ms per row, as SmolLM2 Q8_0 on 2 cores.
        let pass = |n: u32| std::time::Duration::from_micros(730 + 270 * u64::from(n));
        session.set_verify_curve(VerifyCurve::new(vec![(0, (1..=8).map(pass).collect())]));
    }
    let mut cut_rounds = 0;
    let vocab = target.vocab_size();
    // Position of each sequence's last committed token in its output.
    let mut at = vec![0usize; prompts.len()];
    for (index, prompt) in prompts.iter().enumerate() {
        let seq = SeqId(index as u32);
        session
            .begin(seq, &SamplingParams::greedy(), 0)
            .expect("begin");
        let chunks: Vec<&[Token]> = prompt.chunks(session.batch_size()).collect();
        let mut first = None;
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            first = session
                .prefill_chunk(seq, chunk, i * session.batch_size(), last)
                .expect("prefill");
        }
        let (first, _) = first.expect("the last chunk gives a token");
        assert_eq!(
            first, expected[index][0],
            "{model} sequence {index}: first token"
        );
    }
    let mut round = 0;
    loop {
        let mut rounds: Vec<(SeqId, RoundDraft)> = (0..prompts.len())
            .filter(|&index| at[index] + 1 < expected[index].len())
            .map(|index| {
                let output = &expected[index];
                // Lengths 0..=6 and a wrong token at varying places, different per sequence;
                // the round's own token must still be inside the output alone.
                let remaining = output.len() - at[index] - 1;
                let len = ((round + 2 * index) % 7).min(remaining - 1);
                let wrong = (round + index) % 4;
                let tokens = draft(output, at[index], len, wrong, vocab);
                let round_draft = RoundDraft {
                    last: output[at[index]],
                    max_draft_len: tokens.len(),
                    survival: (1..=tokens.len() as i32).map(|i| 0.7f64.powi(i)).collect(),
                    tokens,
                    parents: Vec::new(),
                    n_past: prompts[index].len() + at[index],
                    distributions: Vec::new(),
                };
                (SeqId(index as u32), round_draft)
            })
            .collect();
        if rounds.is_empty() {
            break;
        }
        if cut {
            let proposed: Vec<usize> = rounds.iter().map(|(_, r)| r.tokens.len()).collect();
            session.cut_drafts(&mut rounds);
            cut_rounds += rounds
                .iter()
                .zip(&proposed)
                .filter(|((_, r), len)| r.tokens.len() < **len)
                .count();
        }
        let batch: Vec<(SeqId, &RoundDraft)> = rounds.iter().map(|(s, r)| (*s, r)).collect();
        for ((seq, round_draft), result) in rounds.iter().zip(session.verify_batch(&batch)) {
            let index = seq.0 as usize;
            let verified = result.expect("verify");
            assert_eq!(verified.batch.sequences, rounds.len());
            assert_eq!(verified.drafted, round_draft.tokens.len());
            let from = at[index] + 1;
            let want = &expected[index][from..from + verified.tokens.len()];
            assert_eq!(
                verified.tokens, want,
                "{model} sequence {index}, round {round} (draft {:?}): its tokens depend on the rest of the batch",
                round_draft.tokens
            );
            at[index] += verified.tokens.len();
        }
        round += 1;
    }
    for index in 0..prompts.len() {
        session.end(SeqId(index as u32));
    }
    assert_eq!(
        cut_rounds > 0,
        cut,
        "{model}: {cut_rounds} rounds cut; cutting was {cut}"
    );
    session
        .check_batch_invariance()
        .unwrap_or_else(|difference| panic!("{model}: after use, a batch of several sequences differs from one-by-one decoding: {difference}"));
}

/// [`batched_sequences_decode_as_alone`] on a default model.
fn on_default_model(model: DefaultModel, layout: BatchLayout, cut: bool) {
    let _guard = exclusive();
    batched_sequences_decode_as_alone(&load(model), &format!("{model:?}"), layout, cut);
}

/// [`batched_sequences_decode_as_alone`] on a generated recurrent (Mamba) model, whose
/// sequences roll back by restoring the state saved before each batch and decoding the
/// accepted tokens again (`engine/recurrent.rs`).
fn on_recurrent_model(layout: BatchLayout) {
    let path = generated_model("mamba", &[], "mamba.gguf");
    let _guard = exclusive();
    let target = Target::load(&path, &spechost::engine::TargetParams::default()).expect("loads");
    assert!(target.is_recurrent());
    batched_sequences_decode_as_alone(&target, "mamba", layout, false);
}

#[test]
fn recurrent_batched_sequences_decode_as_alone() {
    on_recurrent_model(BatchLayout::Split);
}

#[test]
fn recurrent_padded_batches_decode_as_alone() {
    on_recurrent_model(BatchLayout::Padded);
}

/// Requests through a batcher's sequence, one after the other, that start with what the
/// sequence's cache holds: the next turn of a conversation (the first prompt and its answer,
/// then more), a prompt sharing only part of the first, the first again (all but its last token
/// kept). Each keeps that prefix instead of reading it again, drafted by `lookup` so that rounds
/// accept and roll back drafts, and each output is exactly its plain output alone.
fn kept_prompt_prefixes_decode_as_alone(model: DefaultModel) {
    let _guard = exclusive();
    let target = load(model);
    let fixtures = fixtures();
    let chat = |index: usize| {
        target
            .tokenize_chat(&fixtures[index].user_message)
            .expect("template")
    };
    let first = chat(0);
    let answer = alone(&target, &first);
    let next_turn: Vec<Token> = [
        first.as_slice(),
        &answer,
        &target.tokenize_raw("\nSay it again in other words."),
    ]
    .concat();
    let part_shared: Vec<Token> = [&first[..first.len() / 2], chat(1).as_slice()].concat();
    let prompts = [first.clone(), next_turn, part_shared, first];
    let expected: Vec<Vec<Token>> = prompts.iter().map(|p| alone(&target, p)).collect();
    let session = target
        .session(&SessionParams {
            sequences: 1,
            ..session_params()
        })
        .expect("session");
    let (batcher, mut sequences) =
        Batcher::new(session, None, BatcherSettings { prefill_chunk: 16 });
    let host = plugin_host();
    let mut sequence = sequences.pop().expect("one sequence");
    // The batcher decodes on this thread (it holds the session), the requests run on another,
    // as in a server; it stops once the sequence is dropped.
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let mut held: Vec<Token> = Vec::new();
            for (index, (prompt, want)) in prompts.iter().zip(&expected).enumerate() {
                let mut lookup = cascade(&host, &[SourceSpec::Builtin("lookup".into())]);
                let request = Request::new(prompt.clone(), MAX_TOKENS, SamplingParams::greedy());
                let outcome = sequence
                    .generate_controlled(&request, &mut lookup, &mut |_| {}, &mut || {
                        RoundDecision::Continue
                    })
                    .expect("generation succeeds");
                assert_eq!(
                    first_difference(&outcome.tokens, want),
                    None,
                    "{model:?} request {index}: a kept prompt prefix changed the output"
                );
                // The cache holds the previous prompt and all of its output but the last token
                // (never decoded); every request after the first starts with some of it.
                let shared = held
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count()
                    .min(prompt.len() - 1);
                assert_eq!(
                    (outcome.stats.cached_prompt_tokens, index == 0),
                    (shared, shared == 0),
                    "{model:?} request {index}: prompt tokens kept from the cache"
                );
                held = [prompt.as_slice(), &want[..want.len() - 1]].concat();
                if index == 1 {
                    assert!(
                        outcome.stats.accepted > 0,
                        "{model:?}: lookup drafted nothing on the next turn, so no accepted draft was kept: {:?}",
                        outcome.stats
                    );
                }
            }
            drop(sequence);
        });
        batcher.run();
    });
}

#[test]
fn smollm2_kept_prompt_prefixes_decode_as_alone() {
    kept_prompt_prefixes_decode_as_alone(DefaultModel::SmolLm2);
}

#[test]
fn gemma3_kept_prompt_prefixes_decode_as_alone() {
    kept_prompt_prefixes_decode_as_alone(DefaultModel::Gemma3);
}

#[test]
fn smollm2_batched_sequences_decode_as_alone() {
    on_default_model(DefaultModel::SmolLm2, BatchLayout::Split, false);
}

#[test]
fn smollm2_padded_batches_decode_as_alone() {
    on_default_model(DefaultModel::SmolLm2, BatchLayout::Padded, false);
}

#[test]
fn smollm2_cut_drafts_decode_as_alone() {
    on_default_model(DefaultModel::SmolLm2, BatchLayout::Auto, true);
}

#[test]
fn gemma3_batched_sequences_decode_as_alone() {
    on_default_model(DefaultModel::Gemma3, BatchLayout::Split, false);
}

#[test]
fn gemma3_padded_batches_decode_as_alone() {
    on_default_model(DefaultModel::Gemma3, BatchLayout::Padded, false);
}

#[test]
fn gemma3_cut_drafts_decode_as_alone() {
    on_default_model(DefaultModel::Gemma3, BatchLayout::Auto, true);
}
