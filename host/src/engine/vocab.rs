//! Whether a draft model speaks the target's tokenizer: the same token ids must mean the same
//! text, or every draft is rejected (or, worse, silently accepted at a different meaning).
//!
//! Compared, in order, so the first difference found is the one reported: vocabulary size, BOS,
//! EOS, the end-of-generation set, then the stored text of a deterministic sample of token ids
//! (the first and last [`EDGE_SAMPLE`] ids, where special and added tokens live, and
//! [`SPREAD_SAMPLE`] ids spread evenly over the rest). Checking every token would cost a second
//! per load on a 262K vocabulary for little gain: vocabularies that differ at all differ early.

use std::collections::BTreeSet;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use crate::cascade::Token;

/// Ids sampled at each end of the vocabulary.
const EDGE_SAMPLE: u32 = 100;
/// Ids sampled evenly across the vocabulary.
const SPREAD_SAMPLE: u32 = 1000;

/// What the check compares of one model's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct VocabFingerprint {
    /// Number of tokens.
    pub(super) size: u32,
    /// Beginning-of-sequence token, if the model has one.
    pub(super) bos: Option<Token>,
    /// End-of-sequence token, if the model has one.
    pub(super) eos: Option<Token>,
    /// Every token that ends generation.
    pub(super) eog: Vec<Token>,
    /// Token texts of the sampled ids, by id (empty for an id without text).
    pub(super) texts: Vec<(Token, Vec<u8>)>,
}

impl VocabFingerprint {
    /// Reads the fingerprint of `model`'s vocabulary.
    pub(super) fn of(model: &LlamaModel) -> Self {
        let vocab = model.vocab();
        let size = vocab.n_tokens().max(0) as u32;
        let known = |t: LlamaToken| (t.0 >= 0).then_some(t.0 as Token);
        let eog = (0..size)
            .filter(|&id| vocab.is_eog(LlamaToken(id as i32)))
            .collect();
        let texts = sample_ids(size)
            .into_iter()
            .map(|id| {
                let text = vocab
                    .text(LlamaToken(id as i32))
                    .map(|t| t.to_bytes().to_vec());
                (id, text.unwrap_or_default())
            })
            .collect();
        Self {
            size,
            bos: known(vocab.bos()),
            eos: known(vocab.eos()),
            eog,
            texts,
        }
    }

    /// The first difference between the `target`'s vocabulary and the `draft`'s, worded as
    /// "what: target X, draft Y"; `None` when they match.
    pub(super) fn difference(target: &Self, draft: &Self) -> Option<String> {
        if target.size != draft.size {
            return Some(format!(
                "vocabulary size: target {}, draft {}",
                target.size, draft.size
            ));
        }
        if target.bos != draft.bos {
            return Some(format!(
                "BOS token: target {}, draft {}",
                show_id(target.bos),
                show_id(draft.bos)
            ));
        }
        if target.eos != draft.eos {
            return Some(format!(
                "EOS token: target {}, draft {}",
                show_id(target.eos),
                show_id(draft.eos)
            ));
        }
        if target.eog != draft.eog {
            return Some(format!(
                "end-of-generation tokens: target {:?}, draft {:?}",
                target.eog, draft.eog
            ));
        }
        target
            .texts
            .iter()
            .zip(&draft.texts)
            .find(|(t, d)| t != d)
            .map(|((id, target_text), (_, draft_text))| {
                format!(
                    "text of token {id}: target {:?}, draft {:?}",
                    String::from_utf8_lossy(target_text),
                    String::from_utf8_lossy(draft_text)
                )
            })
    }
}

fn show_id(id: Option<Token>) -> String {
    id.map_or_else(|| "none".to_owned(), |id| id.to_string())
}

/// The ids whose texts are compared, ascending: both ends of the vocabulary and an even spread.
fn sample_ids(size: u32) -> Vec<Token> {
    let edges = (0..EDGE_SAMPLE.min(size)).chain(size.saturating_sub(EDGE_SAMPLE)..size);
    let spread = (0..SPREAD_SAMPLE)
        .map(|i| (u64::from(i) * u64::from(size) / u64::from(SPREAD_SAMPLE)) as u32);
    edges
        .chain(spread.filter(|&id| id < size))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(size: u32) -> VocabFingerprint {
        VocabFingerprint {
            size,
            bos: Some(1),
            eos: Some(2),
            eog: vec![2, 5],
            texts: sample_ids(size)
                .into_iter()
                .map(|id| (id, format!("tok{id}").into_bytes()))
                .collect(),
        }
    }

    #[test]
    fn samples_both_ends_and_a_spread_once_each() {
        let ids = sample_ids(49_152);
        assert_eq!(
            ids.len(),
            1_195,
            "100 + 100 edges + 1000 spread (0, 49, 98, 49053 and 49102 fall in the edges)"
        );
        assert_eq!((ids[0], ids[99]), (0, 99));
        assert_eq!(ids.last(), Some(&49_151));
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending, unique");
        assert_eq!(
            sample_ids(50),
            (0..50).collect::<Vec<_>>(),
            "small vocab: every id"
        );
        assert!(sample_ids(0).is_empty());
    }

    #[test]
    fn equal_fingerprints_have_no_difference() {
        assert_eq!(
            VocabFingerprint::difference(&fingerprint(4096), &fingerprint(4096)),
            None
        );
    }

    #[test]
    fn names_the_first_difference_with_both_values() {
        let target = fingerprint(4096);
        let mut cases = Vec::new();
        cases.push((
            fingerprint(8192),
            "vocabulary size: target 4096, draft 8192",
        ));
        let mut bos = fingerprint(4096);
        bos.bos = None;
        cases.push((bos, "BOS token: target 1, draft none"));
        let mut eos = fingerprint(4096);
        eos.eos = Some(3);
        cases.push((eos, "EOS token: target 2, draft 3"));
        let mut eog = fingerprint(4096);
        eog.eog = vec![2];
        cases.push((eog, "end-of-generation tokens: target [2, 5], draft [2]"));
        let mut text = fingerprint(4096);
        text.texts[150].1 = b"other".to_vec();
        let id = text.texts[150].0;
        let expected = format!("text of token {id}: target \"tok{id}\", draft \"other\"");
        cases.push((text, expected.as_str()));
        for (draft, expected) in cases {
            assert_eq!(
                VocabFingerprint::difference(&target, &draft).as_deref(),
                Some(expected)
            );
        }
    }
}
