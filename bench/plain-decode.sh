#!/usr/bin/env bash
# Plain decoding (no drafts) of spechost next to llama.cpp's own, same model, prompt length,
# thread count and machine, in one script; prints a markdown table with the ratio.
#
# spechost: `spechost run --cascade none --raw` on a fixed prompt, generation tok/s from --json.
# llama.cpp: `llama-bench -n N -d D` (token generation after a context of D tokens, D = the
# prompt length spechost reported), built by bench/llama-peer.sh from llama-cpp-python 0.3.36.
# Usage: bench/plain-decode.sh [THREADS] [TOKENS] [REPEATS]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
THREADS=${1:-$(nproc)}
TOKENS=${2:-128}
REPEATS=${3:-3}
PEER_BIN=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-bench)
PROMPT="$SPECHOST_ROOT/examples/prompts/edit.txt"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

echo "| model | threads | prompt tokens | spechost tok/s (median of $REPEATS) | llama.cpp tok/s | ratio |"
echo "|---|---|---|---|---|---|"
for model in smollm2 gemma3; do
    path=$("$SPECHOST_BIN" models path "$model")
    runs=()
    depth=0
    for _ in $(seq "$REPEATS"); do
        json=$("$SPECHOST_BIN" run --model "$path" --cascade none --raw --prompt-file "$PROMPT" \
            --max-tokens "$TOKENS" --threads "$THREADS" --json 2>&1 >/dev/null | tail -n 1)
        runs+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["tokens_per_second"]["generation"])' "$json")")
        depth=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["stats"]["prompt_tokens"])' "$json")
    done
    ours=$(printf '%s\n' "${runs[@]}" | median)
    theirs=$("$PEER_BIN/llama-bench" -m "$path" -t "$THREADS" -p 0 -n "$TOKENS" -d "$depth" \
        -r "$REPEATS" -o json 2>/dev/null \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
    ratio=$(python3 -c "print(f'{$ours/$theirs:.3f}')")
    printf '| %s | %s | %s | %.1f | %.1f | %s |\n' "$model" "$THREADS" "$depth" "$ours" "$theirs" "$ratio"
done
