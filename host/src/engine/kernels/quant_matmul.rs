//! Matrix products of Q8_0, Q5_0 and Q4_0 weights with a batch of `f32` rows, computed in one pass
//! over the weights, bit for bit as llama.cpp's CPU backend computes them one row at a time.
//!
//! Why: llama.cpp, built batch-invariant (see `docs/exactness.md`), multiplies a weight matrix
//! with a batch by one vector dot product per (weight row, batch row), unpacking every weight
//! block again for every row of the batch: verifying `n` tokens costs close to `n` single-token
//! passes. Here each weight block is loaded and unpacked once and used for up to 16 batch rows,
//! and each block of those batch rows is loaded once for two weight rows (batches of more than
//! four rows).
//! `kernels::backend` hands it llama.cpp's products: on Gemma 3, its output layer (the
//! 262144 × 640 Q8_0 token embedding) and most of its layers (Q5_0); on Q4_0 models (the
//! default draft models, `spechost models quantize --type Q4_0`), every layer.
//!
//! Exactness: ggml's CPU kernels for these types (`ggml_vec_dot_q8_0_q8_0`,
//! `ggml_vec_dot_q5_0_q8_0` and `ggml_vec_dot_q4_0_q8_0`, their AVX2 form, which every x86 build
//! with AVX2 uses) first
//! quantize the batch row to Q8_0 (`quantize_row_q8_0`), then per 32-value block unpack the
//! weights to 32 signed bytes, take eight lane sums of four int8 products, convert them to
//! `f32`, and fused-multiply-add them, times (weight scale × row scale), into eight lane
//! accumulators in block order; finally the lanes are summed as
//! `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`. Integer lane sums are exact whichever instruction
//! computes them, so a kernel that keeps the lanes, the order of every float operation and the
//! quantization gives the same bits. The one here computes the lane sums of two batch rows with
//! one AVX-512 VNNI instruction (`vpdpbusd`, unsigned × signed bytes: the weight bytes are
//! offset by 128 and the offset's contribution, `-128 ×` the sum of four activation bytes, is
//! the accumulator's start). Sessions check the claim on the real model before using it.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::team;

unsafe extern "C" {
    /// ggml's quantizer of a batch row for Q8_0, Q5_0 and Q4_0 products
    /// (`ggml-cpu/arch/x86/quants.c`), for both kernels (`avx2` too).
    pub(super) fn quantize_row_q8_0(x: *const f32, y: *mut std::ffi::c_void, k: i64);
}

/// Values per block of the 32-value weight types (Q8_0, Q5_0, Q4_0, Q4_1) and of their
/// quantized batch rows.
pub(super) const BLOCK: usize = 32;

/// A block of quantized weights, as ggml stores it.
pub(super) trait QuantBlock {
    /// Values per block.
    const VALUES: usize = BLOCK;
}

impl QuantBlock for BlockQ8_0 {}
impl QuantBlock for BlockQ5_0 {}
impl QuantBlock for BlockQ4_0 {}

/// A block of quantized weights whose dot product with a Q8_0 block ggml computes as
/// `scale × scale × (lane sums of int8 products)`.
pub(super) trait WeightBlock: QuantBlock + Copy + Sync {
    /// The 32 weights as signed bytes, and the block's scale as `f16` bits.
    ///
    /// # Safety
    /// The CPU must have AVX-512 BW and VL ([`kernel_available`]).
    unsafe fn unpack(&self) -> (__m256i, u16);
}

/// One Q8_0 block as ggml stores it (`block_q8_0`): an `f16` scale and 32 signed bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ8_0 {
    /// The block's scale, as `f16` bits.
    pub(super) scale: u16,
    /// The quantized values.
    pub(super) values: [i8; BLOCK],
}

impl BlockQ8_0 {
    /// All zeros: room for a block that ggml's quantizer fills.
    const EMPTY: Self = Self {
        scale: 0,
        values: [0; BLOCK],
    };
}

