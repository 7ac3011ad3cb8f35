//! The grammar source: drafts the text a request's grammar leaves no choice about, and the
//! tokens the model chose before at the same places of the grammar.
//!
//! A grammar fixes much of a constrained answer: a JSON schema's keys, quotes, colons and
//! brackets. From where the output stands, the source asks the grammar which bytes may come
//! next (one probe of the vocabulary's single-byte tokens). Where the model has been before (the
//! same allowed bytes after the same two bytes of output, in any request with this grammar), it
//! drafts the token the model chose there, which also knows how the model splits text into
//! tokens (`":` rather than `"` then `:`, a tab at a time); where the grammar allows a single
//! byte, it walks on while that lasts and drafts the text as the model's tokenizer splits it;
//! elsewhere (free text inside a string) it stops and leaves the rest to other sources. Each
//! token comes with a confidence, and the proposal stops where that falls below
//! [`MIN_CONFIDENCE`].
//!
//! Drafting never changes what is generated: the target verifies every token under the same
//! grammar.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;

use super::GrammarState;
use crate::cascade::{DraftSource, ModelFacts, Proposal, SourceFault, Token};
use crate::engine::model::{from_llama, to_llama};

/// The name the source has in stats.
pub const GRAMMAR_SOURCE: &str = "grammar";

/// Most bytes of text one proposal walks through the grammar.
const MAX_DRAFT_BYTES: usize = 96;

/// A place with more allowed next steps than this is free text: nothing is learnt or guessed
/// there.
const MAX_CHOICES: usize = 6;

/// The probability that the model splits text the grammar forces as its tokenizer does, per
/// token.
const TOKENIZATION_TRUST: f32 = 0.9;

/// A proposal stops before the first token it is less sure of than this (with those before it).
const MIN_CONFIDENCE: f32 = 0.5;

/// Grammars whose learnt choices are kept at once (the least recently opened is forgotten).
const MAX_REMEMBERED_GRAMMARS: usize = 32;

/// A place of the grammar, as the source recognises it: the bytes allowed next (and whether
/// generation may end) after the last two bytes of output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Place {
    recent: [u8; 2],
    allowed: [u64; 4],
    may_end: bool,
}

impl Place {
    /// How many ways the output may go on here: allowed bytes, and the end.
    fn ways(&self) -> usize {
        self.allowed
            .iter()
            .map(|word| word.count_ones() as usize)
            .sum::<usize>()
            + usize::from(self.may_end)
    }

    /// The one byte allowed, when nothing else is (not even the end).
    fn forced_byte(&self) -> Option<u8> {
        (self.ways() == 1 && !self.may_end).then(|| {
            let word = self.allowed.iter().position(|&w| w != 0).unwrap_or(0);
            (word * 64 + self.allowed[word].trailing_zeros() as usize) as u8
        })
    }

    /// Whether the model's choice here is worth learning: few ways to go.
    fn is_structure(&self) -> bool {
        (1..=MAX_CHOICES).contains(&self.ways())
    }
}

/// The token the model chose at a place, and how often that held since.
#[derive(Debug, Clone, Copy)]
struct Choice {
    token: Token,
    held: u32,
    broke: u32,
}

/// The tokens the model chose at the places of one grammar, learnt from committed output.
#[derive(Debug, Default)]
pub(crate) struct Choices(HashMap<Place, Choice>);

impl Choices {
    fn learn(&mut self, place: Place, token: Token) {
        let choice = self.0.entry(place).or_insert(Choice {
            token,
            held: 0,
            broke: 0,
        });
        if choice.token == token {
            choice.held += 1;
        } else if choice.broke >= choice.held {
            *choice = Choice {
                token,
                held: 1,
                broke: 0,
            };
        } else {
            choice.broke += 1;
        }
    }

    /// The token the model chose at `place` more often than not, with the probability that
    /// it does again (by how often it did: Laplace's rule).
    fn likely(&self, place: &Place) -> Option<(Token, f32)> {
        let choice = self.0.get(place)?;
        let confidence =
            (choice.held as f32 + 1.0) / (choice.held as f32 + choice.broke as f32 + 2.0);
        (choice.held > choice.broke).then_some((choice.token, confidence))
    }
}

