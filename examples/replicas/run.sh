#!/usr/bin/env bash
# Two (or --replicas N) `spechost serve` replicas sharing through Redis, behind nginx, on one
# machine, driven by `spechost bench --clients` through nginx. Starts redis-server, the
# replicas and nginx (installing the Debian packages where missing), runs the clients, prints
# each replica's /health `share` block, and stops everything on exit.
#
#   examples/replicas/run.sh [--replicas N] [--no-share] [--clients C] [--requests N]
#                            [--workload FILE] [--out DIR] [-- extra serve flags]
#
# --no-share starts the same replicas without --share: the baseline the shared run is compared
# with in docs/deploy.md. The model is the default SmolLM2 (fetched by scripts/setup.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../scripts/env.sh"

replicas=2
share=1
clients=2
requests=12
workload="$here/../../tests/fixtures/prompts.jsonl"
out=""
model=smollm2
base_port=${SPECHOST_EXAMPLE_PORT:-8100}
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --replicas) replicas=$2; shift 2 ;;
        --no-share) share=0; shift ;;
        --clients) clients=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --workload) workload=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "unknown argument $1; see the header of $0" >&2; exit 2 ;;
    esac
done

for package in redis-server nginx; do
    binary=$package
    [[ $package == nginx ]] && binary=/usr/sbin/nginx
    if ! command -v "$binary" >/dev/null; then
        echo "==> installing $package"
        sudo=""
        [[ $(id -u) -ne 0 ]] && sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$package" >/dev/null
    fi
done
[[ -x $SPECHOST_BIN ]] || { echo "build spechost first: ./scripts/setup.sh" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/spechost-replicas.XXXXXX")
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

redis_port=$((base_port + 90))
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done
echo "redis-server on 127.0.0.1:$redis_port"

# The replicas share the machine's cores: give each its share.
cores=$(nproc)
threads=$(( cores / replicas > 0 ? cores / replicas : 1 ))
upstreams=""
for i in $(seq 1 "$replicas"); do
    port=$((base_port + i))
    flags=(serve --model "$model" --port "$port" --threads "$threads" --public-metrics)
    [[ $share == 1 ]] && flags+=(--share "redis://127.0.0.1:$redis_port/example")
    "$SPECHOST_BIN" "${flags[@]}" "${extra[@]}" >"$work/replica-$i.out" 2>"$work/replica-$i.log" &
    pids+=($!)
    [[ -n $upstreams ]] && upstreams+=$'\n'
    upstreams+="        server 127.0.0.1:$port;"
done
for i in $(seq 1 "$replicas"); do
    port=$((base_port + i))
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "replica $i did not start:" >&2
            cat "$work/replica-$i.log" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "replica $i on 127.0.0.1:$port"
done

mkdir -p "$work/nginx"
conf=$(<"$here/nginx.conf.template")
conf=${conf//@PREFIX@/$work/nginx}
conf=${conf//@PORT@/$base_port}
conf=${conf//@UPSTREAMS@/$upstreams}
printf '%s\n' "$conf" >"$work/nginx/nginx.conf"
/usr/sbin/nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
pids+=($!)
until curl -sf "http://127.0.0.1:$base_port/health" >/dev/null; do sleep 0.2; done
echo "nginx on 127.0.0.1:$base_port, round-robin over $replicas replicas"

bench=(bench --model "$model" --prompt-style chat --workload "$workload" --clients "$clients"
    --requests-per-client "$requests"
    --url "http://127.0.0.1:$base_port" --label "$([[ $share == 1 ]] && echo shared || echo alone)")
[[ -n $out ]] && bench+=(--out "$out")
"$SPECHOST_BIN" "${bench[@]}"

for i in $(seq 1 "$replicas"); do
    echo "replica $i: $(curl -s "http://127.0.0.1:$((base_port + i))/health")"
done
