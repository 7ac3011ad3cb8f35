//! Choosing the target's token at a verified position: greedy or seeded sampling.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use serde::Serialize;

use super::model::from_llama;
use crate::cascade::Token;

/// Sampling settings of a request. `temperature == 0` is greedy decoding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Seed of the random generator; the same seed gives the same output.
    pub seed: u32,
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// Picks the target's token from the logits at one batch position.
///
/// Speculation stays exact because a token is sampled only at positions that are committed:
/// the verify loop stops sampling at the first position whose sample differs from the draft,
/// so the random generator advances exactly once per output token, as in plain decoding.
pub(super) enum TokenSampler {
    /// Arg-max of the logits.
    Greedy,
    /// A llama.cpp sampler chain ending in a seeded draw.
    Seeded(LlamaSampler),
}

impl TokenSampler {
    pub(super) fn new(params: &SamplingParams) -> Self {
        if params.is_greedy() {
            return Self::Greedy;
        }
        let mut chain = Vec::new();
        if params.top_k > 0 {
            chain.push(LlamaSampler::top_k(params.top_k));
        }
        if params.top_p < 1.0 {
            chain.push(LlamaSampler::top_p(params.top_p, 1));
        }
        if params.min_p > 0.0 {
            chain.push(LlamaSampler::min_p(params.min_p, 1));
        }
        chain.push(LlamaSampler::temp(params.temperature));
        chain.push(LlamaSampler::dist(params.seed));
        Self::Seeded(LlamaSampler::chain_simple(chain))
    }

    /// The target's token at batch index `index` (a position whose logits were computed).
    pub(super) fn sample(&mut self, context: &LlamaContext<'_>, index: i32) -> Token {
        match self {
            Self::Greedy => argmax(context.get_logits_ith(index)),
            Self::Seeded(chain) => from_llama(chain.sample(context, index)),
        }
    }
}

/// Index of the largest logit; the first one on ties, so the choice is deterministic.
///
/// Two passes over the vocabulary (a branch-free maximum the compiler vectorises, then a search
/// for its first position) beat one branchy pass: on a 262K-token vocabulary this runs once per
/// verified position and shows up in decode speed.
fn argmax(logits: &[f32]) -> Token {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&logit| logit == max).unwrap_or(0) as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[5.0]), 0);
    }
}
