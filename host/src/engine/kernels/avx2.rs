//! Matrix products of Q4_1, Q8_0, Q5_0 and Q4_0 weights with a batch of `f32` rows, computed in one
//! pass over the weights, bit for bit as llama.cpp's CPU backend computes them one row at a
//! time; for x86-64 with AVX2, FMA and F16C (no AVX-512 needed).
//!
//! Why: SmolLM2-135M, the default model, keeps its layers in Q4_1 and its output layer in Q8_0,
//! Gemma 3 its output layer in Q8_0 and most layers in Q5_0, and the default draft models are
//! Q4_0. llama.cpp, built batch-invariant
//! (`docs/exactness.md`), multiplies a weight matrix with a batch by one vector dot product per
//! (weight row, batch row), unpacking every weight block and converting its `f16` scale again
//! for each batch row. Here each weight block is unpacked once and used for up to
//! [`ROWS_PER_PASS`] batch rows, whose quantized blocks stay in cache, and the scale products of
//! a block with every row of the pass are one vector multiply (ggml computes each in a scalar
//! one): prompts and verify batches get faster, with the same bits. A prompt's many passes also
//! share what does not depend on the batch: a tile's weight scales are converted from `f16`
//! once for all of them ([`TileScales`]), the scale products of a run of blocks are computed
//! ahead of their integer products so that the inner loop broadcasts them from memory, and the
//! lane sums of a pass's eight accumulators are taken together ([`lane_sums`]). On CPUs with
//! AVX-512 VNNI, `quant_matmul` takes Q8_0, Q5_0 and Q4_0 instead.
//!
//! Exactness: ggml's AVX2 dot products (`ggml_vec_dot_q4_1_q8_1`, `ggml_vec_dot_q8_0_q8_0`,
//! `ggml_vec_dot_q5_0_q8_0`, `ggml_vec_dot_q4_0_q8_0`; builds for AVX-512 CPUs run the same
//! arithmetic) read the batch row quantized by `quantize_row_q8_1` (Q4_1) or `quantize_row_q8_0`
//! (called here, the same functions), and per 32-value block: take eight lane sums of four products
//! of weight and activation bytes (integer sums, exact whatever instruction makes them), convert
//! them to `f32`, and fused-multiply-add them times `d_w × d_a` into eight lane accumulators, in
//! block order; Q4_1 also adds `m_w × s_a` (the block's minimum times the activation block's scaled
//! sum) to a scalar. The result is the lanes summed as `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`, plus
//! Q4_1's scalar. The unit tests compare every output with ggml's own functions, linked from the
//! same build.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ffi::c_void;
use std::ops::Range;

use super::quant_matmul::{
    BLOCK, BlockQ4_0, BlockQ5_0, BlockQ8_0, QuantBlock, QuantMatrix, f16_to_f32, quantize_row_q8_0,
    spread_nibbles,
};
use super::team;

/// Weights the AVX2 kernels take: how a pass's batch rows are quantized for them, and the
/// kernel that multiplies a range of weight rows with them.
pub(super) trait Avx2Weights: QuantBlock + Copy + Sync + Sized {
    /// A pass's batch rows quantized as ggml quantizes them for this weight type.
    type Batch: Send + Sync;

    /// What the kernel reads of a tile of weight rows once for every pass of a batch.
    type Tile: Default;

    /// Quantizes `inputs` (at most [`ROWS_PER_PASS`] rows of `blocks_per_row` blocks).
    fn quantize_batch(inputs: &[&[f32]], blocks_per_row: usize) -> Self::Batch;

    /// Fills `tile` for rows `range` of `matrix`, which `passes` passes of batch rows will read
    /// (reusing its memory).
    fn fill_tile(
        matrix: &QuantMatrix<'_, Self>,
        range: Range<usize>,
        passes: usize,
        tile: &mut Self::Tile,
    );

    /// Computes rows `range` of `matrix` times each of `batch`'s rows into `outputs` (one
    /// slice of `range.len()` values per batch row); `tile` was filled for those rows.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn rows(
        matrix: &QuantMatrix<'_, Self>,
        tile: &Self::Tile,
        batch: &Self::Batch,
        range: Range<usize>,
        outputs: &mut [&mut [f32]],
    );
}

/// A 32-value weight block the kernel takes.
pub(super) trait Avx2Block: QuantBlock + Copy + Sync {
    /// How ggml quantizes the batch rows this block is multiplied with.
    const ACTIVATIONS: Activations;
    /// Whether the unpacked weights are signed bytes (the lane sums then go through ggml's
    /// `mul_sum_i8_pairs_float`: `|w|` times `a` with `w`'s sign) rather than unsigned ones.
    const SIGNED: bool;

