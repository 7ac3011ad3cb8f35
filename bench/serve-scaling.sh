#!/usr/bin/env bash
# How `spechost serve` scales with concurrent clients, on one model, in one run (issue 24):
#   current   this build in-process: `spechost bench --clients C,C,...` (plain decoding and
#             `lookup` under the default policy, every client count, and the single-stream
#             comparison of `run` with one-client `serve` on the same requests);
#   baseline  the landed build of BASELINE_COMMIT (default 8080971: a llama.cpp context per slot,
#             threads/C each): `spechost serve --parallel C`, with --cascade none and lookup,
#             restarted for each C and driven by this build's `spechost bench --clients C --url`;
#   variants  this build's `spechost serve` with each flag set of SERVE_VARIANTS (default:
#             `--cascade lookup --draft-cut off`, the default cascade without the step's draft
#             cut), restarted for each C and driven by the same clients;
#   llama     llama-server from the peer build (bench/llama-peer.sh) on the same GGUF, `-np C`,
#             the same threads and context per slot, without speculation and with each n-gram
#             speculation of LLAMA_SPECS, restarted for each C and driven by the same clients.
# Every client is the same closed loop (spechost bench --clients: streamed, greedy, one warm-up
# request per pass, REPEAT passes of each level with the rows alternating, tok/s the median
# pass), so every row is measured alike. Writes each run's serve-results.{md,csv,json}
# under --out and serve-scaling.md there, one summary of every row (bench/serve-scaling.py).
#
# The baseline binary is built once into $SPECHOST_CACHE_DIR/baseline-<commit>/ (a git worktree
# built with the same CARGO_TARGET_DIR, so llama.cpp is not compiled again, then this tree's
# binary is built again); its plugins are built there too, with their own small target dir.
#
# Usage: bench/serve-scaling.sh [--model NAME|GGUF] [--prompt-style chat|raw]
#            [--workload FILE.jsonl] [--clients 1,2,4,8] [--requests-per-client N]
#            [--max-tokens N] [--ctx-size N] [--out DIR]
#   defaults: smollm2-q8, chat, examples/workloads/extract.jsonl (the chat requests of
#   ../shared/workloads/extract.jsonl with raw forms for base models), 1,2,4,8, 12, each request's
#   own max_tokens, 2048 tokens per slot, serve-scaling-<model>
#   Gemma-3-270M (a base model): bench/serve-scaling.sh --model gemma3 --prompt-style raw
# Environment: STEPS (default "current baseline variants llama"), REPEAT (measured passes of
#   each level, default 3), BASELINE_COMMIT, SERVE_VARIANTS
#   (`;`-separated flag sets of this build's serve, each a row), THREADS (llama-server's
#   -t; default: spechost's plan, one per physical core), LLAMA_SPECS (`;`-separated llama-server
#   flag sets, each a row besides no speculation; default: ngram-simple with a 3-token key and
#   8-token drafts, and ngram-cache, llama-lookup's n-gram cache; set empty: none),
#   LLAMA_SERVER_ARGS (flags added to every llama-server, e.g. "-fa on -ctk q8_0 -ctv q8_0
#   --no-repack" for spechost's numerics).
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$SPECHOST_ROOT"

MODEL=smollm2-q8 STYLE=chat WORKLOAD=$SPECHOST_ROOT/examples/workloads/extract.jsonl
CLIENTS=1,2,4,8 PER_CLIENT=12 MAX_TOKENS="" CTX=2048 OUT=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --model) MODEL=$2 ;;
        --prompt-style) STYLE=$2 ;;
        --workload) WORKLOAD=$(realpath "$2") ;;
        --clients) CLIENTS=$2 ;;
        --requests-per-client) PER_CLIENT=$2 ;;
        --max-tokens) MAX_TOKENS=$2 ;;
        --ctx-size) CTX=$2 ;;
        --out) OUT=$2 ;;
        *) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
    shift 2
