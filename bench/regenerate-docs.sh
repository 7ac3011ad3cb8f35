#!/usr/bin/env bash
# Regenerates every measured table and chart of docs/benchmarks.md: the one command behind its
# numbers. In order:
#   1. builds the plugins and spechost (release);
#   2. for each model of MODELS (by default the two realistic pairs: `smollm2-q8`, the
#      instruction-tuned SmolLM2 requantized to Q8_0, on the chat forms of the workloads, and
#      the pretrained `gemma3` on their raw forms; `--prompt-style auto` picks the form):
#      spechost bench, plain decoding and every cascade under the default policy, both modes
#      -> $RESULTS/<model>/results.{md,csv,json}, requests.csv and the SVG charts; then
#      bench/peers.sh: llama.cpp's llama-simple and llama-lookup (each K of PEER_K) on exactly
#      the same prompts, model, threads and context;
#   3. bench/plain-decode.sh: plain decoding against llama-bench, both default models;
#   4. bench/cascade-overhead.sh: lookup through the component boundary, both default models;
# then replaces each `<!-- generated:NAME -->` ... `<!-- /generated:NAME -->` section of the docs
# file with what the steps printed; everything outside the markers is kept as written.
#
# It takes hours on 2 cores and its numbers are only as good as the machine is quiet: run it with
# nothing else running. Everything is configured by environment variables:
#   THREADS      compute threads (default: nproc)
#   MODELS       space-separated targets of step 2 (default: smollm2-q8 gemma3)
#   WORKLOADS    space-separated workload files, each line with a chat and a raw form
#                (default: examples/workloads/{edit,summarize,extract,code}.jsonl)
#   CASCADES     `;`-separated cascades (default: lookup;lookup,suffix)
#   MODES        cascade modes (default: first,scored)
#   POLICY       draft-length policy (default: cost, the default of run and serve)
#   DRAFT_MAX    most draft tokens per round (default: 24)
#   PEER_K       llama-lookup's draft lengths; its best is compared (default: 8,16)
#   REPEAT, WARMUP   measured and warm-up passes of step 2 (defaults: 3, 1)
#   COST_REPEAT  runs of each batch size of step 2's verify cost curves (default: 5)
#   MAX_TOKENS   cap on every request's max_tokens (default: none)
#   PEER_REPEAT  interleaved passes of llama.cpp's tools (default: 1)
#   PLAIN_TOKENS, PLAIN_REPEAT   step 3's tokens and rounds (defaults: 256, 9)
#   CASCADE_TOKENS               step 4's tokens (default: 128)
#   STEPS        which of `bench plain-decode cascade-overhead` to run (default: all three);
#                the sections of the others are left as they are
#   REQUESTS     only the first N requests of each workload, everywhere (a quick check of this
#                script, not for publishing)
#   DOCS         the file to update (default: docs/benchmarks.md)
#   RESULTS      where step 2's files go, next to DOCS (default: docs/bench)
# Usage: bench/regenerate-docs.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$SPECHOST_ROOT"

THREADS=${THREADS:-$(nproc)}
MODELS=${MODELS:-"smollm2-q8 gemma3"}
WORKLOADS=${WORKLOADS:-"examples/workloads/edit.jsonl examples/workloads/summarize.jsonl examples/workloads/extract.jsonl examples/workloads/code.jsonl"}
CASCADES=${CASCADES:-"lookup;lookup,suffix"}
MODES=${MODES:-first,scored}
POLICY=${POLICY:-cost}
DRAFT_MAX=${DRAFT_MAX:-24}
PEER_K=${PEER_K:-8,16}
REPEAT=${REPEAT:-3}
WARMUP=${WARMUP:-1}
COST_REPEAT=${COST_REPEAT:-5}
PEER_REPEAT=${PEER_REPEAT:-1}
PLAIN_TOKENS=${PLAIN_TOKENS:-256}
PLAIN_REPEAT=${PLAIN_REPEAT:-9}
CASCADE_TOKENS=${CASCADE_TOKENS:-128}
STEPS=${STEPS:-"bench plain-decode cascade-overhead"}
DOCS=${DOCS:-docs/benchmarks.md}
RESULTS=${RESULTS:-docs/bench}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
runs() { [[ " $STEPS " == *" $1 "* ]]; }

echo "==> building" >&2
"$SPECHOST_ROOT/scripts/build-plugins.sh" >/dev/null
cargo build --release -p spechost --manifest-path "$SPECHOST_ROOT/Cargo.toml" >&2
if runs bench; then
    # llama.cpp's tools run after an hour of spechost bench; a peer build that cannot run on
    # this CPU (its native AMX kernels die with SIGILL on some VMs) must stop the script now.
    echo "==> checking llama.cpp's tools on this CPU" >&2
    peer_bin=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-simple llama-lookup llama-speculative-simple llama-bench)
    if ! "$peer_bin/llama-bench" -m "$("$SPECHOST_BIN" models path smollm2)" -t "$THREADS" \
        -p 64 -n 4 -r 1 >/dev/null 2>&1; then
        echo "error: llama.cpp's llama-bench ($peer_bin) fails on this CPU; rebuild it without" \
            "the instructions it dies on (bench/llama-peer.sh's header: LLAMA_PEER_CMAKE_ARGS)" >&2
        exit 1
    fi
