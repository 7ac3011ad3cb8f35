//! [`FedTokens`]: the committed context a plugin instance fed its draft-model context, checked.

use crate::cascade::Token;

/// The tokens a plugin fed its draft-model context since the last reset, at most a context's
/// worth, and whether they can be drafted from: a token outside the vocabulary, or more tokens
/// than the context holds, stops proposals until the next reset (a plugin that never resets
/// cannot grow the host's memory, and a garbage token never reaches llama.cpp).
#[derive(Debug, Clone)]
pub struct FedTokens {
    tokens: Vec<Token>,
    vocab_size: u32,
    ctx_size: usize,
    /// A fed token outside the vocabulary.
    invalid_token: Option<Token>,
    /// More was fed than the context holds: the excess was dropped.
    overflowed: bool,
}

impl FedTokens {
    /// An empty context of `ctx_size` tokens over a vocabulary of `vocab_size`.
    pub fn new(vocab_size: u32, ctx_size: usize) -> Self {
        Self {
            tokens: Vec::new(),
            vocab_size,
            ctx_size,
            invalid_token: None,
            overflowed: false,
        }
    }

    /// Empties the context (a new request).
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.invalid_token = None;
        self.overflowed = false;
    }

    /// Appends committed tokens, as far as the context holds them.
    pub fn feed(&mut self, tokens: &[Token]) {
        if self.invalid_token.is_none()
            && let Some(&bad) = tokens.iter().find(|&&t| t >= self.vocab_size)
        {
            tracing::warn!(
                token = bad,
                vocab_size = self.vocab_size,
                "token fed to the draft model is outside its vocabulary; no proposals until the next reset"
            );
            self.invalid_token = Some(bad);
        }
        let room = self.ctx_size.saturating_sub(self.tokens.len());
        if tokens.len() > room && !self.overflowed {
            tracing::warn!(
                ctx_size = self.ctx_size,
                "more tokens fed to the draft model than its context holds; no proposals until the next reset"
            );
            self.overflowed = true;
        }
        self.tokens
            .extend_from_slice(&tokens[..tokens.len().min(room)]);
    }

    /// The tokens fed since the last reset.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// The tokens to draft after, unless proposals are off until the next reset.
    pub fn draftable(&self) -> Option<&[Token]> {
        (self.invalid_token.is_none() && !self.overflowed).then_some(self.tokens.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_vocabulary_token_stops_proposals_until_a_reset() {
        let mut fed = FedTokens::new(10, 100);
        fed.feed(&[1, 2]);
        assert_eq!(fed.draftable(), Some(&[1, 2][..]));
        fed.feed(&[3, 10]);
        assert_eq!(fed.draftable(), None, "10 is outside a vocabulary of 10");
        fed.reset();
        fed.feed(&[4]);
        assert_eq!(fed.draftable(), Some(&[4][..]));
    }

    #[test]
    fn feeding_past_the_context_keeps_what_fits_and_stops_proposals() {
        let mut fed = FedTokens::new(10, 3);
        fed.feed(&[1, 2, 3, 4, 5]);
        assert_eq!(fed.tokens(), [1, 2, 3], "the excess is dropped");
        assert_eq!(fed.draftable(), None);
    }
}
