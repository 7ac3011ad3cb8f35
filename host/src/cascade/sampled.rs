//! Drafts drawn at the request's temperature, for rejection sampling.
//!
//! At temperature, a draft model that *samples* its draft from a distribution `q` it can state
//! lets the verifier accept each drafted token `x` with probability `min(1, p(x) / q(x))` and,
//! on rejection, draw from the residual `max(0, p - q)` (Leviathan et al. 2023, Chen et al.
//! 2023): the output follows exactly the target's distribution `p`, and far more drafted tokens
//! are accepted than by sampling the target and comparing. That holds only if the verified
//! draft is the draw itself, whole, and the decision to verify it was made before it was seen;
//! so a source's draw is its proposal for the round ([`SampledDraft`]), and nothing cuts it
//! after it is drawn (the cascade and the verify step leave such drafts whole).
//!
//! Nothing here names llama.cpp: the draft model's logits come in as a slice.

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use super::draft_model::DraftedToken;
use super::source::Token;

/// Most tokens a drafted position's distribution keeps: the draft model's most likely ones. A
/// draw from fewer tokens than the whole vocabulary is still exact (the verifier uses the
/// distribution the token was drawn from); it costs acceptance only where the draft model
/// spreads its mass thinly, and keeps each position's distribution small.
pub const MAX_DRAFT_SUPPORT: usize = 64;

/// How a draft model draws its tokens at a request's temperature: the request's own sampling
/// settings, and a seed of the draft's own (independent of the target's random generator).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftSampling {
    /// Softmax temperature (positive).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = off; at most [`MAX_DRAFT_SUPPORT`] are
    /// kept either way).
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Seed of the request's draws.
    pub seed: u64,
}

/// The distribution one drafted token was drawn from: the tokens it gives a probability, the
/// rest having none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenDistribution {
    /// `(token, probability)` pairs, most likely first; the probabilities sum to 1.
    pub probabilities: Vec<(Token, f32)>,
}

impl TokenDistribution {
    /// The probability of `token` (0 for a token the distribution does not hold).
    pub fn probability(&self, token: Token) -> f32 {
        self.probabilities
            .iter()
            .find(|&&(held, _)| held == token)
            .map_or(0.0, |&(_, probability)| probability)
    }
}

/// A source's draft drawn from its draft model this round, with the distribution of each
/// token: the round's proposal, verified whole by rejection sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SampledDraft {
    /// The drawn tokens, in order.
    pub tokens: Vec<Token>,
    /// The distribution each token was drawn from, one per token.
    pub distributions: Vec<TokenDistribution>,
}

impl SampledDraft {
    /// The drawn tokens, each with the probability it was drawn with.
    pub fn drafted_tokens(&self) -> impl Iterator<Item = DraftedToken> + '_ {
        self.tokens
            .iter()
            .zip(&self.distributions)
            .map(|(&token, distribution)| DraftedToken {
                token,
                prob: distribution.probability(token),
            })
    }
}

impl DraftSampling {
    /// The random generator of one draw, made from the request's seed and the length of the
    /// context drafted after: each round of a request draws afresh, the same way on every run.
    pub fn generator(&self, context_len: usize) -> Xoshiro256PlusPlus {
        const MIX: u64 = 0x9E37_79B9_7F4A_7C15;
        Xoshiro256PlusPlus::seed_from_u64(self.seed ^ (context_len as u64).wrapping_mul(MIX))
    }

    /// Draws a token from the draft model's `logits` shaped by these settings; returns it with
    /// the distribution it was drawn from. `None` when the logits hold no finite value.
    pub fn draw(
        &self,
        logits: &[f32],
        generator: &mut Xoshiro256PlusPlus,
    ) -> Option<(Token, TokenDistribution)> {
        let distribution = self.shape(logits)?;
        let u: f32 = generator.random();
        let mut left = u;
        let mut chosen = distribution.probabilities[0].0;
        for &(token, probability) in &distribution.probabilities {
            chosen = token;
            if left < probability {
                break;
            }
            left -= probability;
        }
        Some((chosen, distribution))
    }