/// What a model's vocabulary offers the source: a token for each single byte (how it walks the
/// grammar), and an end-of-generation token to ask the grammar whether it may end.
pub(crate) struct ByteTokens {
    by_byte: Vec<Option<LlamaToken>>,
    /// What the grammar is asked about at each place, in order: each byte that has a token,
    /// then the end (`None`).
    probes: Vec<(LlamaToken, Option<u8>)>,
}

impl ByteTokens {
    /// Scans `model`'s vocabulary (once per model: tens of milliseconds on 262K tokens).
    pub(crate) fn of(model: &LlamaModel) -> Self {
        let vocab = model.vocab();
        let mut by_byte = vec![None; 256];
        let mut piece = Vec::new();
        let mut end = None;
        for id in 0..model.n_vocab() {
            let token = LlamaToken(id);
            if vocab.is_eog(token) {
                end = end.or(Some(token));
                continue;
            }
            piece.clear();
            vocab.token_to_piece_into(token, &mut piece, false, None);
            // A byte's own token comes first where a vocabulary has two (a byte-fallback token
            // and a character): either walks the grammar the same way.
            if let [byte] = piece[..]
                && by_byte[byte as usize].is_none()
            {
                by_byte[byte as usize] = Some(token);
            }
        }
        let probes = (0..=u8::MAX)
            .filter_map(|byte| by_byte[byte as usize].map(|token| (token, Some(byte))))
            .chain(end.map(|token| (token, None)))
            .collect();
        Self { by_byte, probes }
    }

    /// Where `grammar` stands after `recent`: which bytes it allows next, and whether it may
    /// end (`candidates` is scratch space).
    fn place(
        &self,
        candidates: &mut LlamaTokenDataArray,
        grammar: &mut GrammarState,
        recent: [u8; 2],
    ) -> Place {
        candidates.data.clear();
        candidates.data.extend(
            self.probes
                .iter()
                .map(|&(token, _)| LlamaTokenData::new(token, 0.0, 0.0)),
        );
        candidates.selected = None;
        candidates.sorted = false;
        grammar.mask(candidates);
        let mut place = Place {
            recent,
            allowed: [0; 4],
            may_end: false,
        };
        // The grammar masks candidates in place, in order.
        for (candidate, &(_, byte)) in candidates.data.iter().zip(&self.probes) {
            if candidate.logit() == f32::NEG_INFINITY {
                continue;
            }
            match byte {
                Some(byte) => place.allowed[byte as usize / 64] |= 1 << (byte % 64),
                None => place.may_end = true,
            }
        }
        place
    }
}

/// The learnt choices of recently used grammars, by grammar text, shared by every request on
/// a model.
#[derive(Default)]
pub(crate) struct ChoiceMemory {
    grammars: Mutex<Vec<(String, Arc<Mutex<Choices>>)>>,
}

impl ChoiceMemory {
    /// The choices learnt for the grammar `text` (new ones when it is not remembered).
    pub(crate) fn of(&self, text: &str) -> Arc<Mutex<Choices>> {
        let mut grammars = self.grammars.lock().unwrap_or_else(|e| e.into_inner());
        let choices = match grammars.iter().position(|(known, _)| known == text) {
            Some(index) => grammars.remove(index).1,
            None => Arc::default(),
        };
        grammars.push((text.to_owned(), Arc::clone(&choices)));
        if grammars.len() > MAX_REMEMBERED_GRAMMARS {
            grammars.remove(0);
        }
        choices
    }
}

/// Drafts what a request's grammar makes certain or likely (see the module documentation).
pub struct GrammarSource {
    model: Arc<LlamaModel>,
    bytes: Arc<ByteTokens>,
    /// The grammar at the start of generation.
    start: GrammarState,
    /// The grammar after the output fed so far.
    state: GrammarState,
    choices: Arc<Mutex<Choices>>,
    /// The last two bytes of output.
    recent: [u8; 2],
    candidates: LlamaTokenDataArray,
    piece: Vec<u8>,
}

/// Where a walk ahead of the output stands.
struct Ahead {
    grammar: GrammarState,
    recent: [u8; 2],
    walked: usize,
    tokens: Vec<Token>,
    confidence: Vec<f32>,
}

impl Ahead {
    fn sure(&self) -> f32 {
        self.confidence.last().copied().unwrap_or(1.0)
    }
}

impl GrammarSource {
    pub(in crate::engine) fn new(
        model: Arc<LlamaModel>,
        bytes: Arc<ByteTokens>,
        start: GrammarState,
        choices: Arc<Mutex<Choices>>,
    ) -> Self {
        Self {
            model,
            bytes,
            state: start.duplicate(),
            start,
            choices,
            recent: [0; 2],
            candidates: LlamaTokenDataArray::new(Vec::with_capacity(257), false),
            piece: Vec::new(),
        }
    }

