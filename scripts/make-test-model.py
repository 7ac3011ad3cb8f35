#!/usr/bin/env python3
"""Writes a tiny model for the tests that need an architecture no package registry ships.

    make-test-model.py moe TOKENIZER.gguf OUT.gguf [--experts-used N]

`moe`: a llama-architecture mixture of experts (Mixtral's layout: 8 experts, 2 used per
token), 2 layers of width 128 (heads of 32, the Q8_0 KV cache's block), random weights from a fixed seed (deterministic greedy output),
with the tokenizer and chat template of TOKENIZER.gguf (the SmolLM2 default model), so prompts
and outputs are real text. `--experts-used` writes another count of experts used per token into
the file itself (what `--experts` overrides at load time).

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

    rng = np.random.default_rng(SEED)

    def weights(*shape: int, scale: float = 0.2) -> np.ndarray:
        # numpy's shape is GGUF's reversed: (rows, columns) is ne = [columns, rows].
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head = EMBEDDING // HEADS
    writer.add_tensor("token_embd.weight", weights(vocab, EMBEDDING, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(EMBEDDING, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, EMBEDDING))
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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["moe"])
    parser.add_argument("tokenizer", help="a GGUF whose tokenizer the model takes")
    parser.add_argument("out", help="where to write the model")
    parser.add_argument("--experts-used", type=int, default=EXPERTS_USED)
    args = parser.parse_args()
    if not 1 <= args.experts_used <= EXPERTS:
        raise SystemExit(f"--experts-used must be between 1 and {EXPERTS}")
    write_moe(args.tokenizer, args.out, args.experts_used)


if __name__ == "__main__":
    main()
