//! Flash attention of a batch's query rows over a Q8_0 KV cache, bit for bit as llama.cpp's CPU
//! backend computes it one query row at a time; for x86-64 with AVX2, FMA and F16C.
//!
//! Why: exactness needs a Q8_0 KV cache (`docs/exactness.md`), and ggml's flash attention over a
//! quantized cache takes one query row at a time: for every (query row, cache position) it calls
//! the dot product, converts the position's value row from Q8_0 to `f32` again and adds it in.
//! A 2,000-token prompt spends most of its time there. Here the query rows that share a KV head
//! (the heads of a group, a tile of positions) go through the cache together: each key row is
//! unpacked once for up to eight query rows and each value row converted once for all of them.
//! A single position is taken too: plain decoding's token (its group's heads still share each
//! value row), and a server's step of several sequences' single rows, which ggml's path made
//! cost about 1.3x as many rows of one sequence (SmolLM2 Q8_0, four sequences: 9.0-12.6 ms a
//! step against 7.0-9.6 for four rows of one).
//!
//! Exactness: each query row gets the arithmetic of ggml's
//! `ggml_compute_forward_flash_attn_ext_f16_one_chunk` for Q8_0 keys and values, in the same
//! order: the row quantized by ggml's `quantize_row_q8_0`; per cache position whose mask is not
//! `-inf`, the Q8_0 dot product (`avx2`'s kernel, bit for bit ggml's), times the scale, plus the
//! mask; on a new maximum `M`, the accumulator scaled by `exp(M_old - M)`, otherwise the weight
//! `exp(s - M)`; the value row (each `i8` times its block's scale, exact) fused-multiply-added
//! into the accumulator; the sum `S = S × ms + vs`; at the end the accumulator times `1 / S`.
//! `exp` is the C library's `expf`, which ggml calls too (taken for all rows of a cache position
//! together, bit for bit the same: [`exp`]). The unit tests compare every output
//! with ggml's own operation on random rows, causal masks and grouped heads.
//!
//! Taken: `f32` queries, Q8_0 keys and values with head sizes a multiple of 64 (ggml's vector
//! loops then have no scalar tail), an `f16` mask, no ALiBi, logit soft-capping or sinks. The
//! rest stays with llama.cpp.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::avx2::{self, Avx2Weights};
use super::exp;
use super::quant_matmul::{BLOCK, BlockQ8_0, QuantMatrix, f16_to_f32};
use super::team;
use llama_cpp_sys_2 as sys;

/// Head sizes must be a multiple of this (ggml's widest `f32` vector step, AVX-512's).
pub(super) const HEAD_SIZE_MULTIPLE: usize = 64;

/// Query positions of one work item, at most: with a group's heads, the rows whose state stays
/// in cache while they go through the KV cache together.
const MAX_TILE_POSITIONS: usize = 8;

/// Byte strides of a 4-D tensor's dimensions 1, 2 and 3.
#[derive(Clone, Copy)]
pub(super) struct Strides {
    /// Between rows (positions).
    pub(super) row: usize,
    /// Between heads.
    pub(super) head: usize,
    /// Between streams (sequences with their own KV cells).
    pub(super) stream: usize,
}

impl Strides {
    /// The byte offset of row `row` of head `head` of stream `stream`.
    fn offset(self, [row, head, stream]: [usize; 3]) -> usize {
        row * self.row + head * self.head + stream * self.stream
    }
}

