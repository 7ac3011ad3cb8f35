//! `POST /tokenize` and `POST /detokenize`, as llama-server answers them: the target's
//! tokenizer over HTTP, for clients that count or build prompts in tokens.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::extract::ApiJson;
use super::state::AppState;
use crate::cascade::Token;

/// `POST /tokenize` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The text.
    pub content: String,
    /// Add BOS where the model has one (llama-server's default: no).
    #[serde(default)]
    pub add_special: bool,
    /// Read special-token markup in the text as those tokens (default: yes).
    #[serde(default = "yes")]
    pub parse_special: bool,
    /// Answer each token with its text.
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// One token of a `/tokenize` answer `with_pieces`.
#[derive(Debug, Clone, Serialize)]
pub struct TokenPiece {
    /// The token id.
    pub id: Token,
    /// Its text, or its bytes where they are not UTF-8 on their own (part of a character).
    pub piece: Piece,
}

/// A token's text, or its bytes.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Piece {
    /// Valid UTF-8.
    Text(String),
    /// Bytes that are not.
    Bytes(Vec<u8>),
}

/// `POST /tokenize` answer.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Tokenized {
    /// `{"tokens": [ids]}`.
    Ids {
        /// The token ids.
        tokens: Vec<Token>,
    },
    /// `{"tokens": [{"id", "piece"}]}`.
    Pieces {
        /// The tokens with their text.
        tokens: Vec<TokenPiece>,
    },
}

/// `POST /detokenize` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<Token>,
}

/// `POST /detokenize` answer.
#[derive(Debug, Clone, Serialize)]
pub struct Detokenized {
    /// The tokens' text (special tokens as their markup), invalid UTF-8 replaced.
    pub content: String,
}

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<AppState>,
    body: Result<ApiJson<TokenizeRequest>, ApiError>,
) -> Result<Json<Tokenized>, ApiError> {
    let ApiJson(body) = body?;
    let tokenizer = Arc::clone(&state.tokenizer);
    let tokenized = tokio::task::spawn_blocking(move || {
        let tokens = tokenizer.tokenize(&body.content, body.add_special, body.parse_special);
        if !body.with_pieces {
            return Tokenized::Ids { tokens };
        }
        let tokens = tokens
            .into_iter()
            .map(|id| TokenPiece {
                id,
                piece: match String::from_utf8(tokenizer.piece(id, true)) {
                    Ok(text) => Piece::Text(text),
                    Err(bytes) => Piece::Bytes(bytes.into_bytes()),
                },
            })
            .collect();
        Tokenized::Pieces { tokens }
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?;
    Ok(Json(tokenized))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<ApiJson<DetokenizeRequest>, ApiError>,
) -> Result<Json<Detokenized>, ApiError> {
    let ApiJson(body) = body?;
    let vocab_size = state.tokenizer.vocab_size();
    if let Some(token) = body.tokens.iter().find(|&&token| token >= vocab_size) {
        return Err(ApiError::invalid_param(
            "tokens",
            format!("token {token} is outside the vocabulary of {vocab_size} tokens"),
        ));
    }
    let tokenizer = Arc::clone(&state.tokenizer);
    let content = tokio::task::spawn_blocking(move || {
        let bytes: Vec<u8> = body
            .tokens
            .iter()
            .flat_map(|&token| tokenizer.piece(token, true))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    })
    .await
    .map_err(|e| ApiError::internal(format!("detokenizing failed: {e}")))?;
    Ok(Json(Detokenized { content }))
}
