//! A llama.cpp context of the target or the draft model, with the batch-invariant settings, and
//! the output layer of the target's verify batches computed by the host.
//!
//! llama.cpp, built batch-invariant, applies the output layer (hidden state → logits) with one
//! dot product per vocabulary row and position, so a verify batch of `n` tokens reads the
//! output weights `n` times; on Gemma 3 those are 63% of the model. When the output layer is a
//! plain Q8_0 matrix product, this context stops llama.cpp's graph at the final norm
//! (`result_norm`, through the scheduler's eval callback, which llama-cpp-2 does not expose, so
//! the context is made through llama.cpp's C API) and computes the logits of every position in
//! one pass over the weights with [`quant_matmul`](super::quant_matmul), bit for bit what
//! llama.cpp computes. Decodes with one output (plain decoding, prompts) run llama.cpp's graph
//! whole.
//!
//! The claim is checked, not assumed: at creation a three-token decode runs the whole graph
//! while the callback records what follows the final norm. The host takes over only when that
//! is exactly one Q8_0 matrix product into the logits, and its logits for the three positions
//! equal llama.cpp's bit for bit; otherwise (another weight type, logit soft-capping, a CPU
//! without AVX-512 VNNI) llama.cpp computes every logit, as before. `--llama-output-layer` turns
//! the host's output layer off.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;

use llama_cpp_2::context::params::KvCacheType;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_sys_2 as sys;

#[cfg(target_arch = "x86_64")]
use super::batch_backend;
#[cfg(target_arch = "x86_64")]
use super::quant_matmul::{self, BlockQ8_0, QuantMatrix};
use crate::cascade::Token;

/// The node llama.cpp names the final, normed hidden state in every architecture's graph.
const FINAL_NORM: &CStr = c"result_norm";
/// The node llama.cpp names the logits.
const LOGITS: &CStr = c"result_output";
/// `LLAMA_FLASH_ATTN_TYPE_ENABLED` in llama.cpp's `llama_flash_attn_type`.
const FLASH_ATTENTION_ON: i32 = 1;
/// Positions of the start-up check of the host's output layer.
const CHECK_POSITIONS: usize = 3;

/// Settings of a context.
pub(super) struct ContextSettings {
    /// Context size in tokens.
    pub(super) ctx_size: u32,
    /// Most tokens per decode (also llama.cpp's micro-batch).
    pub(super) batch_size: u32,
    /// Compute threads, for llama.cpp and for the host's output layer.
    pub(super) threads: usize,
    /// Whether the host may compute the output layer (`--llama-output-layer` says no).
    pub(super) host_output_layer: bool,
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

    fn count(self, n_tokens: usize) -> usize {
        match self {
            Self::None => 0,
            Self::Last => 1,
            Self::All => n_tokens,
        }
    }
}

/// A llama.cpp context of the target or the draft model, decoding one sequence.
pub(super) struct ModelContext<'m> {
    raw: NonNull<sys::llama_context>,
    batch: sys::llama_batch,
    batch_capacity: usize,
    /// Written by the eval callback during `llama_decode`, read by the context between decodes;
    /// allocated here and freed in `Drop`, after the context.
    capture: NonNull<Capture>,
    /// The output weights, when the host computes the logits of decodes with several outputs.
    output_layer: Option<HostOutputLayer<'m>>,
    /// Where the last decode's logits are.
    last: LastDecode,
    /// Logits computed by the host for the last decode, a row of `n_vocab` per output.
    host_logits: Vec<f32>,
    /// Matrix products of this context's decodes that the host's batched kernel computed.
    host_products: u64,
    n_vocab: usize,
    threads: usize,
    _model: PhantomData<&'m LlamaModel>,
}

// SAFETY: a llama.cpp context is not tied to the thread that made it (llama-cpp-2's
// `LlamaContext` is `Send` for the same reason); the callback's capture is only touched by the
// thread that calls `llama_decode`, which holds `&mut self`.
unsafe impl Send for ModelContext<'_> {}

