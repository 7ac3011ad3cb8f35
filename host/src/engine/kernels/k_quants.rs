//! Matrix products of Q4_K and Q6_K weights (the K-quants of `Q4_K_M` models) with a batch of
//! `f32` rows, computed in one pass over the weights, bit for bit as llama.cpp's CPU backend
//! computes them one row at a time; for x86-64 with AVX2, FMA and F16C.
//!
//! Why: a `Q4_K_M` model keeps most of its layers in Q4_K and some in Q6_K (Gemma 3's attention
//! outputs and FFN down projections; nearly every layer of the 7-32B models users run), and
//! llama.cpp, built batch-invariant (`docs/exactness.md`), unpacks each 256-value super-block
//! and its 6- or 8-bit sub-block scales again for every batch row. Here each super-block is
//! unpacked once for up to [`ROWS_PER_PASS`] batch rows.
//!
//! Exactness: ggml's AVX2 `ggml_vec_dot_q4_K_q8_K` and `ggml_vec_dot_q6_K_q8_K` read the batch
//! row quantized by `quantize_row_q8_K` (called here, the same function) and, per super-block,
//! build eight integer lane sums (products of weight and activation bytes times the sub-block
//! scales; Q6_K subtracts its `32 ×` offset from the lanes through the activation's 16-value
//! sums), convert them to `f32` and fused-multiply-add them times `d_a × d_w` into eight lane
//! accumulators. Q4_K also fused-multiply-adds, into four more lanes, its sub-block minimums
//! times the activation's 32-value sums, times `-d_a × dmin_w`. Integer sums are exact whatever
//! their order, so only the lanes' composition and the float operations must be ggml's: the
//! result is the eight lanes summed as `((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7))`, plus (Q4_K) the
//! four minimum lanes summed as `(m0+m2)+(m1+m3)`. The unit tests compare every output with
//! ggml's own functions, linked from the same build.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::ffi::c_void;
use std::ops::Range;

use super::avx2::{Avx2Weights, ROWS_PER_PASS, lane_sum, quarter_sum};
use super::quant_matmul::{QuantBlock, QuantMatrix, f16_to_f32};

/// Values per super-block (ggml's `QK_K`).
const SUPER_BLOCK: usize = 256;

/// One Q4_K super-block as ggml stores it (`block_q4_K`): eight sub-blocks of 32 values, each
/// with a 6-bit scale and minimum, and the values' four bits; the weight is
/// `scale × sub_scale × bits - min_scale × sub_min`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ4K {
    /// The scale of the sub-block scales, as `f16` bits.
    scale: u16,
    /// The scale of the sub-block minimums, as `f16` bits.
    min_scale: u16,
    /// The eight 6-bit scales and eight 6-bit minimums, packed as ggml packs them.
    packed_scales: [u8; 12],
    /// Sub-blocks in pairs: byte `i` of pair `j` holds value `64j + i` in its low nibble and
    /// value `64j + 32 + i` in its high nibble.
    nibbles: [u8; SUPER_BLOCK / 2],
}

/// One Q6_K super-block as ggml stores it (`block_q6_K`): sixteen sub-blocks of 16 values with
/// signed 8-bit scales; the weight is `scale × sub_scale × (bits - 32)`, six bits per value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct BlockQ6K {
    /// The values' low four bits (ggml's `ql`).
    low: [u8; SUPER_BLOCK / 2],
    /// The values' high two bits (ggml's `qh`).
    high: [u8; SUPER_BLOCK / 4],
    /// The sixteen sub-block scales.
    sub_scales: [i8; SUPER_BLOCK / 16],
    /// The super-block's scale, as `f16` bits.
    scale: u16,
}

/// One batch row's super-block quantized by ggml (`block_q8_K`).
#[repr(C)]
#[derive(Clone, Copy)]
struct BlockQ8K {
    /// The scale.
    scale: f32,
    /// The 256 values.
    values: [i8; SUPER_BLOCK],
    /// Sums of the values in groups of 16.
    sums: [i16; SUPER_BLOCK / 16],
}

impl QuantBlock for BlockQ4K {
    const VALUES: usize = SUPER_BLOCK;
}

impl QuantBlock for BlockQ6K {
    const VALUES: usize = SUPER_BLOCK;
}

unsafe extern "C" {
    /// ggml's quantizer of a batch row for K-quant products (`ggml-cpu/arch/x86/quants.c`).
    fn quantize_row_q8_K(x: *const f32, y: *mut c_void, k: i64);
}

/// A super-block type: how it unpacks and adds its products with one batch row to the lanes.
trait SuperBlock: QuantBlock + Copy + Sync {
    /// The super-block ready to be multiplied with batch rows.
    type Unpacked;
    /// Whether products have a minimums part (added after the lanes' sum).
    const HAS_MINIMUMS: bool;

