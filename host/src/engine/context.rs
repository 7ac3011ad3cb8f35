//! A llama.cpp context of the target or the draft model, with the batch-invariant settings, and
//! checked at creation: a batch decodes bit for bit as its tokens one by one.
//!
//! The settings (flash attention over a Q8_0 KV cache, a full sliding-window cache) make every
//! query row of attention the same computation at any batch size; `docs/exactness.md` says why.
//! The matrix products of batches with Q8_0, Q5_0 or Q4_0 weights go to the host's batched kernel
//! (`engine::batch_backend`) when it is on. Its arithmetic is ggml's, checked by its unit tests
//! against ggml's single-row kernels; the check here proves it again on the real model: three
//! tokens decoded one at a time (llama.cpp's own kernels throughout) and as one batch must give
//! the same logits, bit for bit, or the host's products are turned off for the process and the
//! context is made again without them.

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;

#[cfg(target_arch = "x86_64")]
use super::kernels::backend as batch_backend;
use super::model::to_llama;
use crate::cascade::Token;

/// `LLAMA_FLASH_ATTN_TYPE_ENABLED` in llama.cpp's `llama_flash_attn_type`.
const FLASH_ATTENTION_ON: i32 = 1;
/// Tokens of the start-up check.
const CHECK_POSITIONS: usize = 3;
/// The one sequence a context decodes.
const SEQUENCE: i32 = 0;

/// Settings of a context.
pub(super) struct ContextSettings {
    /// Context size in tokens.
    pub(super) ctx_size: u32,
    /// Most tokens per decode (also llama.cpp's micro-batch).
    pub(super) batch_size: u32,
    /// Compute threads.
    pub(super) threads: usize,
}

/// Which positions of a decoded batch get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outputs {
    /// None (a prompt chunk before the last).
    None,
    /// The last position.
    Last,
    /// Every position (a verify batch).
    All,
}

impl Outputs {
    fn at(self, index: usize, n_tokens: usize) -> bool {
        match self {
            Self::None => false,
            Self::Last => index + 1 == n_tokens,
            Self::All => true,
        }
    }
}

/// A llama.cpp context of the target or the draft model, decoding one sequence.
pub(super) struct ModelContext<'m> {
    context: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    batch_capacity: usize,
    /// Matrix products of this context's decodes that the host's batched kernel computed.
    host_products: u64,
}

impl<'m> ModelContext<'m> {
    /// Creates the context: flash attention over a Q8_0 KV cache and a full sliding-window
    /// cache, as `docs/exactness.md` explains; then, when the host's batched products are on,
    /// checks that a batch decodes bit for bit as its tokens one by one.
    pub(super) fn new(
        backend: &LlamaBackend,
        model: &'m LlamaModel,
        settings: &ContextSettings,
    ) -> Result<Self, String> {
        let mut context = Self::create(backend, model, settings)?;
        if !batch_backend_enabled() {
            return Ok(context);
        }
        let checked = context.check_batches();
        context.clear();
        match checked {
            Ok(products) if products > 0 => tracing::info!(
                products,
                "batches: the host computes the Q8_0/Q5_0/Q4_0 matrix products (checked bit-exact against one-by-one decoding)"
            ),
            Ok(_) => tracing::debug!("batches: no Q8_0/Q5_0/Q4_0 matrix products for the host"),
            Err(reason) => {
                tracing::warn!(%reason, "batches: the host's batched matrix products differ from llama.cpp's; llama.cpp computes them from now on");
                disable_batch_backend();
                // This context's scheduler may have placed products on the host already.
                drop(context);
                return Self::create(backend, model, settings);
            }
        }
        Ok(context)
    }

    /// The context as llama.cpp makes it, before any check.
    fn create(
        backend: &LlamaBackend,
        model: &'m LlamaModel,
        settings: &ContextSettings,
    ) -> Result<Self, String> {
        let params = LlamaContextParams::default()
            .with_n_ctx(std::num::NonZeroU32::new(settings.ctx_size))
            .with_n_batch(settings.batch_size)
            .with_n_ubatch(settings.batch_size)
            .with_n_threads(settings.threads as i32)
            .with_n_threads_batch(settings.threads as i32)
            // A sliding-window cache forgets positions a rolled-back draft may still need; the
            // full cache keeps verification exact on models like Gemma 3.
            .with_swa_full(true)
            // Batch-invariant attention: flash attention over a Q8_0 cache computes every query
            // row the same way at any batch size (llama.cpp's other CPU attention paths do not).
            .with_flash_attention_policy(FLASH_ATTENTION_ON)
            .with_type_k(KvCacheType::Q8_0)
            .with_type_v(KvCacheType::Q8_0);
        let context = model
            .new_context(backend, params)
            .map_err(|e| e.to_string())?;
        // llama.cpp may adjust the requested sizes (it caps the batch at the context size).
        let batch_capacity = context.n_batch().max(1) as usize;
        Ok(Self {
            context,
            batch: LlamaBatch::new(batch_capacity, 1),
            batch_capacity,
            host_products: 0,
        })
    }