impl WeightBlock for BlockQ8_0 {
    #[inline(always)]
    unsafe fn unpack(&self) -> (__m256i, u16) {
        // SAFETY: a block holds 32 bytes; `loadu` has no alignment requirement.
        let values = unsafe { _mm256_loadu_si256(self.values.as_ptr().cast()) };
        (values, self.scale)
    }
}

/// One Q5_0 block as ggml stores it (`block_q5_0`): an `f16` scale, the fifth bit of each
/// value, and their low four bits, two per byte; the weight is `(low | fifth << 4) - 16`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ5_0 {
    /// The block's scale, as `f16` bits.
    pub(super) scale: u16,
    /// Bit `i` is value `i`'s fifth bit.
    pub(super) high_bits: [u8; 4],
    /// Byte `i` holds value `i` in its low nibble and value `i + 16` in its high nibble.
    pub(super) low_bits: [u8; BLOCK / 2],
}

impl WeightBlock for BlockQ5_0 {
    #[inline(always)]
    unsafe fn unpack(&self) -> (__m256i, u16) {
        // SAFETY: the caller guarantees AVX-512 BW and VL.
        unsafe {
            let values = spread_nibbles(&self.low_bits);
            // `(low | fifth << 4) - 16` as a signed byte is `low` when the fifth bit is set,
            // and `low | 0xf0` when it is clear (ggml's `bytes_from_bits_32` + `andnot`).
            let clear = !u32::from_le_bytes(self.high_bits);
            let values = _mm256_or_si256(values, _mm256_maskz_set1_epi8(clear, 0xf0u8 as i8));
            (values, self.scale)
        }
    }
}

/// One Q4_0 block as ggml stores it (`block_q4_0`): an `f16` scale and the 32 values' four
/// bits, two per byte; the weight is `bits - 8`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ4_0 {
    /// The block's scale, as `f16` bits.
    pub(super) scale: u16,
    /// Byte `i` holds value `i` in its low nibble and value `i + 16` in its high nibble.
    pub(super) nibbles: [u8; BLOCK / 2],
}

impl WeightBlock for BlockQ4_0 {
    #[inline(always)]
    unsafe fn unpack(&self) -> (__m256i, u16) {
        // SAFETY: the caller guarantees AVX-512 BW and VL.
        unsafe {
            let values = _mm256_sub_epi8(spread_nibbles(&self.nibbles), _mm256_set1_epi8(8));
            (values, self.scale)
        }
    }
}

/// 32 four-bit values, two per byte (value `i` in byte `i`'s low nibble, value `i + 16` in its
/// high nibble), one per byte in order: ggml's `bytes_from_nibbles_32`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
pub(super) unsafe fn spread_nibbles(packed: &[u8; BLOCK / 2]) -> __m256i {
    // SAFETY: the caller guarantees AVX2; the load reads the 16 bytes of `packed`.
    unsafe {
        let packed = _mm_loadu_si128(packed.as_ptr().cast());
        let mask = _mm_set1_epi8(0x0f);
        let low = _mm_and_si128(packed, mask);
        let high = _mm_and_si128(_mm_srli_epi16::<4>(packed), mask);
        _mm256_set_m128i(high, low)
    }
}

/// A weight matrix of `rows` rows of `blocks_per_row` blocks, row `r` starting at block
/// `r × stride`.
#[derive(Clone, Copy)]
pub(super) struct QuantMatrix<'w, B> {
    blocks: &'w [B],
    rows: usize,
    blocks_per_row: usize,
    stride: usize,
}

impl<'w, B: QuantBlock> QuantMatrix<'w, B> {
    /// The matrix over `blocks`, `rows` rows of `columns` values each.
    ///
    /// # Panics
    /// When `columns` is not a multiple of the block's values or `blocks` does not hold the
    /// matrix.
    pub(super) fn new(blocks: &'w [B], rows: usize, columns: usize) -> Self {
        let matrix = Self::strided(blocks, rows, columns, columns / B::VALUES);
        assert_eq!(blocks.len(), rows * matrix.blocks_per_row, "matrix size");
        matrix
    }

