//! `spechost trace`: the target's greedy output on workload requests, recorded once so that
//! [`simulate`](super::simulate) can replay it through cascades without the model.
//!
//! A trace is JSONL. The first line describes the target: its file and sha256, the facts draft
//! sources are given, the session's context and batch size, and its verify cost curve. Every
//! other line is one request, in the order decoded: workload, id, `max_tokens`, prompt tokens,
//! output tokens and why generation stopped.
//!
//! Requests are prepared as `bench` prepares them (same template, same `max_tokens` caps) and
//! decoded with plain decoding, greedy, with their stop strings: the output is exactly what every
//! cascade produces in `bench`, which is what lets `simulate` stand in for it.

use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::ceiling::VerifyCosts;
use super::prepare::{Prepared, prepare_greedy};
use super::runner::{measure_verify_costs, progress_bar};
use super::workload::Workload;
use crate::cascade::{Cascade, ModelFacts, Token};
use crate::config::TraceConfig;
use crate::engine::{StopReason, Target};
use crate::models::sha256_file;

/// Version of the trace format this build reads and writes.
pub const TRACE_FORMAT: u32 = 1;

/// The target a trace was recorded with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceTarget {
    /// [`TRACE_FORMAT`] of the writer.
    pub format: u32,
    /// The target GGUF.
    pub path: PathBuf,
    /// Its sha256, hex.
    pub sha256: String,
    /// Tokens in the vocabulary.
    pub vocab_size: u32,
    /// Beginning-of-sequence token, if any.
    pub bos: Option<Token>,
    /// End-of-sequence token, if any.
    pub eos: Option<Token>,
    /// Every end-of-generation token.
    pub eog: Vec<Token>,
    /// Context size of the session, in tokens.
    pub context_size: u32,
    /// Most tokens one `llama_decode` took (bounds every verify batch).
    pub batch_size: usize,
    /// Compute threads of the target.
    pub threads: usize,
    /// Tokens of context before each batch of the verify cost curve.
    pub verify_cost_context_tokens: usize,
    /// `verify_costs_us[n - 1]`: median time of one verify batch of `n` tokens, in µs; empty
    /// when the trace was recorded without the curve.
    pub verify_costs_us: Vec<f64>,
}

impl TraceTarget {
    /// The facts draft sources were given in the traced session.
    pub fn facts(&self) -> ModelFacts {
        ModelFacts {
            vocab_size: self.vocab_size,
            bos: self.bos,
            eos: self.eos,
            eog: self.eog.clone(),
            context_size: self.context_size,
        }
    }

    /// The recorded verify cost curve.
    pub fn verify_costs(&self) -> VerifyCosts {
        VerifyCosts {
            context_tokens: self.verify_cost_context_tokens,
            per_batch: self
                .verify_costs_us
                .iter()
                .map(|&micros| Duration::from_secs_f64(micros.max(0.0) / 1e6))
                .collect(),
        }
    }
}

/// One traced request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// The workload's name (its file stem).
    pub workload: String,
    /// The request's id.
    pub id: String,
    /// Most tokens it could generate.
    pub max_tokens: usize,
    /// Prompt tokens, chat template applied.
    pub prompt: Vec<Token>,
    /// Every generated token, in order (a final end-of-generation token included).
    pub output: Vec<Token>,
    /// Why generation stopped.
    pub stop_reason: StopReason,
}

impl TraceRequest {
    /// Most tokens a replay may generate: `max_tokens`, or the output's length where a stop
    /// string ended it (a trace holds tokens, not the text a stop string is found in).
    pub fn replay_max_tokens(&self) -> usize {
        match self.stop_reason {
            StopReason::StopString => self.output.len(),
            _ => self.max_tokens,
        }
    }
}

/// One line of a trace file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
enum Line {
    Target(TraceTarget),
    Request(TraceRequest),
}