    /// The 32 weights as bytes.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn values(&self) -> __m256i;

    /// The block's scale, as `f16` bits.
    fn scale(&self) -> u16;

    /// The block's minimum, as `f16` bits (0 when the type has none).
    fn min(&self) -> u16 {
        0
    }
}

impl<B: Avx2Block> Avx2Weights for B {
    type Batch = QuantizedBatch;
    type Tile = TileScales;

    fn quantize_batch(inputs: &[&[f32]], blocks_per_row: usize) -> QuantizedBatch {
        QuantizedBatch::new(inputs, blocks_per_row, B::ACTIVATIONS)
    }

    fn fill_tile(
        matrix: &QuantMatrix<'_, Self>,
        range: Range<usize>,
        passes: usize,
        tile: &mut TileScales,
    ) {
        tile.fill(matrix, range, passes);
    }

    unsafe fn rows(
        matrix: &QuantMatrix<'_, Self>,
        tile: &TileScales,
        batch: &QuantizedBatch,
        range: Range<usize>,
        outputs: &mut [&mut [f32]],
    ) {
        // SAFETY: the caller guarantees the instructions.
        unsafe { rows_kernel(matrix, tile, batch, range, outputs) }
    }
}

/// The scales (and Q4_1's minimums) of a tile of weight rows in `f32`, converted from `f16`
/// once for every pass of a batch of [`MIN_PASSES_FOR_TILE_SCALES`] passes or more (a prompt):
/// row `r` of the tile at `r * blocks_per_row`. A batch of fewer passes (a verify batch)
/// converts each block's scale where it multiplies the block.
#[derive(Default)]
pub(super) struct TileScales {
    converted: bool,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

impl TileScales {
    /// Converts the scales (and minimums) of rows `range` of `matrix` if `passes` is at least
    /// [`MIN_PASSES_FOR_TILE_SCALES`].
    fn fill<B: Avx2Block>(
        &mut self,
        matrix: &QuantMatrix<'_, B>,
        range: Range<usize>,
        passes: usize,
    ) {
        self.converted = passes >= MIN_PASSES_FOR_TILE_SCALES;
        self.scales.clear();
        self.mins.clear();
        if !self.converted {
            return;
        }
        let blocks = range.len() * matrix.columns() / BLOCK;
        let has_min = B::ACTIVATIONS == Activations::Q8_1;
        self.scales.reserve(blocks);
        if has_min {
            self.mins.reserve(blocks);
        }
        for row in range {
            for blocks in matrix.row(row).chunks(ROWS_PER_PASS) {
                let count = blocks.len();
                self.scales
                    .extend_from_slice(&halves_to_floats(blocks, B::scale)[..count]);
                if has_min {
                    self.mins
                        .extend_from_slice(&halves_to_floats(blocks, B::min)[..count]);
                }
            }
        }
    }
}

/// Passes of a batch from which a tile's weight scales are converted once for all of them; for
/// fewer, converting each block's scale where it is used costs less than storing and reloading.
const MIN_PASSES_FOR_TILE_SCALES: usize = 8;

/// The `f16` values `half` reads from up to eight blocks, as `f32` (converted together; zeros
/// past the blocks).
fn halves_to_floats<B>(blocks: &[B], half: impl Fn(&B) -> u16) -> [f32; ROWS_PER_PASS] {
    let mut halves = [0u16; ROWS_PER_PASS];
    for (bits, block) in halves.iter_mut().zip(blocks) {
        *bits = half(block);
    }
    let mut floats = [0.0f32; ROWS_PER_PASS];
    // SAFETY: F16C is checked by `kernel_available` before any kernel runs; both arrays hold
    // eight values.
    unsafe {
        let converted = _mm256_cvtph_ps(_mm_loadu_si128(halves.as_ptr().cast()));
        _mm256_storeu_ps(floats.as_mut_ptr(), converted);
    }
    floats
}

/// One Q4_1 block as ggml stores it (`block_q4_1`): an `f16` scale and minimum, and the 32
/// values' four bits, two per byte; the weight is `scale × bits + min`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ4_1 {
    /// The block's scale, as `f16` bits.
    scale: u16,
    /// The block's minimum, as `f16` bits.
    min: u16,
    /// Byte `i` holds value `i` in its low nibble and value `i + 16` in its high nibble.
    nibbles: [u8; BLOCK / 2],
}