    /// The matrix of `rows` rows of `columns` values each, `stride` blocks apart in `blocks`
    /// (rows of a larger layout, such as one head's rows of a KV cache).
    ///
    /// # Panics
    /// When `columns` is not a multiple of the block's values, rows would overlap or `blocks`
    /// does not hold them.
    pub(super) fn strided(blocks: &'w [B], rows: usize, columns: usize, stride: usize) -> Self {
        assert!(columns.is_multiple_of(B::VALUES), "rows are whole blocks");
        let blocks_per_row = columns / B::VALUES;
        assert!(stride >= blocks_per_row, "rows do not overlap");
        let needed = rows
            .checked_sub(1)
            .map_or(0, |last| last * stride + blocks_per_row);
        assert!(blocks.len() >= needed, "matrix size");
        Self {
            blocks,
            rows,
            blocks_per_row,
            stride,
        }
    }

    /// Number of rows (outputs per batch row).
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row (the width of a batch row).
    pub(super) fn columns(&self) -> usize {
        self.blocks_per_row * B::VALUES
    }

    /// The blocks of row `row`.
    pub(super) fn row(&self, row: usize) -> &'w [B] {
        &self.blocks[row * self.stride..][..self.blocks_per_row]
    }
}

/// Whether this CPU has the instructions of the batched kernel.
pub(super) fn kernel_available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
}

/// Batch rows per kernel pass: eight AVX-512 accumulators of two rows each.
const PAIRS_PER_PASS: usize = 8;

/// The product of `matrix` with each batch row of `inputs` (`matrix.columns()` values each):
/// `outputs[i]` gets `matrix.rows()` values for `inputs[i]`, exactly llama.cpp's. Runs on
/// `threads` threads of llama.cpp's OpenMP team.
///
/// # Panics
/// When [`kernel_available`] is false, or the sizes do not match.
pub(super) fn multiply<B: WeightBlock>(
    matrix: &QuantMatrix<'_, B>,
    inputs: &[&[f32]],
    outputs: &mut [&mut [f32]],
    threads: usize,
) {
    assert!(kernel_available(), "the batched kernel needs AVX-512 VNNI");
    assert_eq!(inputs.len(), outputs.len(), "one output per input");
    assert!(
        inputs.iter().all(|input| input.len() == matrix.columns()),
        "inputs are rows of the matrix's width"
    );
    assert!(
        outputs.iter().all(|output| output.len() == matrix.rows()),
        "outputs are columns of the matrix's height"
    );
    let pass_inputs: Vec<&[&[f32]]> = inputs.chunks(2 * PAIRS_PER_PASS).collect();
    let mut passes: Vec<PairBlocks> = team::map(&pass_inputs, threads, |pass_inputs| {
        PairBlocks::new(pass_inputs, matrix.blocks_per_row)
    });
    if let Some(first) = passes.first_mut() {
        first.streams_weights = true;
    }
    let row_bytes = matrix.blocks_per_row * std::mem::size_of::<B>();
    team::multiply_passes(
        row_bytes,
        &passes,
        2 * PAIRS_PER_PASS,
        outputs,
        threads,
        |_| (),
        |(), pairs, range, outputs| rows_kernel(matrix, pairs, range, outputs),
    );
}