/// The last decode: which positions have logits, and where they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LastDecode {
    outputs: Outputs,
    n_tokens: usize,
    /// Whether the host computed the logits (from the captured final-norm rows).
    by_host: bool,
}

impl LastDecode {
    /// The logits row of batch index `index`.
    fn row(&self, index: usize) -> usize {
        assert!(
            index < self.n_tokens && self.outputs.at(index, self.n_tokens),
            "position {index} of the last decode has no logits"
        );
        match self.outputs {
            Outputs::All => index,
            Outputs::Last | Outputs::None => 0,
        }
    }
}

impl<'m> ModelContext<'m> {
    /// Creates the context: flash attention over a Q8_0 KV cache and a full sliding-window
    /// cache, as `docs/exactness.md` explains; then checks that batches decode bit for bit as
    /// their tokens one by one with the host's kernels, and whether the host can compute the
    /// output layer of decodes with several outputs.
    pub(super) fn new(model: &'m LlamaModel, settings: &ContextSettings) -> Result<Self, String> {
        let mut context = Self::create(model, settings)?;
        let checked = context.check_batches(settings.host_output_layer);
        context.clear();
        if let Err(reason) = checked.products {
            tracing::warn!(%reason, "batches: spechost's batched matrix products differ from llama.cpp's; llama.cpp computes them from now on");
            disable_batch_backend();
            // The context's graphs may already hold products placed on the backend.
            drop(context);
            return Self::new(model, settings);
        }
        context.output_layer = match checked.output_layer {
            Ok(layer) => {
                tracing::info!(
                    vocab = context.n_vocab,
                    "verify batches: the host computes the Q8_0 output layer (checked bit-exact against llama.cpp)"
                );
                Some(layer)
            }
            Err(reason) => {
                tracing::info!(%reason, "verify batches: llama.cpp computes the output layer");
                None
            }
        };
        Ok(context)
    }

    /// The context as llama.cpp makes it, before any check.
    fn create(model: &'m LlamaModel, settings: &ContextSettings) -> Result<Self, String> {
        let capture = NonNull::from(Box::leak(Box::new(Capture::default())));
        // SAFETY: llama.cpp fills in its defaults.
        let mut params = unsafe { sys::llama_context_default_params() };
        params.n_ctx = settings.ctx_size;
        params.n_batch = settings.batch_size;
        params.n_ubatch = settings.batch_size;
        params.n_threads = settings.threads as i32;
        params.n_threads_batch = settings.threads as i32;
        // A sliding-window cache forgets positions a rolled-back draft may still need; the full
        // cache keeps verification exact on models like Gemma 3.
        params.swa_full = true;
        // Batch-invariant attention: flash attention over a Q8_0 cache computes every query row
        // the same way at any batch size (llama.cpp's other CPU attention paths do not).
        params.flash_attn_type = FLASH_ATTENTION_ON;
        params.type_k = KvCacheType::Q8_0.into();
        params.type_v = KvCacheType::Q8_0.into();
        params.cb_eval = Some(observe_node);
        params.cb_eval_user_data = capture.as_ptr().cast::<c_void>();
        // SAFETY: the model outlives 'm and so the context; the callback's data outlives the
        // context (freed after it in `Drop`).
        let raw = unsafe { sys::llama_init_from_model(raw_model(model), params) };
        let Some(raw) = NonNull::new(raw) else {
            // SAFETY: allocated above by `Box::leak`; llama.cpp kept no context to call back.
            drop(unsafe { Box::from_raw(capture.as_ptr()) });
            return Err("llama.cpp could not create the context".into());
        };
        // SAFETY: `raw` is a live context.
        let batch_capacity = unsafe { sys::llama_n_batch(raw.as_ptr()) }.max(1) as usize;
        // SAFETY: a batch of token ids (no embeddings), one sequence id per token.
        let batch = unsafe { sys::llama_batch_init(batch_capacity as i32, 0, 1) };
        Ok(Self {
            raw,
            batch,
            batch_capacity,
            capture,
            output_layer: None,
            last: LastDecode {
                outputs: Outputs::None,
                n_tokens: 0,
                by_host: false,
            },
            host_logits: Vec::new(),
            host_products: 0,
            n_vocab: model.n_vocab().max(0) as usize,
            threads: settings.threads.max(1),
            _model: PhantomData,
        })
    }