/// One flash-attention operation: the tensors' addresses, shapes and strides (ggml's layout:
/// queries `[head_size, positions, heads, streams]`, keys and values `[head_size, cache,
/// kv_heads, streams]`, the mask `[cache, positions, mask_heads, mask_streams]` of `f16`,
/// the output `[value_size, heads, positions, streams]`, contiguous).
pub(super) struct Attention {
    /// The query rows (`f32`).
    pub(super) queries: *const u8,
    /// Their strides.
    pub(super) query_strides: Strides,
    /// The key rows (Q8_0).
    pub(super) keys: *const u8,
    /// Their strides.
    pub(super) key_strides: Strides,
    /// The value rows (Q8_0).
    pub(super) values: *const u8,
    /// Their strides.
    pub(super) value_strides: Strides,
    /// The mask (`f16`), if any.
    pub(super) mask: Option<*const u8>,
    /// Its strides.
    pub(super) mask_strides: Strides,
    /// Its heads and streams (broadcast over the queries').
    pub(super) mask_heads: usize,
    /// As above.
    pub(super) mask_streams: usize,
    /// The output (`f32`).
    pub(super) output: *mut u8,
    /// Bytes of one output row (one head of one position).
    pub(super) output_row: usize,
    /// Values per key and query row.
    pub(super) key_size: usize,
    /// Values per value and output row.
    pub(super) value_size: usize,
    /// Query positions, query heads and streams.
    pub(super) positions: usize,
    /// As above.
    pub(super) heads: usize,
    /// As above.
    pub(super) streams: usize,
    /// KV heads (each read by `heads / kv_heads` query heads; ggml gives keys and values the
    /// queries' streams).
    pub(super) kv_heads: usize,
    /// Cache positions (key and value rows per head).
    pub(super) cache: usize,
    /// The factor of the dot products.
    pub(super) scale: f32,
}

// SAFETY: the pointers address tensors the graph keeps alive while the operation runs; threads
// only read the inputs and write disjoint output rows.
unsafe impl Sync for Attention {}

/// Whether this CPU has the kernel's instructions.
pub(super) fn kernel_available() -> bool {
    avx2::kernel_available()
}

impl Attention {
    /// The operation `node` asks for, if it is one this kernel computes (see the module's
    /// documentation) and the CPU has the kernel's instructions.
    ///
    /// # Safety
    /// `node` and its sources must be live tensors.
    pub(super) unsafe fn of(node: &sys::ggml_tensor) -> Option<Self> {
        if node.op != sys::GGML_OP_FLASH_ATTN_EXT || !kernel_available() {
            return None;
        }
        // SAFETY: the caller guarantees live sources.
        let (queries, keys, values) = unsafe {
            (
                node.src[0].as_ref()?,
                node.src[1].as_ref()?,
                node.src[2].as_ref()?,
            )
        };
        // SAFETY: as above; absent when null.
        let mask = unsafe { node.src[3].as_ref() };
        let sinks = node.src[4];
        let parameter = |at: usize| f32::from_bits(node.op_params[at] as u32);
        let (scale, max_bias, softcap) = (parameter(0), parameter(1), parameter(2));
        let dims = |tensor: &sys::ggml_tensor| tensor.ne.map(|n| n as usize);
        let strides = |tensor: &sys::ggml_tensor| Strides {
            row: tensor.nb[1],
            head: tensor.nb[2],
            stream: tensor.nb[3],
        };
        let [key_size, positions, heads, streams] = dims(queries);
        let [_, cache, kv_heads, _] = dims(keys);
        let value_size = values.ne[0] as usize;
        // Q8_0 rows of whole blocks, each row whole blocks apart (keys are read as a strided
        // matrix of blocks).
        let q8_0 = |tensor: &sys::ggml_tensor| {
            let block = size_of::<BlockQ8_0>();
            tensor.type_ == sys::GGML_TYPE_Q8_0
                && tensor.nb[0] == block
                && tensor.nb[1].is_multiple_of(block)
        };
        let float = size_of::<f32>();
        let supported = sinks.is_null()
            && max_bias == 0.0
            && softcap == 0.0
            && node.type_ == sys::GGML_TYPE_F32
            && queries.type_ == sys::GGML_TYPE_F32
            && queries.nb[0] == float
            && q8_0(keys)
            && q8_0(values)
            && key_size.is_multiple_of(HEAD_SIZE_MULTIPLE)
            && value_size.is_multiple_of(HEAD_SIZE_MULTIPLE)
            && dims(keys) == [key_size, cache, kv_heads, streams]
            && dims(values) == [value_size, cache, kv_heads, streams]
            && kv_heads > 0
            && heads.is_multiple_of(kv_heads)
            && dims(node) == [value_size, heads, positions, streams]
            && node.nb[0] == float
            && node.nb[1] == value_size * float
            && node.nb[2] == heads * value_size * float
            && node.nb[3] == positions * heads * value_size * float
            && mask.is_none_or(|mask| {
                let [mask_cache, mask_rows, mask_heads, mask_streams] = dims(mask);
                mask.type_ == sys::GGML_TYPE_F16
                    && mask.nb[0] == size_of::<u16>()
                    && mask_cache == cache
                    && mask_rows >= positions
                    && mask_heads > 0
                    && heads.is_multiple_of(mask_heads)
                    && mask_streams > 0
                    && streams.is_multiple_of(mask_streams)
            });
        supported.then(|| Self {
            queries: queries.data.cast(),
            query_strides: strides(queries),
            keys: keys.data.cast(),
            key_strides: strides(keys),
            values: values.data.cast(),
            value_strides: strides(values),
            mask: mask.map(|mask| mask.data.cast_const().cast()),
            mask_strides: mask.map_or(
                Strides {
                    row: 0,
                    head: 0,
                    stream: 0,
                },
                strides,
            ),
            mask_heads: mask.map_or(1, |mask| mask.ne[2] as usize),
            mask_streams: mask.map_or(1, |mask| mask.ne[3] as usize),
            output: node.data.cast(),
            output_row: node.nb[1],
            key_size,
            value_size,
            positions,
            heads,
            streams,
            kv_heads,
            cache,
            scale,
        })
    }