    /// The distribution these settings give `logits`, in the order of the target's sampler
    /// chain: the most likely tokens (at most [`MAX_DRAFT_SUPPORT`], or `top_k`), `top_p` and
    /// `min_p` on their softmax, then the softmax of what is left at the temperature.
    fn shape(&self, logits: &[f32]) -> Option<TokenDistribution> {
        let keep = match usize::try_from(self.top_k) {
            Ok(top_k) if top_k > 0 => top_k.min(MAX_DRAFT_SUPPORT),
            _ => MAX_DRAFT_SUPPORT,
        };
        let mut best: Vec<(Token, f32)> = Vec::with_capacity(keep + 1);
        for (id, &logit) in logits.iter().enumerate() {
            if !logit.is_finite() || (best.len() == keep && logit <= best[keep - 1].1) {
                continue;
            }
            let at = best.partition_point(|&(_, other)| other >= logit);
            best.insert(at, (id as Token, logit));
            best.truncate(keep);
        }
        let max = best.first()?.1;
        let softmax = |best: &[(Token, f32)], temperature: f32| {
            let mut probabilities: Vec<(Token, f32)> = best
                .iter()
                .map(|&(token, logit)| (token, ((logit - max) / temperature).exp()))
                .collect();
            let total: f32 = probabilities.iter().map(|&(_, p)| p).sum();
            for (_, probability) in &mut probabilities {
                *probability /= total;
            }
            probabilities
        };
        let plain = softmax(&best, 1.0);
        let mut kept = best.len();
        if self.top_p < 1.0 {
            let mut total = 0.0;
            if let Some(last) = plain.iter().position(|&(_, probability)| {
                total += probability;
                total >= self.top_p
            }) {
                kept = last + 1;
            }
        }
        if self.min_p > 0.0 {
            let floor = self.min_p * plain[0].1;
            kept = kept.min(plain.partition_point(|&(_, probability)| probability >= floor));
        }
        best.truncate(kept.max(1));
        let temperature = self.temperature.max(f32::MIN_POSITIVE);
        Some(TokenDistribution {
            probabilities: softmax(&best, temperature),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f32) -> DraftSampling {
        DraftSampling {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 11,
        }
    }

    #[test]
    fn a_draw_follows_the_distribution_it_states() {
        let logits = [2.0f32, 1.0, 0.0, f32::NEG_INFINITY, 1.5];
        let settings = sampling(0.7);
        let mut generator = settings.generator(3);
        let draws = 40_000;
        let mut counts = [0usize; 5];
        let mut stated = TokenDistribution::default();
        for _ in 0..draws {
            let (token, distribution) = settings.draw(&logits, &mut generator).expect("a draw");
            counts[token as usize] += 1;
            stated = distribution;
        }
        assert_eq!(counts[3], 0, "a masked token is never drawn");
        assert_eq!(stated.probability(3), 0.0);
        let total: f32 = stated.probabilities.iter().map(|&(_, p)| p).sum();
        assert!((total - 1.0).abs() < 1e-5);
        for token in [0, 1, 2, 4] {
            let expected = f64::from(stated.probability(token)) * draws as f64;
            let seen = counts[token as usize] as f64;
            // Five standard deviations of a binomial count.
            assert!(
                (seen - expected).abs() < 5.0 * expected.sqrt(),
                "token {token}: {seen} draws, {expected:.0} expected"
            );
        }
    }

    #[test]
    fn settings_shape_the_distribution_like_the_targets_sampler() {
        let logits: Vec<f32> = (0..200).map(|i| -(i as f32) * 0.05).collect();
        let cold = sampling(0.1).shape(&logits).expect("shaped");
        let warm = sampling(2.0).shape(&logits).expect("shaped");
        assert_eq!(cold.probabilities.len(), MAX_DRAFT_SUPPORT);
        assert!(
            cold.probability(0) > warm.probability(0),
            "colder is sharper"
        );
        let top_k = DraftSampling {
            top_k: 3,
            ..sampling(1.0)
        };
        assert_eq!(top_k.shape(&logits).expect("shaped").probabilities.len(), 3);
        let top_p = DraftSampling {
            top_p: 0.2,
            ..sampling(1.0)
        };
        let nucleus = top_p.shape(&logits).expect("shaped");
        assert!(nucleus.probabilities.len() < MAX_DRAFT_SUPPORT);
        let min_p = DraftSampling {
            min_p: 0.5,
            ..sampling(1.0)
        };
        let floor = min_p.shape(&logits).expect("shaped");
        assert!(
            floor
                .probabilities
                .iter()
                .all(|&(_, p)| p >= 0.5 * floor.probabilities[0].1)
        );
        assert_eq!(sampling(1.0).shape(&[f32::NAN, f32::NEG_INFINITY]), None);
    }

    #[test]
    fn each_round_draws_afresh_and_every_run_the_same() {
        let settings = sampling(1.0);
        let first: f64 = settings.generator(10).random();
        assert_eq!(first, settings.generator(10).random::<f64>());
        assert_ne!(first, settings.generator(11).random::<f64>());
    }
}
