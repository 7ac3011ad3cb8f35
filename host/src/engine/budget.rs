//! How many draft tokens one round may verify: the configured draft length, cut to the room the
//! round has. The verify loop and the offline simulator (`bench::simulate`) both ask here, so a
//! replayed round drafts exactly as many tokens as the real one did.

/// Why a maximum draft length given by a user (a flag, an admin update, a request) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MaxDraftLenError {
    /// 0: a cascade with nothing to draft; plain decoding is the cascade `none`.
    #[error(
        "the draft length must be at least 1; use the cascade `none` to decode without speculation"
    )]
    Zero,
    /// More than the limit that applies.
    #[error("the draft length {given} is above {limit}, the most allowed here")]
    AboveLimit {
        /// The value given.
        given: usize,
        /// The limit.
        limit: usize,
    },
}

/// The one check of a maximum draft length given by a user: at least 1, at most `limit` (the
/// process-wide [`MAX_DRAFT_LEN_LIMIT`](super::MAX_DRAFT_LEN_LIMIT), or a server's
/// `--draft-max`). Callers word the error for where the value came from.
pub fn check_max_draft_len(given: usize, limit: usize) -> Result<usize, MaxDraftLenError> {
    match given {
        0 => Err(MaxDraftLenError::Zero),
        too_large if too_large > limit => Err(MaxDraftLenError::AboveLimit { given, limit }),
        _ => Ok(given),
    }
}

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
    pub fn room(&self) -> usize {
        self.remaining_tokens
            .min(self.batch_size)
            .min(self.free_context)
            .saturating_sub(1)
    }

    /// The round's draft length: the request's `max_draft_len` cut to [`room`](Self::room).
    pub fn max_draft_len(&self, max_draft_len: usize) -> usize {
        max_draft_len.min(self.room())
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
    fn a_maximum_draft_length_is_at_least_one_and_at_most_the_limit() {
        assert_eq!(check_max_draft_len(0, 24), Err(MaxDraftLenError::Zero));
        assert_eq!(check_max_draft_len(1, 24), Ok(1));
        assert_eq!(check_max_draft_len(24, 24), Ok(24));
        assert_eq!(
            check_max_draft_len(25, 24),
            Err(MaxDraftLenError::AboveLimit {
                given: 25,
                limit: 24
            })
        );
        assert!(check_max_draft_len(usize::MAX, 24).is_err());
    }

    #[test]
    fn the_draft_leaves_room_for_the_target_token() {
        assert_eq!(limits(100, 512, 1000).max_draft_len(8), 8);
        assert_eq!(
            limits(5, 512, 1000).max_draft_len(8),
            4,
            "4 drafts + 1 target token"
        );
        assert_eq!(limits(100, 4, 1000).max_draft_len(8), 3, "batch of 4");
        assert_eq!(limits(100, 512, 3).max_draft_len(8), 2, "3 free cells");
        assert_eq!(
            limits(1, 512, 1000).max_draft_len(8),
            0,
            "last token: no draft"
        );
        assert_eq!(limits(0, 512, 1000).max_draft_len(8), 0);
    }
}
