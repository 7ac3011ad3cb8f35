//! The batcher: one thread decodes for every request a server generates at once, in one
//! shared [`Session`] with a sequence per request, so a step reads the weights once for all of
//! them.
//!
//! Each request runs the round protocol (`rounds.rs`, [`generate`]) on its own thread, as one
//! request does in `spechost run`, over a [`BatchedSequence`]: a [`Verifier`] whose prefill and
//! verify calls go to the batcher and wait for its answer. The batcher, on the thread that owns
//! the session (a server's main thread, where llama.cpp's OpenMP team runs best), repeats one
//! step:
//! 1. wait for a call, then give the sequences still working on their next call (proposing a
//!    draft, streaming text) a moment to make it too ([`MAX_GATHER_WAIT`] at most, less when
//!    steps are quick), so their rounds share the step;
//! 2. verify every waiting round in one decode ([`Session::verify_batch`]): each sequence's
//!    `[last, draft..]` rows, sampled with its own sampler and rolled back on its own;
//! 3. decode one chunk of the oldest waiting prompt, in a decode of its own, so running
//!    requests keep streaming while a long prompt is read (a prompt's chunks are at most
//!    `prefill_chunk` tokens; a cancelled request stops between chunks).
//!
//! A request's output does not depend on what else is in a step: every row of a batch is
//! computed as it would be alone (batch-invariant kernels, a KV stream per sequence; the
//! session's start-up check proves it for batches of several sequences), and every committed
//! token is sampled from its own sequence's logits with its own sampler.
//!
//! Not here: which request a sequence serves (the server's slots and queue), drafting (the
//! sequence's thread runs its cascade), and the round protocol (`rounds.rs`).

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::context::SeqId;
use super::error::EngineError;
use super::model::Target;
use super::rounds::{
    Outcome, Prefill, Request, RoundControl, RoundDraft, Verified, Verifier, generate,
};
use super::sample::SamplingParams;
use super::verify::{Session, VerifyCurve, check_request_fits};
use crate::cascade::{Cascade, ModelFacts, Token};

/// The longest the batcher waits for sequences still preparing their next round before it
/// decodes the rounds it has: a slow plugin delays its own request, not the others.
pub const MAX_GATHER_WAIT: Duration = Duration::from_millis(20);
/// The shortest such wait: a sequence's work between two rounds (settling, streaming,
/// proposing) takes about this long with quick plugins.
const MIN_GATHER_WAIT: Duration = Duration::from_micros(500);

/// How the batcher schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatcherSettings {
    /// Most prompt tokens decoded in one step for a request being prefilled.
    pub prefill_chunk: usize,
}

/// What a sequence asks of the batcher.
enum Call {
    /// Decode a chunk of `seq`'s prompt; the first chunk carries the request's sampling and
    /// starts the request.
    Prefill {
        seq: SeqId,
        chunk: Vec<Token>,
        position: usize,
        sampling: Option<SamplingParams>,
        last: bool,
    },
    /// Verify `seq`'s round.
    Verify { seq: SeqId, round: RoundDraft },
    /// `seq`'s request ended.
    End { seq: SeqId },
}

/// The batcher's answer to a sequence's call.
enum Reply {
    /// A prompt chunk was decoded; after the last, the target's first token.
    Prefilled(Result<Option<Token>, EngineError>),
    /// The round was verified.
    Verified(Result<Verified, EngineError>),
}

/// What a sequence is doing, as the batcher sees it.
#[derive(Debug)]
enum SeqState {
    /// No request.
    Idle,
    /// Between calls: settling, streaming, drafting its next round.
    Working,
    /// Waiting for a prompt chunk to be decoded.
    Prefilling {
        chunk: Vec<Token>,
        position: usize,
        last: bool,
    },
    /// Waiting for its round to be verified.
    Verifying(RoundDraft),
}

/// The thread that decodes for every sequence; see the [module](self) docs.
pub struct Batcher<'t> {
    session: Session<'t>,
    settings: BatcherSettings,
    inbox: Receiver<Call>,
    replies: Vec<Sender<Reply>>,
    states: Vec<SeqState>,
    /// Sequences waiting for a prompt chunk, oldest first.
    prefill_order: VecDeque<SeqId>,
    /// Time of the last verify batch: how long a step takes.
    last_verify: Duration,
}

