//! The ordered ("first") cascade: the first source whose proposal is long enough wins.

use std::time::Instant;

use super::source::{DraftSource, Feedback, ModelFacts, Proposal, SourceFault, Token};
use super::stats::SourceStats;

/// Default minimum proposal length for a source to win a round.
pub const DEFAULT_MIN_LEN: usize = 1;

/// How the cascade chooses among its sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CascadeSettings {
    /// A source wins only with a proposal of at least this many tokens.
    pub min_len: usize,
}

impl Default for CascadeSettings {
    fn default() -> Self {
        Self {
            min_len: DEFAULT_MIN_LEN,
        }
    }
}

/// This round's draft: the winning proposal, cut to the round's budget.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    /// Tokens to verify, at most the `max_len` asked for.
    pub tokens: Vec<Token>,
    /// Index of the winning source, or `None` when no source proposed.
    pub source: Option<usize>,
}

struct Slot {
    source: Box<dyn DraftSource>,
    stats: SourceStats,
    /// Whether the source was asked this round (it gets feedback).
    asked: bool,
    /// Length of what it proposed this round, after truncation.
    proposed_len: usize,
}

impl Slot {
    /// Runs `call` on the source, timing it and counting a fault instead of propagating it.
    fn call<T>(
        &mut self,
        method: &'static str,
        call: impl FnOnce(&mut dyn DraftSource) -> Result<T, SourceFault>,
    ) -> Option<T> {
        let started = Instant::now();
        let result = call(self.source.as_mut());
        self.stats.time += started.elapsed();
        match result {
            Ok(value) => Some(value),
            Err(fault) => {
                self.stats.faults += 1;
                tracing::debug!(source = %self.stats.name, method, %fault, "source fault");
                None
            }
        }
    }
}

/// Draft sources in priority order, with their statistics.
pub struct Cascade {
    slots: Vec<Slot>,
    settings: CascadeSettings,
}

impl Cascade {
    /// A cascade over `sources`, asked in the given order.
    pub fn new(sources: Vec<Box<dyn DraftSource>>, settings: CascadeSettings) -> Self {
        let slots = sources
            .into_iter()
            .map(|source| Slot {
                stats: SourceStats::named(source.name()),
                source,
                asked: false,
                proposed_len: 0,
            })
            .collect();
        Self { slots, settings }
    }

    /// A cascade without sources: every round is plain decoding.
    pub fn empty() -> Self {
        Self::new(Vec::new(), CascadeSettings::default())
    }

    /// Whether the cascade has no sources.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Names of the sources, in order.
    pub fn source_names(&self) -> Vec<String> {
        self.slots.iter().map(|s| s.stats.name.clone()).collect()
    }

    /// Starts a request: resets statistics and gives every source the prompt.
    pub fn begin(&mut self, facts: &ModelFacts, prompt: &[Token]) {
        for slot in &mut self.slots {
            slot.stats = SourceStats::named(&slot.stats.name);
            slot.call("begin", |s| s.begin(facts, prompt));
        }
    }

    /// Asks sources in order for up to `max_len` tokens; the first with at least `min_len` wins.
    pub fn propose(&mut self, max_len: usize) -> Draft {
        for slot in &mut self.slots {
            slot.asked = false;
            slot.proposed_len = 0;
        }
        if max_len == 0 {
            return Draft::default();
        }
        for (index, slot) in self.slots.iter_mut().enumerate() {
            slot.asked = true;
            slot.stats.asked += 1;
            let Some(Proposal { mut tokens, .. }) = slot.call("propose", |s| s.propose(max_len))
            else {
                continue;
            };
            tokens.truncate(max_len);
            slot.proposed_len = tokens.len();
            if !tokens.is_empty() {
                slot.stats.proposed += 1;
            }
            if tokens.len() >= self.settings.min_len.max(1) {
                return Draft {
                    tokens,
                    source: Some(index),
                };
            }
        }
        Draft::default()
    }

    /// Records the outcome of a round: `n_accepted` leading draft tokens were accepted and
    /// `committed` (the accepted prefix plus the target's token) was appended to the output.
    pub fn accept(&mut self, draft: &Draft, n_accepted: usize, committed: &[Token]) {
        let Some(&target_token) = committed.last() else {
            return;
        };
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.asked {
                let won = draft.source == Some(index);
                if won {
                    slot.stats.record_win(draft.tokens.len(), n_accepted);
                }
                let feedback = Feedback {
                    won,
                    n_accepted: if won { n_accepted as u32 } else { 0 },
                    target_token,
                };
                slot.call("feedback", |s| s.feedback(feedback));
            }
            slot.call("feed", |s| s.feed(committed));
        }
    }

    /// Ends the request for every source.
    pub fn end(&mut self) {
        for slot in &mut self.slots {
            slot.source.end();
        }
    }

    /// Statistics of every source, in cascade order.
    pub fn stats(&self) -> Vec<SourceStats> {
        self.slots.iter().map(|s| s.stats.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};

    /// A scripted source: proposes `reply` each round and logs what it was told.
    struct Scripted {
        name: &'static str,
        reply: Result<Vec<Token>, ()>,
        log: Arc<Mutex<Vec<String>>>,
    }

    fn scripted(
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

    fn facts() -> ModelFacts {
        ModelFacts {
            vocab_size: 100,
            bos: None,
            eos: Some(2),
            eog: vec![2],
            context_size: 512,
        }
    }

    #[test]
    fn first_long_enough_source_wins_and_draft_is_truncated() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![
                scripted("short", Ok(vec![7]), &log),
                scripted("long", Ok(vec![1, 2, 3, 4, 5]), &log),
                scripted("never", Ok(vec![9]), &log),
            ],
            CascadeSettings { min_len: 2 },
        );
        cascade.begin(&facts(), &[1, 2]);
        let draft = cascade.propose(3);
        assert_eq!(draft.tokens, vec![1, 2, 3], "draft {draft:?}");
        assert_eq!(draft.source, Some(1));
        cascade.accept(&draft, 2, &[1, 2, 8]);
        let stats = cascade.stats();
        assert_eq!(stats[0].asked, 1);
        assert_eq!(stats[0].won, 0);
        assert_eq!(
            (stats[1].won, stats[1].drafted, stats[1].accepted),
            (1, 3, 2)
        );
        assert_eq!(stats[2].asked, 0, "sources after the winner are not asked");
        let log = log.lock().expect("test log").join("\n");
        let expected = "short begin [1, 2]\nlong begin [1, 2]\nnever begin [1, 2]\n\
                        short feedback won=false n=0\nshort feed [1, 2, 8]\n\
                        long feedback won=true n=2\nlong feed [1, 2, 8]\nnever feed [1, 2, 8]";
        assert_eq!(
            log, expected,
            "only asked sources get feedback; all are fed"
        );
    }

    #[test]
    fn fault_counts_as_empty_proposal() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![
                scripted("broken", Err(()), &log),
                scripted("fine", Ok(vec![4]), &log),
            ],
            CascadeSettings::default(),
        );
        cascade.begin(&facts(), &[1]);
        let draft = cascade.propose(4);
        assert_eq!(draft.source, Some(1), "draft {draft:?}");
        assert_eq!(cascade.stats()[0].faults, 1);
    }

    #[test]
    fn zero_budget_asks_nobody() {
        let log = Arc::default();
        let mut cascade = Cascade::new(
            vec![scripted("a", Ok(vec![1]), &log)],
            CascadeSettings::default(),
        );
        cascade.begin(&facts(), &[1]);
        assert_eq!(cascade.propose(0), Draft::default());
        assert_eq!(cascade.stats()[0].asked, 0);
    }
}
