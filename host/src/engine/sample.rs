//! Choosing the target's token at a verified position (greedy or seeded sampling, under the
//! request's grammar if it has one; a drawn draft token accepted by rejection sampling), and
//! reporting its log-probability when asked.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use std::time::Duration;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use super::error::EngineError;
use super::grammar::{Grammar, GrammarError, GrammarState, masked_argmax};
use super::model::{from_llama, to_llama};
use crate::cascade::{DraftSampling, Token, TokenDistribution};
use crate::placement::thread_cpu_time;

/// Temperatures below this are greedy decoding, as in vLLM (`_SAMPLING_EPS`): dividing logits
/// by a smaller temperature overflows `f32` (1e-37 turns every logit into ±inf and the draw
/// into garbage), and the distribution it stands for is already the arg-max.
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// Most alternatives a request may ask to see at each position (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Most time a request's grammar may take to check one token (its draft's included). A grammar
/// whose alternatives can match the same text in many ways (`("a"* "a"*)*`) makes llama.cpp
/// track a number of parses that grows with every token, and sampling runs on the thread that
/// verifies every request's rounds: past this, the request fails, naming its grammar, rather
/// than stall the others. A JSON schema's grammar takes about a millisecond per token, but a pass
/// over the whole vocabulary (when the model's own choice is not allowed) takes up to a few
/// hundred milliseconds on Gemma 3's 262K tokens. Measured in the thread's CPU time, so a busy
/// machine does not fail a request.
pub const MAX_GRAMMAR_TIME_PER_TOKEN: Duration = Duration::from_secs(1);

/// How a sampled request verifies draft tokens that were drawn from a distribution the drafter
/// states (the draft model's, at the request's temperature).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum DraftAcceptance {
    /// Leviathan/Chen rejection sampling: the draft model draws its tokens at the request's
    /// temperature, the target accepts each with probability `min(1, p/q)` and draws from
    /// the residual `max(0, p - q)` at the first rejection. Exactly the target's distribution,
    /// and more accepted tokens.
    #[default]
    Rejection,
    /// Every draft is chosen greedily, and the target's own draw must equal each token: the
    /// same output as plain decoding with the same seed, fewer accepted tokens.
    Compare,
}

/// How a request's tokens are chosen and reported: sampling settings as in llama.cpp's
/// `common_params_sampling`. A `temperature` below [`MIN_TEMPERATURE`] (0 included) is greedy
/// decoding.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SamplingParams {
    /// Softmax temperature; below [`MIN_TEMPERATURE`] (0 included) picks the most likely token.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Seed of the random generator; the same seed gives the same output.
    pub seed: u32,
    /// Every token must keep the output inside this grammar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<Grammar>,
    /// Report each generated token's log-probability with this many of the most likely
    /// tokens at its position (at most [`MAX_TOP_LOGPROBS`]); `None` reports nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<usize>,
    /// How drafts drawn at the temperature are verified (sampled requests without a grammar).
    pub draft_acceptance: DraftAcceptance,
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
            grammar: None,
            top_logprobs: None,
            draft_acceptance: DraftAcceptance::default(),
        }
    }

    /// These settings for the `index`-th request of a set sampled from one seed: its seed is
    /// this seed plus `index` (wrapping), so requests differ from each other and a set is
    /// sampled the same way every time (`spechost bench`).
    pub fn for_request(&self, index: usize) -> Self {
        Self {
            seed: self.seed.wrapping_add(index as u32),
            ..self.clone()
        }
    }

    /// Whether this is greedy decoding: a temperature below [`MIN_TEMPERATURE`].
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }

    /// How a draft model draws the drafts of this request, when they are verified by
    /// rejection sampling: a sampled request without a grammar (under a grammar the target's
    /// token is drawn twice when its first draw is not allowed, a distribution with no
    /// closed form to accept against) whose [`DraftAcceptance`] is `Rejection`. The draft's
    /// seed is the request's, in a generator of its own.
    pub fn draft_sampling(&self) -> Option<DraftSampling> {
        let rejection = !self.is_greedy()
            && self.grammar.is_none()
            && self.draft_acceptance == DraftAcceptance::Rejection;
        rejection.then(|| DraftSampling {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: u64::from(self.seed) ^ DRAFT_SEED_MIX,
        })
    }
}

