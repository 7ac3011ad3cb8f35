//! The host's own compute, for x86-64: the only unsafe code of the engine.
//!
//! - `quant_matmul`: matrix products of Q8_0, Q5_0 and Q4_0 weights with a batch of rows, in one
//!   pass over the weights, bit for bit as llama.cpp computes them one row at a time (AVX-512
//!   VNNI);
//! - `avx2`: the same for Q4_1, Q8_0, Q5_0 and Q4_0 weights on CPUs with AVX2 only;
//! - `k_quants`: the same for Q4_K and Q6_K weights (`Q4_K_M` models), with AVX2;
//! - `attention`: flash attention of a batch's query rows over the Q8_0 KV cache, bit for bit as
//!   llama.cpp computes it one row at a time (AVX2);
//! - `exp`: the C library's `expf` of several values at once, bit for bit (attention's weights);
//! - `team`: the kernels' rows split among llama.cpp's OpenMP threads;
//! - `backend`: a ggml backend device through which llama.cpp hands those products of its
//!   batches to the kernels. Contexts check it bit-exact at creation (`engine::context`).
//!
//! Everything else of the engine goes through llama-cpp-2's safe API.

mod attention;
mod avx2;
pub(super) mod backend;
mod exp;
mod k_quants;
mod quant_matmul;
mod team;
