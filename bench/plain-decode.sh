#!/usr/bin/env bash
# Plain decoding (no drafts) of spechost next to llama.cpp's own, same model, prompt length,
# thread count and machine, in one script; prints a markdown table with the ratios.
#
# spechost: `spechost run --cascade none --raw` on a fixed prompt, generation tok/s from --json
# (median of REPEATS runs, interleaved with llama.cpp's).
# llama.cpp: `llama-bench -n N -d D` (token generation after a context of D tokens, D = the
# prompt length spechost reported), built by bench/llama-peer.sh from llama-cpp-python 0.3.36,
# once with spechost's numerics (flash attention, Q8_0 KV cache, no weight repacking: the batch-invariant
# configuration exact verification needs, see docs/exactness.md) and once with its defaults.
# Usage: bench/plain-decode.sh [THREADS] [TOKENS] [REPEATS]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
THREADS=${1:-$(nproc)}
TOKENS=${2:-128}
REPEATS=${3:-3}
PEER_BIN=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-bench)
PROMPT="$SPECHOST_ROOT/examples/prompts/edit.txt"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
json_field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }
ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }
llama_bench() {
    "$PEER_BIN/llama-bench" -m "$path" -t "$THREADS" -p 0 -n "$TOKENS" -d "$depth" \
        -r 1 -o json "$@" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])'
}

echo "| model | threads | context | spechost tok/s (median of $REPEATS) | llama.cpp, same numerics (FA on, Q8_0 KV, no repack) | ratio | llama.cpp defaults | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for model in smollm2 gemma3; do
    path=$("$SPECHOST_BIN" models path "$model")
    ours=() same=() defaults=()
    # Interleaved, one run of each per round, so drift on a shared machine hits all three alike.
    for _ in $(seq "$REPEATS"); do
        json=$("$SPECHOST_BIN" run --model "$path" --cascade none --raw --prompt-file "$PROMPT" \
            --max-tokens "$TOKENS" --threads "$THREADS" --json 2>&1 >/dev/null | tail -n 1)
        ours+=("$(json_field "$json" tokens_per_second.generation)")
        depth=$(json_field "$json" stats.prompt_tokens)
        same+=("$(llama_bench -fa 1 -ctk q8_0 -ctv q8_0 --repack 0)")
        defaults+=("$(llama_bench)")
    done
    ours=$(printf '%s\n' "${ours[@]}" | median)
    same=$(printf '%s\n' "${same[@]}" | median)
    defaults=$(printf '%s\n' "${defaults[@]}" | median)
    printf '| %s | %s | %s | %.1f | %.1f | %s | %.1f | %s |\n' "$model" "$THREADS" "$depth" "$ours" \
        "$same" "$(ratio "$ours" "$same")" "$defaults" "$(ratio "$ours" "$defaults")"
done