impl<'t> Batcher<'t> {
    /// A batcher over `session` and one [`BatchedSequence`] per sequence of it, for the
    /// threads that generate. Measure the session's verify curve first: every sequence gets
    /// it for its policies.
    pub fn new(
        session: Session<'t>,
        settings: BatcherSettings,
    ) -> (Self, Vec<BatchedSequence<'t>>) {
        let (calls, inbox) = mpsc::channel();
        let facts = session.target().facts(session.ctx_size());
        let prefill_chunk = settings.prefill_chunk.clamp(1, session.batch_size());
        let mut replies = Vec::with_capacity(session.sequences());
        let mut sequences = Vec::with_capacity(session.sequences());
        for index in 0..session.sequences() {
            let (reply, answers) = mpsc::channel();
            replies.push(reply);
            sequences.push(BatchedSequence {
                seq: SeqId(index as u32),
                target: session.target(),
                facts: facts.clone(),
                batch_size: session.batch_size(),
                verify_curve: session.verify_curve().clone(),
                prefill_chunk,
                calls: calls.clone(),
                answers,
                active: false,
            });
        }
        let states = (0..session.sequences()).map(|_| SeqState::Idle).collect();
        let batcher = Self {
            session,
            settings: BatcherSettings { prefill_chunk },
            inbox,
            replies,
            states,
            prefill_order: VecDeque::new(),
            last_verify: Duration::ZERO,
        };
        (batcher, sequences)
    }

    /// Decodes for the sequences until every [`BatchedSequence`] is dropped.
    pub fn run(mut self) {
        tracing::debug!(
            sequences = self.states.len(),
            prefill_chunk = self.settings.prefill_chunk,
            "batcher started"
        );
        loop {
            if !self.has_waiting() {
                match self.inbox.recv() {
                    Ok(call) => self.take(call),
                    Err(_) => break,
                }
            }
            self.gather();
            self.step();
        }
        tracing::debug!("batcher stopped: every sequence is gone");
    }

    /// Takes calls until no sequence is working on its next one, or the gather wait is over.
    fn gather(&mut self) {
        let wait = self.last_verify.clamp(MIN_GATHER_WAIT, MAX_GATHER_WAIT);
        let deadline = Instant::now() + wait;
        loop {
            while let Ok(call) = self.inbox.try_recv() {
                self.take(call);
            }
            let now = Instant::now();
            if !self.states.iter().any(|s| matches!(s, SeqState::Working)) || now >= deadline {
                return;
            }
            match self.inbox.recv_timeout(deadline - now) {
                Ok(call) => self.take(call),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn has_waiting(&self) -> bool {
        self.states.iter().any(|state| {
            matches!(
                state,
                SeqState::Prefilling { .. } | SeqState::Verifying(_)
            )
        })
    }

    fn take(&mut self, call: Call) {
        match call {
            Call::Prefill {
                seq,
                chunk,
                position,
                sampling,
                last,
            } => {
                if let Some(sampling) = sampling
                    && let Err(error) = self.session.begin(seq, &sampling)
                {
                    self.reply(seq, Reply::Prefilled(Err(error)));
                    return;
                }
                self.set_state(
                    seq,
                    SeqState::Prefilling {
                        chunk,
                        position,
                        last,
                    },
                );
                self.prefill_order.push_back(seq);
            }
            Call::Verify { seq, round } => self.set_state(seq, SeqState::Verifying(round)),
            Call::End { seq } => {
                self.session.end(seq);
                self.prefill_order.retain(|waiting| *waiting != seq);
                self.set_state(seq, SeqState::Idle);
            }
        }
    }

    /// One step: every waiting round in one verify batch, then one prompt chunk.
    fn step(&mut self) {
        let mut rounds = Vec::new();
        for (index, state) in self.states.iter_mut().enumerate() {
            if matches!(state, SeqState::Verifying(_))
                && let SeqState::Verifying(round) = std::mem::replace(state, SeqState::Working)
            {
                rounds.push((SeqId(index as u32), round));
            }
        }
        if !rounds.is_empty() {
            let started = Instant::now();
            let batch: Vec<(SeqId, &RoundDraft)> =
                rounds.iter().map(|(seq, round)| (*seq, round)).collect();
            let results = self.session.verify_batch(&batch);
            self.last_verify = started.elapsed();
            tracing::trace!(
                sequences = rounds.len(),
                rows = results
                    .iter()
                    .find_map(|r| r.as_ref().ok())
                    .map_or(0, |v| v.batch.rows),
                ms = self.last_verify.as_secs_f64() * 1e3,
                "verify batch"
            );
            for ((seq, _), result) in rounds.iter().zip(results) {
                self.reply(*seq, Reply::Verified(result));
            }
        }
        if let Some(seq) = self.prefill_order.pop_front() {
            let state = std::mem::replace(&mut self.states[seq.0 as usize], SeqState::Working);
            if let SeqState::Prefilling {
                chunk,
                position,
                last,
            } = state
            {
                let result = self.session.prefill_chunk(seq, &chunk, position, last);
                self.reply(seq, Reply::Prefilled(result));
            }
        }
    }

    fn set_state(&mut self, seq: SeqId, state: SeqState) {
        if let Some(slot) = self.states.get_mut(seq.0 as usize) {
            *slot = state;
        }
    }

    /// Answers `seq`; a sequence that is gone has sent its `End` already, or will.
    fn reply(&self, seq: SeqId, reply: Reply) {
        if let Some(sender) = self.replies.get(seq.0 as usize) {
            let _ = sender.send(reply);
        }
    }
}

/// One sequence of a [`Batcher`]'s session, on the thread that generates its requests: a
/// [`Verifier`] that has the batcher decode.
pub struct BatchedSequence<'t> {
    seq: SeqId,
    target: &'t Target,
    facts: ModelFacts,
    batch_size: usize,
    verify_curve: VerifyCurve,
    prefill_chunk: usize,
    calls: Sender<Call>,
    answers: Receiver<Reply>,
    /// Whether the batcher holds a request of this sequence (from its first prompt chunk to
    /// [`Self::end`]).
    active: bool,
}

impl BatchedSequence<'_> {
    /// Which sequence of the session this is.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// Context size of the sequence, in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.facts.context_size
    }

