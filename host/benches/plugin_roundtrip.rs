//! One round trip through the component boundary: `propose(8)` then `feed` of one token, on the
//! built-in `lookup` drafter, with 256, 2K and 8K tokens of context. Target: median <= 5 µs.
//!
//! The context repeats a pseudo-random pattern, and each round feeds the token that continues
//! it, so `lookup` always finds a match (its steady state on repetitive text). Every
//! [`ROUNDS_PER_REQUEST`] rounds the request is restarted, untimed, so the context stays near
//! its nominal size.
//!
//! Needs `lookup.wasm` (`scripts/build-plugins.sh`); it is found beside the bench binary or in
//! `$SPECHOST_WASM_DIR`.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use spechost::cascade::{DraftSource, ModelFacts, Token};
use spechost::plugins::SourceSpec;
use spechost::plugins::{PluginHost, PluginHostConfig};

/// Context sizes measured, in tokens.
const CONTEXT_SIZES: [usize; 3] = [256, 2048, 8192];
/// Tokens asked for in each `propose`.
const MAX_DRAFT_LEN: usize = 8;
/// Rounds before the request is restarted with the nominal context.
const ROUNDS_PER_REQUEST: u64 = 1024;
/// Period of the repeated token pattern.
const PATTERN_PERIOD: usize = 97;
/// Vocabulary of the pretend target.
const VOCAB_SIZE: u32 = 49_152;

/// Token `position` of the repeated pattern: distinct tokens within a period.
fn pattern_token(position: usize) -> Token {
    let index = (position % PATTERN_PERIOD) as u32;
    1000 + index.wrapping_mul(7919) % 40_000
}

fn roundtrip(c: &mut Criterion) {
    let plugin_dirs: Vec<PathBuf> = std::env::var_os("SPECHOST_WASM_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    let host = PluginHost::new(PluginHostConfig {
        cache_dir: Some(std::env::temp_dir().join("spechost-plugin-sandbox-cache")),
        plugin_dirs,
        ..PluginHostConfig::default()
    })
    .expect("plugin host starts");
    let lookup = host
        .load(&SourceSpec::Builtin("lookup".into()))
        .unwrap_or_else(|e| panic!("{e}"));
    let facts = ModelFacts {
        vocab_size: VOCAB_SIZE,
        bos: Some(1),
        eos: Some(2),
        eog: vec![2],
        context_size: 16_384,
    };

    // Measure the drafting path, not the "no match" shortcut.
    let mut probe = lookup.source("");
    let context: Vec<Token> = (0..CONTEXT_SIZES[0]).map(pattern_token).collect();
    probe.begin(&facts, &context).expect("lookup opens");
    let proposal = probe.propose(MAX_DRAFT_LEN).expect("lookup proposes");
    assert_eq!(
        proposal.tokens.len(),
        MAX_DRAFT_LEN,
        "lookup found no match: {proposal:?}"
    );

    let mut group = c.benchmark_group("plugin_roundtrip");
    for context_len in CONTEXT_SIZES {
        let context: Vec<Token> = (0..context_len).map(pattern_token).collect();
        let mut source = lookup.source("");
        group.bench_with_input(
            BenchmarkId::new("lookup", context_len),
            &context,
            |b, context| {
                b.iter_custom(|iters| {
                    let mut measured = Duration::ZERO;
                    let mut done = 0;
                    while done < iters {
                        source.begin(&facts, context).expect("lookup opens");
                        let rounds = (iters - done).min(ROUNDS_PER_REQUEST);
                        let started = Instant::now();
                        for round in 0..rounds as usize {
                            let proposal = source.propose(MAX_DRAFT_LEN).expect("lookup proposes");
                            black_box(&proposal);
                            source
                                .feed(&[pattern_token(context.len() + round)])
                                .expect("lookup takes the token");
                        }
                        measured += started.elapsed();
                        source.end();
                        done += rounds;
                    }
                    measured
                });
            },
        );
        assert_eq!(
            source.faults(),
            0,
            "lookup faulted: {:?}",
            source.last_fault()
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short runs: the numbers are stable to a few percent well within a couple of seconds.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = roundtrip
}
criterion_main!(benches);
