//! [`DraftModelHost`]: the loaded draft model, which opens contexts on it, and the check that it
//! shares the target's tokenizer.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use llama_cpp_2::model::LlamaModel;

use super::batch::DraftBatch;
use super::context::DraftModelContext;
use crate::cascade::{DraftModel, DraftModelFactory};
use crate::engine::context::{ContextSettings, ModelContext};
use crate::engine::error::EngineError;
use crate::engine::model::{Target, TargetParams, check_gguf, started_backend};
use crate::engine::overrides::ModelOverrides;
use crate::engine::verify::DEFAULT_BATCH_SIZE;
use crate::engine::vocab::VocabFingerprint;

/// Rows of the start-up check of a draft context's batches: its batches are prompt catch-ups,
/// whose exactness does not matter (the target verifies every drafted token); the check decides
/// only whether the host's products are used.
const DRAFT_CHECK_ROWS: usize = 3;

/// Where the draft model comes from and how its contexts are sized.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftModelConfig {
    /// The draft GGUF.
    pub path: PathBuf,
    /// Context size of each draft context, in tokens (the target's, so a draft context holds
    /// every context the target can verify).
    pub ctx_size: u32,
    /// Compute threads of each draft context (the target's by default: the two models never
    /// run at the same time).
    pub threads: usize,
    /// Metadata overrides of the draft model (`--draft-override-kv`, `--draft-experts`).
    pub overrides: ModelOverrides,
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
        let model = loading.load_model(started_backend()?, path, &config.overrides)?;
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

    /// Context size of each of its contexts, in tokens.
    pub fn ctx_size(&self) -> u32 {
        self.config.ctx_size
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> u32 {
        self.model.n_vocab().max(0) as u32
    }

    /// A fresh, empty context, as [`DraftModelFactory::open`] but with the engine's error.
    pub fn open_context(&self) -> Result<DraftModelContext, EngineError> {
        let batch = self.open_batch(1)?;
        Ok(DraftModelContext::new(batch, self.vocab_size()))
    }

    /// A fresh, empty context of `sequences` sequences (a server's, drafting for several plugin
    /// instances at once), each of the configured context size.
    pub fn open_batch(&self, sequences: usize) -> Result<DraftBatch, EngineError> {
        let ctx_size = self.config.ctx_size;
        let context_error = |reason: String| EngineError::Context { ctx_size, reason };
        if ctx_size == 0 {
            return Err(context_error(
                "the draft context needs at least 1 token".into(),
            ));
        }
        let settings = ContextSettings {
            ctx_size,
            // The prompt is fed in batches of this many tokens; the target's batch size is the
            // right trade of memory for speed.
            batch_size: DEFAULT_BATCH_SIZE.min(ctx_size),
            threads: self.config.threads.max(1),
            sequences: u32::try_from(sequences.max(1)).unwrap_or(u32::MAX),
            check_rows: DRAFT_CHECK_ROWS,
            tree_leaves: 1,
        };
        let backend = started_backend()?;
        let context = {
            let _one_at_a_time = self.opening.lock().unwrap_or_else(|e| e.into_inner());
            OwnedContext::try_new(Arc::clone(&self.model), |model| {
                ModelContext::new(backend, model, &settings)
            })
            .map_err(context_error)?
        };
        Ok(DraftBatch::new(context))
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
    pub(super) struct OwnedContext {
        owner: Arc<LlamaModel>,
        #[covariant]
        dependent: BorrowedContext,
    }
);
