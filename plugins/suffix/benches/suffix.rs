//! The `suffix` drafter, natively: feeding one token and one `propose(16)`, with 1K, 16K and
//! 256K tokens of context.
//!
//! The text is synthetic but shaped like code: lines drawn from a few hundred templates,
//! repeated in runs, with a few tokens in each line replaced at random (identifiers, literals).
//! `feed_1` feeds the stream token by token to one session kept across samples; once its context
//! grew by [`GROWTH_ALLOWED`] of the nominal size, it is rebuilt, untimed. `propose_16` asks
//! the session for 16 tokens after a context that ends mid-line, where matches exist.
//!
//! The `request` groups run with `use_global=false`: the request trie alone. The `cached` groups
//! run the default config, with 256 earlier responses of 1K tokens from the same stream in the
//! cross-request cache, at 16K tokens of context.
//!
//! The `cache` groups time keeping that full cache across restarts: `cache/checkpoint` saves it
//! (one more response each time, so there is always something to save), `cache/restore/code`
//! loads it into a fresh instance (a new thread, whose cache and state slot start empty) and
//! feeds that instance's first session until the trie is rebuilt: the whole cost of a restart,
//! spread over calls in the host. That cache is full by nodes with well under 100K tokens:
//! noisy text takes many nodes per token. `cache/restore/repetitive` restores one of text that
//! repeats far more (see [`repetitive_blob`]), full with about 1M tokens.

use std::hint::black_box;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use spechost_sdk::testing::facts;
use spechost_sdk::{Drafter, Token, state};
use suffix::Suffix;