/// Separates the random streams a request's seed starts: the draft model's draws and the
/// verifier's acceptance draws, each a generator of its own.
const DRAFT_SEED_MIX: u64 = 0xD4AF_7000_0000_0000;
const ACCEPTANCE_SEED_MIX: u64 = 0xACCE_9700_0000_0000;

/// A generated token's log-probability under the target's distribution at its position (the
/// softmax of the raw logits, before temperature, truncation or grammar, as llama-server and
/// OpenAI report it), and the most likely tokens there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// The token generated.
    pub token: Token,
    /// Its natural log-probability.
    pub logprob: f32,
    /// The most likely tokens at the position and their log-probabilities, most likely first
    /// (ties by token id), as many as the request asked for.
    pub top: Vec<(Token, f32)>,
}

impl TokenLogprob {
    /// `token`'s log-probability under the softmax of `logits`, with the `top` most likely.
    pub fn at(logits: &[f32], token: Token, top: usize) -> Self {
        let max = max_logit(logits);
        let log_total = sum_exp_below(logits, max).ln() + max;
        let logprob = |id: usize| logits[id] - log_total;
        let mut best: Vec<usize> = Vec::with_capacity(top + 1);
        if top > 0 {
            for (id, &logit) in logits.iter().enumerate() {
                if best.len() == top && logit <= logits[best[top - 1]] {
                    continue;
                }
                let at = best.partition_point(|&other| logits[other] >= logit);
                best.insert(at, id);
                best.truncate(top);
            }
        }
        Self {
            token,
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |_| logprob(token as usize)),
            top: best
                .into_iter()
                .map(|id| (id as Token, logprob(id)))
                .collect(),
        }
    }
}

/// Picks the target's token from the logits at one batch position.
///
/// Speculation stays exact because a token is sampled only at positions that are committed:
/// the verify loop stops sampling at the first position whose sample differs from the draft,
/// so the random generator and the grammar advance exactly once per output token, as in plain
/// decoding. A drawn draft token is instead accepted or replaced by rejection sampling
/// ([`Self::settle_drawn`]), with a generator of its own.
pub(super) struct TokenSampler {
    draw: Draw,
    /// For drawn drafts: the request's sampler chain without its draw (the target's
    /// distribution), and the generator of the acceptance draws.
    rejection: Option<Rejection>,
    grammar: Option<GrammarState>,
    /// Alternatives to report per token; `None`: no log-probabilities.
    top_logprobs: Option<usize>,
    /// Log-probabilities of the tokens sampled since they were last taken.
    logprobs: Vec<TokenLogprob>,
    /// The candidate array a draw or a grammar works on (kept to reuse its allocation, a
    /// vocabulary's worth per sampled token).
    candidates: LlamaTokenDataArray,
    /// The grammar's work since the last sampled token (checking a draft included).
    grammar_time: Duration,
}

/// What rejection sampling needs of a request.
struct Rejection {
    /// The request's truncations and temperature; the softmax of what they leave is the
    /// distribution its draw samples.
    shape: LlamaSampler,
    generator: Xoshiro256PlusPlus,
    /// The target's distribution at the position being settled, `(token, weight)` over the
    /// candidates the shape kept, unnormalised (kept to reuse its allocation).
    target: Vec<(Token, f64)>,
}

/// How the token is drawn.
enum Draw {
    /// Arg-max of the logits.
    Greedy,
    /// A llama.cpp sampler chain ending in a seeded draw.
    Seeded(LlamaSampler),
}

impl TokenSampler {
    /// A sampler for `params`, its grammar (if any) opened on `model`'s vocabulary.
    pub(super) fn new(params: &SamplingParams, model: &LlamaModel) -> Result<Self, GrammarError> {
        let grammar = params
            .grammar
            .as_ref()
            .map(|grammar| grammar.open(model))
            .transpose()?;
        Ok(Self::with_grammar(params, grammar))
    }