    /// Computes the operation on up to `threads` threads of llama.cpp's OpenMP team.
    ///
    /// # Safety
    /// The tensors must be live, of the described layout, and the output must not overlap the
    /// inputs; the CPU must have the kernel's instructions ([`kernel_available`]).
    pub(super) unsafe fn compute(&self, threads: usize) {
        let groups = self.streams * self.kv_heads;
        // Enough items for every thread to take about two (so uneven items even out), each at
        // most a tile.
        let tiles_per_group = self
            .positions
            .div_ceil(MAX_TILE_POSITIONS)
            .max((2 * threads).div_ceil(groups))
            .min(self.positions);
        let tile = self.positions.div_ceil(tiles_per_group);
        let tiles = self.positions.div_ceil(tile);
        // Fewer items than threads (a single row of a model with one KV head): a group's heads
        // are split between items, each converting the group's value rows itself.
        let group_heads = self.heads / self.kv_heads;
        let part_heads =
            group_heads.div_ceil(threads.div_ceil(groups * tiles).clamp(1, group_heads));
        let parts = group_heads.div_ceil(part_heads);
        let items = groups * tiles * parts;
        let next = AtomicUsize::new(0);
        team::parallel(threads.min(items), |_, _| {
            loop {
                let item = next.fetch_add(1, Ordering::Relaxed);
                if item >= items {
                    break;
                }
                let (group, tile_index, part) =
                    (item / (tiles * parts), item / parts % tiles, item % parts);
                let first = tile_index * tile;
                let positions = first..(first + tile).min(self.positions);
                let kv_head = group % self.kv_heads;
                let first_head = kv_head * group_heads + part * part_heads;
                let heads = first_head..(first_head + part_heads).min((kv_head + 1) * group_heads);
                // SAFETY: the caller guarantees the tensors and the instructions.
                unsafe { self.compute_item(group / self.kv_heads, kv_head, positions, heads) };
            }
        });
    }

