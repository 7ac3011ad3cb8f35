//! Constrained output: a GBNF grammar (llama.cpp's format, also what a JSON schema becomes)
//! that every generated token must keep the output inside.
//!
//! The target's choice at a position is made under the grammar ([`GrammarState::allows`],
//! [`GrammarState::mask`]), and only committed tokens advance it ([`GrammarState::accept`]), so
//! a verify round constrains each position exactly as plain decoding does: the state a position
//! is checked against is the one after every token before it. A draft is checked against a
//! copy of the state before it is verified ([`GrammarState::allowed_prefix`]), and what the
//! grammar forbids is never decoded.

use std::time::Duration;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use serde::Serialize;

mod repetition;
mod source;

pub(crate) use self::source::{ByteTokens, ChoiceMemory};
pub use self::source::{GRAMMAR_SOURCE, GrammarSource};

use super::model::{from_llama, to_llama};
use crate::cascade::Token;
use crate::placement::thread_cpu_time;

/// The rule generation starts from.
const ROOT: &str = "root";

/// Tokens of the vocabulary a grammar is tried on when it is checked (spread over all of it).
const TIMING_SAMPLE: usize = 1024;

/// Tokens of that sample tried at a time (a grammar far over the limit takes milliseconds per
/// token).
const TIMING_CHUNK: usize = 8;

/// A request's grammar, as GBNF text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Grammar(String);

/// Why a grammar or a schema was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The GBNF text does not parse, or has no `root` rule.
    #[error(
        "the grammar does not parse as GBNF with a `root` rule (llama.cpp's grammar format: grammars/README.md in llama.cpp){0}"
    )]
    Invalid(String),
    /// A rule repeats something that can match nothing, which llama.cpp cannot follow in
    /// reasonable time (see `repetition.rs`).
    #[error(
        "rule `{0}` repeats something that can match nothing (as in (\"a\"* \"b\"?)+ or x+ with x ::= [a-z]?): every empty repetition is another parse to track, which makes each token take seconds; repeat only what matches at least one character, e.g. ([a-z]+ \" \"?)+"
    )]
    NullableRepetition(String),
    /// The JSON schema could not be turned into a grammar.
    #[error("the JSON schema cannot be turned into a grammar: {0}")]
    Schema(String),
    /// Tried on part of the vocabulary at its start, the grammar would take longer than the
    /// limit to check one token.
    #[error(
        "the grammar would take about {estimated_ms} ms to check one token (the limit is {limit_ms} ms): simplify it (fewer alternatives at one point, no rules that match the same text in many ways)"
    )]
    TooSlow {
        /// The estimate, from a sample of the vocabulary.
        estimated_ms: u64,
        /// The limit.
        limit_ms: u64,
    },
}