    /// A source for another cascade of the same request, from the start of generation.
    pub fn restart(&self) -> Self {
        Self::new(
            Arc::clone(&self.model),
            Arc::clone(&self.bytes),
            self.start.duplicate(),
            Arc::clone(&self.choices),
        )
    }

    /// The bytes of `token` in output, into `self.piece`.
    fn piece_of(&mut self, token: Token) {
        self.piece.clear();
        self.model
            .vocab()
            .token_to_piece_into(to_llama(token), &mut self.piece, false, None);
    }

    /// `recent` after `token`'s bytes.
    fn after(&mut self, recent: [u8; 2], token: Token) -> [u8; 2] {
        self.piece_of(token);
        match self.piece[..] {
            [] => recent,
            [byte] => [recent[1], byte],
            [.., a, b] => [a, b],
        }
    }

    fn is_end(&self, token: Token) -> bool {
        self.model.vocab().is_eog(to_llama(token))
    }

    /// The draft, token by token, as far as the model's past choices and the grammar's forced
    /// bytes carry it, at most `max_draft_len` tokens.
    fn walk_ahead(&mut self, max_draft_len: usize) -> Proposal {
        let choices = Arc::clone(&self.choices);
        let mut ahead = Ahead {
            grammar: self.state.duplicate(),
            recent: self.recent,
            walked: 0,
            tokens: Vec::new(),
            confidence: Vec::new(),
        };
        while ahead.tokens.len() < max_draft_len && ahead.walked < MAX_DRAFT_BYTES {
            let place = self
                .bytes
                .place(&mut self.candidates, &mut ahead.grammar, ahead.recent);
            let learnt = lock(&choices).likely(&place);
            let moved = match learnt {
                Some((token, sure)) if ahead.grammar.allows(token) => {
                    self.take(&mut ahead, token, sure)
                }
                _ if place.forced_byte().is_some() => self.take_forced(&mut ahead),
                _ => false,
            };
            if !moved
                || ahead.sure() < MIN_CONFIDENCE
                || ahead.tokens.last().is_some_and(|&t| self.is_end(t))
            {
                break;
            }
        }
        let sure = ahead
            .confidence
            .iter()
            .take_while(|&&sure| sure >= MIN_CONFIDENCE)
            .count()
            .min(max_draft_len);
        let mut proposal = Proposal {
            tokens: ahead.tokens,
            confidence: ahead.confidence,
            parents: Vec::new(),
        };
        proposal.truncate(sure);
        proposal
    }

    /// Drafts `token`, which the model chooses with probability `sure` here.
    fn take(&mut self, ahead: &mut Ahead, token: Token, sure: f32) -> bool {
        ahead.grammar.accept(token);
        ahead.recent = self.after(ahead.recent, token);
        ahead.walked += self.piece.len().max(1);
        ahead.confidence.push(ahead.sure() * sure);
        ahead.tokens.push(token);
        true
    }

    /// Walks the bytes the grammar forces from here and drafts them as the tokenizer splits
    /// them, but for the last token (the model may join its bytes to what follows: `"` and
    /// `:` as `":`). Whether it drafted anything.
    fn take_forced(&mut self, ahead: &mut Ahead) -> bool {
        let mut walk = ahead.grammar.duplicate();
        let mut recent = ahead.recent;
        let mut text = Vec::new();
        while ahead.walked + text.len() < MAX_DRAFT_BYTES {
            let Some(byte) = self
                .bytes
                .place(&mut self.candidates, &mut walk, recent)
                .forced_byte()
            else {
                break;
            };
            let Some(token) = self.bytes.by_byte[byte as usize] else {
                break;
            };
            walk.accept(from_llama(token));
            text.push(byte);
            recent = [recent[1], byte];
        }
        let complete = match std::str::from_utf8(&text) {
            Ok(_) => text.len(),
            Err(error) => error.valid_up_to(),
        };
        let mut tokens = self.model.vocab().tokenize(&text[..complete], false, false);
        tokens.pop();
        let mut at = 0;
        let mut drafted = false;
        for token in tokens {
            let token = from_llama(token);
            self.piece_of(token);
            let end = at + self.piece.len();
            // A tokenizer that changed the text (a space prefix) drafts what still matches.
            if self.piece.is_empty()
                || text.get(at..end) != Some(&self.piece[..])
                || !ahead.grammar.allows(token)
            {
                break;
            }
            at = end;
            drafted = self.take(ahead, token, TOKENIZATION_TRUST);
        }
        drafted
    }

