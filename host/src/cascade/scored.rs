//! The scored mode's rule: among the proposals long enough to count, the one with the highest
//! expected accepted length wins ([`AcceptanceHistory::expected_accepted`]); expensive sources
//! are asked only when the best cheap proposal is expected to accept fewer tokens than the
//! threshold.
//!
//! [`AcceptanceHistory::expected_accepted`]: super::AcceptanceHistory::expected_accepted

use super::mode::CascadeSettings;
use super::slot::Slot;

/// The index of the best-scoring slot, asking slots in `order` for up to `max_len` tokens.
pub(super) fn best_scored(
    slots: &mut [Slot],
    order: &[usize],
    settings: &CascadeSettings,
    max_len: usize,
) -> Option<usize> {
    let min_len = settings.min_len.max(1);
    let mut best: Option<(usize, f64)> = None;
    for expensive in [false, true] {
        if expensive && best.is_some_and(|(_, score)| score >= settings.expensive_threshold) {
            break;
        }
        for &index in order {
            let slot = &mut slots[index];
            if slot.excluded || slot.source.is_expensive() != expensive {
                continue;
            }
            let len = slot.ask(max_len);
            if slot.drew() && len > 0 {
                return Some(index);
            }
            if len < min_len {
                continue;
            }
            let Some(proposal) = slot.proposal.as_ref() else {
                continue;
            };
            let score = slot.history.expected_accepted(proposal);
            if best.is_none_or(|(_, best_score)| score > best_score) {
                best = Some((index, score));
            }
        }
    }
    best.map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::super::doubles::{constant, facts, scored};
    use super::super::{Cascade, RoundTiming, Token};

    #[test]
    fn scored_mode_picks_highest_expected_acceptance() {
        let (weak, _) = constant("weak", &[1, 2, 3], &[0.5, 0.2, 0.1], false);
        let (strong, _) = constant("strong", &[4, 5], &[0.9, 0.8], false);
        let (model, model_asked) = constant("model", &[6, 7, 8], &[1.0, 1.0, 1.0], true);
        let mut cascade = Cascade::new(vec![weak, strong, model], scored());
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let draft = cascade.propose(8);
        assert_eq!(draft.source, Some(2), "draft {draft:?}");
        // The best cheap proposal expects 1.7 < 2.0 tokens: the draft model is asked, and its
        // proposal (3.0 expected) wins.
        assert_eq!(*model_asked.lock().expect("counter"), 1);
    }

    #[test]
    fn scored_mode_asks_expensive_sources_only_below_threshold() {
        let (weak, _) = constant("weak", &[1, 2], &[0.4, 0.1], false);
        let (model, model_asked) = constant("model", &[6, 7, 8], &[0.9, 0.9, 0.9], true);
        let mut cascade = Cascade::new(vec![model, weak], scored());
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let draft = cascade.propose(8);
        assert_eq!(draft.source, Some(0), "the draft model wins: {draft:?}");
        assert_eq!(*model_asked.lock().expect("counter"), 1);

        let (good, _) = constant("good", &[1, 2, 3], &[0.9, 0.9, 0.9], false);
        let (model, model_asked) = constant("model", &[6, 7, 8], &[1.0, 1.0, 1.0], true);
        let mut cascade = Cascade::new(vec![model, good], scored());
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        let draft = cascade.propose(8);
        assert_eq!(
            draft.source,
            Some(1),
            "cheap proposal is good enough: {draft:?}"
        );
        assert_eq!(*model_asked.lock().expect("counter"), 0, "model not asked");
    }

    #[test]
    fn scored_mode_learns_acceptance_of_sources_without_confidence() {
        let (left, _) = constant("left", &[1, 2, 3, 4], &[], false);
        let (right, _) = constant("right", &[5, 6, 7, 8], &[], false);
        let mut cascade = Cascade::new(vec![left, right], scored());
        cascade.begin(&facts(), &[1], 8, 64, &[]);
        for _ in 0..5 {
            let draft = cascade.propose(4);
            // The target always continues 5, 6, 7, 8: `right` would have been fully accepted.
            let n_accepted = if draft.source == Some(1) { 4 } else { 0 };
            let committed: Vec<Token> = if n_accepted == 4 {
                vec![5, 6, 7, 8, 9]
            } else {
                vec![5]
            };
            cascade.accept(&draft, n_accepted, &committed, RoundTiming::default(), "");
        }
        let draft = cascade.propose(4);
        assert_eq!(
            draft.source,
            Some(1),
            "losing proposals taught the cascade: {draft:?}"
        );
    }

    #[test]
    fn scored_mode_learns_that_a_source_overstates_its_confidence_and_remembers_it() {
        // `boastful` claims 0.95 for each of 4 tokens (3.8 expected) but only its first token is
        // ever right; `plain` gives no confidences and is always right.
        let (boastful, _) = constant("boastful", &[5, 1, 1, 1], &[0.95; 4], false);
        let (plain, _) = constant("plain", &[5, 6, 7, 8], &[], false);
        let mut cascade = Cascade::new(vec![boastful, plain], scored());
        let mut winners = Vec::new();
        for _request in 0..2 {
            cascade.begin(&facts(), &[1], 8, 64, &[]);
            for _ in 0..12 {
                let draft = cascade.propose(4);
                let n_accepted = if draft.source == Some(1) { 4 } else { 1 };
                let committed: &[Token] = if n_accepted == 4 {
                    &[5, 6, 7, 8, 9]
                } else {
                    &[5, 6]
                };
                cascade.accept(&draft, n_accepted, committed, RoundTiming::default(), "");
                winners.push(draft.source);
            }
            cascade.end();
        }
        assert_eq!(winners[0], Some(0), "believed at first: {winners:?}");
        assert_eq!(
            winners[11],
            Some(1),
            "learnt within the request: {winners:?}"
        );
        assert!(
            winners[12..].iter().all(|w| *w == Some(1)),
            "and still known in the next request: {winners:?}"
        );
    }
}