impl Grammar {
    /// A grammar given as GBNF text (checked when it is opened on a model).
    pub fn gbnf(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The grammar of the JSON documents `schema` accepts, as llama-server converts it.
    pub fn json_schema(schema: &serde_json::Value) -> Result<Self, GrammarError> {
        llama_cpp_2::json_schema_to_grammar(&schema.to_string())
            .map(Self)
            .map_err(|error| GrammarError::Schema(error.to_string()))
    }

    /// The GBNF text.
    pub fn text(&self) -> &str {
        &self.0
    }

    /// Checks that the grammar opens on `model`'s vocabulary and that checking a token at its
    /// start would take at most `limit`: the grammar is tried on a sample of the vocabulary
    /// and one of the tokens it allows is accepted, and the time scaled to the whole
    /// vocabulary. The time is this thread's CPU time, so a busy machine does not make a
    /// grammar look slow. A grammar of thousands of alternatives at one point is refused here,
    /// once the sample alone took `limit`, before any request waits behind it. An estimate over
    /// the limit is measured again and the smaller one kept: the sample's time is scaled up
    /// 50 to 250 times, so a few milliseconds the thread lost to something else (page faults
    /// on memory just freed, its virtual CPU stalled) would refuse a grammar of three words.
    pub(super) fn check(&self, model: &LlamaModel, limit: Duration) -> Result<(), GrammarError> {
        let state = self.open(model)?;
        let vocab = model.n_vocab().max(1) as usize;
        let stride = vocab.div_ceil(TIMING_SAMPLE);
        let sample: Vec<LlamaTokenData> = (0..vocab)
            .step_by(stride)
            .map(|id| LlamaTokenData::new(LlamaToken(id as i32), 0.0, 0.0))
            .collect();
        within_limit(limit, || {
            state.duplicate().time_per_token(&sample, stride, limit)
        })
        .map_err(|estimate| GrammarError::TooSlow {
            estimated_ms: estimate.as_millis() as u64,
            limit_ms: limit.as_millis() as u64,
        })
    }

    /// The grammar's state at the start of generation, on `model`'s vocabulary.
    pub(super) fn open(&self, model: &LlamaModel) -> Result<GrammarState, GrammarError> {
        let has_root = self
            .0
            .lines()
            .any(|line| line.trim_start().starts_with(ROOT) && line.contains("::="));
        if !has_root {
            return Err(GrammarError::Invalid(
                ": it has no `root ::= ...` rule".into(),
            ));
        }
        if let Some(rule) = repetition::nullable_repetition(&self.0) {
            return Err(GrammarError::NullableRepetition(rule));
        }
        LlamaSampler::grammar(model, &self.0, ROOT)
            .map(|sampler| GrammarState {
                sampler,
                probe: LlamaTokenDataArray::new(Vec::with_capacity(1), false),
            })
            .map_err(|_| GrammarError::Invalid(String::new()))
    }
}

/// Whether checking a token takes at most `limit`, as `measure` estimates it: an estimate over
/// the limit is measured again, and the smaller of the two kept (see [`Grammar::check`]),
/// except when the sample alone ran past the limit. The estimate kept when it is over.
fn within_limit(limit: Duration, mut measure: impl FnMut() -> TokenTime) -> Result<(), Duration> {
    let first = match measure() {
        TokenTime::Estimated(estimate) if estimate <= limit => return Ok(()),
        TokenTime::Estimated(estimate) => estimate,
        TokenTime::SampleOverLimit(estimate) => return Err(estimate),
    };
    match measure() {
        TokenTime::Estimated(again) if again <= limit => Ok(()),
        TokenTime::Estimated(again) | TokenTime::SampleOverLimit(again) => Err(first.min(again)),
    }
}

/// What checking one token at a grammar's start takes, from a sample of the vocabulary.
#[derive(Debug, Clone, Copy)]
enum TokenTime {
    /// The sample's time scaled to the whole vocabulary.
    Estimated(Duration),
    /// The sample alone took longer than the limit: its part tried so far, scaled.
    SampleOverLimit(Duration),
}

/// Where generation stands in a grammar: which tokens may come next.
pub(super) struct GrammarState {
    sampler: LlamaSampler,
    /// A one-candidate array, kept to check single tokens without allocating.
    probe: LlamaTokenDataArray,
}

impl GrammarState {
    /// Whether the grammar allows `token` next.
    pub(super) fn allows(&mut self, token: Token) -> bool {
        self.probe.data.clear();
        self.probe
            .data
            .push(LlamaTokenData::new(to_llama(token), 0.0, 0.0));
        self.probe.selected = None;
        self.probe.sorted = false;
        self.probe.apply_sampler(&mut self.sampler);
        self.probe.data[0].logit() > f32::NEG_INFINITY
    }

    /// An independent copy of the state, to walk ahead without moving this one.
    pub(super) fn duplicate(&self) -> Self {
        Self {
            sampler: self.sampler.clone(),
            probe: LlamaTokenDataArray::new(Vec::with_capacity(1), false),
        }
    }