impl QuantBlock for BlockQ4_1 {}

impl Avx2Block for BlockQ4_1 {
    const ACTIVATIONS: Activations = Activations::Q8_1;
    const SIGNED: bool = false;

    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: the caller guarantees the instructions.
        unsafe { spread_nibbles(&self.nibbles) }
    }

    fn scale(&self) -> u16 {
        self.scale
    }

    fn min(&self) -> u16 {
        self.min
    }
}

impl Avx2Block for BlockQ8_0 {
    const ACTIVATIONS: Activations = Activations::Q8_0;
    const SIGNED: bool = true;

    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: a block holds 32 bytes; `loadu` has no alignment requirement; the caller
        // guarantees the instructions.
        unsafe { _mm256_loadu_si256(self.values.as_ptr().cast()) }
    }

    fn scale(&self) -> u16 {
        self.scale
    }
}

impl Avx2Block for BlockQ5_0 {
    const ACTIVATIONS: Activations = Activations::Q8_0;
    const SIGNED: bool = true;

    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: the caller guarantees the instructions.
        unsafe {
            // `(low | fifth << 4) - 16` as a signed byte is `low` when the fifth bit is set and
            // `low | 0xf0` when it is clear (ggml's `bytes_from_bits_32` and `andnot`).
            let fifth_set = bit_mask_bytes(u32::from_le_bytes(self.high_bits));
            let high = _mm256_andnot_si256(fifth_set, _mm256_set1_epi8(0xf0u8 as i8));
            _mm256_or_si256(spread_nibbles(&self.low_bits), high)
        }
    }

    fn scale(&self) -> u16 {
        self.scale
    }
}

/// Byte `i` all ones where bit `i` of `bits` is set, zero where it is clear.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn bit_mask_bytes(bits: u32) -> __m256i {
    // SAFETY: the caller guarantees AVX2.
    unsafe {
        // Byte `i` gets byte `i / 8` of `bits`, then keeps only its bit `i % 8`.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
    }
}

impl Avx2Block for BlockQ4_0 {
    const ACTIVATIONS: Activations = Activations::Q8_0;
    const SIGNED: bool = true;

    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: the caller guarantees the instructions.
        unsafe { _mm256_sub_epi8(spread_nibbles(&self.nibbles), _mm256_set1_epi8(8)) }
    }

    fn scale(&self) -> u16 {
        self.scale
    }
}

/// How ggml quantizes a batch row for a weight type's dot product.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Activations {
    /// `block_q8_0`: an `f16` scale and 32 signed bytes.
    Q8_0,
    /// `block_q8_1`: an `f16` scale, the `f16` of the scale times the values' sum, and 32
    /// signed bytes.
    Q8_1,
}

impl Activations {
    /// Bytes of one quantized block.
    fn block_bytes(self) -> usize {
        match self {
            Self::Q8_0 => 2 + BLOCK,
            Self::Q8_1 => 4 + BLOCK,
        }
    }

    /// Quantizes `row` into `out` (`row.len() / 32` blocks) with ggml's own function.
    fn quantize(self, row: &[f32], out: &mut [u8]) {
        assert_eq!(
            out.len(),
            row.len() / BLOCK * self.block_bytes(),
            "quantized size"
        );
        let quantize = match self {
            Self::Q8_0 => quantize_row_q8_0,
            Self::Q8_1 => quantize_row_q8_1,
        };
        // SAFETY: `row` holds whole blocks of floats and `out` as many blocks of this layout.
        unsafe { quantize(row.as_ptr(), out.as_mut_ptr().cast(), row.len() as i64) };
    }
}

unsafe extern "C" {
    /// ggml's quantizer of a batch row for Q4_1 products (`ggml-cpu/arch/x86/quants.c`).
    fn quantize_row_q8_1(x: *const f32, y: *mut c_void, k: i64);
}

/// Whether this CPU has the kernel's instructions.
pub(super) fn kernel_available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Batch rows per pass over the weights: one AVX2 accumulator each, with room left for the
/// weights and the products.
pub(super) const ROWS_PER_PASS: usize = 8;
const _: () = assert!(
    ROWS_PER_PASS == 8,
    "a pass's scales are one vector of eight f32"
);