    /// Context size in tokens.
    pub(super) fn n_ctx(&self) -> u32 {
        // SAFETY: `raw` is a live context.
        unsafe { sys::llama_n_ctx(self.raw.as_ptr()) }
    }

    /// Most tokens one decode takes.
    pub(super) fn batch_capacity(&self) -> usize {
        self.batch_capacity
    }

    /// Whether the host computes the logits of decodes with several outputs.
    pub(super) fn host_output_layer(&self) -> bool {
        self.output_layer.is_some()
    }

    /// How many matrix products of this context's decodes the host's batched kernel computed
    /// (`engine::batch_backend`), the start-up check's included.
    pub(super) fn host_products(&self) -> u64 {
        self.host_products
    }

    /// Decodes `tokens` at positions `position..` in one batch, with logits at `outputs`.
    /// With several outputs and the host's output layer, llama.cpp's graph stops at the final
    /// norm and the host computes the logits.
    pub(super) fn decode(
        &mut self,
        tokens: &[Token],
        position: usize,
        outputs: Outputs,
    ) -> Result<(), String> {
        let n_outputs = outputs.count(tokens.len());
        let mode = if self.output_layer.is_some() && n_outputs >= 2 {
            Mode::Intercept
        } else {
            Mode::Pass
        };
        self.run(tokens, position, outputs, mode)?;
        let capture = self.capture();
        let by_host = mode == Mode::Intercept && !capture.finished_graph;
        if by_host && capture.rows() != n_outputs {
            return Err(format!(
                "the final norm gave {} rows for {n_outputs} outputs",
                capture.rows()
            ));
        }
        if by_host {
            self.compute_host_logits();
        }
        self.last = LastDecode {
            outputs,
            n_tokens: tokens.len(),
            by_host,
        };
        Ok(())
    }

    /// The logits at batch index `index` of the last decode (a position that had logits).
    pub(super) fn logits(&self, index: usize) -> &[f32] {
        let row = self.last.row(index);
        if self.last.by_host {
            &self.host_logits[row * self.n_vocab..(row + 1) * self.n_vocab]
        } else {
            self.llama_logits(index)
        }
    }

    /// Removes positions `from..` of the sequence from the KV cache.
    pub(super) fn remove_from(&mut self, from: usize) -> Result<(), String> {
        // SAFETY: `raw` is a live context; its memory lives as long as it.
        let removed = unsafe {
            sys::llama_memory_seq_rm(sys::llama_get_memory(self.raw.as_ptr()), 0, from as i32, -1)
        };
        removed
            .then_some(())
            .ok_or_else(|| format!("llama.cpp could not remove positions {from}.. from the cache"))
    }

    /// Empties the KV cache.
    pub(super) fn clear(&mut self) {
        // SAFETY: as in `remove_from`.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.raw.as_ptr()), true) };
    }

    fn capture(&mut self) -> &mut Capture {
        // SAFETY: allocated in `new`, freed in `Drop`; the callback, its only other user, runs
        // only inside `llama_decode`, which `run` calls with `&mut self` and no live borrow.
        unsafe { self.capture.as_mut() }
    }

