//! The saved response cache: the binary format of the blob the host keeps for the plugin.
//!
//! The plugin has no files. The host holds one blob per plugin (the WIT `state` interface),
//! hands it to whichever instance asks and writes the latest saved one to disk at its
//! checkpoints. This module only turns responses into bytes and back; what goes in the blob and
//! how the trie is rebuilt from it is the `cache` module's business, when to load and save the
//! crate root's.
//!
//! # Format, version 1
//!
//! The blob holds the cached responses themselves, oldest first, not the trie: the trie is
//! rebuilt from them on load, under the loading session's settings. All integers are
//! little-endian.
//!
//! | offset  | size | field                                                                 |
//! |---------|------|-----------------------------------------------------------------------|
//! | 0       | 8    | magic, `SHSUFFIX`                                                     |
//! | 8       | 4    | format version, 1                                                     |
//! | 12      | 4    | vocabulary size of the target the tokens belong to                    |
//! | 16      | 8    | vocabulary fingerprint (see [`Vocabulary`])                           |
//! | 24      | 4    | number of responses, `n`                                              |
//! | 28      | ...  | `n` responses: a token count `len >= 1`, then `len` tokens, each 4    |
//! | end - 8 | 8    | checksum of every byte before it (see [`checksum`])                   |
//!
//! # What invalidates a blob
//!
//! A blob is ignored (and the cache starts empty) when it is not this plugin's (wrong magic),
//! has another format version, fails its checksum (corrupt or truncated), was saved for another
//! vocabulary (size or special tokens differ: the tokens would mean other text), or is
//! malformed inside (lengths that overrun, empty responses, tokens outside the vocabulary).
//!
//! The plugin's settings do not invalidate it: `max_depth` only shapes the trie, which is
//! rebuilt, and `max_cached_requests` and `max_nodes` are applied on load by keeping the newest
//! responses that fit.

use std::fmt;
use std::ops::Range;

use spechost_sdk::{ModelFacts, Token};

/// First bytes of every blob this plugin saves.
const MAGIC: [u8; 8] = *b"SHSUFFIX";
/// Version of the format this build writes and reads.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// Bytes before the first response: magic, version, vocabulary size and fingerprint, count.
const HEADER_LEN: usize = 28;
/// Bytes of the trailing checksum.
const CHECKSUM_LEN: usize = 8;
/// Bytes per encoded token or length.
const WORD_LEN: usize = 4;

/// The target's vocabulary, as far as a plugin can tell one from another: its size and its
/// special tokens. Saved responses are only meaningful to a target with the same vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vocabulary {
    /// Tokens in the vocabulary; every saved token is below it.
    pub(crate) size: u32,
    /// A hash of the size and the BOS, EOS and end-of-generation tokens.
    pub(crate) fingerprint: u64,
}

impl Vocabulary {
    /// The vocabulary of the target `facts` describe.
    pub(crate) fn of(facts: &ModelFacts) -> Self {
        let mut eog = facts.eog.clone();
        eog.sort_unstable();
        eog.dedup();
        let absent = Token::MAX;
        let mut bytes = Vec::with_capacity(WORD_LEN * (4 + eog.len()));
        for word in [
            facts.vocab_size,
            facts.bos.unwrap_or(absent),
            facts.eos.unwrap_or(absent),
        ]
        .into_iter()
        .chain(eog)
        {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        Self {
            size: facts.vocab_size,
            fingerprint: checksum(&bytes),
        }
    }
}

/// Why a blob cannot be loaded; the message says what was found and what happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BlobError {
    /// Not a blob of this plugin.
    Foreign,
    /// A blob of this plugin in another format version.
    Version { found: u32 },
    /// The blob ends before its header and checksum.
    Truncated { len: usize },
    /// The checksum does not match the contents.
    Checksum,
    /// Saved for another target vocabulary.
    OtherVocabulary {
        saved: Vocabulary,
        current: Vocabulary,
    },
    /// The checksum matches but the contents make no sense (a bug in the writer).
    Malformed(String),
}

