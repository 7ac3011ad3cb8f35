//! [`BatchedSequence`]: a sequence of the batcher's session, as the thread generating on it sees
//! it.

use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use super::calls::{Call, Reply};
use crate::cascade::{Cascade, ModelFacts, Token};
use crate::engine::context::SeqId;
use crate::engine::error::EngineError;
use crate::engine::model::Target;
use crate::engine::rounds::{
    Outcome, Prefill, Request, RoundControl, RoundDraft, Verified, Verifier, generate,
};
use crate::engine::verify::{Session, VerifyCurve, check_request_fits};

/// One sequence of a [`Batcher`](super::Batcher)'s session, on the thread that generates its requests: a
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

impl<'t> BatchedSequence<'t> {
    pub(super) fn new(
        seq: SeqId,
        session: &Session<'t>,
        prefill_chunk: usize,
        calls: Sender<Call>,
        answers: Receiver<Reply>,
    ) -> Self {
        Self {
            seq,
            target: session.target(),
            facts: session.target().facts(session.ctx_size()),
            batch_size: session.batch_size(),
            verify_curve: session.verify_curve().clone(),
            prefill_chunk,
            calls,
            answers,
            active: false,
        }
    }

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
        let _ = self.calls.send(Call::Close);
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
                Reply::Verified(_) => {
                    unreachable!("the batcher answers a prompt chunk with Prefilled")
                }
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