    /// Learns the model's choice of `token` and advances the grammar past it.
    fn follow(&mut self, token: Token) {
        let place = self
            .bytes
            .place(&mut self.candidates, &mut self.state, self.recent);
        if place.is_structure() {
            lock(&self.choices).learn(place, token);
        }
        if !self.is_end(token) {
            self.state.accept(token);
            self.recent = self.after(self.recent, token);
        }
    }
}

fn lock(choices: &Mutex<Choices>) -> MutexGuard<'_, Choices> {
    choices.lock().unwrap_or_else(|e| e.into_inner())
}

impl DraftSource for GrammarSource {
    fn name(&self) -> &str {
        GRAMMAR_SOURCE
    }

    fn begin(&mut self, _facts: &ModelFacts, _prompt: &[Token]) -> Result<(), SourceFault> {
        // The grammar constrains the output only: the prompt is not walked.
        self.state = self.start.duplicate();
        self.recent = [0; 2];
        Ok(())
    }

    fn propose(&mut self, max_draft_len: usize) -> Result<Proposal, SourceFault> {
        Ok(self.walk_ahead(max_draft_len))
    }

    fn feed(&mut self, tokens: &[Token]) -> Result<(), SourceFault> {
        for &token in tokens {
            self.follow(token);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(bytes: &[u8], may_end: bool) -> Place {
        let mut allowed = [0; 4];
        for &byte in bytes {
            allowed[byte as usize / 64] |= 1 << (byte % 64);
        }
        Place {
            recent: *b"\":",
            allowed,
            may_end,
        }
    }

    #[test]
    fn a_place_forces_a_byte_only_when_nothing_else_may_follow() {
        assert_eq!(place(b"\"", false).forced_byte(), Some(b'"'));
        assert_eq!(place(&[0xE2], false).forced_byte(), Some(0xE2));
        assert_eq!(place(b"\"", true).forced_byte(), None, "or the end");
        assert_eq!(place(b" \"", false).forced_byte(), None);
        assert_eq!(place(b" \n\"", true).ways(), 4);
        assert!(place(b" \n\"", true).is_structure());
        assert!(!place(b"abcdefgh", false).is_structure(), "free text");
        assert!(!place(b"", false).is_structure(), "nowhere to go");
    }

    #[test]
    fn choices_follow_what_the_model_does_more_often_than_not() {
        let (here, elsewhere) = (place(b" \"", false), place(b" \n", false));
        let mut choices = Choices::default();
        assert_eq!(choices.likely(&here), None);
        choices.learn(here, 7);
        assert_eq!(choices.likely(&here), Some((7, 2.0 / 3.0)));
        assert_eq!(choices.likely(&elsewhere), None, "another place");
        choices.learn(here, 7);
        choices.learn(here, 9);
        assert_eq!(
            choices.likely(&here),
            Some((7, 0.6)),
            "held twice, broke once"
        );
        choices.learn(here, 9);
        assert_eq!(choices.likely(&here), None, "as often broken as held");
        choices.learn(here, 9);
        assert_eq!(
            choices.likely(&here),
            Some((9, 2.0 / 3.0)),
            "the new habit replaces the old"
        );
    }

    #[test]
    fn the_memory_keeps_the_most_recently_used_grammars() {
        let memory = ChoiceMemory::default();
        let first = memory.of("root ::= \"a\"");
        lock(&first).learn(place(b"a", false), 1);
        for other in 0..MAX_REMEMBERED_GRAMMARS - 1 {
            memory.of(&format!("root ::= \"{other}\""));
        }
        let again = memory.of("root ::= \"a\"");
        assert!(Arc::ptr_eq(&first, &again), "still remembered");
        for other in 0..MAX_REMEMBERED_GRAMMARS {
            memory.of(&format!("root ::= \"x{other}\""));
        }
        let forgotten = memory.of("root ::= \"a\"");
        assert!(
            !Arc::ptr_eq(&first, &forgotten),
            "forgotten after as many others"
        );
        assert_eq!(lock(&forgotten).likely(&place(b"a", false)), None);
    }
}
