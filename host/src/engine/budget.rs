//! How many draft tokens one round may verify: the configured draft length, cut to the room the
//! round has. The verify loop and the offline simulator (`bench::simulate`) both ask here, so a
//! replayed round drafts exactly as many tokens as the real one did.

/// What bounds one round's draft besides the configured draft length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundLimits {
    /// Tokens the request may still generate (at least 1 while the round runs).
    pub remaining_tokens: usize,
    /// Most tokens one `llama_decode` takes.
    pub batch_size: usize,
    /// Context cells not yet holding committed tokens.
    pub free_context: usize,
}

impl RoundLimits {
    /// The most draft tokens the round can verify: the round commits the accepted draft plus
    /// the target's own token, and all of them must fit in the tokens left to generate, in one
    /// batch and in the context.
    pub fn max_draft_len(&self) -> usize {
        self.remaining_tokens
            .min(self.batch_size)
            .min(self.free_context)
            .saturating_sub(1)
    }

    /// `draft_max` cut to [`max_draft_len`](Self::max_draft_len).
    pub fn budget(&self, draft_max: usize) -> usize {
        draft_max.min(self.max_draft_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(remaining_tokens: usize, batch_size: usize, free_context: usize) -> RoundLimits {
        RoundLimits {
            remaining_tokens,
            batch_size,
            free_context,
        }
    }

    #[test]
    fn budget_leaves_room_for_the_target_token() {
        assert_eq!(limits(100, 512, 1000).budget(8), 8);
        assert_eq!(
            limits(5, 512, 1000).budget(8),
            4,
            "4 drafts + 1 target token"
        );
        assert_eq!(limits(100, 4, 1000).budget(8), 3, "batch of 4");
        assert_eq!(limits(100, 512, 3).budget(8), 2, "3 free cells");
        assert_eq!(limits(1, 512, 1000).budget(8), 0, "last token: no draft");
        assert_eq!(limits(0, 512, 1000).budget(8), 0);
    }
}
