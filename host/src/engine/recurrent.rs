//! Rolling back a recurrent (state-space) or hybrid model's sequence, which llama.cpp cannot do
//! with `seq_rm`: such a model keeps one state per sequence, not one entry per position, so the
//! state before a rejected draft token is gone once the token is decoded.
//!
//! The context therefore copies each sequence's state to a spare sequence of its own before
//! every decode that touches it (`llama_memory_seq_cp`: llama.cpp shares the state cell and
//! copies it when the sequence next writes, so the copy costs one state, not a decode), and
//! remembers the tokens it decodes. Rolling the sequence back to a position inside that decode
//! restores the saved state and re-decodes the kept tokens (the round's accepted prefix); a
//! draft accepted whole needs nothing. The re-decode waits until the decode being settled is
//! read (its logits stay readable), and replays of several sequences go in one batch: the
//! verifier decodes them once it has settled a verify batch, so each round's verify time holds
//! its replay and a policy prices it; others' (a recurrent draft model's) wait for the next
//! decode. Exactness: the state after the replayed tokens is the state after decoding them in
//! the verify batch, which the start-up check proves equal to decoding them one by one.
//!
//! This file is the bookkeeping; the llama.cpp calls are `context.rs`'s.

use super::context::SeqId;
use crate::cascade::Token;

/// What rolling a sequence back takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RollbackPlan {
    /// The sequence holds no position at or past the one asked for.
    Nothing,
    /// Empty the sequence (and its spare).
    Clear,
    /// Restore the state saved in the spare sequence; a replay is recorded if tokens are kept.
    Restore,
}

/// The state saved before a sequence's last decode, and the tokens that decode held.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    /// Position of the first token decoded after the state was saved.
    base: usize,
    /// The tokens decoded from `base` on.
    tokens: Vec<Token>,
    /// After a rollback to `base + n` with `n > 0`: the `n` tokens to decode again.
    replay: Option<usize>,
}

/// A tokens replay: `tokens` to decode again into `seq` from `position` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Replay {
    /// The sequence.
    pub(super) seq: SeqId,
    /// Position of the first token.
    pub(super) position: usize,
    /// The tokens.
    pub(super) tokens: Vec<Token>,
}

/// The snapshots of every sequence of a recurrent model's context.
#[derive(Debug, Clone)]
pub(super) struct Rollbacks {
    snapshots: Vec<Option<Snapshot>>,
}

impl Rollbacks {
    /// Bookkeeping for `sequences` sequences, none saved.
    pub(super) fn new(sequences: usize) -> Self {
        Self {
            snapshots: vec![None; sequences],
        }
    }

    /// Records that `seq`'s state was saved and `tokens` are being decoded from `base` on.
    pub(super) fn record(&mut self, seq: SeqId, base: usize, tokens: Vec<Token>) {
        if let Some(slot) = self.snapshots.get_mut(seq.0 as usize) {
            *slot = Some(Snapshot {
                base,
                tokens,
                replay: None,
            });
        }
    }

    /// Records that `tokens` are being decoded into `seq` from `position` on without saving its
    /// state again, when they continue its last decode with no rollback since: a rollback can
    /// then go back to anywhere since the state saved before that decode (a draft model's
    /// drafting steps, undone together once the target has verified them). `false` when they
    /// do not continue it; the caller saves the state then.
    pub(super) fn extend(&mut self, seq: SeqId, position: usize, tokens: &[Token]) -> bool {
        match self.snapshots.get_mut(seq.0 as usize) {
            Some(Some(snapshot))
                if snapshot.replay.is_none()
                    && snapshot.base + snapshot.tokens.len() == position =>
            {
                snapshot.tokens.extend_from_slice(tokens);
                true
            }
            _ => false,
        }
    }

    /// How many positions `seq` holds once its pending replay is decoded, when it has one.
    pub(super) fn pending_len(&self, seq: SeqId) -> Option<usize> {
        let snapshot = self.snapshots.get(seq.0 as usize)?.as_ref()?;
        snapshot.replay.map(|n| snapshot.base + n)
    }

    /// What rolling `seq`, which holds `len` positions, back to its first `from` takes; records
    /// the replay a restore needs. An error when `from` lies before its last decode.
    pub(super) fn plan(
        &mut self,
        seq: SeqId,
        from: usize,
        len: usize,
    ) -> Result<RollbackPlan, String> {
        if from >= len {
            return Ok(RollbackPlan::Nothing);
        }
        let slot = self
            .snapshots
            .get_mut(seq.0 as usize)
            .ok_or_else(|| format!("sequence {seq} is outside the context"))?;
        if from == 0 {
            *slot = None;
            return Ok(RollbackPlan::Clear);
        }
        match slot {
            Some(snapshot) if snapshot.base <= from => {
                snapshot.replay = (from > snapshot.base).then_some(from - snapshot.base);
                Ok(RollbackPlan::Restore)
            }
            _ => Err(format!(
                "a recurrent model's sequence {seq} can go back only within its last decode, not to position {from} of {len}"
            )),
        }
    }