done
OUT=$(realpath -m "${OUT:-serve-scaling-$(basename "$MODEL" .gguf)}")
STEPS=${STEPS:-"current baseline variants llama"}
REPEAT=${REPEAT:-3}
SERVE_VARIANTS=${SERVE_VARIANTS:-"--cascade lookup --draft-cut off"}
BASELINE_COMMIT=${BASELINE_COMMIT:-8080971}
LLAMA_SPECS=${LLAMA_SPECS-"--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8;--spec-type ngram-cache"}
THREADS=${THREADS:-$("$SPECHOST_BIN" info | sed -n 's/^ *threads *\([0-9][0-9]*\) compute.*/\1/p')}
IFS=, read -ra COUNTS <<<"$CLIENTS"
mkdir -p "$OUT"
[[ -x $SPECHOST_BIN ]] || { echo "error: $SPECHOST_BIN missing; build with cargo build --release -p spechost" >&2; exit 1; }
[[ -f $WORKLOAD ]] || { echo "error: workload $WORKLOAD not found; give --workload FILE.jsonl" >&2; exit 1; }

wants() { [[ " $STEPS " == *" $1 "* ]]; }
# Lines "<system>\t<configuration>\t<results dir>" for the summary, a file per step: a step
# run again replaces its own lines, and the summary keeps the other steps' earlier runs.
runs() { echo "$OUT/runs-$1.tsv"; }
common=(--model "$MODEL" --workload "$WORKLOAD" --prompt-style "$STYLE" --requests-per-client "$PER_CLIENT"
    --repeat "$REPEAT")
[[ -n $MAX_TOKENS ]] && common+=(--max-tokens "$MAX_TOKENS")

server_pid=""
stop_server() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    server_pid=""
}
trap stop_server EXIT

# A free loopback port.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until GET $1/health answers 200 (the model is loaded), or the server exits.
wait_healthy() {
    local url=$1 log=$2
    for _ in $(seq 1200); do
        curl -sf -o /dev/null "$url/health" && return 0
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "error: the server exited before it was ready; its log ($log):" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "error: the server was not ready within 600 s; see $log" >&2
    exit 1
}

# Drives the server at $1 with C=$2 clients, as system $3 in configuration $4, results into $5,
# listed in step $6's runs. Differing outputs (llama-server's change with the batch) make bench
# exit non-zero after writing its results: they are reported in the summary, not fatal; a
# missing result is.
drive() {
    local url=$1 clients=$2 system=$3 configuration=$4 dir=$5 step=$6
    "$SPECHOST_BIN" bench "${common[@]}" --clients "$clients" --url "$url" \
        --label "$system $configuration" --out "$dir" >"$dir.stdout" 2>"$dir.stderr" || true
    [[ -f $dir/serve-results.json ]] || {
        echo "error: no results from $system $configuration at $clients clients; see $dir.stderr" >&2
        tail -5 "$dir.stderr" >&2
        exit 1
    }
    printf '%s\t%s\t%s\n' "$system" "$configuration" "$dir" >>"$(runs "$step")"
}

if wants current; then
    echo "==> this build in-process, clients $CLIENTS" >&2
    "$SPECHOST_BIN" bench "${common[@]}" --ctx-size "$CTX" --cascade lookup --clients "$CLIENTS" \
        --out "$OUT/current" 2>"$OUT/current.stderr" | tee "$OUT/current.stdout" \
        || echo "warning: spechost bench failed or outputs differed; see $OUT/current.stderr" >&2
    [[ -f $OUT/current/serve-results.json ]] || { tail -5 "$OUT/current.stderr" >&2; exit 1; }
    printf '%s\t\t%s\n' "spechost in-process" "$OUT/current" >"$(runs current)"
fi

# The GGUF llama-server loads: --model as a path, or the file spechost resolves the name to
# (`run --json` reports it; a variant such as smollm2-q8 is made on first use).
model_path() {
    if [[ -f $MODEL ]]; then
        realpath "$MODEL"
    else
        "$SPECHOST_BIN" run --model "$MODEL" --cascade none --max-tokens 1 --prompt hi --json \
            2>&1 >/dev/null | grep '^{' \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["model"])'
    fi
}

