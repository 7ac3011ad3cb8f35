//! Test doubles for the cascade's tests: scripted sources and policies.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::mode::{CascadeMode, CascadeSettings};
use super::policy::{Decision, PolicySetup, RoundPolicy, RoundRecord};
use super::sampled::{DraftSampling, SampledDraft, TokenDistribution};
use super::source::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token};

/// A scripted source: proposes `reply` each round and logs what it was told.
pub(super) struct Scripted {
    pub(super) name: &'static str,
    pub(super) reply: Result<Vec<Token>, ()>,
    pub(super) log: Arc<Mutex<Vec<String>>>,
}

pub(super) fn scripted(
    name: &'static str,
    reply: Result<Vec<Token>, ()>,
    log: &Arc<Mutex<Vec<String>>>,
) -> Box<dyn DraftSource> {
    Box::new(Scripted {
        name,
        reply,
        log: Arc::clone(log),
    })
}

impl Scripted {
    fn note(&self, line: String) {
        self.log.lock().expect("test log").push(line);
    }
}

impl DraftSource for Scripted {
    fn name(&self) -> &str {
        self.name
    }
    fn begin(&mut self, _facts: &ModelFacts, prompt: &[Token]) -> Result<(), SourceFault> {
        self.note(format!("{} begin {prompt:?}", self.name));
        Ok(())
    }
    fn propose(&mut self, _max_len: usize) -> Result<Proposal, SourceFault> {
        self.reply
            .clone()
            .map(Proposal::from_tokens)
            .map_err(|()| SourceFault {
                source: self.name.into(),
                what: "trapped".into(),
            })
    }
    fn feedback(&mut self, feedback: Feedback) -> Result<(), SourceFault> {
        self.note(format!(
            "{} feedback won={} n={}",
            self.name, feedback.won, feedback.n_accepted
        ));
        Ok(())
    }
    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        self.note(format!("{} feed {tokens:?}", self.name));
        Ok(())
    }
}

pub(super) fn facts() -> ModelFacts {
    ModelFacts {
        vocab_size: 100,
        bos: None,
        eos: Some(2),
        eog: vec![2],
        context_size: 512,
    }
}

/// A source that proposes the same thing every round and counts how often it was asked.
pub(super) struct Constant {
    pub(super) name: &'static str,
    pub(super) proposal: Proposal,
    pub(super) expensive: bool,
    pub(super) asked: Arc<Mutex<u32>>,
}

impl DraftSource for Constant {
    fn name(&self) -> &str {
        self.name
    }
    fn begin(&mut self, _facts: &ModelFacts, _prompt: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
    fn propose(&mut self, _max_len: usize) -> Result<Proposal, SourceFault> {
        *self.asked.lock().expect("counter") += 1;
        Ok(self.proposal.clone())
    }
    fn feed(&mut self, _tokens: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
    fn is_expensive(&self) -> bool {
        self.expensive
    }
}

pub(super) fn constant(
    name: &'static str,
    tokens: &[Token],
    confidence: &[f32],
    expensive: bool,
) -> (Box<dyn DraftSource>, Arc<Mutex<u32>>) {
    let asked = Arc::new(Mutex::new(0));
    let source = Constant {
        name,
        proposal: Proposal {
            tokens: tokens.to_vec(),
            confidence: confidence.to_vec(),
            parents: Vec::new(),
        },
        expensive,
        asked: Arc::clone(&asked),
    };
    (Box::new(source), asked)
}

pub(super) fn scored() -> CascadeSettings {
    CascadeSettings {
        mode: CascadeMode::Scored,
        ..CascadeSettings::default()
    }
}

/// A policy that returns scripted decisions and records what it observed.
pub(super) struct ScriptedPolicy {
    pub(super) decisions: Vec<Decision>,
    pub(super) observed: Arc<Mutex<Vec<RoundRecord>>>,
}

impl RoundPolicy for ScriptedPolicy {
    fn name(&self) -> &str {
        "scripted"
    }
    fn begin(&mut self, _facts: &ModelFacts, _setup: &PolicySetup) -> Result<(), SourceFault> {
        Ok(())
    }
    fn observe(&mut self, round: &RoundRecord) -> Result<(), SourceFault> {
        self.observed.lock().expect("observed").push(round.clone());
        Ok(())
    }
    fn decide(&mut self) -> Result<Decision, SourceFault> {
        if self.decisions.is_empty() {
            return Err(SourceFault {
                source: "scripted".into(),
                what: "out of decisions".into(),
            });
        }
        Ok(self.decisions.remove(0))
    }
}

/// A source that takes `delay` to propose `tokens`.
pub(super) struct Slow {
    pub(super) tokens: Vec<Token>,
    pub(super) delay: Duration,
}

impl DraftSource for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn begin(&mut self, _facts: &ModelFacts, _prompt: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
    fn propose(&mut self, _max_len: usize) -> Result<Proposal, SourceFault> {
        std::thread::sleep(self.delay);
        Ok(Proposal {
            tokens: self.tokens.clone(),
            confidence: Vec::new(),
            parents: Vec::new(),
        })
    }
    fn feed(&mut self, _tokens: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
}

/// A source whose draft model draws `drawn` when the request samples (it records the settings
/// it was given), while its `propose` returns `reply`, as a plugin may.
pub(super) struct Drawing {
    pub(super) drawn: Vec<Token>,
    pub(super) reply: Vec<Token>,
    pub(super) sampling: Arc<Mutex<Option<DraftSampling>>>,
    pub(super) pending: Option<SampledDraft>,
}

impl DraftSource for Drawing {
    fn name(&self) -> &str {
        "drawing"
    }
    fn begin(&mut self, _facts: &ModelFacts, _prompt: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
    fn propose(&mut self, _max_len: usize) -> Result<Proposal, SourceFault> {
        if self.sampling.lock().expect("test settings").is_some() {
            self.pending = Some(SampledDraft {
                tokens: self.drawn.clone(),
                distributions: self
                    .drawn
                    .iter()
                    .map(|&token| TokenDistribution {
                        probabilities: vec![(token, 0.5), (token + 1, 0.5)],
                    })
                    .collect(),
            });
        }
        Ok(Proposal::from_tokens(self.reply.clone()))
    }
    fn feed(&mut self, _tokens: &[Token]) -> Result<(), SourceFault> {
        Ok(())
    }
    fn is_expensive(&self) -> bool {
        true
    }
    fn sample_drafts(&mut self, sampling: Option<DraftSampling>) {
        *self.sampling.lock().expect("test settings") = sampling;
    }
    fn take_draw(&mut self) -> Option<SampledDraft> {
        self.pending.take()
    }
}