    /// The key and value rows (Q8_0) of cache cell `cell` of KV head `kv_head` in stream
    /// `stream`.
    ///
    /// # Safety
    /// As [`Attention::compute`]; `cell` is within the cache.
    unsafe fn cache_rows(
        &self,
        cell: usize,
        kv_head: usize,
        stream: usize,
    ) -> (&[BlockQ8_0], &[BlockQ8_0]) {
        let at = [cell, kv_head, stream];
        // SAFETY: the caller guarantees the rows; Q8_0 rows are 2-byte aligned, as the blocks.
        let row = |base: *const u8, strides: Strides, values: usize| unsafe {
            std::slice::from_raw_parts(base.add(strides.offset(at)).cast(), values / BLOCK)
        };
        (
            row(self.keys, self.key_strides, self.key_size),
            row(self.values, self.value_strides, self.value_size),
        )
    }

    /// The key rows (Q8_0) of cache cells `cells` of KV head `kv_head` in stream `stream`, as a
    /// matrix of one row per cell.
    ///
    /// # Safety
    /// As [`Attention::compute`]; `cells` are within the cache.
    unsafe fn key_rows(
        &self,
        cells: std::ops::Range<usize>,
        kv_head: usize,
        stream: usize,
    ) -> QuantMatrix<'_, BlockQ8_0> {
        let block = size_of::<BlockQ8_0>();
        let stride = self.key_strides.row / block;
        let blocks = (cells.len() - 1) * stride + self.key_size / BLOCK;
        let first = self.key_strides.offset([cells.start, kv_head, stream]);
        // SAFETY: the caller guarantees the rows; `Attention::of` checked that rows are whole
        // blocks apart; Q8_0 rows are 2-byte aligned, as the blocks.
        let blocks = unsafe { std::slice::from_raw_parts(self.keys.add(first).cast(), blocks) };
        QuantMatrix::strided(blocks, cells.len(), self.key_size, stride)
    }

    /// One query row's steps through a run of cells (`scores` its dot products with their keys,
    /// `biases` its mask values there; `maximum` its running maximum, updated): the cells it
    /// attends, in order, into `steps`, each with the exponent ggml takes there (`M_old - M` on
    /// a new maximum `M`, `s - M` otherwise) into `exponents`. Returns how many.
    fn softmax_steps(
        &self,
        scores: &[f32],
        biases: &[f32],
        maximum: &mut f32,
        steps: &mut [Step],
        exponents: &mut [f32],
    ) -> usize {
        let mut taken = steps.iter_mut().zip(exponents.iter_mut());
        let mut count = 0;
        for (cell, (&score, &bias)) in scores.iter().zip(biases).enumerate() {
            if bias == f32::NEG_INFINITY {
                continue;
            }
            let Some((step, exponent)) = taken.next() else {
                break;
            };
            let score = score * self.scale + bias;
            let new_maximum = score > *maximum;
            *exponent = if new_maximum {
                *maximum - score
            } else {
                score - *maximum
            };
            if new_maximum {
                *maximum = score;
            }
            *step = Step { cell, new_maximum };
            count += 1;
        }
        count
    }

    /// The query rows of `positions` and of `heads` (heads that read KV head `kv_head`), in
    /// stream `stream`.
    ///
    /// # Safety
    /// As [`Attention::compute`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn compute_item(
        &self,
        stream: usize,
        kv_head: usize,
        positions: std::ops::Range<usize>,
        heads: std::ops::Range<usize>,
    ) {
        let rows: Vec<(usize, usize)> = positions
            .clone()
            .flat_map(|position| heads.clone().map(move |head| (position, head)))
            .collect();
        let key_blocks = self.key_size / BLOCK;
        // SAFETY (every dereference below): the caller guarantees tensors of the described
        // layout; every offset is within them.
        let query_rows: Vec<&[f32]> = rows
            .iter()
            .map(|&(position, head)| unsafe {
                let at = self
                    .queries
                    .add(self.query_strides.offset([position, head, stream]));
                std::slice::from_raw_parts(at.cast::<f32>(), self.key_size)
            })
            .collect();
        let passes: Vec<_> = query_rows
            .chunks(avx2::ROWS_PER_PASS)
            .map(|pass| BlockQ8_0::quantize_batch(pass, key_blocks))
            .collect();
        // The mask rows the query rows read (the heads of a position often share one) and each
        // query row's; without a mask, one row of zeros.
        let mut mask_rows: Vec<*const u16> = Vec::new();
        let row_masks: Vec<usize> = rows
            .iter()
            .map(|&(position, head)| {
                self.mask.map_or(0, |mask| {
                    let at = [position, head % self.mask_heads, stream % self.mask_streams];
                    let row = unsafe { mask.add(self.mask_strides.offset(at)).cast::<u16>() };
                    mask_rows
                        .iter()
                        .position(|&known| known == row)
                        .unwrap_or_else(|| {
                            mask_rows.push(row);
                            mask_rows.len() - 1
                        })
                })
            })
            .collect();
        let mut maximums = vec![f32::NEG_INFINITY; rows.len()];
        let mut sums = vec![0.0f32; rows.len()];
        let mut accumulators = vec![0.0f32; rows.len() * self.value_size];
        // Per run of cells: each mask row's biases and each query row's scores (`CELL_RUN`
        // apart), the value rows, and each query row's softmax steps with their exponents.
        let mut biases = vec![0.0f32; mask_rows.len().max(1) * CELL_RUN];
        let mut scores = vec![0.0f32; rows.len() * CELL_RUN];
        let mut value_rows = vec![0.0f32; CELL_RUN * self.value_size];
        let mut steps = vec![Step::default(); rows.len() * CELL_RUN];
        let mut exponents = vec![0.0f32; rows.len() * CELL_RUN];
        let mut step_counts = vec![0; rows.len()];
        let mut key_scales = <BlockQ8_0 as Avx2Weights>::Tile::default();
        for first_cell in (0..self.cache).step_by(CELL_RUN) {
            let run = first_cell..(first_cell + CELL_RUN).min(self.cache);
            let cells = run.len();
            let mut attended = mask_rows.is_empty();
            for (biases, mask) in biases.chunks_exact_mut(CELL_RUN).zip(&mask_rows) {
                let biases = &mut biases[..cells];
                // ggml's `slope × mask` with no ALiBi: the slope is 1, the product exact.
                f16_row(
                    unsafe { std::slice::from_raw_parts(mask.add(first_cell), cells) },
                    biases,
                );
                attended |= biases.iter().any(|&bias| bias != f32::NEG_INFINITY);
            }
            if !attended {
                continue;
            }
            let keys = unsafe { self.key_rows(run.clone(), kv_head, stream) };
            BlockQ8_0::fill_tile(&keys, 0..cells, passes.len(), &mut key_scales);
            let pass_scores = scores.chunks_mut(avx2::ROWS_PER_PASS * CELL_RUN);
            for (pass, pass_scores) in passes.iter().zip(pass_scores) {
                let mut outputs: [&mut [f32]; avx2::ROWS_PER_PASS] = Default::default();
                let mut count = 0;
                for (output, scores) in outputs.iter_mut().zip(pass_scores.chunks_mut(CELL_RUN)) {
                    *output = &mut scores[..cells];
                    count += 1;
                }
                let outputs = &mut outputs[..count];
                // SAFETY: this function's features are the kernel's.
                unsafe { BlockQ8_0::rows(&keys, &key_scales, pass, 0..cells, outputs) };
            }
            for (cell, value_row) in run
                .clone()
                .zip(value_rows.chunks_exact_mut(self.value_size))
            {
                let (_, values) = unsafe { self.cache_rows(cell, kv_head, stream) };
                dequantize(values, value_row);
            }
            // Each row's steps through the run, in ggml's order: on a new maximum `M`, the
            // accumulator is scaled by `exp(M_old - M)`, otherwise the value row is weighted by
            // `exp(s - M)`. The exponents of every row are then taken together.
            let run_scores = scores.chunks_exact(CELL_RUN).zip(&row_masks);
            let run_steps = steps
                .chunks_exact_mut(CELL_RUN)
                .zip(exponents.chunks_exact_mut(CELL_RUN));
            for (((row_scores, &mask), (row_steps, row_exponents)), (maximum, count)) in run_scores
                .zip(run_steps)
                .zip(maximums.iter_mut().zip(&mut step_counts))
            {
                *count = self.softmax_steps(
                    &row_scores[..cells],
                    &biases[mask * CELL_RUN..][..cells],
                    maximum,
                    row_steps,
                    row_exponents,
                );
                row_exponents[*count..].fill(0.0);
            }
            exp::exp_in_place(&mut exponents);
            for (((accumulator, sum), (row_steps, row_exponents)), &count) in accumulators
                .chunks_exact_mut(self.value_size)
                .zip(&mut sums)
                .zip(
                    steps
                        .chunks_exact(CELL_RUN)
                        .zip(exponents.chunks_exact(CELL_RUN)),
                )
                .zip(&step_counts)
            {
                let (row_steps, row_exponents) = (&row_steps[..count], &row_exponents[..count]);
                for (step, &exponent) in row_steps.iter().zip(row_exponents) {
                    let (rescale, weight) = if step.new_maximum {
                        (exponent, 1.0)
                    } else {
                        (1.0, exponent)
                    };
                    *sum = sum.mul_add(rescale, weight);
                }
                add_value_rows(accumulator, &value_rows, row_steps, row_exponents);
            }
        }
        for (row, accumulator) in accumulators.chunks_exact_mut(self.value_size).enumerate() {
            let sum = sums[row];
            scale_row(accumulator, if sum == 0.0 { 0.0 } else { 1.0 / sum });
            let (position, head) = rows[row];
            // ggml's output is permuted: position-major, then head.
            let at = ((stream * self.positions + position) * self.heads + head) * self.output_row;
            unsafe {
                std::ptr::copy_nonoverlapping(
                    accumulator.as_ptr(),
                    self.output.add(at).cast::<f32>(),
                    self.value_size,
                );
            }
        }
    }
}

