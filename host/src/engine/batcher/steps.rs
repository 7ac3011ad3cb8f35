//! [`Batcher`]: the decoding thread's loop of steps.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::calls::{Call, Reply};
use super::draft::{BatchedDraftFactory, DraftSide};
use super::sequence::BatchedSequence;
use crate::cascade::{Drafted, Token};
use crate::engine::context::SeqId;
use crate::engine::draft::BatchDrafter;
use crate::engine::rounds::RoundDraft;
use crate::engine::verify::Session;

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

/// The thread that decodes for every sequence; see the [module](super) docs.
pub struct Batcher<'t> {
    session: Session<'t>,
    draft: Option<DraftSide<'t>>,
    settings: BatcherSettings,
    calls: Sender<Call>,
    inbox: Receiver<Call>,
    replies: Vec<Sender<Reply>>,
    states: Vec<SeqState>,
    /// Sequences waiting for a prompt chunk, oldest first.
    prefill_order: VecDeque<SeqId>,
    /// Time of the last verify batch: how long a step takes.
    last_verify: Duration,
    /// Sequences whose [`BatchedSequence`] is not dropped yet.
    open: usize,
    /// When the last verify batch ended.
    last_step_end: Instant,
}

impl<'t> Batcher<'t> {
    /// A batcher over `session` (and `draft`, the draft model's context for the plugin
    /// instances that draft with it, if any) and one [`BatchedSequence`] per sequence of the
    /// session, for the threads that generate. Measure the session's verify curve first:
    /// every sequence gets it for its policies.
    pub fn new(
        session: Session<'t>,
        draft: Option<Box<dyn BatchDrafter + 't>>,
        settings: BatcherSettings,
    ) -> (Self, Vec<BatchedSequence<'t>>) {
        let (calls, inbox) = mpsc::channel();
        let prefill_chunk = settings.prefill_chunk.clamp(1, session.batch_size());
        let session_sequences = session.sequences();
        let mut replies = Vec::with_capacity(session.sequences());
        let mut sequences = Vec::with_capacity(session.sequences());
        for index in 0..session.sequences() {
            let (reply, answers) = mpsc::channel();
            replies.push(reply);
            sequences.push(BatchedSequence::new(
                SeqId(index as u32),
                &session,
                prefill_chunk,
                calls.clone(),
                answers,
            ));
        }
        let states = (0..session.sequences()).map(|_| SeqState::Idle).collect();
        let batcher = Self {
            session,
            draft: draft.map(DraftSide::new),
            settings: BatcherSettings { prefill_chunk },
            calls,
            inbox,
            replies,
            states,
            prefill_order: VecDeque::new(),
            last_verify: Duration::ZERO,
            open: session_sequences,
            last_step_end: Instant::now(),
        };
        (batcher, sequences)
    }

    /// Context size of each sequence, in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.session.ctx_size()
    }

    /// The factory of plugin instances' draft-model contexts, sequences of the batcher's draft
    /// context; `None` without a draft model. Call it once: each factory hands out every
    /// sequence.
    pub fn draft_factory(&self) -> Option<BatchedDraftFactory> {
        let draft = self.draft.as_ref()?;
        Some(BatchedDraftFactory::new(
            self.calls.clone(),
            draft.sequences(),
            self.session.target().vocab_size(),
            draft.ctx_size(),
        ))
    }

    /// Decodes for the sequences until every [`BatchedSequence`] is dropped (a draft-model
    /// handle still held by a plugin instance then gets no more draft tokens).
    pub fn run(mut self) {
        tracing::debug!(
            sequences = self.states.len(),
            prefill_chunk = self.settings.prefill_chunk,
            "batcher started"
        );
        // The batcher's own sender would keep the inbox open for ever.
        let (closed, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.calls, closed));
        while self.open > 0 {
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
            if self.working() == 0 || now >= deadline {
                return;
            }
            match self.inbox.recv_timeout(deadline - now) {
                Ok(call) => self.take(call),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Sequences between two calls, not counting those waiting on the draft model (a draft
    /// proposal comes from a sequence's thread while it prepares its round).
    fn working(&self) -> usize {
        let working = self
            .states
            .iter()
            .filter(|state| matches!(state, SeqState::Working))
            .count();
        working.saturating_sub(self.draft.as_ref().map_or(0, DraftSide::waiting))
    }

    fn has_waiting(&self) -> bool {
        self.draft.as_ref().is_some_and(|draft| draft.waiting() > 0)
            || self
                .states
                .iter()
                .any(|state| matches!(state, SeqState::Prefilling { .. } | SeqState::Verifying(_)))
    }

    fn take(&mut self, call: Call) {
        match call {
            Call::Prefill {
                seq,
                chunk,
                position,
                start,
                last,
            } => {
                if let Some(start) = start
                    && let Err(error) = self.session.begin(seq, &start.sampling, start.keep)
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
            Call::Close => self.open = self.open.saturating_sub(1),
            Call::Draft { ask, reply } => match &mut self.draft {
                Some(draft) => draft.ask(ask, reply),
                None => {
                    let _ = reply.send(Drafted::default());
                }
            },
            Call::CloseDraft { seq } => {
                if let Some(draft) = &mut self.draft {
                    draft.close(seq);
                }
            }
        }
    }

    /// One step: the waiting draft proposals, all together (their sequences then verify in the
    /// next step, with the others); or every waiting round in one verify batch, then one prompt
    /// chunk.
    fn step(&mut self) {
        if let Some(draft) = &mut self.draft
            && draft.waiting() > 0
        {
            draft.step();
            return;
        }
        self.verify();
        self.prefill();
    }

    /// Verifies every waiting round in one batch.
    fn verify(&mut self) {
        // Sequences still preparing their rounds, which this step leaves to the next one.
        let left_working = self.working();
        let mut rounds = Vec::new();
        for (index, state) in self.states.iter_mut().enumerate() {
            if matches!(state, SeqState::Verifying(_))
                && let SeqState::Verifying(round) = std::mem::replace(state, SeqState::Working)
            {
                rounds.push((SeqId(index as u32), round));
            }
        }
        if rounds.is_empty() {
            return;
        }
        let proposed = rows(&rounds);
        let cutting = Instant::now();
        self.session.cut_drafts(&mut rounds);
        let cut_us = cutting.elapsed().as_micros();
        let started = Instant::now();
        let batch: Vec<(SeqId, &RoundDraft)> =
            rounds.iter().map(|(seq, round)| (*seq, round)).collect();
        let results = self.session.verify_batch(&batch);
        self.last_verify = started.elapsed();
        tracing::debug!(
            ?proposed,
            left_working,
            cut_us,
            rows = ?rows(&rounds),
            ms = self.last_verify.as_secs_f64() * 1e3,
            since_last_ms = self.last_step_end.elapsed().as_secs_f64() * 1e3 - self.last_verify.as_secs_f64() * 1e3,
            "verify batch"
        );
        self.last_step_end = Instant::now();
        for ((seq, _), result) in rounds.iter().zip(results) {
            self.reply(*seq, Reply::Verified(result));
        }
    }

    /// Decodes one chunk of the oldest waiting prompt.
    fn prefill(&mut self) {
        let Some(seq) = self.prefill_order.pop_front() else {
            return;
        };
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

/// Each round's sequence and rows (`1 + draft length`), for the log.
fn rows(rounds: &[(SeqId, RoundDraft)]) -> Vec<(u32, usize)> {
    rounds
        .iter()
        .map(|(seq, round)| (seq.0, round.tokens.len() + 1))
        .collect()
}
