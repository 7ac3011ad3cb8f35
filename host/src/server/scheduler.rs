//! The bounded queue between HTTP handlers and the engine's slots.
//!
//! Fairness is arrival order: a free slot always takes the oldest waiting request, so no
//! request is overtaken. Of several free slots the lowest-numbered takes it: busy slots stay
//! packed at the low sequence numbers, which llama.cpp decodes together in one pass over the
//! weights (it splits a batch at a gap in sequence numbers). The exception is a slot whose
//! cache already holds at least half of the request's prompt, and more of it than the lowest
//! slot's (the next turn of the conversation it served): it takes the request, and reads only
//! the rest of the prompt, as llama-server's slot choice by prompt similarity does. The queue holds at most `slots + max_queue` requests in all (running
//! plus waiting); [`Queue::submit`] refuses the next with [`Rejected::Full`], which the API
//! answers with 429 and a `Retry-After` estimated from recent request times.
//!
//! A request's tokens flow back to its handler over an unbounded tokio channel of [`Event`]s
//! (bounded in practice by `max_tokens`), so a slow client never stalls a slot. When the client
//! goes away its handler drops the receiving end; the slot sees the channel closed before it
//! starts the request, or between two rounds, and stops.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::metrics::Endpoint;
use super::registry::{CascadeChoice, ResolvedPolicy};
use crate::cascade::{CascadeMode, Token};
use crate::engine::{Outcome, Request, TokenLogprob, shared_prefix};

/// Longest `Retry-After` the server suggests, in seconds.
const MAX_RETRY_AFTER_SECS: u64 = 60;

/// One request waiting for, or running in, a slot.
#[derive(Debug)]
pub struct Job {
    /// Which endpoint it came from (for metrics).
    pub endpoint: Endpoint,
    /// What to generate.
    pub request: Request,
    /// Which sources draft for it.
    pub cascade: CascadeChoice,
    /// How its cascade picks drafts.
    pub mode: CascadeMode,
    /// Whether it also drafts with the grammar source (when it has a grammar).
    pub grammar_drafts: bool,
    /// The policy choosing its draft lengths; `None` drafts `draft_max` every round.
    pub policy: Option<ResolvedPolicy>,
    /// Which of the request's choices (`n`) it generates, from 0.
    pub choice: usize,
    /// Where its text and result go (shared by the request's choices).
    pub events: UnboundedSender<Event>,
    /// The request's tracing span, entered by the slot.
    pub span: tracing::Span,
    /// When it was queued.
    pub queued_at: Instant,
}

/// What a slot sends back about a request.
#[derive(Debug)]
pub enum Event {
    /// Text that is final, with the log-probabilities of the tokens it completes (empty
    /// unless the request asked for them).
    Text {
        /// The choice it belongs to.
        choice: usize,
        /// The text.
        text: String,
        /// The tokens' log-probabilities.
        logprobs: Vec<TokenLogprob>,
    },
    /// Generation finished.
    Done(Box<Finished>),
    /// Generation failed; the error says why (a 400 when the request's own settings caused it,
    /// such as a grammar too slow to follow).
    Failed(ApiError),
}

/// The result of a finished request.
#[derive(Debug)]
pub struct Finished {
    /// The choice it is.
    pub choice: usize,
    /// Tokens, text, stop reason and stats.
    pub outcome: Outcome,
    /// Names of the sources the last round drafted with.
    pub cascade: Vec<String>,
    /// The draft length the request ran with.
    pub max_draft_len: usize,
    /// The cascade mode the request ran with.
    pub mode: CascadeMode,
    /// The policy and its settings, if the request had one.
    pub policy: Option<String>,
    /// Times its cascade was replaced between rounds (hot swaps).
    pub swaps: u32,
    /// Time it waited for a slot.
    pub queue_time: Duration,
}

/// Why a request was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Every slot is busy and the queue is full.
    #[error(
        "the server is busy: {running} requests running and {waiting} waiting, as many as it holds ({slots} slots plus {max_queue} waiting, --parallel and --max-queue); retry after {retry_after_secs} s"
    )]
    Full {
        /// Requests being generated.
        running: usize,
        /// Requests waiting (more than `max_queue` while slots have yet to take theirs).
        waiting: usize,
        /// Slots.
        slots: usize,
        /// Most requests that wait while every slot is busy.
        max_queue: usize,
        /// Suggested wait before retrying, in seconds.
        retry_after_secs: u64,
    },
    /// The server is shutting down.
    #[error("the server is shutting down; retry on another instance or after it restarts")]
    ShuttingDown,
}

/// Queue occupancy, for `/metrics` and `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueGauges {
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Requests being generated.
    pub running: usize,
    /// Slots.
    pub slots: usize,
    /// Most requests that may wait.
    pub max_queue: usize,
}