    /// Unpacks the weights and scales.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    unsafe fn unpack(&self) -> Self::Unpacked;

    /// Adds the products of `weights` with `activations` to `lanes` and `minimums`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    unsafe fn accumulate(
        weights: &Self::Unpacked,
        activations: &BlockQ8K,
        lanes: &mut __m256,
        minimums: &mut __m128,
    );
}

/// A Q4_K super-block unpacked: each pair of sub-blocks' low and high nibbles as bytes, their
/// scales broadcast to 16-bit lanes, the minimums and the two `f16` scales in `f32`.
struct UnpackedQ4K {
    low: [__m256i; 4],
    high: [__m256i; 4],
    low_scales: [__m256i; 4],
    high_scales: [__m256i; 4],
    minimums: __m128i,
    scale: f32,
    min_scale: f32,
}

impl BlockQ4K {
    /// The eight sub-block scales and eight minimums (ggml's `get_scale_min_k4`).
    fn sub_scales_and_minimums(&self) -> ([u8; 8], [u8; 8]) {
        let b = &self.packed_scales;
        let scales = std::array::from_fn(|i| {
            if i < 4 {
                b[i] & 0x3f
            } else {
                (b[i + 4] & 0x0f) | ((b[i - 4] >> 6) << 4)
            }
        });
        let minimums = std::array::from_fn(|i| {
            if i < 4 {
                b[i + 4] & 0x3f
            } else {
                (b[i + 4] >> 4) | ((b[i] >> 6) << 4)
            }
        });
        (scales, minimums)
    }
}

impl SuperBlock for BlockQ4K {
    type Unpacked = UnpackedQ4K;
    const HAS_MINIMUMS: bool = true;

    #[inline(always)]
    unsafe fn unpack(&self) -> UnpackedQ4K {
        // SAFETY: the caller guarantees the instructions; each pair of sub-blocks holds 32
        // bytes, and `loadu` has no alignment requirement.
        unsafe {
            let (sub_scales, minimums) = self.sub_scales_and_minimums();
            let nibble = _mm256_set1_epi8(0x0f);
            let pair = |j: usize| _mm256_loadu_si256(self.nibbles[32 * j..].as_ptr().cast());
            let minimums: [i16; 8] = std::array::from_fn(|i| i16::from(minimums[i]));
            UnpackedQ4K {
                low: std::array::from_fn(|j| _mm256_and_si256(pair(j), nibble)),
                high: std::array::from_fn(|j| {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(pair(j)), nibble)
                }),
                low_scales: std::array::from_fn(|j| {
                    _mm256_set1_epi16(i16::from(sub_scales[2 * j]))
                }),
                high_scales: std::array::from_fn(|j| {
                    _mm256_set1_epi16(i16::from(sub_scales[2 * j + 1]))
                }),
                minimums: _mm_loadu_si128(minimums.as_ptr().cast()),
                scale: f16_to_f32(self.scale),
                min_scale: f16_to_f32(self.min_scale),
            }
        }
    }

    #[inline(always)]
    unsafe fn accumulate(w: &UnpackedQ4K, a: &BlockQ8K, lanes: &mut __m256, minimums: &mut __m128) {
        // SAFETY: the caller guarantees the instructions; `a` holds 256 values and 16 sums.
        unsafe {
            let scale = a.scale * w.scale;
            let min_scale = -a.scale * w.min_scale;
            let sums = _mm256_loadu_si256(a.sums.as_ptr().cast());
            // The activation's eight 32-value sums (16-bit: at most 32 × 127).
            let sums = _mm_hadd_epi16(
                _mm256_castsi256_si128(sums),
                _mm256_extracti128_si256::<1>(sums),
            );
            let products = _mm_madd_epi16(w.minimums, sums);
            *minimums = _mm_fmadd_ps(_mm_set1_ps(min_scale), _mm_cvtepi32_ps(products), *minimums);
            let values = |at: usize| _mm256_loadu_si256(a.values[at..].as_ptr().cast());
            let mut sum = _mm256_setzero_si256();
            for j in 0..4 {
                let low = _mm256_maddubs_epi16(w.low[j], values(64 * j));
                let high = _mm256_maddubs_epi16(w.high[j], values(64 * j + 32));
                sum = _mm256_add_epi32(
                    sum,
                    _mm256_add_epi32(
                        _mm256_madd_epi16(w.low_scales[j], low),
                        _mm256_madd_epi16(w.high_scales[j], high),
                    ),
                );
            }
            *lanes = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sum), *lanes);
        }
    }
}

