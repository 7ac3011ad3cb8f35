#!/usr/bin/env bash
# Speculation with the `lookup` plugin next to plain decoding, on the fixture prompts of every
# workload category, for both default models, in one script: generation tok/s of each, the
# speedup, acceptance, whether the outputs matched, and the share of generation time spent
# outside the target's verify batches (drafting through the component boundary, sampling,
# detokenizing). Prints a markdown table.
# Usage: bench/cascade-overhead.sh [THREADS] [TOKENS] [DRAFT_MAX]
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
THREADS=${1:-$(nproc)}
TOKENS=${2:-128}
DRAFT_MAX=${3:-8}
PROMPTS="$SPECHOST_ROOT/tests/fixtures/prompts.jsonl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "| model | prompt | plain tok/s | lookup tok/s | speedup | acceptance | mean accepted/draft round | outside verify | same output |"
echo "|---|---|---|---|---|---|---|---|---|"
for model in smollm2 gemma3; do
    count=$(wc -l < "$PROMPTS")
    for i in $(seq 1 "$count"); do
        line=$(sed -n "${i}p" "$PROMPTS")
        id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$line")
        python3 -c 'import json,sys; print(json.loads(sys.argv[1])["messages"][0]["content"], end="")' "$line" > "$work/prompt"
        for cascade in none lookup; do
            "$SPECHOST_BIN" run --model "$model" --cascade "$cascade" --prompt-file "$work/prompt" \
                --max-tokens "$TOKENS" --draft-max "$DRAFT_MAX" --threads "$THREADS" --json \
                > "$work/$cascade.txt" 2> "$work/$cascade.err"
            tail -n 1 "$work/$cascade.err" > "$work/$cascade.json"
        done
        same=no
        cmp -s "$work/none.txt" "$work/lookup.txt" && same=yes
        python3 - "$work/none.json" "$work/lookup.json" "$model" "$id" "$same" <<'PY'
import json, sys
plain, spec = (json.load(open(p)) for p in sys.argv[1:3])
model, prompt, same = sys.argv[3:6]
p, s = plain["tokens_per_second"]["generation"], spec["tokens_per_second"]["generation"]
print(f"| {model} | {prompt} | {p:.1f} | {s:.1f} | {s/p:.2f}x | {100*spec['acceptance']:.1f}% "
      f"| {spec['mean_accepted_per_draft_round']:.2f} | {100*spec['overhead']:.2f}% | {same} |")
PY
    done
done