    fn with_grammar(params: &SamplingParams, grammar: Option<GrammarState>) -> Self {
        let shape = || {
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
            chain
        };
        let draw = if params.is_greedy() {
            Draw::Greedy
        } else {
            let mut chain = shape();
            chain.push(LlamaSampler::dist(params.seed));
            Draw::Seeded(LlamaSampler::chain_simple(chain))
        };
        let rejection =
            (grammar.is_none() && params.draft_sampling().is_some()).then(|| Rejection {
                shape: LlamaSampler::chain_simple(shape()),
                generator: Xoshiro256PlusPlus::seed_from_u64(
                    u64::from(params.seed) ^ ACCEPTANCE_SEED_MIX,
                ),
                target: Vec::new(),
            });
        Self {
            draw,
            rejection,
            grammar,
            top_logprobs: params.top_logprobs.map(|top| top.min(MAX_TOP_LOGPROBS)),
            logprobs: Vec::new(),
            candidates: LlamaTokenDataArray::new(Vec::new(), false),
            grammar_time: Duration::ZERO,
        }
    }

    /// The target's token for the logits of one position. The seeded draw is
    /// `llama_sampler_sample`'s: every token as a candidate, the chain applied, the selected
    /// token accepted. Under a grammar, the token chosen without it is kept when the grammar
    /// allows it, and otherwise chosen again among the allowed tokens only, as llama.cpp's
    /// `common_sampler_sample` does: greedy, that is the arg-max of the allowed tokens; seeded,
    /// a second draw from the allowed ones.
    ///
    /// Fails when the grammar took longer than [`MAX_GRAMMAR_TIME_PER_TOKEN`] for this token.
    pub(super) fn sample(&mut self, logits: &[f32]) -> Result<Token, EngineError> {
        let started = thread_cpu_time();
        let token = match &mut self.draw {
            Draw::Greedy => {
                let token = argmax(logits);
                if let Some(grammar) = self.grammar.as_mut()
                    && !grammar.allows(token)
                {
                    fill(&mut self.candidates, logits);
                    masked_argmax(grammar, &mut self.candidates)
                } else {
                    token
                }
            }
            Draw::Seeded(chain) => {
                let draw = |chain: &mut LlamaSampler,
                            candidates: &mut LlamaTokenDataArray,
                            grammar: Option<&mut GrammarState>| {
                    fill(candidates, logits);
                    if let Some(grammar) = grammar {
                        grammar.mask(candidates);
                    }
                    candidates.apply_sampler(chain);
                    let token = candidates
                        .selected_token()
                        .expect("a sampler chain ending in a draw selects a token");
                    chain.accept(token);
                    from_llama(token)
                };
                let token = draw(chain, &mut self.candidates, None);
                if let Some(grammar) = self.grammar.as_mut()
                    && !grammar.allows(token)
                {
                    draw(chain, &mut self.candidates, Some(grammar))
                } else {
                    token
                }
            }
        };
        if let Some(grammar) = &mut self.grammar {
            grammar.accept(token);
            let took =
                std::mem::take(&mut self.grammar_time) + thread_cpu_time().saturating_sub(started);
            if took > MAX_GRAMMAR_TIME_PER_TOKEN {
                return Err(EngineError::GrammarTooSlow {
                    took_ms: took.as_millis() as u64,
                });
            }
        }
        self.record_logprob(logits, token);
        Ok(token)
    }

    /// The target's token at a position whose draft token `drafted` was drawn from
    /// `distribution`: `drafted` itself with probability `min(1, p(drafted) / q(drafted))`,
    /// where `p` is the distribution the request's draw samples at these logits and `q` is
    /// `distribution`; otherwise a token drawn from the residual `max(0, p - q)`, normalised
    /// (never `drafted`). Either way the token follows `p` exactly, given that `drafted` was
    /// drawn from `q` independently of this sampler's generators. A request that does not
    /// verify by rejection (greedy, a grammar, `compare`) samples and compares instead, as
    /// [`Self::sample`] does.
    pub(super) fn settle_drawn(
        &mut self,
        logits: &[f32],
        drafted: Token,
        distribution: &TokenDistribution,
    ) -> Result<Token, EngineError> {
        let Some(rejection) = &mut self.rejection else {
            return self.sample(logits);
        };
        fill(&mut self.candidates, logits);
        self.candidates.apply_sampler(&mut rejection.shape);
        let token = rejection.settle(&self.candidates, drafted, distribution);
        if let Draw::Seeded(chain) = &mut self.draw {
            chain.accept(to_llama(token));
        }
        self.record_logprob(logits, token);
        Ok(token)
    }

