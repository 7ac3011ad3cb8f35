#!/usr/bin/env bash
# Prompt processing (issue 25): spechost against llama.cpp on the same model, prompt length and
# threads, in interleaved rounds so drift on a shared machine hits every column alike. Each
# round runs, for a prompt of about 512 tokens (2,300 characters of a license text) and one of
# about 1,900 (8,600 characters; bench/long-prompts.py):
#  - `spechost run --raw --max-tokens 1`, prompt tok/s;
#  - `llama-bench -p N` (N = spechost's prompt tokens, peer build of bench/llama-peer.sh) with
#    llama.cpp's defaults and with spechost's numerics (flash attention over a Q8_0 KV cache,
#    no repacking).
# Prints a markdown table of medians over the rounds, and each round's values.
# Usage: bench/prefill.sh [MODEL|GGUF] [ROUNDS] [THREADS]   (defaults: smollm2, 3, all cores)
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
MODEL=${1:-smollm2}
ROUNDS=${2:-3}
THREADS=${3:-$(nproc)}
PEER_BIN=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-bench)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# A default model's name, or a GGUF file (e.g. smollm2-q8's, made by `spechost bench --model smollm2-q8`).
if [[ -f $MODEL ]]; then path=$MODEL; else path=$("$SPECHOST_BIN" models path "$MODEL"); fi
for chars in 2300 8600; do
    "$SPECHOST_ROOT/bench/long-prompts.py" "$chars" 1 |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["prompt"])' \
            >"$WORK/prompt-$chars.txt"
done

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
prompt_speed() {
    "$SPECHOST_BIN" run --model "$path" --cascade none --raw --prompt-file "$1" \
        --max-tokens 1 --threads "$THREADS" --json 2>&1 >/dev/null | tail -n 1 |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print(round(j["tokens_per_second"]["prompt"], 1), j["stats"]["prompt_tokens"])'
}
llama_bench() {
    local tokens=$1
    shift
    "$PEER_BIN/llama-bench" -m "$path" -t "$THREADS" -p "$tokens" -n 0 -r 1 -o json "$@" \
        2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)[0]["avg_ts"], 1))'
}
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }

echo "Prompt processing, $MODEL, $THREADS threads, medians of $ROUNDS interleaved rounds (tok/s):"
echo
echo "| prompt tokens | spechost | llama-bench, spechost's numerics | llama-bench defaults | spechost / same numerics | spechost / defaults |"
echo "|--:|--:|--:|--:|--:|--:|"
rounds_text=""
for chars in 2300 8600; do
    declare -a host=() same=() defaults=()
    for _ in $(seq "$ROUNDS"); do
        read -r speed tokens < <(prompt_speed "$WORK/prompt-$chars.txt")
        host+=("$speed")
        defaults+=("$(llama_bench "$tokens")")
        same+=("$(llama_bench "$tokens" -fa 1 -ctk q8_0 -ctv q8_0 --repack 0)")
    done
    h=$(printf '%s\n' "${host[@]}" | median)
    s=$(printf '%s\n' "${same[@]}" | median)
    d=$(printf '%s\n' "${defaults[@]}" | median)
    echo "| $tokens | $h | $s | $d | $(ratio "$h" "$s") | $(ratio "$h" "$d") |"
    rounds_text+="$tokens tokens: spechost ${host[*]}; same numerics ${same[*]}; defaults ${defaults[*]}. "
done
echo
echo "Each round: $rounds_text"
