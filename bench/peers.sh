#!/usr/bin/env bash
# llama.cpp's own tools next to spechost, on exactly the prompts, model, threads, context and
# max_tokens of a `spechost bench` run (read from its results.json):
#   - plain decoding: llama-simple (4 threads: it takes no thread count) and llama-lookup
#     without drafts (K=0: the same tool and settings as the next row, the baseline of its speedup);
#   - prompt lookup: llama-lookup with each K of --draft-max (comma-separated), next to
#     spechost's `lookup K=K`, and at its best K next to every spechost cascade (best-lookup.md);
#   - a draft model (with --draft-model): llama-speculative-simple, next to spechost's
#     `<--draft-cascade> K=K`;
#   - the verify cost curve: llama-bench -p 1,2,4,8,16,32 at the first workload's curve depth,
#     next to spechost's (bench measures it).
# llama-server, with concurrent clients over HTTP, is measured next to `spechost serve` by
# bench/serve-scaling.sh (the same `spechost bench --clients` drives both), not here.
# The prompts are written by `spechost prompts` (chat template applied by spechost's target) and
# passed whole with -p, so every tool reads the same text; every answer is checked by bench's
# degenerate-output rule (`spechost check-outputs`), and a request is compared only where no
# answer to it, of any tool or pass, spechost's plain decoding included, echoes or loops.
# Tools are built by bench/llama-peer.sh.
# Prints three markdown tables and writes peers.md, best-lookup.md, verify-cost.md, peers.json and
# the tools' logs
# into --out.
#
# Usage: bench/peers.sh --bench-json RESULTS.json --out DIR [--draft-max K,K] [--draft-model GGUF]
#            [--draft-cascade NAME] [--requests N] [--repeat R] [--no-simple]
#   --requests N   only the first N requests of each workload (a quick check)
#   --repeat R     interleaved passes over the requests (medians), default 1
# Run it from the directory `spechost bench` ran in: workload paths in results.json are as given.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"

BENCH_JSON="" OUT=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --bench-json) BENCH_JSON=${args[i + 1]:-} ;;
        --out) OUT=${args[i + 1]:-} ;;
    esac
done
if [[ -z $BENCH_JSON || -z $OUT ]]; then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
[[ -f $BENCH_JSON ]] || { echo "error: $BENCH_JSON not found; run spechost bench --out DIR first" >&2; exit 1; }
[[ -x $SPECHOST_BIN ]] || { echo "error: $SPECHOST_BIN missing; build with cargo build --release -p spechost" >&2; exit 1; }

PEER_BIN=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-simple llama-lookup llama-speculative-simple llama-bench)

mkdir -p "$OUT"
python3 "$SPECHOST_ROOT/bench/peers.py" --spechost "$SPECHOST_BIN" --bin "$PEER_BIN" "$@"
