//! The draft model: a second GGUF that proposes tokens for drafter plugins to use.
//!
//! Order of operations:
//! 1. [`DraftModelHost::load`] loads the GGUF (once per process, after the target) and
//!    [`check_vocab_compatible`] makes sure it shares the target's tokenizer;
//! 2. `plugins` calls [`DraftModelFactory::open`] once per plugin instance that asks for the
//!    model, getting a [`DraftModelContext`]: one llama.cpp context with its own KV cache;
//! 3. the plugin feeds it the committed tokens and asks it to [`DraftModel::propose`]; the
//!    plugin decides how many tokens to ask for and the probability below which to stop.
//!
//! # Ownership
//!
//! A llama.cpp context borrows its model (`ModelContext<'model>`), but a context handed to a
//! plugin lives in a wasmtime store, so it must be `'static`. Each context therefore owns an
//! `Arc` of the model next to the context that borrows it (a `self_cell`): the weights are
//! loaded once, shared by every context, and freed when the last context and the host are
//! dropped. The alternatives were worse: leaking the model needs a process-wide registry so that
//! tests loading it repeatedly do not leak repeatedly (hidden global state), and a thread owning
//! model and contexts would serialise the drafting of concurrent requests and add a channel
//! round trip to every call.
//!
//! # Cache reuse
//!
//! A context remembers which tokens its KV cache holds ([`CachedPrefix`]). Fed tokens are only
//! appended to a list; `propose` evaluates what is missing. Tokens it drafted stay in the cache,
//! so when the target accepts them and they come back through `feed`, only the target's own token
//! is new and only it is decoded (the idea of llama.cpp's `common_speculative_gen_draft`, which
//! reuses the draft cache's longest common prefix with the new context). Cache entries past the
//! common prefix are removed with `seq_rm`.
//!
//! Exactness is not needed here (the target verifies every drafted token), but the context is
//! the target's kind (`ModelContext`: flash attention, Q8_0 KV cache, full sliding-window
//! cache) so both models run the same kernels and the draft's cache can be rolled back on any
//! architecture.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;

use super::context::{ContextSettings, ModelContext, Outputs};
use super::error::EngineError;
use super::model::{Target, TargetParams, check_gguf, started_backend};
use super::sample::argmax_with_probability;
use super::verify::DEFAULT_BATCH_SIZE;
use super::vocab::VocabFingerprint;
use crate::cascade::{DraftModel, DraftModelFactory, DraftedToken, Token};

/// Rows of the start-up check of a draft context's batches: its batches are prompt catch-ups,
/// whose exactness does not matter (the target verifies every drafted token); the check decides
/// only whether the host's products are used.
const DRAFT_CHECK_ROWS: usize = 3;

/// Where the draft model comes from and how its contexts are sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftModelConfig {
    /// The draft GGUF.
    pub path: PathBuf,
    /// Context size of each draft context, in tokens (the target's, so a draft context holds
    /// every context the target can verify).
    pub ctx_size: u32,
    /// Compute threads of each draft context (the target's by default: the two models never
    /// run at the same time).
    pub threads: usize,
}

/// The loaded draft model; opens one [`DraftModelContext`] per plugin instance that asks.
pub struct DraftModelHost {
    model: Arc<LlamaModel>,
    config: DraftModelConfig,
    /// llama.cpp may write to the model while it creates a context, so contexts are created
    /// one at a time (see `LlamaModel::new_context`).
    opening: Mutex<()>,
}

impl DraftModelHost {
    /// Loads the GGUF named in `config`, checking first that it exists and is a GGUF file;
    /// `loading` says how the file is mapped (the target's settings).
    pub fn load(config: &DraftModelConfig, loading: &TargetParams) -> Result<Self, EngineError> {
        let path = &config.path;
        check_gguf(path).map_err(|error| match error {
            EngineError::ModelNotFound { path } => EngineError::DraftModelNotFound { path },
            other => other,
        })?;
        let model_params = LlamaModelParams::default()
            .with_use_mmap(loading.use_mmap)
            .with_use_mlock(loading.use_mlock);
        let model = LlamaModel::load_from_file(started_backend()?, path, &model_params)
            .map_err(|_| EngineError::LoadFailed { path: path.clone() })?;
        if model.is_recurrent() || model.is_hybrid() {
            return Err(EngineError::DraftModelCannotRollBack { path: path.clone() });
        }
        tracing::info!(path = %path.display(), vocab = model.n_vocab(), params = model.n_params(), "loaded draft model");
        Ok(Self {
            model: Arc::new(model),
            config: config.clone(),
            opening: Mutex::new(()),
        })
    }

    /// Loads the draft model as [`load`](Self::load) does and checks it against `target` with
    /// [`check_vocab_compatible`].
    pub fn load_for(
        target: &Target,
        config: &DraftModelConfig,
        loading: &TargetParams,
    ) -> Result<Self, EngineError> {
        let draft = Self::load(config, loading)?;
        check_vocab_compatible(target, &draft)?;
        Ok(draft)
    }

    /// The file the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.config.path
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> u32 {
        self.model.n_vocab().max(0) as u32
    }