/// `hidden` quantized into `blocks` (one per 32 values) by ggml's own `quantize_row_q8_0`, as its
/// single-row product quantizes a batch row.
fn quantize_column(hidden: &[f32], blocks: &mut [BlockQ8_0]) {
    assert_eq!(
        hidden.len(),
        blocks.len() * BLOCK,
        "one block per 32 values"
    );
    // SAFETY: `hidden` holds whole blocks of floats and `blocks` as many Q8_0 blocks, ggml's
    // `block_q8_0` layout.
    unsafe {
        quantize_row_q8_0(
            hidden.as_ptr(),
            blocks.as_mut_ptr().cast(),
            hidden.len() as i64,
        )
    };
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

impl PairBlock {
    /// Lays out one position's quantized block as half `half` (0 or 1) of this pair's.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,f16c")]
    fn set_half(&mut self, half: usize, quantized: &BlockQ8_0) {
        let range = half * BLOCK..(half + 1) * BLOCK;
        self.values[range].copy_from_slice(&quantized.values);
        // SAFETY: `values` holds 32 bytes; `offsets` and `scales` hold 16 values, eight per half.
        unsafe {
            let values = _mm256_loadu_si256(quantized.values.as_ptr().cast());
            // Each lane's sum of its four signed bytes (`vpdpbusd` with ones), times -128.
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), values);
            let offsets = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sums));
            _mm256_storeu_si256(self.offsets[half * 8..].as_mut_ptr().cast(), offsets);
            let scale = _mm256_set1_ps(f16_to_f32(quantized.scale));
            _mm256_storeu_ps(self.scales[half * 8..].as_mut_ptr(), scale);
        }
    }
}

/// The positions of one pass, as [`PairBlock`]s in block-major order.
struct PairBlocks {
    /// Whether this is the batch's first pass, which reads each tile of weights from memory (the
    /// passes after it find the tile in the cache): the kernel then prefetches the weights a few
    /// rows ahead. Without it a batch of two passes (17 to 32 rows) took 1.4-2.2x as long as
    /// with it on a 2-vCPU AMD EPYC (Zen 5), SmolLM2-135M's matrices on two threads.
    streams_weights: bool,
    pairs: usize,
    positions: usize,
    blocks: Vec<PairBlock>,
}

impl PairBlocks {
    /// The batch rows of one pass (at most `2 * PAIRS_PER_PASS`), quantized and laid out for
    /// the kernel, two rows per pair.
    fn new(inputs: &[&[f32]], blocks_per_row: usize) -> Self {
        let pairs = inputs.len().div_ceil(2);
        let empty = PairBlock {
            values: [0; 2 * BLOCK],
            offsets: [0; 16],
            scales: [0.0; 16],
        };
        let mut blocks = vec![empty; pairs * blocks_per_row];
        let mut column = vec![BlockQ8_0::EMPTY; blocks_per_row];
        for (position, input) in inputs.iter().enumerate() {
            quantize_column(input, &mut column);
            let (pair, half) = (position / 2, position % 2);
            for (block, quantized) in column.iter().enumerate() {
                // SAFETY: `multiply` checked that the CPU has the instructions.
                unsafe { blocks[block * pairs + pair].set_half(half, quantized) };
            }
        }
        Self {
            streams_weights: false,
            pairs,
            positions: inputs.len(),
            blocks,
        }
    }
}

