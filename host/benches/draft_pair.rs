//! How well a draft model fits a target: acceptance and cost, measured the way the engine would
//! use it, to choose the default draft of each default target (`docs/draft-model.md`).
//!
//! For each fixture prompt (`--repeat` passes over them) the target first decodes greedily
//! ([`MAX_TOKENS`] tokens, timed without the prompt: the target's ms per token). Then each draft
//! model replays that output in rounds, as a cascade with only the draft model would: it is fed
//! the context, proposes up to `--draft-max` tokens (stopping below `--p-min`), the proposal is
//! accepted up to its first difference from the target's output, and the accepted tokens plus
//! the target's next token are fed back. Printed per draft: acceptance (accepted / drafted), mean
//! tokens committed per round, ms per drafted token (propose time over tokens drafted, without
//! each request's first proposal, which evaluates the prompt; the evaluation of the tokens fed
//! each round is included), and the prompt's evaluation in ms per prompt token.
//!
//! ```text
//! cargo bench -p spechost --bench draft_pair -- --target smollm2 \
//!     --draft smollm2-draft --draft /path/to/other.gguf \
//!     [--draft-max 8] [--p-min 0.5] [--threads 1] [--repeat 1]
//! ```
//!
//! Costs are CPU time of the measuring thread (Linux `/proc/thread-self/schedstat`), which on a
//! shared machine is far steadier than wall time; with `--threads 1` (the default here) llama.cpp
//! computes on that thread, so it is the whole cost. With more threads the workers' time is not
//! counted, and wall time is printed instead.
//!
//! Drafts are `.gguf` paths or default drafts (`smollm2-draft`), which must have been made
//! (`spechost models quantize`, or any `run --draft-model auto`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use spechost::cascade::{Cascade, DraftModel, ProposalSettings, Token};
use spechost::config::cache_dir;
use spechost::engine::{
    DraftModelConfig, DraftModelHost, ModelOverrides, Request, SamplingParams, SessionParams,
    Target, TargetParams, check_vocab_compatible,
};
use spechost::models::{DefaultDraft, DefaultModel};

/// Tokens the target generates per prompt.
const MAX_TOKENS: usize = 128;
/// Context size of target and draft.
const CTX_SIZE: u32 = 2048;