impl fmt::Display for BlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlobError::Foreign => write!(
                f,
                "it is not a suffix response cache (no `SHSUFFIX` magic); the state file \
                 belongs to another plugin or program"
            ),
            BlobError::Version { found } => write!(
                f,
                "it is in format version {found}, this build reads version {FORMAT_VERSION}; \
                 warm it again with this build"
            ),
            BlobError::Truncated { len } => write!(
                f,
                "it is truncated: {len} bytes, shorter than its header and checksum"
            ),
            BlobError::Checksum => {
                write!(f, "its checksum does not match: it is corrupt or truncated")
            }
            BlobError::OtherVocabulary { saved, current } => write!(
                f,
                "it was saved for another vocabulary ({} tokens, fingerprint {:016x}), the \
                 target has {} tokens, fingerprint {:016x}; warm a cache for this model",
                saved.size, saved.fingerprint, current.size, current.fingerprint
            ),
            BlobError::Malformed(what) => write!(f, "it is malformed: {what}"),
        }
    }
}

/// Encodes `responses` (oldest first, none empty) as a blob for `vocabulary`.
pub(crate) fn encode<'a>(
    vocabulary: Vocabulary,
    responses: impl Iterator<Item = &'a [Token]> + Clone,
) -> Vec<u8> {
    let (count, tokens) = responses
        .clone()
        .fold((0usize, 0usize), |(count, tokens), response| {
            (count + 1, tokens + response.len())
        });
    let mut blob = Vec::with_capacity(HEADER_LEN + WORD_LEN * (count + tokens) + CHECKSUM_LEN);
    blob.extend_from_slice(&MAGIC);
    blob.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    blob.extend_from_slice(&vocabulary.size.to_le_bytes());
    blob.extend_from_slice(&vocabulary.fingerprint.to_le_bytes());
    blob.extend_from_slice(&word(count).to_le_bytes());
    for response in responses {
        debug_assert!(!response.is_empty(), "the cache holds no empty responses");
        blob.extend_from_slice(&word(response.len()).to_le_bytes());
        for token in response {
            blob.extend_from_slice(&token.to_le_bytes());
        }
    }
    let sum = checksum(&blob);
    blob.extend_from_slice(&sum.to_le_bytes());
    blob
}

/// A count as a format word.
///
/// Counts are of responses and tokens held in memory, each at most `max_nodes` (below 2^30),
/// so they fit.
fn word(count: usize) -> u32 {
    u32::try_from(count).expect("cache sizes stay below MAX_TRIE_NODES")
}

/// The responses of a valid blob, still encoded: checked, not copied.
#[derive(Debug)]
pub(crate) struct Saved<'a> {
    blob: &'a [u8],
    /// Byte range of each response's tokens, oldest first.
    responses: Vec<Range<usize>>,
}

impl Saved<'_> {
    /// Number of responses.
    pub(crate) fn len(&self) -> usize {
        self.responses.len()
    }

    /// Tokens in response `index` (0 is the oldest).
    pub(crate) fn response_len(&self, index: usize) -> usize {
        self.responses[index].len() / WORD_LEN
    }

    /// The tokens of response `index`.
    pub(crate) fn response(&self, index: usize) -> Vec<Token> {
        self.blob[self.responses[index].clone()]
            .chunks_exact(WORD_LEN)
            .map(read_u32)
            .collect()
    }
}

