#!/usr/bin/env bash
# Overload of `spechost serve`: starts it on loopback with the default model (SmolLM2-135M),
# one slot and a queue of 4 (`--parallel 1 --max-queue 4`, plus any SERVE_ARGS), drives it at
# 4x its measured capacity with bench/overload.py, prints overload.py's markdown summary, and
# stops the server with SIGTERM. The server's log goes to $OUT/serve.log when OUT is set.
#
# Usage: bench/overload.sh [overload.py flags, e.g. --seconds 30 --factor 4 --json out.json]
# Environment: SERVE_ARGS (extra `spechost serve` flags), OUT (a directory for the log),
#   PYTHON (default python3).
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"

[[ -x $SPECHOST_BIN ]] || {
    echo "error: $SPECHOST_BIN missing; build with cargo build --release -p spechost" >&2
    exit 1
}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
work=$(mktemp -d)
log=${OUT:+$OUT/serve.log}
log=${log:-$work/serve.log}
[[ -n ${OUT:-} ]] && mkdir -p "$OUT"
server_pid=""
cleanup() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
"$SPECHOST_BIN" serve --model smollm2 --parallel 1 --max-queue 4 --port 0 ${SERVE_ARGS:-} \
    >"$work/stdout" 2>"$log" &
server_pid=$!

# The address is the only line on stdout: `listening on http://127.0.0.1:PORT`.
base=""
for _ in $(seq 600); do
    base=$(sed -n 's/^listening on //p' "$work/stdout")
    [[ -n $base ]] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "error: spechost serve exited before listening; its log:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.5
done
[[ -n $base ]] || { echo "error: spechost serve did not start within 300 s; see $log" >&2; exit 1; }

"${PYTHON:-python3}" "$SPECHOST_ROOT/bench/overload.py" --base-url "$base" --pid "$server_pid" "$@"

kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