/// A recorded trace: the target, then the requests in the order decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The target.
    pub target: TraceTarget,
    /// The requests, in the order decoded; each workload's requests are contiguous.
    pub requests: Vec<TraceRequest>,
}

/// Why a trace file cannot be used. Every message names the file (and line) to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file cannot be read.
    #[error("cannot read trace {path}: {source}; check the path")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a trace record, or the records are out of place.
    #[error("{path}:{line}: {problem}; write traces with `spechost trace` and do not edit them")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// The trace was written in another format version.
    #[error(
        "{path} is trace format {found}, this build reads format {TRACE_FORMAT}; record it again with this build's `spechost trace`"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// No requests.
    #[error("trace {path} has no requests; record one with `spechost trace --workload FILE`")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl Trace {
    /// Reads and checks the trace at `path`.
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of a trace file; `path` names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, TraceError> {
        let bad = |line: usize, problem: String| TraceError::Line {
            path: path.to_owned(),
            line,
            problem,
        };
        let mut target: Option<TraceTarget> = None;
        let mut requests = Vec::new();
        for (index, text) in text.lines().enumerate() {
            let line = index + 1;
            if text.trim().is_empty() {
                continue;
            }
            let record: Line = serde_json::from_str(text).map_err(|e| bad(line, e.to_string()))?;
            match (record, &target) {
                (Line::Target(found), None) => {
                    if found.format != TRACE_FORMAT {
                        return Err(TraceError::Format {
                            path: path.to_owned(),
                            found: found.format,
                        });
                    }
                    target = Some(found);
                }
                (Line::Target(_), Some(_)) => {
                    return Err(bad(line, "a second target record".into()));
                }
                (Line::Request(_), None) => {
                    return Err(bad(line, "a request before the target record".into()));
                }
                (Line::Request(request), Some(target)) => {
                    check_request(&request, target).map_err(|problem| {
                        bad(line, format!("request `{}`: {problem}", request.id))
                    })?;
                    requests.push(request);
                }
            }
        }
        let Some(target) = target else {
            return Err(TraceError::Empty {
                path: path.to_owned(),
            });
        };
        if requests.is_empty() {
            return Err(TraceError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self { target, requests })
    }

    /// Writes the trace as JSONL to `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the trace {}", path.display()))?;
        let mut out = BufWriter::new(file);
        let mut write_line = |line: &Line| -> anyhow::Result<()> {
            serde_json::to_writer(&mut out, line)?;
            out.write_all(b"\n")?;
            Ok(())
        };
        write_line(&Line::Target(self.target.clone()))
            .and_then(|()| {
                self.requests
                    .iter()
                    .try_for_each(|r| write_line(&Line::Request(r.clone())))
            })
            .and_then(|()| out.flush().map_err(Into::into))
            .with_context(|| format!("writing the trace {}", path.display()))
    }

    /// The requests grouped by workload, in trace order.
    pub fn workloads(&self) -> Vec<(&str, &[TraceRequest])> {
        let mut groups: Vec<(&str, &[TraceRequest])> = Vec::new();
        let mut start = 0;
        for end in 1..=self.requests.len() {
            let boundary = end == self.requests.len()
                || self.requests[end].workload != self.requests[start].workload;
            if boundary {
                groups.push((&self.requests[start].workload, &self.requests[start..end]));
                start = end;
            }
        }
        groups
    }
}