struct Options {
    target: String,
    drafts: Vec<String>,
    max_draft_len: usize,
    p_min: f32,
    threads: usize,
    repeat: usize,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        target: DefaultModel::SmolLm2.alias().to_owned(),
        drafts: Vec::new(),
        max_draft_len: 8,
        p_min: 0.5,
        threads: 1,
        repeat: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--bench" {
            continue; // added by `cargo bench`
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |what: &str| format!("{flag} {value}: not {what}");
        match flag.as_str() {
            "--target" => options.target = value,
            "--draft" => options.drafts.push(value),
            "--draft-max" => {
                options.max_draft_len = value.parse().map_err(|_| number("a count"))?
            }
            "--p-min" => options.p_min = value.parse().map_err(|_| number("a probability"))?,
            "--threads" => options.threads = value.parse().map_err(|_| number("a count"))?,
            "--repeat" => options.repeat = value.parse().map_err(|_| number("a count"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if options.drafts.is_empty() {
        return Err("give at least one --draft PATH|NAME".into());
    }
    Ok(options)
}

fn model_path(name: &str) -> PathBuf {
    let cache = cache_dir();
    if let Some(model) = DefaultModel::from_alias(name) {
        return model.path(&cache);
    }
    if let Some(draft) = DefaultDraft::from_name(name) {
        return draft.path(&cache);
    }
    PathBuf::from(name)
}

fn prompts(target: &Target) -> Vec<Vec<Token>> {
    include_str!("../../tests/fixtures/prompts.jsonl")
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("fixture is JSON");
            let message = value["messages"][0]["content"].as_str().expect("content");
            target.tokenize_chat(message).expect("chat template")
        })
        .collect()
}

/// Time spent computing: CPU time of this thread with one llama.cpp thread, else wall time.
struct Clock {
    cpu_time: bool,
}

impl Clock {
    fn now(&self) -> Duration {
        if self.cpu_time {
            thread_cpu_time().expect("/proc/thread-self/schedstat is readable")
        } else {
            START.get_or_init(Instant::now).elapsed()
        }
    }
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// CPU time of the calling thread, from its scheduler statistics (nanoseconds on the CPU).
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

#[derive(Default)]
struct Replay {
    rounds: u64,
    drafted: u64,
    accepted: u64,
    committed: u64,
    /// Tokens drafted after each request's first proposal.
    later_drafted: u64,
    /// Time of the proposals after each request's first.
    later_time: Duration,
    prompt_tokens: u64,
    /// Time of each request's first proposal.
    first_time: Duration,
}

/// Replays the target's `output` after `prompt` with `draft`, round by round.
fn replay(
    draft: &mut dyn DraftModel,
    prompt: &[Token],
    output: &[Token],
    options: &Options,
    clock: &Clock,
    totals: &mut Replay,
) {
    draft.reset();
    draft.feed(prompt);
    draft.feed(&output[..1]);
    let mut position = 1;
    while position < output.len() {
        let max_len = options.max_draft_len.min(output.len() - position);
        let started = clock.now();
        let proposal = draft
            .propose(ProposalSettings::greedy(max_len, options.p_min))
            .tokens;
        let elapsed = clock.now() - started;
        if position == 1 {
            totals.first_time += elapsed;
            totals.prompt_tokens += prompt.len() as u64 + 1;
        } else {
            totals.later_time += elapsed;
            totals.later_drafted += proposal.len() as u64;
        }
        let n_accepted = proposal
            .iter()
            .zip(&output[position..])
            .take_while(|(drafted, target)| drafted.token == **target)
            .count();
        let end = (position + n_accepted + 1).min(output.len());
        draft.feed(&output[position..end]);
        totals.rounds += 1;
        totals.drafted += proposal.len() as u64;
        totals.accepted += n_accepted as u64;
        totals.committed += (end - position) as u64;
        position = end;
    }
}

fn main() {
    let options = match options() {
        Ok(options) => options,
        Err(problem) => {
            eprintln!("error: {problem}");
            std::process::exit(2);
        }
    };
    let loading = TargetParams::default();
    let target_path = model_path(&options.target);
    let target = Target::load(&target_path, &loading).expect("target loads");
    let session_params = SessionParams {
        ctx_size: CTX_SIZE,
        threads: options.threads,
        ..SessionParams::default()
    };
    let mut session = target.session(&session_params).expect("target session");
    let drafts: Vec<(PathBuf, DraftModelHost)> = options
        .drafts
        .iter()
        .map(|name| {
            let config = DraftModelConfig {
                path: model_path(name),
                ctx_size: CTX_SIZE,
                threads: options.threads,
                overrides: ModelOverrides::default(),
            };
            let draft = DraftModelHost::load(&config, &loading).expect("draft loads");
            check_vocab_compatible(&target, &draft).expect("draft shares the target's tokenizer");
            (config.path, draft)
        })
        .collect();
    let mut contexts: Vec<_> = drafts
        .iter()
        .map(|(_, draft)| draft.open_context().expect("draft context"))
        .collect();
    let mut totals: Vec<Replay> = drafts.iter().map(|_| Replay::default()).collect();
    // Target and drafts take turns on each prompt, so a machine whose load changes during the
    // run slows them alike.
    let clock = Clock {
        cpu_time: options.threads == 1,
    };
    let (mut target_time, mut target_tokens) = (Duration::ZERO, 0);
    for _ in 0..options.repeat {
        for prompt in prompts(&target) {
            // The first token costs the prompt's evaluation; a one-token run measures it, and
            // the difference is the cost of the other tokens.
            let mut decode = |max_tokens| {
                let request = Request::new(prompt.clone(), max_tokens, SamplingParams::greedy());
                let started = clock.now();
                let outcome = session
                    .generate(&request, &mut Cascade::empty(), &mut |_| {})
                    .expect("target decodes");
                (clock.now() - started, outcome)
            };
            let (prompt_time, _) = decode(1);
            let (total_time, outcome) = decode(MAX_TOKENS);
            target_time += total_time.saturating_sub(prompt_time);
            target_tokens += outcome.tokens.len().saturating_sub(1);
            for (context, totals) in contexts.iter_mut().zip(&mut totals) {
                replay(context, &prompt, &outcome.tokens, &options, &clock, totals);
            }
        }
    }
    println!(
        "target {}: {:.2} ms/token plain decoding ({} threads, {} time)",
        target_path.display(),
        ms_per(target_time, target_tokens as u64),
        options.threads,
        if clock.cpu_time { "CPU" } else { "wall" }
    );
    println!(
        "draft\tacceptance\ttokens/round\tms/drafted token\tms/prompt token\t(draft-max {}, p-min {})",
        options.max_draft_len, options.p_min
    );
    for ((path, _), totals) in drafts.iter().zip(&totals) {
        println!(
            "{}\t{:.3}\t{:.2}\t{:.2}\t{:.3}",
            path.display(),
            totals.accepted as f64 / totals.drafted.max(1) as f64,
            totals.committed as f64 / totals.rounds.max(1) as f64,
            ms_per(totals.later_time, totals.later_drafted),
            ms_per(totals.first_time, totals.prompt_tokens)
        );
    }
}

fn ms_per(time: Duration, count: u64) -> f64 {
    time.as_secs_f64() * 1e3 / count.max(1) as f64
}