/// The product of `matrix` with each batch row of `inputs` (`matrix.columns()` values each):
/// `outputs[i]` gets `matrix.rows()` values for `inputs[i]`, exactly llama.cpp's. Runs on
/// `threads` threads of llama.cpp's OpenMP team.
///
/// # Panics
/// When [`kernel_available`] is false, or the sizes do not match.
pub(super) fn multiply<B: Avx2Weights>(
    matrix: &QuantMatrix<'_, B>,
    inputs: &[&[f32]],
    outputs: &mut [&mut [f32]],
    threads: usize,
) {
    assert!(
        kernel_available(),
        "the AVX2 kernel needs AVX2, FMA and F16C"
    );
    assert_eq!(inputs.len(), outputs.len(), "one output per input");
    assert!(
        inputs.iter().all(|input| input.len() == matrix.columns()),
        "inputs are rows of the matrix's width"
    );
    assert!(
        outputs.iter().all(|output| output.len() == matrix.rows()),
        "outputs are columns of the matrix's height"
    );
    let blocks_per_row = matrix.columns() / B::VALUES;
    // Passes of equal sizes (9 rows: 5 and 4, not 8 and 1): a pass's cost per row falls with its
    // size.
    let rows_per_pass = inputs
        .len()
        .div_ceil(inputs.len().div_ceil(ROWS_PER_PASS).max(1))
        .max(1);
    let pass_inputs: Vec<&[&[f32]]> = inputs.chunks(rows_per_pass).collect();
    let passes: Vec<B::Batch> = team::map(&pass_inputs, threads, |pass_inputs| {
        B::quantize_batch(pass_inputs, blocks_per_row)
    });
    let row_bytes = blocks_per_row * std::mem::size_of::<B>();
    team::multiply_passes(
        row_bytes,
        &passes,
        rows_per_pass,
        outputs,
        threads,
        |range| {
            let mut tile = B::Tile::default();
            B::fill_tile(matrix, range, passes.len(), &mut tile);
            tile
        },
        |tile, batch, range, outputs| {
            // SAFETY: `multiply` checked that the CPU has the kernel's instructions.
            unsafe { B::rows(matrix, tile, batch, range, outputs) };
        },
    );
}

/// The batch rows of one pass quantized by ggml for 32-value blocks, laid out block-major:
/// block `b` of batch row `p` at `b * positions + p`; its scale and (Q8_1) scaled sum already in
/// `f32`, at `[b][p]` of arrays padded with zeros to [`ROWS_PER_PASS`] rows, so that the kernel
/// loads a block's scales as one vector.
pub(super) struct QuantizedBatch {
    positions: usize,
    values: Vec<[i8; BLOCK]>,
    scales: Vec<[f32; ROWS_PER_PASS]>,
    scaled_sums: Vec<[f32; ROWS_PER_PASS]>,
}

impl QuantizedBatch {
    fn new(inputs: &[&[f32]], blocks_per_row: usize, activations: Activations) -> Self {
        let positions = inputs.len();
        assert!(positions <= ROWS_PER_PASS, "batch rows of one pass");
        let block_bytes = activations.block_bytes();
        let values_at = block_bytes - BLOCK;
        let mut quantized = vec![0u8; blocks_per_row * block_bytes];
        let mut batch = Self {
            positions,
            values: vec![[0; BLOCK]; blocks_per_row * positions],
            scales: vec![[0.0; ROWS_PER_PASS]; blocks_per_row],
            scaled_sums: vec![[0.0; ROWS_PER_PASS]; blocks_per_row],
        };
        for (position, input) in inputs.iter().enumerate() {
            activations.quantize(input, &mut quantized);
            for (block, bytes) in quantized.chunks_exact(block_bytes).enumerate() {
                let half = |offset: usize| u16::from_le_bytes([bytes[offset], bytes[offset + 1]]);
                batch.values[block * positions + position] =
                    std::array::from_fn(|i| bytes[values_at + i] as i8);
                batch.scales[block][position] = f16_to_f32(half(0));
                if activations == Activations::Q8_1 {
                    batch.scaled_sums[block][position] = f16_to_f32(half(2));
                }
            }
        }
        batch
    }
}

