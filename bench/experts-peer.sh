#!/usr/bin/env bash
# `--experts` and `--override-kv` against llama.cpp's own `--override-kv`: on the generated
# mixture-of-experts test model (scripts/make-test-model.py moe: 8 experts, 2 used, random F32
# weights, SmolLM2's tokenizer), `spechost run --raw` and llama.cpp's llama-completion (built by
# bench/llama-peer.sh) continue the same prompts greedily, with the file's 2 experts and with
# 1 expert per token (spechost `--experts 1`, llama-completion `--override-kv llama.expert_used_count=int:1`).
# Both run llama.cpp's numerics for this model's shapes (F32 weights, flash attention, Q8_0 KV
# cache, one thread so no split changes a sum); the check is that each pair of outputs is the
# same text, and that 1 expert changes it.
#
# Usage: bench/experts-peer.sh [--out DIR] [--tokens N]
# Prints a markdown table and exits 1 if an output differs from llama.cpp's.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"

OUT="" TOKENS=32
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --tokens) TOKENS=$2; shift 2 ;;
        *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

install_gguf_writer >&2
PEER=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-completion)
MODEL=$OUT/moe-2.gguf
[[ -f $MODEL ]] || "$SPECHOST_GGUF_PYTHON" "$SPECHOST_ROOT/scripts/make-test-model.py" moe \
    "$("$SPECHOST_BIN" models path smollm2)" "$MODEL" >&2

PROMPTS=("The sea is" "Once upon a time" "def fibonacci(n):")
status=0
echo "| prompt | experts | spechost = llama.cpp | changed by 1 expert |"
echo "|---|--:|---|---|"
for index in "${!PROMPTS[@]}"; do
    prompt=${PROMPTS[index]}
    declare -A text=()
    for experts in 2 1; do
        spechost_args=() peer_args=()
        if [[ $experts == 1 ]]; then
            spechost_args=(--experts 1)
            peer_args=(--override-kv llama.expert_used_count=int:1)
        fi
        "$SPECHOST_BIN" run --model "$MODEL" --raw --prompt "$prompt" --max-tokens "$TOKENS" \
            --cascade none --threads 1 "${spechost_args[@]}" \
            >"$OUT/spechost-$index-$experts.txt" 2>"$OUT/spechost-$index-$experts.log"
        # llama-completion echoes the prompt, then the continuation.
        "$PEER/llama-completion" -m "$MODEL" -p "$prompt" -n "$TOKENS" --temp 0 -no-cnv --no-warmup \
            -t 1 -fa on -ctk q8_0 -ctv q8_0 -c 512 "${peer_args[@]}" \
            >"$OUT/llama-$index-$experts.raw" 2>"$OUT/llama-$index-$experts.log" </dev/null
        python3 - "$OUT/llama-$index-$experts.raw" "$prompt" >"$OUT/llama-$index-$experts.txt" <<'EOF'
import sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
prompt = sys.argv[2]
start = text.find(prompt)
text = text[start + len(prompt):] if start >= 0 else text
sys.stdout.write(text.split(" [end of text]")[0].rstrip("\n"))
EOF
        if cmp -s <(tr -d '\n' <"$OUT/spechost-$index-$experts.txt") <(tr -d '\n' <"$OUT/llama-$index-$experts.txt"); then
            text[$experts]=same
        else
            text[$experts]=DIFFERENT
            status=1
        fi
    done
    changed=no
    cmp -s "$OUT/spechost-$index-2.txt" "$OUT/spechost-$index-1.txt" || changed=yes
    [[ $changed == yes ]] || status=1
    echo "| \`$prompt\` | 2 (file) | ${text[2]} | |"
    echo "| \`$prompt\` | 1 | ${text[1]} | $changed |"
    unset text
done
echo "outputs and logs in $OUT" >&2
exit $status