/// Checks `blob` and finds its responses, if it is a valid blob for `vocabulary`.
pub(crate) fn decode(blob: &[u8], vocabulary: Vocabulary) -> Result<Saved<'_>, BlobError> {
    if blob.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return Err(BlobError::Foreign);
    }
    let version = blob
        .get(8..12)
        .map(read_u32)
        .ok_or(BlobError::Truncated { len: blob.len() })?;
    if version != FORMAT_VERSION {
        return Err(BlobError::Version { found: version });
    }
    let Some(body_len) = blob
        .len()
        .checked_sub(CHECKSUM_LEN)
        .filter(|&body_len| body_len >= HEADER_LEN)
    else {
        return Err(BlobError::Truncated { len: blob.len() });
    };
    let (body, sum) = blob.split_at(body_len);
    if checksum(body) != u64::from_le_bytes(sum.try_into().expect("CHECKSUM_LEN bytes")) {
        return Err(BlobError::Checksum);
    }
    let saved = Vocabulary {
        size: read_u32(&body[12..16]),
        fingerprint: u64::from_le_bytes(body[16..24].try_into().expect("8 bytes")),
    };
    if saved != vocabulary {
        return Err(BlobError::OtherVocabulary {
            saved,
            current: vocabulary,
        });
    }
    let count = read_u32(&body[24..HEADER_LEN]) as usize;
    // Each response takes at least two words, so a count beyond that is malformed; checking
    // first keeps a bad count from reserving memory.
    if count > (body_len - HEADER_LEN) / (2 * WORD_LEN) {
        return Err(BlobError::Malformed(format!(
            "{count} responses cannot fit in {body_len} bytes"
        )));
    }
    let mut responses = Vec::with_capacity(count);
    let mut offset = HEADER_LEN;
    for index in 0..count {
        let len = body
            .get(offset..offset + WORD_LEN)
            .map(read_u32)
            .ok_or_else(|| BlobError::Malformed(format!("response {index} has no length")))?
            as usize;
        let start = offset + WORD_LEN;
        let end = len
            .checked_mul(WORD_LEN)
            .and_then(|bytes| start.checked_add(bytes))
            .filter(|&end| len > 0 && end <= body_len)
            .ok_or_else(|| {
                BlobError::Malformed(format!(
                    "response {index} claims {len} tokens, at offset {offset} of {body_len} bytes"
                ))
            })?;
        if let Some(token) = body[start..end]
            .chunks_exact(WORD_LEN)
            .map(read_u32)
            .find(|&token| token >= vocabulary.size)
        {
            return Err(BlobError::Malformed(format!(
                "response {index} holds token {token}, outside the vocabulary of {}",
                vocabulary.size
            )));
        }
        responses.push(start..end);
        offset = end;
    }
    if offset != body_len {
        return Err(BlobError::Malformed(format!(
            "{} bytes follow the last response",
            body_len - offset
        )));
    }
    Ok(Saved { blob, responses })
}

/// A little-endian `u32` from exactly four bytes.
fn read_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("WORD_LEN bytes"))
}

/// A 64-bit checksum against accidental corruption (not tampering: the blob is the host's own
/// file), eight bytes per step.
///
/// Each step `state = rotl((state ^ word) * M, 31)` is a bijection of the word for a given
/// state and of the state for a given word (`M` is odd), so any change confined to one 8-byte
/// word always changes the sum; other changes go undetected with a chance near 2^-64. The
/// length is mixed in first, and the end goes through MurmurHash3's `fmix64`. Written here
/// rather than taken from a crate: it is a dozen lines, and the plugin has no other dependency.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
    const MULTIPLIER: u64 = 0x87c3_7b91_1142_53d5;
    let step = |state: u64, word: u64| (state ^ word).wrapping_mul(MULTIPLIER).rotate_left(31);
    let mut state = SEED ^ bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        state = step(state, u64::from_le_bytes(word.try_into().expect("8 bytes")));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut last = [0; 8];
        last[..rest.len()].copy_from_slice(rest);
        state = step(state, u64::from_le_bytes(last));
    }
    state ^= state >> 33;
    state = state.wrapping_mul(0xff51_afd7_ed55_8ccd);
    state ^= state >> 33;
    state = state.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    state ^ (state >> 33)
}

#[cfg(test)]
mod tests {
    use spechost_sdk::testing::facts;

    use super::*;
    use crate::trie::tests::Lcg;

    const VOCAB_SIZE: u32 = 100;

    fn vocabulary() -> Vocabulary {
        Vocabulary::of(&facts(VOCAB_SIZE))
    }

    fn responses(random: &mut Lcg) -> Vec<Vec<Token>> {
        (0..5)
            .map(|_| {
                let len = 1 + random.below(20) as usize;
                random.text(len, VOCAB_SIZE)
            })
            .collect()
    }

    fn encoded(responses: &[Vec<Token>]) -> Vec<u8> {
        encode(vocabulary(), responses.iter().map(Vec::as_slice))
    }

    fn decoded(blob: &[u8]) -> Result<Vec<Vec<Token>>, BlobError> {
        let saved = decode(blob, vocabulary())?;
        Ok((0..saved.len())
            .map(|index| saved.response(index))
            .collect())
    }

    /// A valid blob (right checksum) with `body` after the magic and version.
    fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
        let sum = checksum(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        body
    }

