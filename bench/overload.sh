#!/usr/bin/env bash
# Overload of `spechost serve`: starts it on loopback with the default model (SmolLM2-135M),
# one slot and a queue of 4 (`--parallel 1 --max-queue 4`, plus any SERVE_ARGS), drives it at
# 4x its measured capacity with bench/overload.py, prints overload.py's markdown summary, and
# stops the server with SIGTERM. The server's log goes to $OUT/serve.log when OUT is set.
#
# Usage: bench/overload.sh [overload.py flags, e.g. --seconds 30 --factor 4 --idle 50
#   --slowloris 50 --json out.json]
# Environment: SERVE_ARGS (extra `spechost serve` flags), OUT (a directory for the log),
#   PYTHON (default python3).
set -euo pipefail
source "$(dirname "$0")/serve-lib.sh"
# The load's client threads share the cores with llama.cpp's: its OpenMP workers wait passively.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
start_server --model smollm2 --parallel 1 --max-queue 4 ${SERVE_ARGS:-}
"${PYTHON:-python3}" "$SPECHOST_ROOT/bench/overload.py" --base-url "$base" --pid "$server_pid" "$@"
stop_server