/// Dispatches [`rows_avx2`] on the pass's batch size.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
unsafe fn rows_kernel<B: Avx2Block>(
    matrix: &QuantMatrix<'_, B>,
    tile: &TileScales,
    batch: &QuantizedBatch,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    let kernel = match (batch.positions, tile.converted) {
        (1, false) => rows_avx2::<B, 1, false>,
        (2, false) => rows_avx2::<B, 2, false>,
        (3, false) => rows_avx2::<B, 3, false>,
        (4, false) => rows_avx2::<B, 4, false>,
        (5, false) => rows_avx2::<B, 5, false>,
        (6, false) => rows_avx2::<B, 6, false>,
        (7, false) => rows_avx2::<B, 7, false>,
        (8, false) => rows_avx2::<B, 8, false>,
        (1, true) => rows_avx2::<B, 1, true>,
        (2, true) => rows_avx2::<B, 2, true>,
        (3, true) => rows_avx2::<B, 3, true>,
        (4, true) => rows_avx2::<B, 4, true>,
        (5, true) => rows_avx2::<B, 5, true>,
        (6, true) => rows_avx2::<B, 6, true>,
        (7, true) => rows_avx2::<B, 7, true>,
        (8, true) => rows_avx2::<B, 8, true>,
        (other, _) => unreachable!("{other} batch rows in one pass"),
    };
    // SAFETY: the caller guarantees the instructions.
    unsafe { kernel(matrix, tile, batch, range, outputs) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2<B: Avx2Block, const POSITIONS: usize, const CONVERTED: bool>(
    matrix: &QuantMatrix<'_, B>,
    tile: &TileScales,
    batch: &QuantizedBatch,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    let ones = _mm256_set1_epi16(1);
    let has_min = B::ACTIVATIONS == Activations::Q8_1;
    let first_row = range.start;
    let blocks_per_row = matrix.columns() / BLOCK;
    if CONVERTED {
        assert_eq!(
            tile.scales.len(),
            range.len() * blocks_per_row,
            "the tile's scales"
        );
    }
    // ggml's `d_w × d_a` of a block with each batch row: one vector multiply per block (the same
    // bits as ggml's scalar ones: a multiply rounds each lane alone). For passes of several rows
    // they are computed for a run of blocks before the run's integer products and each is then
    // broadcast straight from memory; for fewer, each block's vector is computed in place and
    // its lanes broadcast from the register.
    let table = POSITIONS >= MIN_POSITIONS_FOR_SCALE_TABLE;
    let mut scale_products = [[0.0f32; ROWS_PER_PASS]; SCALE_RUN];
    for row in range {
        let at = (row - first_row) * blocks_per_row;
        let mut acc = [_mm256_setzero_ps(); POSITIONS];
        let mut minimums = _mm256_setzero_ps();
        for (run, weights) in matrix.row(row).chunks(SCALE_RUN).enumerate() {
            let first_block = run * SCALE_RUN;
            let blocks = first_block..first_block + weights.len();
            let activation_scales = &batch.scales[blocks.clone()];
            let scale_product = |block: usize, w: &B| {
                let scale = if CONVERTED {
                    tile.scales[at + first_block + block]
                } else {
                    f16_to_f32(w.scale())
                };
                // SAFETY: the array holds `ROWS_PER_PASS` (8) floats; no alignment is required.
                let activation_scales =
                    unsafe { _mm256_loadu_ps(activation_scales[block].as_ptr()) };
                _mm256_mul_ps(_mm256_set1_ps(scale), activation_scales)
            };
            if table {
                for (block, (products, w)) in scale_products.iter_mut().zip(weights).enumerate() {
                    // SAFETY: the array holds `ROWS_PER_PASS` (8) floats.
                    unsafe { _mm256_storeu_ps(products.as_mut_ptr(), scale_product(block, w)) };
                }
            }
            if has_min {
                let scaled_sums = &batch.scaled_sums[blocks];
                for (block, (w, scaled_sums)) in weights.iter().zip(scaled_sums).enumerate() {
                    let min = if CONVERTED {
                        tile.mins[at + first_block + block]
                    } else {
                        f16_to_f32(w.min())
                    };
                    // Two `f16` values multiply exactly in `f32`: ggml's `summs += m * s` gives
                    // these bits whether its compiler fuses the multiply and add or not.
                    // SAFETY: the array holds `ROWS_PER_PASS` (8) floats.
                    let scaled_sums = unsafe { _mm256_loadu_ps(scaled_sums.as_ptr()) };
                    let product = _mm256_mul_ps(_mm256_set1_ps(min), scaled_sums);
                    minimums = _mm256_add_ps(minimums, product);
                }
            }
            let values = batch.values[first_block * POSITIONS..].chunks_exact(POSITIONS);
            let blocks = weights.iter().zip(&scale_products).zip(values).enumerate();
            for (block, ((w, products), values)) in blocks {
                let values: &[[i8; BLOCK]; POSITIONS] =
                    values.try_into().expect("a block of every batch row");
                let in_register = if table {
                    _mm256_setzero_ps()
                } else {
                    scale_product(block, w)
                };
                // SAFETY: this function's features include those `values` needs.
                let x = unsafe { w.values() };
                // ggml's `mul_sum_i8_pairs_float` for signed weights: `|w|` and `a` with `w`'s
                // sign.
                let unsigned_x = if B::SIGNED { _mm256_sign_epi8(x, x) } else { x };
                for position in 0..POSITIONS {
                    // SAFETY: a block holds 32 bytes; `loadu` has no alignment requirement.
                    let y = unsafe { _mm256_loadu_si256(values[position].as_ptr().cast()) };
                    let y = if B::SIGNED { _mm256_sign_epi8(y, x) } else { y };
                    let sums = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(unsigned_x, y));
                    let product = if table {
                        _mm256_broadcast_ss(&products[position])
                    } else {
                        let lane = _mm256_set1_epi32(position as i32);
                        _mm256_permutevar8x32_ps(in_register, lane)
                    };
                    acc[position] =
                        _mm256_fmadd_ps(product, _mm256_cvtepi32_ps(sums), acc[position]);
                }
            }
        }
        let mut sums = [0.0f32; ROWS_PER_PASS];
        if POSITIONS >= MIN_POSITIONS_FOR_LANE_SUMS {
            let mut lanes = [_mm256_setzero_ps(); ROWS_PER_PASS];
            lanes[..POSITIONS].copy_from_slice(&acc);
            let row_sums = lane_sums(&lanes);
            // Adding a zero minimum could turn a `-0.0` into `+0.0`: types without one skip it.
            let row_sums = if has_min {
                _mm256_add_ps(row_sums, minimums)
            } else {
                row_sums
            };
            // SAFETY: the array holds `ROWS_PER_PASS` (8) floats.
            unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), row_sums) };
        } else {
            let mut row_minimums = [0.0f32; ROWS_PER_PASS];
            // SAFETY: the array holds `ROWS_PER_PASS` (8) floats.
            unsafe { _mm256_storeu_ps(row_minimums.as_mut_ptr(), minimums) };
            for position in 0..POSITIONS {
                let sum = lane_sum(acc[position]);
                sums[position] = if has_min {
                    sum + row_minimums[position]
                } else {
                    sum
                };
            }
        }
        for (output, sum) in outputs.iter_mut().zip(sums) {
            output[row - first_row] = sum;
        }
    }
}