    /// Context size in tokens.
    pub(super) fn n_ctx(&self) -> u32 {
        self.context.n_ctx()
    }

    /// Most tokens one decode takes.
    pub(super) fn batch_capacity(&self) -> usize {
        self.batch_capacity
    }

    /// How many matrix products of this context's decodes the host's batched kernel computed
    /// (`engine::batch_backend`), the start-up check's included.
    pub(super) fn host_products(&self) -> u64 {
        self.host_products
    }

    /// Decodes `tokens` at positions `position..` in one batch, with logits at `outputs`.
    pub(super) fn decode(
        &mut self,
        tokens: &[Token],
        position: usize,
        outputs: Outputs,
    ) -> Result<(), String> {
        if tokens.is_empty() || tokens.len() > self.batch_capacity {
            return Err(format!(
                "a batch holds 1 to {} tokens, not {}",
                self.batch_capacity,
                tokens.len()
            ));
        }
        self.batch.clear();
        for (i, &token) in tokens.iter().enumerate() {
            self.batch
                .add(
                    to_llama(token),
                    (position + i) as i32,
                    &[SEQUENCE],
                    outputs.at(i, tokens.len()),
                )
                .map_err(|e| e.to_string())?;
        }
        let products_before = host_products_on_this_thread();
        let decoded = self.context.decode(&mut self.batch);
        self.host_products += host_products_on_this_thread() - products_before;
        decoded.map_err(|e| e.to_string())
    }

    /// The logits at batch index `index` of the last decode (a position that had logits).
    pub(super) fn logits(&self, index: usize) -> &[f32] {
        self.context.get_logits_ith(index as i32)
    }

    /// Removes positions `from..` of the sequence from the KV cache.
    pub(super) fn remove_from(&mut self, from: usize) -> Result<(), String> {
        let removed = u32::try_from(from)
            .map_err(|_| format!("position {from} is out of llama.cpp's range"))
            .and_then(|from| {
                self.context
                    .clear_kv_cache_seq(Some(SEQUENCE as u32), Some(from), None)
                    .map_err(|e| e.to_string())
            })?;
        removed
            .then_some(())
            .ok_or_else(|| format!("llama.cpp could not remove positions {from}.. from the cache"))
    }

    /// Empties the KV cache.
    pub(super) fn clear(&mut self) {
        self.context.clear_kv_cache();
    }

    /// Decodes the check's tokens one at a time (llama.cpp's single-row kernels throughout),
    /// then as one batch with every output, as verify batches decode, and compares the logits
    /// bit for bit. Returns how many products of the batch the host computed; a check that
    /// cannot run (a tiny context) proves nothing beyond the kernel's unit tests and passes.
    fn check_batches(&mut self) -> Result<u64, String> {
        let tokens: Vec<Token> = (0..CHECK_POSITIONS as Token).collect();
        let mut one_by_one = Vec::with_capacity(CHECK_POSITIONS);
        for (position, &token) in tokens.iter().enumerate() {
            if self.decode(&[token], position, Outputs::Last).is_err() {
                return Ok(0);
            }
            one_by_one.push(self.logits(0).to_vec());
        }
        self.clear();
        let products_before = self.host_products;
        if self.decode(&tokens, 0, Outputs::All).is_err() {
            return Ok(0);
        }
        for (index, single) in one_by_one.iter().enumerate() {
            let batch = self.logits(index);
            if let Some(token) =
                (0..batch.len()).find(|&t| batch[t].to_bits() != single[t].to_bits())
            {
                return Err(format!(
                    "position {index}, token {token}: batch {} vs one by one {}",
                    batch[token], single[token]
                ));
            }
        }
        Ok(self.host_products - products_before)
    }
}

#[cfg(target_arch = "x86_64")]
fn batch_backend_enabled() -> bool {
    batch_backend::enabled()
}

#[cfg(not(target_arch = "x86_64"))]
fn batch_backend_enabled() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn host_products_on_this_thread() -> u64 {
    batch_backend::computed_on_this_thread()
}

#[cfg(not(target_arch = "x86_64"))]
fn host_products_on_this_thread() -> u64 {
    0
}

#[cfg(target_arch = "x86_64")]
fn disable_batch_backend() {
    batch_backend::disable();
}

#[cfg(not(target_arch = "x86_64"))]
fn disable_batch_backend() {}