    #[test]
    fn round_trips_responses_in_order() {
        let mut random = Lcg(1);
        let responses = responses(&mut random);
        let blob = encoded(&responses);
        let tokens: usize = responses.iter().map(Vec::len).sum();
        assert_eq!(blob.len(), HEADER_LEN + 4 * (5 + tokens) + CHECKSUM_LEN);
        assert_eq!(decoded(&blob), Ok(responses.clone()));
        let saved = decode(&blob, vocabulary()).expect("valid");
        assert_eq!(saved.response_len(2), responses[2].len());
        assert_eq!(decoded(&encoded(&[])), Ok(Vec::new()), "an empty cache");
    }

    #[test]
    fn layout_is_the_documented_one() {
        let blob = encoded(&[vec![7, 8]]);
        assert_eq!(&blob[..8], b"SHSUFFIX");
        assert_eq!(blob[8..12], 1u32.to_le_bytes(), "format version");
        assert_eq!(blob[12..16], VOCAB_SIZE.to_le_bytes());
        assert_eq!(blob[16..24], vocabulary().fingerprint.to_le_bytes());
        assert_eq!(blob[24..28], 1u32.to_le_bytes(), "one response");
        assert_eq!(blob[28..32], 2u32.to_le_bytes(), "of two tokens");
        assert_eq!(blob[32..36], 7u32.to_le_bytes());
        assert_eq!(blob[36..40], 8u32.to_le_bytes());
        assert_eq!(blob[40..], checksum(&blob[..40]).to_le_bytes());
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let blob = encoded(&responses(&mut Lcg(2)));
        for byte in 0..blob.len() {
            for bit in 0..8 {
                let mut corrupt = blob.clone();
                corrupt[byte] ^= 1 << bit;
                assert!(
                    decoded(&corrupt).is_err(),
                    "bit {bit} of byte {byte} flipped"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_detected() {
        let blob = encoded(&responses(&mut Lcg(3)));
        for len in 0..blob.len() {
            let error = decoded(&blob[..len]).expect_err("truncated");
            let expected = match len {
                0..8 => BlobError::Foreign,
                8..36 => BlobError::Truncated { len },
                _ => BlobError::Checksum,
            };
            assert_eq!(error, expected, "cut to {len} bytes");
        }
    }

    #[test]
    fn rejects_foreign_blobs_other_versions_and_other_vocabularies() {
        assert_eq!(decoded(b"{\"responses\": []}"), Err(BlobError::Foreign));
        assert_eq!(decoded(&[]), Err(BlobError::Foreign));
        let mut blob = encoded(&[vec![1, 2, 3]]);
        blob[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decoded(&blob), Err(BlobError::Version { found: 2 }));
        let blob = encoded(&[vec![1, 2, 3]]);
        let other = Vocabulary::of(&ModelFacts {
            eog: vec![5],
            ..facts(VOCAB_SIZE)
        });
        assert!(matches!(
            decode(&blob, other),
            Err(BlobError::OtherVocabulary { saved, current }) if saved == vocabulary() && current == other
        ));
        assert_ne!(
            Vocabulary::of(&facts(VOCAB_SIZE + 1)),
            vocabulary(),
            "the size alone tells vocabularies apart"
        );
    }

    #[test]
    fn rejects_malformed_contents_with_a_valid_checksum() {
        let header = |count: u32| {
            let mut body = MAGIC.to_vec();
            body.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            body.extend_from_slice(&VOCAB_SIZE.to_le_bytes());
            body.extend_from_slice(&vocabulary().fingerprint.to_le_bytes());
            body.extend_from_slice(&count.to_le_bytes());
            body
        };
        let words = |body: &mut Vec<u8>, words: &[u32]| {
            for word in words {
                body.extend_from_slice(&word.to_le_bytes());
            }
        };
        let malformed = |body: Vec<u8>| match decoded(&with_checksum(body)) {
            Err(BlobError::Malformed(what)) => what,
            other => panic!("expected a malformed blob, got {other:?}"),
        };
        let mut body = header(1);
        words(&mut body, &[3, 1, 2]);
        assert!(malformed(body).contains("claims 3 tokens"));
        let mut body = header(1);
        words(&mut body, &[0, 1, 1]);
        assert!(malformed(body).contains("response 0 claims 0 tokens"));
        let mut body = header(1);
        words(&mut body, &[2, 1, VOCAB_SIZE]);
        assert!(malformed(body).contains("token 100, outside the vocabulary"));
        let mut body = header(1);
        words(&mut body, &[1, 1, 9]);
        assert!(malformed(body).contains("4 bytes follow the last response"));
        let mut body = header(u32::MAX);
        words(&mut body, &[1, 1]);
        assert!(malformed(body).contains("responses cannot fit"));
    }

    #[test]
    fn fingerprint_ignores_the_order_of_end_of_generation_tokens() {
        let facts_with = |eog: Vec<Token>| ModelFacts {
            eog,
            ..facts(VOCAB_SIZE)
        };
        assert_eq!(
            Vocabulary::of(&facts_with(vec![3, 9])),
            Vocabulary::of(&facts_with(vec![9, 3, 3]))
        );
        assert_ne!(
            Vocabulary::of(&facts_with(vec![3])),
            Vocabulary::of(&facts_with(vec![9]))
        );
    }
}

/// Seeded fuzzing of the loader: random bytes, valid blobs mutated then resealed with a correct
/// checksum, and blobs written field by field with plausible mistakes, so that the damage
/// reaches the structural checks behind the checksum. Whatever the
/// bytes, [`decode`] must not panic; what it accepts must be exactly a blob [`encode`] writes,
/// and must load into a cache that respects its caps. (`tests` above covers every single bit
/// flip and truncation of one blob; this covers many-byte damage past the checksum.)
#[cfg(test)]
mod fuzz {
    use spechost_sdk::testing::facts;

    use super::*;
    use crate::cache::tests::expected_counts;
    use crate::cache::{CacheSettings, ResponseCache};
    use crate::trie::tests::{Lcg, trie_counts};

    const VOCAB_SIZE: u32 = 50;
    /// Blobs tried per test: well under a second natively.
    const CASES: u64 = 20_000;

    fn vocabulary() -> Vocabulary {
        Vocabulary::of(&facts(VOCAB_SIZE))
    }

    /// A valid blob of up to 6 responses of up to 12 tokens.
    fn valid_blob(random: &mut Lcg) -> Vec<u8> {
        let responses: Vec<Vec<Token>> = (0..random.below(7))
            .map(|_| {
                let len = 1 + random.below(12) as usize;
                random.text(len, VOCAB_SIZE)
            })
            .collect();
        encode(vocabulary(), responses.iter().map(Vec::as_slice))
    }

    /// A word likely to mean something to the decoder: a small count or length, a token just
    /// inside or outside the vocabulary, or anything at all.
    fn interesting_word(random: &mut Lcg) -> u32 {
        match random.below(5) {
            0 => random.below(4),
            1 => random.below(16),
            2 => VOCAB_SIZE - 1 + random.below(2),
            3 => u32::MAX - random.below(2),
            _ => random.below(u32::MAX),
        }
    }

    /// `blob`'s body (checksum dropped) damaged by one to four random edits, resealed.
    fn resealed_mutation(random: &mut Lcg, blob: &[u8]) -> Vec<u8> {
        let mut body = blob[..blob.len() - CHECKSUM_LEN].to_vec();
        for _ in 0..1 + random.below(4) {
            let at = random.below(body.len() as u32 + 1) as usize;
            match random.below(6) {
                // Overwrite the word at a word boundary past the magic and version.
                0 | 1 => {
                    let words = (body.len().saturating_sub(12)) / WORD_LEN;
                    if words > 0 {
                        let start = 12 + WORD_LEN * random.below(words as u32) as usize;
                        let word = interesting_word(random).to_le_bytes();
                        body[start..start + WORD_LEN].copy_from_slice(&word);
                    }
                }
                2 => {
                    let word = interesting_word(random).to_le_bytes();
                    body.splice(at..at, word);
                }
                3 => {
                    let end = (at + 1 + random.below(8) as usize).min(body.len());
                    body.drain(at.min(end)..end);
                }
                4 => body.truncate(at),
                _ => {
                    if let Some(byte) = body.get_mut(at) {
                        *byte ^= 1 << random.below(8);
                    }
                }
            }
        }
        let sum = checksum(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        body
    }

    /// A blob written field by field with the mistakes a buggy writer could make: a count off
    /// by one, a response length of zero or off by one, a token at or past the vocabulary size;
    /// sealed with a correct checksum. Most fields are right, so many blobs are valid.
    fn raw_blob(random: &mut Lcg) -> Vec<u8> {
        let n_responses = random.below(5) as usize;
        let off_by_one = |random: &mut Lcg, n: usize| match random.below(8) {
            0 => n + 1,
            1 => n.saturating_sub(1),
            _ => n,
        };
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        body.extend_from_slice(&VOCAB_SIZE.to_le_bytes());
        body.extend_from_slice(&vocabulary().fingerprint.to_le_bytes());
        let count = off_by_one(random, n_responses);
        body.extend_from_slice(&word(count).to_le_bytes());
        for _ in 0..n_responses {
            // Length 0 is itself a mistake: responses are never empty.
            let len = random.below(5) as usize;
            body.extend_from_slice(&word(off_by_one(random, len)).to_le_bytes());
            for _ in 0..len {
                let token = match random.below(16) {
                    0 => VOCAB_SIZE + random.below(2),
                    _ => random.below(VOCAB_SIZE),
                };
                body.extend_from_slice(&token.to_le_bytes());
            }
        }
        let sum = checksum(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        body
    }

    /// Settings a session could validly have (`1 <= max_depth < max_nodes`).
    fn random_settings(random: &mut Lcg) -> CacheSettings {
        let max_nodes = 2 + random.below(200) as usize;
        CacheSettings {
            max_depth: 1 + random.below((max_nodes - 1).min(8) as u32) as usize,
            max_nodes,
            max_cached_requests: 1 + random.below(8) as usize,
            vocabulary: vocabulary(),
        }
    }

    /// Checks what `decode` accepted: it re-encodes to the same bytes, every token is in the
    /// vocabulary, and a cache built from it under random caps holds them and counts right.
    fn check_accepted(random: &mut Lcg, blob: &[u8], saved: &Saved<'_>) {
        let responses: Vec<Vec<Token>> = (0..saved.len()).map(|i| saved.response(i)).collect();
        assert_eq!(
            encode(vocabulary(), responses.iter().map(Vec::as_slice)),
            blob,
            "an accepted blob is not what encode writes for its responses {responses:?}"
        );
        assert!(
            responses
                .iter()
                .all(|r| !r.is_empty() && r.iter().all(|&t| t < VOCAB_SIZE)),
            "accepted responses outside the format: {responses:?}"
        );
        let settings = random_settings(random);
        let mut cache = ResponseCache::from_saved(settings, saved);
        cache.work(usize::MAX);
        assert!(cache.is_idle(), "a loaded cache is not fully indexed");
        assert!(
            cache.len() <= settings.max_cached_requests,
            "{} responses kept over a cap of {}",
            cache.len(),
            settings.max_cached_requests
        );
        assert!(
            cache.trie().live_nodes() <= settings.max_nodes,
            "{} nodes over a cap of {}",
            cache.trie().live_nodes(),
            settings.max_nodes
        );
        assert_eq!(trie_counts(cache.trie()), expected_counts(&cache));
    }

    #[test]
    fn random_bytes_are_rejected_without_panicking() {
        let mut random = Lcg(0x5eed);
        for case in 0..CASES {
            let len = random.below(96) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| random.below(256) as u8).collect();
            // Half start like a blob of this build, to get past the first two checks.
            if case % 2 == 0 && bytes.len() >= 12 {
                bytes[..8].copy_from_slice(&MAGIC);
                bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
            }
            let result = decode(&bytes, vocabulary());
            assert!(
                result.is_err(),
                "case {case}: random bytes {bytes:?} accepted"
            );
        }
    }

    #[test]
    fn resealed_mutations_load_as_valid_caches_or_are_rejected() {
        let mut random = Lcg(0xb10b);
        let (mut accepted, mut malformed) = (0, 0);
        for case in 0..CASES {
            let blob = if case % 2 == 0 {
                let valid = valid_blob(&mut random);
                resealed_mutation(&mut random, &valid)
            } else {
                raw_blob(&mut random)
            };
            match decode(&blob, vocabulary()) {
                Ok(saved) => {
                    accepted += 1;
                    check_accepted(&mut random, &blob, &saved);
                }
                Err(error) => {
                    malformed += usize::from(matches!(error, BlobError::Malformed(_)));
                    assert!(!error.to_string().is_empty(), "case {case}: empty message");
                }
            }
        }
        // The seeds are fixed, so these hold or fail deterministically: the mutations must reach
        // both outcomes, or the test checks less than it claims.
        assert!(
            accepted > CASES as usize / 50 && malformed > CASES as usize / 50,
            "accepted {accepted}, malformed {malformed} of {CASES}"
        );
    }
}