/// A Q6_K super-block unpacked: its 32-value groups as bytes (0 to 63), each group's two
/// sub-block scales in 16-bit lanes, the sixteen scales for the offset, the scale in `f32`.
struct UnpackedQ6K {
    values: [__m256i; 8],
    group_scales: [__m256i; 8],
    sub_scales: __m256i,
    scale: f32,
}

impl SuperBlock for BlockQ6K {
    type Unpacked = UnpackedQ6K;
    const HAS_MINIMUMS: bool = false;

    #[inline(always)]
    unsafe fn unpack(&self) -> UnpackedQ6K {
        // SAFETY: the caller guarantees the instructions; the loads stay inside the block's
        // arrays, and `loadu` has no alignment requirement.
        unsafe {
            let load = |bytes: &[u8]| _mm256_loadu_si256(bytes.as_ptr().cast());
            let nibble = _mm256_set1_epi8(0x0f);
            let mut values = [_mm256_setzero_si256(); 8];
            for half in 0..2 {
                let first = load(&self.low[64 * half..]);
                let second = load(&self.low[64 * half + 32..]);
                let high = load(&self.high[32 * half..]);
                // Bits 2k and 2k+1 of each high byte are the top of group k's value.
                let top = |k: u32| _mm256_and_si256(high, _mm256_set1_epi8((3u8 << (2 * k)) as i8));
                let tops = [
                    _mm256_slli_epi16::<4>(top(0)),
                    _mm256_slli_epi16::<2>(top(1)),
                    top(2),
                    _mm256_srli_epi16::<2>(top(3)),
                ];
                let bottoms = [
                    _mm256_and_si256(first, nibble),
                    _mm256_and_si256(second, nibble),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(first), nibble),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(second), nibble),
                ];
                for k in 0..4 {
                    values[4 * half + k] = _mm256_or_si256(bottoms[k], tops[k]);
                }
            }
            let sub_scale = |i: usize| _mm_set1_epi16(i16::from(self.sub_scales[i]));
            UnpackedQ6K {
                values,
                group_scales: std::array::from_fn(|g| {
                    _mm256_set_m128i(sub_scale(2 * g + 1), sub_scale(2 * g))
                }),
                sub_scales: _mm256_cvtepi8_epi16(_mm_loadu_si128(self.sub_scales.as_ptr().cast())),
                scale: f16_to_f32(self.scale),
            }
        }
    }

    #[inline(always)]
    unsafe fn accumulate(w: &UnpackedQ6K, a: &BlockQ8K, lanes: &mut __m256, _: &mut __m128) {
        // SAFETY: the caller guarantees the instructions; `a` holds 256 values and 16 sums.
        unsafe {
            // The values' `- 32`, as ggml takes it off: 32 × each scale × its 16-value sum.
            let offsets = _mm256_slli_epi32::<5>(_mm256_madd_epi16(
                _mm256_loadu_si256(a.sums.as_ptr().cast()),
                w.sub_scales,
            ));
            let mut sum = _mm256_setzero_si256();
            for g in 0..8 {
                let values = _mm256_loadu_si256(a.values[32 * g..].as_ptr().cast());
                let products = _mm256_maddubs_epi16(w.values[g], values);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(w.group_scales[g], products));
            }
            let sum = _mm256_sub_epi32(sum, offsets);
            let scale = a.scale * w.scale;
            *lanes = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sum), *lanes);
        }
    }
}

/// The batch rows of one pass quantized by ggml: super-block `b` of batch row `p` at
/// `p * blocks_per_row + b`.
pub(super) struct QuantizedBatchK {
    positions: usize,
    blocks_per_row: usize,
    blocks: Vec<BlockQ8K>,
}

impl QuantizedBatchK {
    /// Quantizes `inputs` (rows of `blocks_per_row` super-blocks) with ggml's own function.
    fn new(inputs: &[&[f32]], blocks_per_row: usize) -> Self {
        let empty = BlockQ8K {
            scale: 0.0,
            values: [0; SUPER_BLOCK],
            sums: [0; SUPER_BLOCK / 16],
        };
        let mut blocks = vec![empty; inputs.len() * blocks_per_row];
        for (input, row) in inputs.iter().zip(blocks.chunks_exact_mut(blocks_per_row)) {
            assert_eq!(input.len(), blocks_per_row * SUPER_BLOCK, "batch row width");
            // SAFETY: `input` holds `blocks_per_row` super-blocks of floats and `row` as many
            // `block_q8_K`s, whose layout `BlockQ8K` mirrors.
            unsafe {
                quantize_row_q8_K(input.as_ptr(), row.as_mut_ptr().cast(), input.len() as i64);
            }
        }
        Self {
            positions: inputs.len(),
            blocks_per_row,
            blocks,
        }
    }
}

