//! [`BatchedSequence`]: a sequence of the batcher's session, as the thread generating on it sees
//! it.

use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use super::calls::{Call, Reply, Start};
use crate::cascade::{Cascade, ModelFacts, Token};
use crate::engine::context::SeqId;
use crate::engine::error::EngineError;
use crate::engine::grammar::GrammarSource;
use crate::engine::model::Target;
use crate::engine::rounds::{
    Outcome, OutputPiece, Prefill, Request, RoundControl, RoundDraft, Verified, Verifier, generate,
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
    /// The tokens whose keys and values the sequence's part of the cache holds, in order: a
    /// request's prompt and every committed token but the last. The next request keeps the
    /// prefix its prompt shares with them (a chat's system prompt and earlier turns), as
    /// llama-server's `cache_prompt` does.
    cached: Vec<Token>,
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
            cached: Vec::new(),
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

    /// The tokens the sequence's cache holds, which a request starting with them does not
    /// read again.
    pub fn cached(&self) -> &[Token] {
        &self.cached
    }

    /// Generates `request` as [`Session::generate_controlled`] does, the batcher decoding, then
    /// ends the request in the batcher (whatever the outcome).
    pub fn generate_controlled(
        &mut self,
        request: &Request,
        cascade: &mut Cascade,
        on_text: &mut dyn FnMut(OutputPiece<'_>),
        control: &mut dyn RoundControl,
    ) -> Result<Outcome, EngineError> {
        check_request_fits(request, self.ctx_size())?;
        let outcome = generate(self, request, cascade, on_text, control);
        self.end();
        outcome
    }

    /// Tells the batcher that this sequence's request is over (it may stop waiting for it; the
    /// cache stays for the next request). Done by [`Self::generate_controlled`] and on drop.
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

    fn is_eog(&self, token: Token) -> bool {
        self.target.is_eog(token)
    }

    fn token_bytes(&self, token: Token, out: &mut Vec<u8>) {
        self.target.token_bytes(token, out);
    }

    fn grammar_source(&self, request: &Request) -> Option<GrammarSource> {
        self.target
            .grammar_source(request.sampling.grammar.as_ref()?)
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
        if request.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        // The prompt's last token is read again for its logits.
        let mut keep = shared_prefix(&self.cached, &request.prompt).min(request.prompt.len() - 1);
        if self.target.is_recurrent() && keep < self.cached.len() {
            // A recurrent state holds all of the cached context or nothing of it.
            keep = 0;
        }
        self.cached.truncate(keep);
        let chunks = request.prompt[keep..].chunks(self.prefill_chunk);
        let n_chunks = chunks.len();
        let mut position = keep;
        if keep > 0 {
            tracing::debug!(seq = %self.seq, kept = keep, "prompt prefix kept in the cache");
        }
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
                start: (index == 0).then(|| Start {
                    sampling: request.sampling.clone(),
                    keep,
                }),
                last,
            });
            match reply {
                Ok(Reply::Prefilled(Ok(first))) => {
                    self.cached.extend_from_slice(chunk);
                    position += chunk.len();
                    if let Some((first, logprobs)) = first.filter(|_| last) {
                        return Ok(Prefill::Done {
                            first,
                            cached: keep,
                            logprobs,
                        });
                    }
                }
                Ok(Reply::Prefilled(Err(error))) | Err(error) => {
                    self.cached.clear();
                    return Err(error);
                }
                Ok(Reply::Verified(_)) => {
                    unreachable!("the batcher answers a prompt chunk with Prefilled")
                }
            }
        }
        Err(EngineError::NoRequest)
    }

    fn verify(&mut self, round: &RoundDraft) -> Result<Verified, EngineError> {
        let result = match self.call(Call::Verify {
            seq: self.seq,
            round: round.clone(),
        }) {
            Ok(Reply::Verified(result)) => result,
            Ok(Reply::Prefilled(_)) => unreachable!("the batcher answers a round with Verified"),
            Err(error) => Err(error),
        };
        match &result {
            // The cache keeps the round's last token and the accepted drafts.
            Ok(verified) if round.n_past == self.cached.len() => {
                let accepted = verified.tokens.len().saturating_sub(1);
                self.cached.push(round.last);
                self.cached.extend_from_slice(&round.tokens[..accepted]);
            }
            _ => self.cached.clear(),
        }
        result
    }
}

/// How many tokens `a` and `b` share at their start: what a sequence holding `a` keeps of a
/// prompt `b`.
pub fn shared_prefix(a: &[Token], b: &[Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