    /// One `llama_decode` with the callback in `mode`.
    fn run(
        &mut self,
        tokens: &[Token],
        position: usize,
        outputs: Outputs,
        mode: Mode,
    ) -> Result<(), String> {
        if tokens.is_empty() || tokens.len() > self.batch_capacity {
            return Err(format!(
                "a batch holds 1 to {} tokens, not {}",
                self.batch_capacity,
                tokens.len()
            ));
        }
        self.fill_batch(tokens, position, outputs);
        self.capture().begin(mode);
        let products_before = host_products_on_this_thread();
        // SAFETY: `raw` is live and `batch` holds `n_tokens` initialised entries.
        let status = unsafe { sys::llama_decode(self.raw.as_ptr(), self.batch) };
        self.host_products += host_products_on_this_thread() - products_before;
        self.capture().mode = Mode::Pass;
        match status {
            0 => Ok(()),
            1 => Err("no room in the KV cache for the batch (raise --ctx-size)".into()),
            2 => Err("llama.cpp aborted the decode".into()),
            other => Err(format!("llama_decode failed with status {other}")),
        }
    }

    fn fill_batch(&mut self, tokens: &[Token], position: usize, outputs: Outputs) {
        let batch = &mut self.batch;
        batch.n_tokens = tokens.len() as i32;
        for (i, &token) in tokens.iter().enumerate() {
            let output = outputs.at(i, tokens.len());
            // SAFETY: `llama_batch_init` allocated `batch_capacity >= tokens.len()` entries of
            // each array and one sequence id per entry.
            unsafe {
                *batch.token.add(i) = token as i32;
                *batch.pos.add(i) = (position + i) as i32;
                *batch.n_seq_id.add(i) = 1;
                **batch.seq_id.add(i) = 0;
                *batch.logits.add(i) = i8::from(output);
            }
        }
    }

    fn llama_logits(&self, index: usize) -> &[f32] {
        // SAFETY: `index` had logits in the last decode (llama.cpp aborts otherwise); the row
        // holds `n_vocab` floats and stays until the next decode, which needs `&mut self`.
        unsafe {
            let logits = sys::llama_get_logits_ith(self.raw.as_ptr(), index as i32);
            std::slice::from_raw_parts(logits, self.n_vocab)
        }
    }

    fn compute_host_logits(&mut self) {
        let Some(layer) = self.output_layer else {
            unreachable!("host logits without the host's output layer");
        };
        let (threads, n_vocab) = (self.threads, self.n_vocab);
        let needed = self.capture().rows() * n_vocab;
        let mut logits = std::mem::take(&mut self.host_logits);
        // The buffer only grows: zero-filling a megabyte per row for every larger batch than the
        // last would cost a millisecond or two a round; rows past `needed` are never read.
        if logits.len() < needed {
            logits.resize(needed, 0.0);
        }
        layer.compute(&self.capture().hidden, &mut logits[..needed], threads);
        self.host_logits = logits;
    }

