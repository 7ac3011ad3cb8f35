#!/usr/bin/env bash
# Regenerates every measured table and chart of docs/benchmarks.md: the one command behind its
# numbers. In order:
#   1. builds the plugins and spechost (release);
#   2. spechost bench: plain decoding and every cascade × draft length on every workload, with the
#      verify cost curve, ideal speedup and efficiency -> $RESULTS/results.{md,csv,json} and the
#      SVG charts;
#   3. bench/plain-decode.sh: plain decoding against llama-bench, both default models;
#   4. bench/cascade-overhead.sh: lookup through the component boundary, both default models;
#   5. bench/peers.sh: llama.cpp's llama-simple, llama-lookup, llama-speculative-simple and
#      llama-bench on the same prompts, model, threads and context as step 2;
# then replaces each `<!-- generated:NAME -->` ... `<!-- /generated:NAME -->` section of the docs
# file with what the steps printed; everything outside the markers is kept as written.
#
# It takes hours on 2 cores and its numbers are only as good as the machine is quiet: run it with
# nothing else running. Everything is configured by environment variables:
#   THREADS      compute threads (default: nproc)
#   MODEL        target of steps 2 and 5 (default: gemma3)
#   WORKLOADS    space-separated workload files
#                (default: examples/workloads/{edit,summarize,extract,code}.jsonl)
#   CASCADES     `;`-separated cascades (default: lookup;suffix;lookup,suffix)
#   DRAFT_MAX    draft lengths of step 2 (default: 4,8,16,24)
#   PEER_K       draft length compared with llama.cpp's tools (default: 8; must be in DRAFT_MAX)
#   REPEAT, WARMUP   measured and warm-up passes of step 2 (defaults: 3, 1)
#   COST_REPEAT  runs of each batch size of step 2's verify cost curves (default: 5)
#   MAX_TOKENS   cap on every request's max_tokens (default: none)
#   DRAFT_MODEL  draft GGUF: step 2's --draft-model (for cascades with `draft`) and step 5's
#                llama-speculative-simple (default: none, that row skipped), and
#   DRAFT_CASCADE    the spechost cascade it is compared with (default: draft; list it in CASCADES)
#   PEER_REPEAT  interleaved passes of step 5 (default: 1)
#   PLAIN_TOKENS, PLAIN_REPEAT   step 3's tokens and rounds (defaults: 256, 9)
#   CASCADE_TOKENS               step 4's tokens (default: 128)
#   REQUESTS     only the first N requests of each workload, everywhere (a quick check of this
#                script, not for publishing)
#   DOCS         the file to update (default: docs/benchmarks.md)
#   RESULTS      where step 2's files go, next to DOCS (default: docs/bench)
# Usage: bench/regenerate-docs.sh
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$SPECHOST_ROOT"

THREADS=${THREADS:-$(nproc)}
MODEL=${MODEL:-gemma3}
WORKLOADS=${WORKLOADS:-"examples/workloads/edit.jsonl examples/workloads/summarize.jsonl examples/workloads/extract.jsonl examples/workloads/code.jsonl"}
CASCADES=${CASCADES:-"lookup;suffix;lookup,suffix"}
DRAFT_MAX=${DRAFT_MAX:-4,8,16,24}
PEER_K=${PEER_K:-8}
REPEAT=${REPEAT:-3}
WARMUP=${WARMUP:-1}
COST_REPEAT=${COST_REPEAT:-5}
PEER_REPEAT=${PEER_REPEAT:-1}
PLAIN_TOKENS=${PLAIN_TOKENS:-256}
PLAIN_REPEAT=${PLAIN_REPEAT:-9}
CASCADE_TOKENS=${CASCADE_TOKENS:-128}
DOCS=${DOCS:-docs/benchmarks.md}
RESULTS=${RESULTS:-docs/bench}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "==> building" >&2
"$SPECHOST_ROOT/scripts/build-plugins.sh" >/dev/null
cargo build --release -p spechost --manifest-path "$SPECHOST_ROOT/Cargo.toml" >&2

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
[[ -n ${DRAFT_MODEL:-} ]] && options+=(--draft-model "$DRAFT_MODEL")

echo "==> spechost bench" >&2
mkdir -p "$RESULTS"
bench_command=(bench --model "$MODEL" "${workloads[@]}" "${cascades[@]}" --policy fixed --draft-max "$DRAFT_MAX"
    --repeat "$REPEAT" --warmup "$WARMUP" --cost-repeat "$COST_REPEAT" --threads "$THREADS"
    "${options[@]}" --out "$RESULTS")
"$SPECHOST_BIN" "${bench_command[@]}" > "$work/bench.md"

echo "==> bench/plain-decode.sh" >&2
"$SPECHOST_ROOT/bench/plain-decode.sh" "$THREADS" "$PLAIN_TOKENS" "$PLAIN_REPEAT" > "$work/plain-decode.md"

echo "==> bench/cascade-overhead.sh" >&2
"$SPECHOST_ROOT/bench/cascade-overhead.sh" "$THREADS" "$CASCADE_TOKENS" 8 > "$work/cascade-overhead.md"

echo "==> bench/peers.sh" >&2
peer_args=(--bench-json "$RESULTS/results.json" --out "$work/peers" --draft-max "$PEER_K"
    --repeat "$PEER_REPEAT")
[[ -n ${DRAFT_MODEL:-} ]] && peer_args+=(--draft-model "$DRAFT_MODEL" --draft-cascade "${DRAFT_CASCADE:-draft}")
[[ -n ${REQUESTS:-} ]] && peer_args+=(--requests "$REQUESTS")
"$SPECHOST_ROOT/bench/peers.sh" "${peer_args[@]}" >&2

# The setup every number was taken on, and the command that took them.
charts=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], os.path.dirname(sys.argv[2])))' "$RESULTS" "$DOCS")
{
    echo "Measured $(date -u +%Y-%m-%d) on $(lscpu | sed -n 's/^Model name: *//p' | head -n 1)," \
        "$(nproc) CPUs, $(free -g | awk '/^Mem:/ {print $2}') GiB RAM, --threads $THREADS," \
        "by \`bench/regenerate-docs.sh\` at commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with local changes)')."
    [[ -n ${REQUESTS:-} ]] && echo "**Quick check only: the first $REQUESTS request(s) of each workload.**"
    echo
    echo '```sh'
    echo "spechost ${bench_command[*]}"
    echo '```'
} > "$work/setup.md"
{
    cat "$work/bench.md"
    echo
    echo "![speedup by configuration]($charts/speedup.svg)"
    echo
    echo "![acceptance by draft position]($charts/acceptance-by-position.svg)"
    echo
    echo "All result files (CSV, JSON, and every workload's verify cost curve): \`$RESULTS/\`."
} > "$work/spechost-bench.md"

python3 - "$DOCS" "$work" <<'PY'
import pathlib, re, sys
docs, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
sections = {
    "setup": work / "setup.md",
    "spechost-bench": work / "spechost-bench.md",
    "plain-decode": work / "plain-decode.md",
    "cascade-overhead": work / "cascade-overhead.md",
    "peers": work / "peers" / "peers.md",
    "verify-cost": work / "peers" / "verify-cost.md",
}
text = docs.read_text()
for name, source in sections.items():
    pattern = re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n).*?(<!-- /generated:{re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        sys.exit(f"error: {docs} has no `<!-- generated:{name} -->` ... "
                 f"`<!-- /generated:{name} -->` section; add the markers where it belongs")
    body = source.read_text().rstrip("\n") + "\n"
    text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
docs.write_text(text)
print(f"updated {docs}: {', '.join(sections)}", file=sys.stderr)
PY
