#!/usr/bin/env bash
# Plain decoding with the target's compute threads pinned (`--cpus LIST`) against the same run
# unpinned (the scheduler places them), same model, prompt, thread count and machine, interleaved
# so drift on a shared machine hits both sides alike; prints a markdown table of medians.
#
# spechost `run --cascade none --raw` on examples/prompts/edit.txt, generation tok/s from --json.
# Pinned runs also report where every thread ran (placement.threads in the JSON); the script
# checks that each compute thread stayed on LIST.
# Usage: bench/pinning.sh LIST [THREADS] [TOKENS] [REPEATS] [MODELS]
#   LIST     CPUs for --cpus, e.g. 0-95 (one per core on an EPYC 9655) or 0 (one of two vCPUs)
#   THREADS  --threads on both sides (default: what spechost plans for LIST)
#   MODELS   space-separated default model names (default: "smollm2 gemma3")
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
LIST=${1:?usage: bench/pinning.sh LIST [THREADS] [TOKENS] [REPEATS] [MODELS]}
THREADS=${2:-$("$SPECHOST_BIN" info --cpus "$LIST" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["plan"]["threads"])')}
TOKENS=${3:-128}
REPEATS=${4:-5}
MODELS=${5:-smollm2 gemma3}
PROMPT="$SPECHOST_ROOT/examples/prompts/edit.txt"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# Prints the generation tok/s of one run; with --cpus, fails if a compute thread left LIST.
tokens_per_second() {
    local json
    json=$("$SPECHOST_BIN" run --model "$path" --cascade none --raw --prompt-file "$PROMPT" \
        --max-tokens "$TOKENS" --threads "$THREADS" --json "$@" 2>&1 >/dev/null | tail -n 1)
    python3 -c '
import json, sys
report = json.loads(sys.argv[1])
plan = report["placement"]["plan"]
if plan["compute_cpus"] is not None:
    for thread in report["placement"]["threads"]:
        allowed = plan["auxiliary_cpus"] if thread["name"] == "spechost-epoch" and plan["auxiliary_cpus"] else plan["compute_cpus"]
        if thread["cpus"] != allowed:
            sys.exit(f"thread {thread} is not on {allowed}")
print(report["tokens_per_second"]["generation"])' "$json"
}

echo "| model | threads | unpinned tok/s (median of $REPEATS) | pinned to $LIST tok/s | pinned / unpinned |"
echo "|---|---|---|---|---|"
for model in $MODELS; do
    path=$("$SPECHOST_BIN" models path "$model")
    unpinned=() pinned=()
    for _ in $(seq "$REPEATS"); do
        unpinned+=("$(tokens_per_second)")
        pinned+=("$(tokens_per_second --cpus "$LIST")")
    done
    unpinned=$(printf '%s\n' "${unpinned[@]}" | median)
    pinned=$(printf '%s\n' "${pinned[@]}" | median)
    printf '| %s | %s | %.1f | %.1f | %s |\n' "$model" "$THREADS" "$unpinned" "$pinned" \
        "$(python3 -c "print(f'{$pinned/$unpinned:.3f}')")"
done
