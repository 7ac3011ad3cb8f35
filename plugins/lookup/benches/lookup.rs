//! The `lookup` drafter, natively: one `propose(16)` and feeding one token, with 8K tokens of
//! context.
//!
//! The text is synthetic but shaped like code: lines drawn from a few hundred templates,
//! repeated in runs, with a few tokens in each line replaced at random (identifiers, literals).
//! `propose_16/hit` asks for 16 tokens after a context whose end has occurred before, followed
//! by at least 16 tokens; `propose_16/miss` after a context ending in tokens never seen, where
//! every n-gram length is looked up in vain. `feed_1` feeds the stream token by token to one
//! session, rebuilt (untimed) once it grew by a quarter.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lookup::Lookup;
use spechost_sdk::testing::facts;
use spechost_sdk::{Drafter, Token};

/// Context size measured, in tokens.
const CONTEXT_SIZE: usize = 1 << 13;
/// Tokens asked for in each `propose`.
const MAX_DRAFT_LEN: usize = 16;
/// Vocabulary of the pretend target.
const VOCAB_SIZE: u32 = 32_000;
/// Tokens the stream never produces: it draws from `0..VOCAB_SIZE - UNSEEN_TOKENS`.
const UNSEEN_TOKENS: u32 = 16;
/// Line templates the text is drawn from, and their lengths.
const TEMPLATES: usize = 400;
const LINE_LEN: std::ops::Range<u32> = 6..20;
/// Chance, in percent, that a token of a line is replaced by a random one.
const NOISE_PERCENT: u32 = 8;
/// Tokens `feed_1` may add to a session before it is rebuilt, untimed.
const GROWTH_ALLOWED: usize = CONTEXT_SIZE / 4;

/// A deterministic token stream shaped like source code.
struct Stream {
    random: u64,
    templates: Vec<Vec<Token>>,
    /// Template of the previous line; runs of nearby templates mimic repeated blocks.
    line: usize,
}

impl Stream {
    fn new(seed: u64) -> Self {
        let mut stream = Self {
            random: seed,
            templates: Vec::new(),
            line: 0,
        };
        let seen = VOCAB_SIZE - UNSEEN_TOKENS;
        stream.templates = (0..TEMPLATES)
            .map(|_| {
                let len = LINE_LEN.start + stream.below(LINE_LEN.end - LINE_LEN.start);
                // Skewed towards small ids: a few very common tokens (indentation, brackets).
                (0..len)
                    .map(|_| {
                        let bound = 1 + stream.below(seen);
                        stream.below(bound)
                    })
                    .collect()
            })
            .collect();
        stream
    }

    fn below(&mut self, bound: u32) -> u32 {
        self.random = self
            .random
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.random >> 33) % u64::from(bound)) as u32
    }

    /// The next `len` tokens.
    fn take(&mut self, len: usize) -> Vec<Token> {
        let mut tokens = Vec::with_capacity(len + LINE_LEN.end as usize);
        while tokens.len() < len {
            // Mostly the next template, sometimes a jump: blocks repeat with variations.
            self.line = match self.below(10) {
                0..=6 => (self.line + 1) % TEMPLATES,
                7 => self.below(TEMPLATES as u32) as usize,
                _ => self.line,
            };
            for index in 0..self.templates[self.line].len() {
                let token = if self.below(100) < NOISE_PERCENT {
                    self.below(VOCAB_SIZE - UNSEEN_TOKENS)
                } else {
                    self.templates[self.line][index]
                };
                tokens.push(token);
            }
        }
        tokens.truncate(len);
        tokens
    }
}

/// A session fed [`CONTEXT_SIZE`] tokens of `stream` as its prompt.
fn session(stream: &mut Stream) -> Lookup {
    let mut drafter = Lookup::new("", &facts(VOCAB_SIZE)).expect("default config");
    drafter.feed(&stream.take(CONTEXT_SIZE));
    drafter
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("propose_16");
    let mut stream = Stream::new(1);
    let mut hit = session(&mut stream);
    // End where the text has been seen before: the stream repeats, so that comes soon.
    while hit.propose(MAX_DRAFT_LEN).len() < MAX_DRAFT_LEN {
        hit.feed(&stream.take(1));
    }
    group.bench_function(format!("hit/{CONTEXT_SIZE}"), |b| {
        b.iter(|| black_box(hit.propose(black_box(MAX_DRAFT_LEN))));
    });
    let mut miss = session(&mut stream);
    let unseen: Vec<Token> = (VOCAB_SIZE - UNSEEN_TOKENS..VOCAB_SIZE).collect();
    miss.feed(&unseen);
    assert!(
        miss.propose(MAX_DRAFT_LEN).is_empty(),
        "unseen tokens match nothing"
    );
    group.bench_function(format!("miss/{CONTEXT_SIZE}"), |b| {
        b.iter(|| black_box(miss.propose(black_box(MAX_DRAFT_LEN))));
    });
    group.finish();

    let mut group = c.benchmark_group("feed_1");
    let mut stream = Stream::new(2);
    let mut drafter = session(&mut stream);
    let mut grown = 0;
    group.bench_function(format!("{CONTEXT_SIZE}"), |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                if grown == GROWTH_ALLOWED {
                    drafter = session(&mut stream);
                    grown = 0;
                }
                let token = stream.take(1);
                let start = Instant::now();
                drafter.feed(black_box(&token));
                elapsed += start.elapsed();
                grown += 1;
            }
            elapsed
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Short runs: sessions are small, and the whole file takes a few seconds.
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