    /// A fresh, empty context, as [`DraftModelFactory::open`] but with the engine's error.
    pub fn open_context(&self) -> Result<DraftModelContext, EngineError> {
        let ctx_size = self.config.ctx_size;
        let context_error = |reason: String| EngineError::Context { ctx_size, reason };
        if ctx_size == 0 {
            return Err(context_error(
                "the draft context needs at least 1 token".into(),
            ));
        }
        let settings = ContextSettings {
            ctx_size,
            // The prompt is fed in batches of this many tokens; a draft context decodes only
            // one request's prompt, so the target's batch size is the right trade of memory
            // for speed.
            batch_size: DEFAULT_BATCH_SIZE.min(ctx_size),
            threads: self.config.threads.max(1),
            sequences: 1,
            check_rows: DRAFT_CHECK_ROWS,
        };
        let backend = started_backend()?;
        let context = {
            let _one_at_a_time = self.opening.lock().unwrap_or_else(|e| e.into_inner());
            OwnedContext::try_new(Arc::clone(&self.model), |model| {
                ModelContext::new(backend, model, &settings)
            })
            .map_err(context_error)?
        };
        Ok(DraftModelContext::new(context, self.vocab_size()))
    }

    fn fingerprint(&self) -> VocabFingerprint {
        VocabFingerprint::of(&self.model)
    }
}

impl DraftModelFactory for DraftModelHost {
    fn open(&self) -> Result<Box<dyn DraftModel>, String> {
        self.open_context()
            .map(|context| Box::new(context) as Box<dyn DraftModel>)
            .map_err(|e| e.to_string())
    }
}

/// Checks that `draft` uses `target`'s tokenizer: vocabulary size, BOS, EOS, the
/// end-of-generation set and the texts of a sample of tokens must be equal. The error names the
/// first difference with both values.
pub fn check_vocab_compatible(target: &Target, draft: &DraftModelHost) -> Result<(), EngineError> {
    let target_vocab = VocabFingerprint::of(target.llama_model());
    match VocabFingerprint::difference(&target_vocab, &draft.fingerprint()) {
        None => Ok(()),
        Some(difference) => Err(EngineError::VocabMismatch {
            target: target.path().to_owned(),
            draft: draft.path().to_owned(),
            difference,
        }),
    }
}

/// `ModelContext<'model>` by a name `self_cell` can take a lifetime into.
type BorrowedContext<'model> = ModelContext<'model>;

self_cell::self_cell!(
    /// A llama.cpp context together with the model it borrows.
    struct OwnedContext {
        owner: Arc<LlamaModel>,
        #[covariant]
        dependent: BorrowedContext,
    }
);

/// One draft context: the tokens fed since the last reset, and a KV cache that holds a prefix
/// of them (plus, after a proposal, the tokens drafted beyond them).
pub struct DraftModelContext {
    context: OwnedContext,
    batch_size: usize,
    vocab_size: u32,
    /// The committed context, as fed.
    fed: Vec<Token>,
    /// What the KV cache holds.
    cached: CachedPrefix,
    /// A fed token outside the vocabulary: proposals are empty until the next reset.
    invalid_token: Option<Token>,
    /// More was fed than the context holds: the excess was dropped, and proposals are empty
    /// until the next reset (a plugin that never resets cannot grow the host's memory).
    overflowed: bool,
}

impl DraftModelContext {
    fn new(context: OwnedContext, vocab_size: u32) -> Self {
        let batch_size = context.borrow_dependent().batch_capacity();
        Self {
            context,
            batch_size,
            vocab_size,
            fed: Vec::new(),
            cached: CachedPrefix::default(),
            invalid_token: None,
            overflowed: false,
        }
    }