/// Cache cells whose key rows are scored in one kernel call per pass of query rows, and whose
/// value rows are added into each query row's accumulator while it stays in registers.
const CELL_RUN: usize = 32;

/// A cell a query row attends, in the order ggml's online softmax takes them.
#[derive(Clone, Copy, Default)]
struct Step {
    /// The cell, within its run.
    cell: usize,
    /// Whether its score is the row's new maximum: the accumulator is rescaled by the step's
    /// exponent and the value row added with weight 1, rather than weighted by it.
    new_maximum: bool,
}

/// `f16` mask values as `f32`, eight at a time (exact).
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_row(halves: &[u16], out: &mut [f32]) {
    let mut halves = halves.chunks_exact(8);
    let mut out = out.chunks_exact_mut(8);
    for (halves, out) in (&mut halves).zip(&mut out) {
        // SAFETY: each chunk holds eight values.
        unsafe {
            let floats = _mm256_cvtph_ps(_mm_loadu_si128(halves.as_ptr().cast()));
            _mm256_storeu_ps(out.as_mut_ptr(), floats);
        }
    }
    for (half, out) in halves.remainder().iter().zip(out.into_remainder()) {
        *out = f16_to_f32(*half);
    }
}

/// Values per register block of an accumulator: eight AVX registers of `f32`.
const REGISTER_VALUES: usize = 64;