/// Blocks whose scale products with a pass's rows are computed ahead of their integer products.
const SCALE_RUN: usize = 32;

/// Batch rows from which a pass computes its scale products ahead, a run of blocks at a time.
const MIN_POSITIONS_FOR_SCALE_TABLE: usize = 5;

/// Batch rows from which one pass's lane sums are taken together ([`lane_sums`]) rather than
/// one accumulator at a time.
const MIN_POSITIONS_FOR_LANE_SUMS: usize = 4;

/// Lane `p` is [`lane_sum`]`(acc[p])`, bit for bit: the same additions, in the same order, for
/// eight accumulators at once.
#[target_feature(enable = "avx")]
pub(super) fn lane_sums(acc: &[__m256; ROWS_PER_PASS]) -> __m256 {
    // `[h_p | h_q]`, `h_p[i] = acc[p][i + 4] + acc[p][i]`: `lane_sum`'s first addition.
    let halves = |p: usize, q: usize| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x31>(acc[p], acc[q]),
            _mm256_permute2f128_ps::<0x20>(acc[p], acc[q]),
        )
    };
    let (h04, h15, h26, h37) = (halves(0, 4), halves(1, 5), halves(2, 6), halves(3, 7));
    // `[h_p[0] + h_p[2], h_p[1] + h_p[3], the same of h_q | of h_{p+4}, of h_{q+4}]`:
    // `quarter_sum`'s first addition.
    let quarters = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    let (q01, q23) = (quarters(h04, h15), quarters(h26, h37));
    // Its last addition, lane `p` for accumulator `p`.
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(q01, q23),
        _mm256_shuffle_ps::<0b11_01_11_01>(q01, q23),
    )
}

/// ggml's `hsum_float_8`: `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`.
#[target_feature(enable = "avx")]
pub(super) fn lane_sum(acc: __m256) -> f32 {
    quarter_sum(_mm_add_ps(
        _mm256_extractf128_ps::<1>(acc),
        _mm256_castps256_ps128(acc),
    ))
}

