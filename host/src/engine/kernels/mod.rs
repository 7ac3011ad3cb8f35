//! The host's own compute, for x86-64 with AVX-512 VNNI: the only unsafe code of the engine.
//!
//! - `quant_matmul`: matrix products of Q8_0, Q5_0 and Q4_0 weights with a batch of rows, in one
//!   pass over the weights, bit for bit as llama.cpp computes them one row at a time;
//! - `backend`: a ggml backend device through which llama.cpp hands those products of its
//!   batches to `quant_matmul`. Contexts check it bit-exact at creation (`engine::context`).
//!
//! Everything else of the engine goes through llama-cpp-2's safe API.

pub(super) mod backend;
mod quant_matmul;
