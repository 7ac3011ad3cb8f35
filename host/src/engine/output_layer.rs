//! The target's output layer (final hidden states → logits) for Q8_0 weights, computed for a
//! whole verify batch in one pass over the weights, bit for bit as llama.cpp computes it.
//!
//! Why: Gemma 3's output layer is its 262144 × 640 token embedding, 169 M of its 268 M weights.
//! llama.cpp, built batch-invariant (see `docs/exactness.md`), multiplies it with one vector dot
//! product per (vocabulary row, position): verifying `n` tokens costs `n` full passes, which is
//! most of why a verify batch of 16 cost 7.9× one token. This module loads each weight block
//! once and uses it for every position of the batch.
//!
//! Exactness: ggml's CPU kernel for a Q8_0 × Q8_0 dot product (`ggml_vec_dot_q8_0_q8_0`, its
//! AVX2 form, which every x86 build with AVX2 uses) first quantizes the hidden state to Q8_0
//! (`quantize_row_q8_0`), then per 32-value block takes eight lane sums of four int8 products,
//! converts them to `f32`, and fused-multiply-adds them, times (row scale × column scale), into
//! eight lane accumulators in block order; finally the lanes are summed as
//! `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`. Integer lane sums are exact whichever instruction
//! computes them, so a kernel that keeps the lanes, the order of every float operation and the
//! quantization gives the same bits. The one here computes the lane sums of two positions with
//! one AVX-512 VNNI instruction (`vpdpbusd`, unsigned × signed bytes: the weight bytes are
//! offset by 128 and the offset's contribution, `-128 ×` the sum of four activation bytes, is
//! the accumulator's start). The session checks the claim on the real model before using it.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

/// Values per Q8_0 block.
pub(super) const BLOCK: usize = 32;

/// One Q8_0 block as ggml stores it: an `f16` scale and 32 signed bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ8_0 {
    /// The block's scale, as `f16` bits.
    pub(super) scale: u16,
    /// The quantized values.
    pub(super) values: [i8; BLOCK],
}

/// A Q8_0 weight matrix: `rows` rows (vocabulary entries) of `blocks_per_row` blocks.
#[derive(Clone, Copy)]
pub(super) struct Q8Matrix<'w> {
    blocks: &'w [BlockQ8_0],
    rows: usize,
    blocks_per_row: usize,
}

impl<'w> Q8Matrix<'w> {
    /// The matrix over `blocks`, `rows` rows of `columns` values each.
    ///
    /// # Panics
    /// When `columns` is not a multiple of [`BLOCK`] or `blocks` does not hold the matrix.
    pub(super) fn new(blocks: &'w [BlockQ8_0], rows: usize, columns: usize) -> Self {
        assert!(columns.is_multiple_of(BLOCK), "Q8_0 rows are whole blocks");
        let blocks_per_row = columns / BLOCK;
        assert_eq!(blocks.len(), rows * blocks_per_row, "matrix size");
        Self {
            blocks,
            rows,
            blocks_per_row,
        }
    }

    /// Number of rows (logits per position).
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row (the hidden state's width).
    pub(super) fn columns(&self) -> usize {
        self.blocks_per_row * BLOCK
    }

    fn row(&self, row: usize) -> &'w [BlockQ8_0] {
        &self.blocks[row * self.blocks_per_row..(row + 1) * self.blocks_per_row]
    }
}

/// Whether this CPU has the instructions of the batched kernel.
pub(super) fn kernel_available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
}

/// Positions per kernel pass: eight AVX-512 accumulators of two positions each.
const PAIRS_PER_PASS: usize = 8;

