//! `expf` of several values at once, bit for bit as the C library computes each one.
//!
//! Why: flash attention takes one `exp` per (query row, cache position) pair
//! ([`attention`](super::attention)), and ggml takes it from the C library's `expf`, one call at
//! a time. On a long prompt those calls are a large share of the attention's time.
//!
//! Exactness: glibc's `expf` on x86-64 with FMA (`__expf_fma`, ARM's optimized-routines
//! algorithm) computes, for `|x| < 88`, in `f64`: `z = x × 32/ln 2 + 1.5 × 2^52` (one fused
//! rounding), `k` its low bits, `r = x × 32/ln 2 - (z - 1.5 × 2^52)` (one fused rounding),
//! `s = 2^(k/32)` from a 32-entry table with `k / 32` added to its exponent, and
//! `((C0 r + C1) r² + (C2 r + 1)) × s` (fused where written so) rounded to `f32`. The same
//! operations in the same order on four `f64` lanes give the same bits; every other input
//! (large, infinite or NaN) goes to the C library itself. Whether this process's `expf` is that
//! one (it is chosen at load time, by CPU and C library) is checked once, on a sweep of inputs,
//! before the vector path is ever used: on any difference every value goes to the C library.

#![allow(unsafe_code)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// `2^(i/32)` as `f64` bits, minus `i << 47` (the table's entries with `i/32` taken out of the
/// exponent, so that adding `k << 47` for any `k` with `k % 32 == i` gives `2^(k/32)`).
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2`.
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// `1.5 × 2^52`: added to round to an integer in the low bits.
const SHIFT: u64 = 0x4338000000000000;
/// The polynomial's coefficients, highest degree first.
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;

/// The top 12 bits of `88.0f32` without its sign: inputs whose magnitude's top bits reach it
/// are left to the C library (overflow, underflow, infinities, NaN).
const LARGE_TOP_BITS: i32 = 0x42b;

/// Replaces every value of `values` with its `expf`, bit for bit as the C library's.
pub(super) fn exp_in_place(values: &mut [f32]) {
    if vector_path_is_exact() {
        // SAFETY: `vector_path_is_exact` checked the features.
        unsafe { exp_vector(values) }
    } else {
        exp_scalar(values);
    }
}

/// Every value through the C library's `expf`.
fn exp_scalar(values: &mut [f32]) {
    for value in values {
        *value = value.exp();
    }
}

/// Whether this CPU runs the vector path and it gives the C library's bits on a sweep of
/// inputs (once per process).
fn vector_path_is_exact() -> bool {
    static EXACT: OnceLock<bool> = OnceLock::new();
    *EXACT.get_or_init(|| {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return false;
        }
        let inputs = sweep(1 << 16);
        let mut vector = inputs.clone();
        // SAFETY: the features were detected.
        unsafe { exp_vector(&mut vector) };
        let exact = inputs
            .iter()
            .zip(&vector)
            .all(|(input, output)| input.exp().to_bits() == output.to_bits());
        if !exact {
            tracing::info!("the C library's expf is not the one the vector exp matches; attention takes it one value at a time");
        }
        exact
    })
}

/// `count` inputs spread evenly over the bit patterns of the `f32`s of both signs below 128 in
/// magnitude (both paths), with the edges and special values.
fn sweep(count: u32) -> Vec<f32> {
    let limit = 128.0f32.to_bits();
    let step = limit / count;
    (0..count)
        .flat_map(|i| {
            let magnitude = f32::from_bits(i * step);
            [magnitude, -magnitude]
        })
        .chain([
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            88.0,
            -88.0,
            f32::from_bits(88.0f32.to_bits() - 1),
            -f32::from_bits(88.0f32.to_bits() - 1),
            -87.5,
            -104.0,
        ])
        .collect()
}

/// The vector path, four values at a time, inputs out of its range through the C library.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_vector(values: &mut [f32]) {
    let mut quads = values.chunks_exact_mut(4);
    for quad in &mut quads {
        // SAFETY: `quad` holds four `f32`s.
        unsafe {
            let inputs = _mm_loadu_ps(quad.as_ptr());
            let small = small_lanes(inputs);
            let mut kept = [0.0f32; 4];
            if small != 0b1111 {
                _mm_storeu_ps(kept.as_mut_ptr(), inputs);
            }
            _mm_storeu_ps(quad.as_mut_ptr(), exp4(inputs));
            if small != 0b1111 {
                for (lane, (value, input)) in quad.iter_mut().zip(kept).enumerate() {
                    if small & (1 << lane) == 0 {
                        *value = input.exp();
                    }
                }
            }
        }
    }
    exp_scalar(quads.into_remainder());
}

/// A bit per lane of `x`: whether it is in the vector path's range (`|x| < 88`).
#[target_feature(enable = "avx2,fma")]
fn small_lanes(x: __m128) -> i32 {
    let top = _mm_and_si128(
        _mm_srli_epi32::<20>(_mm_castps_si128(x)),
        _mm_set1_epi32(0x7ff),
    );
    let small = _mm_cmplt_epi32(top, _mm_set1_epi32(LARGE_TOP_BITS));
    _mm_movemask_ps(_mm_castsi128_ps(small))
}

/// glibc's `__expf_fma` fast path on four values (meaningful in the [`small_lanes`]).
#[target_feature(enable = "avx2,fma")]
fn exp4(inputs: __m128) -> __m128 {
    let constant = |bits: u64| _mm256_set1_pd(f64::from_bits(bits));
    let x = _mm256_cvtps_pd(inputs);
    let inv_ln2_n = constant(INV_LN2_N);
    let shift = constant(SHIFT);
    let z = _mm256_fmadd_pd(inv_ln2_n, x, shift);
    let k = _mm256_castpd_si256(z);
    let k_rounded = _mm256_sub_pd(z, shift);
    let r = _mm256_fmsub_pd(inv_ln2_n, x, k_rounded);
    let index = _mm256_and_si256(k, _mm256_set1_epi64x(31));
    // SAFETY: the gather reads `TABLE` at indices below 32.
    let entry = unsafe { _mm256_i64gather_epi64::<8>(TABLE.as_ptr().cast::<i64>(), index) };
    let scale = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64::<47>(k)));
    let high = _mm256_fmadd_pd(constant(C0), r, constant(C1));
    let low = _mm256_fmadd_pd(constant(C2), r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(high, _mm256_mul_pd(r, r), low);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 7th `f32` bit pattern below 128 in magnitude, of both signs, through the vector
    /// path gives the C library's bits (on a machine whose `expf` it matches).
    #[test]
    fn the_vector_path_gives_the_c_librarys_bits() {
        if !vector_path_is_exact() {
            eprintln!("skipped: this machine's expf is not the vector path's");
            return;
        }
        let limit = 128.0f32.to_bits();
        let mut inputs: Vec<f32> = Vec::with_capacity(1 << 20);
        let mut mismatches = 0u64;
        for bits in (0..limit).step_by(7) {
            let magnitude = f32::from_bits(bits);
            inputs.extend([magnitude, -magnitude]);
            if inputs.len() >= 1 << 20 || bits + 7 >= limit {
                let mut outputs = inputs.clone();
                exp_in_place(&mut outputs);
                mismatches += inputs
                    .iter()
                    .zip(&outputs)
                    .filter(|(input, output)| input.exp().to_bits() != output.to_bits())
                    .count() as u64;
                inputs.clear();
            }
        }
        assert_eq!(mismatches, 0);
    }

    /// Odd lengths, special values and out-of-range inputs come back as the C library's.
    #[test]
    fn tails_and_special_values_are_the_c_librarys() {
        let inputs = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -90.0,
            89.0,
            -1e-30,
            -3.5,
        ];
        let mut outputs = inputs;
        exp_in_place(&mut outputs);
        for (input, output) in inputs.iter().zip(outputs) {
            assert_eq!(input.exp().to_bits(), output.to_bits(), "exp({input})");
        }
    }
}