/// The AVX2 kernels' entry for each super-block type (a blanket impl would overlap the
/// 32-value blocks' one).
macro_rules! avx2_weights {
    ($($block:ty),*) => {$(
        impl Avx2Weights for $block {
            type Batch = QuantizedBatchK;
            // Super-blocks convert their scales as they are unpacked.
            type Tile = ();

            fn quantize_batch(inputs: &[&[f32]], blocks_per_row: usize) -> QuantizedBatchK {
                QuantizedBatchK::new(inputs, blocks_per_row)
            }

            fn fill_tile(_: &QuantMatrix<'_, Self>, _: Range<usize>, _: usize, (): &mut ()) {}

            unsafe fn rows(
                matrix: &QuantMatrix<'_, Self>,
                (): &(),
                batch: &QuantizedBatchK,
                range: Range<usize>,
                outputs: &mut [&mut [f32]],
            ) {
                // SAFETY: the caller guarantees the instructions.
                unsafe { rows_avx2(matrix, batch, range, outputs) }
            }
        }
    )*};
}

avx2_weights!(BlockQ4K, BlockQ6K);

#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2<B: SuperBlock>(
    matrix: &QuantMatrix<'_, B>,
    batch: &QuantizedBatchK,
    range: Range<usize>,
    outputs: &mut [&mut [f32]],
) {
    let positions = batch.positions;
    assert!(positions <= ROWS_PER_PASS, "batch rows of one pass");
    let first_row = range.start;
    for row in range {
        let mut lanes = [_mm256_setzero_ps(); ROWS_PER_PASS];
        let mut minimums = [_mm_setzero_ps(); ROWS_PER_PASS];
        for (block, w) in matrix.row(row).iter().enumerate() {
            // SAFETY: this function's features include those `unpack` and `accumulate` need.
            let w = unsafe { w.unpack() };
            for position in 0..positions {
                let a = &batch.blocks[position * batch.blocks_per_row + block];
                // SAFETY: as above.
                unsafe { B::accumulate(&w, a, &mut lanes[position], &mut minimums[position]) };
            }
        }
        for position in 0..positions {
            let sum = lane_sum(lanes[position]);
            outputs[position][row - first_row] = if B::HAS_MINIMUMS {
                // ggml sums Q4_K's four minimum lanes as `(m0+m2)+(m1+m3)`.
                sum + quarter_sum(minimums[position])
            } else {
                sum
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kernels::avx2::tests::{
        Tested, VecDot, ggml_vec_dots, next, products_are_bit_identical_to_ggml_single_rows,
        random_half,
    };

    ggml_vec_dots!(ggml_vec_dot_q4_K_q8_K, ggml_vec_dot_q6_K_q8_K);

    fn quantize(input: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; input.len() / SUPER_BLOCK * size_of::<BlockQ8K>()];
        // SAFETY: `input` holds whole super-blocks and `out` as many `block_q8_K`s.
        unsafe { quantize_row_q8_K(input.as_ptr(), out.as_mut_ptr().cast(), input.len() as i64) };
        out
    }

    impl Tested for BlockQ4K {
        const DOT: VecDot = ggml_vec_dot_q4_K_q8_K;
        fn random(state: &mut u64) -> Self {
            Self {
                scale: random_half(state),
                min_scale: random_half(state),
                packed_scales: std::array::from_fn(|_| next(state) as u8),
                nibbles: std::array::from_fn(|_| next(state) as u8),
            }
        }
        fn quantize(input: &[f32]) -> Vec<u8> {
            quantize(input)
        }
    }

    impl Tested for BlockQ6K {
        const DOT: VecDot = ggml_vec_dot_q6_K_q8_K;
        fn random(state: &mut u64) -> Self {
            Self {
                low: std::array::from_fn(|_| next(state) as u8),
                high: std::array::from_fn(|_| next(state) as u8),
                sub_scales: std::array::from_fn(|_| next(state) as i8),
                scale: random_half(state),
            }
        }
        fn quantize(input: &[f32]) -> Vec<u8> {
            quantize(input)
        }
    }

    /// ggml's block layouts, which the structures mirror.
    #[test]
    fn blocks_have_ggml_sizes() {
        assert_eq!(size_of::<BlockQ4K>(), 144);
        assert_eq!(size_of::<BlockQ6K>(), 210);
        assert_eq!(size_of::<BlockQ8K>(), 292);
    }

    #[test]
    fn q4_k_products_are_bit_identical_to_ggml_single_rows() {
        // Gemma 3's attention output width.
        products_are_bit_identical_to_ggml_single_rows::<BlockQ4K>(1024);
    }

    #[test]
    fn q6_k_products_are_bit_identical_to_ggml_single_rows() {
        // Gemma 3's FFN down width.
        products_are_bit_identical_to_ggml_single_rows::<BlockQ6K>(2048);
    }
}
