//! What a request cost and how speculation did, printed once at the end.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::cascade::{SourceStats, ratio};

/// Counters of one generation request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens not read again: the prefix a server's sequence kept in its cache from its
    /// previous request (a shared system prompt, the earlier turns of a chat).
    pub cached_prompt_tokens: usize,
    /// Generated tokens (including a final end-of-generation token, if any).
    pub generated_tokens: usize,
    /// Time to decode the prompt and sample the first token.
    #[serde(serialize_with = "seconds")]
    pub prompt_time: Duration,
    /// Time from the first token to the last.
    #[serde(serialize_with = "seconds")]
    pub generation_time: Duration,
    /// Verify rounds after the first token (each commits at least one token).
    pub rounds: u64,
    /// Rounds that verified a non-empty draft.
    pub draft_rounds: u64,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Rounds whose draft was drawn at the request's temperature and verified by rejection
    /// sampling: the output then follows the target's distribution without being plain
    /// decoding's draw for the seed (docs/exactness.md).
    pub drawn_rounds: u64,
    /// Rounds whose draft was a tree of several continuations (`--cascade-mode tree`).
    pub tree_rounds: u64,
    /// Draft tokens proposed but not verified: a server's verify step cut them, their rows
    /// beside the other requests' rounds being worth less than they cost.
    pub cut_draft_tokens: u64,
    /// Tokens decoded again after a recurrent target's draft was cut short: its state was
    /// restored to before the verify batch and the accepted tokens replayed (`engine/recurrent.rs`);
    /// or accepted tokens of a tree off its leading chain, decoded again in the next round's
    /// batch (`engine/verify/tree.rs`).
    pub replayed_tokens: u64,
    /// `verify_batches[n - 1]`: rounds that verified a batch of `n` tokens (`[last, d1..]`).
    pub verify_batches: Vec<u64>,
    /// Requests verified in the batch of each round, summed over rounds (`rounds` when every
    /// round was verified alone; more in a server that verifies requests together).
    pub batch_requests: u64,
    /// Tokens of the batch of each round, every request's, summed over rounds.
    pub batch_tokens: u64,
    /// Time spent in `llama_decode` for verify batches.
    #[serde(serialize_with = "seconds")]
    pub verify_time: Duration,
    /// Time spent asking the cascade for drafts and feeding it.
    #[serde(serialize_with = "seconds")]
    pub draft_time: Duration,
    /// Per-source counters, in cascade order.
    pub sources: Vec<SourceStats>,
}

impl GenerationStats {
    /// Counts a verify round of `n_tokens` tokens (the last committed token and the draft).
    pub fn count_verify_batch(&mut self, n_tokens: usize) {
        if self.verify_batches.len() < n_tokens {
            self.verify_batches.resize(n_tokens, 0);
        }
        if let Some(count) = n_tokens
            .checked_sub(1)
            .and_then(|i| self.verify_batches.get_mut(i))
        {
            *count += 1;
        }
    }

    /// Prompt tokens per second.
    pub fn prompt_tokens_per_second(&self) -> f64 {
        per_second(self.prompt_tokens, self.prompt_time)
    }

    /// Generated tokens per second after the first token.
    pub fn generation_tokens_per_second(&self) -> f64 {
        per_second(
            self.generated_tokens.saturating_sub(1),
            self.generation_time,
        )
    }

    /// Requests per verify batch the rounds were in, on average (1 when alone).
    pub fn mean_batch_requests(&self) -> f64 {
        ratio(self.batch_requests, self.rounds)
    }

    /// Tokens per verify batch the rounds were in, every request's, on average.
    pub fn mean_batch_tokens(&self) -> f64 {
        ratio(self.batch_tokens, self.rounds)
    }

    /// Accepted over drafted tokens, in [0, 1].
    pub fn acceptance(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Mean accepted draft tokens per round that verified a draft.
    pub fn mean_accepted_per_draft_round(&self) -> f64 {
        ratio(self.accepted, self.draft_rounds)
    }

    /// Share of generation time spent outside the target's verify batches (drafting, sampling,
    /// detokenizing, bookkeeping), in [0, 1].
    pub fn overhead(&self) -> f64 {
        let total = self.generation_time.as_secs_f64();
        if total > 0.0 {
            (1.0 - self.verify_time.as_secs_f64() / total).max(0.0)
        } else {
            0.0
        }
    }

    /// The stats block printed after a run.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "prompt      {:>6} tokens  {:>8.1} tok/s  ({:.3} s)",
            self.prompt_tokens,
            self.prompt_tokens_per_second(),
            self.prompt_time.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "generation  {:>6} tokens  {:>8.1} tok/s  ({:.3} s)",
            self.generated_tokens,
            self.generation_tokens_per_second(),
            self.generation_time.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "rounds      {:>6}  drafted {}  accepted {}  acceptance {:.1}%  mean accepted/draft round {:.2}",
            self.rounds,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance(),
            self.mean_accepted_per_draft_round()
        );
        if self.tree_rounds > 0 {
            let _ = writeln!(
                out,
                "trees       {:>6} rounds verified a tree of drafts",
                self.tree_rounds
            );
        }
        if self.replayed_tokens > 0 {
            let _ = writeln!(
                out,
                "replayed    {:>6} tokens decoded again (accepted tree rows off the leading chain, or a recurrent target's state after drafts cut short)",
                self.replayed_tokens
            );
        }
        let _ = writeln!(
            out,
            "time        verify {:.3} s  draft {:.3} s  outside verify {:.2}%",
            self.verify_time.as_secs_f64(),
            self.draft_time.as_secs_f64(),
            100.0 * self.overhead()
        );
        for s in &self.sources {
            let _ = writeln!(
                out,
                "source {:<12} asked {} proposed {} won {} drafted {} accepted {} ({:.1}%) faults {} time {:.3} ms",
                s.name,
                s.asked,
                s.proposed,
                s.won,
                s.drafted,
                s.accepted,
                100.0 * s.acceptance(),
                s.faults,
                s.time.as_secs_f64() * 1e3
            );
        }
        out
    }
}

fn per_second(tokens: usize, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    }
}

fn seconds<S: serde::Serializer>(time: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(time.as_secs_f64())
}
