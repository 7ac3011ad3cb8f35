#!/usr/bin/env python3
"""Writes a tiny model for the tests that need an architecture no package registry ships.

    make-test-model.py moe TOKENIZER.gguf OUT.gguf [--experts-used N]
    make-test-model.py mamba TOKENIZER.gguf OUT.gguf

`moe`: a llama-architecture mixture of experts (Mixtral's layout: 8 experts, 2 used per
token), 2 layers of width 128 (heads of 32, the Q8_0 KV cache's block), random weights from a fixed seed (deterministic greedy output),
with the tokenizer and chat template of TOKENIZER.gguf (the SmolLM2 default model), so prompts
and outputs are real text. `--experts-used` writes another count of experts used per token into
the file itself (what `--experts` overrides at load time).

`mamba`: a recurrent (state-space) model of llama.cpp's `mamba` architecture, 2 layers of width
128 (inner size 256, state 16, convolution 4), random weights from a fixed seed, the same
tokenizer: a target whose state cannot be rolled back with `seq_rm`.

Needs the `gguf` and `numpy` packages from PyPI (scripts/env.sh installs them into a venv in the
cache). Nothing it writes is committed.
"""

import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

EMBEDDING = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FEED_FORWARD = 128
EXPERTS = 8
EXPERTS_USED = 2
SEED = 2026


def copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    """Copies every `tokenizer.*` key of `reader`; returns the vocabulary size."""
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            item = field.types[1]
            values = [field.parts[index] for index in field.data]
            if item == GGUFValueType.STRING:
                values = [bytes(value).decode("utf-8") for value in values]
            else:
                values = [value.tolist()[0] for value in values]
            writer.add_array(key, values)
            if key == "tokenizer.ggml.tokens":
                vocab = len(values)
        elif kind == GGUFValueType.STRING:
            writer.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(key, bool(field.parts[field.data[0]][0]))
        elif kind == GGUFValueType.UINT32:
            writer.add_uint32(key, int(field.parts[field.data[0]][0]))
        elif kind == GGUFValueType.INT32:
            writer.add_int32(key, int(field.parts[field.data[0]][0]))
        elif kind == GGUFValueType.FLOAT32:
            writer.add_float32(key, float(field.parts[field.data[0]][0]))
        else:
            raise SystemExit(f"tokenizer key {key} has a type this script does not copy: {kind}")
    return vocab


def random_weights():
    """A generator of F32 weights from the fixed seed: `weights(rows, columns, scale=...)`."""
    rng = np.random.default_rng(SEED)

    def weights(*shape: int, scale: float = 0.2) -> np.ndarray:
        # numpy's shape is GGUF's reversed: (rows, columns) is ne = [columns, rows].
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return weights


def add_embeddings(writer: GGUFWriter, weights, vocab: int) -> None:
    """The token embeddings, the output norm and the output layer every model here has."""
    writer.add_tensor("token_embd.weight", weights(vocab, EMBEDDING, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(EMBEDDING, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, EMBEDDING))


def write(writer: GGUFWriter) -> None:
    """Writes the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_moe(tokenizer: str, out: str, experts_used: int) -> None:
    reader = GGUFReader(tokenizer)
    writer = GGUFWriter(out, "llama")
    writer.add_name("spechost test MoE")
    vocab = copy_tokenizer(reader, writer)
    writer.add_context_length(2048)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(EMBEDDING // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(experts_used)
    writer.add_file_type(0)  # all F32

    weights = random_weights()

    head = EMBEDDING // HEADS
    add_embeddings(writer, weights, vocab)
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(EMBEDDING, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weights(EMBEDDING, EMBEDDING))
        writer.add_tensor(f"{block}.attn_k.weight", weights(KV_HEADS * head, EMBEDDING))
        writer.add_tensor(f"{block}.attn_v.weight", weights(KV_HEADS * head, EMBEDDING))
        writer.add_tensor(f"{block}.attn_output.weight", weights(EMBEDDING, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(EMBEDDING, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate_inp.weight", weights(EXPERTS, EMBEDDING, scale=1.0))
        writer.add_tensor(f"{block}.ffn_gate_exps.weight", weights(EXPERTS, FEED_FORWARD, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_up_exps.weight", weights(EXPERTS, FEED_FORWARD, EMBEDDING))
        writer.add_tensor(f"{block}.ffn_down_exps.weight", weights(EXPERTS, EMBEDDING, FEED_FORWARD))
    write(writer)


def write_mamba(tokenizer: str, out: str) -> None:
    reader = GGUFReader(tokenizer)
    writer = GGUFWriter(out, "mamba")
    writer.add_name("spechost test Mamba")
    vocab = copy_tokenizer(reader, writer)
    inner, state, conv, rank = 2 * EMBEDDING, 16, 4, EMBEDDING // 16
    writer.add_context_length(2048)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_ssm_conv_kernel(conv)
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_state_size(state)
    writer.add_ssm_time_step_rank(rank)
    writer.add_vocab_size(vocab)
    writer.add_file_type(0)  # all F32

    weights = random_weights()

    add_embeddings(writer, weights, vocab)
    # A = -exp(A_log) with Mamba's initialisation A_log = log(1..state); dt's bias is the inverse
    # softplus of 0.01, so each step keeps most of the state.
    a = -np.tile(np.arange(1, state + 1, dtype=np.float32), (inner, 1))
    dt_bias = np.full(inner, np.log(np.expm1(0.01)), dtype=np.float32)
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(EMBEDDING, dtype=np.float32))
        writer.add_tensor(f"{block}.ssm_in.weight", weights(2 * inner, EMBEDDING))
        writer.add_tensor(f"{block}.ssm_conv1d.weight", weights(inner, conv, scale=0.5))
        writer.add_tensor(f"{block}.ssm_conv1d.bias", np.zeros(inner, dtype=np.float32))
        writer.add_tensor(f"{block}.ssm_x.weight", weights(rank + 2 * state, inner, scale=0.1))
        writer.add_tensor(f"{block}.ssm_dt.weight", weights(inner, rank, scale=0.1))
        writer.add_tensor(f"{block}.ssm_dt.bias", dt_bias)
        writer.add_tensor(f"{block}.ssm_a", a)
        writer.add_tensor(f"{block}.ssm_d", np.ones(inner, dtype=np.float32))
        writer.add_tensor(f"{block}.ssm_out.weight", weights(EMBEDDING, inner, scale=0.1))
    write(writer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["moe", "mamba"])
    parser.add_argument("tokenizer", help="a GGUF whose tokenizer the model takes")
    parser.add_argument("out", help="where to write the model")
    parser.add_argument("--experts-used", type=int, default=EXPERTS_USED)
    args = parser.parse_args()
    if not 1 <= args.experts_used <= EXPERTS:
        raise SystemExit(f"--experts-used must be between 1 and {EXPERTS}")
    if args.kind == "mamba":
        write_mamba(args.tokenizer, args.out)
    else:
        write_moe(args.tokenizer, args.out, args.experts_used)


if __name__ == "__main__":
    main()