// Every head size the kernel takes is whole register blocks.
const _: () = assert!(HEAD_SIZE_MULTIPLE.is_multiple_of(REGISTER_VALUES));

/// A query row's accumulator through its `steps` of a run of cells (`value_rows` the run's value
/// rows, `exponents` each step's exponent): on a new maximum `accumulator *= exponent` (ggml's
/// `ggml_vec_scale_f32`), then `accumulator += value_row × weight` (ggml's `ggml_vec_mad_f32`,
/// one fused multiply-add per value), the weight 1 on a new maximum and the exponent otherwise.
/// Each value is computed alone, so it is kept in registers for the whole run, 64 at a time.
#[target_feature(enable = "avx2,fma,f16c")]
fn add_value_rows(accumulator: &mut [f32], value_rows: &[f32], steps: &[Step], exponents: &[f32]) {
    let value_size = accumulator.len();
    for (block, accumulator) in accumulator.chunks_exact_mut(REGISTER_VALUES).enumerate() {
        let offset = block * REGISTER_VALUES;
        // SAFETY (loads and stores): each chunk of eight is within its slice.
        let mut lanes: [__m256; 8] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(accumulator[i * 8..].as_ptr()) });
        for (step, &exponent) in steps.iter().zip(exponents) {
            let values = &value_rows[step.cell * value_size + offset..][..REGISTER_VALUES];
            let weight = if step.new_maximum {
                let rescale = _mm256_set1_ps(exponent);
                for lane in &mut lanes {
                    *lane = _mm256_mul_ps(*lane, rescale);
                }
                _mm256_set1_ps(1.0)
            } else {
                _mm256_set1_ps(exponent)
            };
            for (i, lane) in lanes.iter_mut().enumerate() {
                let values = unsafe { _mm256_loadu_ps(values[i * 8..].as_ptr()) };
                *lane = _mm256_fmadd_ps(values, weight, *lane);
            }
        }
        for (i, lane) in lanes.iter().enumerate() {
            unsafe { _mm256_storeu_ps(accumulator[i * 8..].as_mut_ptr(), *lane) };
        }
    }
}

