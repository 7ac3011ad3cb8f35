//! Errors of the engine; every message names the fix.

use std::path::PathBuf;

/// Why the target could not be loaded or could not generate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The request's grammar took too long to check a token.
    #[error(
        "the grammar took {took_ms} ms to check one token (the limit is {limit_ms} ms): simplify it (fewer alternatives at one point, no rules that match the same text in many ways)",
        limit_ms = super::sample::MAX_GRAMMAR_TIME_PER_TOKEN.as_millis()
    )]
    GrammarTooSlow {
        /// How long it took.
        took_ms: u64,
    },
    /// The request's grammar cannot be used.
    #[error("{0}")]
    Grammar(#[from] super::grammar::GrammarError),
    /// A metadata override (`--override-kv`, `--experts`) does not fit the model.
    #[error(transparent)]
    Override(#[from] super::overrides::OverrideError),
    /// A round was verified before a prompt was read (a bug in the caller of the protocol).
    #[error("a round was verified before the request's prompt was read; prefill first")]
    NoRequest,
    /// A replayed trace ran out of tokens before generation ended (`spechost simulate`).
    #[error(
        "the trace ended before generation did (it is truncated or hand-made); record it again with `spechost trace`"
    )]
    TraceEnded,
    /// The model file does not exist.
    #[error(
        "model file {path} not found; fetch the default models with `spechost models fetch` or pass --model PATH to a .gguf file"
    )]
    ModelNotFound {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The file exists but is not a GGUF model.
    #[error(
        "{path} is not a GGUF model (it starts with {found:?}, not \"GGUF\"); pass a .gguf file to --model"
    )]
    NotGguf {
        /// The offending file.
        path: PathBuf,
        /// Its first bytes.
        found: String,
    },
    /// The model file could not be read.
    #[error("cannot read model file {path}: {source}; check the path and its permissions")]
    Unreadable {
        /// The offending file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The draft model file does not exist.
    #[error(
        "draft model file {path} not found; give --draft-model a .gguf path, or `auto` (the default target's draft, made by `spechost models quantize` on first use)"
    )]
    DraftModelNotFound {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The draft model does not share the target's tokenizer.
    #[error(
        "draft model {draft} does not use the tokenizer of the target {target}: {difference}; use a draft model with the target's tokenizer, e.g. the target requantized with `spechost models quantize --model TARGET --type Q4_0`"
    )]
    VocabMismatch {
        /// The target's file.
        target: PathBuf,
        /// The draft model's file.
        draft: PathBuf,
        /// The first difference found, with both values.
        difference: String,
    },
    /// llama.cpp refused the file.
    #[error(
        "llama.cpp could not load {path}: the file is truncated, corrupt or of an unsupported architecture; re-fetch it (`spechost models fetch` verifies checksums)"
    )]
    LoadFailed {
        /// The offending file.
        path: PathBuf,
    },
    /// llama.cpp could not be initialised.
    #[error("cannot initialise llama.cpp: {0}")]
    Backend(String),
    /// A second target asked for another NUMA strategy than the process started llama.cpp with.
    #[error(
        "llama.cpp already runs with --numa {active} in this process and cannot switch to {requested}; load every model with the same --numa"
    )]
    NumaAlreadySet {
        /// The strategy asked for.
        requested: &'static str,
        /// The strategy in effect.
        active: &'static str,
    },
    /// A llama.cpp context could not be created.
    #[error(
        "cannot create a context of {ctx_size} tokens: {reason}; lower --ctx-size or free memory"
    )]
    Context {
        /// The requested context size.
        ctx_size: u32,
        /// llama.cpp's reason.
        reason: String,
    },
    /// The chat template could not be applied.
    #[error("cannot apply the model's chat template: {0}; pass --raw to send the prompt as-is")]
    ChatTemplate(String),
    /// The chat template asked for (`--chat-template`, `--jinja`) cannot be used.
    #[error("{0}")]
    ChatTemplateSetting(String),
    /// The batcher that decodes for a server's requests is gone (the server is stopping).
    #[error(
        "the server's decoding thread has stopped; retry on another instance or after it restarts"
    )]
    BatcherStopped,
    /// The prompt has no tokens.
    #[error("the prompt is empty; give text with --prompt, --prompt-file or on stdin")]
    EmptyPrompt,
    /// Prompt and output do not fit in the context.
    #[error(
        "prompt ({prompt} tokens) + --max-tokens ({max_tokens}) exceed the context size ({ctx_size} tokens); raise --ctx-size to at least {needed} or lower --max-tokens"
    )]
    ContextOverflow {
        /// Prompt length in tokens.
        prompt: usize,
        /// Requested output length.
        max_tokens: usize,
        /// Context size.
        ctx_size: u32,
        /// The smallest context that fits.
        needed: usize,
    },
    /// A verify cost measurement cannot run as asked.
    #[error("cannot measure verify costs: {problem}")]
    VerifyCost {
        /// What is wrong, and what to do instead.
        problem: String,
    },
    /// `llama_decode` failed.
    #[error("llama.cpp failed to decode a batch of {n_tokens} tokens: {reason}")]
    Decode {
        /// Batch size.
        n_tokens: usize,
        /// llama.cpp's reason.
        reason: String,
    },
}