    /// Generates `request` as [`Session::generate_controlled`] does, the batcher decoding, then
    /// ends the request in the batcher (whatever the outcome).
    pub fn generate_controlled(
        &mut self,
        request: &Request,
        cascade: &mut Cascade,
        on_text: &mut dyn FnMut(&str),
        control: &mut dyn RoundControl,
    ) -> Result<Outcome, EngineError> {
        check_request_fits(request, self.ctx_size())?;
        let outcome = generate(self, request, cascade, on_text, control);
        self.end();
        outcome
    }

    /// Tells the batcher that this sequence's request is over (it may stop waiting for it and
    /// empties its cache). Done by [`Self::generate_controlled`] and on drop.
    pub fn end(&mut self) {
        if std::mem::take(&mut self.active) {
            let _ = self.calls.send(Call::End { seq: self.seq });
        }
    }

    fn call(&mut self, call: Call) -> Result<Reply, EngineError> {
        self.calls
            .send(call)
            .map_err(|_| EngineError::BatcherStopped)?;
        self.answers.recv().map_err(|_| EngineError::BatcherStopped)
    }
}

impl Drop for BatchedSequence<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

impl Verifier for BatchedSequence<'_> {
    fn facts(&self) -> ModelFacts {
        self.facts.clone()
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn can_verify_drafts(&self) -> bool {
        self.target.can_roll_back()
    }

    fn is_eog(&self, token: Token) -> bool {
        self.target.is_eog(token)
    }

    fn token_bytes(&self, token: Token, out: &mut Vec<u8>) {
        self.target.token_bytes(token, out);
    }

    fn verify_costs(&self, context_len: usize) -> Vec<Duration> {
        self.verify_curve.at(context_len)
    }

    fn prefill(
        &mut self,
        request: &Request,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Prefill, EngineError> {
        self.end();
        let chunks = request.prompt.chunks(self.prefill_chunk);
        let n_chunks = chunks.len();
        if n_chunks == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        let mut position = 0;
        for (index, chunk) in chunks.enumerate() {
            if index > 0 && stop() {
                self.end();
                return Ok(Prefill::Stopped { read: position });
            }
            self.active = true;
            let last = index + 1 == n_chunks;
            let reply = self.call(Call::Prefill {
                seq: self.seq,
                chunk: chunk.to_vec(),
                position,
                sampling: (index == 0).then(|| request.sampling.clone()),
                last,
            })?;
            match reply {
                Reply::Prefilled(Ok(Some(first))) if last => return Ok(Prefill::Done { first }),
                Reply::Prefilled(Ok(_)) => position += chunk.len(),
                Reply::Prefilled(Err(error)) => return Err(error),
                Reply::Verified(_) => unreachable!("the batcher answers a prompt chunk with Prefilled"),
            }
        }
        Err(EngineError::NoRequest)
    }

    fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
        match self.call(Call::Verify {
            seq: self.seq,
            round: round.clone(),
        })? {
            Reply::Verified(result) => result,
            Reply::Prefilled(_) => unreachable!("the batcher answers a round with Verified"),
        }
    }
}