/// Four lanes summed as ggml's horizontal sums end: `(s0+s2)+(s1+s3)`.
#[target_feature(enable = "sse3")]
pub(super) fn quarter_sum(s: __m128) -> f32 {
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// ggml's single-row dot product of a weight row with a quantized batch row.
    pub(in crate::engine::kernels) type VecDot = unsafe extern "C" fn(
        n: i32,
        s: *mut f32,
        bs: usize,
        vx: *const c_void,
        bx: usize,
        vy: *const c_void,
        by: usize,
        nrc: i32,
    );

    /// Declares ggml's single-row dot products, which share one signature ([`VecDot`]).
    macro_rules! ggml_vec_dots {
        ($($name:ident),*) => {
            unsafe extern "C" {
                $(
                    fn $name(
                        n: i32,
                        s: *mut f32,
                        bs: usize,
                        vx: *const c_void,
                        bx: usize,
                        vy: *const c_void,
                        by: usize,
                        nrc: i32,
                    );
                )*
            }
        };
    }
    pub(in crate::engine::kernels) use ggml_vec_dots;

    ggml_vec_dots!(
        ggml_vec_dot_q4_1_q8_1,
        ggml_vec_dot_q8_0_q8_0,
        ggml_vec_dot_q5_0_q8_0,
        ggml_vec_dot_q4_0_q8_0
    );

    unsafe extern "C" {
        /// Fills ggml's conversion tables (its `f16` to `f32` may read one).
        fn ggml_cpu_init();
    }

    /// A block type with random contents, and ggml's dot product for it and quantizer of its
    /// batch rows.
    pub(in crate::engine::kernels) trait Tested: Avx2Weights {
        const DOT: VecDot;
        fn random(state: &mut u64) -> Self;
        fn quantize(input: &[f32]) -> Vec<u8>;
    }

    /// A batch row quantized for 32-value blocks of `B`.
    fn quantize_for<B: Avx2Block>(input: &[f32]) -> Vec<u8> {
        let mut quantized = vec![0u8; input.len() / BLOCK * B::ACTIVATIONS.block_bytes()];
        B::ACTIVATIONS.quantize(input, &mut quantized);
        quantized
    }

    impl Tested for BlockQ4_1 {
        fn quantize(input: &[f32]) -> Vec<u8> {
            quantize_for::<Self>(input)
        }
        const DOT: VecDot = ggml_vec_dot_q4_1_q8_1;
        fn random(state: &mut u64) -> Self {
            Self {
                scale: random_half(state),
                min: random_half(state),
                nibbles: std::array::from_fn(|_| next(state) as u8),
            }
        }
    }

    impl Tested for BlockQ8_0 {
        fn quantize(input: &[f32]) -> Vec<u8> {
            quantize_for::<Self>(input)
        }
        const DOT: VecDot = ggml_vec_dot_q8_0_q8_0;
        fn random(state: &mut u64) -> Self {
            // The full byte range, -128 included (llama.cpp's quantizer stops at -127).
            Self {
                scale: random_half(state),
                values: std::array::from_fn(|_| next(state) as i8),
            }
        }
    }

    impl Tested for BlockQ5_0 {
        fn quantize(input: &[f32]) -> Vec<u8> {
            quantize_for::<Self>(input)
        }
        const DOT: VecDot = ggml_vec_dot_q5_0_q8_0;
        fn random(state: &mut u64) -> Self {
            Self {
                scale: random_half(state),
                high_bits: (next(state) as u32).to_le_bytes(),
                low_bits: std::array::from_fn(|_| next(state) as u8),
            }
        }
    }

    impl Tested for BlockQ4_0 {
        fn quantize(input: &[f32]) -> Vec<u8> {
            quantize_for::<Self>(input)
        }
        const DOT: VecDot = ggml_vec_dot_q4_0_q8_0;
        fn random(state: &mut u64) -> Self {
            Self {
                scale: random_half(state),
                nibbles: std::array::from_fn(|_| next(state) as u8),
            }
        }
    }

    /// What ggml computes for one weight row and one batch row.
    fn ggml_dot<B: Tested>(row: &[B], input: &[f32]) -> f32 {
        let quantized = B::quantize(input);
        let mut out = f32::NAN;
        // SAFETY: both rows hold `input.len() / 32` blocks of ggml's layouts.
        unsafe {
            B::DOT(
                input.len() as i32,
                &mut out,
                0,
                row.as_ptr().cast(),
                0,
                quantized.as_ptr().cast(),
                0,
                1,
            );
        }
        out
    }

    /// xorshift64: deterministic test data without a dependency.
    pub(in crate::engine::kernels) fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Positive and negative f16 values between about 1e-4 and 1e-1.
    pub(in crate::engine::kernels) fn random_half(state: &mut u64) -> u16 {
        (0x0c00 + (next(state) % 0x2000) as u16) | (((next(state) % 2) as u16) << 15)
    }

    /// SmolLM2's hidden size.
    const SMOLLM2_WIDTH: usize = 576;

    /// Checks [`multiply`] on a random matrix of `B` with `columns` columns against ggml's
    /// single-row dot products, bit for bit, for 1 to 18 batch rows on 1 to 3 threads.
    pub(in crate::engine::kernels) fn products_are_bit_identical_to_ggml_single_rows<B: Tested>(
        columns: usize,
    ) {
        if !kernel_available() {
            eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
            return;
        }
        // SAFETY: ggml's CPU set-up, idempotent.
        unsafe { ggml_cpu_init() };
        // Enough rows for two threads to share them, and a remainder.
        let rows = 301;
        let mut state = 0x9e37_79b9_7f4a_7c15;
        let blocks: Vec<B> = (0..rows * columns / B::VALUES)
            .map(|_| B::random(&mut state))
            .collect();
        let matrix = QuantMatrix::new(&blocks, rows, columns);
        // 1 to 18 batch rows: 9+ take two passes, 17+ three.
        for positions in 1..=18 {
            let mut inputs: Vec<f32> = (0..positions * columns)
                .map(|_| (next(&mut state) % 2_000_001) as f32 / 1000.0 - 1000.0)
                .collect();
            // An all-zero block (scale 0).
            inputs[..BLOCK].fill(0.0);
            let inputs: Vec<&[f32]> = inputs.chunks_exact(columns).collect();
            for threads in [1, 2, 3] {
                let mut outputs = vec![f32::NAN; positions * rows];
                let mut output_rows: Vec<&mut [f32]> = outputs.chunks_exact_mut(rows).collect();
                multiply(&matrix, &inputs, &mut output_rows, threads);
                for (position, input) in inputs.iter().enumerate() {
                    for row in 0..rows {
                        let want = ggml_dot(matrix.row(row), input);
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
    fn q4_1_products_are_bit_identical_to_ggml_single_rows() {
        products_are_bit_identical_to_ggml_single_rows::<BlockQ4_1>(SMOLLM2_WIDTH);
    }

    #[test]
    fn q8_0_products_are_bit_identical_to_ggml_single_rows() {
        products_are_bit_identical_to_ggml_single_rows::<BlockQ8_0>(SMOLLM2_WIDTH);
    }

    #[test]
    fn q5_0_products_are_bit_identical_to_ggml_single_rows() {
        products_are_bit_identical_to_ggml_single_rows::<BlockQ5_0>(SMOLLM2_WIDTH);
    }

    #[test]
    fn q4_0_products_are_bit_identical_to_ggml_single_rows() {
        products_are_bit_identical_to_ggml_single_rows::<BlockQ4_0>(SMOLLM2_WIDTH);
    }

    #[test]
    fn lane_sums_are_lane_sum_of_each_accumulator_bit_for_bit() {
        if !kernel_available() {
            eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
            return;
        }
        let specials = [
            0.0f32,
            -0.0,
            1e-45,
            -1e38,
            3e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let mut state = 0x2545_f491_4f6c_dd1d;
        for round in 0..2000u32 {
            let values: [[f32; 8]; ROWS_PER_PASS] = std::array::from_fn(|_| {
                std::array::from_fn(|_| {
                    let bits = next(&mut state);
                    if round.is_multiple_of(4) && bits.is_multiple_of(3) {
                        specials[(bits >> 8) as usize % specials.len()]
                    } else {
                        // Magnitudes far apart, so the order of the additions shows.
                        f32::from_bits(bits as u32 & 0xbfff_ffff)
                    }
                })
            });
            // SAFETY: `kernel_available` checked AVX2; each array holds eight floats.
            unsafe {
                let acc = values.map(|lanes| _mm256_loadu_ps(lanes.as_ptr()));
                let mut sums = [0.0f32; ROWS_PER_PASS];
                _mm256_storeu_ps(sums.as_mut_ptr(), lane_sums(&acc));
                for (p, (sum, acc)) in sums.iter().zip(acc).enumerate() {
                    let want = lane_sum(acc);
                    assert!(
                        sum.to_bits() == want.to_bits() || (sum.is_nan() && want.is_nan()),
                        "accumulator {p} of {:?}: {sum} against {want}",
                        values[p]
                    );
                }
            }
        }
    }
}
