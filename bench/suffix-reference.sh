#!/usr/bin/env bash
# The suffix drafter against the reference implementation of SuffixDecoding (ArcticInference's
# suffix cache), on the same greedy outputs: records the target's outputs once with
# `spechost trace`, replays them through `spechost simulate --cascade suffix` and through the
# reference (bench/suffix-reference.py) with the same draft lengths, the same rule for
# accepting and advancing and the requests in order, and prints both round counts.
# docs/suffix.md has the results and what differs by design.
#
# The reference comes from the `arctic-inference` wheel on PyPI (its suffix cache is a compiled
# C++ module that needs no GPU, nor torch), installed with numpy into a venv in the cache. The
# wheel is built for CPython 3.11 on x86_64 Linux.
#
# Usage: bench/suffix-reference.sh [OUT]   (OUT: a directory for the trace and the results;
#   default: a temporary one)
# Environment:
#   SPECHOST   the spechost binary (default: the release build)
#   SUFFIX     the suffix drafter to replay: `suffix` (the built one) or a .wasm path
#   MODEL      the target (default: SmolLM2-135M-Instruct requantized to Q8_0, made on first use)
#   WORKLOADS  workload files, space-separated (default: extract and code of ../shared/workloads)
#   DRAFT_MAX  draft lengths K, comma-separated (default: 8,24)
#   TRACE      a trace to replay instead of recording one
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"

spechost=${SPECHOST:-$SPECHOST_BIN}
[[ -x $spechost ]] || {
    echo "error: $spechost missing; build with cargo build --release -p spechost" >&2
    exit 1
}
out=${1:-$(mktemp -d)}
mkdir -p "$out"
suffix=${SUFFIX:-suffix}
draft_max=${DRAFT_MAX:-8,24}
workloads=${WORKLOADS:-"$SPECHOST_ROOT/../shared/workloads/extract.jsonl $SPECHOST_ROOT/../shared/workloads/code.jsonl"}
venv=$SPECHOST_CACHE_DIR/venv-suffix-reference

if ! "$venv/bin/python" -c "import arctic_inference.suffix_decoding" >/dev/null 2>&1; then
    echo "==> installing the reference (arctic-inference 0.3.0) into $venv" >&2
    python3 -m venv "$venv"
    # Its declared dependencies are a GPU serving stack; the suffix cache needs only numpy.
    "$venv/bin/pip" install --quiet --no-deps arctic-inference==0.3.0
    "$venv/bin/pip" install --quiet numpy
fi

trace=${TRACE:-$out/trace.jsonl}
if [[ -z ${TRACE:-} ]]; then
    model=${MODEL:-$("$spechost" models quantize --model smollm2 --type Q8_0 --embeddings Q8_0)}
    workload_args=()
    for workload in $workloads; do
        workload_args+=(--workload "$workload")
    done
    echo "==> recording the target's outputs into $trace" >&2
    "$spechost" trace --model "$model" "${workload_args[@]}" --cost-max-tokens 0 --out "$trace"
fi

echo "==> replaying through $suffix at K=$draft_max" >&2
"$spechost" simulate --trace "$trace" --cascade "$suffix" --draft-max "$draft_max" \
    --out "$out/simulate" >&2
echo "==> replaying through the reference" >&2
"$venv/bin/python" "$SPECHOST_ROOT/bench/suffix-reference.py" --trace "$trace" \
    --simulation "$out/simulate/simulation.json" --draft-max "$draft_max" | tee "$out/rounds.md"