/// Context sizes measured, in tokens.
const CONTEXT_SIZES: [usize; 3] = [1 << 10, 1 << 14, 1 << 18];
/// Context size of the `cached` groups.
const CACHED_CONTEXT_SIZE: usize = 1 << 14;
/// Earlier responses in the cache for the `cached` groups, and their length.
const CACHED_RESPONSES: usize = 256;
const CACHED_RESPONSE_LEN: usize = 1 << 10;
/// Length of each response of [`repetitive_blob`], and of the line it repeats.
const REPETITIVE_RESPONSE_LEN: usize = 8 << 10;
const REPETITIVE_LINE_LEN: usize = 50;
/// Chance, in thousandths, that a token of [`repetitive_blob`] is a random one.
const REPETITIVE_NOISE_PERMILLE: u32 = 1;
/// Growth of the context, as a fraction of its nominal size, before the session is rebuilt.
const GROWTH_ALLOWED: f64 = 0.25;
/// Tokens per `feed` while building a context: a round's worth would be slower to build, and a
/// whole prompt at once would leave a backlog to index during the timed calls.
const BUILD_CHUNK: usize = 1 << 10;
/// Tokens asked for in each `propose`.
const MAX_DRAFT_LEN: usize = 16;
/// Vocabulary of the pretend target.
const VOCAB_SIZE: u32 = 32_000;
/// Line templates the text is drawn from, and their lengths.
const TEMPLATES: usize = 400;
const LINE_LEN: std::ops::Range<u32> = 6..20;
/// Chance, in percent, that a token of a line is replaced by a random one.
const NOISE_PERCENT: u32 = 8;

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
        stream.templates = (0..TEMPLATES)
            .map(|_| {
                let len = LINE_LEN.start + stream.below(LINE_LEN.end - LINE_LEN.start);
                // Skewed towards small ids: a few very common tokens (indentation, brackets).
                (0..len)
                    .map(|_| {
                        let bound = 1 + stream.below(VOCAB_SIZE);
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
                    self.below(VOCAB_SIZE)
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

/// A session fed `size` tokens of `stream`, in chunks.
fn session(config: &str, stream: &mut Stream, size: usize) -> Suffix {
    let mut drafter = Suffix::new(config, &facts(VOCAB_SIZE)).expect("valid config");
    let mut fed = 0;
    while fed < size {
        let chunk = stream.take(BUILD_CHUNK.min(size - fed));
        drafter.feed(&chunk);
        fed += chunk.len();
    }
    drafter
}

/// A session fed one token at a time, kept between criterion's samples.
struct Feeder {
    config: &'static str,
    size: usize,
    seed: u64,
    stream: Stream,
    drafter: Suffix,
    /// Tokens fed since the session was built, and how many are allowed.
    grown: u64,
    allowed: u64,
}

impl Feeder {
    fn new(config: &'static str, size: usize, seed: u64) -> Self {
        let mut stream = Stream::new(seed);
        let drafter = session(config, &mut stream, size);
        Self {
            config,
            size,
            seed,
            stream,
            drafter,
            grown: 0,
            allowed: ((size as f64 * GROWTH_ALLOWED) as u64).max(1),
        }
    }

    /// Times feeding `iters` tokens one at a time, rebuilding the session (untimed) whenever
    /// its context grew by more than [`GROWTH_ALLOWED`].
    fn time(&mut self, iters: u64) -> Duration {
        let mut elapsed = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            if self.grown == self.allowed {
                // Drop the old session first: its response then enters the cache while the
                // new one is built, untimed, as it would between two requests.
                self.drafter =
                    Suffix::new("use_global=false", &facts(VOCAB_SIZE)).expect("valid config");
                *self = Feeder::new(self.config, self.size, self.seed);
            }
            let batch = left.min(self.allowed - self.grown);
            let tokens = self.stream.take(batch as usize);
            let start = Instant::now();
            for &token in &tokens {
                self.drafter.feed(black_box(&[token]));
            }
            elapsed += start.elapsed();
            self.grown += batch;
            left -= batch;
        }
        elapsed
    }
}

/// Fills the cross-request cache with earlier responses from the stream.
fn warm_cache(stream: &mut Stream) {
    for _ in 0..CACHED_RESPONSES {
        let mut drafter = Suffix::new("", &facts(VOCAB_SIZE)).expect("default config");
        drafter.feed(&stream.take(BUILD_CHUNK));
        for token in stream.take(CACHED_RESPONSE_LEN) {
            drafter.feed(&[token]);
        }
    }
}

/// Times `iters` restarts from `blob`: on a new thread each, the first session loads it and is
/// fed empty rounds until the cache is rebuilt.
fn time_restore(blob: &Arc<Vec<u8>>, iters: u64) -> Duration {
    (0..iters)
        .map(|_| {
            let blob = Arc::clone(blob);
            thread::spawn(move || {
                state::save(&blob).expect("no limit on native state");
                let start = Instant::now();
                let mut drafter = Suffix::new("", &facts(VOCAB_SIZE)).expect("default config");
                drafter.feed(&[0]);
                while !Suffix::cache_is_idle() {
                    drafter.feed(&[]);
                }
                // The thread's cache is freed after this, untimed.
                start.elapsed()
            })
            .join()
            .expect("restore ran")
        })
        .sum()
}

/// The blob of a full cache of very repetitive text: 256 responses of 8K tokens, each one line
/// of 50 tokens over and over with a rare random token. Such text adds few nodes per token, so
/// the full cache holds about 1M tokens, a 4 MiB blob (at most 2M tokens fit, with no noise).
///
/// Built on a thread of its own, so that its cache and state slot are its own.
fn repetitive_blob() -> Vec<u8> {
    thread::spawn(|| {
        let mut stream = Stream::new(3);
        let line = stream.take(REPETITIVE_LINE_LEN);
        for _ in 0..CACHED_RESPONSES {
            let text: Vec<Token> = (0..REPETITIVE_RESPONSE_LEN)
                .map(|index| {
                    if stream.below(1000) < REPETITIVE_NOISE_PERMILLE {
                        stream.below(VOCAB_SIZE)
                    } else {
                        line[index % REPETITIVE_LINE_LEN]
                    }
                })
                .collect();
            let mut drafter = Suffix::new("", &facts(VOCAB_SIZE)).expect("default config");
            drafter.feed(&[0]);
            drafter.feed(&text);
        }
        let mut drafter = Suffix::new("", &facts(VOCAB_SIZE)).expect("default config");
        drafter.feed(&[0]);
        while !Suffix::cache_is_idle() {
            drafter.feed(&[]);
        }
        Suffix::checkpoint();
        state::load().expect("the checkpoint saved the cache")
    })
    .join()
    .expect("the repetitive cache was built")
}

/// Times `iters` checkpoints of the cache, each after one more response.
fn time_checkpoint(stream: &mut Stream, iters: u64) -> Duration {
    let mut elapsed = Duration::ZERO;
    for _ in 0..iters {
        let mut drafter = Suffix::new("", &facts(VOCAB_SIZE)).expect("default config");
        drafter.feed(&[0]);
        drafter.feed(&stream.take(CACHED_RESPONSE_LEN));
        drop(drafter);
        let start = Instant::now();
        Suffix::checkpoint();
        elapsed += start.elapsed();
    }
    elapsed
}

fn bench(c: &mut Criterion) {
    let request_only = "use_global=false";

    let mut group = c.benchmark_group("request/feed_1");
    for size in CONTEXT_SIZES {
        let mut feeder = Feeder::new(request_only, size, 1);
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter_custom(|iters| feeder.time(iters));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("request/propose_16");
    for size in CONTEXT_SIZES {
        let mut stream = Stream::new(1);
        let mut drafter = session(request_only, &mut stream, size);
        // End mid-line, where the text has been seen before.
        drafter.feed(&stream.take(3));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter(|| black_box(drafter.propose(MAX_DRAFT_LEN)));
        });
    }
    group.finish();

    let mut stream = Stream::new(2);
    warm_cache(&mut stream);
    let mut group = c.benchmark_group("cached/feed_1");
    let mut feeder = Feeder::new("", CACHED_CONTEXT_SIZE, 2);
    group.bench_function(BenchmarkId::from_parameter(CACHED_CONTEXT_SIZE), |b| {
        b.iter_custom(|iters| feeder.time(iters));
    });
    group.finish();

    let mut group = c.benchmark_group("cached/propose_16");
    let mut drafter = session("", &mut stream, CACHED_CONTEXT_SIZE);
    drafter.feed(&stream.take(3));
    group.bench_function(BenchmarkId::from_parameter(CACHED_CONTEXT_SIZE), |b| {
        b.iter(|| black_box(drafter.propose(MAX_DRAFT_LEN)));
    });
    group.finish();
    drop(drafter);

    let mut group = c.benchmark_group("cache");
    group.sample_size(10);
    group.bench_function("checkpoint", |b| {
        b.iter_custom(|iters| time_checkpoint(&mut stream, iters));
    });
    let blobs = [
        (
            "code",
            state::load().expect("the checkpoints saved the cache"),
        ),
        ("repetitive", repetitive_blob()),
    ];
    for (name, blob) in blobs {
        eprintln!("cache/restore/{name}: a blob of {} bytes", blob.len());
        let blob = Arc::new(blob);
        group.bench_function(BenchmarkId::new("restore", name), |b| {
            b.iter_custom(|iters| time_restore(&blob, iters));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short runs: the whole file takes about a minute, most of it building 256K contexts and
    // full caches.
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