    /// Context size in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.context.borrow_dependent().n_ctx()
    }

    /// The tokens fed since the last reset, at most a context's worth.
    pub fn context_tokens(&self) -> &[Token] {
        &self.fed
    }

    /// How many matrix products of this context's batches (prompt catch-ups) the host's batched
    /// kernel computed, as `Session::host_batch_products` for the target.
    pub fn host_batch_products(&self) -> u64 {
        self.context.borrow_dependent().host_products()
    }

    /// Decodes what the cache lacks of the fed context, then drafts; any llama.cpp failure is
    /// returned, and leaves the cache empty so the next proposal starts over.
    fn try_propose(
        &mut self,
        max_len: usize,
        p_min: f32,
    ) -> Result<Vec<DraftedToken>, EngineError> {
        let n_ctx = self.ctx_size() as usize;
        // Position i of the draft needs drafted token i-1 decoded at `fed.len() + i - 1`, which
        // must be inside the context.
        let max_len = max_len.min(n_ctx.saturating_sub(self.fed.len()));
        if max_len == 0 || self.fed.is_empty() {
            return Ok(Vec::new());
        }
        let result = self.draft(max_len, p_min);
        if result.is_err() {
            self.context
                .with_dependent_mut(|_, context| context.clear());
            self.cached.clear();
        }
        result
    }

    fn draft(&mut self, max_len: usize, p_min: f32) -> Result<Vec<DraftedToken>, EngineError> {
        // The last fed token is decoded again even when cached, for its logits.
        let keep = self.cached.common_prefix(&self.fed).min(self.fed.len() - 1);
        self.remove_from(keep)?;
        let mut logits_index = 0;
        let mut position = keep;
        while position < self.fed.len() {
            let end = (position + self.batch_size).min(self.fed.len());
            logits_index = self.decode(position, end)?;
            position = end;
        }
        let mut drafted = Vec::new();
        loop {
            let (token, prob) = self
                .context
                .with_dependent(|_, context| argmax_with_probability(context.logits(logits_index)));
            drafted.push(DraftedToken { token, prob });
            if drafted.len() == max_len || prob < p_min {
                return Ok(drafted);
            }
            logits_index = self.decode_drafted(token)?;
        }
    }

    /// Decodes `fed[start..end]` at their positions, with logits at the last; returns its batch
    /// index.
    fn decode(&mut self, start: usize, end: usize) -> Result<usize, EngineError> {
        let tokens = &self.fed[start..end];
        self.context
            .with_dependent_mut(|_, context| context.decode(tokens, start, Outputs::Last))
            .map_err(|e| decode_error(end - start, e))?;
        self.cached.extend(&self.fed[start..end]);
        Ok(end - start - 1)
    }

    /// Decodes one drafted token after the cached ones; returns its batch index.
    fn decode_drafted(&mut self, token: Token) -> Result<usize, EngineError> {
        let position = self.cached.len();
        self.context
            .with_dependent_mut(|_, context| context.decode(&[token], position, Outputs::Last))
            .map_err(|e| decode_error(1, e))?;
        self.cached.extend(&[token]);
        Ok(0)
    }

    /// Drops cache entries from position `keep` on.
    fn remove_from(&mut self, keep: usize) -> Result<(), EngineError> {
        if keep == self.cached.len() {
            return Ok(());
        }
        self.context
            .with_dependent_mut(|_, context| context.remove_from(keep))
            .map_err(|e| EngineError::Decode {
                n_tokens: 0,
                reason: format!("cannot roll the draft cache back to {keep} tokens: {e}"),
            })?;
        self.cached.truncate(keep);
        Ok(())
    }
}

impl DraftModel for DraftModelContext {
    fn reset(&mut self) {
        self.fed.clear();
        self.invalid_token = None;
        self.overflowed = false;
        // The cache is kept: a new request that starts like the last one (a shared system
        // prompt) reuses it, and `propose` trims what differs.
    }

    fn feed(&mut self, tokens: &[Token]) {
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
        let room = (self.ctx_size() as usize).saturating_sub(self.fed.len());
        if tokens.len() > room && !self.overflowed {
            tracing::warn!(
                ctx_size = self.ctx_size(),
                "more tokens fed to the draft model than its context holds; no proposals until the next reset"
            );
            self.overflowed = true;
        }
        self.fed
            .extend_from_slice(&tokens[..tokens.len().min(room)]);
    }

    fn propose(&mut self, max_len: usize, p_min: f32) -> Vec<DraftedToken> {
        if self.invalid_token.is_some() || self.overflowed {
            return Vec::new();
        }
        self.try_propose(max_len, p_min).unwrap_or_else(|error| {
            tracing::warn!(%error, "draft model failed to propose; its cache starts over");
            Vec::new()
        })
    }
}

fn decode_error(n_tokens: usize, reason: impl std::fmt::Display) -> EngineError {
    EngineError::Decode {
        n_tokens,
        reason: reason.to_string(),
    }
}

/// The tokens a draft context's KV cache holds, at positions `0..len`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct CachedPrefix {
    tokens: Vec<Token>,
}

impl CachedPrefix {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    /// How many leading tokens of `context` the cache already holds.
    fn common_prefix(&self, context: &[Token]) -> usize {
        self.tokens
            .iter()
            .zip(context)
            .take_while(|(cached, fed)| cached == fed)
            .count()
    }

    fn extend(&mut self, tokens: &[Token]) {
        self.tokens.extend_from_slice(tokens);
    }

    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    fn clear(&mut self) {
        self.tokens.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(tokens: &[Token]) -> CachedPrefix {
        CachedPrefix {
            tokens: tokens.to_vec(),
        }
    }

    #[test]
    fn accepted_drafts_are_reused_up_to_the_first_difference() {
        // Context 1 2 3, drafted 4 5 (6 was drafted last, so never decoded).
        let cache = cached(&[1, 2, 3, 4, 5]);
        assert_eq!(
            cache.common_prefix(&[1, 2, 3, 4, 9]),
            4,
            "one accepted, target said 9"
        );
        assert_eq!(
            cache.common_prefix(&[1, 2, 3, 4, 5, 6, 7]),
            5,
            "all accepted"
        );
        assert_eq!(
            cache.common_prefix(&[1, 2]),
            2,
            "a shorter context after a reset"
        );
        assert_eq!(cache.common_prefix(&[7, 2, 3]), 0, "a new request");
        assert_eq!(CachedPrefix::default().common_prefix(&[1]), 0);
    }
}