if wants baseline; then
    home=$SPECHOST_CACHE_DIR/baseline-$BASELINE_COMMIT
    baseline=$home/spechost
    if [[ ! -x $baseline ]]; then
        echo "==> building the baseline $BASELINE_COMMIT into $home" >&2
        tree=$(mktemp -d)/baseline
        git worktree add --detach "$tree" "$BASELINE_COMMIT" >&2
        mkdir -p "$home/plugins"
        # Its own plugins (its WIT), with a target dir of their own: this tree's stay as they are.
        CARGO_TARGET_DIR=$home/plugin-target "$tree/scripts/build-plugins.sh" --locked >&2
        cp "$home"/plugin-target/wasm32-wasip2/release/*.wasm "$home/plugins/"
        # The shared target dir: llama.cpp and wasmtime are reused, only spechost's crate builds.
        cargo build --release --locked -p spechost --manifest-path "$tree/Cargo.toml" >&2
        cp "$CARGO_TARGET_DIR/release/spechost" "$baseline.partial" && mv "$baseline.partial" "$baseline"
        git worktree remove --force "$tree"
        echo "==> building this tree again" >&2
        cargo build --release --locked -p spechost >&2 || {
            echo "error: $SPECHOST_BIN is the baseline's now and this tree does not build;" \
                "build it again once it does (cargo build --release -p spechost)" >&2
            exit 1
        }
    fi
    : >"$(runs baseline)"
    for cascade in none lookup; do
        for clients in "${COUNTS[@]}"; do
            echo "==> baseline $BASELINE_COMMIT, --cascade $cascade, --parallel $clients" >&2
            port=$(free_port) log=$OUT/baseline-$cascade-$clients.log
            "$baseline" serve --model "$MODEL" --ctx-size "$CTX" --parallel "$clients" \
                --cascade "$cascade" --plugin-dir "$home/plugins" --port "$port" >/dev/null 2>"$log" &
            server_pid=$!
            wait_healthy "http://127.0.0.1:$port" "$log"
            drive "http://127.0.0.1:$port" "$clients" "spechost $BASELINE_COMMIT per-slot" \
                "$cascade" "$OUT/baseline-$cascade-$clients" baseline
            stop_server
        done
    done
fi

if wants variants; then
    IFS=';' read -ra variants <<<"$SERVE_VARIANTS"
    : >"$(runs variants)"
    # Every variant at one client count, then the next count: rows compared at one count are
    # measured minutes apart, not half an hour.
    for clients in "${COUNTS[@]}"; do
        for index in "${!variants[@]}"; do
            flags=${variants[index]}
            echo "==> this build's serve $flags, --parallel $clients" >&2
            port=$(free_port) log=$OUT/variant-$index-$clients.log
            # shellcheck disable=SC2086 # flags is a list of flags
            "$SPECHOST_BIN" serve --model "$MODEL" --ctx-size "$CTX" --parallel "$clients" \
                $flags --port "$port" >/dev/null 2>"$log" &
            server_pid=$!
            wait_healthy "http://127.0.0.1:$port" "$log"
            drive "http://127.0.0.1:$port" "$clients" "spechost serve" "$flags" \
                "$OUT/variant-$index-$clients" variants
            stop_server
        done
    done
fi

if wants llama; then
    peer_bin=$("$SPECHOST_ROOT/bench/llama-peer.sh" llama-server)
    gguf=$(model_path)
    IFS=';' read -ra specs <<<"none;$LLAMA_SPECS"
    : >"$(runs llama)"
    for index in "${!specs[@]}"; do
        spec=${specs[index]}
        configuration=${spec:-none}
        [[ $spec == none ]] && spec=""
        for clients in "${COUNTS[@]}"; do
            echo "==> llama-server $configuration, -np $clients" >&2
            port=$(free_port) log=$OUT/llama-$index-$clients.log
            # shellcheck disable=SC2086 # spec and LLAMA_SERVER_ARGS are lists of flags
            "$peer_bin/llama-server" -m "$gguf" -np "$clients" -c $((CTX * clients)) -t "$THREADS" \
                --host 127.0.0.1 --port "$port" $spec ${LLAMA_SERVER_ARGS:-} >"$log" 2>&1 &
            server_pid=$!
            wait_healthy "http://127.0.0.1:$port" "$log"
            drive "http://127.0.0.1:$port" "$clients" llama-server "$configuration" \
                "$OUT/llama-$index-$clients" llama
            stop_server
        done
    done
fi

for step in current baseline variants llama; do
    [[ -f $(runs "$step") ]] && cat "$(runs "$step")"
done >"$OUT/runs.tsv"
python3 "$SPECHOST_ROOT/bench/serve-scaling.py" --runs "$OUT/runs.tsv" --model "$MODEL" \
    --threads "$THREADS" --ctx-size "$CTX" | tee "$OUT/serve-scaling.md"
echo "summary written to $OUT/serve-scaling.md" >&2
