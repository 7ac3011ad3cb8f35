#!/usr/bin/env bash
# The host's batched matrix products (engine/kernels/) against llama.cpp's own kernels for the
# same batches, in one script, in interleaved rounds so drift on a shared machine hits both
# alike. Each round runs spechost with its default (the host's products) and with
# --llama-matmul (llama.cpp computes every product) on:
#  - prompt processing: `spechost run --raw --max-tokens 1` on the longest `summarize` prompt,
#    prompt tok/s, next to `llama-bench -p N` (N = spechost's prompt tokens) with llama.cpp's
#    defaults and with spechost's numerics (flash attention over a Q8_0 KV cache, no repacking;
#    peer build of bench/llama-peer.sh);
#  - verify batches: `spechost bench`'s verify-cost curve (1 to 25 tokens) at the median prompt
#    of the first REQUESTS requests of WORKLOAD, and the speedup of `lookup,suffix` on them.
# Prints markdown tables: medians over the rounds, and each round's values.
# Usage: bench/host-products.sh [MODEL] [WORKLOAD] [ROUNDS] [THREADS] [REQUESTS]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
MODEL=${1:-smollm2}
WORKLOAD=${2:-extract}
ROUNDS=${3:-3}
THREADS=${4:-$(nproc)}
REQUESTS=${5:-4}
PEER_BIN=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-bench)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
head -n "$REQUESTS" "$SPECHOST_ROOT/examples/workloads/$WORKLOAD.jsonl" >"$WORK/$WORKLOAD.jsonl"
python3 - "$SPECHOST_ROOT/examples/workloads/summarize.jsonl" >"$WORK/prompt.txt" <<'PY'
import json, sys
requests = [json.loads(line) for line in open(sys.argv[1])]
print(max((r["messages"][-1]["content"] for r in requests), key=len))
PY
path=$("$SPECHOST_BIN" models path "$MODEL")

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
prompt_speed() {
    "$SPECHOST_BIN" run --model "$path" --cascade none --raw --prompt-file "$WORK/prompt.txt" \
        --max-tokens 1 --threads "$THREADS" --json "$@" 2>&1 >/dev/null | tail -n 1 |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print(round(j["tokens_per_second"]["prompt"], 1), j["stats"]["prompt_tokens"])'
}
llama_bench() {
    "$PEER_BIN/llama-bench" -m "$path" -t "$THREADS" -p "$prompt_tokens" -n 0 -r 1 -o json "$@" \
        2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)[0]["avg_ts"], 1))'
}
# Verify-cost curve (ms per batch of 1, 2, 4, 8, 16, 25 tokens) and the cascade's speedup.
verify_run() {
    local out="$WORK/bench-$1"
    shift
    "$SPECHOST_BIN" bench --model "$path" --workload "$WORK/$WORKLOAD.jsonl" \
        --cascade lookup,suffix --repeat 1 --threads "$THREADS" --out "$out" "$@" >/dev/null 2>&1
    python3 - "$out/results.json" <<'PY'
import json, sys
workload = json.load(open(sys.argv[1]))["workloads"][0]
curve = {p["tokens"]: p["micros"] / 1000 for p in workload["verify_cost"]["points"]}
speedup = [c["speedup"] for c in workload["configurations"] if c["cascade"]][0]
print(workload["verify_cost"]["context_tokens"], f"{speedup:.2f}",
      *(f"{curve[n]:.1f}" for n in (1, 2, 4, 8, 16, 25)))
PY
}

declare -a host_prompt llama_prompt defaults same host_verify llama_verify
for round in $(seq "$ROUNDS"); do
    read -r speed prompt_tokens < <(prompt_speed)
    host_prompt+=("$speed")
    read -r speed _ < <(prompt_speed --llama-matmul)
    llama_prompt+=("$speed")
    defaults+=("$(llama_bench)")
    same+=("$(llama_bench -fa 1 -ctk q8_0 -ctv q8_0 --repack 0)")
    host_verify+=("$(verify_run "host-$round")")
    llama_verify+=("$(verify_run "llama-$round" --llama-matmul)")
done

median_of() { printf '%s\n' "$@" | median; }
field() { local index=$1; shift; for line in "$@"; do echo "$line" | cut -d' ' -f"$index"; done; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
host=$(median_of "${host_prompt[@]}")
llama=$(median_of "${llama_prompt[@]}")
d=$(median_of "${defaults[@]}")
s=$(median_of "${same[@]}")
echo "Prompt of $prompt_tokens tokens, $MODEL, $THREADS threads, medians of $ROUNDS interleaved rounds (tok/s):"
echo
echo "| spechost (host products) | spechost --llama-matmul | llama-bench, spechost's numerics | llama-bench defaults | host / --llama-matmul | host / llama-bench defaults |"
echo "|--:|--:|--:|--:|--:|--:|"
echo "| $host | $llama | $s | $d | $(ratio "$host" "$llama") | $(ratio "$host" "$d") |"
echo
echo "Each round: host ${host_prompt[*]}; --llama-matmul ${llama_prompt[*]}; llama-bench same numerics ${same[*]}; defaults ${defaults[*]}."
echo
context=${host_verify[0]%% *}
echo "Verify batches at a context of $context tokens ($WORKLOAD, first $REQUESTS requests), ms per batch, medians:"
echo
echo "| tokens | host products | relative to 1 | --llama-matmul | relative to 1 | host / llama.cpp |"
echo "|--:|--:|--:|--:|--:|--:|"
index=3
for tokens in 1 2 4 8 16 25; do
    h=$(median_of $(field "$index" "${host_verify[@]}"))
    l=$(median_of $(field "$index" "${llama_verify[@]}"))
    h1=$(median_of $(field 3 "${host_verify[@]}"))
    l1=$(median_of $(field 3 "${llama_verify[@]}"))
    echo "| $tokens | $h | $(ratio "$h" "$h1") | $l | $(ratio "$l" "$l1") | $(ratio "$h" "$l") |"
    index=$((index + 1))
done
echo
echo "\`lookup,suffix\` over plain decoding in the same process: host products $(median_of $(field 2 "${host_verify[@]}"))x (rounds: $(field 2 "${host_verify[@]}" | tr '\n' ' ')), --llama-matmul $(median_of $(field 2 "${llama_verify[@]}"))x (rounds: $(field 2 "${llama_verify[@]}" | tr '\n' ' '))."