    /// The CPU time of checking one token of the whole vocabulary here: masking `sample`
    /// (every `stride`-th token of the vocabulary) in chunks, scaled by `stride`, then
    /// accepting one token it allows (which moves this state); cut short once masking took
    /// `limit`.
    fn time_per_token(
        &mut self,
        sample: &[LlamaTokenData],
        stride: usize,
        limit: Duration,
    ) -> TokenTime {
        let vocab = sample.len() * stride;
        let (mut masking, mut allowed) = (Duration::ZERO, None);
        for (tried, chunk) in sample.chunks(TIMING_CHUNK).enumerate() {
            let mut candidates = LlamaTokenDataArray::new(chunk.to_vec(), false);
            let started = thread_cpu_time();
            self.mask(&mut candidates);
            masking += thread_cpu_time().saturating_sub(started);
            allowed = allowed.or_else(|| {
                candidates
                    .data
                    .iter()
                    .find(|candidate| candidate.logit() > f32::NEG_INFINITY)
                    .map(LlamaTokenData::id)
            });
            if masking > limit {
                let tried = (tried + 1) * TIMING_CHUNK;
                return TokenTime::SampleOverLimit(masking * (vocab / tried) as u32);
            }
        }
        let started = thread_cpu_time();
        if let Some(allowed) = allowed {
            self.accept(from_llama(allowed));
        }
        TokenTime::Estimated(masking * stride as u32 + thread_cpu_time().saturating_sub(started))
    }

    /// Sets the logit of every token the grammar forbids next to `-inf`.
    pub(super) fn mask(&mut self, candidates: &mut LlamaTokenDataArray) {
        candidates.apply_sampler(&mut self.sampler);
    }

    /// Advances the grammar past `token`, which it allowed.
    pub(super) fn accept(&mut self, token: Token) {
        // A token the grammar did not allow leaves the state as it was; the caller only
        // accepts allowed tokens, so there is nothing to report.
        let _ = self.sampler.try_accept(to_llama(token));
    }

    /// How many of `draft`'s first tokens the grammar allows in a row from here (the state
    /// itself is left as it is), checking no further once `enough` says so.
    pub(super) fn allowed_prefix(
        &mut self,
        draft: &[Token],
        mut enough: impl FnMut() -> bool,
    ) -> usize {
        if draft.is_empty() {
            return 0;
        }
        let mut ahead = self.duplicate();
        for (index, &token) in draft.iter().enumerate() {
            if enough() || !ahead.allows(token) {
                return index;
            }
            ahead.accept(token);
        }
        draft.len()
    }
}

/// Picks the token the grammar allows among `candidates` (the vocabulary with its logits) by
/// arg-max, after masking the rest: greedy decoding under a grammar.
pub(super) fn masked_argmax(
    grammar: &mut GrammarState,
    candidates: &mut LlamaTokenDataArray,
) -> Token {
    grammar.mask(candidates);
    let mut best: Option<&LlamaTokenData> = None;
    for candidate in &candidates.data {
        if best.is_none_or(|best| candidate.logit() > best.logit()) {
            best = Some(candidate);
        }
    }
    best.map_or(0, |best| from_llama(best.id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_schema_grammars_pass_the_repetition_check() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                "extra": {"type": "object", "additionalProperties": {"type": "number"}}
            },
            "required": ["name"]
        });
        for schema in [
            schema,
            serde_json::json!({}),
            serde_json::json!({"type": "object"}),
        ] {
            let grammar = Grammar::json_schema(&schema).expect("converts");
            assert_eq!(
                repetition::nullable_repetition(grammar.text()),
                None,
                "{}",
                grammar.text()
            );
        }
    }

    /// `within_limit` fed the estimates `times` in turn; how many it measured.
    fn judged(times: &[TokenTime]) -> (Result<(), Duration>, usize) {
        let mut measured = 0;
        let verdict = within_limit(Duration::from_millis(100), || {
            measured += 1;
            times[measured - 1]
        });
        (verdict, measured)
    }

    #[test]
    fn an_estimate_over_the_limit_is_measured_again_and_the_smaller_one_kept() {
        let ms = Duration::from_millis;
        use TokenTime::{Estimated, SampleOverLimit};
        assert_eq!(judged(&[Estimated(ms(90))]), (Ok(()), 1));
        // A pass slowed by something else: the second one decides.
        assert_eq!(
            judged(&[Estimated(ms(900)), Estimated(ms(40))]),
            (Ok(()), 2)
        );
        assert_eq!(
            judged(&[Estimated(ms(900)), Estimated(ms(300))]),
            (Err(ms(300)), 2)
        );
        assert_eq!(
            judged(&[Estimated(ms(300)), SampleOverLimit(ms(5000))]),
            (Err(ms(300)), 2)
        );
        // Far over: the sample alone took the limit, and is not tried again.
        assert_eq!(judged(&[SampleOverLimit(ms(5000))]), (Err(ms(5000)), 1));
    }
}