    /// Decodes the check's tokens one by one (llama.cpp's single-row kernels throughout), then
    /// as one batch with every output, as verify batches decode, and compares the logits bit for
    /// bit: those llama.cpp computes for the batch (with the host's batched matrix products, when
    /// they are on) and those the host's output layer would compute (if allowed, and the graph
    /// after the final norm is a plain Q8_0 product).
    fn check_batches(&mut self, allow_output_layer: bool) -> BatchCheck<'m> {
        let products_on = batch_backend_enabled();
        if !products_on && !allow_output_layer {
            return BatchCheck {
                products: Ok(()),
                output_layer: Err("--llama-output-layer".into()),
            };
        }
        let reference = match self.decode_one_by_one() {
            Ok(reference) => reference,
            // A check that cannot run proves nothing against the kernels' unit tests.
            Err(reason) => {
                return BatchCheck {
                    products: Ok(()),
                    output_layer: Err(format!("the check could not run: {reason}")),
                };
            }
        };
        let tokens: Vec<Token> = (0..CHECK_POSITIONS as Token).collect();
        if let Err(reason) = self.run(&tokens, 0, Outputs::All, Mode::Inspect) {
            return BatchCheck {
                products: Ok(()),
                output_layer: Err(format!("the check could not run: {reason}")),
            };
        }
        let n_vocab = self.n_vocab;
        let products = if products_on {
            (0..CHECK_POSITIONS).try_for_each(|index| {
                let batch = self.llama_logits(index);
                same_logits(
                    index,
                    batch,
                    &reference[index * n_vocab..(index + 1) * n_vocab],
                )
            })
        } else {
            Ok(())
        };
        let output_layer = if allow_output_layer {
            self.check_output_layer(&reference)
        } else {
            Err("--llama-output-layer".into())
        };
        BatchCheck {
            products,
            output_layer,
        }
    }

    /// The logits of the check's tokens decoded one at a time, a row of `n_vocab` per token.
    fn decode_one_by_one(&mut self) -> Result<Vec<f32>, String> {
        if self.n_vocab < CHECK_POSITIONS {
            return Err("vocabulary too small to check".into());
        }
        let mut logits = Vec::with_capacity(CHECK_POSITIONS * self.n_vocab);
        for position in 0..CHECK_POSITIONS {
            self.run(&[position as Token], position, Outputs::Last, Mode::Pass)?;
            logits.extend_from_slice(self.llama_logits(0));
        }
        self.clear();
        Ok(logits)
    }

    /// The host's output layer after the check's batch, if the graph allows it and its logits
    /// equal the one-by-one `reference`.
    fn check_output_layer(&mut self, reference: &[f32]) -> Result<HostOutputLayer<'m>, String> {
        if !HostOutputLayer::available() {
            return Err("this CPU lacks AVX-512 VNNI".into());
        }
        let n_vocab = self.n_vocab;
        let layer = self.capture().output_layer(n_vocab)?;
        let threads = self.threads;
        let mut logits = vec![0.0; CHECK_POSITIONS * n_vocab];
        layer.compute(&self.capture().hidden, &mut logits, threads);
        for (index, (host, reference)) in logits
            .chunks_exact(n_vocab)
            .zip(reference.chunks_exact(n_vocab))
            .enumerate()
        {
            same_logits(index, host, reference)?;
        }
        Ok(layer)
    }
}

/// What [`ModelContext::check_batches`] found.
struct BatchCheck<'m> {
    /// Whether llama.cpp's batch, with the host's batched matrix products, matched.
    products: Result<(), String>,
    /// The host's output layer, or why not.
    output_layer: Result<HostOutputLayer<'m>, String>,
}

/// `Ok` when the two rows of logits of batch index `index` are the same bits.
fn same_logits(index: usize, batch: &[f32], one_by_one: &[f32]) -> Result<(), String> {
    match (0..batch.len()).find(|&t| batch[t].to_bits() != one_by_one[t].to_bits()) {
        None => Ok(()),
        Some(token) => Err(format!(
            "position {index}, token {token}: batch {} vs one by one {}",
            batch[token], one_by_one[token]
        )),
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

impl Drop for ModelContext<'_> {
    fn drop(&mut self) {
        // SAFETY: both were made in `new` and are freed once; the context goes before the
        // capture its callback writes to.
        unsafe {
            sys::llama_batch_free(self.batch);
            sys::llama_free(self.raw.as_ptr());
            drop(Box::from_raw(self.capture.as_ptr()));
        }
    }
}

/// llama-cpp-2 keeps the model's pointer private; `llama_init_from_model` needs it.
fn raw_model(model: &LlamaModel) -> *mut sys::llama_model {
    const _: () = assert!(size_of::<LlamaModel>() == size_of::<*mut sys::llama_model>());
    // SAFETY: `LlamaModel` is `#[repr(transparent)]` over `Ptr<llama_model>`, itself
    // `#[repr(transparent)]` over `NonNull<llama_model>` (llama-cpp-2 0.1.160, pinned in the
    // workspace), so its bytes are the pointer.
    unsafe { *std::ptr::from_ref(model).cast::<*mut sys::llama_model>() }
}

/// What the eval callback does in one decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Mode {
    /// Nothing: llama.cpp runs its whole graph.
    #[default]
    Pass,
    /// Copy the final norm's rows and stop the graph there.
    Intercept,
    /// Copy the final norm's rows, run the whole graph and note the nodes after the norm.
    Inspect,
}