#[derive(Debug, Default)]
struct State {
    waiting: VecDeque<Job>,
    running: usize,
    /// Slots waiting in [`Queue::next`], with the tokens their caches hold.
    idle: BTreeMap<usize, Vec<Token>>,
    closed: bool,
}

/// The first-come-first-served queue of requests, shared by handlers and slots.
#[derive(Debug)]
pub struct Queue {
    state: Mutex<State>,
    ready: Condvar,
    slots: usize,
    max_queue: usize,
}

impl Queue {
    /// A queue feeding `slots` slots, holding at most `max_queue` waiting requests.
    pub fn new(slots: usize, max_queue: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            slots,
            max_queue,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves the queue consistent (every change is one
        // push, pop or counter update), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues every one of `jobs` (a request's choices), or refuses them all when they would
    /// make more than `slots + max_queue` requests in all. The `Retry-After` of a refusal
    /// assumes requests take `request_time` (recent ones' mean).
    pub fn submit(&self, jobs: Vec<Job>, request_time: Duration) -> Result<(), Rejected> {
        let mut state = self.lock();
        if state.closed {
            return Err(Rejected::ShuttingDown);
        }
        if state.running + state.waiting.len() + jobs.len() > self.slots + self.max_queue {
            return Err(Rejected::Full {
                running: state.running,
                waiting: state.waiting.len(),
                slots: self.slots,
                max_queue: self.max_queue,
                retry_after_secs: retry_after_secs(state.waiting.len(), self.slots, request_time),
            });
        }
        state.waiting.extend(jobs);
        drop(state);
        // Every idle slot wakes; the lowest-numbered takes the job.
        self.ready.notify_all();
        Ok(())
    }

    /// The oldest waiting request for `slot`, whose cache holds `held`, blocking until there is
    /// one that this slot is the one to take (see the [module](self) docs); `None` once the
    /// queue is closed and empty. The caller must call [`Self::finished`] when done with it.
    pub fn next(&self, slot: usize, held: &[Token]) -> Option<Job> {
        let mut state = self.lock();
        state.idle.insert(slot, held.to_vec());
        loop {
            let taker = state
                .waiting
                .front()
                .and_then(|job| taker(&state.idle, &job.request.prompt));
            if taker == Some(slot)
                && let Some(job) = state.waiting.pop_front()
            {
                state.idle.remove(&slot);
                state.running += 1;
                let more = !state.waiting.is_empty();
                drop(state);
                if more {
                    // The next idle slot takes the next job.
                    self.ready.notify_all();
                }
                return Some(job);
            }
            if state.closed && state.waiting.is_empty() {
                state.idle.remove(&slot);
                drop(state);
                self.ready.notify_all();
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A slot finished the request it took with [`Self::next`].
    pub fn finished(&self) {
        let mut state = self.lock();
        state.running = state.running.saturating_sub(1);
    }

    /// Refuses new requests; slots finish those already queued, then [`Self::next`] returns
    /// `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Per slot, in order: whether it is generating (not waiting for a request).
    pub fn slots_busy(&self) -> Vec<bool> {
        let state = self.lock();
        (0..self.slots)
            .map(|slot| !state.idle.contains_key(&slot))
            .collect()
    }

    /// Current occupancy.
    pub fn gauges(&self) -> QueueGauges {
        let state = self.lock();
        QueueGauges {
            waiting: state.waiting.len(),
            running: state.running,
            slots: self.slots,
            max_queue: self.max_queue,
        }
    }
}

/// Seconds until a slot is likely free for a new request: the waiting requests plus one, spread
/// over the slots, at `request_time` each; at least 1, at most [`MAX_RETRY_AFTER_SECS`].
/// The idle slot that takes a request of `prompt`: the lowest-numbered, unless another one's
/// cache holds at least half of the prompt and more of it than the lowest one's.
fn taker(idle: &BTreeMap<usize, Vec<Token>>, prompt: &[Token]) -> Option<usize> {
    let shared = |held: &[Token]| shared_prefix(held, prompt);
    let (&lowest, lowest_held) = idle.first_key_value()?;
    let lowest_shared = shared(lowest_held);
    let (best, best_shared) = idle.iter().map(|(&slot, held)| (slot, shared(held))).fold(
        (lowest, lowest_shared),
        |best, candidate| {
            if candidate.1 > best.1 {
                candidate
            } else {
                best
            }
        },
    );
    Some(
        if 2 * best_shared >= prompt.len() && best_shared > lowest_shared {
            best
        } else {
            lowest
        },
    )
}

fn retry_after_secs(waiting: usize, slots: usize, request_time: Duration) -> u64 {
    let rounds = (waiting + 1).div_ceil(slots.max(1)) as f64;
    let secs = (rounds * request_time.as_secs_f64()).ceil() as u64;
    secs.clamp(1, MAX_RETRY_AFTER_SECS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;

    /// A job told apart from others by its `max_tokens`.
    fn job(number: usize) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        let job = Job {
            endpoint: Endpoint::Completions,
            request: Request::new(vec![1], number, SamplingParams::greedy()),
            cascade: CascadeChoice::Default,
            mode: CascadeMode::First,
            grammar_drafts: true,
            policy: None,
            choice: 0,
            events,
            span: tracing::Span::none(),
            queued_at: Instant::now(),
        };
        (job, receiver)
    }

    #[test]
    fn serves_in_arrival_order_and_refuses_beyond_slots_plus_queue() {
        let queue = Queue::new(1, 2);
        let mean = Duration::from_secs(2);
        let mut receivers = Vec::new();
        for number in [1, 2, 3] {
            let (job, receiver) = job(number);
            queue
                .submit(vec![job], mean)
                .expect("room for 1 running + 2 waiting");
            receivers.push(receiver);
        }
        let (extra, _receiver) = job(4);
        let refused = queue.submit(vec![extra], mean).expect_err("full");
        assert_eq!(
            refused,
            Rejected::Full {
                running: 0,
                waiting: 3,
                slots: 1,
                max_queue: 2,
                retry_after_secs: 8
            }
        );
        assert!(
            refused
                .to_string()
                .contains("3 waiting, as many as it holds (1 slots plus 2 waiting"),
            "{refused}"
        );
        let first = queue.next(0, &[]).expect("a job");
        assert_eq!(first.request.max_tokens, 1, "the oldest job first");
        assert_eq!(
            queue.gauges(),
            QueueGauges {
                waiting: 2,
                running: 1,
                slots: 1,
                max_queue: 2
            }
        );
        queue.finished();
        assert_eq!(queue.next(0, &[]).map(|j| j.request.max_tokens), Some(2));
    }

    #[test]
    fn closing_refuses_new_jobs_and_drains_queued_ones() {
        let queue = Queue::new(1, 1);
        let (queued, _r1) = job(1);
        queue.submit(vec![queued], Duration::ZERO).expect("room");
        queue.close();
        let (late, _r2) = job(2);
        assert_eq!(
            queue.submit(vec![late], Duration::ZERO),
            Err(Rejected::ShuttingDown)
        );
        assert_eq!(queue.next(0, &[]).map(|j| j.request.max_tokens), Some(1));
        queue.finished();
        assert!(queue.next(0, &[]).is_none(), "closed and empty");
    }

    #[test]
    fn the_lowest_idle_slot_takes_a_job() {
        let queue = std::sync::Arc::new(Queue::new(3, 4));
        let (taken, took) = std::sync::mpsc::channel();
        let slots: Vec<_> = [2, 1]
            .into_iter()
            .map(|slot| {
                let (shared, taken) = (std::sync::Arc::clone(&queue), taken.clone());
                let thread = std::thread::spawn(move || {
                    while let Some(job) = shared.next(slot, &[]) {
                        taken
                            .send((slot, job.request.max_tokens))
                            .expect("the test listens");
                        shared.finished();
                    }
                });
                // Both slots wait before any job arrives.
                while !queue.lock().idle.contains_key(&slot) {
                    std::thread::yield_now();
                }
                thread
            })
            .collect();
        let (job, _receiver) = job(7);
        queue.submit(vec![job], Duration::ZERO).expect("room");
        assert_eq!(
            took.recv().expect("a slot took it"),
            (1, 7),
            "slot 1 is the lowest idle slot"
        );
        queue.close();
        for slot in slots {
            slot.join().expect("slot thread");
        }
    }

    #[test]
    fn a_slot_holding_most_of_the_prompt_takes_it_else_the_lowest() {
        let prompt: Vec<Token> = (0..10).collect();
        let idle = BTreeMap::from([
            (1, vec![0, 1, 2, 99]),
            (3, (0..8).collect::<Vec<Token>>()),
            (5, (0..9).chain([42]).collect::<Vec<Token>>()),
        ]);
        assert_eq!(
            taker(&idle, &prompt),
            Some(5),
            "slot 5 holds 9 of 10 tokens"
        );
        let idle = BTreeMap::from([(1, vec![0, 1]), (3, vec![0, 1, 2, 3])]);
        assert_eq!(
            taker(&idle, &prompt),
            Some(1),
            "4 of 10 tokens are not worth leaving the lowest slot"
        );
        let idle = BTreeMap::from([(1, prompt.clone()), (3, prompt.clone())]);
        assert_eq!(taker(&idle, &prompt), Some(1), "a tie goes to the lowest");
        assert_eq!(taker(&BTreeMap::new(), &prompt), None);
    }

    #[test]
    fn retry_after_spreads_waiting_requests_over_slots() {
        assert_eq!(retry_after_secs(0, 1, Duration::ZERO), 1, "at least 1 s");
        assert_eq!(retry_after_secs(3, 2, Duration::from_millis(1500)), 3);
        assert_eq!(
            retry_after_secs(1000, 1, Duration::from_secs(5)),
            MAX_RETRY_AFTER_SECS
        );
    }
}