/// Computes rows `range` for every batch row of `pairs`; `outputs[p]` holds batch row `p`'s
/// values for those rows.
fn rows_kernel<B: WeightBlock>(
    matrix: &QuantMatrix<'_, B>,
    pairs: &PairBlocks,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    let odd = pairs.positions % 2 == 1;
    // SAFETY: `multiply` checked that the CPU has the kernel's instructions.
    unsafe {
        match (pairs.pairs, odd) {
            (1, false) => rows_avx512::<B, 1, false>(matrix, pairs, range, outputs),
            (1, true) => rows_avx512::<B, 1, true>(matrix, pairs, range, outputs),
            (2, false) => rows_avx512::<B, 2, false>(matrix, pairs, range, outputs),
            (2, true) => rows_avx512::<B, 2, true>(matrix, pairs, range, outputs),
            (3, false) => rows_avx512::<B, 3, false>(matrix, pairs, range, outputs),
            (3, true) => rows_avx512::<B, 3, true>(matrix, pairs, range, outputs),
            (4, false) => rows_avx512::<B, 4, false>(matrix, pairs, range, outputs),
            (4, true) => rows_avx512::<B, 4, true>(matrix, pairs, range, outputs),
            (5, false) => rows_avx512::<B, 5, false>(matrix, pairs, range, outputs),
            (5, true) => rows_avx512::<B, 5, true>(matrix, pairs, range, outputs),
            (6, false) => rows_avx512::<B, 6, false>(matrix, pairs, range, outputs),
            (6, true) => rows_avx512::<B, 6, true>(matrix, pairs, range, outputs),
            (7, false) => rows_avx512::<B, 7, false>(matrix, pairs, range, outputs),
            (7, true) => rows_avx512::<B, 7, true>(matrix, pairs, range, outputs),
            (8, false) => rows_avx512::<B, 8, false>(matrix, pairs, range, outputs),
            (8, true) => rows_avx512::<B, 8, true>(matrix, pairs, range, outputs),
            (other, _) => unreachable!("{other} pairs in one pass"),
        }
    }
}

/// How many weight rows ahead the kernel prefetches.
const PREFETCH_ROWS: usize = 4;

/// Weight rows the kernel takes together: each pass block loaded once serves all of them.
const ROWS_PER_STEP: usize = 2;

/// Fewest pairs a pass needs for the kernel to take [`ROWS_PER_STEP`] weight rows together.
/// With one or two pairs (verify batches of up to four tokens) the weights stream from memory
/// faster a row at a time: measured on a 2-vCPU AMD EPYC with AVX-512 VNNI, a 40 MB Q8_0
/// matrix on two threads, three or four batch rows took about a fifth less time a row at a
/// time, five or six about a tenth more (docs/benchmarks-history.md, "Verify batches of three
/// and four tokens a weight row at a time").
const MIN_PAIRS_FOR_ROW_STEPS: usize = 3;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn rows_avx512<B: WeightBlock, const PAIRS: usize, const ODD: bool>(
    matrix: &QuantMatrix<'_, B>,
    pairs: &PairBlocks,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    let first_row = range.start;
    let mut row = range.start;
    while PAIRS >= MIN_PAIRS_FOR_ROW_STEPS && row + ROWS_PER_STEP <= range.end {
        // SAFETY: this function's features are the callee's.
        let accs = unsafe { accumulate::<B, PAIRS, ODD, ROWS_PER_STEP>(matrix, pairs, row) };
        for (step_row, acc) in accs.iter().enumerate() {
            store_row(acc, pairs, row + step_row - first_row, outputs);
        }
        row += ROWS_PER_STEP;
    }
    for row in row..range.end {
        // SAFETY: as above.
        let [acc] = unsafe { accumulate::<B, PAIRS, ODD, 1>(matrix, pairs, row) };
        store_row(&acc, pairs, row - first_row, outputs);
    }
}