/// Logits of `matrix` for each hidden state in `hidden` (`n` states of `matrix.columns()`
/// values, one after the other) into `logits` (`n` rows of `matrix.rows()` values), on
/// `threads` threads. Exactly llama.cpp's logits for the same hidden states.
///
/// # Panics
/// When [`kernel_available`] is false, or the sizes do not match.
pub(super) fn compute_logits(
    matrix: &Q8Matrix<'_>,
    hidden: &[f32],
    logits: &mut [f32],
    threads: usize,
) {
    assert!(
        kernel_available(),
        "the batched output layer needs AVX-512 VNNI"
    );
    let width = matrix.columns();
    assert!(
        hidden.len().is_multiple_of(width),
        "hidden states are whole rows"
    );
    let positions = hidden.len() / width;
    assert_eq!(
        logits.len(),
        positions * matrix.rows(),
        "one row of logits per position"
    );
    let columns: Vec<QuantizedColumn> = hidden
        .chunks_exact(width)
        .map(QuantizedColumn::new)
        .collect();
    let mut outputs: Vec<&mut [f32]> = logits.chunks_exact_mut(matrix.rows()).collect();
    for (pass_columns, pass_outputs) in columns
        .chunks(2 * PAIRS_PER_PASS)
        .zip(outputs.chunks_mut(2 * PAIRS_PER_PASS))
    {
        let pairs = PairBlocks::new(pass_columns, matrix.blocks_per_row);
        run_pass(matrix, &pairs, pass_outputs, threads.max(1));
    }
}

/// Splits the rows among `threads` threads (the calling one included) for one pass.
fn run_pass(matrix: &Q8Matrix<'_>, pairs: &PairBlocks, outputs: &mut [&mut [f32]], threads: usize) {
    let rows = matrix.rows();
    let per_thread = rows.div_ceil(threads);
    // Each thread gets, for every position, the slice of its rows.
    let mut shares: Vec<Vec<&mut [f32]>> = (0..threads).map(|_| Vec::new()).collect();
    for output in outputs.iter_mut() {
        let mut rest: &mut [f32] = output;
        for share in shares.iter_mut() {
            let take = per_thread.min(rest.len());
            let (mine, others) = rest.split_at_mut(take);
            share.push(mine);
            rest = others;
        }
    }
    std::thread::scope(|scope| {
        let mut shares = shares.into_iter().enumerate();
        let (_, first) = shares.next().expect("at least one thread");
        for (thread, mut share) in shares {
            let start = thread * per_thread;
            let range = start.min(rows)..(start + per_thread).min(rows);
            scope.spawn(move || rows_kernel(matrix, pairs, range, &mut share));
        }
        let mut first = first;
        rows_kernel(matrix, pairs, 0..per_thread.min(rows), &mut first);
    });
}

/// A hidden state quantized as ggml's `quantize_row_q8_0` (x86 form) quantizes it.
struct QuantizedColumn {
    /// Per block: the scale, rounded to `f16` and back, as the dot product reads it.
    scales: Vec<f32>,
    values: Vec<i8>,
}

impl QuantizedColumn {
    fn new(hidden: &[f32]) -> Self {
        let mut scales = Vec::with_capacity(hidden.len() / BLOCK);
        let mut values = Vec::with_capacity(hidden.len());
        for block in hidden.chunks_exact(BLOCK) {
            let max = block.iter().fold(0.0f32, |max, x| max.max(x.abs()));
            let scale = max / 127.0;
            let inverse = if max != 0.0 { 127.0 / max } else { 0.0 };
            scales.push(f16_to_f32(f32_to_f16(scale)));
            values.extend(
                block
                    .iter()
                    .map(|&x| (x * inverse).round_ties_even().clamp(-128.0, 127.0) as i8),
            );
        }
        Self { scales, values }
    }
}

/// Two positions' data for one block, laid out for the kernel's 512-bit registers: the low
/// half is the first position, the high half the second.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct PairBlock {
    values: [i8; 2 * BLOCK],
    /// Lane sums start here: `-128 ×` the sum of each lane's four activation bytes.
    offsets: [i32; 16],
    scales: [f32; 16],
}

/// The positions of one pass, as [`PairBlock`]s in block-major order.
struct PairBlocks {
    pairs: usize,
    positions: usize,
    blocks: Vec<PairBlock>,
}

impl PairBlocks {
    fn new(columns: &[QuantizedColumn], blocks_per_row: usize) -> Self {
        let pairs = columns.len().div_ceil(2);
        let empty = PairBlock {
            values: [0; 2 * BLOCK],
            offsets: [0; 16],
            scales: [0.0; 16],
        };
        let mut blocks = vec![empty; pairs * blocks_per_row];
        for (position, column) in columns.iter().enumerate() {
            let (pair, half) = (position / 2, position % 2);
            for block in 0..blocks_per_row {
                let target = &mut blocks[block * pairs + pair];
                let values = &column.values[block * BLOCK..(block + 1) * BLOCK];
                target.values[half * BLOCK..(half + 1) * BLOCK].copy_from_slice(values);
                for lane in 0..8 {
                    let sum: i32 = values[4 * lane..4 * lane + 4]
                        .iter()
                        .map(|&v| i32::from(v))
                        .sum();
                    target.offsets[half * 8 + lane] = -128 * sum;
                    target.scales[half * 8 + lane] = column.scales[block];
                }
            }
        }
        Self {
            pairs,
            positions: columns.len(),
            blocks,
        }
    }
}