/// A Q8_0 row as `f32`: each value times its block's scale (one exact rounding, as ggml's
/// `dequantize_row_q8_0`).
#[target_feature(enable = "avx2,fma,f16c")]
fn dequantize(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (block, out) in blocks.iter().zip(out.chunks_exact_mut(BLOCK)) {
        let scale = _mm256_set1_ps(f16_to_f32(block.scale));
        for (values, out) in block.values.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
            // SAFETY: each chunk holds eight values.
            unsafe {
                let values = _mm256_cvtepi8_epi32(_mm_loadl_epi64(values.as_ptr().cast()));
                let floats = _mm256_mul_ps(_mm256_cvtepi32_ps(values), scale);
                _mm256_storeu_ps(out.as_mut_ptr(), floats);
            }
        }
    }
}

/// `row *= factor`, element by element (ggml's `ggml_vec_scale_f32`).
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_row(row: &mut [f32], factor: f32) {
    for value in row {
        *value *= factor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kernels::avx2::tests::next;

    /// A random value between -2 and 2.
    fn random(state: &mut u64) -> f32 {
        (next(state) % 4_000_001) as f32 / 1_000_000.0 - 2.0
    }

    /// Builds ggml's flash attention of random queries, keys and values with a causal mask
    /// (cells after a row's position and past the used ones are `-inf`), computes it with ggml's
    /// CPU backend and with [`Attention`] on 1 to 3 threads, and compares every output bit.
    ///
    /// `shape`: query rows, heads, KV heads, streams, head size, cache cells, and the cache
    /// position of the first query row.
    fn compare_with_ggml(shape: [usize; 7], seed: u64) {
        let [positions, heads, kv_heads, streams, head_size, cache, first] = shape;
        let mut state = seed;
        let used = first + positions;
        // SAFETY: a ggml context of its own; every tensor is filled within its size, and the
        // context is freed at the end.
        unsafe {
            sys::ggml_cpu_init();
            let context = sys::ggml_init(sys::ggml_init_params {
                mem_size: 64 << 20,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: false,
            });
            assert!(!context.is_null(), "a ggml context");
            let [d, p, h, kh, s, c] =
                [head_size, positions, heads, kv_heads, streams, cache].map(|n| n as i64);
            // Queries as llama.cpp has them: heads contiguous per position, then permuted.
            let queries = sys::ggml_new_tensor_4d(context, sys::GGML_TYPE_F32, d, h, p, s);
            let values_of = |tensor: *mut sys::ggml_tensor, count: usize| {
                std::slice::from_raw_parts_mut((*tensor).data.cast::<f32>(), count)
            };
            for value in values_of(queries, head_size * heads * positions * streams) {
                *value = random(&mut state);
            }
            let queries = sys::ggml_permute(context, queries, 0, 2, 1, 3);
            let quantized = |state: &mut u64| {
                let tensor = sys::ggml_new_tensor_4d(context, sys::GGML_TYPE_Q8_0, d, c, kh, s);
                let rows = cache * kv_heads * streams;
                let floats: Vec<f32> = (0..rows * head_size).map(|_| random(state)).collect();
                sys::ggml_quantize_chunk(
                    sys::GGML_TYPE_Q8_0,
                    floats.as_ptr(),
                    (*tensor).data,
                    0,
                    rows as i64,
                    d,
                    std::ptr::null(),
                );
                tensor
            };
            let keys = quantized(&mut state);
            let values = quantized(&mut state);
            let mask = sys::ggml_new_tensor_4d(context, sys::GGML_TYPE_F16, c, p, 1, s);
            let mask_values = std::slice::from_raw_parts_mut(
                (*mask).data.cast::<u16>(),
                cache * positions * streams,
            );
            for (at, value) in mask_values.iter_mut().enumerate() {
                let (cell, row) = (at % cache, at / cache % positions);
                let visible = cell < used && cell <= first + row;
                *value = sys::ggml_fp32_to_fp16(if visible { 0.0 } else { f32::NEG_INFINITY });
            }
            let scale = 1.0 / (head_size as f32).sqrt();
            let output =
                sys::ggml_flash_attn_ext(context, queries, keys, values, mask, scale, 0.0, 0.0);
            sys::ggml_flash_attn_ext_set_prec(output, sys::GGML_PREC_F32);
            let graph = sys::ggml_new_graph(context);
            sys::ggml_build_forward_expand(graph, output);
            assert_eq!(
                sys::ggml_graph_compute_with_ctx(context, graph, 2),
                sys::GGML_STATUS_SUCCESS
            );
            let count = head_size * heads * positions * streams;
            let want = values_of(output, count).to_vec();
            let attention = Attention::of(&*output).expect("the kernel takes this operation");
            for threads in [1, 2, 3] {
                values_of(output, count).fill(f32::NAN);
                attention.compute(threads);
                for (at, (got, want)) in values_of(output, count).iter().zip(&want).enumerate() {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{threads} threads, {positions} rows of {heads} heads over {kv_heads}, \
                         head size {head_size}: output {at}: {got} vs {want}"
                    );
                }
            }
            sys::ggml_free(context);
        }
    }

    #[test]
    fn attention_is_bit_identical_to_ggml_one_row_at_a_time() {
        if !kernel_available() {
            eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
            return;
        }
        let shapes = [
            // SmolLM2: 9 heads over 3 KV heads of 64; a verify batch, a prompt chunk.
            [2, 9, 3, 1, 64, 256, 40],
            [9, 9, 3, 1, 64, 256, 100],
            [37, 9, 3, 1, 64, 256, 0],
            // Gemma 3 270M: 4 heads over one KV head of 256.
            [5, 4, 1, 1, 256, 256, 30],
            [20, 4, 1, 1, 256, 512, 300],
            // Two sequences with their own KV cells.
            [6, 4, 2, 2, 64, 256, 17],
            // Plain decoding's single row: SmolLM2's, and Gemma's, whose one group's heads are
            // split between threads.
            [1, 9, 3, 1, 64, 512, 300],
            [1, 4, 1, 1, 256, 512, 200],
            // A server's step of four sequences' single rows.
            [1, 9, 3, 4, 64, 256, 50],
        ];
        for (seed, shape) in shapes.into_iter().enumerate() {
            compare_with_ggml(shape, 0x2545_f491_4f6c_dd1d + seed as u64);
        }
    }
}