/// The lane accumulators of weight rows `first_row..first_row + ROWS` with every batch row of
/// `pairs`: each (weight row, batch row) gets exactly the operations it would get alone, the
/// rows only share the loads of the pass's blocks. With `ODD` the last pair holds one batch
/// row, computed with 256-bit instructions into its accumulator's low half (the same
/// operations on the same lanes; on CPUs that split a 512-bit instruction in two, half the
/// work of a full pair).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn accumulate<B: WeightBlock, const PAIRS: usize, const ODD: bool, const ROWS: usize>(
    matrix: &QuantMatrix<'_, B>,
    pairs: &PairBlocks,
    first_row: usize,
) -> [[__m512; PAIRS]; ROWS] {
    let offset_weights = _mm512_set1_epi8(-128);
    let weight_rows: [&[B]; ROWS] = std::array::from_fn(|i| matrix.row(first_row + i));
    let row_bytes = std::mem::size_of_val(weight_rows[0]);
    let mut accs = [[_mm512_setzero_ps(); PAIRS]; ROWS];
    for block in 0..matrix.blocks_per_row {
        let mut xs = [_mm512_setzero_si512(); ROWS];
        let mut row_scales = [_mm512_setzero_ps(); ROWS];
        for ((x, row_scale), weights) in xs.iter_mut().zip(&mut row_scales).zip(&weight_rows) {
            if pairs.streams_weights {
                // Weights a few rows ahead, so that memory keeps streaming while the batch
                // rows are computed (a prefetch never faults, past the matrix's end included).
                _mm_prefetch::<_MM_HINT_T0>(
                    weights
                        .as_ptr()
                        .wrapping_add(block)
                        .cast::<i8>()
                        .wrapping_add(PREFETCH_ROWS * row_bytes),
                );
            }
            // SAFETY: this function's features include those `unpack` needs.
            let (unpacked, scale) = unsafe { weights[block].unpack() };
            *x = _mm512_xor_si512(_mm512_broadcast_i64x4(unpacked), offset_weights);
            *row_scale = _mm512_set1_ps(f16_to_f32(scale));
        }
        let batch = &pairs.blocks[block * PAIRS..(block + 1) * PAIRS];
        let (full, half) = batch.split_at(PAIRS - usize::from(ODD));
        if let [pair] = half {
            // SAFETY: `PairBlock` is 64-byte aligned; each field's first 32 bytes are the
            // first position's.
            let (y, offsets, scales) = unsafe {
                (
                    _mm256_load_si256(pair.values.as_ptr().cast()),
                    _mm256_load_si256(pair.offsets.as_ptr().cast()),
                    _mm256_load_ps(pair.scales.as_ptr()),
                )
            };
            for ((acc, x), row_scale) in accs.iter_mut().zip(&xs).zip(&row_scales) {
                let sums = _mm256_dpbusd_epi32(offsets, _mm512_castsi512_si256(*x), y);
                let scale = _mm256_mul_ps(_mm512_castps512_ps256(*row_scale), scales);
                let low = _mm512_castps512_ps256(acc[PAIRS - 1]);
                let low = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), low);
                acc[PAIRS - 1] = _mm512_castps256_ps512(low);
            }
        }
        for (pair_index, pair) in full.iter().enumerate() {
            // SAFETY: `PairBlock` is 64-byte aligned and each field is 64 bytes long.
            let (y, offsets, scales) = unsafe {
                (
                    _mm512_load_si512(pair.values.as_ptr().cast()),
                    _mm512_load_si512(pair.offsets.as_ptr().cast()),
                    _mm512_load_ps(pair.scales.as_ptr()),
                )
            };
            for ((acc, x), row_scale) in accs.iter_mut().zip(&xs).zip(&row_scales) {
                let sums = _mm512_dpbusd_epi32(offsets, *x, y);
                let scale = _mm512_mul_ps(*row_scale, scales);
                acc[pair_index] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[pair_index]);
            }
        }
    }
    accs
}

/// Sums each batch row's lanes as ggml does and stores the sum at `index` of its output.
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