    fn record_logprob(&mut self, logits: &[f32], token: Token) {
        if let Some(top) = self.top_logprobs {
            self.logprobs.push(TokenLogprob::at(logits, token, top));
        }
    }

    /// How many of `draft`'s first tokens the grammar allows from here (all of them without
    /// a grammar). The check stops, cutting the draft there, once the grammar has taken
    /// [`MAX_GRAMMAR_TIME_PER_TOKEN`]: the next sample then fails.
    pub(super) fn allowed_prefix(&mut self, draft: &[Token]) -> usize {
        let Some(grammar) = &mut self.grammar else {
            return draft.len();
        };
        let started = thread_cpu_time();
        let allowed = grammar.allowed_prefix(draft, || {
            thread_cpu_time().saturating_sub(started) > MAX_GRAMMAR_TIME_PER_TOKEN
        });
        self.grammar_time += thread_cpu_time().saturating_sub(started);
        allowed
    }

    /// The log-probabilities of the tokens sampled since the last call (none unless the
    /// request asked for them).
    pub(super) fn take_logprobs(&mut self) -> Vec<TokenLogprob> {
        std::mem::take(&mut self.logprobs)
    }
}

impl Rejection {
    /// Accepts `drafted` or draws from the residual (see [`TokenSampler::settle_drawn`]);
    /// `candidates` are the target's, shaped.
    fn settle(
        &mut self,
        candidates: &LlamaTokenDataArray,
        drafted: Token,
        distribution: &TokenDistribution,
    ) -> Token {
        let max = candidates
            .data
            .iter()
            .map(LlamaTokenData::logit)
            .fold(f32::NEG_INFINITY, f32::max);
        self.target.clear();
        self.target.extend(candidates.data.iter().map(|candidate| {
            let weight = f64::from(candidate.logit() - max).exp();
            (from_llama(candidate.id()), weight)
        }));
        let total: f64 = self.target.iter().map(|&(_, weight)| weight).sum();
        let p_drafted = self
            .target
            .iter()
            .find(|&&(token, _)| token == drafted)
            .map_or(0.0, |&(_, weight)| weight / total);
        let q_drafted = f64::from(distribution.probability(drafted));
        let u: f64 = self.generator.random();
        if q_drafted > 0.0 && u * q_drafted < p_drafted {
            return drafted;
        }
        let mut q_by_token: Vec<(Token, f64)> = distribution
            .probabilities
            .iter()
            .map(|&(token, q)| (token, f64::from(q)))
            .collect();
        q_by_token.sort_unstable_by_key(|&(token, _)| token);
        let q = |token: Token| {
            q_by_token
                .binary_search_by_key(&token, |&(held, _)| held)
                .map_or(0.0, |at| q_by_token[at].1)
        };
        let residual: Vec<f64> = self
            .target
            .iter()
            .map(|&(token, weight)| (weight / total - q(token)).max(0.0))
            .collect();
        let mut mass: f64 = residual.iter().sum();
        let u: f64 = self.generator.random();
        // `p` and `q` equal to rounding leave nothing over: `p` itself is the residual's
        // limit then.
        let weights: Vec<f64> = if mass > 0.0 {
            residual
        } else {
            mass = 1.0;
            self.target
                .iter()
                .map(|&(_, weight)| weight / total)
                .collect()
        };
        let mut left = u * mass;
        let mut chosen = None;
        for (&(token, _), &weight) in self.target.iter().zip(&weights) {
            if weight > 0.0 {
                chosen = Some(token);
                if left < weight {
                    break;
                }
                left -= weight;
            }
        }
        chosen.unwrap_or(drafted)
    }
}

/// Every token of the vocabulary as a candidate, with its logit.
fn fill(candidates: &mut LlamaTokenDataArray, logits: &[f32]) {
    candidates.data.clear();
    candidates.data.extend(
        logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| LlamaTokenData::new(LlamaToken(id as i32), logit, 0.0)),
    );
    candidates.selected = None;
    candidates.sorted = false;
}

