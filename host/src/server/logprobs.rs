//! Log-probabilities in answers: what a request asks for (`logprobs`, `top_logprobs`) and the
//! two layouts OpenAI defines, chat's `content` list and the legacy completions' parallel
//! lists. The numbers come from the verify batch's logits at each committed position, the
//! same logits plain decoding computes (docs/exactness.md), so they equal plain decoding's.

use serde_json::{Value, json};

use super::error::ApiError;
use super::state::PromptTokenizer;
use crate::engine::{MAX_TOP_LOGPROBS, TokenLogprob};

/// What a chat request asks for: `logprobs: true` reports each token's log-probability,
/// `top_logprobs: N` (0 to [`MAX_TOP_LOGPROBS`], with `logprobs: true`) the N most likely
/// tokens at each position too. `None`: nothing asked.
pub fn chat_request(
    logprobs: Option<&Value>,
    top_logprobs: Option<&Value>,
) -> Result<Option<usize>, ApiError> {
    let asked = match logprobs {
        None | Some(Value::Null) => false,
        Some(Value::Bool(asked)) => *asked,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!(
                    "logprobs must be true or false in a chat completion, got {other}; give the number of alternatives in top_logprobs"
                ),
            ));
        }
    };
    let top = match top_logprobs {
        None | Some(Value::Null) => None,
        Some(value) => Some(count("top_logprobs", value)?),
    };
    match (asked, top) {
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, None | Some(0)) => Ok(None),
        (false, Some(_)) => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true; set it, or leave top_logprobs out",
        )),
    }
}

/// What a completion request asks for: legacy `logprobs: N` reports each token's
/// log-probability and the N most likely tokens at each position (0 to [`MAX_TOP_LOGPROBS`]).
pub fn completion_request(
    logprobs: Option<&Value>,
    top_logprobs: Option<&Value>,
) -> Result<Option<usize>, ApiError> {
    if top_logprobs.is_some_and(|value| !value.is_null()) {
        return Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs is a chat completion field; in a completion, logprobs: N asks for the N most likely tokens",
        ));
    }
    match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(0)),
        Some(value) => count("logprobs", value).map(Some),
    }
}

fn count(param: &'static str, value: &Value) -> Result<usize, ApiError> {
    value
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= MAX_TOP_LOGPROBS)
        .ok_or_else(|| {
            ApiError::invalid_param(
                param,
                format!("{param} must be a whole number from 0 to {MAX_TOP_LOGPROBS}, got {value}"),
            )
        })
}

/// Chat's `logprobs` of a message or of a chunk's delta: `{"content": [...], "refusal": null}`,
/// one entry per token with its text, bytes and alternatives.
pub fn chat_content(tokenizer: &dyn PromptTokenizer, logprobs: &[TokenLogprob]) -> Value {
    let entry = |token, logprob: f32| {
        let bytes = tokenizer.piece(token, false);
        json!({
            "token": String::from_utf8_lossy(&bytes),
            "logprob": logprob,
            "bytes": bytes,
        })
    };
    let content: Vec<Value> = logprobs
        .iter()
        .map(|generated| {
            let mut value = entry(generated.token, generated.logprob);
            value["top_logprobs"] = generated
                .top
                .iter()
                .map(|&(token, logprob)| entry(token, logprob))
                .collect();
            value
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The legacy completions' `logprobs`, built piece by piece as a stream goes (the text
/// offsets continue from one chunk to the next).
#[derive(Debug, Default)]
pub struct CompletionLogprobs {
    /// Characters of completion text before the next token.
    offset: usize,
}

impl CompletionLogprobs {
    /// `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` of `logprobs`, which
    /// follow the tokens formatted before.
    pub fn next(&mut self, tokenizer: &dyn PromptTokenizer, logprobs: &[TokenLogprob]) -> Value {
        let text = |token| String::from_utf8_lossy(&tokenizer.piece(token, false)).into_owned();
        let mut tokens = Vec::with_capacity(logprobs.len());
        let mut token_logprobs = Vec::with_capacity(logprobs.len());
        let mut top_logprobs = Vec::with_capacity(logprobs.len());
        let mut text_offset = Vec::with_capacity(logprobs.len());
        for generated in logprobs {
            let piece = text(generated.token);
            text_offset.push(self.offset);
            self.offset += piece.chars().count();
            tokens.push(piece);
            token_logprobs.push(generated.logprob);
            let top: serde_json::Map<String, Value> = generated
                .top
                .iter()
                .map(|&(token, logprob)| (text(token), json!(logprob)))
                .collect();
            top_logprobs.push(top);
        }
        json!({
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_asks_with_a_flag_and_a_count() {
        let t = Value::Bool(true);
        assert_eq!(chat_request(None, None).ok(), Some(None));
        assert_eq!(chat_request(Some(&t), None).ok(), Some(Some(0)));
        assert_eq!(chat_request(Some(&t), Some(&json!(5))).ok(), Some(Some(5)));
        assert_eq!(
            chat_request(Some(&Value::Bool(false)), Some(&json!(0))).ok(),
            Some(None)
        );
        for (logprobs, top, needle) in [
            (None, Some(json!(3)), "needs logprobs: true"),
            (Some(t.clone()), Some(json!(21)), "from 0 to 20"),
            (Some(t.clone()), Some(json!(-1)), "from 0 to 20"),
            (Some(json!(3)), None, "true or false"),
        ] {
            let error = chat_request(logprobs.as_ref(), top.as_ref()).expect_err(needle);
            assert!(error.message().contains(needle), "{}", error.message());
        }
    }

    #[test]
    fn completions_ask_with_a_count() {
        assert_eq!(completion_request(None, None).ok(), Some(None));
        assert_eq!(
            completion_request(Some(&json!(0)), None).ok(),
            Some(Some(0))
        );
        assert_eq!(
            completion_request(Some(&json!(5)), None).ok(),
            Some(Some(5))
        );
        assert!(completion_request(Some(&json!(50)), None).is_err());
        assert!(completion_request(Some(&json!(1)), Some(&json!(1))).is_err());
    }
}
