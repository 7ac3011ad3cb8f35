# Shared by the bench scripts that drive a live `spechost serve`: source it, then
# `start_server ARGS...` starts the server on loopback (the log in $log) and sets $base to its
# address and $server_pid; the server is stopped with SIGTERM when the script exits.
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"

[[ -x $SPECHOST_BIN ]] || {
    echo "error: $SPECHOST_BIN missing; build with cargo build --release -p spechost" >&2
    exit 1
}
work=$(mktemp -d)
log=${OUT:+$OUT/serve.log}
log=${log:-$work/serve.log}
[[ -n ${OUT:-} ]] && mkdir -p "$OUT"
server_pid=""
base=""

stop_server() {
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    server_pid=""
}

cleanup() {
    stop_server
    rm -rf "$work"
}
trap cleanup EXIT

# Starts `spechost serve --port 0 ARGS` and waits for the `listening on` line on its stdout.
start_server() {
    "$SPECHOST_BIN" serve --port 0 "$@" >"$work/stdout" 2>"$log" &
    server_pid=$!
    for _ in $(seq 600); do
        base=$(sed -n 's/^listening on //p' "$work/stdout")
        [[ -n $base ]] && return 0
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "error: spechost serve exited before listening; its log:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "error: spechost serve did not start within 300 s; see $log" >&2
    exit 1
}