    /// Takes the replays rollbacks recorded; their sequences are then as if decoded afresh.
    pub(super) fn take_replays(&mut self) -> Vec<Replay> {
        let mut replays = Vec::new();
        for (index, slot) in self.snapshots.iter_mut().enumerate() {
            if let Some(Snapshot {
                replay: Some(n), ..
            }) = slot
            {
                let n = *n;
                if let Some(snapshot) = slot.take() {
                    replays.push(Replay {
                        seq: SeqId(index as u32),
                        position: snapshot.base,
                        tokens: snapshot.tokens[..n.min(snapshot.tokens.len())].to_vec(),
                    });
                }
            }
        }
        replays
    }

    /// Forgets every snapshot (the cache was emptied).
    pub(super) fn forget_all(&mut self) {
        self.snapshots.iter_mut().for_each(|slot| *slot = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEQ: SeqId = SeqId(1);

    #[test]
    fn a_rejected_draft_restores_and_replays_the_accepted_prefix() {
        let mut rollbacks = Rollbacks::new(2);
        // 10 positions held; a verify batch [last, d1, d2, d3] decoded at 10..14.
        rollbacks.record(SEQ, 10, vec![5, 6, 7, 8]);
        assert_eq!(rollbacks.plan(SEQ, 14, 14), Ok(RollbackPlan::Nothing));
        // d1 accepted: keep 10..12.
        assert_eq!(rollbacks.plan(SEQ, 12, 14), Ok(RollbackPlan::Restore));
        assert_eq!(rollbacks.pending_len(SEQ), Some(12));
        assert_eq!(
            rollbacks.take_replays(),
            [Replay {
                seq: SEQ,
                position: 10,
                tokens: vec![5, 6]
            }]
        );
        assert_eq!(rollbacks.pending_len(SEQ), None);
        assert!(rollbacks.take_replays().is_empty());
    }

    #[test]
    fn back_to_the_saved_state_needs_no_replay_and_earlier_is_refused() {
        let mut rollbacks = Rollbacks::new(2);
        rollbacks.record(SEQ, 10, vec![5, 6]);
        assert_eq!(rollbacks.plan(SEQ, 10, 12), Ok(RollbackPlan::Restore));
        assert!(rollbacks.take_replays().is_empty());
        let error = rollbacks
            .plan(SEQ, 9, 12)
            .expect_err("before the last decode");
        assert!(error.contains("within its last decode"), "{error}");
        assert_eq!(rollbacks.plan(SEQ, 0, 12), Ok(RollbackPlan::Clear));
        assert!(
            rollbacks.plan(SEQ, 5, 12).is_err(),
            "no snapshot after a clear"
        );
        assert!(rollbacks.plan(SeqId(7), 1, 12).is_err(), "unknown sequence");
    }

    #[test]
    fn decodes_that_continue_the_last_one_go_back_to_the_state_before_it() {
        let mut rollbacks = Rollbacks::new(2);
        // A draft model's drafting: the state saved before d1 at 10, then d2 and d3 appended.
        rollbacks.record(SEQ, 10, vec![5]);
        assert!(rollbacks.extend(SEQ, 11, &[6]));
        assert!(rollbacks.extend(SEQ, 12, &[7]));
        assert!(!rollbacks.extend(SEQ, 14, &[9]), "not contiguous");
        assert!(!rollbacks.extend(SeqId(0), 0, &[1]), "nothing saved");
        // The target accepted d1 only.
        assert_eq!(rollbacks.plan(SEQ, 11, 13), Ok(RollbackPlan::Restore));
        assert!(!rollbacks.extend(SEQ, 11, &[8]), "a replay is pending");
        assert_eq!(rollbacks.take_replays()[0].tokens, [5]);
    }

    #[test]
    fn a_second_rollback_of_the_same_decode_replaces_the_first() {
        let mut rollbacks = Rollbacks::new(1);
        rollbacks.record(SeqId::FIRST, 0, vec![1, 2, 3, 4]);
        assert_eq!(
            rollbacks.plan(SeqId::FIRST, 3, 4),
            Ok(RollbackPlan::Restore)
        );
        assert_eq!(
            rollbacks.plan(SeqId::FIRST, 2, 3),
            Ok(RollbackPlan::Restore)
        );
        assert_eq!(rollbacks.take_replays()[0].tokens, [1, 2]);
        rollbacks.record(SeqId::FIRST, 0, vec![1]);
        rollbacks.forget_all();
        assert!(rollbacks.plan(SeqId::FIRST, 1, 2).is_err());
    }
}
