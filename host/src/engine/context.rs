//! A llama.cpp context of the target or the draft model, with the batch-invariant settings, and
//! checked at creation: a batch decodes bit for bit as its tokens one by one.
//!
//! The settings (flash attention over a Q8_0 KV cache, a full sliding-window cache) make every
//! query row of attention the same computation at any batch size; `docs/exactness.md` says why.
//! A context holds one or several sequences ([`SeqId`]), each in a KV stream of its own
//! (llama.cpp's `kv_unified = false`): a sequence's cells hold exactly its positions, in order,
//! whatever the other sequences do, so its attention is computed as in a context of its own,
//! and one decode may hold rows of every sequence.
//!
//! A context of one sequence may instead take tree drafts ([`ContextSettings::tree_leaves`]):
//! its cells are one unified stream shared by the sequence and, during a tree's decode, one
//! sequence per further path of the tree (`tree.rs`), so that a row attends to the context and
//! its own ancestors only. Its cells still hold its positions in order: a tree's rows are
//! decoded after every cell it keeps, and only a leading chain of them is kept.
//!
//! The matrix products of batches with Q8_0, Q5_0, Q4_0, Q4_1, Q4_K or Q6_K weights go to the
//! host's batched kernels (`engine::kernels`) when they are on (and, on CPUs with AVX-512 VNNI,
//! the single rows of Q8_0, Q5_0 and Q4_0 products too). Their arithmetic is ggml's, checked by
//! their unit tests against ggml's single-row kernels; the check here proves on the real model
//! that a row's logits do not depend on its batch, for the batch shapes the context will
//! decode: the rows of a largest verify batch of one sequence and, with several sequences,
//! beside them rows of sequences with other lengths and other contexts, decoded one at a time
//! (as plain decoding decodes them) and then as one batch, must give the same logits, bit for
//! bit, or the host's products are
//! turned off for the process and the context is made again without them (then the check runs
//! once more, on llama.cpp's kernels alone, and a difference there is logged as a warning:
//! output may then differ from plain decoding near ties).

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;

#[cfg(target_arch = "x86_64")]
use super::kernels::backend as batch_backend;
use super::model::to_llama;
use super::recurrent::{RollbackPlan, Rollbacks};
use crate::cascade::Token;

mod tree;

pub(super) use self::tree::{TreeRow, tree_rows};

/// `LLAMA_FLASH_ATTN_TYPE_ENABLED` in llama.cpp's `llama_flash_attn_type`.
const FLASH_ATTENTION_ON: i32 = 1;
/// Tokens of the start-up check beside the longest sequence's: a second sequence's rows and
/// the context they follow (so rows of different lengths and contexts share the batch).
const CHECK_SECOND_ROWS: usize = 3;
/// Context of the check's second sequence before its rows.
const CHECK_SECOND_CONTEXT: usize = 5;

/// One sequence of a context: a request's place in its KV cache, a stream of cells of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u32);

impl SeqId {
    /// The sequence of a context that decodes one request at a time.
    pub const FIRST: SeqId = SeqId(0);

    fn llama(self) -> i32 {
        self.0 as i32
    }
}

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Settings of a context.
pub(super) struct ContextSettings {
    /// Context size of each sequence, in tokens.
    pub(super) ctx_size: u32,
    /// Most tokens per decode (also llama.cpp's micro-batch).
    pub(super) batch_size: u32,
    /// Compute threads.
    pub(super) threads: usize,
    /// Sequences the context holds, each with `ctx_size` tokens of KV cache.
    pub(super) sequences: u32,
    /// Rows of the longest batch of one sequence the start-up check decodes (the largest
    /// verify batch), cut to the batch and context sizes.
    pub(super) check_rows: usize,
    /// Most paths of a tree draft a context of one sequence decodes (1: chains only); a context
    /// of several sequences or of a recurrent model takes chains only.
    pub(super) tree_leaves: u32,
}

/// Tokens of one sequence in a decode: at positions `position..`, with logits at `outputs`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rows<'t> {
    /// Whose tokens they are.
    pub(super) seq: SeqId,
    /// The tokens, in order.
    pub(super) tokens: &'t [Token],
    /// Position of the first.
    pub(super) position: usize,
    /// Which of them get logits.
    pub(super) outputs: Outputs,
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