/// What a replay relies on: the output is what plain decoding produced, so it ended at
/// `max_tokens`, with an end-of-generation token or at a stop string (taken on trust: a trace
/// holds no text), and every token is in the vocabulary.
fn check_request(request: &TraceRequest, target: &TraceTarget) -> Result<(), String> {
    if request.prompt.is_empty() || request.output.is_empty() {
        return Err("empty prompt or output".into());
    }
    if request.output.len() > request.max_tokens {
        return Err(format!(
            "{} output tokens exceed max_tokens {}",
            request.output.len(),
            request.max_tokens
        ));
    }
    if request.prompt.len() + request.max_tokens > target.context_size as usize {
        return Err(format!(
            "prompt ({}) + max_tokens ({}) exceed the context of {} tokens",
            request.prompt.len(),
            request.max_tokens,
            target.context_size
        ));
    }
    if let Some(token) = request
        .prompt
        .iter()
        .chain(&request.output)
        .find(|&&t| t >= target.vocab_size)
    {
        return Err(format!(
            "token {token} is outside the vocabulary of {}",
            target.vocab_size
        ));
    }
    let last = request.output[request.output.len() - 1];
    let ended = match request.stop_reason {
        StopReason::EndOfGeneration => target.eog.contains(&last),
        StopReason::MaxTokens => request.output.len() == request.max_tokens,
        StopReason::StopString => true,
        StopReason::Cancelled => false,
    };
    if !ended {
        return Err(format!(
            "the output ({} tokens, last {last}) does not end as its stop reason `{:?}` says",
            request.output.len(),
            request.stop_reason
        ));
    }
    Ok(())
}

/// Decodes every request of the configured workloads and returns the trace.
pub fn record(config: &TraceConfig) -> anyhow::Result<Trace> {
    let inputs = &config.inputs;
    let workloads = Workload::read_all(&inputs.workloads)?;
    let target = Target::load(&inputs.model, &inputs.target)?;
    let sha256 = sha256_file(&inputs.model)
        .with_context(|| format!("hashing {}", inputs.model.display()))?;
    let mut session = target.session(&inputs.session)?;
    // A trace is plain decoding's greedy output: what `simulate` replays.
    let prepared = prepare_greedy(inputs, &target, &workloads, session.ctx_size())?;

    let all: Vec<Prepared> = prepared.iter().flatten().cloned().collect();
    let progress = progress_bar(all.len() as u64);
    let costs = if config.cost_max_tokens > 0 {
        progress.set_message("measuring verify costs");
        measure_verify_costs(
            &mut session,
            &all,
            config.cost_max_tokens,
            config.cost_repeat,
        )
        .context("measuring verify costs")?
    } else {
        VerifyCosts {
            context_tokens: 0,
            per_batch: Vec::new(),
        }
    };
    let facts = target.facts(session.ctx_size());
    let mut requests = Vec::with_capacity(all.len());
    for (workload, prepared) in workloads.iter().zip(&prepared) {
        for request in prepared {
            progress.set_message(format!("{} · {}", workload.name, request.id));
            let outcome = session
                .generate(&request.request, &mut Cascade::empty(), &mut |_| {})
                .with_context(|| {
                    format!(
                        "decoding request `{}` of workload `{}`",
                        request.id, workload.name
                    )
                })?;
            requests.push(TraceRequest {
                workload: workload.name.clone(),
                id: request.id.clone(),
                max_tokens: request.request.max_tokens,
                prompt: request.request.prompt.clone(),
                output: outcome.tokens,
                stop_reason: outcome.stop_reason,
            });
            progress.inc(1);
        }
    }
    progress.finish_and_clear();
    Ok(Trace {
        target: TraceTarget {
            format: TRACE_FORMAT,
            path: inputs.model.clone(),
            sha256,
            vocab_size: facts.vocab_size,
            bos: facts.bos,
            eos: facts.eos,
            eog: facts.eog,
            context_size: facts.context_size,
            batch_size: session.batch_size(),
            threads: inputs.session.threads,
            verify_cost_context_tokens: costs.context_tokens,
            verify_costs_us: costs
                .per_batch
                .iter()
                .map(|cost| cost.as_secs_f64() * 1e6)
                .collect(),
        },
        requests,
    })
}