/// Computes rows `range` of every position of `pairs`; `outputs[p]` holds position `p`'s logits
/// for those rows.
fn rows_kernel(
    matrix: &Q8Matrix<'_>,
    pairs: &PairBlocks,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    // SAFETY: `compute_logits` checked that the CPU has the kernel's instructions.
    unsafe {
        match pairs.pairs {
            1 => rows_avx512::<1>(matrix, pairs, range, outputs),
            2 => rows_avx512::<2>(matrix, pairs, range, outputs),
            3 => rows_avx512::<3>(matrix, pairs, range, outputs),
            4 => rows_avx512::<4>(matrix, pairs, range, outputs),
            5 => rows_avx512::<5>(matrix, pairs, range, outputs),
            6 => rows_avx512::<6>(matrix, pairs, range, outputs),
            7 => rows_avx512::<7>(matrix, pairs, range, outputs),
            8 => rows_avx512::<8>(matrix, pairs, range, outputs),
            other => unreachable!("{other} pairs in one pass"),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn rows_avx512<const PAIRS: usize>(
    matrix: &Q8Matrix<'_>,
    pairs: &PairBlocks,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    let offset_weights = _mm512_set1_epi8(-128);
    let first_row = range.start;
    for row in range {
        let mut acc = [_mm512_setzero_ps(); PAIRS];
        for (block, weights) in matrix.row(row).iter().enumerate() {
            // SAFETY: a block holds 32 bytes; `loadu` has no alignment requirement.
            let x = unsafe { _mm256_loadu_si256(weights.values.as_ptr().cast()) };
            let x = _mm512_xor_si512(_mm512_broadcast_i64x4(x), offset_weights);
            let row_scale = _mm512_set1_ps(f16_to_f32(weights.scale));
            let batch = &pairs.blocks[block * PAIRS..(block + 1) * PAIRS];
            for (acc, pair) in acc.iter_mut().zip(batch) {
                // SAFETY: `PairBlock` is 64-byte aligned and each field is 64 bytes long.
                let (y, offsets, scales) = unsafe {
                    (
                        _mm512_load_si512(pair.values.as_ptr().cast()),
                        _mm512_load_si512(pair.offsets.as_ptr().cast()),
                        _mm512_load_ps(pair.scales.as_ptr()),
                    )
                };
                let sums = _mm512_dpbusd_epi32(offsets, x, y);
                let scale = _mm512_mul_ps(row_scale, scales);
                *acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), *acc);
            }
        }
        store_row(&acc, pairs, row - first_row, outputs);
    }
}

/// Sums each position's lanes as ggml does and stores the logit at `index` of its output.
#[target_feature(enable = "avx512f")]
fn store_row<const PAIRS: usize>(
    acc: &[__m512; PAIRS],
    pairs: &PairBlocks,
    index: usize,
    outputs: &mut [&mut [f32]],
) {
    let mut lanes = [0.0f32; 16];
    for (pair, acc) in acc.iter().enumerate() {
        // ggml's horizontal sum, within each 256-bit half: (a_k + a_{k+4}), then
        // (s0 + s2, s1 + s3), then their sum.
        let s = _mm512_add_ps(*acc, _mm512_shuffle_f32x4::<0b10_11_00_01>(*acc, *acc));
        let s = _mm512_add_ps(s, _mm512_permute_ps::<0b01_00_11_10>(s));
        let s = _mm512_add_ps(s, _mm512_permute_ps::<0b10_11_00_01>(s));
        // SAFETY: `lanes` holds 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), s) };
        let position = 2 * pair;
        outputs[position][index] = lanes[0];
        if position + 1 < pairs.positions {
            outputs[position + 1][index] = lanes[8];
        }
    }
}

/// `f16` bits to `f32` (exact).
fn f16_to_f32(bits: u16) -> f32 {
    // SAFETY: F16C is checked by `kernel_available` before any caller runs.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

/// `f32` to `f16` bits, rounding to nearest even, as ggml's `GGML_CPU_FP32_TO_FP16` on x86.
fn f32_to_f16(value: f32) -> u16 {
    // SAFETY: as in `f16_to_f32`.
    unsafe {
        _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(value))) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One logit as `ggml_vec_dot_q8_0_q8_0` (AVX2 form) computes it, written out in scalar code.
    fn reference_logit(row: &[BlockQ8_0], hidden: &[f32]) -> f32 {
        let column = QuantizedColumn::new(hidden);
        let mut acc = [0.0f32; 8];
        for (block, weights) in row.iter().enumerate() {
            let scale = f16_to_f32(weights.scale) * column.scales[block];
            for (lane, acc) in acc.iter_mut().enumerate() {
                let sum: i32 = (4 * lane..4 * lane + 4)
                    .map(|i| {
                        i32::from(weights.values[i]) * i32::from(column.values[block * BLOCK + i])
                    })
                    .sum();
                *acc = scale.mul_add(sum as f32, *acc);
            }
        }
        ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
    }

    /// xorshift64: deterministic test data without a dependency.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn random_matrix(rows: usize, columns: usize, state: &mut u64) -> Vec<BlockQ8_0> {
        (0..rows * columns / BLOCK)
            .map(|_| {
                let mut values = [0i8; BLOCK];
                // The full byte range, -128 included (llama.cpp's quantizer stops at -127).
                values.iter_mut().for_each(|v| *v = next(state) as i8);
                // Positive and negative f16 scales between about 1e-4 and 1e-1.
                let scale =
                    (0x0c00 + (next(state) % 0x2000) as u16) | (((next(state) % 2) as u16) << 15);
                BlockQ8_0 { scale, values }
            })
            .collect()
    }

    fn random_hidden(positions: usize, columns: usize, state: &mut u64) -> Vec<f32> {
        let mut hidden: Vec<f32> = (0..positions * columns)
            .map(|_| (next(state) % 2_000_001) as f32 / 1000.0 - 1000.0)
            .collect();
        // An all-zero block (scale 0) and a block with a value at exactly .5 after scaling.
        hidden[..BLOCK].fill(0.0);
        if hidden.len() >= 2 * BLOCK {
            hidden[BLOCK..2 * BLOCK].fill(1.0);
            hidden[BLOCK] = 254.0;
        }
        hidden
    }

    #[test]
    fn batched_logits_are_bit_identical_to_ggml_single_row_arithmetic() {
        if !kernel_available() {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        let (rows, columns) = (301, 96);
        let mut state = 0x9e37_79b9_7f4a_7c15;
        let blocks = random_matrix(rows, columns, &mut state);
        let matrix = Q8Matrix::new(&blocks, rows, columns);
        // 1 to 18 positions: odd counts leave a half-empty pair, and 17+ take two passes.
        for positions in 1..=18 {
            let hidden = random_hidden(positions, columns, &mut state);
            for threads in [1, 2, 3] {
                let mut logits = vec![f32::NAN; positions * rows];
                compute_logits(&matrix, &hidden, &mut logits, threads);
                for position in 0..positions {
                    let state = &hidden[position * columns..(position + 1) * columns];
                    for row in 0..rows {
                        let want = reference_logit(matrix.row(row), state);
                        let got = logits[position * rows + row];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{positions} positions on {threads} threads: position {position}, row {row}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn hidden_states_are_quantized_as_ggml_does() {
        let mut block = [0.5f32; BLOCK];
        block[0] = -127.0;
        block[1] = 63.5;
        block[2] = -0.25;
        let column = QuantizedColumn::new(&block);
        // Scale 1: values round to nearest, ties to even (`_mm256_round_ps`).
        assert_eq!(column.scales, vec![1.0]);
        assert_eq!(&column.values[..4], &[-127, 64, 0, 0]);
        let zeros = QuantizedColumn::new(&[0.0; BLOCK]);
        assert_eq!((zeros.scales[0], zeros.values[5]), (0.0, 0));
        // The scale is stored as f16: 1/3 rounds to 0.33325195.
        let third = QuantizedColumn::new(&[127.0 / 3.0; BLOCK]);
        assert_eq!(third.scales[0], 0.333_251_95);
        assert!(third.values.iter().all(|&v| v == 127));
    }
}