/// The eval callback's state.
#[derive(Default)]
struct Capture {
    mode: Mode,
    /// The final norm's rows seen in this decode, `width` floats each.
    hidden: Vec<f32>,
    width: usize,
    /// Whether the graph ran to its end (no interception, or the norm could not be copied).
    finished_graph: bool,
    /// Inspect: the final norm, once computed, and the nodes computed after it.
    norm: Option<NonNull<sys::ggml_tensor>>,
    after_norm: Vec<NonNull<sys::ggml_tensor>>,
}

impl Capture {
    fn begin(&mut self, mode: Mode) {
        self.mode = mode;
        self.hidden.clear();
        self.finished_graph = true;
        self.norm = None;
        self.after_norm.clear();
    }

    fn rows(&self) -> usize {
        self.hidden.len().checked_div(self.width).unwrap_or(0)
    }

    /// The scheduler asks (`ask`) whether the node's data is wanted, then hands over a wanted
    /// node once computed; returning `false` then ends the graph.
    fn observe(&mut self, node: &sys::ggml_tensor, ask: bool) -> bool {
        if self.mode == Mode::Pass {
            return !ask;
        }
        if ask {
            if self.norm.is_some() {
                self.after_norm.push(NonNull::from(node));
            }
            return name(node) == FINAL_NORM;
        }
        let copied = self.copy_rows(node);
        match self.mode {
            Mode::Intercept if copied => {
                self.finished_graph = false;
                false
            }
            _ => {
                self.norm = Some(NonNull::from(node));
                true
            }
        }
    }

    /// Appends the rows of the final norm, if they are contiguous `f32` rows in host memory.
    fn copy_rows(&mut self, node: &sys::ggml_tensor) -> bool {
        let width = node.ne[0] as usize;
        let rows = node.ne[1] as usize;
        let plain = node.type_ == sys::GGML_TYPE_F32
            && node.ne[2] == 1
            && node.ne[3] == 1
            && node.nb[0] == size_of::<f32>()
            && node.nb[1] == width * size_of::<f32>()
            && !node.data.is_null()
            // SAFETY: a computed node has a buffer.
            && unsafe { sys::ggml_backend_buffer_is_host(node.buffer) }
            && (self.width == 0 || self.width == width);
        if !plain {
            return false;
        }
        self.width = width;
        // SAFETY: checked above: `rows` contiguous rows of `width` floats in host memory.
        let data = unsafe { std::slice::from_raw_parts(node.data.cast::<f32>(), width * rows) };
        self.hidden.extend_from_slice(data);
        true
    }

    /// The host's output layer, if the graph after the final norm is exactly one Q8_0 matrix
    /// product of `n_vocab` rows, named as the logits; else what differs.
    fn output_layer<'m>(&self, n_vocab: usize) -> Result<HostOutputLayer<'m>, String> {
        let norm = self.norm.ok_or("no `result_norm` node in the graph")?;
        let [product] = self.after_norm.as_slice() else {
            return Err(format!(
                "{} nodes follow the final norm, not one matrix product",
                self.after_norm.len()
            ));
        };
        // SAFETY: the graph's nodes live until the next decode; none has run since.
        let product = unsafe { product.as_ref() };
        if product.op != sys::GGML_OP_MUL_MAT || name(product) != LOGITS {
            return Err("the node after the final norm is not the logits' matrix product".into());
        }
        if product.src[1] != norm.as_ptr() || product.src[0].is_null() {
            return Err("the logits' matrix product does not take the final norm".into());
        }
        // SAFETY: a source of a live node.
        let weights = unsafe { &*product.src[0] };
        HostOutputLayer::from_weights(weights, self.width, n_vocab)
    }
}

