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
# passed whole with -p, so every tool reads the same text. Tools are built by bench/llama-peer.sh.
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

# The bench run's settings: prompts must be templated and capped exactly as it did.
mapfile -t settings < <(python3 - "$BENCH_JSON" <<'PY'
import json, sys
bench = json.load(open(sys.argv[1]))
print(bench["model"]); print(bench["ctx_size"]); print(bench["max_tokens_cap"] or "")
print(bench.get("prompt_style", "chat"))
for w in bench["workloads"]:
    print(w["path"])
PY
)
model=${settings[0]} ctx=${settings[1]} cap=${settings[2]} style=${settings[3]}
prompt_args=(--model "$model" --ctx-size "$ctx" --prompt-style "$style")
[[ -n $cap ]] && prompt_args+=(--max-tokens "$cap")
for path in "${settings[@]:4}"; do prompt_args+=(--workload "$path"); done
mkdir -p "$OUT"
"$SPECHOST_BIN" prompts "${prompt_args[@]}" --out "$OUT/prompts"

python3 "$SPECHOST_ROOT/bench/peers.py" --prompts "$OUT/prompts" --bin "$PEER_BIN" "$@"