fi

workloads=()
for path in $WORKLOADS; do
    if [[ -n ${REQUESTS:-} ]]; then
        head -n "$REQUESTS" "$path" > "$work/$(basename "$path")"
        path="$work/$(basename "$path")"
    fi
    workloads+=(--workload "$path")
done
cascades=()
IFS=';' read -ra list <<< "$CASCADES"
for cascade in "${list[@]}"; do cascades+=(--cascade "$cascade"); done
options=()
[[ -n ${MAX_TOKENS:-} ]] && options+=(--max-tokens "$MAX_TOKENS")
sections=()
commands=()
if runs bench; then
    for model in $MODELS; do
        out="$RESULTS/$model"
        echo "==> spechost bench: $model" >&2
        mkdir -p "$out"
        bench_command=(bench --model "$model" "${workloads[@]}" --prompt-style auto "${cascades[@]}"
            --cascade-mode "$MODES" --policy "$POLICY" --draft-max "$DRAFT_MAX"
            --repeat "$REPEAT" --warmup "$WARMUP" --cost-repeat "$COST_REPEAT" --threads "$THREADS"
            "${options[@]}" --out "$out")
        "$SPECHOST_BIN" "${bench_command[@]}" > "$work/bench-$model.md"
        commands+=("spechost ${bench_command[*]}")
        echo "==> bench/peers.sh: $model" >&2
        peer_args=(--bench-json "$out/results.json" --out "$work/peers-$model" --draft-max "$PEER_K"
            --repeat "$PEER_REPEAT")
        [[ -n ${REQUESTS:-} ]] && peer_args+=(--requests "$REQUESTS")
        "$SPECHOST_ROOT/bench/peers.sh" "${peer_args[@]}" >&2
        charts=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], os.path.dirname(sys.argv[2])))' "$out" "$DOCS")
        style=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt_style"])' "$out/results.json")
        {
            echo "\`$model\`, $style prompts:"
            echo
            cat "$work/bench-$model.md"
            echo
            grep -h '^- `' "$out/results.md" || true
            echo
            echo "![speedup by configuration]($charts/speedup.svg)"
            echo
            echo "All result files (CSV per configuration and per request, JSON, the verify cost curves): \`$out/\`."
        } > "$work/spechost-bench-$model.md"
        cp "$work/peers-$model/best-lookup.md" "$work/best-lookup-$model.md"
        cp "$work/peers-$model/peers.md" "$work/peers-$model.md"
        cp "$work/peers-$model/verify-cost.md" "$work/verify-cost-$model.md"
        sections+=("spechost-bench-$model" "best-lookup-$model" "peers-$model" "verify-cost-$model")
    done
    # The setup every number was taken on, and the commands that took them.
    {
        echo "Measured $(date -u +%Y-%m-%d) on $(lscpu | sed -n 's/^Model name: *//p' | head -n 1)," \
            "$(nproc) CPUs, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, --threads $THREADS," \
            "by \`bench/regenerate-docs.sh\` at commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with local changes)')."
        [[ -n ${REQUESTS:-} ]] && echo "**Quick check only: the first $REQUESTS request(s) of each workload.**"
        echo
        echo '```sh'
        printf '%s\n' "${commands[@]}"
        echo '```'
    } > "$work/setup.md"
    sections+=(setup)
fi
if runs plain-decode; then
    echo "==> bench/plain-decode.sh" >&2
    "$SPECHOST_ROOT/bench/plain-decode.sh" "$THREADS" "$PLAIN_TOKENS" "$PLAIN_REPEAT" > "$work/plain-decode.md"
    sections+=(plain-decode)
fi
if runs cascade-overhead; then
    echo "==> bench/cascade-overhead.sh" >&2
    "$SPECHOST_ROOT/bench/cascade-overhead.sh" "$THREADS" "$CASCADE_TOKENS" 8 > "$work/cascade-overhead.md"
    sections+=(cascade-overhead)
fi

python3 - "$DOCS" "$work" "${sections[@]}" <<'PY'
import pathlib, re, sys
docs, work, sections = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
text = docs.read_text()
for name in sections:
    pattern = re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        sys.exit(f"error: {docs} has no `<!-- generated:{name} -->` ... "
                 f"`<!-- /generated:{name} -->` section; add the markers where it belongs")
    body = (work / f"{name}.md").read_text().rstrip("\n") + "\n"
    text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
docs.write_text(text)
print(f"updated {docs}: {', '.join(sections)}", file=sys.stderr)
PY