/// Records the trace and writes it to `--out`.
pub fn run(config: &TraceConfig) -> anyhow::Result<()> {
    let trace = record(config)?;
    trace.write(&config.out)?;
    let generated: usize = trace.requests.iter().map(|r| r.output.len()).sum();
    eprintln!(
        "traced {} requests of {} workload(s), {generated} generated tokens, into {}",
        trace.requests.len(),
        trace.workloads().len(),
        config.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> TraceTarget {
        TraceTarget {
            format: TRACE_FORMAT,
            path: "m.gguf".into(),
            sha256: "00".into(),
            vocab_size: 100,
            bos: Some(1),
            eos: Some(2),
            eog: vec![2],
            context_size: 512,
            batch_size: 512,
            threads: 2,
            verify_cost_context_tokens: 10,
            verify_costs_us: vec![1000.0, 1200.0],
        }
    }

    fn request(workload: &str, id: &str, output: Vec<Token>, stop: StopReason) -> TraceRequest {
        TraceRequest {
            workload: workload.into(),
            id: id.into(),
            max_tokens: 4,
            prompt: vec![1, 5, 6],
            output,
            stop_reason: stop,
        }
    }

    #[test]
    fn round_trips_and_groups_by_workload() {
        let trace = Trace {
            target: target(),
            requests: vec![
                request("edit", "a", vec![7, 8, 9, 10], StopReason::MaxTokens),
                request("edit", "b", vec![7, 2], StopReason::EndOfGeneration),
                request("code", "c", vec![3, 3, 3, 3], StopReason::MaxTokens),
            ],
        };
        let dir = std::env::temp_dir().join(format!("spechost-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("t.jsonl");
        trace.write(&path).expect("write");
        let read = Trace::read(&path).expect("read back");
        assert_eq!(read, trace);
        let groups: Vec<(&str, usize)> = read
            .workloads()
            .iter()
            .map(|(name, requests)| (*name, requests.len()))
            .collect();
        assert_eq!(groups, [("edit", 2), ("code", 1)]);
        assert_eq!(
            read.target.verify_costs().per_batch[1],
            Duration::from_micros(1200)
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn rejects_requests_a_replay_cannot_trust() {
        let header = serde_json::to_string(&Line::Target(target())).expect("json");
        for (bad, needle) in [
            (
                request("w", "short", vec![7, 8], StopReason::MaxTokens),
                "does not end as its stop reason",
            ),
            (
                request("w", "noeog", vec![7, 8], StopReason::EndOfGeneration),
                "does not end as its stop reason",
            ),
            (
                request("w", "long", vec![7, 8, 9, 10, 11], StopReason::MaxTokens),
                "exceed max_tokens",
            ),
            (
                request("w", "vocab", vec![7, 8, 9, 100], StopReason::MaxTokens),
                "token 100 is outside the vocabulary",
            ),
        ] {
            let line = serde_json::to_string(&Line::Request(bad)).expect("json");
            let err = Trace::parse(Path::new("t.jsonl"), &format!("{header}\n{line}\n"))
                .expect_err(needle)
                .to_string();
            assert!(
                err.starts_with("t.jsonl:2: request `") && err.contains(needle),
                "wanted `{needle}` in: {err}"
            );
        }
    }

    #[test]
    fn rejects_misplaced_records_other_formats_and_empty_traces() {
        let header = serde_json::to_string(&Line::Target(target())).expect("json");
        let line = serde_json::to_string(&Line::Request(request(
            "w",
            "a",
            vec![2],
            StopReason::EndOfGeneration,
        )))
        .expect("json");
        let parse = |text: String| {
            Trace::parse(Path::new("t.jsonl"), &text)
                .expect_err("invalid")
                .to_string()
        };
        assert!(parse(format!("{line}\n{header}")).contains(":1: a request before the target"));
        assert!(parse(format!("{header}\n{header}")).contains(":2: a second target record"));
        assert!(parse(header.clone()).contains("has no requests"));
        let old = header.replace("\"format\":1", "\"format\":0");
        assert!(parse(format!("{old}\n{line}")).contains("is trace format 0"));
    }
}