/// The scheduler's eval callback; `user_data` is the context's [`Capture`].
unsafe extern "C" fn observe_node(
    node: *mut sys::ggml_tensor,
    ask: bool,
    user_data: *mut c_void,
) -> bool {
    // SAFETY: llama.cpp passes the pointer given at creation, and calls back only inside
    // `llama_decode` on the calling thread, while the context holds no other borrow of it.
    let capture = unsafe { &mut *user_data.cast::<Capture>() };
    // SAFETY: a node of the graph being computed.
    let Some(node) = (unsafe { node.as_ref() }) else {
        return !ask;
    };
    // A panic must not unwind into C++; "no data wanted, go on" is always safe.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| capture.observe(node, ask)))
        .unwrap_or(!ask)
}

/// A node's name.
fn name(node: &sys::ggml_tensor) -> &CStr {
    // SAFETY: ggml keeps names NUL-terminated within the array.
    unsafe { CStr::from_ptr(node.name.as_ptr()) }
}

/// The output weights, when the host computes them.
#[derive(Clone, Copy)]
struct HostOutputLayer<'m> {
    #[cfg(target_arch = "x86_64")]
    matrix: QuantMatrix<'m, BlockQ8_0>,
    #[cfg(not(target_arch = "x86_64"))]
    _model: PhantomData<&'m ()>,
}

#[cfg(target_arch = "x86_64")]
impl<'m> HostOutputLayer<'m> {
    fn available() -> bool {
        quant_matmul::kernel_available()
    }

    fn from_weights(
        weights: &sys::ggml_tensor,
        width: usize,
        n_vocab: usize,
    ) -> Result<Self, String> {
        let rows = weights.ne[1] as usize;
        let columns = weights.ne[0] as usize;
        let row_bytes = columns / quant_matmul::BLOCK * size_of::<BlockQ8_0>();
        let plain = weights.type_ == sys::GGML_TYPE_Q8_0
            && columns == width
            && rows == n_vocab
            && columns.is_multiple_of(quant_matmul::BLOCK)
            && weights.ne[2] == 1
            && weights.ne[3] == 1
            && weights.nb[1] == row_bytes
            && !weights.data.is_null()
            // SAFETY: a model tensor has a buffer.
            && unsafe { sys::ggml_backend_buffer_is_host(weights.buffer) };
        if !plain {
            return Err(format!(
                "the output weights are not a plain Q8_0 matrix of {n_vocab} x {width} in host memory (ggml type {})",
                weights.type_
            ));
        }
        // SAFETY: checked above: `rows` contiguous rows of Q8_0 blocks in host memory, which
        // the model owns for 'm; ggml aligns tensor data beyond `BlockQ8_0`'s 2 bytes.
        let blocks = unsafe {
            std::slice::from_raw_parts(
                weights.data.cast::<BlockQ8_0>(),
                rows * columns / quant_matmul::BLOCK,
            )
        };
        Ok(Self {
            matrix: QuantMatrix::new(blocks, rows, columns),
        })
    }

    fn compute(&self, hidden: &[f32], logits: &mut [f32], threads: usize) {
        let width = self.matrix.columns();
        let inputs: Vec<&[f32]> = hidden.chunks_exact(width).collect();
        let mut outputs: Vec<&mut [f32]> = logits.chunks_exact_mut(self.matrix.rows()).collect();
        quant_matmul::multiply(&self.matrix, &inputs, &mut outputs, threads);
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl<'m> HostOutputLayer<'m> {
    fn available() -> bool {
        false
    }

    fn from_weights(_: &sys::ggml_tensor, _: usize, _: usize) -> Result<Self, String> {
        Err("the host's output layer is written for x86-64".into())
    }

    fn compute(&self, _: &[f32], _: &mut [f32], _: usize) {
        unreachable!("never chosen off x86-64")
    }
}
