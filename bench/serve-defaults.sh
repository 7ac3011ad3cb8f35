#!/usr/bin/env bash
# `spechost serve` with its defaults against plain decoding on the same server, side by side
# (bench/serve-defaults.py): starts the server on loopback with MODEL (default smollm2) and any
# SERVE_ARGS, drives it with the workload's chat requests, prints the table, stops the server.
#
# Usage: bench/serve-defaults.sh [serve-defaults.py flags, e.g. --passes 3 --json out.json]
# Environment: MODEL, WORKLOAD (default ../shared/workloads/summarize.jsonl), SERVE_ARGS, OUT
#   (a directory for the server log), PYTHON (default python3).
set -euo pipefail
source "$(dirname "$0")/serve-lib.sh"

workload=${WORKLOAD:-$SPECHOST_ROOT/../shared/workloads/summarize.jsonl}
# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
start_server --model "${MODEL:-smollm2}" ${SERVE_ARGS:-}
"${PYTHON:-python3}" "$SPECHOST_ROOT/bench/serve-defaults.py" --base-url "$base" \
    --workload "$workload" "$@"
stop_server