/// `f16` bits to `f32` (exact), for both kernels (`avx2` too).
pub(super) fn f16_to_f32(bits: u16) -> f32 {
    // SAFETY: F16C is checked by this kernel's or `avx2`'s `kernel_available` before any caller
    // runs.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block's weights as signed bytes, written out in scalar code from ggml's layout.
    trait ScalarWeights: WeightBlock {
        fn weights(&self) -> [i32; BLOCK];
        fn scale_bits(&self) -> u16;
        fn random(state: &mut u64) -> Self;
    }

    impl ScalarWeights for BlockQ8_0 {
        fn weights(&self) -> [i32; BLOCK] {
            self.values.map(i32::from)
        }
        fn scale_bits(&self) -> u16 {
            self.scale
        }
        fn random(state: &mut u64) -> Self {
            let mut values = [0i8; BLOCK];
            // The full byte range, -128 included (llama.cpp's quantizer stops at -127).
            values.iter_mut().for_each(|v| *v = next(state) as i8);
            Self {
                scale: random_scale(state),
                values,
            }
        }
    }

    impl ScalarWeights for BlockQ5_0 {
        fn weights(&self) -> [i32; BLOCK] {
            let fifth = u32::from_le_bytes(self.high_bits);
            std::array::from_fn(|i| {
                i32::from(nibble(&self.low_bits, i)) + 16 * ((fifth >> i) & 1) as i32 - 16
            })
        }
        fn scale_bits(&self) -> u16 {
            self.scale
        }
        fn random(state: &mut u64) -> Self {
            let low_bits = random_bytes(state);
            Self {
                scale: random_scale(state),
                high_bits: (next(state) as u32).to_le_bytes(),
                low_bits,
            }
        }
    }

    impl ScalarWeights for BlockQ4_0 {
        fn weights(&self) -> [i32; BLOCK] {
            std::array::from_fn(|i| i32::from(nibble(&self.nibbles, i)) - 8)
        }
        fn scale_bits(&self) -> u16 {
            self.scale
        }
        fn random(state: &mut u64) -> Self {
            Self {
                nibbles: random_bytes(state),
                scale: random_scale(state),
            }
        }
    }

    /// Value `i` of 32 four-bit values packed as ggml packs them: the low nibbles of the 16
    /// bytes, then their high nibbles.
    fn nibble(packed: &[u8; BLOCK / 2], i: usize) -> u8 {
        if i < BLOCK / 2 {
            packed[i] & 0x0f
        } else {
            packed[i - BLOCK / 2] >> 4
        }
    }

    /// `N` random bytes.
    fn random_bytes<const N: usize>(state: &mut u64) -> [u8; N] {
        std::array::from_fn(|_| next(state) as u8)
    }

    /// Positive and negative f16 scales between about 1e-4 and 1e-1.
    fn random_scale(state: &mut u64) -> u16 {
        (0x0c00 + (next(state) % 0x2000) as u16) | (((next(state) % 2) as u16) << 15)
    }

    /// One output as ggml's single-row kernel (AVX2 form) computes it, in scalar code.
    fn reference_dot<B: ScalarWeights>(row: &[B], input: &[f32]) -> f32 {
        let column = quantized(input);
        let mut acc = [0.0f32; 8];
        for (weights, quantized) in row.iter().zip(&column) {
            let scale = f16_to_f32(weights.scale_bits()) * f16_to_f32(quantized.scale);
            let values = weights.weights();
            for (lane, acc) in acc.iter_mut().enumerate() {
                let sum: i32 = (4 * lane..4 * lane + 4)
                    .map(|i| values[i] * i32::from(quantized.values[i]))
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

    fn random_inputs(positions: usize, columns: usize, state: &mut u64) -> Vec<f32> {
        let mut inputs: Vec<f32> = (0..positions * columns)
            .map(|_| (next(state) % 2_000_001) as f32 / 1000.0 - 1000.0)
            .collect();
        // An all-zero block (scale 0) and a block with a value at exactly .5 after scaling.
        inputs[..BLOCK].fill(0.0);
        if inputs.len() >= 2 * BLOCK {
            inputs[BLOCK..2 * BLOCK].fill(1.0);
            inputs[BLOCK] = 254.0;
        }
        inputs
    }

    fn batched_products_match_single_rows<B: ScalarWeights>() {
        if !kernel_available() {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        // Enough rows for two threads to share them, and a remainder.
        let (rows, columns) = (301, 96);
        let mut state = 0x9e37_79b9_7f4a_7c15;
        let blocks: Vec<B> = (0..rows * columns / BLOCK)
            .map(|_| B::random(&mut state))
            .collect();
        let matrix = QuantMatrix::new(&blocks, rows, columns);
        // 1 to 18 batch rows: odd counts leave a half-empty pair, and 17+ take two passes.
        for positions in 1..=18 {
            let inputs = random_inputs(positions, columns, &mut state);
            let inputs: Vec<&[f32]> = inputs.chunks_exact(columns).collect();
            for threads in [1, 2, 3] {
                let mut outputs = vec![f32::NAN; positions * rows];
                let mut output_rows: Vec<&mut [f32]> = outputs.chunks_exact_mut(rows).collect();
                multiply(&matrix, &inputs, &mut output_rows, threads);
                for (position, input) in inputs.iter().enumerate() {
                    for row in 0..rows {
                        let want = reference_dot(matrix.row(row), input);
                        let got = outputs[position * rows + row];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{positions} rows on {threads} threads: batch row {position}, weight row {row}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn q8_0_products_are_bit_identical_to_ggml_single_row_arithmetic() {
        batched_products_match_single_rows::<BlockQ8_0>();
    }

    #[test]
    fn q5_0_products_are_bit_identical_to_ggml_single_row_arithmetic() {
        batched_products_match_single_rows::<BlockQ5_0>();
    }

    #[test]
    fn q4_0_products_are_bit_identical_to_ggml_single_row_arithmetic() {
        batched_products_match_single_rows::<BlockQ4_0>();
    }

    fn weights_unpack_as_ggml_lays_them_out<B: ScalarWeights>() {
        if !kernel_available() {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        let mut state = 0x1234_5678_9abc_def1;
        for _ in 0..100 {
            let block = B::random(&mut state);
            let mut unpacked = [0i8; BLOCK];
            // SAFETY: checked above.
            let (values, scale) = unsafe { block.unpack() };
            // SAFETY: `unpacked` holds 32 bytes.
            unsafe { _mm256_storeu_si256(unpacked.as_mut_ptr().cast(), values) };
            assert_eq!(unpacked.map(i32::from), block.weights());
            assert_eq!(scale, block.scale_bits());
        }
    }

    #[test]
    fn q5_0_weights_unpack_as_ggml_lays_them_out() {
        weights_unpack_as_ggml_lays_them_out::<BlockQ5_0>();
    }

    #[test]
    fn q4_0_weights_unpack_as_ggml_lays_them_out() {
        weights_unpack_as_ggml_lays_them_out::<BlockQ4_0>();
    }

    /// `input` quantized as the kernel quantizes a batch row.
    fn quantized(input: &[f32]) -> Vec<BlockQ8_0> {
        let mut blocks = vec![BlockQ8_0::EMPTY; input.len() / BLOCK];
        quantize_column(input, &mut blocks);
        blocks
    }

    #[test]
    fn batch_rows_are_quantized_by_ggml_into_its_block_layout() {
        let mut block = [0.5f32; BLOCK];
        block[0] = -127.0;
        block[1] = 63.5;
        block[2] = -0.25;
        let column = quantized(&block);
        // Scale 1: values round to nearest, ties to even (`_mm256_round_ps`).
        assert_eq!(f16_to_f32(column[0].scale), 1.0);
        assert_eq!(&column[0].values[..4], &[-127, 64, 0, 0]);
        let zeros = quantized(&[0.0; 2 * BLOCK]);
        assert_eq!(zeros.len(), 2);
        assert_eq!((f16_to_f32(zeros[1].scale), zeros[1].values[5]), (0.0, 0));
        // The scale is stored as f16: 1/3 rounds to 0.33325195.
        let third = quantized(&[127.0 / 3.0; BLOCK]);
        assert_eq!(f16_to_f32(third[0].scale), 0.333_251_95);
        assert!(third[0].values.iter().all(|&v| v == 127));
    }
}
