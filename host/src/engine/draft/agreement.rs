//! How often the draft model's most likely next token is the target's, measured at start-up
//! so that a policy can expect an acceptance of the draft model before its first ask (WIT
//! `draft-model-costs.agreement`).
//!
//! Both models read the same built-in chat exchange (teacher-forced: each position's context is
//! the text, not either model's output): the target in one batch with logits at every position,
//! in a small context of its own; the draft model token by token through a context of the
//! plugins' kind, greedily proposing one token after each prefix. The share of the answer's
//! tokens at which the two greedy tokens agree is the top-1 agreement, which is what a greedy
//! draft token's acceptance is on contexts like the text. It takes one target batch and one
//! draft-model decode per answer token.

use crate::cascade::{DraftModel, ProposalSettings, Token};
use crate::engine::{SessionParams, Target};

/// The question of the built-in exchange.
const QUESTION: &str = "What does a hash map do, and when should I use one? Show a short example.";

/// The answer of the built-in exchange: prose and code, as chat answers mix them.
const ANSWER: &str = "A hash map stores key-value pairs and finds the value for a key in \
constant time on average. It hashes each key to pick a bucket, so looking up, inserting and \
removing an entry do not depend on how many entries the map holds. Use one when you need to \
find items by a key, count occurrences, or remove duplicates.\n\n\
```python\ncounts = {}\nfor word in text.split():\n    counts[word] = counts.get(word, 0) + 1\n\
print(counts)\n```\n\n\
This counts how often each word appears in `text`. Keys must be hashable, and the order of \
the entries is the order in which they were first inserted.";

/// Measures the top-1 agreement of `model` (a fresh context of the draft model, as a plugin
/// instance gets it; left empty) with `target`, whose context for it computes on `threads`
/// threads. `None`, with a warning, when either model fails; policies then start from their
/// own prior.
pub fn measure_agreement(
    target: &Target,
    threads: usize,
    model: &mut dyn DraftModel,
) -> Option<f32> {
    let (prompt, answer) = exchange(target);
    match agreement(target, threads, model, &prompt, &answer) {
        Ok(agreement) => {
            tracing::info!(
                agreement,
                tokens = answer.len(),
                "measured the draft model's agreement with the target"
            );
            Some(agreement)
        }
        Err(reason) => {
            tracing::warn!(%reason, "cannot measure the draft model's agreement with the target; policies start from their own prior");
            None
        }
    }
}

/// The exchange's prompt (the question in the chat template, or as raw text where the target
/// has no template) and its answer, in the target's tokens.
fn exchange(target: &Target) -> (Vec<Token>, Vec<Token>) {
    let prompt = if target.has_chat_template() {
        target.tokenize_chat(QUESTION).ok()
    } else {
        None
    }
    .unwrap_or_else(|| target.tokenize_raw(&format!("Q: {QUESTION}\nA:")));
    let answer = target.tokenize_text(&format!(" {ANSWER}"));
    (prompt, answer)
}

fn agreement(
    target: &Target,
    threads: usize,
    model: &mut dyn DraftModel,
    prompt: &[Token],
    answer: &[Token],
) -> Result<f32, String> {
    if prompt.is_empty() || answer.is_empty() {
        return Err("the built-in text tokenizes to nothing".into());
    }
    let text: Vec<Token> = prompt.iter().chain(answer).copied().collect();
    let target_next = target_next_tokens(target, threads, &text)?;
    model.reset();
    model.feed(prompt);
    let mut agreed = 0usize;
    for (index, &token) in answer.iter().enumerate() {
        let drafted = model.propose(ProposalSettings::greedy(1, 0.0));
        let Some(first) = drafted.tokens.first() else {
            model.reset();
            return Err("the draft model drafted nothing".into());
        };
        // The target's token after the same prefix: the prompt and the answer's first `index`.
        if first.token == target_next[prompt.len() - 1 + index] {
            agreed += 1;
        }
        model.feed(&[token]);
    }
    model.reset();
    Ok(agreed as f32 / answer.len() as f32)
}

/// The target's greedy next token after every prefix of `text`, from a context just large
/// enough for it.
fn target_next_tokens(
    target: &Target,
    threads: usize,
    text: &[Token],
) -> Result<Vec<Token>, String> {
    let len = u32::try_from(text.len()).map_err(|_| "the built-in text is too long")?;
    let mut session = target
        .session(&SessionParams {
            ctx_size: len + 1,
            batch_size: len,
            threads,
            max_draft_len: 1,
            ..SessionParams::default()
        })
        .map_err(|e| e.to_string())?;
    session.greedy_next_tokens(text).map_err(|e| e.to_string())
}