/// Index of the largest logit; the first one on ties, so the choice is deterministic.
///
/// Two passes over the vocabulary (a branch-free maximum the compiler vectorises, then a search
/// for its first position) beat one branchy pass: on a 262K-token vocabulary this runs once per
/// verified position and shows up in decode speed.
pub(super) fn argmax(logits: &[f32]) -> Token {
    let max = max_logit(logits);
    logits.iter().position(|&logit| logit == max).unwrap_or(0) as Token
}

fn max_logit(logits: &[f32]) -> f32 {
    logits.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// The greedy token (as [`argmax`]) and its probability under the softmax of `logits`.
///
/// The probability of the largest logit `m` is `1 / sum(exp(l - m))`. The sum runs over the whole
/// vocabulary (262K entries for Gemma) once per drafted token, so it is written to vectorise:
/// [`LANES`] independent partial sums (float addition is not associative, so the compiler would
/// not split one sum by itself) of a polynomial `exp` made only of arithmetic the compiler turns
/// into SIMD instructions, where `f32::exp` is a scalar libm call per element.
pub(super) fn argmax_with_probability(logits: &[f32]) -> (Token, f32) {
    let max = max_logit(logits);
    let token = logits.iter().position(|&logit| logit == max).unwrap_or(0) as Token;
    let total = sum_exp_below(logits, max);
    // `total >= 1` (the maximum contributes exp(0) = 1) unless the logits are NaN.
    let probability = if total >= 1.0 { 1.0 / total } else { 0.0 };
    (token, probability)
}

/// The second most likely token of `logits` (the first on ties, `first` aside) and its
/// probability, given the greedy token `first` and its probability (as
/// [`argmax_with_probability`] gives them); `None` for a vocabulary of one token.
pub(super) fn second_choice(
    logits: &[f32],
    first: Token,
    probability: f32,
) -> Option<(Token, f32)> {
    let (index, logit) = logits
        .iter()
        .enumerate()
        .filter(|&(index, _)| index != first as usize)
        .fold(
            None,
            |best: Option<(usize, f32)>, (index, &logit)| match best {
                Some((_, kept)) if kept >= logit => best,
                _ if logit.is_nan() => best,
                _ => Some((index, logit)),
            },
        )?;
    let max = logits.get(first as usize).copied().unwrap_or(f32::NAN);
    // p(second) / p(first) = exp(l2 - max).
    Some((index as Token, probability * exp_non_positive(logit - max)))
}

/// `sum(exp(l - max))` over `logits`, `max` their largest, vectorised (see
/// [`argmax_with_probability`]).
fn sum_exp_below(logits: &[f32], max: f32) -> f32 {
    let mut partial = [0.0f32; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (sum, &logit) in partial.iter_mut().zip(chunk) {
            *sum += exp_non_positive(logit - max);
        }
    }
    let rest: f32 = chunks
        .remainder()
        .iter()
        .map(|&logit| exp_non_positive(logit - max))
        .sum();
    partial.iter().sum::<f32>() + rest
}

/// Partial sums in [`argmax_with_probability`]: two AVX-512 registers of `f32`.
const LANES: usize = 32;

/// `e^x` for `x <= 0`, to about 2e-7 relative error: Cephes' `expf` (a degree-5 polynomial on
/// `x - n ln 2`, times `2^n` built in the exponent bits), without branches so it vectorises.
/// Inputs below -87 (where `e^x` leaves the normal `f32` range) give `e^-87`, which is 0 for
/// any sum of probabilities; `-inf` (a masked token) gives the same.
fn exp_non_positive(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so `n * LN2_HIGH` is exact.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    let x = x.max(-87.0);
    let n = (x * LOG2_E + 0.5).floor();
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // n is in [-126, 0] here, so 2^n is a normal float: its biased exponent is n + 127.
    let two_to_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
    e_r * two_to_n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_request_of_a_set_takes_the_next_seed() {
        let base = SamplingParams {
            temperature: 0.5,
            seed: u32::MAX,
            ..SamplingParams::greedy()
        };
        assert_eq!(base.for_request(0).seed, u32::MAX);
        assert_eq!(base.for_request(2).seed, 1, "wraps");
        assert_eq!(base.for_request(2).temperature, 0.5);
    }

    #[test]
    fn temperatures_too_small_to_divide_by_are_greedy() {
        let at = |temperature| SamplingParams {
            temperature,
            seed: 7,
            ..SamplingParams::greedy()
        };
        for temperature in [0.0, 1e-37, f32::MIN_POSITIVE, 9e-6] {
            assert!(at(temperature).is_greedy(), "temperature {temperature:e}");
        }
        assert!(!at(MIN_TEMPERATURE).is_greedy());
        // A draw at the smallest sampled temperature is still a real token: the arg-max of
        // logits this far apart.
        let logits: Vec<f32> = (0..1000).map(|i| 30.0 - i as f32 * 0.01).collect();
        let mut sampler = TokenSampler::with_grammar(&at(MIN_TEMPERATURE), None);
        assert_eq!(sampler.sample(&logits).ok(), Some(argmax(&logits)));
    }

    #[test]
    fn logprobs_are_the_log_softmax_with_the_most_likely_first() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let log_total = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        let logprob = TokenLogprob::at(&logits, 4, 3);
        assert_eq!(logprob.token, 4);
        assert!((f64::from(logprob.logprob) - (0.5 - log_total)).abs() < 1e-5);
        let top: Vec<Token> = logprob.top.iter().map(|&(token, _)| token).collect();
        assert_eq!(top, [1, 2, 0], "most likely first, ties by token id");
        for &(token, value) in &logprob.top {
            let exact = f64::from(logits[token as usize]) - log_total;
            assert!((f64::from(value) - exact).abs() < 1e-5, "{token}: {value}");
        }
        assert!(TokenLogprob::at(&logits, 1, 0).top.is_empty());
        assert_eq!(TokenLogprob::at(&logits, 0, 20).top.len(), logits.len());
    }

    /// Pearson's chi-square statistic of `counts` against `probabilities` over `draws`.
    fn chi_square(counts: &[usize], probabilities: &[f64], draws: usize) -> f64 {
        counts
            .iter()
            .zip(probabilities)
            .map(|(&seen, &p)| {
                let expected = p * draws as f64;
                (seen as f64 - expected).powi(2) / expected
            })
            .sum()
    }

    #[test]
    fn rejection_sampling_draws_the_targets_distribution_whatever_the_draft() {
        let logits = [1.0f32, 2.5, 0.2, -1.0, 1.8, 0.9];
        let params = SamplingParams {
            temperature: 0.8,
            seed: 5,
            ..SamplingParams::greedy()
        };
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| (f64::from(l) / f64::from(params.temperature)).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let p: Vec<f64> = weights.iter().map(|w| w / total).collect();
        // A draft that misses token 1 (the target's favourite) and overweights token 3.
        let q = TokenDistribution {
            probabilities: vec![(3, 0.5), (0, 0.3), (4, 0.15), (5, 0.05)],
        };
        let mut sampler = TokenSampler::with_grammar(&params, None);
        let mut draft_generator = Xoshiro256PlusPlus::seed_from_u64(99);
        let draws = 60_000;
        let (mut counts, mut accepted) = (vec![0usize; logits.len()], 0);
        for _ in 0..draws {
            let mut left: f32 = draft_generator.random();
            let mut drafted = 5;
            for &(token, probability) in &q.probabilities {
                if left < probability {
                    drafted = token;
                    break;
                }
                left -= probability;
            }
            let token = sampler
                .settle_drawn(&logits, drafted, &q)
                .expect("no grammar");
            counts[token as usize] += 1;
            accepted += usize::from(token == drafted);
        }
        // 5 degrees of freedom: above 20.5 one time in a thousand.
        let statistic = chi_square(&counts, &p, draws);
        assert!(
            statistic < 20.5,
            "chi-square {statistic:.1}: {counts:?} against {p:?}"
        );
        // Accepted as often as the overlap of the two distributions says.
        let overlap: f64 = q
            .probabilities
            .iter()
            .map(|&(token, q)| f64::from(q).min(p[token as usize]))
            .sum();
        let rate = accepted as f64 / draws as f64;
        assert!(
            (rate - overlap).abs() < 0.01,
            "accepted {rate:.3}, overlap {overlap:.3}"
        );
    }

    #[test]
    fn a_draft_equal_to_the_target_is_always_accepted_and_compare_never_draws_twice() {
        let logits = [0.5f32, 1.5, -0.5];
        let params = SamplingParams {
            temperature: 1.0,
            seed: 3,
            ..SamplingParams::greedy()
        };
        let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let q = TokenDistribution {
            probabilities: logits
                .iter()
                .enumerate()
                .map(|(token, &l)| (token as Token, (f64::from(l).exp() / total) as f32))
                .collect(),
        };
        let mut sampler = TokenSampler::with_grammar(&params, None);
        for drafted in [0, 1, 2, 1, 0] {
            assert_eq!(
                sampler.settle_drawn(&logits, drafted, &q).ok(),
                Some(drafted)
            );
        }
        // `compare`: no rejection sampling; the target's own draw, as plain decoding's.
        let compare = SamplingParams {
            draft_acceptance: DraftAcceptance::Compare,
            ..params.clone()
        };
        assert_eq!(compare.draft_sampling(), None);
        let mut plain = TokenSampler::with_grammar(&compare, None);
        let mut settled = TokenSampler::with_grammar(&compare, None);
        for _ in 0..20 {
            assert_eq!(
                settled.settle_drawn(&logits, 2, &q).ok(),
                plain.sample(&logits).ok()
            );
        }
        assert!(params.draft_sampling().is_some());
        assert_eq!(SamplingParams::greedy().draft_sampling(), None);
    }

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[5.0]), 0);
    }

    #[test]
    fn polynomial_exp_matches_libm() {
        let mut worst = 0.0f64;
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let exact = f64::from(x).exp();
            let error = ((f64::from(exp_non_positive(x)) - exact) / exact).abs();
            worst = worst.max(error);
        }
        assert!(worst < 1e-6, "worst relative error {worst:e}");
        assert!(exp_non_positive(f32::NEG_INFINITY) < 1e-37);
        assert_eq!(exp_non_positive(0.0), 1.0);
    }

    #[test]
    fn probability_of_the_greedy_token_is_its_softmax() {
        // A vocabulary-sized row with a remainder after the lane chunks, ties and a masked token.
        let logits: Vec<f32> = (0..49_157)
            .map(|i| match i {
                7 => f32::NEG_INFINITY,
                1234 | 4321 => 9.5,
                _ => ((i * 7919) % 1000) as f32 / 100.0 - 5.0,
            })
            .collect();
        let (token, probability) = argmax_with_probability(&logits);
        let max = 9.5f64;
        let exact = 1.0
            / logits
                .iter()
                .map(|&l| (f64::from(l) - max).exp())
                .sum::<f64>();
        assert_eq!(token, 1234, "first of the tied maxima");
        assert!(
            (f64::from(probability) - exact).abs() < 1e-5 * exact,
            "probability {probability} vs exact {exact}"
        );
        assert_eq!(argmax_with_probability(&[3.0]), (0, 1.0));
        let (_, half) = argmax_with_probability(&[1.0, 1.0]);
        assert!(
            (half - 0.5).abs() < 1e-6,
            "two equal logits give 0.5, got {half}"
        );
    }

    #[test]
    fn the_second_choice_is_the_next_largest_logit_with_its_probability() {
        let top_two = |logits: &[f32]| {
            let (first, p1) = argmax_with_probability(logits);
            ((first, p1), second_choice(logits, first, p1))
        };
        // Softmax of [0, ln 3, ln 2, ln 3]: 1/9, 3/9, 2/9, 3/9.
        let logits = [0.0, 3f32.ln(), 2f32.ln(), 3f32.ln()];
        let ((first, p1), second) = top_two(&logits);
        let (second, p2) = second.expect("two tokens or more");
        assert_eq!(
            (first, second),
            (1, 3),
            "the first of tied maxima, then the other"
        );
        assert!(
            (p1 - 3.0 / 9.0).abs() < 1e-5 && (p2 - 3.0 / 9.0).abs() < 1e-5,
            "{p1} {p2}"
        );
        let (_, second) = top_two(&[0.0, 2f32.ln(), f32::NAN]);
        let (second, p2) = second.expect("a second token");
        assert_eq!(second, 0, "a NaN logit is never a choice");
        assert!(p2.is_finite());
        assert_eq!(top_two(&[3.0]), ((0, 1.0), None));
    }
}