/// A llama.cpp context of the target or the draft model, decoding one or several sequences.
pub(super) struct ModelContext<'m> {
    context: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    batch_capacity: usize,
    sequences: u32,
    /// KV streams llama.cpp holds: one per sequence and as many spares for a recurrent model,
    /// or one for a context that takes trees.
    streams: u32,
    /// Most paths of a tree this context decodes: as many llama.cpp sequences share its one
    /// stream. 1: chains only.
    tree_leaves: u32,
    /// For a recurrent or hybrid model: the states saved to roll sequences back (see
    /// `recurrent.rs`); each sequence `s` saves into spare sequence `s + sequences`.
    rollbacks: Option<Rollbacks>,
    /// Rows of the check's longest sequence (see [`ContextSettings::check_rows`]).
    check_rows: usize,
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
        let checked = context.check_batch_invariance();
        match checked {
            Ok(products) if products > 0 => tracing::info!(
                products,
                rows = settings.check_rows,
                sequences = settings.sequences,
                "batches: the host computes the Q8_0/Q5_0/Q4_0/Q4_1/Q4_K/Q6_K matrix products (checked bit-exact against one-by-one decoding)"
            ),
            Ok(_) => tracing::debug!(
                rows = settings.check_rows,
                sequences = settings.sequences,
                "batches: llama.cpp computes every matrix product (checked bit-exact against one-by-one decoding)"
            ),
            Err(reason) if batch_backend_enabled() => {
                tracing::warn!(%reason, "batches: the host's batched matrix products differ from llama.cpp's; llama.cpp computes them from now on");
                disable_batch_backend();
                // This context's scheduler may have placed products on the host already.
                drop(context);
                let mut context = Self::create(backend, model, settings)?;
                if let Err(reason) = context.check_batch_invariance() {
                    warn_not_batch_invariant(&reason);
                }
                return Ok(context);
            }
            Err(reason) => warn_not_batch_invariant(&reason),
        }
        Ok(context)
    }

    /// The context as llama.cpp makes it, before any check.
    fn create(
        backend: &LlamaBackend,
        model: &'m LlamaModel,
        settings: &ContextSettings,
    ) -> Result<Self, String> {
        let sequences = settings.sequences.max(1);
        let recurrent = model.is_recurrent() || model.is_hybrid();
        let tree_leaves = if sequences == 1 && !recurrent {
            settings.tree_leaves.max(1)
        } else {
            1
        };
        let streams = match (recurrent, tree_leaves > 1) {
            (true, _) => 2 * sequences,
            (false, true) => 1,
            (false, false) => sequences,
        };
        let params = LlamaContextParams::default()
            .with_n_ctx(std::num::NonZeroU32::new(
                settings.ctx_size.saturating_mul(streams),
            ))
            .with_n_seq_max(streams.max(tree_leaves))
            // Each sequence in a stream of cells of its own: its positions stay in order
            // in its cells whatever the others decode and roll back, so its attention sums
            // over the same cells in the same order as in a context of its own. A tree's
            // paths share the one sequence's stream (see the module docs).
            .with_kv_unified(tree_leaves > 1)
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
            batch: LlamaBatch::new(batch_capacity, tree_leaves as i32),
            batch_capacity,
            sequences,
            streams,
            tree_leaves,
            rollbacks: recurrent.then(|| Rollbacks::new(sequences as usize)),
            check_rows: settings.check_rows,
            host_products: 0,
        })
    }

    /// Context size of each sequence, in tokens.
    pub(super) fn n_ctx(&self) -> u32 {
        // llama.cpp rounds each sequence's share up and the total to the shares' sum.
        self.context.n_ctx() / self.streams
    }

    /// Sequences the context holds.
    pub(super) fn sequences(&self) -> u32 {
        self.sequences
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

    /// Decodes `tokens` of the first sequence at positions `position..` in one batch, with
    /// logits at `outputs`.
    pub(super) fn decode(
        &mut self,
        tokens: &[Token],
        position: usize,
        outputs: Outputs,
    ) -> Result<(), String> {
        self.decode_rows(&[Rows {
            seq: SeqId::FIRST,
            tokens,
            position,
            outputs,
        }])
    }

    /// Decodes the rows of every entry of `rows` in one batch, in order: the logits of the
    /// `i`-th token overall (counting the entries' tokens one after another) are
    /// [`Self::logits`]`(i)`, if it had any. A recurrent model's context first decodes the
    /// replays earlier rollbacks left, and saves the state of each sequence in `rows`.
    pub(super) fn decode_rows(&mut self, rows: &[Rows<'_>]) -> Result<(), String> {
        if self.rollbacks.is_some() {
            self.decode_replays()?;
            self.save_states(rows)?;
        }
        self.decode_batch(rows)
    }

    /// Decodes `rows` as [`Self::decode_rows`] does, except that a recurrent model's sequence
    /// whose rows continue its last decode keeps the state saved before that decode, so it can
    /// go back to anywhere since (`Rollbacks::extend`): a draft model's drafting steps after
    /// the first.
    pub(super) fn decode_rows_continuing(&mut self, rows: &[Rows<'_>]) -> Result<(), String> {
        if let Some(rollbacks) = &mut self.rollbacks {
            let fresh: Vec<Rows<'_>> = rows
                .iter()
                .filter(|entry| !rollbacks.extend(entry.seq, entry.position, entry.tokens))
                .copied()
                .collect();
            self.decode_replays()?;
            self.save_states(&fresh)?;
        }
        self.decode_batch(rows)
    }

    /// Whether this is a recurrent or hybrid model's context, whose sequences roll back by
    /// restoring a saved state and decoding the kept tokens again.
    pub(super) fn is_recurrent(&self) -> bool {
        self.rollbacks.is_some()
    }

    /// Saves the state of every sequence in `rows` into its spare and records their tokens.
    fn save_states(&mut self, rows: &[Rows<'_>]) -> Result<(), String> {
        let mut decoded: Vec<(SeqId, usize, Vec<Token>)> = Vec::new();
        for entry in rows {
            match decoded.iter_mut().find(|(seq, ..)| *seq == entry.seq) {
                Some((_, _, tokens)) => tokens.extend_from_slice(entry.tokens),
                None => decoded.push((entry.seq, entry.position, entry.tokens.to_vec())),
            }
        }
        for (seq, base, tokens) in decoded {
            let spare = self.spare(seq)?;
            self.copy_sequence(seq, spare)?;
            if let Some(rollbacks) = &mut self.rollbacks {
                rollbacks.record(seq, base, tokens);
            }
        }
        Ok(())
    }

    /// Decodes the replays recorded by rollbacks, in one batch (no logits); the next decode
    /// does it anyway, so a caller does it early only to settle its cost where it belongs (the
    /// verifier, in the round that cut a draft).
    pub(super) fn decode_replays(&mut self) -> Result<(), String> {
        let replays = match &mut self.rollbacks {
            Some(rollbacks) => rollbacks.take_replays(),
            None => return Ok(()),
        };
        if replays.is_empty() {
            return Ok(());
        }
        let rows: Vec<Rows<'_>> = replays
            .iter()
            .map(|replay| Rows {
                seq: replay.seq,
                tokens: &replay.tokens,
                position: replay.position,
                outputs: Outputs::None,
            })
            .collect();
        self.decode_batch(&rows)
            .map_err(|reason| format!("re-decoding the kept tokens after a rollback: {reason}"))
    }

    /// The spare sequence `seq`'s state is saved in.
    fn spare(&self, seq: SeqId) -> Result<SeqId, String> {
        if seq.0 >= self.sequences {
            return Err(format!(
                "sequence {seq} is outside this context's {} sequences",
                self.sequences
            ));
        }
        Ok(SeqId(seq.0 + self.sequences))
    }

    /// Makes `to` hold what `from` holds (its state, for a recurrent model), emptying it first.
    fn copy_sequence(&mut self, from: SeqId, to: SeqId) -> Result<(), String> {
        self.context
            .clear_kv_cache_seq(Some(to.0), None, None)
            .map_err(|e| e.to_string())?;
        self.context
            .copy_kv_cache_seq(from.llama(), to.llama(), None, None)
            .map_err(|e| e.to_string())
    }

    /// Decodes `rows` in one batch as they are.
    fn decode_batch(&mut self, rows: &[Rows<'_>]) -> Result<(), String> {
        let n_tokens: usize = rows.iter().map(|entry| entry.tokens.len()).sum();
        if n_tokens == 0 || n_tokens > self.batch_capacity {
            return Err(format!(
                "a batch holds 1 to {} tokens, not {n_tokens}",
                self.batch_capacity
            ));
        }
        self.batch.clear();
        for entry in rows {
            if entry.seq.0 >= self.sequences {
                return Err(format!(
                    "sequence {} is outside this context's {} sequences",
                    entry.seq, self.sequences
                ));
            }
            for (i, &token) in entry.tokens.iter().enumerate() {
                self.batch
                    .add(
                        to_llama(token),
                        (entry.position + i) as i32,
                        &[entry.seq.llama()],
                        entry.outputs.at(i, entry.tokens.len()),
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        self.decode_filled_batch()
    }

    /// Decodes the batch as filled, counting the matrix products the host computed.
    fn decode_filled_batch(&mut self) -> Result<(), String> {
        let products_before = host_products_on_this_thread();
        let decoded = self.context.decode(&mut self.batch);
        self.host_products += host_products_on_this_thread() - products_before;
        decoded.map_err(|e| e.to_string())
    }

    /// The logits at batch index `index` of the last decode (a position that had logits).
    pub(super) fn logits(&self, index: usize) -> &[f32] {
        self.context.get_logits_ith(index as i32)
    }

    /// Removes positions `from..` of the first sequence from the KV cache.
    pub(super) fn remove_from(&mut self, from: usize) -> Result<(), String> {
        self.remove_positions(SeqId::FIRST, from)
    }

    /// Removes positions `from..` of `seq` from the KV cache. A recurrent model's sequence goes
    /// back only within its last decode: its saved state is restored now, and the kept tokens
    /// of that decode are decoded again before the next decode.
    pub(super) fn remove_positions(&mut self, seq: SeqId, from: usize) -> Result<(), String> {
        let len = self.sequence_len(seq);
        let plan = match &mut self.rollbacks {
            Some(rollbacks) => rollbacks.plan(seq, from, len)?,
            None => return self.remove_cells(seq, from),
        };
        match plan {
            RollbackPlan::Nothing => Ok(()),
            RollbackPlan::Clear => {
                let spare = self.spare(seq)?;
                self.remove_cells(spare, 0)?;
                self.remove_cells(seq, 0)
            }
            RollbackPlan::Restore => {
                let spare = self.spare(seq)?;
                self.copy_sequence(spare, seq)
            }
        }
    }

    /// Removes positions `from..` of `seq` with llama.cpp's `seq_rm`.
    fn remove_cells(&mut self, seq: SeqId, from: usize) -> Result<(), String> {
        let removed = u32::try_from(from)
            .map_err(|_| format!("position {from} is out of llama.cpp's range"))
            .and_then(|from| {
                self.context
                    .clear_kv_cache_seq(Some(seq.0), Some(from), None)
                    .map_err(|e| e.to_string())
            })?;
        removed.then_some(()).ok_or_else(|| {
            format!(
                "llama.cpp could not remove positions {from}.. of sequence {seq} from the cache"
            )
        })
    }

    /// Positions `seq`'s part of the KV cache holds (`0..len`).
    pub(super) fn sequence_len(&self, seq: SeqId) -> usize {
        if let Some(len) = self.rollbacks.as_ref().and_then(|r| r.pending_len(seq)) {
            return len;
        }
        // llama.cpp answers -1 for an empty sequence.
        usize::try_from(self.context.kv_cache_seq_pos_max(seq.llama()) + 1).unwrap_or(0)
    }

    /// Empties `seq`'s part of the KV cache.
    pub(super) fn clear_sequence(&mut self, seq: SeqId) -> Result<(), String> {
        self.remove_positions(seq, 0)
    }

    /// Empties the KV cache.
    pub(super) fn clear(&mut self) {
        self.context.clear_kv_cache();
        if let Some(rollbacks) = &mut self.rollbacks {
            rollbacks.forget_all();
        }
    }

    /// The start-up check, again: see [`Self::check_batches`] and, for a context that takes
    /// trees, [`Self::check_tree`]. Empties the cache.
    pub(super) fn check_batch_invariance(&mut self) -> Result<u64, String> {
        let checked = self.check_batches(self.check_rows);
        self.clear();
        if checked.is_ok()
            && self.tree_leaves > 1
            && let Err(reason) = self.check_tree()
        {
            tracing::warn!(%reason, "trees: a tree's rows decode differently from its paths one by one; tree drafts are off");
            self.tree_leaves = 1;
        }
        self.clear();
        checked
    }

    /// Decodes the check's batch (see [`BatchCheck`]) one token at a time, as plain decoding
    /// does, then as one batch with every output, as verify batches
    /// decode, and compares the logits bit for bit. Returns how many products of the batch the
    /// host computed; a check that cannot run (a tiny context) proves nothing beyond the
    /// kernel's unit tests and passes.
    fn check_batches(&mut self, rows: usize) -> Result<u64, String> {
        let check = BatchCheck::new(
            rows.clamp(1, self.batch_capacity),
            self.sequences,
            self.batch_capacity,
            self.n_ctx() as usize,
        );
        let mut one_by_one = Vec::with_capacity(check.sequences.len());
        for (seq, context, rows) in check.entries() {
            let mut logits = Vec::with_capacity(rows.len());
            for (offset, &token) in context.iter().chain(rows).enumerate() {
                if self.decode_one(seq, token, offset).is_err() {
                    return Ok(0);
                }
                if offset >= context.len() {
                    logits.push(self.logits(0).to_vec());
                }
            }
            one_by_one.push(logits);
        }
        self.clear();
        for (seq, context, _) in check.entries() {
            for (position, &token) in context.iter().enumerate() {
                if self.decode_one(seq, token, position).is_err() {
                    return Ok(0);
                }
            }
        }
        let batch: Vec<Rows<'_>> = check
            .entries()
            .map(|(seq, context, rows)| Rows {
                seq,
                tokens: rows,
                position: context.len(),
                outputs: Outputs::All,
            })
            .collect();
        let products_before = self.host_products;
        if self.decode_rows(&batch).is_err() {
            return Ok(0);
        }
        let mut index = 0;
        for ((seq, _, rows), single) in check.entries().zip(&one_by_one) {
            for (row, single) in single.iter().enumerate().take(rows.len()) {
                let batched = self.logits(index + row);
                if let Some(token) =
                    (0..batched.len()).find(|&t| batched[t].to_bits() != single[t].to_bits())
                {
                    return Err(format!(
                        "sequence {seq}, row {row} of {}, token {token}: batch {} vs one by one {}",
                        rows.len(),
                        batched[token],
                        single[token]
                    ));
                }
            }
            index += rows.len();
        }
        Ok(self.host_products - products_before)
    }

    /// Decodes one token of `seq` at `position`, with its logits.
    fn decode_one(&mut self, seq: SeqId, token: Token, position: usize) -> Result<(), String> {
        self.decode_rows(&[Rows {
            seq,
            tokens: &[token],
            position,
            outputs: Outputs::Last,
        }])
    }
}

/// The batch the start-up check decodes: the first sequence's rows (a largest verify batch)
/// from position 0 and, when the context holds more sequences, a second sequence's few rows
/// after a short context of its own and a third's single row, so rows of several lengths,
/// sequences and contexts share one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BatchCheck {
    /// Per sequence: its context (decoded before the batch) and its rows in the batch.
    sequences: Vec<(SeqId, Vec<Token>, Vec<Token>)>,
}

impl BatchCheck {
    fn new(rows: usize, sequences: u32, batch_capacity: usize, ctx_size: usize) -> Self {
        let rows = rows.min(ctx_size).max(1);
        // Token ids do not matter to the arithmetic; different ones per sequence make the
        // rows different.
        let mut check = vec![(SeqId::FIRST, Vec::new(), (0..rows as Token).collect())];
        let room = batch_capacity.saturating_sub(rows);
        if sequences >= 2
            && room >= CHECK_SECOND_ROWS
            && ctx_size >= CHECK_SECOND_CONTEXT + CHECK_SECOND_ROWS
        {
            let context = (0..CHECK_SECOND_CONTEXT as Token).map(|t| t + 7).collect();
            let second = (0..CHECK_SECOND_ROWS as Token).map(|t| t + 3).collect();
            check.push((SeqId(1), context, second));
            if sequences >= 3 && room > CHECK_SECOND_ROWS {
                check.push((SeqId(2), Vec::new(), vec![11]));
            }
        }
        Self { sequences: check }
    }

    /// `(sequence, context, rows)` of each sequence, in batch order.
    fn entries(&self) -> impl Iterator<Item = (SeqId, &[Token], &[Token])> + '_ {
        self.sequences
            .iter()
            .map(|(seq, context, rows)| (*seq, context.as_slice(), rows.as_slice()))
    }
}

/// Says that llama.cpp's own kernels decode a batch differently from its tokens one by one:
/// output still comes from the target, but speculation may change it.
fn warn_not_batch_invariant(reason: &str) {
    tracing::warn!(
        %reason,
        "batches: llama.cpp decodes a batch differently from its tokens one by one on this CPU or model, so speculative output may differ from plain decoding near ties; see docs/exactness.md for the settings that make it exact"
    );
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
    batch_backend::products_on_this_thread()
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
